"""A node's published `NodeCPUTopology` read back as a `HostState` (`corepin report --node`).

Pure: the object in, the state out. Each `status.allocations` row becomes an assignment of
its container (kind = the row's policy, exclusive or share; its CPUs, NUMA nodes and level;
the withheld units are recomputed from the level on the published topology), named
`<namespace>/<pod>/<container>`. The node facts come from the object too: online CPUs from
`spec.topology`, isolated and reserved CPUs and the options from status and spec. The pools
the agent published (`status.sharedPool`, `status.free`, ...) are returned beside the state,
so a report shows what the agent says even where it would be derived differently, and so are
the CPUReservations the agent holds (`status.reservations`), as the rows a host report lists
(`name`, `cpus`, `expires`: null, the CPUReservation says when; `consumed_by`: the pod on it).
"""

from __future__ import annotations

from typing import Any

from corepin.allocation.levels import withheld_for
from corepin.core.errors import CorepinError, InputError
from corepin.core.record import record
from corepin.kube.models import NodeCPUTopology
from corepin.state.model import Assignment, HostState, fingerprint
from corepin.state.owners import ContainerOwner


@record
class NodeReport:
    """A node's state as its `NodeCPUTopology` shows it, and the pools it published."""

    node: str
    state: HostState
    pools: dict[str, str]
    reservations: tuple[dict[str, Any], ...] = ()


def node_state(ncpt: NodeCPUTopology) -> NodeReport:
    """The state of a published node (InputError when the object contradicts itself)."""
    spec, status = ncpt.spec, ncpt.status
    topology = spec.topology
    assignments: dict[str, Assignment] = {}
    pools: dict[str, str] = {}
    reserved = spec.reserved_cpus
    isolated = topology.isolated_cpus
    try:
        if status is not None:
            reserved = status.reserved_cpus or reserved
            isolated = status.isolated_cpus or isolated
            pools = {
                "shared_pool": str(status.shared_pool),
                "free": str(status.free),
                "reserved": str(reserved),
                "isolated": str(isolated),
            }
            for row in status.allocations:
                ident = f"{row.namespace}/{row.pod}/{row.container}"
                if ident in assignments:
                    ident = f"{ident}@{row.pod_uid}"
                assignments[ident] = Assignment(
                    id=ident,
                    kind=row.policy,
                    cpus=row.cpus,
                    withheld=withheld_for(topology, row.level, row.cpus),
                    mems=row.mems,
                    level=row.level,
                    owner=ContainerOwner(
                        pod_uid=row.pod_uid,
                        container=row.container,
                        namespace=row.namespace,
                        pod=row.pod,
                    ),
                    policy=spec.policy,
                    workload=row.workload,
                    qos=row.qos_class,
                )
        state = HostState(
            topology=fingerprint(topology),
            online=topology.online_cpus,
            isolated=isolated,
            reserved=reserved,
            options=dict(spec.options),
        )
        for assignment in assignments.values():  # checked: no CPU held twice, none reserved
            state = state.add(assignment)
    except CorepinError as exc:
        raise InputError(
            f"NodeCPUTopology {ncpt.name!r} does not add up: {exc}", reason="bad_node_topology"
        ) from exc
    held = tuple(
        {
            "name": r.name,
            "cpus": str(r.cpus),
            "expires": None,
            "consumed_by": r.consumed_by,
            "phase": r.phase,
        }
        for r in (status.reservations if status is not None else ())
    )
    return NodeReport(ncpt.name, state, pools, held)
