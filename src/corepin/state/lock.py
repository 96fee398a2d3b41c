"""The state lock: an exclusive `flock` on `state.lock`, granted in arrival order.

`flock` alone is not fair: when the holder lets go, whichever waiter happens to poll next wins,
so under contention one corepin process may wait while later ones go first. Waiters therefore
queue in a ticket directory next to the lock, `state.lock.queue/`:

- a waiter takes a ticket: it creates a file under a temp name (`.tmp-<pid>-<random>`), takes an
  exclusive `flock` on it, and renames it in place to `<monotonic ns, 20 digits>-<pid>-<random>`,
  so ticket names sort in arrival order and a ticket is never visible unlocked while its owner
  lives. The owner keeps that flock until it leaves the queue;
- a ticket whose file is not locked belongs to a waiter that died (the kernel dropped its
  flock): whoever finds one removes it (temp files too: a creator that loses its temp file to
  such a clean-up before renaming it simply starts over);
- the oldest live ticket goes next: only its owner tries `flock(state.lock, LOCK_EX|LOCK_NB)`;
  the others wait until no live ticket older than theirs is left;
- a waiter that is stopped (SIGSTOP, Ctrl-Z, a debugger: state `T` or `t` in /proc/PID/stat,
  PID read from its ticket's name) does not hold up the ones behind it while it stays stopped:
  they pass it by. Nor does one that leaves a free lock untaken (too slow to be scheduled, or
  in another PID namespace, so that its stop cannot be seen): the waiter behind it probes the
  lock (LOCK_NB, let go at once) and, when it has found it free at every look for `GRACE`
  seconds times its place in line, keeps it. Neither loses its ticket: once it runs again
  and looks, it is first in line again and the others wait for it;
- with the lock in hand the owner removes its ticket (unlink, then close).

Mutual exclusion rests on the flock of `state.lock` alone; the queue only orders corepin
processes. An operator or a tool that runs `flock /var/lib/corepin/state.lock CMD` therefore
still pauses corepin: the head of the queue waits behind it. A process that finds no ticket
and a free lock takes the lock at once (one listdir, one flock). Waiting is polling (at most
every 20 ms), because `flock` has no timeout; the lock is held for short transactions, so lines
are short.

The order is that of CLOCK_MONOTONIC, which Linux keeps system-wide (processes in different
time namespaces sharing one state directory would be ordered by their own clocks: still safe,
maybe not fair).

On timeout the error says how long it waited, which process holds the lock (found in
/proc/locks by the lock file's device and inode, so an operator's `flock` shows too) and how
many corepin processes queue ahead.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import time
from typing import Final

from corepin.core.errors import CorepinError, EnvironmentProblem, StateError
from corepin.state.checkpoint import OPEN_FLAGS, os_error
from corepin.sysfs.procfs import lock_holders, read_stat

LOCK_FILE: Final = "state.lock"
QUEUE_DIR: Final = "state.lock.queue"
TEMP_PREFIX: Final = ".tmp-"
#: Longest pause between two looks at the queue and the lock, in seconds.
MAX_POLL: Final = 0.02
#: How long (times its place in line) a waiter lets a free lock lie untaken by the running
#: waiter ahead of it before it takes the lock itself, in seconds.
GRACE: Final = 0.5


def acquire(dir_fd: int, directory: str, timeout: float, *, proc_root: str = "/proc") -> int:
    """Lock `directory/state.lock` (reached through `dir_fd`) exclusively, in arrival order.

    Returns the descriptor of the lock file: closing it releases the lock. StateError with
    reason `lock_timeout` after `timeout` seconds of waiting."""
    lock_path = os.path.join(directory, LOCK_FILE)
    queue_path = os.path.join(directory, QUEUE_DIR)
    lock_fd = _open_lock(dir_fd, lock_path)
    try:
        queue_fd = _open_queue(dir_fd, queue_path)
        try:
            if not _tickets(queue_fd):
                with contextlib.suppress(BlockingIOError):
                    fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    return lock_fd
            _wait_in_line(queue_fd, lock_fd, lock_path, timeout, proc_root)
            return lock_fd
        except OSError as exc:  # the queue directory failed under us (EIO, EMFILE, ...)
            raise os_error(queue_path, exc, "queue for the state lock") from None
        finally:
            os.close(queue_fd)
    except BaseException:
        os.close(lock_fd)
        raise


def _open_lock(dir_fd: int, lock_path: str) -> int:
    try:
        fd = os.open(LOCK_FILE, os.O_RDWR | os.O_CREAT | OPEN_FLAGS, 0o600, dir_fd=dir_fd)
    except OSError as exc:
        raise os_error(lock_path, exc, "open the lock file") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise StateError(
            f"{lock_path}: is not a regular file; remove it (corepin creates it), or pass "
            "another --state-dir",
            reason="state_not_regular",
        )
    return fd


def _open_queue(dir_fd: int, queue_path: str, name: str = QUEUE_DIR) -> int:
    """The ticket directory `name` of the state directory (created 0700 when missing); the
    state lock's own by default (`corepin.state.waitline` keeps another)."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    for _ in range(3):
        try:
            return os.open(name, flags, dir_fd=dir_fd)
        except FileNotFoundError:
            pass
        except OSError as exc:
            if exc.errno == errno.ENOTDIR:
                raise StateError(
                    f"{queue_path}: is not a directory (corepin queues its lock waiters there); "
                    "remove it, or pass another --state-dir",
                    reason="state_not_regular",
                ) from None
            raise os_error(queue_path, exc, "open the lock queue") from None
        try:
            os.mkdir(name, 0o700, dir_fd=dir_fd)
        except FileExistsError:
            pass
        except OSError as exc:
            raise os_error(queue_path, exc, "create the lock queue") from None
    raise StateError(f"{queue_path}: keeps disappearing; is another program removing it?")


