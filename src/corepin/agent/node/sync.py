"""The node agent's decisions: a pod's plan applied to the node state (pure: no I/O).

`sync_pod(state, plan, ctx)` returns the next `HostState` and the `PodEvent`s (Kubernetes
Events, sent by the agent) to tell about one pod; `forget_pod(state, uid)` releases everything a
pod held. Both work on the same state model and pool model as host mode
(`corepin.state.model.HostState`, `corepin.allocation.pools`), so a node's processes and
containers share one account of its CPUs.

Per app container, with identity pod uid + container name (`ContainerOwner`):
- not running yet: nothing is allocated (an existing assignment is kept through a restart);
- terminated, or the pod is being deleted: its assignment is released;
- `none`: a `shared` assignment (the container runs on the shared pool, re-pinned whenever the
  pool changes);
- `share` / `exclusive`: CPUs of its own from the free set (never leaving the shared pool
  empty), at its exclusiveness level; explicit CPUs of a PodCPUBinding are taken as given when
  they are free. An unchanged request keeps its CPUs across container restarts (a new container
  id only updates the owner). A changed CPU count (in-place resize) grows or shrinks the set
  around the CPUs it already holds: kept CPUs never move, added ones come from the same L3,
  then NUMA node, then socket. A changed kind or level is a new allocation;
- when CPUs are short the container runs on the shared pool (`shared`) and the note says
  `CPUPinFailed`; the next sync tries again, so it is upgraded once CPUs free up;
- a container the kubelet gave devices (`SyncContext.device_numa`, from its PodResources API)
  gets its new CPUs in those devices' NUMA nodes when they can be had there
  (`corepin.io/device-alignment: preferred`, the default), only there (`required`: else it is
  treated as any request that cannot be met, on the shared pool with `CPUPinFailed`), or
  wherever the policy likes (`none`).
Init containers run on the shared pool while they run. Assignments imported from the kubelet
(`--kubelet-compat`, policy `kubelet-static`) are left as they are until their pod is gone.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from corepin.allocation.decide import decide
from corepin.allocation.levels import withheld_for
from corepin.allocation.types import Policy, Request
from corepin.core.cpuset import CPUSet
from corepin.core.errors import AllocationError, CorepinError
from corepin.core.record import field, record, replace
from corepin.kube.podplan import ContainerPlan, PodPlan
from corepin.state.kubelet import KUBELET_POLICY
from corepin.state.model import Assignment, HostState
from corepin.state.owners import ContainerOwner
from corepin.topology.model import Topology

#: assignment kind per container policy
KIND_OF: Final = {"none": "shared", "share": "share", "exclusive": "exclusive"}


@record
class PodEvent:
    """A Kubernetes Event to tell about a pod: `type` Normal or Warning, `reason` (CPUPinned,
    CPUMoved, CPUPinFailed, CPUPolicyIgnored), `message`, and the container it is about."""

    type: str
    reason: str
    message: str
    container: str = ""


@record
class SyncContext:
    """What a sync needs besides the state: the machine, the policy, the clock, and the CPUs
    promised to other pods by PodCPUBindings whose containers do not run yet (decisions from
    annotations leave them alone; the pods they are promised to take them when they start),
    and the NUMA nodes of the devices the kubelet gave the pod's containers (container name ->
    NUMA node ids; a container of no devices is not in it)."""

    topology: Topology
    policy: Policy
    now: float = 0.0
    promised: CPUSet = CPUSet()
    device_numa: Mapping[str, CPUSet] = field(default_factory=dict)
    #: the reservation (`HostState.reservations`) whose CPUs this pod gets: "" for none
    reservation: str = ""


def assignment_id(uid: str, container: str) -> str:
    """The state id of a container's assignment (stable across container restarts)."""
    return f"pod/{uid}/{container}"


def _owner(plan: PodPlan, c: ContainerPlan, cgroup: str | None) -> ContainerOwner:
    return ContainerOwner(
        pod_uid=plan.uid,
        container=c.name,
        namespace=plan.namespace,
        pod=plan.name,
        container_id=c.container_id,
        qos=plan.qos,
        runtime=c.runtime,
        cgroup=cgroup,
    )


def pod_assignments(state: HostState, uid: str) -> list[Assignment]:
    """Every assignment of the pod with this uid."""
    return list(state.pod_assignments(uid))


