"""The checkpoint's payload: a `HostState` as JSON and back, read field by field.

Payload, version 4 (`CURRENT_VERSION`):

    {"revision": int, "topology": "sha256:...", "online": "0-7", "isolated": "",
     "reserved": "0", "infra": "", "options": {"name": "value"},
     "shield": null | <shield>,
     "assignments": [{"id": str, "kind": "exclusive"|"mixed"|"share"|"shared",
                      "cpus": "2-3", "withheld": "2-3", "mems": "0", "level": "cpu",
                      "owner": <owner>|null, "created": float, "policy": str,
                      "workload": str|null, "qos": str|null,
                      "near": [str, ...], "reservation": str|null,
                      "rebalance": bool}],   # sorted by id
     "reservations": [{"name": str, "cpus": "4-5", "withheld": "4-5", "level": "cpu",
                       "reusable": bool, "expires": float|null, "created": float,
                       "consumed_by": [str, ...], "uid": str}]}   # sorted by name

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

`qos` (an assignment's QoS class when one was given; null or absent: derived from its kind)
came after version 4 without a new version: a reader that does not know it ignores it, and a
row without it reads as null, so checkpoints of either kind stay readable by both. `near` (the
devices a run's CPUs were chosen near, as named) came the same way: a row without it reads as
none. `reservation` and `reservations` (CPUs held for a workload yet to come,
`corepin.state.reservations`) came the same way: absent reads as none; and `rebalance` (false:
rebalancing never moves the assignment): absent reads as true.

Older payloads are brought up to this version by `corepin.state.migrations` before they are
read. `PayloadReader` is the typed field access both use: every error it raises is a
`StateFormatError` naming the file and the JSON path of the bad value.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from corepin.allocation.pools import KINDS
from corepin.core.cpuset import CPUSet
from corepin.core.errors import CorepinError, StateFormatError
from corepin.state.model import Assignment, HostState
from corepin.state.owners import owner_from_json
from corepin.state.reservations import Reservation

#: The payload format version this code writes (older ones are migrated on reading).
CURRENT_VERSION: Final = 4


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
        "qos": a.qos,
        "near": list(a.near),
        "reservation": a.reservation,
        "rebalance": a.rebalance,
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
        "reservations": [r.to_json() for r in state.reservations.values()],
    }


# ---------------------------------------------------------------------- decoding


class PayloadReader:
    """Typed field access that names the file and the JSON path in every error."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, where: str, problem: str, reason: str = "bad_field") -> StateFormatError:
        return StateFormatError(f"{self.source}: {where}: {problem}", reason=reason)

    def obj(self, value: object, where: str) -> Mapping[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(where, f"expected a JSON object, got {describe(value)}")
        return value

    def field(self, obj: Mapping[str, Any], key: str, where: str) -> Any:
        if key not in obj:
            raise self.fail(where, f"missing field {key!r}", "missing_field")
        return obj[key]

    def str_(self, obj: Mapping[str, Any], key: str, where: str) -> str:
        value = self.field(obj, key, where)
        if not isinstance(value, str):
            raise self.fail(f"{where}.{key}", f"expected a string, got {describe(value)}")
        return value

    def optional_str(self, obj: Mapping[str, Any], key: str, where: str) -> str | None:
        value = obj.get(key)
        if value is None:
            return None
        if not isinstance(value, str):
            raise self.fail(f"{where}.{key}", f"expected a string, got {describe(value)}")
        return value

    def str_list(self, obj: Mapping[str, Any], key: str, where: str) -> tuple[str, ...]:
        """An optional list of non-empty strings (absent or null: empty)."""
        value = obj.get(key)
        if value is None:
            return ()
        if not isinstance(value, list):
            raise self.fail(f"{where}.{key}", f"expected a list of strings, got {describe(value)}")
        for i, item in enumerate(value):
            if not isinstance(item, str) or not item:
                raise self.fail(
                    f"{where}.{key}[{i}]", f"expected a non-empty string, got {describe(item)}"
                )
        return tuple(value)

    def int_(self, obj: Mapping[str, Any], key: str, where: str) -> int:
        value = self.field(obj, key, where)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(f"{where}.{key}", f"expected an integer, got {describe(value)}")
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
                raise self.fail(f"{where}.{key}.{k}", f"expected a string, got {describe(v)}")
        return dict(m)


def describe(value: object) -> str:
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


def _assignment_from_json(r: PayloadReader, row: object, where: str) -> Assignment:
    row = r.obj(row, where)
    ident = r.str_(row, "id", where)
    where = f"{where} (id {ident!r})"
    kind = r.str_(row, "kind", where)
    if kind not in KINDS:
        raise r.fail(f"{where}.kind", f"expected one of {', '.join(KINDS)}, got {kind!r}")
    created = r.field(row, "created", where)
    if isinstance(created, bool) or not isinstance(created, (int, float)):
        raise r.fail(f"{where}.created", f"expected a number, got {describe(created)}")
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
            workload=r.optional_str(row, "workload", where),
            qos=r.optional_str(row, "qos", where),
            near=r.str_list(row, "near", where),
            reservation=r.optional_str(row, "reservation", where),
            rebalance=_flag(r, row, "rebalance", where),
        )
    except StateFormatError:
        raise
    except CorepinError as exc:
        raise r.fail(where, exc.message) from None


