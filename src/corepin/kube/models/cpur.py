"""`CPUReservation` (`corepin.io/v1alpha1`, cluster scoped, short name `cpur`): CPUs held on a
node for pods that have not come yet.

Spec: `nodeName` (optional: the scheduler picks one), `cpus` (a count) or `cpuSet` (an exact CPU
list such as `"4-7"`), `level` (the exclusiveness level of the held CPUs), `owners` (who may use
it: rows of `namespace`, `name` (a pod name) and `labelSelector`; a pod matches when every field
of one row matches it), `ttl` (seconds, or a duration such as `"90s"`, `"30m"`, `"1h30m"`; none:
it never expires) and `allocateOnce` (default true: the first pod that uses it consumes it).

Status: `phase` (`Pending` until a node's agent holds the CPUs, then `Available`; `Succeeded`
once consumed under allocateOnce, `Expired` after its TTL, `Failed` when it cannot be held),
`nodeName`, `cpus` (the CPUs held), `owners` (the pods that used it), `message`, `expireTime`.

Pure values: the clock is always passed in.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Final

from corepin.core.cpuset import EMPTY, CPUSet
from corepin.kube.models.fields import (
    FieldError,
    cpuset_field,
    integer,
    list_field,
    object_at,
    one_of,
    optional_bool_field,
    optional_string_field,
    readonly,
    string_field,
    strings_field,
)
from corepin.kube.models.levels import corepin_level, crd_level
from corepin.kube.models.meta import ObjectMeta, format_time, parse_time

CPUR_KIND: Final = "CPUReservation"
CPUR_PLURAL: Final = "cpureservations"
#: `status.phase` values.
CPUR_PHASES: Final = ("Pending", "Available", "Succeeded", "Expired", "Failed")
#: Phases after which a reservation holds nothing any more.
CPUR_DONE: Final = frozenset({"Succeeded", "Expired", "Failed"})
#: Label selector operators (`matchExpressions[].operator`).
SELECTOR_OPERATORS: Final = ("In", "NotIn", "Exists", "DoesNotExist")
#: Longest TTL accepted (a year): beyond it a typo is likelier than an intent.
MAX_TTL_SECONDS: Final = 366 * 24 * 3600

_DURATION: Final = re.compile(r"^(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")


def parse_ttl(value: object, path: str = "spec.ttl") -> int | None:
    """A TTL as whole seconds: an integer, a digit string, or a duration (`90s`, `30m`,
    `1h30m`); None when absent. FieldError naming the value otherwise."""
    if value is None:
        return None
    if isinstance(value, str):
        text = value.strip()
        if text.isdigit():
            seconds = int(text)
        else:
            m = _DURATION.match(text)
            if not text or m is None:
                raise FieldError(path, value, "must be seconds or a duration such as 90s, 30m, 1h")
            hours, minutes, secs = (int(g or 0) for g in m.groups())
            seconds = hours * 3600 + minutes * 60 + secs
    else:
        seconds = integer(value, path, minimum=1)
    if seconds < 1 or seconds > MAX_TTL_SECONDS:
        raise FieldError(path, value, f"must be 1..{MAX_TTL_SECONDS} seconds")
    return seconds


# ---------------------------------------------------------------------- label selectors
@dataclass(frozen=True, slots=True)
class Requirement:
    """One `matchExpressions` row."""

    key: str
    operator: str
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        if self.operator == "Exists":
            return self.key in labels
        if self.operator == "DoesNotExist":
            return self.key not in labels
        if self.operator == "In":
            return labels.get(self.key) in self.values
        return labels.get(self.key) not in self.values  # NotIn: absent labels match too

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"key": self.key, "operator": self.operator}
        if self.values:
            out["values"] = list(self.values)
        return out


@dataclass(frozen=True, slots=True)
class LabelSelector:
    """A metav1.LabelSelector: every `matchLabels` pair and every expression must hold. An
    empty selector matches everything, as in Kubernetes."""

    match_labels: Mapping[str, str] = field(default_factory=dict)
    expressions: tuple[Requirement, ...] = ()

    @classmethod
    def from_dict(cls, data: object, path: str) -> LabelSelector:
        d = object_at(data, path)
        rows: list[Requirement] = []
        for i, raw in enumerate(list_field(d, "matchExpressions", path)):
            where = f"{path}.matchExpressions[{i}]"
            row = object_at(raw, where)
            key = string_field(row, "key", where, required=True)
            op = one_of(
                string_field(row, "operator", where, required=True),
                f"{where}.operator",
                SELECTOR_OPERATORS,
            )
            values = list_field(row, "values", where)
            if not all(isinstance(v, str) for v in values):
                raise FieldError(f"{where}.values", values, "must be strings")
            if op in ("In", "NotIn") and not values:
                raise FieldError(f"{where}.values", values, f"must not be empty for {op}")
            if op in ("Exists", "DoesNotExist") and values:
                raise FieldError(f"{where}.values", values, f"must be empty for {op}")
            rows.append(Requirement(key, op, tuple(values)))
        return cls(readonly(strings_field(d, "matchLabels", path)), tuple(rows))

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(labels.get(k) == v for k, v in self.match_labels.items()) and all(
            r.matches(labels) for r in self.expressions
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.match_labels:
            out["matchLabels"] = dict(self.match_labels)
        if self.expressions:
            out["matchExpressions"] = [r.to_dict() for r in self.expressions]
        return out


@dataclass(frozen=True, slots=True)
class ReservationOwner:
    """One row of `spec.owners`: the pods it stands for (every given field must match)."""

    namespace: str | None = None
    name: str | None = None
    selector: LabelSelector | None = None

    @classmethod
    def from_dict(cls, data: object, path: str) -> ReservationOwner:
        d = object_at(data, path)
        raw = d.get("labelSelector")
        owner = cls(
            optional_string_field(d, "namespace", path),
            optional_string_field(d, "name", path),
            None if raw is None else LabelSelector.from_dict(raw, f"{path}.labelSelector"),
        )
        if owner.namespace is None and owner.name is None and owner.selector is None:
            raise FieldError(path, data, "must name a namespace, a pod name or a labelSelector")
        return owner

    def matches(self, namespace: str, name: str, labels: Mapping[str, str]) -> bool:
        return (
            (self.namespace is None or self.namespace == namespace)
            and (self.name is None or self.name == name)
            and (self.selector is None or self.selector.matches(labels))
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.namespace is not None:
            out["namespace"] = self.namespace
        if self.name is not None:
            out["name"] = self.name
        if self.selector is not None:
            out["labelSelector"] = self.selector.to_dict()
        return out


# ---------------------------------------------------------------------- the reservation
@dataclass(frozen=True, slots=True)
class CPUReservationSpec:
    """What a CPUReservation asks for. Exactly one of `count` and `cpus` is given."""

    owners: tuple[ReservationOwner, ...]
    count: int = 0
    cpus: CPUSet = EMPTY
    node_name: str | None = None
    level: str = "cpu"
    ttl: int | None = None
    allocate_once: bool = True

    @classmethod
    def from_dict(cls, data: object, path: str = "spec") -> CPUReservationSpec:
        d = object_at(data, path)
        raw_count = d.get("cpus")
        count = (
            0 if raw_count is None else integer(raw_count, f"{path}.cpus", minimum=1, maximum=8192)
        )
        cpus = cpuset_field(d, "cpuSet", path)
        if count and cpus:
            raise FieldError(f"{path}.cpuSet", str(cpus), "give either cpus (a count) or cpuSet")
        if not count and not cpus:
            raise FieldError(f"{path}.cpus", None, "give cpus (a count) or cpuSet (a CPU list)")
        owners = tuple(
            ReservationOwner.from_dict(o, f"{path}.owners[{i}]")
            for i, o in enumerate(list_field(d, "owners", path))
        )
        if not owners:
            raise FieldError(f"{path}.owners", d.get("owners"), "must name at least one owner")
        level = d.get("level")
        once = optional_bool_field(d, "allocateOnce", path)
        return cls(
            owners=owners,
            count=count,
            cpus=cpus,
            node_name=optional_string_field(d, "nodeName", path) or None,
            level="cpu" if level is None else corepin_level(level, f"{path}.level"),
            ttl=parse_ttl(d.get("ttl"), f"{path}.ttl"),
            allocate_once=True if once is None else once,
        )

    @property
    def size(self) -> int:
        """How many CPUs it holds."""
        return self.count or len(self.cpus)

    def matches(self, namespace: str, name: str, labels: Mapping[str, str]) -> bool:
        """Whether the pod `namespace/name` with `labels` is one of its owners."""
        return any(o.matches(namespace, name, labels) for o in self.owners)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"owners": [o.to_dict() for o in self.owners]}
        if self.count:
            out["cpus"] = self.count
        else:
            out["cpuSet"] = str(self.cpus)
        if self.node_name:
            out["nodeName"] = self.node_name
        out["level"] = crd_level(self.level)
        if self.ttl is not None:
            out["ttl"] = self.ttl
        out["allocateOnce"] = self.allocate_once
        return out


@dataclass(frozen=True, slots=True)
class ReservationUser:
    """One row of `status.owners`: a pod that used the reservation."""

    namespace: str
    name: str
    uid: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"namespace": self.namespace, "name": self.name, "uid": self.uid}


@dataclass(frozen=True, slots=True)
class CPUReservationStatus:
    phase: str = "Pending"
    node_name: str | None = None
    cpus: CPUSet = EMPTY
    owners: tuple[ReservationUser, ...] = ()
    message: str = ""
    expire_time: datetime | None = None

    @classmethod
    def from_dict(cls, data: object, path: str = "status") -> CPUReservationStatus:
        d = object_at(data or {}, path)
        phase = string_field(d, "phase", path, default="Pending")
        users = []
        for i, raw in enumerate(list_field(d, "owners", path)):
            row = object_at(raw, f"{path}.owners[{i}]")
            users.append(
                ReservationUser(
                    string_field(row, "namespace", f"{path}.owners[{i}]", required=True),
                    string_field(row, "name", f"{path}.owners[{i}]", required=True),
                    string_field(row, "uid", f"{path}.owners[{i}]"),
                )
            )
        expire = d.get("expireTime")
        return cls(
            phase=one_of(phase, f"{path}.phase", CPUR_PHASES),
            node_name=optional_string_field(d, "nodeName", path) or None,
            cpus=cpuset_field(d, "cpus", path),
            owners=tuple(users),
            message=string_field(d, "message", path),
            expire_time=None if expire is None else parse_time(expire, f"{path}.expireTime"),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"phase": self.phase}
        if self.node_name:
            out["nodeName"] = self.node_name
        if self.cpus:
            out["cpus"] = str(self.cpus)
        if self.owners:
            out["owners"] = [u.to_dict() for u in self.owners]
        if self.message:
            out["message"] = self.message
        if self.expire_time is not None:
            out["expireTime"] = format_time(self.expire_time)
        return out


@dataclass(frozen=True, slots=True)
class CPUReservation:
    """A CPUReservation as read from the API (see the module docstring)."""

    metadata: ObjectMeta
    spec: CPUReservationSpec
    status: CPUReservationStatus = CPUReservationStatus()
    created: datetime | None = None

    @classmethod
    def from_dict(cls, data: object) -> CPUReservation:
        d = object_at(data, "CPUReservation")
        meta = object_at(d.get("metadata"), "metadata")
        stamp = meta.get("creationTimestamp")
        return cls(
            metadata=ObjectMeta.from_dict(meta),
            spec=CPUReservationSpec.from_dict(d.get("spec"), "spec"),
            status=CPUReservationStatus.from_dict(d.get("status") or {}, "status"),
            created=None if stamp is None else parse_time(stamp, "metadata.creationTimestamp"),
        )

    @property
    def name(self) -> str:
        return self.metadata.name

    @property
    def uid(self) -> str:
        return self.metadata.uid or ""

    @property
    def node_name(self) -> str | None:
        """The node it is on: the spec's, else the one the scheduler chose (status)."""
        return self.spec.node_name or self.status.node_name

    @property
    def done(self) -> bool:
        """Whether it holds nothing any more (Succeeded, Expired or Failed)."""
        return self.status.phase in CPUR_DONE

    def expires_at(self) -> datetime | None:
        """When its TTL runs out (creation time + ttl), None without a TTL or a creation time."""
        if self.spec.ttl is None or self.created is None:
            return None
        return self.created + timedelta(seconds=self.spec.ttl)

    def expired(self, now: datetime) -> bool:
        at = self.expires_at()
        return at is not None and now >= at

    def matches(self, namespace: str, name: str, labels: Mapping[str, str]) -> bool:
        return self.spec.matches(namespace, name, labels)


__all__ = [
    "CPUR_DONE",
    "CPUR_KIND",
    "CPUR_PHASES",
    "CPUR_PLURAL",
    "CPUReservation",
    "CPUReservationSpec",
    "CPUReservationStatus",
    "LabelSelector",
    "Requirement",
    "ReservationOwner",
    "ReservationUser",
    "parse_ttl",
]