def _tickets(queue_fd: int) -> list[str]:
    """The ticket names (oldest first); temp files are not tickets yet."""
    return sorted(n for n in os.listdir(queue_fd) if not n.startswith("."))


def _take_ticket(queue_fd: int) -> tuple[int, str]:
    """A new ticket: (descriptor holding its flock, name)."""
    pid = os.getpid()
    while True:
        tmp = f"{TEMP_PREFIX}{pid}-{os.urandom(4).hex()}"
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | OPEN_FLAGS, 0o600, dir_fd=queue_fd)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            name = f"{time.monotonic_ns():020d}-{pid}-{os.urandom(4).hex()}"
            os.rename(tmp, name, src_dir_fd=queue_fd, dst_dir_fd=queue_fd)
        except FileNotFoundError:
            os.close(fd)  # a clean-up took the temp file before it was locked: start over
            continue
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=queue_fd)
            os.close(fd)
            raise
        return fd, name


def _try_lock(lock_fd: int) -> bool:
    """Whether the lock was free (it is now held through `lock_fd`)."""
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _leave(queue_fd: int, ticket_fd: int, name: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(name, dir_fd=queue_fd)
    os.close(ticket_fd)


def _alive(queue_fd: int, name: str) -> bool:
    """Whether the ticket (or temp file) `name` is locked by a live waiter; a dead one is
    removed."""
    try:
        fd = os.open(name, os.O_RDONLY | OPEN_FLAGS, dir_fd=queue_fd)
    except FileNotFoundError:
        return False
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
        fd = -1  # a link has no business here: remove it
    try:
        if fd >= 0:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        if fd >= 0:
            os.close(fd)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(name, dir_fd=queue_fd)
    return False


def _stopped(name: str, proc_root: str) -> bool:
    """Whether the owner of ticket `name` (its pid is the name's second field) is stopped."""
    try:
        return read_stat(int(name.split("-")[1]), proc_root).stopped
    except (IndexError, ValueError, CorepinError):
        return False


def _live_ahead(
    queue_fd: int, mine: str, *, count_all: bool = False, proc_root: str = "/proc"
) -> int:
    """How many live tickets whose owners are not stopped are older than `mine` (dead ones met
    on the way are removed); with `count_all`, how many live ones (stopped or not).

    Looks from the nearest predecessor backwards and stops at the first one that counts unless
    `count_all`: a waiter only needs to know whether it is first in line."""
    return _ahead(queue_fd, mine, count_all=count_all, proc_root=proc_root)[0]


def _ahead(
    queue_fd: int, mine: str, *, count_all: bool = False, proc_root: str = "/proc"
) -> tuple[int, str, int]:
    """`_live_ahead`, the name of the nearest live running ticket ahead ("" when none) and how
    many tickets are older than `mine` (its place in line, dead or stopped ones included)."""
    names = os.listdir(queue_fd)
    older = sorted((n for n in names if not n.startswith(".") and n < mine), reverse=True)
    live = 0
    for name in older:
        if _alive(queue_fd, name) and (count_all or not _stopped(name, proc_root)):
            live += 1
            if not count_all:
                return live, name, len(older)
    if live == 0:  # first in line: clear what dead creators left half-made
        for name in names:
            if name.startswith(TEMP_PREFIX):
                _alive(queue_fd, name)
    return live, "", len(older)


def _wait_in_line(
    queue_fd: int, lock_fd: int, lock_path: str, timeout: float, proc_root: str
) -> None:
    start = time.monotonic()
    deadline = start + max(0.0, timeout)
    ticket_fd, ticket = _take_ticket(queue_fd)
    try:
        delay = 0.0005
        waiting_for = ""  # the running waiter ahead whose turn it is
        free_since = 0.0  # since when the lock has been found free at every look (0: it was not)
        while True:
            live, nearest, place = _ahead(queue_fd, ticket, proc_root=proc_root)
            if live == 0:
                try:
                    fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    return
                except BlockingIOError:
                    pass
            elif _try_lock(lock_fd):  # a probe: is the lock lying free?
                now = time.monotonic()
                if nearest == waiting_for and free_since and now - free_since >= GRACE * place:
                    return  # the running waiters ahead let it lie that long: keep it
                fcntl.flock(lock_fd, fcntl.LOCK_UN)
                if nearest != waiting_for or not free_since:
                    waiting_for, free_since = nearest, now
            else:
                free_since = 0.0
            now = time.monotonic()
            if now >= deadline:
                ahead = _live_ahead(queue_fd, ticket, count_all=True, proc_root=proc_root)
                raise _timeout(lock_fd, lock_path, now - start, timeout, ahead, proc_root)
            time.sleep(min(delay, deadline - now))
            delay = min(delay * 2, MAX_POLL)
    finally:
        _leave(queue_fd, ticket_fd, ticket)


def _timeout(
    lock_fd: int, lock_path: str, waited: float, timeout: float, ahead: int, proc_root: str
) -> StateError:
    info = os.fstat(lock_fd)
    holders = []
    for pid in lock_holders(info.st_dev, info.st_ino, proc_root):
        if pid == os.getpid():
            holders.append(f"pid {pid} (this very process, through another descriptor)")
            continue
        try:
            holders.append(f"pid {pid} ({read_stat(pid, proc_root).comm})")
        except (EnvironmentProblem, OSError):  # gone meanwhile, or /proc unreadable
            holders.append(f"pid {pid}")
    if holders:
        who = "it is held by " + ", ".join(holders)
    else:
        who = "its holder is not in /proc/locks (another PID namespace?)"
    queued = (
        f", and {ahead} other corepin process{'es' if ahead != 1 else ''} queue ahead of this one"
        if ahead
        else ""
    )
    return StateError(
        f"{lock_path}: waited {waited:.1f} s for the state lock (limit {timeout:g} s); {who}"
        f"{queued}. Wait for it or stop it, then retry (`fuser {lock_path}` lists the "
        "processes that have it open)",
        reason="lock_timeout",
    )
