"""The files of the state directory: safe opens and the atomic checkpoint write.

Every function here takes the file's `path` (for messages) and, optionally, `dir_fd`: a
descriptor of the directory that holds it. With `dir_fd` the file is reached by its base name
relative to that descriptor (openat and friends), so a directory that was checked once
(`corepin.state.store`) cannot be swapped for another between the check and the use. No
function follows a symbolic link in the last component of a name (O_NOFOLLOW): a link
planted as `state.json` or as a temp file is refused, never read or written through.

Writes are atomic: a temp file `.state.json.tmp-<pid>-<random>` in the same directory is
written, flushed and fsynced, renamed over the checkpoint, then the directory is fsynced. A
crash at any point leaves either the old or the new checkpoint; leftover temp files are removed
by the next writer (under the lock). A corrupt checkpoint raises `StateFormatError` naming the
file and the problem; it is never replaced silently (see `quarantine`).

The file is always fsynced before the rename, so whichever name survives a power loss leads to
a complete, checksummed file: a checkpoint is never torn. The directory's fsync (what makes the
rename itself survive a power loss) is left to the caller with `sync_dir`: the state store skips
it for a commit that changes nothing but records of processes (`corepin.state.store`), because a
power loss or kernel crash ends every process - such a commit, if the crash undoes it, leaves
the previous checkpoint, whose difference is only in records of processes that the crash ended
as well (the next transaction frees them as dead). Everything that outlives the processes
(reserved CPUs, options, the shield, containers, the topology) is written with both fsyncs.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Callable
from typing import Final

from corepin.core.errors import CorepinError, InputError, StateError, StateFormatError
from corepin.state.checkpoint import decode_checkpoint, encode_checkpoint
from corepin.state.model import HostState

STATE_FILE: Final = "state.json"
TEMP_MARK: Final = ".tmp-"

#: Points at which `write_checkpoint` calls its hook (crash-injection tests use them).
WRITE_POINTS: Final = ("opened", "written", "fsynced", "renamed", "dir_fsynced")

WriteHook = Callable[[str], None]

#: Flags of every open of a file in the state directory: no links, no hanging on a FIFO.
OPEN_FLAGS: Final = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


def os_error(path: str, exc: OSError, doing: str) -> CorepinError:
    """The corepin error for an OSError met while `doing` something with `path` in the state
    directory: StateError (exit 4) saying what to do, or InputError (exit 2) for a name the
    system refuses as too long. Never a bare OSError (exit 1)."""
    what = exc.strerror or str(exc)
    if isinstance(exc, PermissionError):
        return StateError(
            f"{path}: cannot {doing} ({what}); run corepin as the user that owns the state "
            "directory (usually root) or pass --state-dir DIR (or set COREPIN_STATE_DIR)",
            reason="state_permission",
        )
    if exc.errno == errno.ELOOP:
        if _is_link(path):
            return StateError(
                f"{path}: is a symbolic link; corepin never follows links in its state "
                "directory (one planted there could redirect its writes): remove the link, or "
                "pass another --state-dir",
                reason="state_symlink",
            )
        return StateError(
            f"{path}: cannot {doing}: too many levels of symbolic links in the path; pass "
            "--state-dir with a path that resolves",
            reason="state_dir",
        )
    if exc.errno == errno.ENAMETOOLONG:
        return InputError(
            f"{path[:80]}...: cannot {doing}: the path is too long for the system ({what}); "
            "pass a shorter --state-dir",
            reason="bad_state_dir",
        )
    return StateError(f"{path}: cannot {doing}: {what}", reason="state_dir")


def _is_link(path: str) -> bool:
    try:
        return stat.S_ISLNK(os.lstat(path).st_mode)
    except OSError:
        return False


def _regular(fd: int, path: str) -> None:
    """StateError unless the open descriptor `fd` (of `path`) is a regular file."""
    mode = os.fstat(fd).st_mode
    if stat.S_ISDIR(mode):
        raise StateFormatError(f"{path}: is a directory, not a state file")
    if not stat.S_ISREG(mode):
        raise StateError(
            f"{path}: is not a regular file (a device, FIFO or socket); remove it, or pass "
            "another --state-dir",
            reason="state_not_regular",
        )


def read_checkpoint(path: str, *, dir_fd: int | None = None) -> HostState | None:
    """The state in `path`, or None when there is no checkpoint yet."""
    name = os.path.basename(path) if dir_fd is not None else path
    try:
        fd = os.open(name, os.O_RDONLY | OPEN_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise os_error(path, exc, "read the state file") from None
    try:
        _regular(fd, path)
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
    except OSError as exc:
        raise os_error(path, exc, "read the state file") from None
    finally:
        os.close(fd)
    return decode_checkpoint(b"".join(chunks), path)


def open_directory(directory: str) -> int:
    """A descriptor of `directory` (for `dir_fd=`); OSError becomes a corepin error."""
    try:
        return os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise os_error(directory, exc, "open the state directory") from None


def write_checkpoint(
    path: str,
    state: HostState,
    *,
    hook: WriteHook | None = None,
    dir_fd: int | None = None,
    sync_dir: bool = True,
) -> None:
    """Atomically replace `path` with the checkpoint of `state` (see the module docstring).

    `hook`, when given, is called with each name of WRITE_POINTS as the write reaches it
    (`dir_fsynced` also when `sync_dir` is false: the write is then complete without it).
    OSError becomes StateError naming the path.
    """
    if dir_fd is None:
        dfd = open_directory(os.path.dirname(path) or ".")
        try:
            write_checkpoint(path, state, hook=hook, dir_fd=dfd, sync_dir=sync_dir)
        finally:
            os.close(dfd)
        return
    data = encode_checkpoint(state)
    directory = os.path.dirname(path) or "."
    name = os.path.basename(path)
    tmp = f".{name}{TEMP_MARK}{os.getpid()}-{os.urandom(4).hex()}"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | OPEN_FLAGS, 0o600, dir_fd=dir_fd)
    except OSError as exc:
        raise os_error(directory, exc, "create a file in the state directory") from None
    renamed = False
    try:
        if hook:
            hook("opened")
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        if hook:
            hook("written")
        os.fsync(fd)
        if hook:
            hook("fsynced")
        os.close(fd)
        fd = -1
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        renamed = True
        if hook:
            hook("renamed")
        if sync_dir:
            os.fsync(dir_fd)
        if hook:
            hook("dir_fsynced")
    except OSError as exc:
        raise StateError(f"{path}: writing the state checkpoint failed: {exc.strerror}") from None
    finally:
        if fd >= 0:
            os.close(fd)
        if not renamed:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dir_fd)


def leftover_temp_files(
    directory: str, name: str = STATE_FILE, *, dir_fd: int | None = None
) -> list[str]:
    prefix = f".{name}{TEMP_MARK}"
    try:
        names = os.listdir(directory if dir_fd is None else dir_fd)
    except OSError:
        return []
    return sorted(n for n in names if n.startswith(prefix))


def remove_temp_files(
    directory: str, name: str = STATE_FILE, *, dir_fd: int | None = None
) -> list[str]:
    """Delete temp files left by crashed writers; returns their names. Call under the lock."""
    removed = []
    for leftover in leftover_temp_files(directory, name, dir_fd=dir_fd):
        target = leftover if dir_fd is not None else os.path.join(directory, leftover)
        try:
            os.unlink(target, dir_fd=dir_fd)  # unlink never follows a link: it removes it
            removed.append(leftover)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise StateError(
                f"{os.path.join(directory, leftover)}: cannot remove a leftover temp file: "
                f"{exc.strerror}"
            ) from None
    return removed
