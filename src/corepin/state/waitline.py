"""The line of `corepin run --wait`: runs that wait for CPUs are served in arrival order.

A waiting run takes a ticket in `<state dir>/state.wait.queue/`, made and kept exactly like the
tickets of the state lock's queue (`corepin.state.lock`): a file locked with `flock` by its
owner while it lives, named `<CLOCK_MONOTONIC ns>-<pid>-<random>` so names sort in arrival
order; a ticket whose owner died is unlocked and removed by whoever finds it. Only the run at
the head of the line (no live older ticket) tries to allocate; the others wait behind it, so a
run that arrived later never takes CPUs an earlier one is waiting for, whatever their sizes
(strict first come, first served). A run without `--wait` does not queue: it tries once.

Waiting sleeps in the kernel, never spins on the state lock: the line watches, with inotify,
the queue directory (a ticket ahead leaving) and the state directory (a new checkpoint renamed
into place: CPUs may have been freed), and wakes at least every `RECHECK` seconds, which
catches what changes nothing on disk (a process holding CPUs died: the next transaction reaps
it, a waiter ahead died: its ticket is unlocked). Where inotify is not available it naps
`RECHECK` seconds at a time.
"""

from __future__ import annotations

import contextlib
import os
import select
import time
from typing import Final

from corepin.state.checkpoint import os_error
from corepin.state.lock import _leave, _live_ahead, _open_queue, _take_ticket

WAIT_QUEUE: Final = "state.wait.queue"
#: Longest sleep between two looks, in seconds.
RECHECK: Final = 0.5

_IN_MOVED_TO: Final = 0x00000080
_IN_DELETE: Final = 0x00000200
_IN_CLOSE_WRITE: Final = 0x00000008


class _Inotify:
    """A minimal inotify instance (ctypes; loaded only by waiting runs)."""

    def __init__(self) -> None:
        import ctypes

        self._libc = ctypes.CDLL(None, use_errno=True)
        fd = self._libc.inotify_init1(os.O_CLOEXEC | os.O_NONBLOCK)
        if fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        self.fd: int = fd

    def watch(self, path: str, mask: int) -> None:
        import ctypes

        if self._libc.inotify_add_watch(self.fd, os.fsencode(path), mask) < 0:
            raise OSError(ctypes.get_errno(), f"inotify_add_watch {path}")

    def wait(self, timeout: float) -> None:
        ready, _, _ = select.select([self.fd], [], [], max(0.0, timeout))
        if ready:
            with contextlib.suppress(BlockingIOError):
                while os.read(self.fd, 65536):
                    pass

    def close(self) -> None:
        os.close(self.fd)


class WaitLine:
    """One run's place in the line of a state directory. Use as a context manager (the ticket
    is given back on exit, also on errors and Ctrl-C)."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.queue_path = os.path.join(directory, WAIT_QUEUE)
        self._dir_fd = -1
        self._queue_fd = -1
        self._ticket_fd = -1
        self._ticket = ""
        self._notify: _Inotify | None = None

    def __enter__(self) -> WaitLine:
        try:
            self._dir_fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            self._queue_fd = _open_queue(self._dir_fd, self.queue_path, WAIT_QUEUE)
            self._ticket_fd, self._ticket = _take_ticket(self._queue_fd)
        except OSError as exc:
            self.__exit__(None, None, None)
            raise os_error(self.queue_path, exc, "queue for CPUs") from None
        except BaseException:
            self.__exit__(None, None, None)
            raise
        try:
            notify = _Inotify()
            notify.watch(self.queue_path, _IN_DELETE | _IN_MOVED_TO)
            notify.watch(self.directory, _IN_MOVED_TO | _IN_CLOSE_WRITE)
            self._notify = notify
        except (OSError, AttributeError):
            self._notify = None
        return self

    def __exit__(self, *_exc: object) -> None:
        self.leave()
        if self._notify is not None:
            self._notify.close()
            self._notify = None
        for name in ("_queue_fd", "_dir_fd"):
            fd = getattr(self, name)
            if fd >= 0:
                os.close(fd)
                setattr(self, name, -1)

    def ahead(self) -> int:
        """How many live runs wait ahead of this one (0: it is first in line)."""
        if not self._ticket:
            return 0
        return _live_ahead(self._queue_fd, self._ticket, count_all=True)

    def first(self) -> bool:
        return not self._ticket or _live_ahead(self._queue_fd, self._ticket) == 0

    def nap(self, deadline: float) -> None:
        """Sleep until something may have changed (see the module docstring) or `deadline`
        (time.monotonic) comes."""
        timeout = min(RECHECK, max(0.0, deadline - time.monotonic()))
        if self._notify is not None:
            self._notify.wait(timeout)
        else:
            time.sleep(timeout)

    def leave(self) -> None:
        """Give the ticket back (the next run in line goes next)."""
        if self._ticket_fd >= 0:
            _leave(self._queue_fd, self._ticket_fd, self._ticket)
            self._ticket_fd = -1
            self._ticket = ""
