"""The `NodeResourceTopology` (`topology.node.k8s.io/v1alpha2`) object the node agent publishes
for the scheduler-plugins (`node_resource_topology`): corepin writes it and never reads it back.
"""

from __future__ import annotations

from typing import Any, Final

from corepin.core.cpuset import EMPTY, CPUSet
from corepin.kube.models.fields import FieldError, one_of
from corepin.kube.models.meta import OwnerReference
from corepin.topology.model import Topology

NRT_GROUP: Final = "topology.node.k8s.io"
NRT_API_VERSION: Final = f"{NRT_GROUP}/v1alpha2"
NRT_KIND: Final = "NodeResourceTopology"
NRT_PLURAL: Final = "noderesourcetopologies"
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
    one_of(manager_policy, "topologyManagerPolicy", TOPOLOGY_MANAGER_POLICIES)
    one_of(manager_scope, "topologyManagerScope", TOPOLOGY_MANAGER_SCOPES)
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
