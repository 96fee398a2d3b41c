"""The versioned, checksummed checkpoint file and its atomic writer.

File format (UTF-8 JSON, one object, trailing newline):

    {"version":4,"checksum":"sha256:<64 hex>","payload":<payload>}

- `payload` is serialized canonically, exactly as
  `json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)` encoded
  as UTF-8, and those bytes are embedded verbatim in the file;
- `checksum` is `sha256:` + the hex SHA-256 of those canonical payload bytes. A reader parses
  the file, re-serializes `payload` canonically and compares: any edit, bit flip or truncation
  is detected (a hand-reformatted file still verifies as long as the values are unchanged);
- `version` is the payload format version. Older versions are migrated in memory by the chain
  of functions in `MIGRATIONS` (vN -> vN+1); a newer version than this code knows is refused.

Payload, version 4:

    {"revision": int, "topology": "sha256:...", "online": "0-7", "isolated": "",
     "reserved": "0", "infra": "", "options": {"name": "value"},
     "shield": null | <shield>,
     "assignments": [{"id": str, "kind": "exclusive"|"mixed"|"share"|"shared",
                      "cpus": "2-3", "withheld": "2-3", "mems": "0", "level": "cpu",
                      "owner": <owner>|null, "created": float, "policy": str,
                      "workload": str|null}]}   # sorted by id

    <owner> = {"type": "process", "pid": int, "start_time": int|null,
               "runner_pid": int|null, "runner_start_time": int|null, "cgroup": str|null,
               "session": int|null, "members": [[pid, start_time], ...],
               "name": str, "command": str}
            | {"type": "container", "pod_uid": str, "container": str, "namespace": str,
               "pod": str, "container_id": str, "qos": str, "runtime": str,
               "cgroup": str|null}

    <shield> = {"scope": str, "mode": "cpuset"|"affinity", "cgroup_version": 0|1|2,
                "kthreads": bool, "irqs": bool, "since": float, "excluded": [str],
                "enabled": [str], "moved": [[pid, start_time, origin cgroup], ...],
                "restricted": [[cgroup, original cpus text], ...],
                "tasks": [[pid, start_time, "cpus"], ...], "kernel_threads": (same),
                "irq_affinity": [[irq number or "default", "cpus"], ...]}
    (`corepin.state.shield.ShieldRecord`: what `corepin shield off` puts back.)

Version 3 was version 4 without `shield` (no shield could be on).

Version 2 recorded per assignment `{"id", "kind", "cpus", "reserved" (the withheld set),
"mems", "level", "pid", "start_time", "cgroup", "created", "policy", "meta": {str: str}}` with
the owner spread over `pid`, `start_time`, `cgroup` and untyped `meta` strings (`source`,
`owner_pid`, `owner_start`, `name`, `command`, `container_id`, `pod_uid`, `container`), and no
isolated or infra CPUs at the state level. Version 1 (corepin 0.0.x) recorded
`{"id", "exclusive": bool, "cpus", "pid", "created", "policy"}` per assignment.

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

from corepin.allocation.pools import KINDS
from corepin.core.cpuset import CPUSet
from corepin.core.errors import CorepinError, InputError, StateError, StateFormatError
from corepin.state.model import Assignment, HostState
from corepin.state.owners import owner_from_json

try:  # the builtin module is much cheaper to import than hashlib (OpenSSL)
    from _sha256 import sha256 as _sha256  # type: ignore[import-not-found,unused-ignore]
except ImportError:  # pragma: no cover - Python >= 3.12 names it _sha2
    try:
        from _sha2 import sha256 as _sha256  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        from hashlib import sha256 as _sha256

CURRENT_VERSION: Final = 4
STATE_FILE: Final = "state.json"
TEMP_MARK: Final = ".tmp-"

#: Points at which `write_checkpoint` calls its hook (crash-injection tests use them).
WRITE_POINTS: Final = ("opened", "written", "fsynced", "renamed", "dir_fsynced")

WriteHook = Callable[[str], None]


def canonical_bytes(payload: Any) -> bytes:
    """The one serialization the checksum is computed over (see the module docstring)."""
    return json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode(
        "utf-8"
    )


def sha256_hex(data: bytes) -> str:
    return str(_sha256(data).hexdigest())


def payload_checksum(payload: Any) -> str:
    return "sha256:" + sha256_hex(canonical_bytes(payload))


# ---------------------------------------------------------------------- encoding


def _assignment_to_json(a: Assignment) -> dict[str, Any]:
    return {
        "id": a.id,
        "kind": a.kind,
        "cpus": str(a.cpus),
        "withheld": str(a.withheld),
        "mems": str(a.mems),
        "level": a.level,
        "owner": a.owner.to_json() if a.owner is not None else None,
        "created": a.created,
        "policy": a.policy,
        "workload": a.workload,
    }


def state_to_payload(state: HostState) -> dict[str, Any]:
    return {
        "revision": state.revision,
        "topology": state.topology,
        "online": str(state.online),
        "isolated": str(state.isolated),
        "reserved": str(state.reserved),
        "infra": str(state.infra),
        "options": dict(state.options),
        "assignments": [_assignment_to_json(a) for a in state.assignments.values()],
        "shield": state.shield.to_json() if state.shield is not None else None,
    }


def encode_checkpoint(state: HostState) -> bytes:
    """The full file content for `state` (current version)."""
    body = canonical_bytes(state_to_payload(state))
    head = f'{{"version":{CURRENT_VERSION},"checksum":"sha256:{sha256_hex(body)}","payload":'
    return head.encode("ascii") + body + b"}\n"


# ---------------------------------------------------------------------- decoding


class _Reader:
    """Typed field access that names the file and the JSON path in every error."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, where: str, problem: str, reason: str = "bad_field") -> StateFormatError:
        return StateFormatError(f"{self.source}: {where}: {problem}", reason=reason)

    def obj(self, value: Any, where: str) -> Mapping[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(where, f"expected a JSON object, got {_kind(value)}")
        return value

    def field(self, obj: Mapping[str, Any], key: str, where: str) -> Any:
        if key not in obj:
            raise self.fail(where, f"missing field {key!r}", "missing_field")
        return obj[key]

    def str_(self, obj: Mapping[str, Any], key: str, where: str, *, optional: bool = False) -> Any:
        value = obj.get(key) if optional else self.field(obj, key, where)
        if value is None and optional:
            return None
        if not isinstance(value, str):
            raise self.fail(f"{where}.{key}", f"expected a string, got {_kind(value)}")
        return value

    def int_(self, obj: Mapping[str, Any], key: str, where: str, *, optional: bool = False) -> Any:
        value = obj.get(key) if optional else self.field(obj, key, where)
        if value is None and optional:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(f"{where}.{key}", f"expected an integer, got {_kind(value)}")
        return value

    def cpus(self, obj: Mapping[str, Any], key: str, where: str) -> CPUSet:
        text = self.str_(obj, key, where)
        try:
            return CPUSet.parse(text)
        except ValueError as exc:
            raise self.fail(f"{where}.{key}", str(exc)) from None

    def strmap(self, obj: Mapping[str, Any], key: str, where: str) -> dict[str, str]:
        value = obj.get(key, {})
        m = self.obj(value, f"{where}.{key}")
        for k, v in m.items():
            if not isinstance(v, str):
                raise self.fail(f"{where}.{key}.{k}", f"expected a string, got {_kind(v)}")
        return dict(m)


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean {value!r}"
    if isinstance(value, (int, float)):
        return f"number {value!r}"
    if isinstance(value, str):
        return f"string {value[:40]!r}"
    if isinstance(value, list):
        return "a list"
    return type(value).__name__


def _assignment_from_json(r: _Reader, row: Any, where: str) -> Assignment:
    row = r.obj(row, where)
    ident = r.str_(row, "id", where)
    where = f"{where} (id {ident!r})"
    kind = r.str_(row, "kind", where)
    if kind not in KINDS:
        raise r.fail(f"{where}.kind", f"expected one of {', '.join(KINDS)}, got {kind!r}")
    created = r.field(row, "created", where)
    if isinstance(created, bool) or not isinstance(created, (int, float)):
        raise r.fail(f"{where}.created", f"expected a number, got {_kind(created)}")
    raw_owner = row.get("owner")
    try:
        owner = None
        if raw_owner is not None:
            owner = owner_from_json(r.obj(raw_owner, f"{where}.owner"))
        return Assignment(
            id=ident,
            kind=kind,
            cpus=r.cpus(row, "cpus", where),
            withheld=r.cpus(row, "withheld", where),
            mems=r.cpus(row, "mems", where),
            level=r.str_(row, "level", where),
            owner=owner,
            created=float(created),
            policy=r.str_(row, "policy", where),
            workload=r.str_(row, "workload", where, optional=True),
        )
    except StateFormatError:
        raise
    except CorepinError as exc:
        raise r.fail(where, exc.message) from None


def payload_to_state(payload: Any, source: str) -> HostState:
    """Decode a current-version payload; StateFormatError naming `source` on any problem."""
    r = _Reader(source)
    p = r.obj(payload, "payload")
    rows = r.field(p, "assignments", "payload")
    if not isinstance(rows, list):
        raise r.fail("payload.assignments", f"expected a list, got {_kind(rows)}")
    items: dict[str, Assignment] = {}
    for i, row in enumerate(rows):
        a = _assignment_from_json(r, row, f"payload.assignments[{i}]")
        if a.id in items:
            raise r.fail(f"payload.assignments[{i}]", f"duplicate id {a.id!r}")
        items[a.id] = a
    shield = None
    raw_shield = r.field(p, "shield", "payload")
    if raw_shield is not None:
        from corepin.state.shield import ShieldRecord

        try:
            shield = ShieldRecord.from_json(r.obj(raw_shield, "payload.shield"))
        except StateFormatError:
            raise
        except CorepinError as exc:
            raise r.fail("payload.shield", exc.message) from None
    try:
        return HostState(
            revision=r.int_(p, "revision", "payload"),
            topology=r.str_(p, "topology", "payload"),
            online=r.cpus(p, "online", "payload"),
            isolated=r.cpus(p, "isolated", "payload"),
            reserved=r.cpus(p, "reserved", "payload"),
            infra=r.cpus(p, "infra", "payload"),
            options=r.strmap(p, "options", "payload"),
            assignments=items,
            shield=shield,
        )
    except StateFormatError:
        raise
    except CorepinError as exc:
        raise r.fail("payload", exc.message) from None


# ---------------------------------------------------------------------- migrations


def _v1_to_v2(payload: dict[str, Any], source: str) -> dict[str, Any]:
    """v1 -> v2: kinds replace the `exclusive` flag; add start_time, mems, level, reserved.

    A v1 assignment has no process start time (`start_time` becomes null: the process is then
    identified by pid alone until it is re-recorded) and no NUMA mems (empty: `validate`
    recomputes them from the live topology).
    """
    r = _Reader(source)
    rows = r.field(payload, "assignments", "payload")
    if not isinstance(rows, list):
        raise r.fail("payload.assignments", f"expected a list, got {_kind(rows)}")
    out_rows = []
    for i, row in enumerate(rows):
        where = f"payload.assignments[{i}]"
        row = r.obj(row, where)
        exclusive = r.field(row, "exclusive", where)
        if not isinstance(exclusive, bool):
            raise r.fail(f"{where}.exclusive", f"expected true or false, got {_kind(exclusive)}")
        cpus = r.str_(row, "cpus", where)
        new = {
            "id": r.str_(row, "id", where),
            "kind": "exclusive" if exclusive else "shared",
            "cpus": cpus if exclusive else "",
            "reserved": cpus if exclusive else "",
            "mems": "",
            "level": "cpu",
            "pid": row.get("pid"),
            "start_time": None,
            "cgroup": None,
            "created": row.get("created", 0.0),
            "policy": row.get("policy", ""),
            "meta": {},
        }
        out_rows.append(new)
    out = dict(payload)
    out["assignments"] = out_rows
    return out


def _v2_owner(row: Mapping[str, Any]) -> dict[str, Any] | None:
    """The typed owner of a version-2 row, from its pid, start time, cgroup and `meta`."""
    meta = row.get("meta") or {}
    if not isinstance(meta, Mapping):
        meta = {}

    def text(key: str) -> str:
        value = meta.get(key, "")
        return value if isinstance(value, str) else ""

    def number(key: str) -> int | None:
        value = text(key)
        return int(value) if value.isascii() and value.isdigit() else None

    raw_id = row.get("id")
    ident = raw_id if isinstance(raw_id, str) else ""
    cgroup = row.get("cgroup")
    pid = row.get("pid")
    if isinstance(pid, int) and not isinstance(pid, bool) and pid > 0:
        return {
            "type": "process",
            "pid": pid,
            "start_time": row.get("start_time"),
            "runner_pid": number("owner_pid"),
            "runner_start_time": number("owner_start"),
            "cgroup": cgroup,
            "session": None,
            "members": [],
            "name": text("name"),
            "command": text("command"),
        }
    pod_uid, container, container_id = text("pod_uid"), text("container"), text("container_id")
    parts = ident.split("/", 2)
    if not pod_uid and parts[0] == "pod" and len(parts) >= 2:
        pod_uid = parts[1]
        container = parts[2] if len(parts) == 3 else ""
    if not container_id and parts[0] == "container" and len(parts) >= 2:
        container_id = ident.split("/", 1)[1]
    if pod_uid or container_id:
        return {
            "type": "container",
            "pod_uid": pod_uid,
            "container": container,
            "namespace": "",
            "pod": "",
            "container_id": container_id,
            "qos": "",
            "runtime": "",
            "cgroup": cgroup,
        }
    return None


_V2_OWNER_FIELDS: Final = frozenset({"reserved", "pid", "start_time", "cgroup", "meta"})


def _v2_to_v3(payload: dict[str, Any], source: str) -> dict[str, Any]:
    """v2 -> v3: typed owners replace pid/start_time/cgroup/meta; `reserved` per assignment
    becomes `withheld`; the state gains `isolated` and `infra` (empty: `validate` adopts the
    live topology's isolated CPUs). Every assignment is kept."""
    r = _Reader(source)
    rows = r.field(payload, "assignments", "payload")
    if not isinstance(rows, list):
        raise r.fail("payload.assignments", f"expected a list, got {_kind(rows)}")
    out_rows = []
    for i, row in enumerate(rows):
        row = r.obj(row, f"payload.assignments[{i}]")
        new = {k: v for k, v in row.items() if k not in _V2_OWNER_FIELDS}
        new["withheld"] = row.get("reserved", "")
        new["owner"] = _v2_owner(row)
        new["workload"] = None
        out_rows.append(new)
    out = dict(payload)
    out["assignments"] = out_rows
    out.setdefault("isolated", "")
    out.setdefault("infra", "")
    return out


def _v3_to_v4(payload: dict[str, Any], source: str) -> dict[str, Any]:
    """v3 -> v4: the state gains `shield` (none: version 3 knew no shield). Every assignment
    is kept as it is."""
    out = dict(payload)
    out["shield"] = None
    return out


#: version N -> function producing the version N+1 payload.
MIGRATIONS: Final[dict[int, Callable[[dict[str, Any], str], dict[str, Any]]]] = {
    1: _v1_to_v2,
    2: _v2_to_v3,
    3: _v3_to_v4,
}


def migrate(version: int, payload: dict[str, Any], source: str) -> dict[str, Any]:
    """Run the migration chain from `version` up to CURRENT_VERSION."""
    while version < CURRENT_VERSION:
        step = MIGRATIONS.get(version)
        if step is None:
            raise StateFormatError(
                f"{source}: no migration from state format version {version}",
                reason="unknown_version",
            )
        payload = step(payload, source)
        version += 1
    return payload


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
    r = _Reader(source)
    top = r.obj(doc, "top level")
    for key in ("version", "payload", "checksum"):
        if key not in top:
            raise r.fail("top level", f"missing field {key!r}", "missing_field")
    version = top["version"]
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise r.fail("version", f"expected a positive integer, got {_kind(version)}")
    if version > CURRENT_VERSION:
        raise StateFormatError(
            f"{source}: state format version {version} is newer than this corepin understands "
            f"(1..{CURRENT_VERSION}); upgrade corepin, or move the file away to start from an "
            "empty state",
            reason="unknown_version",
        )
    checksum = top["checksum"]
    if not isinstance(checksum, str) or not checksum.startswith("sha256:"):
        raise r.fail("checksum", f'expected "sha256:<hex>", got {_kind(checksum)}')
    payload = r.obj(top["payload"], "payload")
    actual = payload_checksum(payload)
    if actual != checksum:
        raise StateFormatError(
            f"{source}: checksum mismatch: the file says {checksum} but its payload hashes to "
            f"{actual}; the checkpoint is corrupt (kept as is: inspect it, then restore it or "
            "quarantine it)",
            reason="checksum_mismatch",
        )
    return payload_to_state(migrate(version, dict(payload), source), source)


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
