"""The rebalancing planner: which running exclusive allocations to move to better-aligned CPUs.

Pure (no I/O, no clock) and deterministic. Every mover - the node agent (`--rebalance`), host
mode (`corepin reconcile --rebalance`) and the simulator (`replay(..., rebalance=True)`) - asks
`plan_moves` and applies the moves it returns, in their order.

An allocation is worth moving when it spans more NUMA nodes, L3 caches or partial cores than an
allocation of its size must (`AlignmentMetrics.minimum`). The planner takes the movable
allocations worst first (the most NUMA nodes over the minimum, then L3 caches, then partial
cores; the larger first on a tie, then by id) and for each:

1. skips it when even the best choice out of the free CPUs and its own could not be strictly
   better (a cheap bound, `AlignmentMetrics.best_within`);
2. releases its withheld CPUs from the pools and asks the policy, through the same `decide` as an
   admission (with `keep_shared`), for as many CPUs at the same exclusiveness level;
3. proposes the move only when the answer is strictly better (`Alignment.better_than`), takes no
   CPU that is neither free nor its own, and withholds no more CPUs than before; the new CPUs are
   then held in the pools before the next allocation is looked at.

So the moves, applied one after the other in their order, never put two allocations on one CPU
and never touch a CPU that anything else holds: a move may only take CPUs that were free, its
own, or left by a move before it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

from corepin.allocation.alignment import Alignment, AlignmentMetrics, alignment_of, metrics_for
from corepin.allocation.decide import decide
from corepin.allocation.pools import EXCLUSIVE_KINDS, NodePools
from corepin.allocation.types import LEVELS, Policy, Request
from corepin.core.cpuset import CPUSet
from corepin.core.errors import AllocationError, RequestError
from corepin.core.record import record
from corepin.topology.model import Topology

__all__ = ["Alignment", "Movable", "Move", "alignment_of", "plan_moves"]

#: Kinds of allocation the planner moves (what `NodePools` holds out of the shared pool).
MOVABLE_KINDS: Final = tuple(sorted(EXCLUSIVE_KINDS))


@record
class Movable:
    """A running exclusive allocation the planner may move: its CPUs, everything it withholds
    (its CPUs plus the rest of the units of its exclusiveness level) and that level. The caller
    leaves out what must not move (opted out, running on a reservation...)."""

    id: str
    cpus: CPUSet
    withheld: CPUSet
    level: str = "cpu"
    kind: str = "exclusive"

    def __post_init__(self) -> None:
        if not isinstance(self.cpus, CPUSet) or not self.cpus:
            raise RequestError(
                f"movable {self.id!r}: cpus must be a non-empty CPUSet, got {self.cpus!r}",
                reason="bad_movable",
            )
        if not isinstance(self.withheld, CPUSet):
            raise RequestError(
                f"movable {self.id!r}: withheld must be a CPUSet, got {self.withheld!r}",
                reason="bad_movable",
            )
        if self.level not in LEVELS:
            raise RequestError(
                f"movable {self.id!r}: unknown exclusiveness level {self.level!r} (choose from "
                f"{', '.join(LEVELS)})",
                reason="bad_movable",
            )
        if self.kind not in MOVABLE_KINDS:
            raise RequestError(
                f"movable {self.id!r}: kind {self.kind!r} cannot be moved (only "
                f"{', '.join(MOVABLE_KINDS)})",
                reason="bad_movable",
            )

    @property
    def held(self) -> CPUSet:
        """Everything the allocation holds: its withheld CPUs and its own."""
        return self.withheld | self.cpus


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


@record
class Move:
    """Move allocation `id` from CPUs `old` to `new` (withholding `new_withheld`, which holds
    `new`); its alignment goes from `before` to `after`, which is strictly better."""

    id: str
    old: CPUSet
    new: CPUSet
    new_withheld: CPUSet
    before: Alignment
    after: Alignment

    @property
    def reason(self) -> str:
        """One sentence: what was wrong and where it went."""
        b, a = self.before, self.after
        spans = f"spans {_plural(b.numa, 'NUMA node')} and {_plural(b.l3, 'L3 cache')}"
        if b.partial_cores != a.partial_cores:
            spans += f" with {_plural(b.partial_cores, 'partial core')}"
            would = f"{a.numa}, {a.l3} and {a.partial_cores}"
        else:
            would = f"{a.numa} and {a.l3}"
        return f"{spans} where {would} would do; moved to {self.new}"

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "old": str(self.old),
            "new": str(self.new),
            "withheld": str(self.new_withheld),
            "before": self.before.to_json(),
            "after": self.after.to_json(),
            "reason": self.reason,
        }


def _checked(pools: NodePools, movable: Iterable[Movable]) -> list[Movable]:
    """The movables, each once; RequestError (reason bad_movable) naming one that holds CPUs the
    pools do not hold exclusively, or that another movable holds too."""
    items = list(movable)
    seen: dict[str, Movable] = {}
    taken = 0
    for item in items:
        if not isinstance(item, Movable):
            raise RequestError(f"not a Movable: {item!r}", reason="bad_movable")
        if item.id in seen:
            raise RequestError(f"movable {item.id!r} is given twice", reason="bad_movable")
        seen[item.id] = item
        bits = item.held.bits
        loose = bits & ~pools.exclusive
        if loose:
            raise RequestError(
                f"movable {item.id!r}: CPUs {CPUSet.from_bits(loose)} are not held exclusively "
                "in the node's pools",
                reason="bad_movable",
            )
        shared = bits & taken
        if shared:
            raise RequestError(
                f"movable {item.id!r}: CPUs {CPUSet.from_bits(shared)} are held by another "
                "movable too",
                reason="bad_movable",
            )
        taken |= bits
    return items


def _worst_first(
    metrics: AlignmentMetrics, items: list[Movable]
) -> list[tuple[Movable, Alignment]]:
    """The movables that are not at their size's minimum, with their alignment, worst first."""
    ranked: list[tuple[tuple[int, int, int, int, str], Movable, Alignment]] = []
    for item in items:
        now = metrics.alignment(item.cpus)
        best = metrics.minimum(len(item.cpus))
        if best.better_than(now):
            excess = (
                now.numa - best.numa,
                now.l3 - best.l3,
                now.partial_cores - best.partial_cores,
            )
            key = (-excess[0], -excess[1], -excess[2], -len(item.cpus), item.id)
            ranked.append((key, item, now))
    ranked.sort(key=lambda row: row[0])
    return [(item, now) for _, item, now in ranked]


