"""Host-mode settings: where state lives, which roots to read, whether to use cgroups.

The composition root (the CLI) builds one `HostSettings` from command-line arguments and the
environment; nothing below the agent reads the environment. Every root is a plain path so tests
can point corepin at scratch trees.

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

import os
from collections.abc import Mapping
from typing import Any, Final

from corepin.core.errors import InputError
from corepin.core.record import record

DEFAULT_STATE_DIR: Final = "/var/lib/corepin"
DEFAULT_CGROUP_ROOT: Final = "/sys/fs/cgroup"
DEFAULT_POLICY: Final = "topology-aware"
DEFAULT_LOCK_TIMEOUT: Final = 10.0
CGROUP_MODES: Final = ("auto", "on", "off")
#: corepin's own cgroup under the cpuset hierarchy. Each state directory gets a group of its own
#: below it (`<root>/cpuset/corepin/<state dir key>/<run id>`), so runs of two state directories
#: on one host never see (or remove) each other's cgroups.
CGROUP_PARENT: Final = "corepin"


def state_dir_key(state_dir: str) -> str:
    """A short, stable, path-safe name for a state directory (hash of its absolute path)."""
    try:  # the builtin module is much cheaper to import than hashlib (OpenSSL)
        from _blake2 import blake2b
    except ImportError:  # pragma: no cover - CPython always builds it
        from hashlib import blake2b

    path = os.path.abspath(state_dir)
    return "sd-" + blake2b(path.encode("utf-8", "surrogateescape"), digest_size=6).hexdigest()


@record
class HostSettings:
    """Everything host mode needs to know about where things are."""

    state_dir: str = DEFAULT_STATE_DIR
    sysfs_root: str = "/"
    proc_root: str = "/proc"
    cgroup_root: str = DEFAULT_CGROUP_ROOT
    cgroups: str = "auto"
    policy: str = DEFAULT_POLICY
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
        if not self.state_dir:
            raise InputError("the state directory must not be empty", reason="bad_state_dir")
        if not self.cgroup_parent:
            object.__setattr__(
                self, "cgroup_parent", f"{CGROUP_PARENT}/{state_dir_key(self.state_dir)}"
            )

    @classmethod
    def from_args(cls, args: Any, environ: Mapping[str, str]) -> HostSettings:
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