def _flag(r: PayloadReader, row: Mapping[str, Any], key: str, where: str) -> bool:
    """An optional boolean field (absent: true)."""
    value = row.get(key, True)
    if not isinstance(value, bool):
        raise r.fail(f"{where}.{key}", f"expected true or false, got {describe(value)}")
    return value


def _reservation_from_json(r: PayloadReader, row: object, where: str) -> Reservation:
    row = r.obj(row, where)
    name = r.str_(row, "name", where)
    where = f"{where} (name {name!r})"
    numbers: dict[str, float | None] = {}
    for key in ("expires", "created"):
        value = row.get(key)
        if value is None and key == "expires":
            numbers[key] = None
        elif isinstance(value, bool) or not isinstance(value, (int, float)):
            raise r.fail(f"{where}.{key}", f"expected a number, got {describe(value)}")
        else:
            numbers[key] = float(value)
    reusable = row.get("reusable", False)
    if not isinstance(reusable, bool):
        raise r.fail(f"{where}.reusable", f"expected true or false, got {describe(reusable)}")
    try:
        return Reservation(
            name=name,
            cpus=r.cpus(row, "cpus", where),
            withheld=r.cpus(row, "withheld", where),
            level=r.str_(row, "level", where),
            reusable=reusable,
            expires=numbers["expires"],
            created=numbers["created"] or 0.0,
            consumed_by=r.str_list(row, "consumed_by", where),
            uid=r.optional_str(row, "uid", where) or "",
        )
    except StateFormatError:
        raise
    except CorepinError as exc:
        raise r.fail(where, exc.message) from None


def payload_to_state(payload: object, source: str) -> HostState:
    """Decode a current-version payload; StateFormatError naming `source` on any problem."""
    r = PayloadReader(source)
    p = r.obj(payload, "payload")
    rows = r.field(p, "assignments", "payload")
    if not isinstance(rows, list):
        raise r.fail("payload.assignments", f"expected a list, got {describe(rows)}")
    items: dict[str, Assignment] = {}
    for i, row in enumerate(rows):
        a = _assignment_from_json(r, row, f"payload.assignments[{i}]")
        if a.id in items:
            raise r.fail(f"payload.assignments[{i}]", f"duplicate id {a.id!r}")
        items[a.id] = a
    raw_held = p.get("reservations", [])
    if not isinstance(raw_held, list):
        raise r.fail("payload.reservations", f"expected a list, got {describe(raw_held)}")
    held: dict[str, Reservation] = {}
    for i, row in enumerate(raw_held):
        res = _reservation_from_json(r, row, f"payload.reservations[{i}]")
        if res.name in held:
            raise r.fail(f"payload.reservations[{i}]", f"duplicate name {res.name!r}")
        held[res.name] = res
    shield = None
    raw_shield = r.field(p, "shield", "payload")
    if raw_shield is not None:
        # loaded only when a shield is on: `corepin run` reads states without one
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
            reservations=held,
        )
    except StateFormatError:
        raise
    except CorepinError as exc:
        raise r.fail("payload", exc.message) from None
