"""The live exclusive allocations of one trace replay (`corepin.allocation.simulate.replay`).

What each live allocation holds, the exclusive CPU-time so far with its NUMA-aligned and
LLC-aligned parts (each allocation counted by what it is in each interval between two events),
and, when the replay rebalances, the allocations worth moving and the step that asks the
rebalancing planner and applies its moves. Pure: no files, no clock.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from corepin.allocation.alignment import AlignmentMetrics
from corepin.allocation.pools import NodePools
from corepin.allocation.rebalance import Movable, Move, plan_moves
from corepin.allocation.types import Policy
from corepin.core.cpuset import CPUSet
from corepin.core.errors import AllocationError
from corepin.topology.model import Topology

#: The planner's signature (`plan_moves`); a benchmark passes a timed wrapper.
Planner = Callable[..., tuple[Move, ...]]


class LiveExclusive:
    """The live exclusive allocations of a replay, their CPU-time, and their rebalancing.

    With `rebalance`, `settle` runs `planner` over the allocations that are not at their size's
    minimum (at most `limit` moves) and applies the moves to the pools.
    """

    __slots__ = (
        "cpu_time",
        "cpus_live",
        "flags",
        "held",
        "limit",
        "llc_live",
        "llc_time",
        "misaligned",
        "moves",
        "numa_live",
        "numa_time",
        "on_move",
        "options",
        "planner",
        "policy",
        "rebalance",
        "scorer",
        "topology",
    )

    def __init__(
        self,
        topology: Topology,
        policy: Policy,
        scorer: AlignmentMetrics,
        *,
        rebalance: bool = False,
        limit: int | None = None,
        options: Mapping[str, str] | None = None,
        planner: Planner = plan_moves,
        on_move: Callable[[int, Move], None] | None = None,
    ) -> None:
        self.topology = topology
        self.policy = policy
        self.scorer = scorer
        self.rebalance = rebalance
        self.limit = limit
        self.options = options
        self.planner = planner
        self.on_move = on_move
        self.held: dict[str, CPUSet] = {}
        self.flags: dict[str, tuple[int, bool, bool]] = {}  # id -> (CPUs, NUMA-, LLC-aligned)
        self.misaligned: dict[str, Movable] = {}  # not at their size's minimum
        self.cpus_live = self.numa_live = self.llc_live = 0
        self.cpu_time = self.numa_time = self.llc_time = 0
        self.moves = 0

    def add(self, ident: str, cpus: CPUSet, held: CPUSet, level: str) -> tuple[bool, bool, bool]:
        """Count a new allocation; its (NUMA-aligned, LLC-aligned, full-core)."""
        now = self.scorer.alignment(cpus)
        best = self.scorer.minimum(len(cpus))
        got = (now.numa <= best.numa, now.l3 <= best.l3, now.partial_cores <= best.partial_cores)
        size = len(cpus)
        self.held[ident] = held
        self.flags[ident] = (size, got[0], got[1])
        self.cpus_live += size
        self.numa_live += size * got[0]
        self.llc_live += size * got[1]
        if self.rebalance and got != (True, True, True):
            self.misaligned[ident] = Movable(ident, cpus, held, level)
        return got

    def remove(self, ident: str) -> CPUSet | None:
        """Forget the allocation `ident`; what it held (None when it is not live)."""
        held = self.held.pop(ident, None)
        if held is not None:
            size, numa, llc = self.flags.pop(ident)
            self.cpus_live -= size
            self.numa_live -= size * numa
            self.llc_live -= size * llc
            self.misaligned.pop(ident, None)
        return held

    def settle(self, pools: NodePools, index: int, *, keep_shared: bool) -> NodePools:
        """After event `index`: rebalance (when on), then count one more event lived by every
        live allocation. The pools after the moves; AllocationError (reason
        planner_contract) when the planner moves what is not movable or takes CPUs that are not
        free."""
        if self.rebalance and self.misaligned:
            pools = self._rebalance(pools, index, keep_shared)
        self.cpu_time += self.cpus_live
        self.numa_time += self.numa_live
        self.llc_time += self.llc_live
        return pools

    def _rebalance(self, pools: NodePools, index: int, keep_shared: bool) -> NodePools:
        moves = self.planner(
            self.topology,
            pools,
            list(self.misaligned.values()),
            self.policy,
            limit=self.limit,
            keep_shared=keep_shared,
            options=self.options,
        )
        for move in moves:
            mover = self.misaligned.get(move.id)
            if mover is None or move.old != mover.cpus:
                raise AllocationError(
                    f"after trace event {index} the planner moved {move.id!r}, which is not a "
                    "live movable allocation",
                    reason="planner_contract",
                )
            try:
                pools = pools.release("exclusive", mover.held).hold("exclusive", move.new_withheld)
            except AllocationError as exc:
                raise AllocationError(
                    f"after trace event {index} the planner moved {move.id!r} to CPUs "
                    f"{move.new_withheld} that are not free: {exc}",
                    reason="planner_contract",
                ) from None
            self.remove(move.id)
            self.add(move.id, move.new, move.new_withheld, mover.level)
            self.moves += 1
            if self.on_move is not None:
                self.on_move(index, move)
        return pools
