"""The state directory: checkpoint file, lock file, transactions.

```python
store = StateStore("/var/lib/corepin")          # the CLI passes --state-dir / COREPIN_STATE_DIR
with store.transaction(timeout=10.0) as tx:     # exclusive flock on <dir>/state.lock
    state = tx.state                            # the checkpoint (or an empty HostState)
    tx.commit(state.add(assignment))            # atomic write, revision + 1
state = store.read()                            # lock-free snapshot for reports
```

Every read-modify-write holds an exclusive `fcntl.flock` on `state.lock`, so concurrent corepin
processes serialise; waiting longer than `timeout` raises StateError (reason `lock_timeout`)
saying who to look for. The lock is released by the kernel when the process dies, so a killed
corepin never leaves the directory locked. Reads need no lock: the checkpoint is only ever
replaced by rename, so a reader sees the old or the new file, never a mix.

The directory is created (mode 0700) when missing. A directory that cannot be created, read or
written raises StateError (exit 4) with what to do next.
"""

from __future__ import annotations

import fcntl
import os
import stat
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Final

from corepin.core.errors import StateError
from corepin.state.checkpoint import (
    STATE_FILE,
    WriteHook,
    read_checkpoint,
    remove_temp_files,
    write_checkpoint,
)
from corepin.state.model import HostState

DEFAULT_STATE_DIR: Final = "/var/lib/corepin"
STATE_DIR_ENV: Final = "COREPIN_STATE_DIR"
LOCK_FILE: Final = "state.lock"
DEFAULT_LOCK_TIMEOUT: Final = 10.0

_WHAT_TO_DO: Final = (
    "run corepin as root, or pass --state-dir DIR (or set COREPIN_STATE_DIR) to a directory "
    "this user may write"
)


class Transaction:
    """One locked read-modify-write. Obtain it from `StateStore.transaction()`."""

    __slots__ = ("_committed", "_exists", "_hook", "_path", "_state")

    def __init__(self, path: str, state: HostState, exists: bool, hook: WriteHook | None) -> None:
        self._path = path
        self._state = state
        self._exists = exists
        self._hook = hook
        self._committed = False

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
        """Write `new_state` (with the next revision) atomically; returns what was written."""
        written = new_state.evolve(revision=self._state.revision + 1)
        write_checkpoint(self._path, written, hook=self._hook)
        self._state = written
        self._exists = True
        self._committed = True
        return written


