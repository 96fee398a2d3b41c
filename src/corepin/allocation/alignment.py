"""How well a set of CPUs fits the machine: the NUMA nodes, L3 caches and partial cores it spans.

One counting for everyone who judges alignment: the simulator's quality metrics
(`corepin.allocation.simulate`) and the rebalancing planner (`corepin.allocation.rebalance`).

- `Alignment(numa, l3, partial_cores)`: what a CPU set spans; smaller is better, compared in
  that order (`better_than`).
- `AlignmentMetrics(topology)`: per-CPU tables of one topology, built once; `alignment(cpus)`
  counts, `minimum(n)` is the best any n CPUs could do on an empty machine (the fewest NUMA
  nodes and L3 instances whose CPUs add up to n; no partial core, or one when n is not a
  multiple of the SMT width), `best_within(bits, n)` a lower bound for n CPUs taken out of a
  given set, `classify(cpus)` the simulator's (NUMA-aligned, LLC-aligned, full-core).
"""

from __future__ import annotations

from collections.abc import Iterable

from corepin.core.cpuset import CPUSet
from corepin.core.record import record
from corepin.topology.model import Topology


@record
class Alignment:
    """What a CPU set spans: NUMA nodes, L3 cache instances, and physical cores of which it holds
    some threads but not all."""

    numa: int
    l3: int
    partial_cores: int

    def better_than(self, other: Alignment) -> bool:
        """Strictly better: fewer NUMA nodes, else as many and fewer L3 caches, else as many of
        both and fewer partial cores."""
        return (self.numa, self.l3, self.partial_cores) < (
            other.numa,
            other.l3,
            other.partial_cores,
        )

    def to_json(self) -> dict[str, int]:
        return {"numa": self.numa, "l3": self.l3, "partial_cores": self.partial_cores}


def fewest_units(unit_sizes: Iterable[int], n: int) -> int:
    """Fewest units (of these sizes) whose CPUs add up to at least n (all of them if never)."""
    total = 0
    used = 0
    for size in sorted(unit_sizes, reverse=True):
        if total >= n:
            break
        total += size
        used += 1
    return used


class AlignmentMetrics:
    """Alignment counting for one topology (its online CPUs).

    The minimum for each size n is computed once (from an empty machine) and kept.
    """

    __slots__ = (
        "_core_mask",
        "_core_of",
        "_l3_masks",
        "_l3_of",
        "_min_cache",
        "_numa_masks",
        "_numa_of",
        "smt",
    )

    def __init__(self, topology: Topology) -> None:
        online = topology.online_cpus
        size = online.last() + 1 if online else 0
        self._numa_of: list[int] = [-1] * size
        self._l3_of: list[int] = [-1] * size
        self._core_of: list[int] = [-1] * size
        self._core_mask: dict[int, int] = {}
        numa_masks: dict[int, int] = {}
        l3_masks: dict[int, int] = {}
        for info in topology.cpus:
            if not info.online:
                continue
            bit = 1 << info.cpu
            if info.numa is not None:
                self._numa_of[info.cpu] = info.numa
                numa_masks[info.numa] = numa_masks.get(info.numa, 0) | bit
            if info.l3 is not None:
                self._l3_of[info.cpu] = info.l3
                l3_masks[info.l3] = l3_masks.get(info.l3, 0) | bit
            core = info.core if info.core is not None else info.cpu
            self._core_of[info.cpu] = core
            self._core_mask[core] = self._core_mask.get(core, 0) | bit
        self._numa_masks = tuple(numa_masks.values())
        self._l3_masks = tuple(l3_masks.values())
        self._min_cache: dict[int, Alignment] = {}
        self.smt = max((m.bit_count() for m in self._core_mask.values()), default=1)

    def partial_allowed(self, n: int) -> int:
        """Partial cores n CPUs cannot avoid: one when n is not a multiple of the SMT width."""
        return 1 if self.smt > 1 and n % self.smt else 0

    def minimum(self, n: int) -> Alignment:
        """The best alignment n CPUs could have on an empty machine."""
        got = self._min_cache.get(n)
        if got is None:
            got = Alignment(
                fewest_units((m.bit_count() for m in self._numa_masks), n),
                fewest_units((m.bit_count() for m in self._l3_masks), n),
                self.partial_allowed(n),
            )
            self._min_cache[n] = got
        return got

    def fewest(self, n: int) -> tuple[int, int]:
        """(fewest NUMA nodes, fewest L3 instances) that n CPUs could span on an empty machine."""
        best = self.minimum(n)
        return best.numa, best.l3

    def best_within(self, bits: int, n: int) -> Alignment:
        """A lower bound on the alignment of any n CPUs out of the CPUs of bitmask `bits`: no n
        of them span fewer NUMA nodes, L3 caches or partial cores than this."""
        return Alignment(
            fewest_units(((m & bits).bit_count() for m in self._numa_masks), n),
            fewest_units(((m & bits).bit_count() for m in self._l3_masks), n),
            self.partial_allowed(n),
        )

    def alignment(self, cpus: CPUSet) -> Alignment:
        """What `cpus` spans (CPUs this topology does not know count for nothing)."""
        numa: set[int] = set()
        l3: set[int] = set()
        cores: set[int] = set()
        numa_of, l3_of, core_of = self._numa_of, self._l3_of, self._core_of
        known = len(numa_of)
        for cpu in cpus:
            if cpu >= known:
                continue
            if numa_of[cpu] >= 0:
                numa.add(numa_of[cpu])
            if l3_of[cpu] >= 0:
                l3.add(l3_of[cpu])
            if core_of[cpu] >= 0:
                cores.add(core_of[cpu])
        bits = cpus.bits
        core_mask = self._core_mask
        partial = 0
        for core in cores:
            mask = core_mask[core]
            if mask & bits != mask:
                partial += 1
        return Alignment(len(numa), len(l3), partial)

    def classify(self, cpus: CPUSet) -> tuple[bool, bool, bool]:
        """(numa_aligned, llc_aligned, full_core) for an allocation of len(cpus) CPUs."""
        got = self.alignment(cpus)
        best = self.minimum(len(cpus))
        return (
            got.numa <= best.numa,
            got.l3 <= best.l3,
            got.partial_cores <= best.partial_cores,
        )


_METRICS: dict[int, tuple[Topology, AlignmentMetrics]] = {}
_METRICS_KEPT = 8


def metrics_for(topology: Topology) -> AlignmentMetrics:
    """The metrics of `topology`, built once for the last few topologies asked about (kept by
    identity: a topology is an immutable value)."""
    got = _METRICS.get(id(topology))
    if got is not None and got[0] is topology:
        return got[1]
    metrics = AlignmentMetrics(topology)
    if len(_METRICS) >= _METRICS_KEPT:
        _METRICS.pop(next(iter(_METRICS)))
    _METRICS[id(topology)] = (topology, metrics)
    return metrics


def alignment_of(topology: Topology, cpus: CPUSet) -> Alignment:
    """What `cpus` spans on `topology`."""
    return metrics_for(topology).alignment(cpus)
