"""Host-mode settings: the shared roots and policy (`corepin.agent.settings.AgentSettings`),
whether to use cgroups, corepin's cgroup parent, the lock timeout.

Environment variables (command-line options win):

- `COREPIN_STATE_DIR`: state directory (default `/var/lib/corepin`).
- `COREPIN_CGROUPS`: `auto` (default: use the cpuset hierarchy when it is there and writable),
  `on` (require it; exit 4 when unusable) or `off` (affinity only).
- `COREPIN_CGROUP_ROOT`: the cgroup mount root (default `/sys/fs/cgroup`).
- `COREPIN_POLICY`: allocation policy for exclusive runs (default `topology-aware`).
- `COREPIN_LOCK_TIMEOUT`: seconds to wait for the state lock before giving up (default 10).
- `COREPIN_FORCE_MEMBIND=1` (testing): bind the memory of runs without a cpuset cgroup to their
  NUMA nodes even on a machine with a single NUMA node (normally done only with two or more).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Final

from corepin.agent.settings import DEFAULT_CGROUP_ROOT, AgentSettings, state_dir_key
from corepin.allocation.policies import DEFAULT_POLICY
from corepin.core.errors import InputError
from corepin.core.record import record
from corepin.state.store import DEFAULT_LOCK_TIMEOUT, DEFAULT_STATE_DIR

if TYPE_CHECKING:
    from argparse import Namespace

CGROUP_MODES: Final = ("auto", "on", "off")
#: corepin's own cgroup under the cpuset hierarchy. Each state directory gets a group of its own
#: below it (`<root>/cpuset/corepin/<state dir key>/<run id>`), so runs of two state directories
#: on one host never see (or remove) each other's cgroups.
CGROUP_PARENT: Final = "corepin"


@record
class HostSettings(AgentSettings):
    """Everything host mode needs to know about where things are."""

    cgroups: str = "auto"
    #: corepin's cgroup parent for this state directory (default: CGROUP_PARENT/<state dir key>)
    cgroup_parent: str = ""
    #: bind memory (set_mempolicy) of runs outside a cpuset cgroup even with one NUMA node
    force_membind: bool = False
    #: seconds to wait for the state lock
    lock_timeout: float = DEFAULT_LOCK_TIMEOUT

    def __post_init__(self) -> None:
        if self.cgroups not in CGROUP_MODES:
            raise InputError(
                f"unknown cgroup mode {self.cgroups!r} (choose from {', '.join(CGROUP_MODES)})",
                reason="bad_cgroup_mode",
            )
        self.check_state_dir()
        if not self.cgroup_parent:
            object.__setattr__(
                self, "cgroup_parent", f"{CGROUP_PARENT}/{state_dir_key(self.state_dir)}"
            )

    @classmethod
    def from_args(cls, args: Namespace, environ: Mapping[str, str]) -> HostSettings:
        """Options from argparse `args` (missing attributes are fine), else the environment."""

        def pick(attr: str, env: str, default: str) -> str:
            value = getattr(args, attr, None)
            if value == "":
                option = "--" + attr.replace("_", "-")
                raise InputError(
                    f"{option} '' names nothing: give a value, or leave the option out for "
                    f"${env} or {default!r}",
                    reason="bad_usage",
                )
            if value:
                return str(value)
            return environ.get(env) or default

        sysfs_root = getattr(args, "sysfs_root", None)
        if sysfs_root == "":
            raise InputError(
                "--sysfs-root '' names no directory: give one, or leave the option out for /",
                reason="bad_usage",
            )

        return cls(
            state_dir=pick("state_dir", "COREPIN_STATE_DIR", DEFAULT_STATE_DIR),
            sysfs_root=sysfs_root or "/",
            proc_root=getattr(args, "proc_root", None) or "/proc",
            cgroup_root=pick("cgroup_root", "COREPIN_CGROUP_ROOT", DEFAULT_CGROUP_ROOT),
            cgroups=pick("cgroups", "COREPIN_CGROUPS", "auto"),
            policy=pick("policy", "COREPIN_POLICY", DEFAULT_POLICY),
            force_membind=environ.get("COREPIN_FORCE_MEMBIND", "") == "1",
            lock_timeout=_seconds(environ.get("COREPIN_LOCK_TIMEOUT"), "COREPIN_LOCK_TIMEOUT"),
        )


def _seconds(text: str | None, name: str) -> float:
    """A positive number of seconds from the environment variable `name` (unset or empty:
    the default)."""
    if not text:
        return DEFAULT_LOCK_TIMEOUT
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise InputError(
            f"{name}={text!r} is not a positive number of seconds", reason="bad_lock_timeout"
        )
    return value
