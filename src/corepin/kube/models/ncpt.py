"""`NodeCPUTopology` (`corepin.io/v1alpha1`, cluster scoped, one per node, written by the node's
agent): what the node is (`NodeCPUTopologySpec`: topology, policy, options, reserved CPUs) and
what it has (`NodeCPUTopologyStatus`: pools, free CPUs, one `Allocation` row per container that
holds CPUs - with its QoS class, `qosClass`, absent in objects written before classes existed -,
the node's devices per NUMA node (`NodeDevices`, from the kubelet's PodResources API; absent in
objects written before the agent read it), the heartbeat and the `Ready` condition).

CPU sets are `CPUSet` values, on the wire strings in the Linux list form (`"0-3,8"`); the
mappings the models hold are read-only copies (the models compare by value but are not
hashable).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

from corepin.allocation.types import WORKLOADS
from corepin.core.cpuset import EMPTY, CPUSet
from corepin.core.qos import CLASSES as QOS_CLASSES
from corepin.kube.models.fields import (
    MISSING,
    FieldError,
    check_header,
    cpuset_field,
    cpuset_text,
    integer,
    list_field,
    object_at,
    object_field,
    one_of,
    optional_string_field,
    readonly,
    set_frozen,
    string_field,
    strings_field,
    unique,
)
from corepin.kube.models.levels import check_level
from corepin.kube.models.meta import (
    API_VERSION,
    READY,
    Condition,
    ObjectMeta,
    conditions_field,
    find_condition,
    format_time,
    parse_time,
    status_condition,
    utc_time,
)
from corepin.topology.model import Topology

NCPT_KIND: Final = "NodeCPUTopology"
NCPT_PLURAL: Final = "nodecputopologies"
#: `status.allocations[].policy` values (a `none` container holds nothing, so it is not listed).
ALLOCATION_POLICIES: Final = ("exclusive", "share")
#: The reason the controller gives a NodeCPUTopology's `Ready=False` when the agent's
#: heartbeat stopped.
HEARTBEAT_STALE: Final = "HeartbeatStale"

_ID_TEXT = re.compile(r"[0-9]{1,6}\Z", re.ASCII)


def _cpuset_map(data: Mapping[str, Any], key: str, path: str) -> dict[int, CPUSet]:
    raw = object_field(data, key, path)
    out: dict[int, CPUSet] = {}
    for k, v in raw.items():
        where = f"{path}.{key}[{k!r}]"
        if not _ID_TEXT.match(k):
            raise FieldError(f"{path}.{key}", k, "keys must be ids in decimal text such as '0'")
        ident = int(k)
        if ident in out:
            raise FieldError(f"{path}.{key}", k, f"id {ident} is listed twice")
        out[ident] = cpuset_text(v, where)
    return out


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
    #: the container's QoS class (`corepin.allocation.qos.CLASSES`); None in rows written
    #: before the agent told it
    qos_class: str | None = None

    def __post_init__(self) -> None:
        one_of(self.policy, "allocation.policy", ALLOCATION_POLICIES)
        check_level(self.level, "allocation.level")
        if self.workload is not None:
            one_of(self.workload, "allocation.workload", WORKLOADS)
        if self.qos_class is not None:
            one_of(self.qos_class, "allocation.qosClass", QOS_CLASSES)

    @property
    def key(self) -> tuple[str, str]:
        """What identifies the row: the pod's uid and the container's name."""
        return (self.pod_uid, self.container)

    @classmethod
    def from_dict(cls, data: object, path: str = "allocation") -> Allocation:
        d = object_at(data, path)
        policy = one_of(
            string_field(d, "policy", path, required=True), f"{path}.policy", ALLOCATION_POLICIES
        )
        level = string_field(d, "level", path, default="cpu")
        check_level(level, f"{path}.level")
        workload = optional_string_field(d, "workload", path)
        if workload is not None:
            one_of(workload, f"{path}.workload", WORKLOADS)
        qos_class = optional_string_field(d, "qosClass", path)
        if qos_class is not None:
            one_of(qos_class, f"{path}.qosClass", QOS_CLASSES)
        return cls(
            namespace=string_field(d, "namespace", path, required=True),
            pod=string_field(d, "pod", path, required=True),
            pod_uid=string_field(d, "podUID", path, required=True),
            container=string_field(d, "container", path, required=True),
            cpus=cpuset_field(d, "cpus", path),
            mems=cpuset_field(d, "mems", path),
            policy=policy,
            level=level,
            workload=workload,
            qos_class=qos_class,
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
        if self.qos_class is not None:
            out["qosClass"] = self.qos_class
        return out


@dataclass(frozen=True, slots=True)
class HeldReservation:
    """One row of `NodeCPUTopology.status.reservations`: a CPUReservation the node's agent
    holds CPUs for (`name`), those CPUs, its phase as the agent sees it (`Available`, or
    `Succeeded` once a one-time reservation was consumed) and the pod running on it
    (`consumed_by`: `namespace/name`), if any."""

    name: str
    cpus: CPUSet
    phase: str | None = None
    consumed_by: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise FieldError("reservations.name", self.name, "must be a non-empty string")

    @classmethod
    def from_dict(cls, data: object, path: str = "reservation") -> HeldReservation:
        d = object_at(data, path)
        return cls(
            name=string_field(d, "name", path, required=True),
            cpus=cpuset_field(d, "cpus", path),
            phase=string_field(d, "phase", path) or None,
            consumed_by=string_field(d, "consumedBy", path) or None,
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "cpus": str(self.cpus)}
        if self.phase:
            out["phase"] = self.phase
        if self.consumed_by:
            out["consumedBy"] = self.consumed_by
        return out


@dataclass(frozen=True, slots=True)
class NodeDevices:
    """One row of `NodeCPUTopology.status.devices`: `count` devices of an extended resource
    (e.g. `nvidia.com/gpu`) on NUMA node `numa_node` (None: the kubelet knows no NUMA node for
    them), `allocatable` of them held by no container."""

    resource: str
    numa_node: int | None
    count: int
    allocatable: int

    def __post_init__(self) -> None:
        if not isinstance(self.resource, str) or not self.resource:
            raise FieldError("devices.resource", self.resource, "must be a non-empty string")
        if self.numa_node is not None:
            integer(self.numa_node, "devices.numaNode", maximum=1 << 20)
        integer(self.count, "devices.count")
        integer(self.allocatable, "devices.allocatable", maximum=self.count)

    @property
    def key(self) -> tuple[str, int]:
        return (self.resource, -1 if self.numa_node is None else self.numa_node)

    @classmethod
    def from_dict(cls, data: object, path: str = "device") -> NodeDevices:
        d = object_at(data, path)
        node = d.get("numaNode")
        count = integer(d.get("count", MISSING), f"{path}.count")
        return cls(
            resource=string_field(d, "resource", path, required=True),
            numa_node=None if node is None else integer(node, f"{path}.numaNode"),
            count=count,
            allocatable=integer(
                d.get("allocatable", MISSING), f"{path}.allocatable", maximum=count
            ),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"resource": self.resource}
        if self.numa_node is not None:
            out["numaNode"] = self.numa_node
        out["count"] = self.count
        out["allocatable"] = self.allocatable
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
        set_frozen(self, "options", readonly(self.options))

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
        d = object_at(data, path)
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
            policy=string_field(d, "policy", path, required=True),
            options=strings_field(d, "options", path),
            reserved_cpus=cpuset_field(d, "reservedCPUs", path),
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
    #: the node's devices per resource and NUMA node (empty: none known, or an older agent)
    devices: tuple[NodeDevices, ...] = ()
    #: the CPUReservations the agent holds CPUs for (empty: none, or an older agent)
    reservations: tuple[HeldReservation, ...] = ()

    def __post_init__(self) -> None:
        set_frozen(self, "reservations", tuple(self.reservations))
        set_frozen(self, "free_by_numa", readonly(dict(sorted(self.free_by_numa.items()))))
        set_frozen(self, "free_by_l3", readonly(dict(sorted(self.free_by_l3.items()))))
        set_frozen(self, "allocations", tuple(self.allocations))
        set_frozen(self, "conditions", tuple(self.conditions))
        set_frozen(self, "devices", tuple(self.devices))
        unique([d.key for d in self.devices], "status.devices", "resource and NUMA node")
        unique([a.key for a in self.allocations], "status.allocations", "pod uid and container")
        unique([c.type for c in self.conditions], "status.conditions", "type")
        if self.heartbeat_time is not None:
            set_frozen(
                self, "heartbeat_time", utc_time(self.heartbeat_time, "status.heartbeatTime")
            )

    @property
    def ready(self) -> bool:
        found = find_condition(self.conditions, READY)
        return found is not None and found.status == "True"

    @classmethod
    def from_dict(cls, data: object, path: str = "status") -> NodeCPUTopologyStatus:
        d = object_at(data, path)
        allocations = tuple(
            Allocation.from_dict(a, f"{path}.allocations[{i}]")
            for i, a in enumerate(list_field(d, "allocations", path))
        )
        unique([a.key for a in allocations], f"{path}.allocations", "pod uid and container")
        heartbeat = d.get("heartbeatTime")
        return cls(
            shared_pool=cpuset_field(d, "sharedPool", path),
            reserved_cpus=cpuset_field(d, "reservedCPUs", path),
            isolated_cpus=cpuset_field(d, "isolatedCPUs", path),
            free=cpuset_field(d, "free", path),
            free_by_numa=_cpuset_map(d, "freeByNUMA", path),
            free_by_l3=_cpuset_map(d, "freeByL3", path),
            allocations=allocations,
            heartbeat_time=None
            if heartbeat is None
            else parse_time(heartbeat, f"{path}.heartbeatTime"),
            conditions=conditions_field(d, path),
            devices=tuple(
                NodeDevices.from_dict(x, f"{path}.devices[{i}]")
                for i, x in enumerate(list_field(d, "devices", path))
            ),
            reservations=tuple(
                HeldReservation.from_dict(x, f"{path}.reservations[{i}]")
                for i, x in enumerate(list_field(d, "reservations", path))
            ),
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
        out["conditions"] = [status_condition(c) for c in self.conditions]
        if self.devices:
            out["devices"] = [x.to_dict() for x in self.devices]
        if self.reservations:
            out["reservations"] = [r.to_dict() for r in self.reservations]
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
        d = object_at(data, NCPT_KIND)
        check_header(d, NCPT_KIND, API_VERSION)
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
