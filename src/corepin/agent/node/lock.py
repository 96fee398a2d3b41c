"""The node lock: one agent per node.

An exclusive `flock` on `<state dir>/agent.lock`, held for the agent's life. A second agent of
the same node waits for it - reading no state and writing no cgroup - until the first stops or
dies (the kernel drops the lock of a dead process at once), then takes over. The file names its
holder (`pid=... node=...`), which the waiting agent logs once.
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


class NodeLock:
    """The node lock of the agent of `node_name` whose state lives in `state_dir`."""

    def __init__(self, state_dir: str, node_name: str) -> None:
        self.state_dir = state_dir
        self.node_name = node_name
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
                if not told:
                    holder = os.pread(fd, 200, 0).decode("ascii", "replace").strip()
                    log.warning(
                        "event=node_lock_busy path=%s holder=%s: another agent manages node %s; "
                        "waiting until it stops",
                        path,
                        holder or "unknown",
                        self.node_name,
                    )
                    told = True
                if stop is not None and stop.wait(poll):
                    os.close(fd)
                    return False
                if stop is None:
                    time.sleep(poll)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid={os.getpid()} node={self.node_name}\n".encode(), 0)
        self._fd = fd
        if told:
            log.info("event=node_lock_taken_over path=%s", path)
        return True

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


__all__ = ["LOCK_FILE", "NodeLock"]
