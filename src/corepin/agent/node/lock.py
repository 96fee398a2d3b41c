"""The node lock: one manager per node, the node agent or the NRI plugin.

An exclusive `flock` on `<state dir>/agent.lock`, held for the manager's life. A second manager
of the same kind (a rolling update) waits for it - reading no state and writing nothing - until
the first stops or dies (the kernel drops the lock of a dead process at once), then takes over.
The file names its holder (`pid=... node=... mode=agent|nri`), which the waiting one logs once.
A manager of the other kind is refused at once (EnvironmentProblem, exit 4, naming the holder):
`corepin agent` and `corepin nri` never manage one node together. A holder line without a mode
was written by an agent.
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
import time
from typing import Final

from corepin.core.errors import EnvironmentProblem

log = logging.getLogger("corepin.agent.node")

#: the node lock in the state directory
LOCK_FILE: Final = "agent.lock"
#: the kinds of node manager, as `corepin <mode>` names them
MODES: Final = ("agent", "nri")


class NodeLock:
    """The node lock of the manager (`mode`) of `node_name` whose state lives in `state_dir`."""

    def __init__(self, state_dir: str, node_name: str, mode: str = "agent") -> None:
        if mode not in MODES:
            raise ValueError(f"unknown node manager {mode!r}")
        self.state_dir = state_dir
        self.node_name = node_name
        self.mode = mode
        self._fd: int | None = None

    def acquire(self, stop: threading.Event | None = None, poll: float = 0.2) -> bool:
        """Hold the lock (see the module docstring), waiting as long as another agent holds it.
        False when `stop` was set while waiting."""
        if self._fd is not None:
            return True
        path = os.path.join(self.state_dir, LOCK_FILE)
        try:
            os.makedirs(self.state_dir, mode=0o755, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise EnvironmentProblem(
                f"cannot open the node lock {path}: {exc.strerror or exc}",
                reason="node_lock_unusable",
            ) from exc
        told = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                holder = os.pread(fd, 200, 0).decode("ascii", "replace").strip()
                other = _mode_of(holder)
                if other is not None and other != self.mode:
                    os.close(fd)
                    raise EnvironmentProblem(
                        f"corepin {other} ({holder}) already manages this node with state "
                        f"directory {self.state_dir}; corepin agent and corepin nri cannot "
                        f"manage one node together: stop corepin {other} first",
                        reason="other_node_manager",
                    ) from None
                if not told and holder:
                    log.warning(
                        "event=node_lock_busy path=%s holder=%s: another agent manages node %s; "
                        "waiting until it stops",
                        path,
                        holder,
                        self.node_name,
                    )
                    told = True
                if stop is not None and stop.wait(poll):
                    os.close(fd)
                    return False
                if stop is None:
                    time.sleep(poll)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid={os.getpid()} node={self.node_name} mode={self.mode}\n".encode(), 0)
        self._fd = fd
        if told:
            log.info("event=node_lock_taken_over path=%s", path)
        return True

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


def _mode_of(holder: str) -> str | None:
    """The kind of manager a holder line names (None while the holder has not written it)."""
    if not holder:
        return None
    for word in holder.split():
        key, _, value = word.partition("=")
        if key == "mode":
            return value
    return "agent"  # (written before there were two kinds)


__all__ = ["LOCK_FILE", "MODES", "NodeLock"]
