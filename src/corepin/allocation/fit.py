"""How well free CPUs take n CPUs: the scores the topology-aware walk compares.

`Fit` answers, for one decision (an index, an SMT mode), questions about a set of free CPUs
given as a bitmask: how many CPUs short of whole cores a unit is (`core_fit`), what taking n
CPUs in a NUMA node costs (`node_score`), how closely NUMA nodes are tied (`kinship`), what a
finished pick costs (`span_score`, partial cores beyond the one an odd n may hold), and which
CPUs of a list of cores to take (`pick_cores`). It holds no free set of its own: the walk
(`corepin.allocation.topology_aware.Selector`) passes the one it is working on.

Modes: "whole" (whole cores, one partial core at most), "spread" (one thread per core first)
or "packed" (fill the free siblings of partly used cores first).
"""

from __future__ import annotations

from corepin.allocation.levels import NumaUnit, TopologyIndex


def lowest_bits(mask: int, k: int) -> int:
    """The k lowest set bits of mask."""
    out = 0
    while k > 0 and mask:
        low = mask & -mask
        out |= low
        mask ^= low
        k -= 1
    return out


def fewest_to_hold(frees: list[int], n: int) -> int:
    """How many of these units (largest first) are needed to hold n CPUs (a huge number if they
    cannot)."""
    total = 0
    for k, f in enumerate(sorted(frees, reverse=True), 1):
        total += f
        if total >= n:
            return k
    return 1 << 30


