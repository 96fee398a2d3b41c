"""Older checkpoint payloads, brought up to the current version in memory.

`MIGRATIONS` is a chain of functions, version N -> N+1; `migrate` runs it from a file's version
up to `CURRENT_VERSION` (`corepin.state.payload`). Nothing is written back until the next
commit, which writes the current version.

Version 3 was version 4 without `shield` (no shield could be on).

Version 2 recorded per assignment `{"id", "kind", "cpus", "reserved" (the withheld set),
"mems", "level", "pid", "start_time", "cgroup", "created", "policy", "meta": {str: str}}` with
the owner spread over `pid`, `start_time`, `cgroup` and untyped `meta` strings (`source`,
`owner_pid`, `owner_start`, `name`, `command`, `container_id`, `pod_uid`, `container`), and no
isolated or infra CPUs at the state level. Version 1 (corepin 0.0.x) recorded
`{"id", "exclusive": bool, "cpus", "pid", "created", "policy"}` per assignment.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

from corepin.core.errors import StateFormatError
from corepin.state.payload import CURRENT_VERSION, PayloadReader, describe


def _v1_to_v2(payload: dict[str, Any], source: str) -> dict[str, Any]:
    """v1 -> v2: kinds replace the `exclusive` flag; add start_time, mems, level, reserved.

    A v1 assignment has no process start time (`start_time` becomes null: the process is then
    identified by pid alone until it is re-recorded) and no NUMA mems (empty: `validate`
    recomputes them from the live topology).
    """
    r = PayloadReader(source)
    rows = r.field(payload, "assignments", "payload")
    if not isinstance(rows, list):
        raise r.fail("payload.assignments", f"expected a list, got {describe(rows)}")
    out_rows = []
    for i, row in enumerate(rows):
        where = f"payload.assignments[{i}]"
        row = r.obj(row, where)
        exclusive = r.field(row, "exclusive", where)
        if not isinstance(exclusive, bool):
            raise r.fail(f"{where}.exclusive", f"expected true or false, got {describe(exclusive)}")
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
    r = PayloadReader(source)
    rows = r.field(payload, "assignments", "payload")
    if not isinstance(rows, list):
        raise r.fail("payload.assignments", f"expected a list, got {describe(rows)}")
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
