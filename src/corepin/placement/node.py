"""A node as its agent publishes it: the `NodeCPUTopology` read into pools (pure).

The pools are rebuilt from what the agent published, not recomputed from the allocation rows:
`status.free` and `status.sharedPool` already count every hold of the agent's state (rows it
cannot name, such as a kubelet entry imported under `--kubelet-compat`, and units a decision
withholds beyond its level, such as the idle siblings of a cpu-bound workload). With
`held` = online - reserved - free:

- exclusive holds = held CPUs outside the shared pool;
- share holds = held CPUs inside it;

so `NodePools.free` and `NodePools.shared_pool` of the view are exactly the published sets, and
`corepin.allocation.decide.decide` sees the node as the agent's own state does.

`empty_view(ncpt)` is the node with nothing held (what it could ever take: the webhook's
question). A view is unusable (its `problem` says why, in a sentence) when the agent runs a
policy this build does not know, or when it has not published its CPUs yet. `ready` is the
`Ready` condition; `heartbeat` the agent's last heartbeat in seconds since the epoch
(staleness is judged by the caller, who knows the time); `devices` the node's devices per NUMA
node, as its agent read them from the kubelet.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from corepin.allocation.policies import get_policy
from corepin.allocation.pools import NodePools
from corepin.allocation.types import Policy
from corepin.core.errors import CorepinError
from corepin.core.record import field, record
from corepin.kube.models import (
    READY,
    Allocation,
    NodeCPUTopology,
    NodeCPUTopologySpec,
    NodeDevices,
    find_condition,
)
from corepin.topology.model import Topology

STRICT_RESERVATION: Final = "strict-cpu-reservation"
_TRUE: Final = ("", "1", "true", "yes", "on")


@record
class NodeView:
    """One node's published CPUs, ready for the allocator."""

    name: str
    topology: Topology
    pools: NodePools
    policy: Policy | None
    policy_name: str
    ready: bool = False
    not_ready: str = ""  # the Ready condition's reason and message when not ready
    heartbeat: float | None = None
    allocations: tuple[Allocation, ...] = ()
    confirmed: frozenset[tuple[str, str]] = frozenset()  # (pod uid, container) of the rows
    problem: str = ""  # why the view cannot be used at all ("" when it can)
    version: str = ""
    #: CPUs held by memory-bound containers, per socket id
    memory_bound: Mapping[int, int] = field(default_factory=dict)
    #: the node's devices per resource and NUMA node (`status.devices`; empty: none known)
    devices: tuple[NodeDevices, ...] = ()

    @property
    def usable(self) -> bool:
        return not self.problem

    @property
    def capacity(self) -> int:
        """CPUs that can ever be handed out: online less reserved."""
        return (self.pools.online & ~self.pools.reserved).bit_count()


def node_view(ncpt: NodeCPUTopology, *, version: str = "") -> NodeView:
    """The view of a published node (never raises: a problem is recorded on the view)."""
    spec, status = ncpt.spec, ncpt.status
    topology = spec.topology
    online = topology.online_cpus
    problem = ""
    policy: Policy | None = None
    try:
        policy = get_policy(spec.policy)
    except CorepinError:
        problem = (
            f"its agent runs CPU policy {spec.policy!r}, which this placement build does not "
            "know: run the same corepin version for the agent and the scheduler"
        )
    strict = strict_reservation(spec)
    if status is None:
        pools = NodePools.build(online, reserved=spec.reserved_cpus, strict=strict)
        return NodeView(
            name=ncpt.name,
            topology=topology,
            pools=pools,
            policy=policy,
            policy_name=spec.policy,
            problem=problem
            or "its corepin agent has not published the node's CPUs yet (NodeCPUTopology "
            "without status): wait for the agent to start, or check its pod on the node",
            version=version,
        )
    reserved = status.reserved_cpus & online
    free = (status.free & online) - reserved
    shared = status.shared_pool & online
    held = online - reserved - free
    pools = NodePools(
        online=online.bits,
        isolated=(status.isolated_cpus & online).bits,
        reserved=reserved.bits,
        strict=strict,
        exclusive=(held - shared).bits,
        share=(held & shared).bits,
    )
    condition = find_condition(status.conditions, READY)
    ready = condition is not None and condition.status == "True"
    not_ready = ""
    if not ready:
        if condition is None:
            not_ready = "it has no Ready condition"
        else:
            said = f"{condition.reason}: {condition.message}" if condition.message else ""
            not_ready = f"Ready is {condition.status}" + (f" ({said})" if said else "")
    heartbeat = status.heartbeat_time.timestamp() if status.heartbeat_time else None
    memory_bound: dict[int, int] = {}
    for row in status.allocations:
        if row.workload == "memory-bound":
            for cpu in row.cpus & online:
                socket = topology.socket_of(cpu)
                if socket is not None:
                    memory_bound[socket] = memory_bound.get(socket, 0) + 1
    return NodeView(
        name=ncpt.name,
        topology=topology,
        pools=pools,
        policy=policy,
        policy_name=spec.policy,
        ready=ready,
        not_ready=not_ready,
        heartbeat=heartbeat,
        allocations=status.allocations,
        confirmed=frozenset(a.key for a in status.allocations),
        problem=problem,
        version=version,
        memory_bound=memory_bound,
        devices=status.devices,
    )


def strict_reservation(spec: NodeCPUTopologySpec) -> bool:
    """Whether the node keeps its reserved CPUs out of the shared pool too (the option
    `strict-cpu-reservation`, read as the agent's state reads it)."""
    flag = spec.options.get(STRICT_RESERVATION)
    return flag is not None and flag.strip().lower() in _TRUE


def empty_view(ncpt: NodeCPUTopology) -> NodeView:
    """The node with nothing held: what it could ever give, whatever runs there now (its
    online CPUs less its reserved ones, the status's when it has one, else the spec's).
    RequestError when the node runs a policy this build does not know."""
    spec = ncpt.spec
    topology = spec.topology
    reserved = ncpt.status.reserved_cpus if ncpt.status is not None else spec.reserved_cpus
    policy = get_policy(spec.policy)
    pools = NodePools.for_topology(
        topology, reserved=reserved & topology.online_cpus, strict=strict_reservation(spec)
    )
    return NodeView(
        name=ncpt.name, topology=topology, pools=pools, policy=policy, policy_name=spec.policy
    )


__all__ = ["NodeView", "empty_view", "node_view", "strict_reservation"]