class Fit:
    """The scores of one decision's walk (see the module docstring)."""

    __slots__ = ("idx", "mode", "t", "whole_for", "whole_mask")

    def __init__(self, idx: TopologyIndex, mode: str) -> None:
        self.idx = idx
        self.mode = mode
        self.t = idx.threads_per_core
        self.whole_for = -1
        self.whole_mask = 0

    # -------------------------------------------------------------- whole cores
    def whole(self, mask: int) -> int:
        """The CPUs of the cores whose threads are all in `mask` (cached for the last mask)."""
        if self.whole_for != mask:
            self.whole_for = mask
            self.whole_mask = self.idx.whole_free(mask)
        return self.whole_mask

    def core_fit(self, mask: int, umask: int, cores: tuple[int, ...], n: int) -> tuple[int, int]:
        """How well the free CPUs (`mask`) of `cores` (all inside `umask`) take n CPUs as whole
        cores: (CPUs of n minus its odd remainder that whole free cores cannot supply, 1 when
        the odd remainder would have to split a whole free core because no partly used core has
        that many free threads).
        (0, 0) is perfect: whole cores for the even part and a stray thread for the rest."""
        t = self.t
        if t <= 1 or self.mode != "whole":
            return 0, 0
        rem = n % t
        want = n - rem
        if self.idx.pairs is not None:
            wm = self.whole(mask) & umask
            have = wm.bit_count()
            short = want - have if have < want else 0
            return short, 0 if rem == 0 or mask & umask & ~wm else 1
        m = mask
        have = 0
        stray = rem == 0
        for c in cores:
            f = c & m
            if f == c:
                if have < want:
                    have += c.bit_count()
                    if have >= want and stray:
                        return 0, 0
            elif f and not stray and f.bit_count() >= rem:
                stray = True
                if have >= want:
                    return 0, 0
        return (want - have if have < want else 0), (0 if stray else 1)

    def node_score(self, mask: int, unit: NumaUnit, n: int) -> tuple[int, int, int]:
        """(L3 instances needed, whole-core shortfall, odd remainder splits a whole core) for n
        free CPUs (`mask`) in `unit`; the core figures are those of the best single L3 when one
        can hold n."""
        m = mask
        if n < self.t and self.mode == "whole" and self.idx.pairs is not None:
            # Any L3 with a free CPU holds n, and takes no whole core when the node has a stray
            # thread: the node with the most stray threads first (they keep its whole-core
            # capacity below its free count), else split a core of the best fit.
            strays = (m & unit.mask & ~self.whole(m)).bit_count()
            return 1, 0, -strays if strays else 1
        if len(unit.parts) == 1:
            return (1, *self.core_fit(m, unit.mask, unit.cores, n))
        frees = [(p.mask & m).bit_count() for p in unit.parts]
        fitting = [p for p, f in zip(unit.parts, frees, strict=True) if f >= n]
        if fitting:
            t = self.t
            if t == 2 and self.mode == "whole" and self.idx.pairs is not None:
                # core_fit inlined (hot: every fitting L3 of every fitting node)
                wm = self.whole(m)
                want = n & ~1
                odd = n & 1
                best = (1 << 30, 1)
                for p in fitting:
                    pm = p.mask
                    have = (pm & wm).bit_count()
                    fit = (
                        want - have if have < want else 0,
                        1 if odd and not m & pm & ~wm else 0,
                    )
                    if fit < best:
                        best = fit
                        if fit == (0, 0):
                            break
                return 1, best[0], best[1]
            return (1, *min(self.core_fit(m, p.mask, p.cores, n) for p in fitting))
        k = fewest_to_hold(frees, n)
        short, split = self.core_fit(m, unit.mask, unit.cores, n)
        if self.t > 1 and self.mode == "whole":
            # Whole cores must also fit in k L3s, else the span holds partial cores.
            wm = self.whole(m)
            wfrees = [(p.mask & wm).bit_count() for p in unit.parts]
            kw = fewest_to_hold(wfrees, n - n % self.t)
            if kw > k and not short:
                short = 1
        return k, short, split

    # -------------------------------------------------------------- NUMA ties
    def kinship(self, i: int, chosen: list[int]) -> int:
        """How closely NUMA node (position) i is tied to the chosen ones: 2 per shared L3,
        1 per shared die."""
        units = self.idx.numa
        me = units[i]
        score = 0
        for j in chosen:
            other = units[j]
            if me.l3_reach & other.mask:
                score += 2
            elif me.die == other.die:
                score += 1
        return score

    # -------------------------------------------------------------- finished picks
    def span_score(self, mask: int, cpus: int, n: int) -> tuple[int, int, int, int]:
        """The cost of `cpus` (n CPUs taken from `mask`), lower is better: (NUMA nodes + pc,
        L3 instances + pc, pc, change in the number of partly free cores), where pc counts the
        partial cores beyond the one an odd n may hold."""
        idx = self.idx
        numa = sum(1 for u in idx.numa if u.mask & cpus)
        l3 = sum(1 for u in idx.units["l3"] if u & cpus)
        table = idx.cpu_unit["core"]
        m = mask
        partial = 0
        strays = 0
        rest = cpus
        while rest:
            c = table[(rest & -rest).bit_length() - 1]
            rest &= ~c
            if c & cpus != c:
                partial += 1
            before = c & m
            after = before & ~cpus
            strays += (0 < after != c) - (0 < before != c)
        pe = self._beyond_allowed(partial, n)
        # One NUMA node (one L3) stays best whenever it holds n. Over a span of several, a
        # partial core weighs as much as one more unit: whole cores over one more node or L3
        # beat sharing cores with strangers to save it.
        return (
            numa if numa == 1 else numa + pe,
            l3 if l3 == 1 else l3 + pe,
            pe,
            strays,
        )

    def excess_partials(self, cpus: int, n: int) -> int:
        """Partial cores in `cpus` beyond the one an odd n may hold."""
        table = self.idx.cpu_unit["core"]
        partial = 0
        rest = cpus
        while rest:
            c = table[(rest & -rest).bit_length() - 1]
            rest &= ~c
            if c & cpus != c:
                partial += 1
        return self._beyond_allowed(partial, n)

    def _beyond_allowed(self, partial: int, n: int) -> int:
        """How many of `partial` partly taken cores an allocation of n CPUs has beyond the one
        it may hold when n is not a multiple of the threads per core (none when it is)."""
        allowed = 1 if self.t > 1 and n % self.t else 0
        return partial - allowed if partial > allowed else 0

    # -------------------------------------------------------------- inside a list of cores
    def pick_cores(self, mask: int, cores: tuple[int, ...], n: int) -> tuple[int, str]:
        """n of the free CPUs (`mask`) of `cores`, as the mode says, and a note saying how."""
        m = mask
        whole = [c for c in cores if c & m == c]
        partial = [c & m for c in cores if c & m and c & m != c]
        if self.mode == "packed":
            out = 0
            need = n
            for c in partial + whole:
                if need == 0:
                    break
                got = lowest_bits(c & m, need)
                out |= got
                need -= got.bit_count()
            return out, f"{n} CPUs packed onto the fewest cores, partly used cores first"
        if self.mode == "spread":
            out = 0
            need = n
            for group in (whole, partial):
                for c in group:
                    if need == 0:
                        break
                    out |= c & -c
                    need -= 1
            rest = m & ~out
            for c in cores:
                if need == 0:
                    break
                extra = lowest_bits(c & rest, need)
                out |= extra
                need -= extra.bit_count()
            return out, f"{n} CPUs, one thread per core first"
        t = self.t
        rem = n % t if t > 1 else 0
        out = 0
        need = n
        used_whole = 0
        for c in whole:
            size = c.bit_count()
            if need - rem < size:
                break
            out |= c
            need -= size
            used_whole += 1
        leftovers = partial + whole[used_whole:]
        partial_used = 0
        while need > 0:
            fitting = [c for c in leftovers if c.bit_count() >= need]
            if fitting:
                best = min(fitting, key=lambda c: (c.bit_count(), leftovers.index(c)))
                out |= lowest_bits(best, need)
                need = 0
                partial_used += 1
                break
            big = max(leftovers, key=lambda c: (c.bit_count(), -leftovers.index(c)))
            leftovers.remove(big)
            out |= big
            need -= big.bit_count()
            partial_used += 1
        note = f"{used_whole} whole core{'' if used_whole == 1 else 's'}"
        if partial_used:
            note += f" + CPUs of {partial_used} more core{'s' if partial_used > 1 else ''}"
        return out, note