def plan_moves(
    topology: Topology,
    pools: NodePools,
    movable: Iterable[Movable],
    policy: Policy,
    *,
    limit: int | None = None,
    keep_shared: bool = True,
    options: Mapping[str, str] | None = None,
) -> tuple[Move, ...]:
    """Moves that strictly improve the alignment of `movable` allocations, at most `limit`.

    `pools` are the node's pools with every movable allocation held in them; each move takes
    only CPUs that are free or the mover's own (or left by an earlier move), never withholds more
    CPUs than before, and with `keep_shared` never leaves the shared pool empty. Apply the moves
    in the order given. `options` are policy options given to every request (as for
    admissions, e.g. {"full-pcpus-only": "true"}). RequestError (reason bad_movable) for a
    movable that the pools do not hold or that overlaps another.
    """
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise RequestError(
            f"limit must be a non-negative integer or None, got {limit!r}", reason="bad_limit"
        )
    items = _checked(pools, movable)
    if limit == 0 or not items:
        return ()
    metrics = metrics_for(topology)
    moves: list[Move] = []
    for item, before in _worst_first(metrics, items):
        if limit is not None and len(moves) >= limit:
            break
        count = len(item.cpus)
        held = item.held
        trial = pools.release(item.kind, held)
        available = trial.free_bits
        if not metrics.best_within(available, count).better_than(before):
            continue
        request = Request(count, level=item.level, options=options or {})
        try:
            decision = decide(
                trial, topology, request, policy, kind=item.kind, keep_shared=keep_shared
            )
        except (AllocationError, RequestError):
            continue
        new = decision.cpus
        new_withheld = decision.withheld | new
        if len(new) != count or new_withheld.bits & ~available or len(new_withheld) > len(held):
            continue  # a policy out of contract, or a move that withholds more: not proposed
        after = metrics.alignment(new)
        if not after.better_than(before):
            continue
        pools = trial.hold(item.kind, new_withheld)
        moves.append(Move(item.id, item.cpus, new, new_withheld, before, after))
    return tuple(moves)
