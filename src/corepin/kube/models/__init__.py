"""Typed models of corepin's Kubernetes objects and pod-facing annotations.

Pure values, no I/O and no clock: every timestamp is passed in. This module is the one place that
knows the wire spelling of:

- `NodeCPUTopology` (`corepin.io/v1alpha1`, cluster scoped, one per node): `NodeCPUTopology`,
  `NodeCPUTopologySpec`, `NodeCPUTopologyStatus`, `Allocation`;
- `PodCPUBinding` (`corepin.io/v1alpha1`, namespaced, actimanager's shape): `PodCPUBinding`,
  `PodCPUBindingSpec`, `PodCPUBindingStatus`, `ContainerCPUSet`;
- the shared pieces `ObjectMeta`, `OwnerReference` and `Condition` (metav1.Condition);
- who wrote a PodCPUBinding (`is_agent_binding`: the agent's label `app.kubernetes.io/
  managed-by: corepin-agent`) and which pod incarnation it belongs to (`pod_owner_uid`: the
  uid of its Pod owner reference), the controller's `Validated` condition and the
  `HeartbeatStale` reason (the rules are in `corepin.agent.cluster.controller`);
- the `NodeResourceTopology` object the agent publishes for the scheduler-plugins
  (`node_resource_topology`);
- the pod and node annotations (`parse_pod_annotations`, `parse_cpus_annotation`,
  `parse_node_reservation`, `aliases_to_copy`) and container eligibility for pinning
  (`parse_quantity`, `container_eligibility`).

Every model has `from_dict(data)` (strict about the fields it knows: a `FieldError` names the
field path and the bad value; unknown fields are ignored) and `to_dict()` (what goes on the
wire, CRD spelling). `X.from_dict(x.to_dict()) == x` for every model value `x`.

CPU sets are `CPUSet` values; on the wire they are strings in the Linux list form (`"0-3,8"`).
Exclusiveness levels are held in corepin's spelling (`cpu|core|l3|numa|socket`) and written in
the CRD spelling (`CPU|Core|L3|NUMA|Socket`) where the CRD asks for it (`crd_level`,
`corepin_level`); actimanager's `None` means `cpu`.

Mappings held by the models are read-only copies (so the models compare by value but are not
hashable).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone
from fractions import Fraction
from types import MappingProxyType
from typing import Any, Final, TypeVar

from corepin.allocation.pools import (
    KOORDINATOR_RESERVATION,
    Reservation,
    parse_koordinator_reservation,
)
from corepin.allocation.types import LEVELS, WORKLOADS
from corepin.core.cpuset import EMPTY, MAX_CPUS, CPUSet
from corepin.core.errors import CPUSetParseError, InputError
from corepin.topology.model import Topology

_K = TypeVar("_K")
_V = TypeVar("_V")

# ---------------------------------------------------------------------- names on the wire
GROUP: Final = "corepin.io"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
NCPT_KIND: Final = "NodeCPUTopology"
NCPT_PLURAL: Final = "nodecputopologies"
PCB_KIND: Final = "PodCPUBinding"
PCB_PLURAL: Final = "podcpubindings"

NRT_GROUP: Final = "topology.node.k8s.io"
NRT_API_VERSION: Final = f"{NRT_GROUP}/v1alpha2"
NRT_KIND: Final = "NodeResourceTopology"
NRT_PLURAL: Final = "noderesourcetopologies"

#: Exclusiveness levels in the CRD spelling (actimanager's, plus L3); `None` means `cpu`.
CRD_LEVELS: Final = ("None", "CPU", "Core", "L3", "NUMA", "Socket")
#: Every spelling `spec.exclusivenessLevel` accepts: the CRD's and the annotation/CLI one.
ACCEPTED_CRD_LEVELS: Final = CRD_LEVELS + LEVELS
#: `corepin.io/cpu-policy` values.
CPU_POLICIES: Final = ("none", "share", "exclusive")
#: `status.allocations[].policy` values (a `none` container holds nothing, so it is not listed).
ALLOCATION_POLICIES: Final = ("exclusive", "share")
#: `PodCPUBinding.status.phase` values.
PHASES: Final = ("Pending", "Validated", "Applied", "Failed")
CONDITION_STATUSES: Final = ("True", "False", "Unknown")
READY: Final = "Ready"

# ---------------------------------------------------------------------- annotations and labels
ANN_CPU_POLICY: Final = "corepin.io/cpu-policy"
ANN_CPU_POLICY_PREFIX: Final = "corepin.io/cpu-policy."
ANN_LEVEL: Final = "corepin.io/exclusiveness-level"
ANN_WORKLOAD: Final = "corepin.io/workload-type"
ANN_CPUS: Final = "corepin.io/cpus"
ANN_RESERVATION: Final = "corepin.io/reservation"
#: Aliases read for migration; a corepin.io key wins over its alias.
CRANE_CPU_MANAGER: Final = "qos.gocrane.io/cpu-manager"
ACTIMANAGER_LEVEL: Final = "cslab.ece.ntua.gr/exclusiveness-level"
ACTIMANAGER_WORKLOAD: Final = "cslab.ece.ntua.gr/workload-type"

_TO_CRD_LEVEL: Final = {
    "cpu": "CPU",
    "core": "Core",
    "l3": "L3",
    "numa": "NUMA",
    "socket": "Socket",
}
_WORKLOAD_KEYS: Final = {w.replace("-", ""): w for w in WORKLOADS}

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
_ID_TEXT = re.compile(r"[0-9]{1,6}\Z", re.ASCII)
_QUANTITY = re.compile(
    r"([+-]?)([0-9]+(?:\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+|Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])?\Z",
    re.ASCII,
)
_DECIMAL_SUFFIX: Final = {
    "n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18,
}  # fmt: skip
_BINARY_SUFFIX: Final = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}


# ---------------------------------------------------------------------- errors
class FieldError(InputError, ValueError):
    """A field (or annotation) of a Kubernetes object with a bad value; names both."""

    default_reason = "bad_field"

    def __init__(self, path: str, value: object, problem: str, *, reason: str | None = None):
        self.path = path
        self.value = None if value is MISSING else value
        self.problem = problem
        shown = "" if value is MISSING else f" (got {_show(value)})"
        super().__init__(f"{path}: {_clip(problem, 160)}{shown}", reason=reason)


#: The value of a FieldError for a field that is not there at all.
MISSING: Final = object()


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _show(value: object) -> str:
    return _clip(repr(value), 120)


def _annotation_error(key: str, value: object, problem: str) -> FieldError:
    return FieldError(f"annotation {key}", value, problem, reason="bad_annotation")


# ---------------------------------------------------------------------- field readers
def _obj(value: object, path: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise FieldError(path, value, "must be an object")
    for key in value:
        if not isinstance(key, str):
            raise FieldError(path, key, "has a key that is not a string")
    return value


def _opt_obj(data: Mapping[str, Any], key: str, path: str) -> Mapping[str, Any]:
    value = data.get(key)
    return {} if value is None else _obj(value, f"{path}.{key}")


def _list(data: Mapping[str, Any], key: str, path: str) -> list[Any]:
    value = data.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise FieldError(f"{path}.{key}", value, "must be a list")
    return value


def _str(
    data: Mapping[str, Any], key: str, path: str, *, required: bool = False, default: str = ""
) -> str:
    value = data.get(key)
    if value is None:
        if required:
            raise FieldError(f"{path}.{key}", MISSING, "is required")
        return default
    if not isinstance(value, str):
        raise FieldError(f"{path}.{key}", value, "must be a string")
    if required and not value:
        raise FieldError(f"{path}.{key}", value, "must not be empty")
    return value


def _opt_str(data: Mapping[str, Any], key: str, path: str) -> str | None:
    value = data.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise FieldError(f"{path}.{key}", value, "must be a string")
    return value


def _int(value: object, path: str, *, minimum: int = 0, maximum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise FieldError(path, value, "must be an integer")
    if value < minimum or (maximum is not None and value > maximum):
        bound = f"{minimum}..{maximum}" if maximum is not None else f">= {minimum}"
        raise FieldError(path, value, f"must be {bound}")
    return value


def _opt_bool(data: Mapping[str, Any], key: str, path: str) -> bool | None:
    value = data.get(key)
    if value is None or isinstance(value, bool):
        return value
    raise FieldError(f"{path}.{key}", value, "must be true or false")


def _cpuset_text(value: object, path: str) -> CPUSet:
    if not isinstance(value, str):
        raise FieldError(path, value, "must be a CPU list string such as '0-3,8'")
    try:
        return CPUSet.parse(value)
    except CPUSetParseError as exc:
        raise FieldError(path, value, exc.problem) from None


def _cpuset(data: Mapping[str, Any], key: str, path: str) -> CPUSet:
    value = data.get(key)
    return EMPTY if value is None else _cpuset_text(value, f"{path}.{key}")


def _enum(value: str, path: str, choices: Sequence[str]) -> str:
    if value not in choices:
        raise FieldError(path, value, f"must be one of {', '.join(choices)}")
    return value


def _string_map(data: Mapping[str, Any], key: str, path: str) -> dict[str, str]:
    raw = _opt_obj(data, key, path)
    out: dict[str, str] = {}
    for k, v in raw.items():
        if not isinstance(v, str):
            raise FieldError(f"{path}.{key}[{k!r}]", v, "must be a string")
        out[k] = v
    return out


def _cpuset_map(data: Mapping[str, Any], key: str, path: str) -> dict[int, CPUSet]:
    raw = _opt_obj(data, key, path)
    out: dict[int, CPUSet] = {}
    for k, v in raw.items():
        where = f"{path}.{key}[{k!r}]"
        if not _ID_TEXT.match(k):
            raise FieldError(f"{path}.{key}", k, "keys must be ids in decimal text such as '0'")
        ident = int(k)
        if ident in out:
            raise FieldError(f"{path}.{key}", k, f"id {ident} is listed twice")
        out[ident] = _cpuset_text(v, where)
    return out


def _readonly(mapping: Mapping[_K, _V]) -> Mapping[_K, _V]:
    if isinstance(mapping, MappingProxyType):
        return mapping
    return MappingProxyType(dict(mapping))


def _set(obj: object, name: str, value: object) -> None:
    object.__setattr__(obj, name, value)


def _check_header(data: Mapping[str, Any], kind: str, api_version: str) -> None:
    got_kind = data.get("kind")
    if got_kind is not None and got_kind != kind:
        raise FieldError("kind", got_kind, f"must be {kind!r}")
    got_version = data.get("apiVersion")
    if got_version is not None and got_version != api_version:
        raise FieldError("apiVersion", got_version, f"must be {api_version!r}")


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


def _utc(stamp: datetime, path: str) -> datetime:
    if not isinstance(stamp, datetime) or stamp.tzinfo is None or stamp.utcoffset() is None:
        raise FieldError(path, stamp, "must be a timezone-aware datetime")
    return stamp.astimezone(UTC)


# ---------------------------------------------------------------------- levels
def crd_level(level: str) -> str:
    """corepin's level spelling -> the CRD's (`cpu` -> `CPU`, ...); any accepted spelling in."""
    return _TO_CRD_LEVEL[corepin_level(level)]


def corepin_level(text: object, path: str = "exclusiveness level") -> str:
    """Any spelling of an exclusiveness level, in any case (`None`, `CPU`, `core`, `NUMA`...)
    -> corepin's (`cpu|core|l3|numa|socket`); `None` means `cpu`."""
    if not isinstance(text, str):
        raise FieldError(path, text, "must be a string")
    low = text.lower()
    if low == "none":
        return "cpu"
    if low not in LEVELS:
        raise FieldError(path, text, f"must be one of {', '.join(CRD_LEVELS)} (any case)")
    return low


