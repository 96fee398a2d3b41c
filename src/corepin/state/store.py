"""The state directory: checkpoint file, lock file, transactions.

```python
store = StateStore("/var/lib/corepin")          # the CLI passes --state-dir / COREPIN_STATE_DIR
with store.transaction(timeout=10.0) as tx:     # exclusive flock on <dir>/state.lock
    state = tx.state                            # the checkpoint (or an empty HostState)
    tx.commit(state.add(assignment))            # atomic write, revision + 1
state = store.read()                            # lock-free snapshot for reports
```

Every read-modify-write holds an exclusive `fcntl.flock` on `state.lock`, granted in arrival
order (`corepin.state.lock`), so concurrent corepin processes serialise; waiting longer than
`timeout` raises StateError (reason `lock_timeout`) saying how long it waited and who holds the
lock. The lock is released by the kernel when the process dies, so a killed corepin never
leaves the directory locked. Reads need no lock: the checkpoint is only ever replaced by
rename, so a reader sees the old or the new file, never a mix.

The directory is trusted only when it belongs to the effective user and is not writable by
group or others: whoever can write it could forge a validly
checksummed checkpoint or plant `state.lock` as a link to a file that root would then create
or open. Every operation opens the directory once (O_DIRECTORY), checks it with fstat on that
descriptor and then reaches each file relative to the descriptor (`dir_fd=`), so the directory
checked is the directory used; no file in it is opened through a symbolic link (O_NOFOLLOW).
The directory path itself may be a link (`/var/lib/corepin -> /data/corepin`): what is checked
is the directory it leads to.

The directory is created (mode 0700) when missing. A directory that cannot be created, read or
written, or that is not safe, raises StateError (exit 4) with what to do next; a path the
system refuses as too long raises InputError (exit 2).
"""

from __future__ import annotations

import errno
import os
import stat
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Final

from corepin.core.errors import InputError, StateError
from corepin.core.record import fields
from corepin.state.checkpoint import (
    STATE_FILE,
    WriteHook,
    os_error,
    read_checkpoint,
    remove_temp_files,
    write_checkpoint,
)
from corepin.state.lock import LOCK_FILE, acquire
from corepin.state.model import HostState

DEFAULT_STATE_DIR: Final = "/var/lib/corepin"
STATE_DIR_ENV: Final = "COREPIN_STATE_DIR"
DEFAULT_LOCK_TIMEOUT: Final = 10.0
__all__ = [
    "DEFAULT_LOCK_TIMEOUT",
    "DEFAULT_STATE_DIR",
    "LOCK_FILE",
    "STATE_DIR_ENV",
    "StateStore",
    "Transaction",
    "state_dir_from",
]

_WHAT_TO_DO: Final = (
    "run corepin as root, or pass --state-dir DIR (or set COREPIN_STATE_DIR) to a directory "
    "this user may write"
)
_DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


#: What identifies one version of the checkpoint file on disk: (inode, mtime ns, size). Every
#: commit renames a new file into place, so a new version always has a new inode.
Stamp = tuple[int, int, int]


