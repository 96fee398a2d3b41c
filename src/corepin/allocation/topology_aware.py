"""Policy `topology-aware` (the default): corepin's own exclusive CPU placement.

A *stray thread* is the free thread of a partly used core; a *partial core* of a decision is a
core it holds only some threads of. Order of preference for n CPUs taken from the available set:
1. one NUMA node whenever one can hold n; among those, the one that needs the fewest L3
   instances, then can give n as whole cores inside that many L3s, then (odd n) has a stray
   thread for the odd CPU, then has the *fewest* free CPUs (best fit: partly used nodes are
   filled first so that empty ones stay whole), then the lowest id; one CPU (SMT-2) goes to a
   stray thread whenever there is one, so that it splits no whole core, in the node with the
   most stray threads (they hold its whole-core capacity below its free count);
2. inside a node, one L3 whenever one can hold n, chosen the same way; inside an L3 over
   several packages (DynamIQ clusters numbered as packages), one package whenever one can hold
   n (the best fit), else the fewest packages, largest first;
3. inside an L3, whole physical cores (n / SMT-width cores when n is a multiple of the SMT
   width; at most one partial core otherwise, a stray thread before a whole core).

When no single unit can hold n, the fewest units are combined: largest first, then the best fit
for the remainder, preferring units in one socket, sharing an L3 or a die, close by NUMA
distance. When a pick holds more partial cores than n allows, it is compared with the same walk
over the whole free cores alone (for an odd n: whole cores for n - 1 plus one stray thread,
near the rest); a single node or L3 that holds n is always kept, but over a span of several
units a partial core weighs as much as one more unit, so whole cores over one more node or L3
beat sharing cores with other workloads to save it. This is a greedy walk over the pool tree,
linear in the number of units: no combinations are enumerated, so it stays fast at 16+ NUMA
nodes and 1,000+ CPUs.

Options in `Request`: `level` (exclusiveness: only fully free units of that level are used and
the decision reserves them whole), `numa_hint` (tried first), `prefer_isolated` (isolated CPUs
first, else they are tried last), `smt` ("whole-cores" insists on whole cores, "spread" takes one
thread per core). Policy option: `full-pcpus-only` (same as smt="whole-cores").
"""

from __future__ import annotations

from typing import Final

from corepin.allocation.levels import TopologyIndex, index_of
from corepin.allocation.pools import NodePools
from corepin.allocation.selector import Selector
from corepin.allocation.types import Decision, Request, Step, check_options, option_flag
from corepin.core.cpuset import CPUSet
from corepin.core.errors import AllocationError, SMTAlignmentError
from corepin.topology.model import Topology

NAME: Final = "topology-aware"
OPTIONS: Final = ("full-pcpus-only", "allow-isolated")


def mems_of(idx: TopologyIndex, cpus: int) -> CPUSet:
    return CPUSet(u.id for u in idx.numa if u.mask & cpus and u.id >= 0)


class TopologyAwarePolicy:
    """corepin's default policy (see the module docstring)."""

    name: str = NAME

    def decide(self, topology: Topology, request: Request, available: CPUSet) -> Decision:
        check_options(request.options, OPTIONS, NAME)
        whole = request.smt == "whole-cores" or option_flag(request.options, "full-pcpus-only")
        idx = index_of(topology)
        avail = available.bits & idx.online
        if not request.exclusive:
            return shared_decision(idx, avail, request, NAME)
        n = request.count
        level = request.level
        t = idx.threads_per_core
        if avail.bit_count() < n:
            raise AllocationError(
                f"not enough CPUs: requested {n}, available {avail.bit_count()}",
                reason="not_enough_cpus",
            )
        if whole and t > 1 and n % t:
            raise SMTAlignmentError(
                f"SMT alignment error: {n} CPUs is not a multiple of the {t} threads per core",
                reason="smt_alignment",
            )
        steps: list[Step] = []
        for mask, note in _candidates(idx, avail, request):
            usable = idx.free_units_mask(level, mask) if level != "cpu" else mask
            if whole:
                usable = idx.free_units_mask("core", usable)
            free = usable.bit_count()
            if free < n:
                what = f"whole free {level}s" if level != "cpu" else "CPUs"
                if whole:
                    what += " in whole free cores"
                steps.append(Step("pool", note, f"skipped: only {free} {what} there"))
                continue
            steps.append(Step("pool", note, f"{free} usable CPUs hold {n}"))
            if level != "cpu":
                steps.append(
                    Step(
                        "level",
                        level,
                        f"only {level}s whose CPUs are all free are used; their other CPUs "
                        "are withheld with the decision",
                    )
                )
            sel = Selector(idx, usable, "spread" if request.smt == "spread" else "whole")
            cpus = sel.select(n)
            steps.extend(sel.steps)
            return Decision(
                cpus=CPUSet.from_bits(cpus),
                mems=mems_of(idx, cpus),
                withheld=CPUSet.from_bits(idx.withheld_mask(level, cpus)),
                policy=NAME,
                explanation=tuple(steps),
            )
        if whole:
            raise SMTAlignmentError(
                f"SMT alignment error: {n} CPUs need {n // t} whole free cores and there are "
                "not enough",
                reason="smt_alignment",
            )
        raise AllocationError(
            f"cannot reserve whole {level}s for {n} CPUs: not enough {level}s are entirely free "
            f"({idx.free_units_mask(level, avail).bit_count()} CPUs in free {level}s)",
            reason="level_unsatisfiable",
        )


def _candidates(idx: TopologyIndex, avail: int, request: Request) -> list[tuple[int, str]]:
    """The CPU pools to try in order: hinted NUMA nodes first, isolated CPUs as preferred."""
    iso = avail & idx.isolated
    if iso and request.prefer_isolated:
        base = [(iso, "isolated CPUs"), (avail & ~iso, "non-isolated CPUs"), (avail, "all CPUs")]
    elif iso:
        base = [(avail & ~iso, "non-isolated CPUs"), (avail, "all CPUs (isolated included)")]
    else:
        base = [(avail, "available CPUs")]
    out: list[tuple[int, str]] = []
    if request.numa_hint is not None:
        hinted = 0
        for node in request.numa_hint:
            pos = idx.numa_pos.get(node)
            if pos is not None:
                hinted |= idx.numa[pos].mask
        nodes = str(request.numa_hint)
        out.extend((m & hinted, f"{note} in hinted NUMA nodes {nodes}") for m, note in base)
    out.extend(base)
    seen: set[int] = set()
    unique = []
    for m, note in out:
        if m and m not in seen:
            seen.add(m)
            unique.append((m, note))
    return unique or [(avail, "available CPUs")]


def shared_decision(idx: TopologyIndex, avail: int, request: Request, policy: str) -> Decision:
    """A shared request gets the whole shared pool it is given, isolated CPUs only if asked."""
    pools = NodePools.build(CPUSet.from_bits(avail), isolated=CPUSet.from_bits(idx.isolated))
    pool = pools.shared_pool_for(allow_isolated=option_flag(request.options, "allow-isolated")).bits
    if not pool:
        raise AllocationError(
            "the shared pool is empty (isolated CPUs are only used when allow-isolated is given)",
            reason="no_shared_cpus",
        )
    return Decision(
        cpus=CPUSet.from_bits(pool),
        mems=mems_of(idx, pool),
        withheld=CPUSet.from_bits(0),
        policy=policy,
        explanation=(Step("pool", "shared", "shared requests run on the whole shared pool"),),
    )
