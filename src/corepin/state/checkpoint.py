"""The versioned, checksummed checkpoint file and its atomic writer.

File format (UTF-8 JSON, one object, trailing newline):

    {"version":4,"checksum":"sha256:<64 hex>","payload":<payload>}

- `payload` is serialized canonically, exactly as
  `json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)` encoded
  as UTF-8 (`corepin.core.digest.canonical_bytes`), and those bytes are embedded verbatim in
  the file; what it holds is described in `corepin.state.payload`;
- `checksum` is `sha256:` + the hex SHA-256 of those canonical payload bytes. A reader parses
  the file, re-serializes `payload` canonically and compares: any edit, bit flip or truncation
  is detected (a hand-reformatted file still verifies as long as the values are unchanged);
- `version` is the payload format version. Older versions are migrated in memory by the chain
  of functions in `corepin.state.migrations` (vN -> vN+1); a newer version than this code knows
  is refused.

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
import json
import os
import stat
from collections.abc import Callable, Mapping
from typing import Any, Final

from corepin.core.digest import canonical_bytes, canonical_digest, sha256_hex
from corepin.core.errors import CorepinError, InputError, StateError, StateFormatError
from corepin.state.model import HostState
from corepin.state.payload import (
    CURRENT_VERSION,
    PayloadReader,
    describe,
    payload_to_state,
    state_to_payload,
)

STATE_FILE: Final = "state.json"
TEMP_MARK: Final = ".tmp-"

#: Points at which `write_checkpoint` calls its hook (crash-injection tests use them).
WRITE_POINTS: Final = ("opened", "written", "fsynced", "renamed", "dir_fsynced")

WriteHook = Callable[[str], None]


# ---------------------------------------------------------------------- encoding and decoding


def encode_checkpoint(state: HostState) -> bytes:
    """The full file content for `state` (current version)."""
    body = canonical_bytes(state_to_payload(state))
    head = f'{{"version":{CURRENT_VERSION},"checksum":"sha256:{sha256_hex(body)}","payload":'
    return head.encode("ascii") + body + b"}\n"


def decode_checkpoint(data: bytes, source: str) -> HostState:
    """Parse, verify and migrate checkpoint bytes. StateFormatError names `source`."""
    if not data:
        raise StateFormatError(f"{source}: file is empty (0 bytes)", reason="truncated")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise StateFormatError(
            f"{source}: not UTF-8 text (bad byte at offset {exc.start})", reason="bad_json"
        ) from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        if exc.pos >= len(text.rstrip()):
            raise StateFormatError(
                f"{source}: truncated: the JSON ends early at byte {len(data)} ({exc.msg})",
                reason="truncated",
            ) from None
        raise StateFormatError(
            f"{source}: not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}",
            reason="bad_json",
        ) from None
    except RecursionError:
        raise StateFormatError(f"{source}: JSON nested too deeply", reason="bad_json") from None
    r = PayloadReader(source)
    top = r.obj(doc, "top level")
    for key in ("version", "payload", "checksum"):
        if key not in top:
            raise r.fail("top level", f"missing field {key!r}", "missing_field")
    version = top["version"]
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise r.fail("version", f"expected a positive integer, got {describe(version)}")
    if version > CURRENT_VERSION:
        raise StateFormatError(
            f"{source}: state format version {version} is newer than this corepin understands "
            f"(1..{CURRENT_VERSION}); upgrade corepin, or move the file away to start from an "
            "empty state",
            reason="unknown_version",
        )
    checksum = top["checksum"]
    if not isinstance(checksum, str) or not checksum.startswith("sha256:"):
        raise r.fail("checksum", f'expected "sha256:<hex>", got {describe(checksum)}')
    payload = r.obj(top["payload"], "payload")
    actual = canonical_digest(payload)
    if actual != checksum:
        raise StateFormatError(
            f"{source}: checksum mismatch: the file says {checksum} but its payload hashes to "
            f"{actual}; the checkpoint is corrupt (kept as is: inspect it, then restore it or "
            "quarantine it)",
            reason="checksum_mismatch",
        )
    if version < CURRENT_VERSION:
        # older files are rare: their migrations load only for them (`corepin run` start-up)
        from corepin.state.migrations import migrate

        return payload_to_state(migrate(version, dict(payload), source), source)
    return payload_to_state(payload, source)


def encode_legacy(payload: Mapping[str, Any], version: int) -> bytes:
    """A checkpoint file of an older `version` around a payload of that version (tests, tools)."""
    body = canonical_bytes(payload)
    head = f'{{"version":{version},"checksum":"sha256:{sha256_hex(body)}","payload":'
    return head.encode("ascii") + body + b"}\n"


# ---------------------------------------------------------------------- files
#
# Every function below takes the file's `path` (for messages) and, optionally, `dir_fd`: a
# descriptor of the directory that holds it. With `dir_fd` the file is reached by its base name
# relative to that descriptor (openat and friends), so a directory that was checked once
# (`corepin.state.store`) cannot be swapped for another between the check and the use. No
# function follows a symbolic link in the last component of a name (O_NOFOLLOW): a link
# planted as `state.json` or as a temp file is refused, never read or written through.

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
