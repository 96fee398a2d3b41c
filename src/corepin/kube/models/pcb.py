"""`PodCPUBinding` (`corepin.io/v1alpha1`, namespaced, actimanager's shape): explicit CPUs for a
pod (`PodCPUBindingSpec`: the pod, its exclusiveness level, CPUs for the whole pod or per
container as `ContainerCPUSet` rows), or the node agent's record of what it pinned from
annotations; `PodCPUBindingStatus` says where it stands (for the agent's records also the
container's QoS class, `status.qosClass`; absent in bindings written before classes existed).

Who wrote a binding: the node agent labels every binding it creates
`app.kubernetes.io/managed-by: corepin-agent` (`agent_binding_labels`, `is_agent_binding`);
every other binding is a user's (or the scheduler's) request, which the controller validates
with the `Validated` condition (the rules are in `corepin.agent.cluster.controller`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from corepin.core.cpuset import EMPTY, MAX_CPUS, CPUSet
from corepin.core.qos import CLASSES as QOS_CLASSES
from corepin.kube.models.fields import (
    MISSING,
    FieldError,
    check_header,
    cpuset_field,
    integer,
    list_field,
    object_at,
    one_of,
    optional_string_field,
    set_frozen,
    string_field,
    unique,
)
from corepin.kube.models.levels import ACCEPTED_CRD_LEVELS, check_level, corepin_level, crd_level
from corepin.kube.models.meta import (
    API_VERSION,
    Condition,
    ObjectMeta,
    conditions_field,
    status_condition,
)

PCB_KIND: Final = "PodCPUBinding"
PCB_PLURAL: Final = "podcpubindings"
#: `PodCPUBinding.status.phase` values.
PHASES: Final = ("Pending", "Validated", "Applied", "Failed")

#: The label that tells a PodCPUBinding the node agent wrote (its record of a container it
#: pinned from annotations) from one a user or the scheduler wrote (a request the controller
#: validates). The agent sets `app.kubernetes.io/managed-by: corepin-agent` on every binding it
#: creates; every other binding is user-written.
LABEL_MANAGED_BY: Final = "app.kubernetes.io/managed-by"
AGENT_MANAGER: Final = "corepin-agent"
#: Labels of the bindings corepin writes: the node the CPUs are on (the agent's records and the
#: scheduler's bindings), and the pod uid and container an agent record belongs to.
NODE_LABEL: Final = "corepin.io/node"
POD_UID_LABEL: Final = "corepin.io/pod-uid"
CONTAINER_LABEL: Final = "corepin.io/container"
#: The PodCPUBinding condition the controller owns: True (valid), False (invalid, with the
#: reason), Unknown (cannot be decided yet: pod not scheduled, node topology missing).
VALIDATED: Final = "Validated"


def agent_binding_labels() -> dict[str, str]:
    """The labels the node agent puts on every PodCPUBinding it creates."""
    return {LABEL_MANAGED_BY: AGENT_MANAGER}


def is_agent_binding(labels: Mapping[str, str] | None) -> bool:
    """Whether a PodCPUBinding with these labels is the node agent's (not user-written)."""
    return labels is not None and labels.get(LABEL_MANAGED_BY) == AGENT_MANAGER


# ---------------------------------------------------------------------- the binding
def _cpu_list(value: object, path: str) -> CPUSet:
    """actimanager's `[{"cpuID": N}, ...]` -> CPUSet (a CPU listed twice is an error)."""
    if not isinstance(value, list):
        raise FieldError(path, value, 'must be a list of {"cpuID": N}')
    ids: list[int] = []
    for i, row in enumerate(value):
        d = object_at(row, f"{path}[{i}]")
        if d.get("cpuID") is None:
            raise FieldError(f"{path}[{i}].cpuID", MISSING, "is required")
        cpu = integer(d["cpuID"], f"{path}[{i}].cpuID", maximum=MAX_CPUS - 1)
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
        d = object_at(data, path)
        name = string_field(d, "name", path, required=True)
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
        check_level(self.level, "spec.exclusivenessLevel")
        if self.cpus is not None and not self.cpus:
            set_frozen(self, "cpus", None)
        set_frozen(self, "containers", tuple(self.containers))
        unique([c.name for c in self.containers], "spec.containers", "container name")

    @classmethod
    def from_dict(cls, data: object, path: str = "spec") -> PodCPUBindingSpec:
        d = object_at(data, path)
        raw_level = d.get("exclusivenessLevel")
        level = "cpu"
        if raw_level is not None:
            where = f"{path}.exclusivenessLevel"
            if not isinstance(raw_level, str):
                raise FieldError(where, raw_level, "must be a string")
            level = corepin_level(one_of(raw_level, where, ACCEPTED_CRD_LEVELS), where)
        raw_cpus = d.get("cpuSet")
        containers = tuple(
            ContainerCPUSet.from_dict(c, f"{path}.containers[{i}]")
            for i, c in enumerate(list_field(d, "containers", path))
        )
        unique([c.name for c in containers], f"{path}.containers", "container name")
        return cls(
            pod_name=string_field(d, "podName", path, required=True),
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
    """Where the binding stands: the node, the phase, the CPUs and memory nodes applied, and
    the QoS class of the container (the agent's records; None where not told)."""

    phase: str = "Pending"
    node_name: str | None = None
    cpus: CPUSet = EMPTY
    mems: CPUSet = EMPTY
    message: str = ""
    conditions: tuple[Condition, ...] = ()
    qos_class: str | None = None

    def __post_init__(self) -> None:
        one_of(self.phase, "status.phase", PHASES)
        if self.qos_class is not None:
            one_of(self.qos_class, "status.qosClass", QOS_CLASSES)
        set_frozen(self, "conditions", tuple(self.conditions))
        unique([c.type for c in self.conditions], "status.conditions", "type")

    @classmethod
    def from_dict(cls, data: object, path: str = "status") -> PodCPUBindingStatus:
        d = object_at(data, path)
        qos_class = optional_string_field(d, "qosClass", path)
        if qos_class is not None:
            one_of(qos_class, f"{path}.qosClass", QOS_CLASSES)
        return cls(
            phase=one_of(
                string_field(d, "phase", path, default="Pending"), f"{path}.phase", PHASES
            ),
            node_name=optional_string_field(d, "nodeName", path),
            cpus=cpuset_field(d, "cpus", path),
            mems=cpuset_field(d, "mems", path),
            message=string_field(d, "message", path),
            conditions=conditions_field(d, path),
            qos_class=qos_class,
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {} if self.node_name is None else {"nodeName": self.node_name}
        out.update(
            phase=self.phase,
            cpus=str(self.cpus),
            mems=str(self.mems),
            message=self.message,
            conditions=[status_condition(c) for c in self.conditions],
        )
        if self.qos_class is not None:
            out["qosClass"] = self.qos_class
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
        d = object_at(data, PCB_KIND)
        check_header(d, PCB_KIND, API_VERSION)
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
