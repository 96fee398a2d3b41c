"""Node API messages <-> corepin values: the one place that knows both spellings.

Every conversion goes both ways and round-trips: `topology_from_message(topology_message(t))
== t`, and a `NodeState` message gives back the `HostState` it was made from (same facts and
assignments, so the same derived pools) with the statuses the server sent.

Messages from a client are untrusted: CPU sets are parsed (CPUSetParseError), values go
through the validating constructors of the state layer (RequestError), so a bad message is
an InputError like bad command-line input.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from corepin.agent.ports import AllocationSpec, ContainerRef, ProcessRef
from corepin.api.grpc.gen.v1alpha1 import pinning_pb2 as pb
from corepin.api.grpc.gen.v1alpha1 import topology_pb2 as tpb
from corepin.core.cpuset import CPUSet
from corepin.core.errors import RequestError
from corepin.state.model import Assignment, HostState
from corepin.state.owners import ContainerOwner, Owner, ProcessOwner
from corepin.topology.devices import Device
from corepin.topology.model import Topology

_CPU_OPTIONAL = ("socket", "die", "numa", "l3", "l2", "core", "cluster", "capacity")


# ---------------------------------------------------------------------- topology
def topology_message(topology: Topology) -> tpb.NodeTopology:
    """The `NodeTopology` message of a topology: the fields of `corepin topology -o json`
    (null = absent)."""
    out = tpb.NodeTopology()
    for cpu in topology.cpus:
        row = out.cpus.add(cpu=cpu.cpu, online=cpu.online, isolated=cpu.isolated)
        for name in _CPU_OPTIONAL:
            value = getattr(cpu, name)
            if value is not None:
                setattr(row, name, value)
        if cpu.core_type is not None:
            row.core_type = cpu.core_type
    for node in topology.numa_nodes:
        msg = out.numa_nodes.add(id=node.id, cpus=str(node.cpus))
        msg.distances.update(dict(node.distances))
        if node.memory_kb is not None:
            msg.memory_kb = node.memory_kb
    for device in topology.devices:
        found = out.devices.add(
            address=device.address,
            class_code=device.pci_class,
            vendor=device.vendor,
            device=device.device,
            local_cpus=str(device.local_cpus),
            names=device.names,
        )
        if device.numa is not None:
            found.numa = device.numa
    return out


def topology_from_message(msg: tpb.NodeTopology) -> Topology:
    """The topology a `NodeTopology` message describes (TopologyError when inconsistent)."""
    cpus: list[dict[str, Any]] = []
    for row in msg.cpus:
        cpu: dict[str, Any] = {"cpu": row.cpu, "online": row.online, "isolated": row.isolated}
        for name in _CPU_OPTIONAL:
            cpu[name] = getattr(row, name) if row.HasField(name) else None
        cpu["core_type"] = row.core_type if row.HasField("core_type") else None
        cpus.append(cpu)
    nodes: list[dict[str, Any]] = []
    for node in msg.numa_nodes:
        data: dict[str, Any] = {
            "id": node.id,
            "cpus": node.cpus,
            "distances": {str(k): v for k, v in sorted(node.distances.items())},
        }
        if node.HasField("memory_kb"):
            data["memory_kb"] = node.memory_kb
        nodes.append(data)
    devices = [
        Device(
            address=row.address,
            pci_class=row.class_code,
            vendor=row.vendor,
            device=row.device,
            numa=row.numa if row.HasField("numa") else None,
            local_cpus=CPUSet.parse(row.local_cpus),
            names=tuple(row.names),
        )
        for row in msg.devices
    ]
    topology = Topology.from_json({"cpus": cpus, "numa_nodes": nodes})
    return Topology(topology.cpus, topology.numa_nodes, devices=devices)


# ---------------------------------------------------------------------- owners
def _process_message(owner: ProcessOwner) -> pb.ProcessOwner:
    msg = pb.ProcessOwner(pid=owner.pid, name=owner.name, command=owner.command)
    for name in ("start_time", "runner_pid", "runner_start_time", "cgroup", "session"):
        value = getattr(owner, name)
        if value is not None:
            setattr(msg, name, value)
    return msg


def _container_message(owner: ContainerOwner) -> pb.ContainerOwner:
    msg = pb.ContainerOwner(
        pod_uid=owner.pod_uid,
        container=owner.container,
        namespace=owner.namespace,
        pod=owner.pod,
        container_id=owner.container_id,
        qos=owner.qos,
        runtime=owner.runtime,
    )
    if owner.cgroup is not None:
        msg.cgroup = owner.cgroup
    return msg


def _owner_from(msg: pb.Allocation) -> Owner | None:
    which = msg.WhichOneof("owner")
    if which == "process":
        p = msg.process
        return ProcessOwner(
            pid=p.pid,
            start_time=p.start_time if p.HasField("start_time") else None,
            runner_pid=p.runner_pid if p.HasField("runner_pid") else None,
            runner_start_time=p.runner_start_time if p.HasField("runner_start_time") else None,
            cgroup=p.cgroup if p.HasField("cgroup") else None,
            session=p.session if p.HasField("session") else None,
            name=p.name,
            command=p.command,
        )
    if which == "container":
        c = msg.container
        return ContainerOwner(
            pod_uid=c.pod_uid,
            container=c.container,
            namespace=c.namespace,
            pod=c.pod,
            container_id=c.container_id,
            qos=c.qos,
            runtime=c.runtime,
            cgroup=c.cgroup if c.HasField("cgroup") else None,
        )
    return None


# ---------------------------------------------------------------------- allocations
def allocation_message(
    a: Assignment, shared_pool: CPUSet, status: str | None = None
) -> pb.Allocation:
    """The `Allocation` message of an assignment, with its affinity given the shared pool."""
    msg = pb.Allocation(
        id=a.id,
        kind=a.kind,
        cpus=str(a.cpus),
        withheld=str(a.withheld),
        mems=str(a.mems),
        level=a.level,
        created=a.created,
        policy=a.policy,
        affinity=str(a.affinity(shared_pool)),
    )
    if a.workload is not None:
        msg.workload = a.workload
    if status is not None:
        msg.status = status
    if isinstance(a.owner, ProcessOwner):
        msg.process.CopyFrom(_process_message(a.owner))
    elif isinstance(a.owner, ContainerOwner):
        msg.container.CopyFrom(_container_message(a.owner))
    return msg


def assignment_from_message(msg: pb.Allocation) -> Assignment:
    """The assignment an `Allocation` message describes (InputError when it is not valid)."""
    return Assignment(
        id=msg.id,
        kind=msg.kind,
        cpus=CPUSet.parse(msg.cpus),
        withheld=CPUSet.parse(msg.withheld),
        mems=CPUSet.parse(msg.mems),
        level=msg.level or "cpu",
        owner=_owner_from(msg),
        created=msg.created,
        policy=msg.policy,
        workload=msg.workload if msg.HasField("workload") else None,
    )


def status_of(msg: pb.Allocation) -> str | None:
    return msg.status if msg.HasField("status") else None


# ---------------------------------------------------------------------- state
def pools_message(state: HostState) -> pb.Pools:
    return pb.Pools(
        online=str(state.online),
        isolated=str(state.isolated),
        reserved=str(state.reserved),
        infra=str(state.infra),
        shared_pool=str(state.shared_pool),
        free=str(state.free),
        held=str(state.held),
        exclusive=str(state.exclusive_cpus),
    )


def state_message(
    state: HostState, statuses: Mapping[str, str] | None = None, *, node_name: str = ""
) -> pb.NodeState:
    """The `NodeState` message of a state (with the statuses the agent knows)."""
    statuses = statuses or {}
    pool = state.shared_pool
    msg = pb.NodeState(
        node_name=node_name,
        revision=state.revision,
        pools=pools_message(state),
        topology_fingerprint=state.topology,
    )
    msg.options.update(dict(state.options))
    msg.allocations.extend(allocation_message(a, pool, statuses.get(a.id)) for a in state)
    return msg


def state_from_message(msg: pb.NodeState) -> tuple[HostState, dict[str, str]]:
    """The state a `NodeState` message describes, and the statuses it carries."""
    assignments = [assignment_from_message(a) for a in msg.allocations]
    ids = [a.id for a in assignments]
    if len(set(ids)) != len(ids):
        raise RequestError("the node state lists an allocation id twice")
    state = HostState(
        revision=msg.revision,
        topology=msg.topology_fingerprint,
        online=CPUSet.parse(msg.pools.online),
        isolated=CPUSet.parse(msg.pools.isolated),
        reserved=CPUSet.parse(msg.pools.reserved),
        infra=CPUSet.parse(msg.pools.infra),
        options=dict(msg.options),
        assignments={a.id: a for a in assignments},
    )
    statuses = {a.id: a.status for a in msg.allocations if a.HasField("status")}
    return state, statuses


# ---------------------------------------------------------------------- allocate
def spec_from_request(msg: pb.AllocateRequest) -> AllocationSpec:
    """The `AllocationSpec` of an Allocate request (InputError when it makes no sense)."""
    owner: ProcessRef | ContainerRef | None = None
    which = msg.WhichOneof("owner")
    if which == "process":
        owner = ProcessRef(pid=msg.process.pid)
    elif which == "container":
        c = msg.container
        owner = ContainerRef(
            pod_uid=c.pod_uid,
            container=c.container,
            namespace=c.namespace,
            pod=c.pod,
            container_id=c.container_id,
        )
    return AllocationSpec.build(
        kind=msg.kind,
        cpus=msg.cpus,
        level=msg.level,
        options=dict(msg.options),
        owner=owner,
        name=msg.name,
    )


def request_from_spec(spec: AllocationSpec) -> pb.AllocateRequest:
    msg = pb.AllocateRequest(kind=spec.kind, cpus=spec.cpus, level=spec.level, name=spec.name)
    msg.options.update(dict(spec.options))
    if isinstance(spec.owner, ProcessRef):
        msg.process.pid = spec.owner.pid
    elif isinstance(spec.owner, ContainerRef):
        o = spec.owner
        msg.container.CopyFrom(
            pb.ContainerRef(
                pod_uid=o.pod_uid,
                container=o.container,
                namespace=o.namespace,
                pod=o.pod,
                container_id=o.container_id,
            )
        )
    return msg


# ---------------------------------------------------------------------- watch
def initial_event(
    state: HostState, statuses: Mapping[str, str], *, node_name: str
) -> pb.WatchEvent:
    return pb.WatchEvent(
        type=pb.WatchEvent.INITIAL,
        revision=state.revision,
        pools=pools_message(state),
        state=state_message(state, statuses, node_name=node_name),
    )


def change_events(
    before: HostState, after: HostState, statuses: Mapping[str, str] | None = None
) -> Iterable[pb.WatchEvent]:
    """The events that lead from `before` to `after`: DELETED, ADDED and MODIFIED per
    allocation (in id order), or one POOLS event when only the node's facts or pools changed.
    None when nothing changed."""
    statuses = statuses or {}
    pools = pools_message(after)
    pool_before, pool_after = before.shared_pool, after.shared_pool
    events: list[pb.WatchEvent] = []
    for a in before:
        if a.id not in after:
            events.append(
                pb.WatchEvent(
                    type=pb.WatchEvent.DELETED,
                    revision=after.revision,
                    allocation=allocation_message(a, pool_before),
                    pools=pools,
                )
            )
    for a in after:
        old = before.get(a.id)
        if old is None:
            kind = pb.WatchEvent.ADDED
        elif old != a or old.affinity(pool_before) != a.affinity(pool_after):
            kind = pb.WatchEvent.MODIFIED
        else:
            continue
        events.append(
            pb.WatchEvent(
                type=kind,
                revision=after.revision,
                allocation=allocation_message(a, pool_after, statuses.get(a.id)),
                pools=pools,
            )
        )
    if not events and pools != pools_message(before):
        events.append(pb.WatchEvent(type=pb.WatchEvent.POOLS, revision=after.revision, pools=pools))
    return events