def forget_pod(state: HostState, uid: str) -> tuple[HostState, list[Assignment]]:
    """`state` without the pod's assignments, and what was released."""
    gone = pod_assignments(state, uid)
    return state.remove_many(a.id for a in gone), gone


def sync_pod(state: HostState, plan: PodPlan, ctx: SyncContext) -> tuple[HostState, list[PodEvent]]:
    """Apply one pod's plan (see the module docstring)."""
    events: list[PodEvent] = []
    if plan.deleting:
        state, _ = forget_pod(state, plan.uid)
        return state, events
    names = {c.name for c in plan.containers} | {c.name for c in plan.init_containers}
    for a in pod_assignments(state, plan.uid):
        owner = a.container
        if owner is not None and owner.container not in names:
            state = state.remove(a.id)
    for c in plan.init_containers:
        state = _sync_container(state, plan, c, ctx, events, init=True)
    for c in plan.containers:
        state = _sync_container(state, plan, c, ctx, events, init=False)
    return state, events


def _sync_container(
    state: HostState,
    plan: PodPlan,
    c: ContainerPlan,
    ctx: SyncContext,
    events: list[PodEvent],
    *,
    init: bool,
) -> HostState:
    ident = assignment_id(plan.uid, c.name)
    existing = state.get(ident)
    if existing is not None and existing.policy == KUBELET_POLICY:
        # the kubelet's own assignment (--kubelet-compat): left alone, only named
        named = _owner(plan, c, existing.cgroup)
        return _with_owner(state, existing, named) if c.running else state
    if c.terminated and not c.running:
        return state.remove(ident, missing_ok=True)
    if c.bad_id:
        events.append(
            PodEvent("Warning", "CPUPinFailed", f"container {c.name!r}: {c.bad_id}", c.name)
        )
    if not c.running:
        return state  # not started yet, or between restarts: keep what it holds
    if c.problem and not init:
        events.append(PodEvent("Warning", "CPUPolicyIgnored", c.problem, c.name))
    same_container = (
        existing is not None
        and existing.container is not None
        and (existing.container.container_id == c.container_id)
    )
    owner = _owner(plan, c, existing.cgroup if existing is not None and same_container else None)
    kind = "shared" if init else KIND_OF[c.policy]
    if kind == "shared":
        if existing is not None and existing.kind == "shared":
            return _with_owner(state, existing, owner)
        return _place(state, ident, "shared", CPUSet(), CPUSet(), c, owner, ctx, existing, events)
    if (
        existing is not None
        and existing.kind == kind
        and existing.level == c.level
        and (c.cpus is None or existing.cpus == c.cpus)
    ):
        if len(existing.cpus) == c.count:
            return _with_owner(state, existing, owner)
        return _resize(state, existing, c, owner, ctx, events)
    return _allocate(state, ident, kind, c, owner, ctx, existing, events)


def _with_owner(state: HostState, a: Assignment, owner: ContainerOwner) -> HostState:
    if a.owner == owner:
        return state
    return state.replace_assignment(a.evolve(owner=owner))


def _place(
    state: HostState,
    ident: str,
    kind: str,
    cpus: CPUSet,
    withheld: CPUSet,
    c: ContainerPlan,
    owner: ContainerOwner,
    ctx: SyncContext,
    existing: Assignment | None,
    events: list[PodEvent],
    *,
    policy: str = "",
    reservation: str | None = None,
) -> HostState:
    new = Assignment(
        id=ident,
        kind=kind,
        cpus=cpus,
        withheld=withheld,
        mems=ctx.topology.mems_of(cpus) if cpus else CPUSet(),
        level=c.level if kind != "shared" else "cpu",
        owner=owner,
        created=existing.created if existing is not None else ctx.now,
        policy=policy or (existing.policy if existing is not None else ""),
        workload=c.workload,
        reservation=reservation,
    )
    state = state.remove(ident, missing_ok=True).add(new)
    before = existing.cpus if existing is not None and existing.holds else CPUSet()
    what = kind if reservation is None else f"{kind}, reservation {reservation}"
    if cpus and not before:
        events.append(
            PodEvent("Normal", "CPUPinned", f"container {c.name!r}: CPUs {cpus} ({what})", c.name)
        )
    elif before and before != cpus:
        where = f"CPUs {cpus} ({kind})" if cpus else "the shared pool"
        events.append(
            PodEvent(
                "Normal", "CPUMoved", f"container {c.name!r}: CPUs {before} -> {where}", c.name
            )
        )
    return state


