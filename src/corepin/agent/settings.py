"""Settings every program that runs on a machine shares: where its state lives, where it reads
the machine (sysfs, /proc, the cgroup mount), which policy decides; and the key that keeps the
cgroups of two state directories apart.

Host mode (`corepin.agent.host.settings.HostSettings`) and the node agent
(`corepin.agent.node.settings.NodeSettings`) extend `AgentSettings` with their own fields. The
composition root (the CLI) builds them from command-line arguments and the environment; nothing
below the agent reads the environment. Every root is a plain path so tests can point corepin at
scratch trees.

On the start-up path of `corepin run`: the import inside `state_dir_key` stays there on purpose
(the builtin blake2 module, with hashlib only as the fallback, which would cost every run).
"""

from __future__ import annotations

import os
from typing import Final

from corepin.allocation.policies import DEFAULT_POLICY
from corepin.core.errors import InputError
from corepin.core.record import record
from corepin.state.store import DEFAULT_STATE_DIR

DEFAULT_CGROUP_ROOT: Final = "/sys/fs/cgroup"
#: where resctrl is mounted unless `--resctrl-root` says otherwise (every room)
DEFAULT_RESCTRL_ROOT: Final = "/sys/fs/resctrl"


def state_dir_key(state_dir: str) -> str:
    """A short, stable, path-safe name for a state directory (hash of its absolute path)."""
    try:  # the builtin module is much cheaper to import than hashlib (OpenSSL)
        from _blake2 import blake2b
    except ImportError:  # pragma: no cover - CPython always builds it
        from hashlib import blake2b

    path = os.path.abspath(state_dir)
    return "sd-" + blake2b(path.encode("utf-8", "surrogateescape"), digest_size=6).hexdigest()


@record
class AgentSettings:
    """Where a program on this machine keeps its state and reads the machine, and its policy."""

    state_dir: str = DEFAULT_STATE_DIR
    sysfs_root: str = "/"
    proc_root: str = "/proc"
    cgroup_root: str = DEFAULT_CGROUP_ROOT
    policy: str = DEFAULT_POLICY

    def check_state_dir(self) -> None:
        """InputError (reason `bad_state_dir`) for an empty state directory."""
        if not self.state_dir:
            raise InputError("the state directory must not be empty", reason="bad_state_dir")
