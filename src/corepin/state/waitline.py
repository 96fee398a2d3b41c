"""The line of `corepin run --wait`: runs that wait for CPUs are served in arrival order.

A waiting run takes a ticket in `<state dir>/state.wait.queue/`, made and kept exactly like the
tickets of the state lock's queue (`corepin.state.lock`): a file locked with `flock` by its
owner while it lives, named `<CLOCK_MONOTONIC ns>-<pid>-<random>` so names sort in arrival
order; a ticket whose owner died is unlocked and removed by whoever finds it, and one whose
owner is stopped (Ctrl-Z) is passed by until it runs again. Only the run at the head of the
line (no live, running older ticket) tries to allocate; the others wait behind it, so a run
that arrived later never takes CPUs an earlier one is waiting for, whatever their sizes
(strict first come, first served). A run without `--wait` does not queue: it tries once.

Waiting sleeps in the kernel and wakes only for what can change its answer:

- a run behind the head waits for a ticket older than its own to be removed (inotify
  `IN_DELETE` on the queue directory), and looks again every `RECHECK` seconds (one listdir
  and one `flock` probe), which finds a waiter ahead that died or was stopped;
- the head, after an attempt that found no CPUs, waits for a checkpoint renamed into place by
  another process (inotify `IN_MOVED_TO` of `state.json`: CPUs may have been freed or
  reservations changed) and for the exit of a process that holds CPUs (a pidfd per
  assignment: the `corepin run` that waits for its command, else the process itself, checked
  by start time so a recycled pid is never watched). An assignment whose holder cannot be
  watched that way (a container, processes lingering after their main one, too many to watch)
  makes the head try again every `RECHECK` seconds; otherwise it tries again every
  `IDLE_RECHECK` seconds in case something was missed.

A waiter's own attempts write nothing when they fail (its look at the state lock opens and
closes `state.lock`, which nobody watches), so a waiter never wakes itself up. Where inotify or
pidfds are not available it naps `RECHECK` seconds at a time.
"""

from __future__ import annotations

import ctypes
import math
import os
import select
import struct
import time
from typing import Final

from corepin.core.errors import CorepinError
from corepin.state.checkpoint import STATE_FILE, os_error, read_checkpoint
from corepin.state.lock import _leave, _live_ahead, _open_queue, _take_ticket
from corepin.sysfs.procfs import process_start_time

WAIT_QUEUE: Final = "state.wait.queue"
#: Longest sleep between two looks, in seconds (see the module docstring).
RECHECK: Final = 0.5
#: Longest sleep of the head of the line when every holder of CPUs is watched, in seconds.
IDLE_RECHECK: Final = 5.0
#: The most processes the head watches through pidfds.
MAX_WATCHED: Final = 256

_IN_MOVED_TO: Final = 0x00000080
_IN_DELETE: Final = 0x00000200
_IN_Q_OVERFLOW: Final = 0x00004000
_IN_IGNORED: Final = 0x00008000
_EVENT: Final = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len (+ name)


class _Inotify:
    """A minimal inotify instance (ctypes: the standard library has no inotify; loaded only
    by waiting runs)."""

    def __init__(self) -> None:
        self._libc = ctypes.CDLL(None, use_errno=True)
        fd = self._libc.inotify_init1(os.O_CLOEXEC | os.O_NONBLOCK)
        if fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        self.fd: int = fd

    def watch(self, path: str, mask: int) -> int:
        wd: int = self._libc.inotify_add_watch(self.fd, os.fsencode(path), mask)
        if wd < 0:
            raise OSError(ctypes.get_errno(), f"inotify_add_watch {path}")
        return wd

    def events(self) -> list[tuple[int, int, str]]:
        """The events queued so far: (watch descriptor, mask, name)."""
        out: list[tuple[int, int, str]] = []
        while True:
            try:
                data = os.read(self.fd, 65536)
            except BlockingIOError:
                return out
            if not data:
                return out
            offset = 0
            while offset + _EVENT.size <= len(data):
                wd, mask, _cookie, size = _EVENT.unpack_from(data, offset)
                start = offset + _EVENT.size
                name = data[start : start + size].rstrip(b"\0")
                out.append((wd, mask, os.fsdecode(name)))
                offset = start + size

    def close(self) -> None:
        os.close(self.fd)


