"""Typed models of corepin's Kubernetes objects, the annotations it reads and writes, and typed
views of the objects the API server sends: the only reader and writer of the wire format.

Pure values, no I/O and no clock (every timestamp is passed in). Modules:

- `fields`       the JSON field readers every reader of the wire format uses, and `FieldError`
                 (names the field path and the bad value)
- `meta`         the API group, `ObjectMeta`, `OwnerReference`, `Condition`, timestamps
- `levels`       exclusiveness levels in corepin's spelling and the CRD's
- `ncpt`         `NodeCPUTopology` (one per node, written by its agent) and its `Allocation` rows
- `cpur`         `CPUReservation` (CPUs held on a node for pods yet to come; owner matching)
- `pcb`          `PodCPUBinding` (explicit CPUs for a pod; who wrote it: `is_agent_binding`)
- `nrt`          the `NodeResourceTopology` the agent publishes for the scheduler-plugins
- `annotations`  the pod and node annotations (`parse_pod_annotations`, `corepin.io/cpus`, ...)
- `pod`          `PodView` / `ObjectView` (typed read-only views of API objects) and container
                 eligibility for CPUs of its own

Every model has `from_dict(data)` (strict about the fields it knows; unknown fields are
ignored) and `to_dict()` (the wire spelling); `X.from_dict(x.to_dict()) == x`. This package
re-exports the public names of its modules.
"""

from __future__ import annotations

from corepin.kube.models.annotations import (
    ACTIMANAGER_LEVEL,
    ACTIMANAGER_WORKLOAD,
    ANN_CPU_POLICY,
    ANN_CPU_POLICY_PREFIX,
    ANN_CPUS,
    ANN_DEVICE_ALIGNMENT,
    ANN_LEVEL,
    ANN_QOS_CLASS,
    ANN_RESERVATION,
    ANN_WORKLOAD,
    CPU_POLICIES,
    CRANE_CPU_MANAGER,
    DEVICE_ALIGNMENTS,
    KOORDINATOR_QOS_CLASS,
    PodCPUPolicy,
    aliases_to_copy,
    format_cpus_annotation,
    parse_cpus_annotation,
    parse_level_annotation,
    parse_node_reservation,
    parse_pod_annotations,
    parse_workload,
    qos_class_request,
)
from corepin.kube.models.cpur import (
    CPUR_DONE,
    CPUR_KIND,
    CPUR_PHASES,
    CPUR_PLURAL,
    CPUReservation,
    CPUReservationSpec,
    CPUReservationStatus,
    LabelSelector,
    ReservationOwner,
    ReservationUser,
    parse_ttl,
)
from corepin.kube.models.fields import (
    MISSING,
    FieldError,
)
from corepin.kube.models.levels import (
    ACCEPTED_CRD_LEVELS,
    CRD_LEVELS,
    corepin_level,
    crd_level,
)
from corepin.kube.models.meta import (
    API_VERSION,
    CONDITION_STATUSES,
    GROUP,
    READY,
    VERSION,
    Condition,
    ObjectMeta,
    OwnerReference,
    find_condition,
    format_time,
    node_owner,
    parse_time,
    pod_owner,
    pod_owner_uid,
    set_condition,
)
from corepin.kube.models.ncpt import (
    ALLOCATION_POLICIES,
    HEARTBEAT_STALE,
    NCPT_KIND,
    NCPT_PLURAL,
    Allocation,
    NodeCPUTopology,
    NodeCPUTopologySpec,
    NodeCPUTopologyStatus,
    NodeDevices,
)
from corepin.kube.models.nrt import (
    NRT_API_VERSION,
    NRT_GROUP,
    NRT_KIND,
    NRT_PLURAL,
    TOPOLOGY_MANAGER_POLICIES,
    TOPOLOGY_MANAGER_SCOPES,
    node_resource_topology,
)
from corepin.kube.models.pcb import (
    AGENT_MANAGER,
    CONTAINER_LABEL,
    LABEL_MANAGED_BY,
    NODE_LABEL,
    PCB_KIND,
    PCB_PLURAL,
    PHASES,
    POD_UID_LABEL,
    VALIDATED,
    ContainerCPUSet,
    PodCPUBinding,
    PodCPUBindingSpec,
    PodCPUBindingStatus,
    agent_binding_labels,
    is_agent_binding,
)
from corepin.kube.models.pod import (
    Eligibility,
    ObjectView,
    PodView,
    container_eligibility,
    read_quantity,
)

__all__ = [
    "ACCEPTED_CRD_LEVELS",
    "ACTIMANAGER_LEVEL",
    "ACTIMANAGER_WORKLOAD",
    "AGENT_MANAGER",
    "ALLOCATION_POLICIES",
    "ANN_CPUS",
    "ANN_CPU_POLICY",
    "ANN_CPU_POLICY_PREFIX",
    "ANN_DEVICE_ALIGNMENT",
    "ANN_LEVEL",
    "ANN_QOS_CLASS",
    "ANN_RESERVATION",
    "ANN_WORKLOAD",
    "API_VERSION",
    "CONDITION_STATUSES",
    "CONTAINER_LABEL",
    "CPUR_DONE",
    "CPUR_KIND",
    "CPUR_PHASES",
    "CPUR_PLURAL",
    "CPU_POLICIES",
    "CRANE_CPU_MANAGER",
    "CRD_LEVELS",
    "DEVICE_ALIGNMENTS",
    "GROUP",
    "HEARTBEAT_STALE",
    "KOORDINATOR_QOS_CLASS",
    "LABEL_MANAGED_BY",
    "MISSING",
    "NCPT_KIND",
    "NCPT_PLURAL",
    "NODE_LABEL",
    "NRT_API_VERSION",
    "NRT_GROUP",
    "NRT_KIND",
    "NRT_PLURAL",
    "PCB_KIND",
    "PCB_PLURAL",
    "PHASES",
    "POD_UID_LABEL",
    "READY",
    "TOPOLOGY_MANAGER_POLICIES",
    "TOPOLOGY_MANAGER_SCOPES",
    "VALIDATED",
    "VERSION",
    "Allocation",
    "CPUReservation",
    "CPUReservationSpec",
    "CPUReservationStatus",
    "Condition",
    "ContainerCPUSet",
    "Eligibility",
    "FieldError",
    "LabelSelector",
    "NodeCPUTopology",
    "NodeCPUTopologySpec",
    "NodeCPUTopologyStatus",
    "NodeDevices",
    "ObjectMeta",
    "ObjectView",
    "OwnerReference",
    "PodCPUBinding",
    "PodCPUBindingSpec",
    "PodCPUBindingStatus",
    "PodCPUPolicy",
    "PodView",
    "ReservationOwner",
    "ReservationUser",
    "agent_binding_labels",
    "aliases_to_copy",
    "container_eligibility",
    "corepin_level",
    "crd_level",
    "find_condition",
    "format_cpus_annotation",
    "format_time",
    "is_agent_binding",
    "node_owner",
    "node_resource_topology",
    "parse_cpus_annotation",
    "parse_level_annotation",
    "parse_node_reservation",
    "parse_pod_annotations",
    "parse_time",
    "parse_ttl",
    "parse_workload",
    "pod_owner",
    "pod_owner_uid",
    "qos_class_request",
    "read_quantity",
    "set_condition",
]
