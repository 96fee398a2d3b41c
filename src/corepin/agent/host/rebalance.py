"""`corepin reconcile --rebalance`: move misaligned exclusive runs of this host live to
better-aligned CPUs.

`rebalance(host)` works in one state transaction (under the state lock):

1. reap the dead runs; the movable runs are the exclusive (and mixed) runs of this host that
   are not on a reservation, did not opt out (`corepin run --no-rebalance`,
   `Assignment.rebalance`) and have no cpuset partition of their own;
2. the planner (`corepin.allocation.rebalance.plan_moves`, the host's policy, the shared pool
   kept when shared runs need it) proposes the moves that strictly improve alignment (fewer
   NUMA nodes, L3 caches, partial cores), each onto CPUs that are free or the run's own;
3. `apply_moves`: each move updates the run's assignment (CPUs, withheld CPUs, memory nodes:
   those of the new CPUs, as the state's validation keeps them), all of them
   are committed at once, and then the run is re-pinned live through the pinning engine
   (`Pinner.apply_all`, `corepin.enforcement.reconcile`): its cpuset cgroup in place
   (`cpuset.cpus`, `cpuset.mems`), then every thread's affinity; the shared runs follow the
   shared pool that changed.

Memory: a run's cgroup target asks for its pages to follow (`CgroupTarget(migrate_memory=True)`):
on cgroup v1 the reconciler turns `cpuset.memory_migrate` on before `cpuset.mems` changes, so
the kernel moves the pages the run already has to the new nodes; on cgroup v2 the kernel
migrates them itself when `cpuset.mems` changes. A run without a cpuset group
(`--cgroups off`) keeps its pages where they are (new ones follow its new CPUs' nodes only
where no memory binding of its own says otherwise).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from corepin.agent.host.agent import HostAgent
from corepin.allocation.policies import get_policy
from corepin.allocation.rebalance import Movable, Move, plan_moves
from corepin.core.errors import AllocationError
from corepin.enforcement.note import Note
from corepin.enforcement.shield.control import keep_system
from corepin.state.move import move_assignment

if TYPE_CHECKING:
    from corepin.state.model import Assignment, HostState
    from corepin.state.transaction import CheckedTransaction


def movable_runs(host: HostAgent, state: HostState) -> list[Movable]:
    """The runs of `state` the planner may move (see the module docstring)."""
    out: list[Movable] = []
    for a in state:
        if not a.exclusive or a.reservation is not None or not a.rebalance:
            continue
        if a.process is None or host.pinner.is_partition_path(a.cgroup):
            continue  # a container moves with its node agent; a partition keeps its CPUs
        out.append(Movable(a.id, a.cpus, a.withheld, a.level, a.kind))
    return out


def plan(host: HostAgent, state: HostState, *, limit: int | None = None) -> tuple[Move, ...]:
    """The moves the planner proposes for `state`'s movable runs, in the order to apply them."""
    keep = bool(state.shared_assignments())
    if not keep and state.shield is not None:
        keep = keep_system(state)
    return plan_moves(
        host.topology,
        state.pools,
        movable_runs(host, state),
        get_policy(host.settings.policy),
        limit=limit,
        keep_shared=keep,
    )


def rebalance(host: HostAgent, *, limit: int | None = None) -> tuple[list[Move], list[Note]]:
    """Plan and apply the moves of this host's runs in one transaction: (the moves made, what
    the re-pinning did)."""
    with host.transaction() as txn:
        state, _ = host.liveness.reap(txn.state)
        moves = plan(host, state, limit=limit)
        if not moves:
            if state is not txn.state:
                txn.commit(state)
            return [], []
        return list(moves), apply_moves(host, txn, state, moves)


def execute(host: HostAgent, moves: Sequence[Move]) -> list[Note]:
    """Apply `moves` (made by the planner or by hand: each run's CPUs must still be the move's
    `old`) in a transaction of their own: what the re-pinning did."""
    with host.transaction() as txn:
        return apply_moves(host, txn, txn.state, moves)


def apply_moves(
    host: HostAgent, txn: CheckedTransaction, state: HostState, moves: Iterable[Move]
) -> list[Note]:
    """Record `moves` in `state` (in their order) and commit, then re-pin the moved runs live
    and the shared runs to the new shared pool (see the module docstring). AllocationError
    when a move is stale (the run is gone or on other CPUs) or would take CPUs that are held;
    nothing is changed then."""
    moved: list[tuple[Assignment, Assignment]] = []
    for move in moves:
        old = state.get(move.id)
        if old is None or old.cpus != move.old:
            where = "gone" if old is None else f"on CPUs {old.cpus}"
            raise AllocationError(
                f"move of {move.id!r} from {move.old} is stale: the run is {where}",
                reason="stale_move",
            )
        # the nodes of its new CPUs, as the state's validation keeps them for every holder
        state, old, new = move_assignment(
            state, move.id, move.new, move.new_withheld, host.topology.mems_of(move.new)
        )
        moved.append((old, new))
    if not moved:
        return []
    state = txn.commit(host.sync_shield(state, strict=True))
    ids = {new.id for _, new in moved} | {a.id for a in state.shared_assignments()}
    return host.enforce(state, ids)


def move_note(move: Move) -> Note:
    """One move as a line (`moved ID: from CPUs OLD to NEW: why`)."""
    return Note("moved", move.id, f"from CPUs {move.old} to {move.new}: {move.reason}")


__all__ = ["apply_moves", "execute", "movable_runs", "move_note", "plan", "rebalance"]