def _stamp(dir_fd: int | None, path: str) -> Stamp | None:
    try:
        if dir_fd is None:
            info = os.stat(path, follow_symlinks=False)
        else:
            info = os.stat(os.path.basename(path), dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return None
    return (info.st_ino, info.st_mtime_ns, info.st_size)


class Transaction:
    """One locked read-modify-write. Obtain it from `StateStore.transaction()`."""

    __slots__ = ("_committed", "_dir_fd", "_exists", "_hook", "_path", "_state", "reused", "stamp")

    def __init__(
        self,
        path: str,
        state: HostState,
        exists: bool,
        hook: WriteHook | None,
        dir_fd: int | None = None,
        *,
        stamp: Stamp | None = None,
        reused: bool = False,
    ) -> None:
        self._path = path
        self._state = state
        self._exists = exists
        self._hook = hook
        self._dir_fd = dir_fd
        self._committed = False
        #: the checkpoint's version on disk (after a commit: the one written)
        self.stamp = stamp
        #: True when `state` is the caller's cached copy (the file had not changed)
        self.reused = reused

    @property
    def state(self) -> HostState:
        """The current state (after any commit in this transaction)."""
        return self._state

    @property
    def existed(self) -> bool:
        """Whether a checkpoint existed when the transaction began."""
        return self._exists

    @property
    def committed(self) -> bool:
        return self._committed

    def commit(self, new_state: HostState) -> HostState:
        """Write `new_state` (with the next revision) atomically; returns what was written.

        The file is fsynced before it replaces the checkpoint, always; the directory too
        (making the replacement itself survive a power loss) unless the commit changes nothing
        but records of processes (`only_processes_differ`; see `corepin.state.checkpoint`)."""
        written = new_state.evolve(revision=self._state.revision + 1)
        sync_dir = not self._exists or not only_processes_differ(self._state, written)
        write_checkpoint(
            self._path, written, hook=self._hook, dir_fd=self._dir_fd, sync_dir=sync_dir
        )
        self._state = written
        self._exists = True
        self._committed = True
        self.stamp = _stamp(self._dir_fd, self._path)
        return written


def only_processes_differ(old: HostState, new: HostState) -> bool:
    """Whether `new` differs from `old` in records of processes alone (assignments owned by a
    process: added, removed or changed), the revision aside. Such a difference names nothing
    after a power loss or kernel crash, which ends every process."""
    lasting = [f.name for f in fields(HostState) if f.compare]
    if any(
        getattr(old, name) != getattr(new, name)
        for name in lasting
        if name not in ("revision", "assignments")
    ):
        return False
    before, after = old.assignments, new.assignments
    for key in before.keys() | after.keys():
        a, b = before.get(key), after.get(key)
        if a == b:
            continue
        if (a is not None and a.process is None) or (b is not None and b.process is None):
            return False
    return True


class StateStore:
    """A state directory. Nothing touches the disk until a method is called.

    `proc_root` is only read to name the holder of a lock that times out (/proc/locks)."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        write_hook: WriteHook | None = None,
        proc_root: str = "/proc",
    ) -> None:
        self.directory = os.fspath(directory)
        if not self.directory:
            raise InputError(
                "the state directory must not be empty: pass --state-dir DIR, or leave the "
                "option out for $COREPIN_STATE_DIR or /var/lib/corepin",
                reason="bad_state_dir",
            )
        self.path = os.path.join(self.directory, STATE_FILE)
        self.lock_path = os.path.join(self.directory, LOCK_FILE)
        self.proc_root = proc_root
        self._write_hook = write_hook

    def __repr__(self) -> str:
        return f"StateStore({self.directory!r})"

    # ------------------------------------------------------------------ directory
    def ensure_directory(self) -> None:
        """Create the directory (0700) if missing; StateError when it is not usable or safe."""
        fd = self._open(create=True)
        assert fd is not None
        os.close(fd)

    def _open(self, *, create: bool, write: bool = True) -> int | None:
        """A checked descriptor of the directory (the caller closes it); None when it does not
        exist and `create` is false. `write=False` (lock-free reads) does not ask for write
        permission: a report may read a state on a read-only mount."""
        try:
            fd = os.open(self.directory, _DIR_FLAGS)
        except FileNotFoundError:
            if not create:
                return None
            self._create()
            try:
                fd = os.open(self.directory, _DIR_FLAGS)
            except OSError as exc:
                raise self._dir_error(exc) from None
        except OSError as exc:
            raise self._dir_error(exc) from None
        try:
            self._check(fd, write)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _create(self) -> None:
        try:
            os.makedirs(self.directory, mode=0o700, exist_ok=True)
        except PermissionError:
            raise StateError(
                f"{self.directory}: cannot create the state directory (permission denied); "
                + _WHAT_TO_DO,
                reason="state_permission",
            ) from None
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENAMETOOLONG, errno.ENOTDIR, errno.EEXIST):
                raise self._dir_error(exc) from None
            raise StateError(
                f"{self.directory}: cannot create the state directory ({exc.strerror}); "
                + _WHAT_TO_DO,
                reason="state_dir",
            ) from None

    def _dir_error(self, exc: OSError) -> Exception:
        if exc.errno in (errno.ENOTDIR, errno.EEXIST):
            if os.path.lexists(self.directory):
                return StateError(
                    f"{self.directory}: exists but is not a directory; pass --state-dir DIR",
                    reason="state_dir",
                )
            return StateError(
                f"{self.directory}: a parent of the state directory is not a directory; pass "
                "--state-dir DIR",
                reason="state_dir",
            )
        if isinstance(exc, PermissionError):
            return StateError(
                f"{self.directory}: cannot open the state directory (permission denied on it or "
                "on a parent directory); " + _WHAT_TO_DO,
                reason="state_permission",
            )
        if exc.errno == errno.ELOOP:
            return StateError(
                f"{self.directory}: cannot open the state directory: too many levels of "
                "symbolic links (a link loop?) in the path; pass --state-dir with a path that "
                "resolves",
                reason="state_dir",
            )
        return os_error(self.directory, exc, "open the state directory")

    def _check(self, fd: int, write: bool) -> None:
        """StateError unless the open directory belongs to the effective user, is not
        writable by group or others, and is readable (and writable, with `write`)."""
        info = os.fstat(fd)
        euid = os.geteuid()
        if info.st_uid != euid:
            raise StateError(
                f"{self.directory}: the state directory belongs to uid {info.st_uid}, not to "
                f"uid {euid} that runs corepin, and its owner could forge the state or plant "
                f"links in it; if it is yours, `chown {euid} {self.directory}`, else pass "
                "another --state-dir (or COREPIN_STATE_DIR)",
                reason="state_dir_unsafe",
            )
        loose = info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
        if loose:
            who = {stat.S_IWGRP: "its group", stat.S_IWOTH: "others"}.get(loose, "group and others")
            raise StateError(
                f"{self.directory}: the state directory is writable by {who} (mode "
                f"{stat.S_IMODE(info.st_mode):04o}), who could forge the state or plant links "
                f"in it; `chmod go-w {self.directory}`, or pass another --state-dir (or "
                "COREPIN_STATE_DIR)",
                reason="state_dir_unsafe",
            )
        if not os.access(".", os.R_OK | os.X_OK | (os.W_OK if write else 0), dir_fd=fd):
            raise StateError(
                f"{self.directory}: the state directory is not readable and writable by uid "
                f"{euid}; " + _WHAT_TO_DO,
                reason="state_permission",
            )

    # ------------------------------------------------------------------ reading
    def read(self) -> HostState | None:
        """The committed state, or None when there is no checkpoint. No lock taken.

        StateFormatError when the checkpoint is corrupt (the file is left untouched).
        """
        fd = self._open(create=False, write=False)
        if fd is None:
            return None
        try:
            return read_checkpoint(self.path, dir_fd=fd)
        finally:
            os.close(fd)

    def exists(self) -> bool:
        fd = self._open(create=False, write=False)
        if fd is None:
            return False
        try:
            os.stat(STATE_FILE, dir_fd=fd, follow_symlinks=False)
            return True
        except FileNotFoundError:
            return False
        finally:
            os.close(fd)

    # ------------------------------------------------------------------ locking
    @contextmanager
    def lock(self, timeout: float = DEFAULT_LOCK_TIMEOUT) -> Iterator[None]:
        """Hold the exclusive lock of the state directory."""
        with self._locked(timeout):
            yield

    @contextmanager
    def _locked(self, timeout: float) -> Iterator[int]:
        """Hold the lock; yields the checked descriptor of the directory."""
        dir_fd = self._open(create=True)
        assert dir_fd is not None
        try:
            lock_fd = self._acquire(dir_fd, timeout)
            try:
                yield dir_fd
            finally:
                os.close(lock_fd)  # closing the descriptor releases the flock
        finally:
            os.close(dir_fd)

    def _acquire(self, dir_fd: int, timeout: float) -> int:
        return acquire(dir_fd, self.directory, timeout, proc_root=self.proc_root)

    @contextmanager
    def transaction(
        self,
        timeout: float = DEFAULT_LOCK_TIMEOUT,
        *,
        cached: tuple[Stamp, HostState] | None = None,
    ) -> Iterator[Transaction]:
        """Locked read-modify-write. `tx.state` is the checkpoint (or an empty HostState when
        there is none yet); `tx.commit(new)` writes atomically. Without a commit nothing is
        written. A corrupt checkpoint raises StateFormatError and stays untouched.

        `cached` = (stamp, state) of the checkpoint as the caller last read or wrote it (a
        long-running writer such as the node agent): when the file on disk is still that
        version, `tx.state` is the cached state and nothing is read (`tx.reused`)."""
        with self._locked(timeout) as dir_fd:
            stamp = _stamp(dir_fd, self.path)
            if cached is not None and stamp is not None and cached[0] == stamp:
                yield Transaction(
                    self.path, cached[1], True, self._write_hook, dir_fd, stamp=stamp, reused=True
                )
                return
            remove_temp_files(self.directory, dir_fd=dir_fd)
            state = read_checkpoint(self.path, dir_fd=dir_fd)
            exists = state is not None
            yield Transaction(
                self.path, state or HostState(), exists, self._write_hook, dir_fd, stamp=stamp
            )

    # ------------------------------------------------------------------ maintenance
    def quarantine(self) -> str | None:
        """Rename a (corrupt) checkpoint to `state.json.corrupt-<timestamp>` so that corepin can
        start from an empty state. Only on explicit request of the operator. Returns the new
        path, or None when there was no checkpoint."""
        with self._locked(DEFAULT_LOCK_TIMEOUT) as dir_fd:
            if not _entry_exists(STATE_FILE, dir_fd):
                return None
            stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
            target = f"{STATE_FILE}.corrupt-{stamp}"
            n = 1
            while _entry_exists(target, dir_fd):
                n += 1
                target = f"{STATE_FILE}.corrupt-{stamp}-{n}"
            try:
                os.rename(STATE_FILE, target, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
                os.fsync(dir_fd)
            except OSError as exc:
                raise StateError(f"{self.path}: cannot quarantine: {exc.strerror}") from None
            return os.path.join(self.directory, target)


def _entry_exists(name: str, dir_fd: int) -> bool:
    """Whether `name` exists in the directory (a link counts; it is not followed)."""
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def state_dir_from(env: dict[str, str] | None = None, override: str | None = None) -> str:
    """The state directory the CLI should use: --state-dir, else COREPIN_STATE_DIR, else
    /var/lib/corepin. (Only the composition root calls this.) An empty --state-dir is an
    InputError; an empty COREPIN_STATE_DIR counts as unset."""
    if override is not None:
        if not override:
            raise InputError(
                "--state-dir '' names no directory: pass a directory, or leave the option out "
                f"for ${STATE_DIR_ENV} or {DEFAULT_STATE_DIR}",
                reason="bad_state_dir",
            )
        return override
    source = os.environ if env is None else env
    return source.get(STATE_DIR_ENV) or DEFAULT_STATE_DIR
