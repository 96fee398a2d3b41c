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
the decision reserves them whole), `near` (CPUs near a device, `corepin.allocation.near`: the
same walk inside them first), `numa_hint` (tried first), `prefer_isolated` (isolated CPUs
first, else they are tried last), `smt` ("whole-cores" insists on whole cores, "spread" takes one
thread per core). Policy option: `full-pcpus-only` (same as smt="whole-cores").

`Selector` is the walk (one per decision, writing each choice down as a `Step`); the scores it
compares candidates by are `corepin.allocation.fit.Fit`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from corepin.allocation.fit import Fit, fewest_to_hold, lowest_bits
from corepin.allocation.levels import L3Part, NumaUnit, TopologyIndex, index_of
from corepin.allocation.near import decide_near
from corepin.allocation.pools import NodePools
from corepin.allocation.types import Decision, Request, Step, check_options, option_flag
from corepin.core.cpuset import CPUSet
from corepin.core.errors import AllocationError, SMTAlignmentError
from corepin.topology.model import Topology

NAME: Final = "topology-aware"
OPTIONS: Final = ("full-pcpus-only", "allow-isolated")


class Selector:
    """One decision's working state: the index, the usable mask, SMT settings, the steps."""

    __slots__ = ("fit", "idx", "mask", "mode", "nested", "steps", "t")

    def __init__(self, idx: TopologyIndex, mask: int, mode: str = "whole") -> None:
        """`mode`: "whole" (whole cores, one partial core at most), "spread" (one thread per
        core first) or "packed" (fill the free siblings of partly used cores first)."""
        self.idx = idx
        self.mask = mask
        self.t = idx.threads_per_core
        self.mode = mode
        self.fit = Fit(idx, mode)
        self.steps: list[Step] = []
        #: True while an alternative span is being tried (no further alternatives inside it)
        self.nested = False

    # -------------------------------------------------------------- machine level
    def select(self, n: int) -> int:
        idx, m = self.idx, self.mask
        units = idx.numa
        frees = [(u.mask & m).bit_count() for u in units]
        fits = [i for i, f in enumerate(frees) if f >= n]
        if fits:
            if len(fits) == 1:
                best = fits[0]
                why = f"the only NUMA node with {n} free CPUs ({frees[best]} free)"
            else:
                scores = {i: (self.fit.node_score(m, units[i], n), frees[i], i) for i in fits}
                best = min(fits, key=scores.__getitem__)
                (l3s, short, _split), _, _ = scores[best]
                why = (
                    f"best fit among {len(fits)} NUMA nodes that hold {n} CPUs: {frees[best]} "
                    f"free, {l3s} L3 instance{'s' if l3s > 1 else ''}"
                    + (
                        f", {short} CPUs short of whole cores"
                        if short
                        else f", {-_split} stray thread{'s' if _split < -1 else ''} to fill"
                        if _split < 0
                        else ", whole cores"
                    )
                )
                skipped = []
                for i in fits:
                    if i == best:
                        continue
                    (o_l3s, o_short, o_split), o_free, _ = scores[i]
                    if o_l3s > l3s:
                        cause = f"needs {o_l3s} L3s"
                    elif o_short > short:
                        cause = "fewer whole cores"
                    elif o_split > _split:
                        cause = (
                            "no stray thread for the odd CPU"
                            if o_split > 0
                            else "fewer stray threads"
                        )
                    elif o_free > frees[best]:
                        whole = o_free == units[i].mask.bit_count()
                        cause = f"{o_free} free" + (", kept whole" if whole else "")
                    else:
                        cause = "higher id"
                    skipped.append(f"node {units[i].id} ({cause})")
                    if len(skipped) == 4:
                        break
                if len(fits) - 1 > len(skipped):
                    skipped.append(f"{len(fits) - 1 - len(skipped)} more")
                why += "; skipped " + ", ".join(skipped)
            small = len(frees) - len(fits)
            if small:
                why += f"; {small} node{'s' if small > 1 else ''} too small"
            node = units[best]
            step = Step("numa", f"node {node.id}", why)

            def in_best(k: int) -> int:
                self.steps.append(step)
                return self.in_numa(node, k)

            return self.best_span(n, m, idx.core_masks, in_best, self.select)
        return self.best_span(n, self.mask, idx.core_masks, self.across_numa, self.select)

    def best_span(
        self,
        n: int,
        scope: int,
        cores: tuple[int, ...],
        first: Callable[[int], int],
        again: Callable[[int], int],
    ) -> int:
        """n CPUs inside `scope` (the machine or one NUMA node): `first(n)` is the walk by
        fewest units. When its pick holds more partial cores than n allows, the walk is tried
        again (`again(n)`) on the whole free cores of `scope` alone, and for an odd n on whole
        cores for n - 1 plus one stray thread; the lowest `span_score` wins, the first walk on
        ties. Alternatives are not nested."""
        outer = self.steps
        self.steps = []
        got = first(n)
        steps = self.steps
        self.steps = outer
        t = self.t
        rem = n % t if t > 1 else 0
        if self.nested or self.mode != "whole" or t <= 1:
            outer.extend(steps)
            return got
        if self.fit.excess_partials(got, n) == 0:
            outer.extend(steps)
            return got
        score = self.fit.span_score(self.mask, got, n)
        saved = self.mask
        whole = self.fit.whole(self.mask) & scope
        best = (score, got, steps)
        self.nested = True
        try:
            self.mask = (saved & ~scope) | whole
            tries: list[tuple[int, int, str]] = []
            if whole.bit_count() >= n:
                self.steps = []
                alt = again(n)
                tries.append((alt, 0, "whole free cores only"))
            if rem and whole.bit_count() >= n - rem:
                self.steps = []
                base = again(n - rem)
                self.mask = saved
                extra = self.pick_remainder(base, rem, scope, cores)
                if extra:
                    tries.append((base | extra, extra, f"whole cores for {n - rem} CPUs"))
            for alt, extra, label in tries:
                self.mask = saved
                alt_score = self.fit.span_score(self.mask, alt, n)
                if alt_score < best[0]:
                    note = (
                        "the stray free threads of partly used cores were left out: whole free "
                        "cores span as few NUMA nodes and L3s with fewer partial cores"
                    )
                    if extra:
                        note += f"; CPU {CPUSet.from_bits(extra)} takes the odd remainder"
                    best = (alt_score, alt, [*self.steps, Step("core", label, note)])
        finally:
            self.mask = saved
            self.steps = outer
            self.nested = False
        outer.extend(best[2])
        return best[1]

    def pick_remainder(self, base: int, rem: int, scope: int, cores: tuple[int, ...]) -> int:
        """rem more CPUs (fewer than the SMT width) from one core of `scope` outside `base`:
        in a NUMA node and an L3 that `base` already uses when possible, from a partly used
        core (a stray thread) before a whole one."""
        idx = self.idx
        numa_of = idx.cpu_unit["numa"]
        l3_of = idx.cpu_unit["l3"]
        m = self.mask & scope & ~base

        def rank(c: int, pos: int) -> tuple[int, int, int, int, int]:
            f = c & m
            low = (c & -c).bit_length() - 1
            return (
                0 if numa_of[low] & base else 1,
                0 if l3_of[low] & base else 1,
                1 if f == c else 0,
                f.bit_count(),
                pos,
            )

        best: tuple[int, int, int, int, int] | None = None
        pick = 0
        near = [u.cores for u in idx.numa if u.mask & base & scope]
        for group in (*near, cores):
            for pos, c in enumerate(group):
                f = c & m
                if f.bit_count() < rem:
                    continue
                r = rank(c, pos)
                if best is None or r < best:
                    best, pick = r, c
            if best is not None and best[0] == 0 and best[2] == 0:
                break
        return lowest_bits(pick & m, rem) if best is not None else 0

    def across_numa(self, n: int) -> int:
        idx = self.idx
        units = idx.numa
        frees = [(u.mask & self.mask).bit_count() for u in units]
        k = fewest_to_hold(frees, n)
        pool = [i for i, f in enumerate(frees) if f > 0]
        where = "the machine"
        # Prefer one socket when it can hold n with as few NUMA nodes as the whole machine.
        by_socket: dict[int, list[int]] = {}
        for i in pool:
            by_socket.setdefault(units[i].socket, []).append(i)
        if len(by_socket) > 1:
            good = [
                (sum(frees[i] for i in members), s)
                for s, members in by_socket.items()
                if fewest_to_hold([frees[i] for i in members], n) == k
            ]
            if good:
                _, sock = min(good)
                pool = by_socket[sock]
                where = f"socket {sock}"
        dist = idx.distance
        chosen: list[int] = []
        need = n
        last = -1
        while need > 0:
            fitting = [i for i in pool if frees[i] >= need and i not in chosen]
            if fitting:
                last = min(
                    fitting,
                    key=lambda i: (
                        self.fit.node_score(self.mask, units[i], need),
                        -self.fit.kinship(i, chosen),
                        frees[i],
                        sum(dist[i][j] for j in chosen),
                        i,
                    ),
                )
                chosen.append(last)
                break
            rest = [i for i in pool if i not in chosen]
            i = min(
                rest,
                key=lambda i: (
                    -frees[i],
                    -self.fit.kinship(i, chosen),
                    sum(dist[i][j] for j in chosen),
                    i,
                ),
            )
            chosen.append(i)
            need -= frees[i]
        picked = ",".join(str(units[i].id) for i in chosen)
        self.steps.append(
            Step(
                "numa",
                f"nodes {picked}",
                f"no single NUMA node holds {n} free CPUs (largest has {max(frees)}): "
                f"the fewest nodes is {k}, taken in {where}, largest first, then the best fit "
                "for the remainder, closest by NUMA distance",
            )
        )
        result = 0
        for i in chosen:
            if i == last:
                result |= self.in_numa(units[i], need)
            else:
                result |= units[i].mask & self.mask
        return result

    # -------------------------------------------------------------- NUMA level
    def in_numa(self, unit: NumaUnit, n: int) -> int:
        m = self.mask
        free = unit.mask & m
        if free.bit_count() == n:
            self.steps.append(Step("l3", "all", f"node {unit.id} has exactly {n} free CPUs"))
            return free
        parts = unit.parts
        frees = [(p.mask & m).bit_count() for p in parts]
        fits = [i for i, f in enumerate(frees) if f >= n]
        if fits:
            if len(parts) == 1:
                return self.in_part(parts[0], n)
            best = min(
                fits,
                key=lambda i: (self.fit.core_fit(m, parts[i].mask, parts[i].cores, n), frees[i], i),
            )
            part = parts[best]
            step = Step(
                "l3",
                part.label,
                f"best fit among {len(fits)} L3 instances of node {unit.id} that hold {n} "
                f"CPUs ({frees[best]} free); emptier ones stay whole",
            )

            def in_best(k: int) -> int:
                self.steps.append(step)
                return self.in_part(part, k)

            return self.best_span(
                n, unit.mask, unit.cores, in_best, lambda k: self.in_numa(unit, k)
            )
        return self.best_span(
            n,
            unit.mask,
            unit.cores,
            lambda k: self.span_parts(unit, k),
            lambda k: self.in_numa(unit, k),
        )

    def span_parts(self, unit: NumaUnit, n: int) -> int:
        """n CPUs over the fewest L3 parts of `unit`: largest first, then the best fit."""
        m = self.mask
        parts = unit.parts
        frees = [(p.mask & m).bit_count() for p in parts]
        chosen: list[int] = []
        need = n
        result = 0
        while need > 0:
            fitting = [i for i, f in enumerate(frees) if f >= need and i not in chosen]
            if fitting:
                i = min(
                    fitting,
                    key=lambda i: (
                        self.fit.core_fit(m, parts[i].mask, parts[i].cores, need),
                        frees[i],
                        i,
                    ),
                )
                chosen.append(i)
                result |= self.in_part(parts[i], need, quiet=True)
                need = 0
            else:
                i = min(
                    (j for j in range(len(parts)) if j not in chosen), key=lambda j: (-frees[j], j)
                )
                chosen.append(i)
                result |= parts[i].mask & m
                need -= frees[i]
        self.steps.append(
            Step(
                "l3",
                ", ".join(parts[i].label for i in chosen),
                f"no single L3 of node {unit.id} holds {n} free CPUs: fewest L3 instances, "
                "largest first, then the best fit for the remainder",
            )
        )
        return result

    # -------------------------------------------------------------- L3 / core level
    def in_part(self, part: L3Part, n: int, quiet: bool = False) -> int:
        m = self.mask
        free = part.mask & m
        if free.bit_count() == n:
            if not quiet:
                self.steps.append(Step("core", "all", f"{part.label} has exactly {n} free CPUs"))
            return free
        cores, where = part.cores, part.label
        if part.packages:
            cores, where = self.in_packages(part, n)
        got, note = self.fit.pick_cores(m, cores, n)
        if not quiet:
            self.steps.append(Step("core", note, f"inside {where}"))
        return got

    def in_packages(self, part: L3Part, n: int) -> tuple[tuple[int, ...], str]:
        """The cores to take n CPUs from in an L3 part over several packages (DynamIQ
        clusters): the best-fitting package that holds n, else the packages largest first."""
        m = self.mask
        packages = part.packages
        frees = [(p.mask & m).bit_count() for p in packages]
        fits = [i for i, f in enumerate(frees) if f >= n]
        if fits:
            best = min(
                fits,
                key=lambda i: (
                    self.fit.core_fit(m, packages[i].mask, packages[i].cores, n),
                    frees[i],
                    i,
                ),
            )
            return packages[best].cores, (
                f"{part.label}, {packages[best].label} (best fit of {len(fits)} packages that "
                f"hold {n} CPUs)"
            )
        order = sorted(range(len(packages)), key=lambda i: (-frees[i], i))
        cores = tuple(c for i in order for c in packages[i].cores)
        return cores, f"{part.label}, the fewest packages, largest first"


def mems_of(idx: TopologyIndex, cpus: int) -> CPUSet:
    return CPUSet(u.id for u in idx.numa if u.mask & cpus and u.id >= 0)


class TopologyAwarePolicy:
    """corepin's default policy (see the module docstring)."""

    name: str = NAME

    def decide(self, topology: Topology, request: Request, available: CPUSet) -> Decision:
        if request.near is not None:
            return decide_near(self, topology, request, available)
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