class WaitLine:
    """One run's place in the line of a state directory. Use as a context manager (the ticket
    is given back on exit, also on errors and Ctrl-C)."""

    def __init__(self, directory: str, *, proc_root: str = "/proc") -> None:
        self.directory = directory
        self.proc_root = proc_root
        self.queue_path = os.path.join(directory, WAIT_QUEUE)
        self._dir_fd = -1
        self._queue_fd = -1
        self._ticket_fd = -1
        self._ticket = ""
        self._notify: _Inotify | None = None
        self._queue_wd = -1
        self._dir_wd = -1
        self._first = False
        #: pidfd -> (pid, start time) of the holders the head watches
        self._pidfds: dict[int, tuple[int, int | None]] = {}
        #: the checkpoint's (inode, mtime ns, size) the pidfds were opened for
        self._holders_of: tuple[int, int, int] | None = None
        #: whether some holder of CPUs is not watched (the head then looks every RECHECK)
        self._unwatched = True
        #: holders whose exit was already seen (their pidfds stay readable: never again)
        self._gone: set[tuple[int, int | None]] = set()

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
            try:
                self._queue_wd = notify.watch(self.queue_path, _IN_DELETE)
                self._dir_wd = notify.watch(self.directory, _IN_MOVED_TO)
            except OSError:
                notify.close()
                raise
            self._notify = notify
        except (OSError, AttributeError):
            self._notify = None
        return self

    def __exit__(self, *_exc: object) -> None:
        self.leave()
        self._unwatch()
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
        return _live_ahead(self._queue_fd, self._ticket, count_all=True, proc_root=self.proc_root)

    def first(self) -> bool:
        self._first = (
            not self._ticket
            or _live_ahead(self._queue_fd, self._ticket, proc_root=self.proc_root) == 0
        )
        return self._first

    def nap(self, deadline: float) -> None:
        """Sleep until something may have changed (see the module docstring) or `deadline`
        (time.monotonic) comes. Call after `first()` (and, when first, after the attempt)."""
        now = time.monotonic()
        notify = self._notify
        if notify is None:
            time.sleep(min(RECHECK, max(0.0, deadline - now)))
            return
        if self._first:
            self._watch_holders()
            period = RECHECK if self._unwatched else IDLE_RECHECK
        else:
            self._unwatch()
            period = RECHECK
        end = min(deadline, now + period)
        poller = select.poll()
        poller.register(notify.fd, select.POLLIN)
        for fd in self._pidfds:
            poller.register(fd, select.POLLIN)
        while (left := end - time.monotonic()) > 0:
            ready = poller.poll(math.ceil(left * 1000))
            if not ready:
                return
            exited = [fd for fd, _ in ready if fd in self._pidfds]
            if exited:
                self._gone.update(self._pidfds[fd] for fd in exited)
                self._holders_of = None  # open them again, without the ones that went
                return
            if self._matters(notify.events()):
                return

    def _matters(self, events: list[tuple[int, int, str]]) -> bool:
        """Whether one of `events` may change this waiter's answer."""
        for wd, mask, name in events:
            if mask & (_IN_Q_OVERFLOW | _IN_IGNORED):
                return True  # events were lost, or a watched directory went: look
            if self._first and wd == self._dir_wd and name == STATE_FILE:
                return True
            if (
                not self._first
                and wd == self._queue_wd
                and not name.startswith(".")
                and name < self._ticket
            ):
                return True
        return False

    def _watch_holders(self) -> None:
        """Open pidfds on the processes that hold the checkpoint's assignments (unless the
        checkpoint is the one they were opened for)."""
        try:
            info = os.stat(STATE_FILE, dir_fd=self._dir_fd, follow_symlinks=False)
            stamp = (info.st_ino, info.st_mtime_ns, info.st_size)
        except OSError:
            stamp = (0, 0, 0)  # no checkpoint (yet)
        if stamp == self._holders_of:
            return
        self._unwatch()
        self._holders_of = stamp
        try:
            state = read_checkpoint(os.path.join(self.directory, STATE_FILE), dir_fd=self._dir_fd)
        except CorepinError:
            return  # the attempt reports what is wrong with it; look every RECHECK
        unwatched = False
        for a in state or ():
            process = a.process
            if process is None or len(self._pidfds) >= MAX_WATCHED:
                unwatched = True
                continue
            if process.runner_pid is not None:  # its `corepin run` frees it (or dies)
                holder = (process.runner_pid, process.runner_start_time)
            else:
                holder = (process.pid, process.start_time)
            fd = None if holder in self._gone else self._pidfd(*holder)
            if fd is None:
                unwatched = True  # gone already, or lingering: liveness needs a full look
            else:
                self._pidfds[fd] = holder
        self._unwatched = unwatched

    def _pidfd(self, pid: int, start_time: int | None) -> int | None:
        """A pidfd of `pid` if it is still the process that started at `start_time`."""
        try:
            fd = os.pidfd_open(pid)
        except (OSError, AttributeError):  # gone, or no pidfds here (Linux < 5.3)
            return None
        if start_time is not None:
            try:
                same = process_start_time(pid, self.proc_root) == start_time
            except (CorepinError, OSError):
                same = False
            if not same:
                os.close(fd)
                return None
        return fd

    def _unwatch(self) -> None:
        for fd in self._pidfds:
            os.close(fd)
        self._pidfds = {}
        self._holders_of = None
        self._unwatched = True

    def leave(self) -> None:
        """Give the ticket back (the next run in line goes next)."""
        if self._ticket_fd >= 0:
            _leave(self._queue_fd, self._ticket_fd, self._ticket)
            self._ticket_fd = -1
            self._ticket = ""