def _check_level(level: str, path: str) -> None:
    if level not in LEVELS:
        raise FieldError(path, level, f"must be one of {', '.join(LEVELS)}")


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
        d = _obj(data, path)
        return cls(
            api_version=_str(d, "apiVersion", path, required=True),
            kind=_str(d, "kind", path, required=True),
            name=_str(d, "name", path, required=True),
            uid=_str(d, "uid", path, required=True),
            controller=_opt_bool(d, "controller", path),
            block_owner_deletion=_opt_bool(d, "blockOwnerDeletion", path),
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


#: The label that tells a PodCPUBinding the node agent wrote (its record of a container it
#: pinned from annotations) from one a user or the scheduler wrote (a request the controller
#: validates). The agent sets `app.kubernetes.io/managed-by: corepin-agent` on every binding it
#: creates; every other binding is user-written.
LABEL_MANAGED_BY: Final = "app.kubernetes.io/managed-by"
AGENT_MANAGER: Final = "corepin-agent"
#: The PodCPUBinding condition the controller owns: True (valid), False (invalid, with the
#: reason), Unknown (cannot be decided yet: pod not scheduled, node topology missing).
VALIDATED: Final = "Validated"
#: The reason the controller gives a NodeCPUTopology's `Ready=False` when the agent's
#: heartbeat stopped.
HEARTBEAT_STALE: Final = "HeartbeatStale"


def agent_binding_labels() -> dict[str, str]:
    """The labels the node agent puts on every PodCPUBinding it creates."""
    return {LABEL_MANAGED_BY: AGENT_MANAGER}


def is_agent_binding(labels: Mapping[str, str] | None) -> bool:
    """Whether a PodCPUBinding with these labels is the node agent's (not user-written)."""
    return labels is not None and labels.get(LABEL_MANAGED_BY) == AGENT_MANAGER


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
        _set(self, "labels", _readonly(self.labels))
        _set(self, "annotations", _readonly(self.annotations))
        _set(self, "owner_references", tuple(self.owner_references))

    @classmethod
    def from_dict(cls, data: object, path: str = "metadata") -> ObjectMeta:
        d = _obj(data, path)
        generation = d.get("generation")
        return cls(
            name=_str(d, "name", path, required=True),
            namespace=_opt_str(d, "namespace", path),
            uid=_opt_str(d, "uid", path),
            resource_version=_opt_str(d, "resourceVersion", path),
            generation=None
            if generation is None
            else _int(generation, f"{path}.generation", minimum=0),
            labels=_string_map(d, "labels", path),
            annotations=_string_map(d, "annotations", path),
            owner_references=tuple(
                OwnerReference.from_dict(o, f"{path}.ownerReferences[{i}]")
                for i, o in enumerate(_list(d, "ownerReferences", path))
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
    _enum(status, f"{path}.status", CONDITION_STATUSES)
    if not isinstance(reason, str) or len(reason) > 1024 or not _CONDITION_REASON.match(reason):
        raise FieldError(
            f"{path}.reason", reason, "must be a CamelCase reason (letters, digits, _ , :)"
        )
    if not isinstance(message, str) or len(message) > 32768:
        raise FieldError(f"{path}.message", message, "must be a string of at most 32768 chars")
    if generation is not None:
        _int(generation, f"{path}.observedGeneration")


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
        _set(
            self,
            "last_transition_time",
            _utc(self.last_transition_time, "condition.lastTransitionTime"),
        )

    @classmethod
    def from_dict(cls, data: object, path: str = "condition") -> Condition:
        d = _obj(data, path)
        type_ = _str(d, "type", path, required=True)
        status = _str(d, "status", path, required=True)
        reason = _str(d, "reason", path, required=True)
        message = _str(d, "message", path)
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


def _status_condition(condition: Condition) -> dict[str, Any]:
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


def _conditions(data: Mapping[str, Any], path: str) -> tuple[Condition, ...]:
    rows = [
        Condition.from_dict(c, f"{path}.conditions[{i}]")
        for i, c in enumerate(_list(data, "conditions", path))
    ]
    _unique([c.type for c in rows], f"{path}.conditions", "type")
    return tuple(rows)


def _unique(keys: Sequence[object], path: str, what: str) -> None:
    seen: set[object] = set()
    for i, key in enumerate(keys):
        if key in seen:
            raise FieldError(f"{path}[{i}]", key, f"{what} is listed twice")
        seen.add(key)


# ---------------------------------------------------------------------- NodeCPUTopology
@dataclass(frozen=True, slots=True)
class Allocation:
    """One row of `NodeCPUTopology.status.allocations`: what a container holds."""

    namespace: str
    pod: str
    pod_uid: str
    container: str
    cpus: CPUSet
    mems: CPUSet
    policy: str
    level: str = "cpu"
    #: the workload family the container asked for (`corepin.io/workload-type`), if any: the
    #: placement core keeps memory-bound pods off sockets busy with memory-bound work
    workload: str | None = None

    def __post_init__(self) -> None:
        _enum(self.policy, "allocation.policy", ALLOCATION_POLICIES)
        _check_level(self.level, "allocation.level")
        if self.workload is not None:
            _enum(self.workload, "allocation.workload", WORKLOADS)

    @property
    def key(self) -> tuple[str, str]:
        """What identifies the row: the pod's uid and the container's name."""
        return (self.pod_uid, self.container)

    @classmethod
    def from_dict(cls, data: object, path: str = "allocation") -> Allocation:
        d = _obj(data, path)
        policy = _enum(
            _str(d, "policy", path, required=True), f"{path}.policy", ALLOCATION_POLICIES
        )
        level = _str(d, "level", path, default="cpu")
        _check_level(level, f"{path}.level")
        workload = _opt_str(d, "workload", path)
        if workload is not None:
            _enum(workload, f"{path}.workload", WORKLOADS)
        return cls(
            namespace=_str(d, "namespace", path, required=True),
            pod=_str(d, "pod", path, required=True),
            pod_uid=_str(d, "podUID", path, required=True),
            container=_str(d, "container", path, required=True),
            cpus=_cpuset(d, "cpus", path),
            mems=_cpuset(d, "mems", path),
            policy=policy,
            level=level,
            workload=workload,
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "namespace": self.namespace,
            "pod": self.pod,
            "podUID": self.pod_uid,
            "container": self.container,
            "cpus": str(self.cpus),
            "mems": str(self.mems),
            "policy": self.policy,
            "level": self.level,
        }
        if self.workload is not None:
            out["workload"] = self.workload
        return out


@dataclass(frozen=True, slots=True)
class NodeCPUTopologySpec:
    """What the node is: its topology, the policy and options the agent
    runs with, and the CPUs reserved for the system."""

    topology: Topology
    policy: str
    options: Mapping[str, str] = field(default_factory=dict)
    reserved_cpus: CPUSet = EMPTY

    def __post_init__(self) -> None:
        if not isinstance(self.policy, str) or not self.policy:
            raise FieldError("spec.policy", self.policy, "must be a non-empty string")
        _set(self, "options", _readonly(self.options))

    @classmethod
    def from_dict(
        cls,
        data: object,
        path: str = "spec",
        *,
        topologies: MutableMapping[str, Topology] | None = None,
    ) -> NodeCPUTopologySpec:
        """The spec; `topologies` (canonical JSON text -> Topology) shares one parsed machine
        among the many nodes of the same hardware (a cluster's worth of NodeCPUTopologies)."""
        d = _obj(data, path)
        raw = d.get("topology")
        if raw is None:
            raise FieldError(f"{path}.topology", MISSING, "is required")
        key = ""
        if topologies is not None:
            try:
                key = json.dumps(raw, sort_keys=True, separators=(",", ":"))
            except (TypeError, ValueError):
                key = ""
        found = topologies.get(key) if topologies is not None and key else None
        if found is not None:
            topology = found
        else:
            try:
                topology = Topology.from_json(raw)
            except (ValueError, TypeError) as exc:  # TopologyError, or a CPU id out of range
                raise FieldError(f"{path}.topology", raw, str(exc)) from None
            if topologies is not None and key:
                topologies[key] = topology
        return cls(
            topology=topology,
            policy=_str(d, "policy", path, required=True),
            options=_string_map(d, "options", path),
            reserved_cpus=_cpuset(d, "reservedCPUs", path),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "topology": self.topology.to_json(),
            "policy": self.policy,
            "options": dict(self.options),
            "reservedCPUs": str(self.reserved_cpus),
        }


@dataclass(frozen=True, slots=True)
class NodeCPUTopologyStatus:
    """What the node has: pools, free CPUs (overall, per NUMA node and per L3), who holds what,
    the agent's heartbeat and the `Ready` condition."""

    shared_pool: CPUSet = EMPTY
    reserved_cpus: CPUSet = EMPTY
    isolated_cpus: CPUSet = EMPTY
    free: CPUSet = EMPTY
    free_by_numa: Mapping[int, CPUSet] = field(default_factory=dict)
    free_by_l3: Mapping[int, CPUSet] = field(default_factory=dict)
    allocations: tuple[Allocation, ...] = ()
    heartbeat_time: datetime | None = None
    conditions: tuple[Condition, ...] = ()

    def __post_init__(self) -> None:
        _set(self, "free_by_numa", _readonly(dict(sorted(self.free_by_numa.items()))))
        _set(self, "free_by_l3", _readonly(dict(sorted(self.free_by_l3.items()))))
        _set(self, "allocations", tuple(self.allocations))
        _set(self, "conditions", tuple(self.conditions))
        _unique([a.key for a in self.allocations], "status.allocations", "pod uid and container")
        _unique([c.type for c in self.conditions], "status.conditions", "type")
        if self.heartbeat_time is not None:
            _set(self, "heartbeat_time", _utc(self.heartbeat_time, "status.heartbeatTime"))

    @property
    def ready(self) -> bool:
        found = find_condition(self.conditions, READY)
        return found is not None and found.status == "True"

    @classmethod
    def from_dict(cls, data: object, path: str = "status") -> NodeCPUTopologyStatus:
        d = _obj(data, path)
        allocations = tuple(
            Allocation.from_dict(a, f"{path}.allocations[{i}]")
            for i, a in enumerate(_list(d, "allocations", path))
        )
        _unique([a.key for a in allocations], f"{path}.allocations", "pod uid and container")
        heartbeat = d.get("heartbeatTime")
        return cls(
            shared_pool=_cpuset(d, "sharedPool", path),
            reserved_cpus=_cpuset(d, "reservedCPUs", path),
            isolated_cpus=_cpuset(d, "isolatedCPUs", path),
            free=_cpuset(d, "free", path),
            free_by_numa=_cpuset_map(d, "freeByNUMA", path),
            free_by_l3=_cpuset_map(d, "freeByL3", path),
            allocations=allocations,
            heartbeat_time=None
            if heartbeat is None
            else parse_time(heartbeat, f"{path}.heartbeatTime"),
            conditions=_conditions(d, path),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "sharedPool": str(self.shared_pool),
            "reservedCPUs": str(self.reserved_cpus),
            "isolatedCPUs": str(self.isolated_cpus),
            "free": str(self.free),
            "freeByNUMA": {str(k): str(v) for k, v in self.free_by_numa.items()},
            "freeByL3": {str(k): str(v) for k, v in self.free_by_l3.items()},
            "allocations": [a.to_dict() for a in self.allocations],
        }
        if self.heartbeat_time is not None:
            out["heartbeatTime"] = format_time(self.heartbeat_time)
        out["conditions"] = [_status_condition(c) for c in self.conditions]
        return out


@dataclass(frozen=True, slots=True)
class NodeCPUTopology:
    """`NodeCPUTopology` (cluster scoped, named after its node, written by that node's agent)."""

    metadata: ObjectMeta
    spec: NodeCPUTopologySpec
    status: NodeCPUTopologyStatus | None = None

    def __post_init__(self) -> None:
        if self.metadata.namespace:
            raise FieldError(
                "metadata.namespace", self.metadata.namespace, "NodeCPUTopology is cluster scoped"
            )

    @property
    def name(self) -> str:
        return self.metadata.name

    @classmethod
    def from_dict(
        cls, data: object, *, topologies: MutableMapping[str, Topology] | None = None
    ) -> NodeCPUTopology:
        """The object (`topologies`: see `NodeCPUTopologySpec.from_dict`)."""
        d = _obj(data, NCPT_KIND)
        _check_header(d, NCPT_KIND, API_VERSION)
        status = d.get("status")
        return cls(
            metadata=ObjectMeta.from_dict(d.get("metadata")),
            spec=NodeCPUTopologySpec.from_dict(d.get("spec"), topologies=topologies),
            status=None if status is None else NodeCPUTopologyStatus.from_dict(status),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "apiVersion": API_VERSION,
            "kind": NCPT_KIND,
            "metadata": self.metadata.to_dict(),
            "spec": self.spec.to_dict(),
        }
        if self.status is not None:
            out["status"] = self.status.to_dict()
        return out


# ---------------------------------------------------------------------- PodCPUBinding
def _cpu_list(value: object, path: str) -> CPUSet:
    """actimanager's `[{"cpuID": N}, ...]` -> CPUSet (a CPU listed twice is an error)."""
    if not isinstance(value, list):
        raise FieldError(path, value, 'must be a list of {"cpuID": N}')
    ids: list[int] = []
    for i, row in enumerate(value):
        d = _obj(row, f"{path}[{i}]")
        if d.get("cpuID") is None:
            raise FieldError(f"{path}[{i}].cpuID", MISSING, "is required")
        cpu = _int(d["cpuID"], f"{path}[{i}].cpuID", maximum=MAX_CPUS - 1)
        if cpu in ids:
            raise FieldError(f"{path}[{i}].cpuID", cpu, "CPU is listed twice")
        ids.append(cpu)
    return CPUSet(ids)


def _cpu_rows(cpus: CPUSet) -> list[dict[str, int]]:
    return [{"cpuID": c} for c in cpus]


@dataclass(frozen=True, slots=True)
class ContainerCPUSet:
    """One row of `PodCPUBinding.spec.containers`: explicit CPUs for one container."""

    name: str
    cpus: CPUSet

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise FieldError("container.name", self.name, "must be a non-empty string")
        if not self.cpus:
            raise FieldError("container.cpuSet", str(self.cpus), "must list at least one CPU")

    @classmethod
    def from_dict(cls, data: object, path: str = "container") -> ContainerCPUSet:
        d = _obj(data, path)
        name = _str(d, "name", path, required=True)
        raw = d.get("cpuSet")
        if raw is None:
            raise FieldError(f"{path}.cpuSet", MISSING, "is required")
        cpus = _cpu_list(raw, f"{path}.cpuSet")
        if not cpus:
            raise FieldError(f"{path}.cpuSet", raw, "must list at least one CPU")
        return cls(name, cpus)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "cpuSet": _cpu_rows(self.cpus)}


@dataclass(frozen=True, slots=True)
class PodCPUBindingSpec:
    """Which pod, at which exclusiveness level, on which explicit CPUs (optional, for the whole
    pod or per container). An empty `cpus` is the same as none given."""

    pod_name: str
    level: str = "cpu"
    cpus: CPUSet | None = None
    containers: tuple[ContainerCPUSet, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.pod_name, str) or not self.pod_name:
            raise FieldError("spec.podName", self.pod_name, "must be a non-empty string")
        _check_level(self.level, "spec.exclusivenessLevel")
        if self.cpus is not None and not self.cpus:
            _set(self, "cpus", None)
        _set(self, "containers", tuple(self.containers))
        _unique([c.name for c in self.containers], "spec.containers", "container name")

    def cpus_for(self, container: str) -> CPUSet | None:
        """The explicit CPUs of `container`: its own row, else the pod's, else None."""
        for row in self.containers:
            if row.name == container:
                return row.cpus
        return self.cpus

    @classmethod
    def from_dict(cls, data: object, path: str = "spec") -> PodCPUBindingSpec:
        d = _obj(data, path)
        raw_level = d.get("exclusivenessLevel")
        level = "cpu"
        if raw_level is not None:
            where = f"{path}.exclusivenessLevel"
            if not isinstance(raw_level, str):
                raise FieldError(where, raw_level, "must be a string")
            level = corepin_level(_enum(raw_level, where, ACCEPTED_CRD_LEVELS), where)
        raw_cpus = d.get("cpuSet")
        containers = tuple(
            ContainerCPUSet.from_dict(c, f"{path}.containers[{i}]")
            for i, c in enumerate(_list(d, "containers", path))
        )
        _unique([c.name for c in containers], f"{path}.containers", "container name")
        return cls(
            pod_name=_str(d, "podName", path, required=True),
            level=level,
            cpus=None if raw_cpus is None else _cpu_list(raw_cpus, f"{path}.cpuSet"),
            containers=containers,
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "podName": self.pod_name,
            "exclusivenessLevel": crd_level(self.level),
        }
        if self.cpus is not None:
            out["cpuSet"] = _cpu_rows(self.cpus)
        if self.containers:
            out["containers"] = [c.to_dict() for c in self.containers]
        return out


@dataclass(frozen=True, slots=True)
class PodCPUBindingStatus:
    """Where the binding stands: the node, the phase, the CPUs and memory nodes applied."""

    phase: str = "Pending"
    node_name: str | None = None
    cpus: CPUSet = EMPTY
    mems: CPUSet = EMPTY
    message: str = ""
    conditions: tuple[Condition, ...] = ()

    def __post_init__(self) -> None:
        _enum(self.phase, "status.phase", PHASES)
        _set(self, "conditions", tuple(self.conditions))
        _unique([c.type for c in self.conditions], "status.conditions", "type")

    @classmethod
    def from_dict(cls, data: object, path: str = "status") -> PodCPUBindingStatus:
        d = _obj(data, path)
        return cls(
            phase=_enum(_str(d, "phase", path, default="Pending"), f"{path}.phase", PHASES),
            node_name=_opt_str(d, "nodeName", path),
            cpus=_cpuset(d, "cpus", path),
            mems=_cpuset(d, "mems", path),
            message=_str(d, "message", path),
            conditions=_conditions(d, path),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {} if self.node_name is None else {"nodeName": self.node_name}
        out.update(
            phase=self.phase,
            cpus=str(self.cpus),
            mems=str(self.mems),
            message=self.message,
            conditions=[_status_condition(c) for c in self.conditions],
        )
        return out


@dataclass(frozen=True, slots=True)
class PodCPUBinding:
    """`PodCPUBinding` (namespaced): explicit CPUs for a pod, or the record of what the agent
    pinned from annotations."""

    metadata: ObjectMeta
    spec: PodCPUBindingSpec
    status: PodCPUBindingStatus | None = None

    def __post_init__(self) -> None:
        if not self.metadata.namespace:
            raise FieldError(
                "metadata.namespace", self.metadata.namespace, "PodCPUBinding is namespaced"
            )

    @property
    def name(self) -> str:
        return self.metadata.name

    @property
    def namespace(self) -> str:
        return self.metadata.namespace or ""

    @classmethod
    def from_dict(cls, data: object) -> PodCPUBinding:
        d = _obj(data, PCB_KIND)
        _check_header(d, PCB_KIND, API_VERSION)
        status = d.get("status")
        return cls(
            metadata=ObjectMeta.from_dict(d.get("metadata")),
            spec=PodCPUBindingSpec.from_dict(d.get("spec")),
            status=None if status is None else PodCPUBindingStatus.from_dict(status),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "apiVersion": API_VERSION,
            "kind": PCB_KIND,
            "metadata": self.metadata.to_dict(),
            "spec": self.spec.to_dict(),
        }
        if self.status is not None:
            out["status"] = self.status.to_dict()
        return out


# ---------------------------------------------------------------------- NodeResourceTopology
#: kubelet Topology Manager policies and scopes, as NodeResourceTopology attributes name them.
TOPOLOGY_MANAGER_POLICIES: Final = ("none", "best-effort", "restricted", "single-numa-node")
TOPOLOGY_MANAGER_SCOPES: Final = ("container", "pod")
_LEGACY_POLICY: Final = {
    "none": "None",
    "best-effort": "BestEffort",
    "restricted": "Restricted",
    "single-numa-node": "SingleNUMANode",
}


def node_resource_topology(
    node_name: str,
    topology: Topology,
    *,
    free: CPUSet,
    reserved: CPUSet = EMPTY,
    manager_policy: str = "none",
    manager_scope: str = "container",
    owner: OwnerReference | None = None,
) -> dict[str, Any]:
    """The `NodeResourceTopology` (`topology.node.k8s.io/v1alpha2`) of a corepin node.

    One zone per NUMA node, named `node-<id>`, of type `Node`, with resource `cpu`:
    capacity = its online CPUs, allocatable = capacity less `reserved`, available = its CPUs in
    `free` less `reserved` (quantity strings). `costs` are the NUMA distances. The attributes
    `topologyManagerPolicy` / `topologyManagerScope` (and the deprecated `topologyPolicies`)
    tell the scheduler-plugins `NodeResourceTopologyMatch` plugin how to filter."""
    if not isinstance(node_name, str) or not node_name:
        raise FieldError("metadata.name", node_name, "must be a non-empty node name")
    _enum(manager_policy, "topologyManagerPolicy", TOPOLOGY_MANAGER_POLICIES)
    _enum(manager_scope, "topologyManagerScope", TOPOLOGY_MANAGER_SCOPES)
    zones: list[dict[str, Any]] = []
    for node in topology.numa_nodes:
        cpus = node.cpus & topology.online_cpus
        capacity = len(cpus)
        allocatable = len(cpus - reserved)
        available = len((free & cpus) - reserved)
        zone: dict[str, Any] = {
            "name": f"node-{node.id}",
            "type": "Node",
            "resources": [
                {
                    "name": "cpu",
                    "capacity": str(capacity),
                    "allocatable": str(allocatable),
                    "available": str(available),
                }
            ],
        }
        if node.distances:
            zone["costs"] = [
                {"name": f"node-{other}", "value": distance}
                for other, distance in sorted(node.distances.items())
            ]
        zones.append(zone)
    legacy = _LEGACY_POLICY[manager_policy]
    if manager_policy == "single-numa-node":
        legacy += "PodLevel" if manager_scope == "pod" else "ContainerLevel"
    metadata: dict[str, Any] = {"name": node_name}
    if owner is not None:
        metadata["ownerReferences"] = [owner.to_dict()]
    return {
        "apiVersion": NRT_API_VERSION,
        "kind": NRT_KIND,
        "metadata": metadata,
        "topologyPolicies": [legacy],
        "attributes": [
            {"name": "topologyManagerPolicy", "value": manager_policy},
            {"name": "topologyManagerScope", "value": manager_scope},
        ],
        "zones": zones,
    }


# ---------------------------------------------------------------------- pod annotations
@dataclass(frozen=True, slots=True)
class PodCPUPolicy:
    """What a pod's annotations (and labels) ask of corepin.

    `explicit` is true when the pod carries any corepin or alias key: the webhook patches
    only such pods."""

    policy: str = "none"
    containers: Mapping[str, str] = field(default_factory=dict)
    level: str = "cpu"
    workload: str | None = None
    explicit: bool = False

    def __post_init__(self) -> None:
        _enum(self.policy, ANN_CPU_POLICY, CPU_POLICIES)
        for name, value in self.containers.items():
            _enum(value, ANN_CPU_POLICY_PREFIX + name, CPU_POLICIES)
        _check_level(self.level, ANN_LEVEL)
        if self.workload is not None:
            _enum(self.workload, ANN_WORKLOAD, WORKLOADS)
        _set(self, "containers", _readonly(dict(sorted(self.containers.items()))))

    def policy_for(self, container: str) -> str:
        """The container's own policy, else the pod's."""
        return self.containers.get(container, self.policy)


def _strings(data: object, what: str) -> Mapping[str, str]:
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise FieldError(f"metadata.{what}", data, "must be an object of strings")
    for key, value in data.items():
        if not isinstance(key, str):
            raise FieldError(f"metadata.{what}", key, "has a key that is not a string")
        if not isinstance(value, str):
            raise FieldError(f"metadata.{what}[{key!r}]", value, "must be a string")
    return data


def _cpu_policy(key: str, value: str) -> str:
    if value not in CPU_POLICIES:
        raise _annotation_error(key, value, f"must be one of {', '.join(CPU_POLICIES)}")
    return value


def parse_level_annotation(key: str, value: str) -> str:
    """An exclusiveness level annotation value (any case; `None` = `cpu`) -> corepin spelling."""
    try:
        return corepin_level(value)
    except FieldError:
        raise _annotation_error(
            key, value, f"must be one of {', '.join(LEVELS)} or None (any case)"
        ) from None


def parse_workload(key: str, value: str) -> str:
    """A workload family: corepin's `memory-bound` or actimanager's `MemoryBound`, any case."""
    found = _WORKLOAD_KEYS.get(value.lower().replace("-", "").replace("_", ""))
    if found is None:
        raise _annotation_error(
            key,
            value,
            f"must be one of {', '.join(WORKLOADS)} (or MemoryBound, CPUBound, IOBound, "
            "BestEffort)",
        )
    return found


def _first(sources: Sequence[tuple[str, Mapping[str, str]]]) -> tuple[str, str] | None:
    for key, mapping in sources:
        if key in mapping:
            return key, mapping[key]
    return None


def parse_pod_annotations(
    annotations: Mapping[str, str] | None, labels: Mapping[str, str] | None = None
) -> PodCPUPolicy:
    """The pod's corepin request from its annotations and labels.

    Keys, most important first: `corepin.io/cpu-policy` then Crane's
    `qos.gocrane.io/cpu-manager`; `corepin.io/cpu-policy.<container>` per container;
    `corepin.io/exclusiveness-level` then actimanager's `cslab.ece.ntua.gr/exclusiveness-level`;
    `corepin.io/workload-type` (annotation, then label) then actimanager's
    `cslab.ece.ntua.gr/workload-type` (label, then annotation). A malformed value raises
    `FieldError` naming the key and the value, even when a higher key hides it (the webhook
    refuses every malformed corepin or alias annotation)."""
    ann = _strings(annotations, "annotations")
    lab = _strings(labels, "labels")
    explicit = False
    policies: dict[str, str] = {}
    for key in (ANN_CPU_POLICY, CRANE_CPU_MANAGER):
        if key in ann:
            policies[key] = _cpu_policy(key, ann[key])
            explicit = True
    policy = policies.get(ANN_CPU_POLICY, policies.get(CRANE_CPU_MANAGER, "none"))
    containers: dict[str, str] = {}
    for key, value in ann.items():
        if key.startswith(ANN_CPU_POLICY_PREFIX):
            name = key[len(ANN_CPU_POLICY_PREFIX) :]
            if not name:
                raise _annotation_error(key, value, "names no container after the dot")
            containers[name] = _cpu_policy(key, value)
            explicit = True
    levels: dict[str, str] = {}
    for key in (ANN_LEVEL, ACTIMANAGER_LEVEL):
        if key in ann:
            levels[key] = parse_level_annotation(key, ann[key])
            explicit = True
    level = levels.get(ANN_LEVEL, levels.get(ACTIMANAGER_LEVEL, "cpu"))
    workloads: list[str] = []
    for key, mapping in (
        (ANN_WORKLOAD, ann),
        (ANN_WORKLOAD, lab),
        (ACTIMANAGER_WORKLOAD, lab),
        (ACTIMANAGER_WORKLOAD, ann),
    ):
        if key in mapping:
            workloads.append(parse_workload(key, mapping[key]))
            explicit = True
    return PodCPUPolicy(
        policy=policy,
        containers=containers,
        level=level,
        workload=workloads[0] if workloads else None,
        explicit=explicit,
    )


def aliases_to_copy(
    annotations: Mapping[str, str] | None, labels: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The corepin.io annotations the webhook adds for the aliases a pod carries (only where
    the corepin.io key is absent), in corepin's spelling. Raises FieldError on a bad value."""
    ann = _strings(annotations, "annotations")
    lab = _strings(labels, "labels")
    out: dict[str, str] = {}
    if ANN_CPU_POLICY not in ann and CRANE_CPU_MANAGER in ann:
        out[ANN_CPU_POLICY] = _cpu_policy(CRANE_CPU_MANAGER, ann[CRANE_CPU_MANAGER])
    if ANN_LEVEL not in ann and ACTIMANAGER_LEVEL in ann:
        out[ANN_LEVEL] = parse_level_annotation(ACTIMANAGER_LEVEL, ann[ACTIMANAGER_LEVEL])
    if ANN_WORKLOAD not in ann and ANN_WORKLOAD not in lab:
        found = _first([(ACTIMANAGER_WORKLOAD, lab), (ACTIMANAGER_WORKLOAD, ann)])
        if found is not None:
            out[ANN_WORKLOAD] = parse_workload(*found)
    return out


def parse_cpus_annotation(value: object) -> dict[str, CPUSet]:
    """`corepin.io/cpus`: a JSON object from container name to CPU list, e.g. `{"app": "2-3"}`."""
    if not isinstance(value, str):
        raise _annotation_error(ANN_CPUS, value, "must be a JSON text")
    try:
        data = json.loads(value)
    except (json.JSONDecodeError, RecursionError) as exc:
        problem = exc.msg if isinstance(exc, json.JSONDecodeError) else "nested too deeply"
        raise _annotation_error(ANN_CPUS, value, f"is not valid JSON: {problem}") from None
    if not isinstance(data, dict):
        raise _annotation_error(ANN_CPUS, value, "must be a JSON object of container: CPU list")
    out: dict[str, CPUSet] = {}
    for name, text in data.items():
        if not name:
            raise _annotation_error(ANN_CPUS, value, "has an empty container name")
        if not isinstance(text, str):
            raise _annotation_error(ANN_CPUS, value, f"container {name!r}: CPUs must be a string")
        try:
            out[name] = CPUSet.parse(text)
        except CPUSetParseError as exc:
            raise _annotation_error(ANN_CPUS, value, f"container {name!r}: {exc.problem}") from None
    return out


def format_cpus_annotation(cpus: Mapping[str, CPUSet]) -> str:
    """The `corepin.io/cpus` text for container -> CPUs (sorted keys, compact)."""
    return json.dumps({k: str(v) for k, v in sorted(cpus.items())}, separators=(",", ":"))


def parse_node_reservation(annotations: Mapping[str, str] | None) -> Reservation | None:
    """The node's CPU reservation from `corepin.io/reservation`, else Koordinator's
    `node.koordinator.sh/reservation` (same JSON); None when neither is there."""
    ann = _strings(annotations, "annotations")
    found = _first([(ANN_RESERVATION, ann), (KOORDINATOR_RESERVATION, ann)])
    if found is None:
        return None
    key, text = found
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        raise _annotation_error(
            key, text, 'is not valid JSON (e.g. {"resources": {"cpu": "2"}})'
        ) from None
    if not isinstance(data, dict):
        raise _annotation_error(key, text, "must be a JSON object")
    try:
        return parse_koordinator_reservation(data)
    except InputError as exc:
        raise _annotation_error(key, text, exc.message) from None


# ---------------------------------------------------------------------- quantities, eligibility
def parse_quantity(value: object, path: str = "quantity") -> Fraction:
    """A Kubernetes resource quantity, exactly: "2" -> 2, "2000m" -> 2, "2.0" -> 2,
    "1500m" -> 3/2, "1e3" -> 1000, "1Ki" -> 1024. JSON numbers are accepted too."""
    if isinstance(value, bool):
        raise FieldError(path, value, "must be a quantity such as '2' or '1500m'")
    if isinstance(value, int):
        return Fraction(value)
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise FieldError(path, value, "must be a finite quantity")
        return Fraction(repr(value))
    if not isinstance(value, str):
        raise FieldError(path, value, "must be a quantity such as '2' or '1500m'")
    known = _QUANTITIES.get(value)
    if known is not None:
        return known
    match = _QUANTITY.match(value)
    if match is None or len(value) > 64:
        raise FieldError(path, value, "is not a Kubernetes quantity such as '2' or '1500m'")
    sign, number, suffix = match.group(1), match.group(2), match.group(3) or ""
    if number.isdigit():  # (Fraction's own text parsing is some 30x slower)
        amount = Fraction(int(number))
    else:
        amount = Fraction(number if not number.endswith(".") else number[:-1])
    if suffix in _BINARY_SUFFIX:
        amount *= 2 ** _BINARY_SUFFIX[suffix]
    else:
        exponent = _DECIMAL_SUFFIX[suffix] if suffix in _DECIMAL_SUFFIX else int(suffix[1:])
        if abs(exponent) > 40:
            raise FieldError(path, value, "is out of range")
        amount *= Fraction(10) ** exponent
    if sign == "-":
        amount = -amount
    if len(_QUANTITIES) < 4096:  # the few distinct texts a node sees, parsed once each
        _QUANTITIES[value] = amount
    return amount


_QUANTITIES: dict[str, Fraction] = {}


@dataclass(frozen=True, slots=True)
class Eligibility:
    """Whether a container may get `exclusive` or `share` CPUs, and how many."""

    eligible: bool
    cpus: int = 0
    reason: str = ""


def container_eligibility(container: object, path: str = "container") -> Eligibility:
    """Eligible when the CPU limit is a whole number >= 1 equal to the CPU
    request (a missing request counts as the limit, as the API server defaults it).

    A malformed container (not an object, a quantity that does not parse) raises FieldError;
    a well-formed but ineligible one returns `eligible=False` with the reason."""
    c = _obj(container, path)
    resources = _opt_obj(c, "resources", path)
    limits = _opt_obj(resources, "limits", f"{path}.resources")
    requests = _opt_obj(resources, "requests", f"{path}.resources")
    raw_limit = limits.get("cpu")
    if raw_limit is None:
        return Eligibility(False, 0, "it has no CPU limit")
    limit = parse_quantity(raw_limit, f"{path}.resources.limits.cpu")
    raw_request = requests.get("cpu")
    request = (
        limit
        if raw_request is None
        else parse_quantity(raw_request, f"{path}.resources.requests.cpu")
    )
    if limit.denominator != 1 or limit < 1:
        return Eligibility(False, 0, f"its CPU limit {raw_limit!r} is not a whole number >= 1")
    if request != limit:
        return Eligibility(
            False, 0, f"its CPU request {raw_request!r} differs from its CPU limit {raw_limit!r}"
        )
    return Eligibility(True, int(limit))