def _allocate(
    state: HostState,
    ident: str,
    kind: str,
    c: ContainerPlan,
    owner: ContainerOwner,
    ctx: SyncContext,
    existing: Assignment | None,
    events: list[PodEvent],
) -> HostState:
    """A new allocation of `kind` for the container; the shared pool when there is none."""
    base = state.remove(ident, missing_ok=True)
    if ctx.reservation and c.cpus is None:
        placed = _on_reservation(base, ident, kind, c, owner, ctx, existing, events)
        if placed is not None:
            return placed
    try:
        if c.cpus is not None:
            cpus = c.cpus
            withheld = withheld_for(ctx.topology, c.level, cpus)
            base.pools.check_hold(kind, withheld)
            if not base.pools.keeps_shared_pool(withheld if kind == "exclusive" else CPUSet()):
                raise AllocationError(
                    f"CPUs {cpus} would leave no CPU in the shared pool",
                    reason="shared_pool_exhausted",
                )
            policy_name = "binding"
        else:
            near, strict = _near(c, ctx)
            request = Request(
                c.count, level=c.level, workload=c.workload, near=near, near_strict=strict
            )
            pools = base.pools
            if ctx.promised & pools.free:
                pools = pools.hold("share", ctx.promised & pools.free)  # (stays in the pool)
            decision = decide(pools, ctx.topology, request, ctx.policy, kind=kind, keep_shared=True)
            cpus, withheld, policy_name = (
                decision.cpus,
                decision.withheld | decision.cpus,
                (decision.policy),
            )
    except CorepinError as exc:
        events.append(
            PodEvent(
                "Warning",
                "CPUPinFailed",
                f"container {c.name!r}: {c.count} {kind} CPU(s) not available ({exc.message}); "
                "it runs on the shared pool until CPUs free up",
                c.name,
            )
        )
        if existing is not None and existing.kind == "shared":
            return _with_owner(state, existing, owner)
        return _place(state, ident, "shared", CPUSet(), CPUSet(), c, owner, ctx, existing, events)
    return _place(
        state, ident, kind, cpus, withheld, c, owner, ctx, existing, events, policy=policy_name
    )


def _on_reservation(
    state: HostState,
    ident: str,
    kind: str,
    c: ContainerPlan,
    owner: ContainerOwner,
    ctx: SyncContext,
    existing: Assignment | None,
    events: list[PodEvent],
) -> HostState | None:
    """The container placed on the CPUs of the pod's reservation (`ctx.reservation`), None
    when it cannot be (the usual decision follows). The first container takes its CPUs out of
    the reservation (`Assignment.reservation`, which consumes it); when the reservation holds
    more, a later container of the same pod takes the rest (a one-time reservation shrinks to
    its first container's CPUs). What the reservation cannot cover comes from the free set."""
    held = state.reservations.get(ctx.reservation)
    if held is None:
        return None
    link: str | None = held.name
    pool = held.cpus
    if held.in_use:
        first = state.get(held.consumed_by[0])
        mine = held.consumed_by[0].startswith(f"pod/{owner.pod_uid}/")
        if first is None or not mine or held.reusable:
            return None
        kept = first.cpus & held.cpus
        rest = held.cpus - kept
        if not kept or not rest:
            return None
        shrunk = replace(held, cpus=kept, withheld=kept | (first.withheld & held.withheld))
        state = state.evolve(reservations={**state.reservations, held.name: shrunk})
        link, pool = None, rest & state.free
    try:
        if c.count < len(pool):
            request = Request(c.count, level=c.level, workload=c.workload)
            cpus = ctx.policy.decide(ctx.topology, request, pool).cpus
        else:
            cpus = pool
            if c.count > len(pool):
                free = state.pools.free - ctx.promised - pool
                cpus = pool | grow(ctx.topology, pool, c.count - len(pool), free, ctx.policy, c)
        withheld = withheld_for(ctx.topology, c.level, cpus)
        return _place(
            state,
            ident,
            kind,
            cpus,
            withheld,
            c,
            owner,
            ctx,
            existing,
            events,
            policy="reservation",
            reservation=link,
        )
    except CorepinError:
        return None


