"""The pieces every corepin object shares: the API group, `ObjectMeta`, `OwnerReference`,
`Condition` (metav1.Condition) and RFC 3339 timestamps.

Each model has `from_dict(data)` (strict about the fields it knows: a `FieldError` names the
field path and the bad value; unknown fields are ignored) and `to_dict()` (the wire spelling);
`X.from_dict(x.to_dict()) == x`. Timestamps are timezone-aware `datetime`s, held in UTC.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone
from typing import Any, Final

from corepin.kube.models.fields import (
    MISSING,
    FieldError,
    integer,
    list_field,
    object_at,
    one_of,
    optional_bool_field,
    optional_string_field,
    readonly,
    set_frozen,
    string_field,
    strings_field,
    unique,
)

GROUP: Final = "corepin.io"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
CONDITION_STATUSES: Final = ("True", "False", "Unknown")
READY: Final = "Ready"

_CONDITION_TYPE = re.compile(
    r"([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])\Z"
)
_CONDITION_REASON = re.compile(r"[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?\Z")
_RFC3339 = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[Tt](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?"
    r"(?:([Zz])|([+-])(\d{2}):(\d{2}))\Z",
    re.ASCII,
)


# ---------------------------------------------------------------------- timestamps
def parse_time(value: object, path: str) -> datetime:
    """An RFC 3339 timestamp (`2024-05-01T12:00:00Z`, fractions and offsets allowed) in UTC."""
    if not isinstance(value, str):
        raise FieldError(path, value, "must be an RFC 3339 timestamp string")
    match = _RFC3339.match(value)
    if match is None:
        raise FieldError(path, value, "is not an RFC 3339 timestamp such as 2024-05-01T12:00:00Z")
    year, month, day, hour, minute, second = (int(g) for g in match.groups()[:6])
    fraction, zulu, sign, off_h, off_m = match.groups()[6:]
    micro = int((fraction or "0").ljust(6, "0")[:6])
    if zulu:
        zone = UTC
    else:
        offset = timedelta(hours=int(off_h), minutes=int(off_m))
        if offset >= timedelta(hours=24):
            raise FieldError(path, value, "has a UTC offset beyond 23:59")
        zone = timezone(-offset if sign == "-" else offset)
    try:
        stamp = datetime(year, month, day, hour, minute, second, micro, tzinfo=zone)
        return stamp.astimezone(UTC)
    except (ValueError, OverflowError) as exc:
        raise FieldError(path, value, f"is not a valid time ({exc})") from None


def format_time(stamp: datetime) -> str:
    """RFC 3339 in UTC with a `Z`; microseconds only when there are any."""
    utc = stamp.astimezone(UTC)
    if utc.microsecond:
        return utc.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return utc.strftime("%Y-%m-%dT%H:%M:%SZ")


def utc_time(stamp: datetime, path: str) -> datetime:
    """`stamp` in UTC; refuses a naive datetime."""
    if not isinstance(stamp, datetime) or stamp.tzinfo is None or stamp.utcoffset() is None:
        raise FieldError(path, stamp, "must be a timezone-aware datetime")
    return stamp.astimezone(UTC)


# ---------------------------------------------------------------------- metadata
@dataclass(frozen=True, slots=True)
class OwnerReference:
    """metav1.OwnerReference: the object whose deletion deletes this one."""

    api_version: str
    kind: str
    name: str
    uid: str
    controller: bool | None = None
    block_owner_deletion: bool | None = None

    @classmethod
    def from_dict(cls, data: object, path: str = "ownerReference") -> OwnerReference:
        d = object_at(data, path)
        return cls(
            api_version=string_field(d, "apiVersion", path, required=True),
            kind=string_field(d, "kind", path, required=True),
            name=string_field(d, "name", path, required=True),
            uid=string_field(d, "uid", path, required=True),
            controller=optional_bool_field(d, "controller", path),
            block_owner_deletion=optional_bool_field(d, "blockOwnerDeletion", path),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "apiVersion": self.api_version,
            "kind": self.kind,
            "name": self.name,
            "uid": self.uid,
        }
        if self.controller is not None:
            out["controller"] = self.controller
        if self.block_owner_deletion is not None:
            out["blockOwnerDeletion"] = self.block_owner_deletion
        return out


def node_owner(name: str, uid: str) -> OwnerReference:
    """Owner reference to a Node: a NodeCPUTopology goes away with its node."""
    return OwnerReference("v1", "Node", name, uid)


def pod_owner(name: str, uid: str) -> OwnerReference:
    """Owner reference to a Pod: a PodCPUBinding goes away with its pod."""
    return OwnerReference("v1", "Pod", name, uid, controller=False, block_owner_deletion=False)


def pod_owner_uid(owners: Iterable[OwnerReference], pod_name: str) -> str | None:
    """The uid of the pod `pod_name` among `owners` (a binding's owner references): the pod
    incarnation the binding belongs to; None when no owner reference names that pod."""
    for owner in owners:
        if owner.api_version == "v1" and owner.kind == "Pod" and owner.name == pod_name:
            return owner.uid
    return None


@dataclass(frozen=True, slots=True)
class ObjectMeta:
    """The part of metav1.ObjectMeta corepin reads and writes."""

    name: str
    namespace: str | None = None
    uid: str | None = None
    resource_version: str | None = None
    generation: int | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    owner_references: tuple[OwnerReference, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise FieldError("metadata.name", self.name, "must be a non-empty string")
        set_frozen(self, "labels", readonly(self.labels))
        set_frozen(self, "annotations", readonly(self.annotations))
        set_frozen(self, "owner_references", tuple(self.owner_references))

    @classmethod
    def from_dict(cls, data: object, path: str = "metadata") -> ObjectMeta:
        d = object_at(data, path)
        generation = d.get("generation")
        return cls(
            name=string_field(d, "name", path, required=True),
            namespace=optional_string_field(d, "namespace", path),
            uid=optional_string_field(d, "uid", path),
            resource_version=optional_string_field(d, "resourceVersion", path),
            generation=None
            if generation is None
            else integer(generation, f"{path}.generation", minimum=0),
            labels=strings_field(d, "labels", path),
            annotations=strings_field(d, "annotations", path),
            owner_references=tuple(
                OwnerReference.from_dict(o, f"{path}.ownerReferences[{i}]")
                for i, o in enumerate(list_field(d, "ownerReferences", path))
            ),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name}
        if self.namespace is not None:
            out["namespace"] = self.namespace
        if self.uid is not None:
            out["uid"] = self.uid
        if self.resource_version is not None:
            out["resourceVersion"] = self.resource_version
        if self.generation is not None:
            out["generation"] = self.generation
        if self.labels:
            out["labels"] = dict(self.labels)
        if self.annotations:
            out["annotations"] = dict(self.annotations)
        if self.owner_references:
            out["ownerReferences"] = [o.to_dict() for o in self.owner_references]
        return out


# ---------------------------------------------------------------------- conditions
def _check_condition(
    path: str, type_: str, status: str, reason: str, message: str, generation: int | None
) -> None:
    if not isinstance(type_, str) or len(type_) > 316 or not _CONDITION_TYPE.match(type_):
        raise FieldError(f"{path}.type", type_, "must be a condition type such as 'Ready'")
    one_of(status, f"{path}.status", CONDITION_STATUSES)
    if not isinstance(reason, str) or len(reason) > 1024 or not _CONDITION_REASON.match(reason):
        raise FieldError(
            f"{path}.reason", reason, "must be a CamelCase reason (letters, digits, _ , :)"
        )
    if not isinstance(message, str) or len(message) > 32768:
        raise FieldError(f"{path}.message", message, "must be a string of at most 32768 chars")
    if generation is not None:
        integer(generation, f"{path}.observedGeneration")


@dataclass(frozen=True, slots=True)
class Condition:
    """metav1.Condition."""

    type: str
    status: str
    last_transition_time: datetime
    reason: str
    message: str = ""
    observed_generation: int | None = None

    def __post_init__(self) -> None:
        _check_condition(
            "condition",
            self.type,
            self.status,
            self.reason,
            self.message,
            self.observed_generation,
        )
        set_frozen(
            self,
            "last_transition_time",
            utc_time(self.last_transition_time, "condition.lastTransitionTime"),
        )

    @classmethod
    def from_dict(cls, data: object, path: str = "condition") -> Condition:
        d = object_at(data, path)
        type_ = string_field(d, "type", path, required=True)
        status = string_field(d, "status", path, required=True)
        reason = string_field(d, "reason", path, required=True)
        message = string_field(d, "message", path)
        generation = d.get("observedGeneration")
        _check_condition(path, type_, status, reason, message, generation)
        stamp = d.get("lastTransitionTime")
        if stamp is None:
            raise FieldError(f"{path}.lastTransitionTime", MISSING, "is required")
        return cls(
            type=type_,
            status=status,
            last_transition_time=parse_time(stamp, f"{path}.lastTransitionTime"),
            reason=reason,
            message=message,
            observed_generation=generation,
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "type": self.type,
            "status": self.status,
            "lastTransitionTime": format_time(self.last_transition_time),
            "reason": self.reason,
            "message": self.message,
        }
        if self.observed_generation is not None:
            out["observedGeneration"] = self.observed_generation
        return out


def set_condition(conditions: Iterable[Condition], new: Condition) -> tuple[Condition, ...]:
    """`conditions` with `new` in place of the one of its type (added at the end if none).

    As apimachinery's SetStatusCondition: when the status does not change, the previous
    lastTransitionTime is kept."""
    out: list[Condition] = []
    placed = False
    for old in conditions:
        if old.type != new.type:
            out.append(old)
            continue
        stamp = old.last_transition_time if old.status == new.status else new.last_transition_time
        out.append(
            Condition(new.type, new.status, stamp, new.reason, new.message, new.observed_generation)
        )
        placed = True
    if not placed:
        out.append(new)
    return tuple(out)


def status_condition(condition: Condition) -> dict[str, Any]:
    """A condition as the node agent writes it in the statuses it owns (NodeCPUTopology,
    its PodCPUBindings): the keys in the order it has always sent them, the time after the
    reason and message (`Condition.to_dict` has Kubernetes' own order)."""
    out: dict[str, Any] = {
        "type": condition.type,
        "status": condition.status,
        "reason": condition.reason,
        "message": condition.message,
        "lastTransitionTime": format_time(condition.last_transition_time),
    }
    if condition.observed_generation is not None:
        out["observedGeneration"] = condition.observed_generation
    return out


def find_condition(conditions: Iterable[Condition], type_: str) -> Condition | None:
    return next((c for c in conditions if c.type == type_), None)


def conditions_field(data: Mapping[str, Any], path: str) -> tuple[Condition, ...]:
    """`data["conditions"]`, each type at most once."""
    rows = [
        Condition.from_dict(c, f"{path}.conditions[{i}]")
        for i, c in enumerate(list_field(data, "conditions", path))
    ]
    unique([c.type for c in rows], f"{path}.conditions", "type")
    return tuple(rows)