class StateStore:
    """A state directory. Nothing touches the disk until a method is called."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        write_hook: WriteHook | None = None,
    ) -> None:
        self.directory = os.fspath(directory)
        self.path = os.path.join(self.directory, STATE_FILE)
        self.lock_path = os.path.join(self.directory, LOCK_FILE)
        self._write_hook = write_hook

    def __repr__(self) -> str:
        return f"StateStore({self.directory!r})"

    # ------------------------------------------------------------------ directory
    def ensure_directory(self) -> None:
        """Create the directory (0700) if missing; StateError when it is not usable."""
        try:
            info = os.stat(self.directory)
        except FileNotFoundError:
            info = None
        except PermissionError:
            raise StateError(
                f"{self.directory}: cannot reach the state directory (permission denied on a "
                "parent directory); " + _WHAT_TO_DO,
                reason="state_permission",
            ) from None
        except NotADirectoryError:
            raise StateError(
                f"{self.directory}: a parent of the state directory is not a directory; pass "
                "--state-dir DIR",
                reason="state_dir",
            ) from None
        if info is None:
            try:
                os.makedirs(self.directory, mode=0o700, exist_ok=True)
            except PermissionError:
                raise StateError(
                    f"{self.directory}: cannot create the state directory (permission denied); "
                    + _WHAT_TO_DO,
                    reason="state_permission",
                ) from None
            except OSError as exc:
                raise StateError(
                    f"{self.directory}: cannot create the state directory ({exc.strerror}); "
                    + _WHAT_TO_DO,
                    reason="state_dir",
                ) from None
        elif not stat.S_ISDIR(info.st_mode):
            raise StateError(
                f"{self.directory}: exists but is not a directory; pass --state-dir DIR",
                reason="state_dir",
            )
        if not os.access(self.directory, os.R_OK | os.W_OK | os.X_OK):
            raise StateError(
                f"{self.directory}: the state directory is not readable and writable by uid "
                f"{os.geteuid()}; " + _WHAT_TO_DO,
                reason="state_permission",
            )

    # ------------------------------------------------------------------ reading
    def read(self) -> HostState | None:
        """The committed state, or None when there is no checkpoint. No lock taken.

        StateFormatError when the checkpoint is corrupt (the file is left untouched).
        """
        if not os.path.isdir(self.directory):
            if os.path.exists(self.directory):
                raise StateError(
                    f"{self.directory}: exists but is not a directory; pass --state-dir DIR",
                    reason="state_dir",
                )
            return None
        return read_checkpoint(self.path)

    def exists(self) -> bool:
        return os.path.exists(self.path)

    # ------------------------------------------------------------------ locking
    @contextmanager
    def lock(self, timeout: float = DEFAULT_LOCK_TIMEOUT) -> Iterator[None]:
        """Hold the exclusive lock of the state directory."""
        self.ensure_directory()
        try:
            fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except PermissionError:
            raise StateError(
                f"{self.lock_path}: cannot open the lock file (permission denied); " + _WHAT_TO_DO,
                reason="state_permission",
            ) from None
        except OSError as exc:
            raise StateError(
                f"{self.lock_path}: cannot open the lock file ({exc.strerror})",
                reason="state_dir",
            ) from None
        try:
            self._acquire(fd, timeout)
            yield
        finally:
            os.close(fd)  # closing the descriptor releases the flock

    def _acquire(self, fd: int, timeout: float) -> None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            pass
        deadline = time.monotonic() + max(0.0, timeout)
        delay = 0.001
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                pass
            now = time.monotonic()
            if now >= deadline:
                raise StateError(
                    f"{self.lock_path}: another corepin process has held the state lock for "
                    f"more than {timeout:g} s; find it with `fuser {self.lock_path}` (or lsof) "
                    "and wait for it or stop it, then retry",
                    reason="lock_timeout",
                )
            time.sleep(min(delay, deadline - now))
            delay = min(delay * 2, 0.05)

    @contextmanager
    def transaction(self, timeout: float = DEFAULT_LOCK_TIMEOUT) -> Iterator[Transaction]:
        """Locked read-modify-write. `tx.state` is the checkpoint (or an empty HostState when
        there is none yet); `tx.commit(new)` writes atomically. Without a commit nothing is
        written. A corrupt checkpoint raises StateFormatError and stays untouched."""
        with self.lock(timeout):
            self.cleanup()
            state = read_checkpoint(self.path)
            exists = state is not None
            yield Transaction(self.path, state or HostState(), exists, self._write_hook)

    # ------------------------------------------------------------------ maintenance
    def cleanup(self) -> list[str]:
        """Remove temp files left by crashed writers. Call only while holding the lock."""
        return remove_temp_files(self.directory)

    def quarantine(self) -> str | None:
        """Rename a (corrupt) checkpoint to `state.json.corrupt-<timestamp>` so that corepin can
        start from an empty state. Only on explicit request of the operator. Returns the new
        path, or None when there was no checkpoint."""
        with self.lock():
            if not os.path.exists(self.path):
                return None
            stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
            target = f"{self.path}.corrupt-{stamp}"
            n = 1
            while os.path.exists(target):
                n += 1
                target = f"{self.path}.corrupt-{stamp}-{n}"
            try:
                os.rename(self.path, target)
                dfd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
                try:
                    os.fsync(dfd)
                finally:
                    os.close(dfd)
            except OSError as exc:
                raise StateError(f"{self.path}: cannot quarantine: {exc.strerror}") from None
            return target


def state_dir_from(env: dict[str, str] | None = None, override: str | None = None) -> str:
    """The state directory the CLI should use: --state-dir, else COREPIN_STATE_DIR, else
    /var/lib/corepin. (Only the composition root calls this.)"""
    if override:
        return override
    source = os.environ if env is None else env
    return source.get(STATE_DIR_ENV) or DEFAULT_STATE_DIR