def _near(c: ContainerPlan, ctx: SyncContext) -> tuple[CPUSet | None, bool]:
    """(near, near_strict) of the request that keeps `c`'s CPUs near its devices: (None, False)
    when it has no devices of a known NUMA node, its alignment is `none`, or it is a
    best-effort workload."""
    nodes = ctx.device_numa.get(c.name)
    if not nodes or c.device_alignment == "none" or c.workload == "best-effort":
        return None, False
    near = ctx.topology.cpus_in_numa_nodes(*nodes)
    if not near:
        if c.device_alignment != "required":
            return None, False
        raise AllocationError(
            f"its devices sit on NUMA node(s) {nodes}, which have no online CPU here",
            reason="near_unsatisfiable",
        )
    return near, c.device_alignment == "required"


def _resize(
    state: HostState,
    existing: Assignment,
    c: ContainerPlan,
    owner: ContainerOwner,
    ctx: SyncContext,
    events: list[PodEvent],
) -> HostState:
    """Grow or shrink a container's CPUs around those it keeps (in-place pod resize)."""
    kept = existing.cpus
    if c.count < len(kept):
        cpus = shrink(ctx.topology, kept, len(kept) - c.count)
    else:
        try:
            free = state.pools.free - ctx.promised
            added = grow(ctx.topology, kept, c.count - len(kept), free, ctx.policy, c)
        except CorepinError as exc:
            events.append(
                PodEvent(
                    "Warning",
                    "CPUPinFailed",
                    f"container {c.name!r}: cannot grow CPUs {kept} to {c.count} "
                    f"({exc.message}); it keeps its {len(kept)} CPU(s)",
                    c.name,
                )
            )
            return _with_owner(state, existing, owner)
        cpus = kept | added
    withheld = withheld_for(ctx.topology, c.level, cpus)
    resized = existing.evolve(
        cpus=cpus, withheld=withheld, mems=ctx.topology.mems_of(cpus), owner=owner
    )
    try:
        state = state.replace_assignment(resized)
    except CorepinError as exc:
        events.append(
            PodEvent("Warning", "CPUPinFailed", f"container {c.name!r}: {exc.message}", c.name)
        )
        return _with_owner(state, existing, owner)
    events.append(
        PodEvent(
            "Normal", "CPUMoved", f"container {c.name!r}: resized CPUs {kept} -> {cpus}", c.name
        )
    )
    return state


def grow(
    topology: Topology,
    kept: CPUSet,
    extra: int,
    free: CPUSet,
    policy: Policy,
    c: ContainerPlan,
) -> CPUSet:
    """`extra` free CPUs chosen next to `kept`: in the L3s of the kept CPUs if they hold
    enough, else their NUMA nodes, else their sockets, else anywhere free."""
    near: list[CPUSet] = [
        topology.cpus_in_l3s(*topology.l3s_in(kept)),
        topology.cpus_in_numa_nodes(*topology.numa_nodes_in(kept)),
        topology.cpus_in_sockets(*topology.sockets_in(kept)),
        topology.online_cpus,
    ]
    request = Request(extra, workload=c.workload)
    last: CorepinError | None = None
    for area in near:
        pool = free & area
        if len(pool) < extra:
            continue
        try:
            return policy.decide(topology, request, pool).cpus
        except CorepinError as exc:
            last = exc
    if last is not None:
        raise last
    raise AllocationError(
        f"only {len(free)} free CPU(s) ({free or 'none'}) for {extra} more",
        reason="not_enough_cpus",
    )


def shrink(topology: Topology, kept: CPUSet, drop: int) -> CPUSet:
    """`kept` without `drop` CPUs: first from the L3 holding the fewest of them (so the set
    stays in as few caches as it can), within it from partly used cores, highest id first."""
    l3_size: dict[int | None, int] = {}
    for cpu in kept:
        l3 = topology.l3_of(cpu)
        l3_size[l3] = l3_size.get(l3, 0) + 1

    def order(cpu: int) -> tuple[int, int, int]:
        siblings = topology.siblings_of(cpu) & kept
        return (l3_size[topology.l3_of(cpu)], len(siblings), -cpu)

    dropped = sorted(kept, key=order)[:drop]
    return kept - CPUSet(dropped)


def shared_pool_users(state: HostState) -> list[Assignment]:
    """Container assignments that run on the shared pool (re-pinned when it changes)."""
    return [a for a in state if a.container is not None and a.with_shared]


__all__ = [
    "PodEvent",
    "SyncContext",
    "assignment_id",
    "forget_pod",
    "grow",
    "pod_assignments",
    "shared_pool_users",
    "shrink",
    "sync_pod",
]
