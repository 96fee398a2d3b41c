"""Policy `kubelet-static`: the kubelet static CPU manager's CPU choice, reproduced exactly.

The kubelet (pkg/kubelet/cm/cpumanager, Apache-2.0) is the reference; this module is an
independent re-implementation of its behaviour, written so
that the same inputs give the same CPUs, the same errors and the same error messages. The
upstream function names are kept in the docstrings so both can be read side by side:

* `take_by_topology_numa_packed`      = takeByTopologyNUMAPacked (cpuAccumulator, the
  numaFirst / socketsFirst level order, uncore-cache alignment, packed or spread CPU order);
* `take_by_topology_numa_distributed` = takeByTopologyNUMADistributed
  (`distribute-cpus-across-numa`);
* `static_allocate`                   = staticPolicy.Allocate + allocateCPUs (full-pcpus-only
  checks, NUMA affinity hint, align-by-socket, reusable CPUs);
* `select_reserved`                   = the reserved-CPU choice of NewStaticPolicy.

Model mapping. The kubelet keys a core by its CoreID alone and reads the header counts
NumCPUs / NumCores / NumSockets / NumNUMANodes / NumUncoreCache; here they are computed from the
online CPUs of the corepin Topology (`core`, `socket`, `numa`, `l3`; a missing NUMA node or L3
id counts as 0, as Go's zero value does). Offline CPUs are left out of every table, header count
and "full topology" unit, as they are absent from the kubelet's cadvisor view.

One deliberate departure: the kubelet calls a core or socket free when its count of available
CPUs equals the machine-wide average (CPUsPerCore = NumCPUs / NumCores, CPUsPerSocket) and then
takes the unit as defined in the full topology. On non-uniform machines (hybrid P/E cores, a
core or socket with offline CPUs, uneven sockets) that hands out CPUs that are not available.
Here every unit (core, socket, NUMA node, uncore cache) is free exactly when ALL its online
CPUs are available; on uniform topologies, the only ones the kubelet's tests use, the two tests
agree, so results are unchanged there. A final guard refuses (AllocationError
"internal_inconsistency") any result that is not a subset of the allowed CPUs.

Quirks that cannot put a CPU outside the available set are kept on purpose, e.g. the slice
aliasing of iterateCombinations (a combination kept as "best" can be overwritten by the next one
sharing its backing array when it has 4 or more elements; `_GoSlice` emulates Go's append growth
to reproduce that) and the header-count arithmetic (CPUsPerCore for full-pcpus-only and partial
uncore caches, the NUMA distribution group counts).

Everything is pure: masks are Python ints (bit i = CPU i) and the per-topology tables are built
once and cached.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Final

from corepin.allocation.near import decide_near
from corepin.allocation.pools import NodePools
from corepin.allocation.types import Decision, Request, Step
from corepin.core.cpuset import EMPTY, CPUSet
from corepin.core.errors import AllocationError, RequestError, SMTAlignmentError
from corepin.topology.model import Topology

__all__ = [
    "KUBELET_OPTIONS",
    "KubeletOptions",
    "KubeletStaticPolicy",
    "parse_options",
    "select_reserved",
    "static_allocate",
    "take_by_topology",
    "take_by_topology_numa_distributed",
    "take_by_topology_numa_packed",
]

FULL_PCPUS_ONLY: Final = "full-pcpus-only"
DISTRIBUTE_CPUS_ACROSS_NUMA: Final = "distribute-cpus-across-numa"
ALIGN_BY_SOCKET: Final = "align-by-socket"
DISTRIBUTE_CPUS_ACROSS_CORES: Final = "distribute-cpus-across-cores"
STRICT_CPU_RESERVATION: Final = "strict-cpu-reservation"
PREFER_ALIGN_BY_UNCORECACHE: Final = "prefer-align-cpus-by-uncorecache"

#: The kubelet's static policy options (cpuManagerPolicyOptions keys), all boolean.
KUBELET_OPTIONS: Final = (
    FULL_PCPUS_ONLY,
    DISTRIBUTE_CPUS_ACROSS_NUMA,
    ALIGN_BY_SOCKET,
    DISTRIBUTE_CPUS_ACROSS_CORES,
    STRICT_CPU_RESERVATION,
    PREFER_ALIGN_BY_UNCORECACHE,
)

#: corepin extensions accepted by KubeletStaticPolicy.decide (the kubelet's --reserved-cpus and
#: the reserved CPU count it derives from kube/system-reserved).
RESERVED_CPUS: Final = "reserved-cpus"
NUM_RESERVED_CPUS: Final = "num-reserved-cpus"

_GO_TRUE: Final = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_GO_FALSE: Final = frozenset({"0", "f", "F", "FALSE", "false", "False"})


# ================================================================== options
@dataclass(frozen=True, slots=True)
class KubeletOptions:
    """Parsed StaticPolicyOptions."""

    full_pcpus_only: bool = False
    distribute_cpus_across_numa: bool = False
    align_by_socket: bool = False
    distribute_cpus_across_cores: bool = False
    strict_cpu_reservation: bool = False
    prefer_align_by_uncorecache: bool = False


_FIELD: Final = {
    FULL_PCPUS_ONLY: "full_pcpus_only",
    DISTRIBUTE_CPUS_ACROSS_NUMA: "distribute_cpus_across_numa",
    ALIGN_BY_SOCKET: "align_by_socket",
    DISTRIBUTE_CPUS_ACROSS_CORES: "distribute_cpus_across_cores",
    STRICT_CPU_RESERVATION: "strict_cpu_reservation",
    PREFER_ALIGN_BY_UNCORECACHE: "prefer_align_by_uncorecache",
}

_INCOMPATIBLE: Final = (
    (FULL_PCPUS_ONLY, DISTRIBUTE_CPUS_ACROSS_CORES),
    (DISTRIBUTE_CPUS_ACROSS_NUMA, DISTRIBUTE_CPUS_ACROSS_CORES),
    (PREFER_ALIGN_BY_UNCORECACHE, DISTRIBUTE_CPUS_ACROSS_CORES),
    (PREFER_ALIGN_BY_UNCORECACHE, DISTRIBUTE_CPUS_ACROSS_NUMA),
)


def _parse_bool(name: str, value: object) -> bool:
    if isinstance(value, bool):
        return value
    if not isinstance(value, str):
        raise RequestError(
            f"bad value for option {_go_quote(name)}: expected a boolean, got {value!r}",
            reason="bad_option_value",
        )
    if value == "" or value in _GO_TRUE:  # a bare option name means true
        return True
    if value in _GO_FALSE:
        return False
    raise RequestError(
        f"bad value for option {_go_quote(name)}: strconv.ParseBool: parsing "
        f"{_go_quote(value)}: invalid syntax",
        reason="bad_option_value",
    )


def _go_quote(text: str) -> str:
    """Go's %q for plain strings."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def parse_options(
    options: Mapping[str, object] | Iterable[str] | KubeletOptions | None = None,
) -> KubeletOptions:
    """NewStaticPolicyOptions: a mapping name -> "true"/"false" (Go strconv.ParseBool spellings,
    "" = bare name = true, or a bool), or an iterable of "name" / "name=value" strings.

    Unknown names raise RequestError with the kubelet's message; so do the option pairs the
    kubelet refuses to combine.
    """
    if isinstance(options, KubeletOptions):
        return options
    pairs: list[tuple[str, object]] = []
    if options is None:
        pass
    elif isinstance(options, Mapping):
        pairs = [(str(k), v) for k, v in options.items()]
    else:
        for item in options:
            if not isinstance(item, str):
                raise RequestError(f"option {item!r} is not a string", reason="bad_option")
            name, _, text = item.partition("=")
            pairs.append((name.strip(), text.strip()))
    values: dict[str, bool] = {}
    for name, value in sorted(pairs, key=lambda p: p[0]):
        if name not in _FIELD:
            raise RequestError(
                f"unknown CPU Manager Policy option: {_go_quote(name)}", reason="unknown_option"
            )
        values[_FIELD[name]] = _parse_bool(name, value)
    opts = KubeletOptions(**values)
    for first, second in _INCOMPATIBLE:
        if getattr(opts, _FIELD[first]) and getattr(opts, _FIELD[second]):
            raise RequestError(
                f"static policy options {first} and {second} can not be used at the same time",
                reason="incompatible_options",
            )
    return opts


def validate_options_for_topology(topo: Topology, opts: KubeletOptions) -> None:
    """ValidateStaticPolicyOptions (the hardware part)."""
    if opts.align_by_socket:
        tables = _tables(topo)
        if tables.num_sockets > tables.num_numa:
            raise RequestError(
                "Align by socket is not compatible with hardware where number of sockets are "
                "more than number of NUMA",
                reason="incompatible_options",
            )


# ================================================================== topology tables
def _popcount(mask: int) -> int:
    return mask.bit_count()


def _bits(mask: int) -> list[int]:
    out = []
    while mask:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return out


class _Tables:
    """Per-topology masks and id lists, built once (the kubelet's CPUTopology + CPUDetails)."""

    __slots__ = (
        "all_mask",
        "core",
        "cores_in_l3",
        "cores_in_numa",
        "cores_in_socket",
        "cpu_core",
        "cpu_numa",
        "cpus_per_core",
        "cpus_per_socket",
        "cpus_per_uncore",
        "l3",
        "l3_numa",
        "l3s_in_numa",
        "num_cores",
        "num_cpus",
        "num_numa",
        "num_sockets",
        "num_uncore",
        "numa",
        "numa_first",
        "numa_socket",
        "numas_in_socket",
        "smallest_core",
        "socket",
        "sockets_in_numa",
    )

    def __init__(self, topo: Topology) -> None:
        socket: dict[int, int] = {}
        numa: dict[int, int] = {}
        core: dict[int, int] = {}
        l3: dict[int, int] = {}
        numa_socket: dict[tuple[int, int], int] = {}
        l3_numa: dict[tuple[int, int], int] = {}
        core_l3: dict[int, set[int]] = {}
        cpu_core: dict[int, int] = {}
        cpu_numa: dict[int, int] = {}
        all_mask = 0
        for info in topo.cpus:
            if not info.online:
                continue
            bit = 1 << info.cpu
            all_mask |= bit
            s = info.socket or 0
            n = info.numa or 0
            c = info.core if info.core is not None else info.cpu
            u = info.l3 or 0
            socket[s] = socket.get(s, 0) | bit
            numa[n] = numa.get(n, 0) | bit
            core[c] = core.get(c, 0) | bit
            l3[u] = l3.get(u, 0) | bit
            numa_socket[(n, s)] = numa_socket.get((n, s), 0) | bit
            l3_numa[(u, n)] = l3_numa.get((u, n), 0) | bit
            core_l3.setdefault(u, set()).add(c)
            cpu_core[info.cpu] = c
            cpu_numa[info.cpu] = n
        self.all_mask = all_mask
        self.socket = socket
        self.numa = numa
        self.core = core
        self.l3 = l3
        self.numa_socket = numa_socket
        self.l3_numa = l3_numa
        self.cpu_core = cpu_core
        self.cpu_numa = cpu_numa
        self.num_cpus = _popcount(all_mask)
        self.num_cores = len(core)
        self.num_sockets = len(socket)
        self.num_numa = len(numa)
        self.num_uncore = len(l3)
        # CPUsPerCore() etc.: integer division of the header counts, as upstream.
        self.cpus_per_core = self.num_cpus // self.num_cores if self.num_cores else 0
        self.cpus_per_socket = self.num_cpus // self.num_sockets if self.num_sockets else 0
        self.cpus_per_uncore = self.num_cpus // self.num_uncore if self.num_uncore else 0
        self.numa_first = self.num_sockets >= self.num_numa
        self.smallest_core = min((m.bit_count() for m in core.values()), default=1)
        self.sockets_in_numa = {
            n: sorted(s for (nn, s) in numa_socket if nn == n) for n in sorted(numa)
        }
        self.numas_in_socket = {
            s: sorted(n for (n, ss) in numa_socket if ss == s) for s in sorted(socket)
        }
        self.l3s_in_numa = {n: sorted(u for (u, nn) in l3_numa if nn == n) for n in sorted(numa)}
        # Cores of a socket / NUMA node, and (CoresNeededInUncoreCache) of an uncore cache,
        # ascending. A core whose CPUs straddle units is listed under each (as CoreID keys do).
        cis: dict[int, set[int]] = {}
        cin: dict[int, set[int]] = {}
        for info in topo.cpus:
            if info.online:
                c = cpu_core[info.cpu]
                cis.setdefault(info.socket or 0, set()).add(c)
                cin.setdefault(info.numa or 0, set()).add(c)
        self.cores_in_socket = {s: sorted(v) for s, v in cis.items()}
        self.cores_in_numa = {n: sorted(v) for n, v in cin.items()}
        self.cores_in_l3 = {u: sorted(v) for u, v in core_l3.items()}


_CACHE: dict[int, tuple[Topology, _Tables]] = {}
_CACHE_SIZE: Final = 32


def _tables(topo: Topology) -> _Tables:
    hit = _CACHE.get(id(topo))
    if hit is not None and hit[0] is topo:
        return hit[1]
    tables = _Tables(topo)
    if len(_CACHE) >= _CACHE_SIZE:
        _CACHE.pop(next(iter(_CACHE)))
    _CACHE[id(topo)] = (topo, tables)
    return tables


# ================================================================== errors
def _not_enough(n: int, available: int) -> AllocationError:
    return AllocationError(
        f"not enough cpus available to satisfy request: requested={n}, available={available}",
        reason="not_enough_cpus",
    )


def _failed() -> AllocationError:
    return AllocationError("failed to allocate cpus", reason="allocation_failed")


def _guard(result: int, allowed: int) -> int:
    """The invariant every choice must keep: never a CPU outside `allowed`."""
    extra = result & ~allowed
    if extra:
        raise AllocationError(
            f"kubelet-static internal inconsistency: chose CPUs {CPUSet.from_bits(extra)} "
            f"outside the available CPUs {CPUSet.from_bits(allowed)}",
            reason="internal_inconsistency",
        )
    return result


# ================================================================== cpuAccumulator
Trace = list[tuple[str, int]]


class _Accumulator:
    """cpuAccumulator: `avail` is `details` (available CPUs not yet taken) as a mask."""

    __slots__ = ("avail", "need", "result", "spread", "t", "trace")

    def __init__(
        self, t: _Tables, available: int, n: int, spread: bool, trace: Trace | None
    ) -> None:
        self.t = t
        self.avail = available & t.all_mask
        self.need = n
        self.result = 0
        self.spread = spread
        self.trace = trace

    # -- state
    def take(self, mask: int, stage: str) -> None:
        self.result |= mask
        self.avail &= ~self.result
        self.need -= _popcount(mask)
        if self.trace is not None:
            self.trace.append((stage, mask))

    def satisfied(self) -> bool:
        return self.need < 1

    def failed(self) -> bool:
        return self.need > _popcount(self.avail)

    # -- sorting: ascending by available CPUs in the unit, then by id
    def _sorted(self, ids: Iterable[int], masks: Mapping[int, int]) -> list[int]:
        avail = self.avail
        keyed = [((masks[i] & avail).bit_count(), i) for i in ids]
        keyed.sort()
        return [i for _, i in keyed]

    def sort_numas(self) -> list[int]:
        t, avail = self.t, self.avail
        if t.numa_first:
            return self._sorted((n for n, m in t.numa.items() if m & avail), t.numa)
        out: list[int] = []
        for s in self.sort_sockets():
            ids = (n for n in t.numas_in_socket[s] if t.numa_socket[(n, s)] & avail)
            out.extend(self._sorted(ids, t.numa))
        return out

    def sort_sockets(self) -> list[int]:
        t, avail = self.t, self.avail
        if not t.numa_first:
            return self._sorted((s for s, m in t.socket.items() if m & avail), t.socket)
        out: list[int] = []
        for n in self.sort_numas():
            ids = (s for s in t.sockets_in_numa[n] if t.numa_socket[(n, s)] & avail)
            out.extend(self._sorted(ids, t.socket))
        return out

    def _core_units(self) -> list[tuple[int, list[int]]]:
        """(unit mask, its cores ascending) in the order sortAvailableCores walks the units:
        sockets (numaFirst: CoresInSockets) or NUMA nodes (socketsFirst: CoresInNUMANodes)."""
        t = self.t
        if t.numa_first:
            return [(t.socket[s], t.cores_in_socket[s]) for s in self.sort_sockets()]
        return [(t.numa[n], t.cores_in_numa[n]) for n in self.sort_numas()]

    def iter_cores(self) -> Iterator[int]:
        """sortAvailableCores, lazily: every unit's cores are sorted against the available set
        as it is now (later takes do not change the order, as upstream sorts once)."""
        avail, core = self.avail, self.t.core
        for umask, cores in self._core_units():
            m = umask & avail
            yield from self._sorted((c for c in cores if core[c] & m), core)

    def sort_cores(self) -> list[int]:
        return list(self.iter_cores())

    def sort_uncores(self) -> list[int]:
        t, avail = self.t, self.avail
        out: list[int] = []
        for n in self.sort_numas():
            ids = (u for u in t.l3s_in_numa[n] if t.l3_numa[(u, n)] & avail)
            out.extend(self._sorted(ids, t.l3))
        return out

    def iter_cpus(self) -> Iterator[int]:
        """sortAvailableCPUsPacked (cores in sorted order) or ...Spread (sockets in order),
        lazily and against the available set as it is now."""
        avail = self.avail
        if self.spread:
            for s in self.sort_sockets():
                yield from _bits(self.t.socket[s] & avail)
        else:
            core = self.t.core
            for c in self.iter_cores():
                yield from _bits(core[c] & avail)

    def cpu_order(self) -> list[int]:
        return list(self.iter_cpus())

    # -- free units: every online CPU of the unit is still available
    def is_free(self, unit_mask: int) -> bool:
        """isSocketFree / isNUMANodeFree / isCoreFree / isUncoreCacheFree. Upstream compares the
        unit's available count with the machine-wide average size; requiring all its (online)
        CPUs is the same on uniform machines and never frees a unit with a missing CPU."""
        return unit_mask & ~self.avail == 0

    def _free(self, ids: Iterable[int], masks: Mapping[int, int]) -> list[int]:
        return [i for i in ids if self.is_free(masks[i])]

    def free_numas(self) -> list[int]:
        return self._free(self.sort_numas(), self.t.numa)

    def free_sockets(self) -> list[int]:
        return self._free(self.sort_sockets(), self.t.socket)

    def free_cores(self) -> list[int]:
        return self._free(self.iter_cores(), self.t.core)

    # -- taking whole units
    def _take_whole(self, free: list[int], masks: Mapping[int, int], stage: str) -> None:
        """takeFullFirstLevel / takeFullSecondLevel / the whole-uncore loop: every unit of
        `free` (already free and sorted) that fits in what is still needed."""
        for i in free:
            if self.need >= _popcount(masks[i]):
                self.take(masks[i], stage)

    def take_full_numas(self) -> None:
        self._take_whole(self.free_numas(), self.t.numa, "numa")

    def take_full_sockets(self) -> None:
        self._take_whole(self.free_sockets(), self.t.socket, "socket")

    def take_full_cores(self) -> None:
        """Free cores in sortAvailableCores order; within one unit every free core of a given
        size has the same count of available CPUs, so they come by ascending id (cores of
        different sizes, e.g. hybrid P/E cores, are sorted by size first as upstream sorts by
        available count). Stops once no core can fit."""
        t = self.t
        core, smallest = t.core, t.smallest_core
        for umask, cores in self._core_units():
            avail = self.avail
            m = umask & avail
            if not m:
                continue
            free = [c for c in cores if core[c] & ~avail == 0 and core[c] & m]
            for c in self._sorted(free, core):
                if self.need < smallest:
                    return
                cm = core[c]
                if self.need >= cm.bit_count():
                    self.take(cm, "core")

    def take_full_uncores(self) -> None:
        l3 = self.t.l3
        if not any(self.is_free(m) for m in l3.values()):
            return  # no uncore cache is free: sorting them would change nothing
        self._take_whole(self._free(self.sort_uncores(), l3), l3, "l3")

    def take_partial_uncore(self, u: int) -> None:
        t, avail = self.t, self.avail
        per_core = t.cpus_per_core
        cores_needed = (self.need + per_core - 1) // per_core
        chosen = [c for c in t.cores_in_l3.get(u, ()) if t.core[c] & t.l3[u] & avail]
        mask = 0
        for c in chosen[:cores_needed]:
            mask |= t.core[c] & avail
        if self.need % 2 != 0 and per_core > 1:
            count = _popcount(mask)
            if count > self.need:
                mask &= ~(1 << (mask.bit_length() - 1))  # drop the highest-numbered CPU
        if self.need == _popcount(mask):
            self.take(mask, "l3-partial")

    def take_uncore_cache(self) -> None:
        per_uncore = self.t.cpus_per_uncore
        for u in self.sort_uncores():
            if self.need >= per_uncore:
                self.take_full_uncores()
            if self.satisfied():
                return
            self.take_partial_uncore(u)
            if self.satisfied():
                return

    def take_remaining_cpus(self) -> None:
        for cpu in self.iter_cpus():
            self.take(1 << cpu, "cpu")
            if self.satisfied():
                return


def _start(t: _Tables, available: int, n: int, spread: bool, trace: Trace | None) -> _Accumulator:
    """A new accumulator for `n` CPUs of `available`; the kubelet's "not enough cpus" error
    when a request that is not already satisfied can never be."""
    acc = _Accumulator(t, available, n, spread, trace)
    if not acc.satisfied() and acc.failed():
        raise _not_enough(n, _popcount(acc.avail))
    return acc


def _packed(
    t: _Tables,
    available: int,
    n: int,
    spread: bool,
    uncore: bool,
    trace: Trace | None,
) -> int:
    """takeByTopologyNUMAPacked on masks, with the subset guard."""
    return _guard(_packed_steps(t, available, n, spread, uncore, trace), available)


def _packed_steps(
    t: _Tables,
    available: int,
    n: int,
    spread: bool,
    uncore: bool,
    trace: Trace | None,
) -> int:
    acc = _start(t, available, n, spread, trace)
    if acc.satisfied():
        return 0
    if t.numa_first:
        acc.take_full_numas()
        if acc.satisfied():
            return acc.result
        acc.take_full_sockets()
    else:
        acc.take_full_sockets()
        if acc.satisfied():
            return acc.result
        acc.take_full_numas()
    if acc.satisfied():
        return acc.result
    if uncore:
        acc.take_uncore_cache()
        if acc.satisfied():
            return acc.result
    if not spread:
        acc.take_full_cores()
        if acc.satisfied():
            return acc.result
    acc.take_remaining_cpus()
    if acc.satisfied():
        return acc.result
    raise _failed()


def take_by_topology_numa_packed(
    topo: Topology,
    available: CPUSet,
    n: int,
    *,
    spread: bool = False,
    prefer_uncore: bool = False,
) -> CPUSet:
    """takeByTopologyNUMAPacked: `n` CPUs of `available`.

    Whole NUMA nodes / sockets first (level order by the header counts), then whole uncore
    caches and a best-fitting partial one (`prefer_uncore`), then whole cores (not with
    `spread`), then single CPUs in packed (core) or spread (socket) order. AllocationError
    "not enough cpus available to satisfy request: ..." or "failed to allocate cpus".
    """
    _check_count(n)
    return CPUSet.from_bits(_packed(_tables(topo), available.bits, n, spread, prefer_uncore, None))


# ================================================================== NUMA distribution
class _GoSlice:
    """A Go []int slice header over a shared backing array (to reproduce append aliasing)."""

    __slots__ = ("arr", "n")

    def __init__(self, arr: list[int], n: int) -> None:
        self.arr = arr
        self.n = n

    def items(self) -> list[int]:
        return self.arr[: self.n]

    def append(self, x: int) -> _GoSlice:
        if self.n < len(self.arr):  # spare capacity: written in place, shared with others
            self.arr[self.n] = x
            return _GoSlice(self.arr, self.n + 1)
        cap = len(self.arr)
        new_cap = max(self.n + 1, 2 * cap) if cap < 256 else cap + (cap + 3 * 256) // 4
        arr = self.arr[: self.n] + [x] + [0] * (new_cap - self.n - 1)
        return _GoSlice(arr, self.n + 1)


_BREAK: Final = True


def _iterate_combinations(
    items: list[int], k: int, visit: Callable[[_GoSlice], bool | None]
) -> None:
    """iterateCombinations: k-subsets in lexicographic position order; `visit` returns True to
    stop. Each combination is a _GoSlice built with Go's append, aliasing included."""
    if k < 1:
        return
    size = len(items)

    def helper(k: int, start: int, accum: _GoSlice) -> bool:
        if k == 0:
            return bool(visit(accum))
        for i in range(start, size - k + 1):
            if helper(k - 1, i + 1, accum.append(items[i])):
                return _BREAK
        return False

    helper(k, 0, _GoSlice([], 0))


def _go_round(x: float) -> float:
    """Go's math.Round: half away from zero."""
    t = float(math.trunc(x))
    if abs(x - t) >= 0.5:
        t += math.copysign(1.0, x)
    return t


def _std_dev(values: Iterable[int]) -> float:
    """standardDeviation: population std dev; the mean and the result each rounded to 3
    decimals as math.Round(x*1000)/1000."""
    xs = list(values)
    mean = _go_round(math.fsum(xs) / len(xs) * 1000) / 1000 if xs else 0.0
    total = 0.0
    for x in xs:
        total += (x - mean) * (x - mean)
    return _go_round(math.sqrt(total / len(xs)) * 1000) / 1000


def _packed_or_nothing(t: _Tables, available: int, n: int, spread: bool) -> int:
    """The packed choice of `n` CPUs inside one NUMA node's share, or none: upstream ignores
    the error of these inner takes and takes nothing."""
    try:
        return _packed(t, available, n, spread, False, None)
    except AllocationError:
        return 0


def _distributed(
    t: _Tables,
    available: int,
    n: int,
    group: int,
    spread: bool,
    trace: Trace | None,
) -> int:
    """takeByTopologyNUMADistributed on masks, with the subset guard."""
    return _guard(_distributed_steps(t, available, n, group, spread, trace), available)


def _distributed_steps(
    t: _Tables,
    available: int,
    n: int,
    group: int,
    spread: bool,
    trace: Trace | None,
) -> int:
    if group < 1:
        group = 1
    if n % group != 0:
        return _packed(t, available, n, spread, False, trace)
    acc = _start(t, available, n, spread, trace)
    if acc.satisfied():
        return 0
    numas = acc.sort_numas()
    numa_mask = t.numa
    avail_in = {m: _popcount(numa_mask[m] & acc.avail) for m in numas}

    # rangeNUMANodesNeededToSatisfy
    groups_total = (t.num_cpus - 1) // group + 1
    groups_per_numa = (groups_total - 1) // t.num_numa + 1
    groups_needed = (acc.need - 1) // group + 1
    min_numas = (groups_needed - 1) // groups_per_numa + 1
    max_numas = min(groups_needed, len(numas))

    for k in range(min_numas, max_numas + 1):
        best_balance = math.inf
        best_remainder: _GoSlice | None = None
        best_combo: _GoSlice | None = None

        def visit(combo_view: _GoSlice) -> bool:
            nonlocal best_balance, best_remainder, best_combo
            if best_balance == 0:
                return _BREAK
            combo = combo_view.items()
            if sum(avail_in[m] for m in combo) < n:
                return False
            if sum(avail_in[m] // group for m in combo) * group < n:
                return False
            distribution = (n // len(combo) // group) * group
            if any(avail_in[m] < distribution for m in combo):
                return False
            after = dict(avail_in)
            for m in combo:
                after[m] -= distribution
            remainder = n - distribution * len(combo)
            remainder_combo = [m for m in combo if after[m] >= group]
            best_local = math.inf
            best_local_remainder: _GoSlice | None = None
            if remainder == 0:
                best_local = _std_dev(after[m] for m in numas)
            sub_k = len(remainder_combo)
            while remainder > 0 and sub_k >= 1:

                def visit_subset(subset_view: _GoSlice) -> bool:
                    nonlocal best_local, best_local_remainder
                    subset = subset_view.items()
                    left = dict(after)
                    rem = remainder
                    if sum(left[m] for m in subset) < rem:
                        return False
                    while rem > 0:
                        progressed = False
                        for m in subset:
                            if rem == 0:
                                break
                            if left[m] < group:
                                continue
                            left[m] -= group
                            rem -= group
                            progressed = True
                        if not progressed:  # Go would spin forever here; treat as unusable
                            return False
                    balance = _std_dev(left[m] for m in numas)
                    if balance < best_local:
                        best_local = balance
                        best_local_remainder = subset_view
                    return False

                _iterate_combinations(remainder_combo, sub_k, visit_subset)
                sub_k -= 1
            if best_local < best_balance:
                best_balance = best_local
                best_remainder = best_local_remainder
                best_combo = combo_view
            return False

        _iterate_combinations(numas, k, visit)
        if best_combo is None:
            continue

        combo = best_combo.items()  # read now: Go reads the (possibly aliased) slice here too
        distribution = (n // len(combo) // group) * group
        for m in combo:
            got = _packed_or_nothing(t, numa_mask[m] & acc.avail, distribution, spread)
            acc.take(got, f"numa {m} share")
        remainder = n - distribution * len(combo)
        remainder_numas = best_remainder.items() if best_remainder is not None else []
        while remainder > 0:
            progressed = False
            for m in remainder_numas:
                if remainder == 0:
                    break
                if _popcount(numa_mask[m] & acc.avail) < group:
                    continue
                got = _packed_or_nothing(t, numa_mask[m] & acc.avail, group, spread)
                acc.take(got, f"numa {m} remainder")
                remainder -= group
                progressed = True
            if not progressed:
                break
        if acc.need > 0:
            raise AllocationError(
                f"accounting error, not enough CPUs allocated, remaining: {acc.need}",
                reason="accounting_error",
            )
        if acc.need < 0:
            raise AllocationError(
                f"accounting error, too many CPUs allocated, remaining: {acc.need}",
                reason="accounting_error",
            )
        return acc.result

    return _packed(t, available, n, spread, False, trace)


def take_by_topology_numa_distributed(
    topo: Topology,
    available: CPUSet,
    n: int,
    group_size: int,
    *,
    spread: bool = False,
) -> CPUSet:
    """takeByTopologyNUMADistributed: spread `n` CPUs evenly (in groups of `group_size`) over the
    fewest NUMA nodes that can take them, choosing the combination that leaves the available
    CPUs of all NUMA nodes most balanced; falls back to the packed algorithm."""
    _check_count(n)
    return CPUSet.from_bits(
        _distributed(_tables(topo), available.bits, n, group_size, spread, None)
    )


# ================================================================== static policy
def _check_count(n: int) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise RequestError(
            f"CPU count must be a non-negative integer, got {n!r}", reason="bad_count"
        )


def _take(t: _Tables, opts: KubeletOptions, available: int, n: int, trace: Trace | None) -> int:
    """staticPolicy.takeByTopology."""
    spread = opts.distribute_cpus_across_cores
    if opts.distribute_cpus_across_numa:
        group = t.cpus_per_core if opts.full_pcpus_only else 1
        return _distributed(t, available, n, group, spread, trace)
    return _packed(t, available, n, spread, opts.prefer_align_by_uncorecache, trace)


def take_by_topology(
    topo: Topology,
    available: CPUSet,
    n: int,
    options: Mapping[str, object] | Iterable[str] | KubeletOptions | None = None,
) -> CPUSet:
    """staticPolicy.takeByTopology: the distributed or packed algorithm as the options say."""
    _check_count(n)
    opts = parse_options(options)
    return CPUSet.from_bits(_take(_tables(topo), opts, available.bits, n, None))


def select_reserved(
    topo: Topology,
    count: int,
    explicit: CPUSet | None = None,
    *,
    options: Mapping[str, object] | Iterable[str] | KubeletOptions | None = None,
) -> CPUSet:
    """The reserved CPUs of NewStaticPolicy: `explicit` (kubelet --reserved-cpus) when it is not
    empty, otherwise `count` CPUs chosen by takeByTopology over all CPUs (e.g. 2 on
    topoDualSocketHT -> 0,6). RequestError with the kubelet's message when the size differs."""
    _check_count(count)
    opts = parse_options(options)
    if explicit is not None and explicit:
        reserved = explicit
    else:
        t = _tables(topo)
        try:
            reserved = CPUSet.from_bits(_take(t, opts, t.all_mask, count, None))
        except AllocationError:
            reserved = EMPTY
    if len(reserved) != count:
        raise RequestError(
            f"[cpumanager] unable to reserve the required amount of CPUs (size of {reserved} "
            f"did not equal {count})",
            reason="bad_reserved_cpus",
        )
    return reserved


def _siblings(t: _Tables, cpus: int) -> int:
    out = 0
    for cpu in _bits(cpus & t.all_mask):
        out |= t.core[t.cpu_core[cpu]]
    return out


def _allocate(
    t: _Tables,
    available: int,
    n: int,
    opts: KubeletOptions,
    numa_affinity: CPUSet | None,
    reusable: int,
    reserved: int,
    trace: Trace | None,
) -> int:
    if opts.full_pcpus_only:
        group = t.cpus_per_core
        if group == 0 or n % group != 0:
            raise SMTAlignmentError(
                f"SMT Alignment Error: requested {n} cpus not multiple cpus per core = {group}",
                reason="smt_alignment",
            )
        physical = _popcount(available & ~_siblings(t, reserved))
        if n > physical:
            raise SMTAlignmentError(
                f"SMT Alignment Error: not enough free physical CPUs: available physical "
                f"CPUs = {physical}, requested CPUs = {n}, CPUs per core = {group}",
                reason="smt_alignment",
            )
    allocatable = available | reusable
    result = 0
    if numa_affinity is not None:
        node_ids = list(numa_affinity)
        if opts.align_by_socket:
            sockets = sorted({s for (m, s) in t.numa_socket if m in node_ids})
            domain = 0
            for s in sockets:
                domain |= t.socket[s]
        else:
            domain = 0
            for m in node_ids:
                domain |= t.numa.get(m, 0)
        aligned = allocatable & domain
        take_n = min(n, _popcount(aligned))
        sub: Trace | None = [] if trace is not None else None
        result |= _take(t, opts, aligned, take_n, sub)
        if trace is not None and sub is not None:
            trace.extend((f"aligned {stage}", mask) for stage, mask in sub)
    if n > _popcount(result):
        result |= _take(t, opts, allocatable & ~result, n - _popcount(result), trace)
    return _guard(result, allocatable)


def static_allocate(
    topo: Topology,
    available: CPUSet,
    n: int,
    options: Mapping[str, object] | Iterable[str] | KubeletOptions | None = None,
    numa_affinity: CPUSet | None = None,
    reusable: CPUSet = EMPTY,
    *,
    reserved: CPUSet = EMPTY,
) -> CPUSet:
    """staticPolicy.Allocate for a Guaranteed container with an integer request of `n` CPUs.

    `available` is the kubelet's GetAvailableCPUs (the default cpuset minus the reserved CPUs);
    `reserved` (optional) is the reserved set, used as upstream for full-pcpus-only (the siblings
    of reserved CPUs do not count as free physical CPUs); `numa_affinity` is the topology
    manager hint (a set of NUMA node ids); `reusable` are CPUs of finished init containers of the
    same pod. `n == 0` (a shared-pool container) gives the empty set.
    """
    _check_count(n)
    opts = parse_options(options)
    validate_options_for_topology(topo, opts)
    if n == 0:
        return EMPTY
    t = _tables(topo)
    return CPUSet.from_bits(
        _allocate(t, available.bits, n, opts, numa_affinity, reusable.bits, reserved.bits, None)
    )


# ================================================================== Policy object
_STAGE_LEVEL: Final = {
    "numa": "numa",
    "socket": "socket",
    "l3": "l3",
    "l3-partial": "l3",
    "core": "core",
    "cpu": "cpu",
}


def _explain(trace: Trace) -> tuple[Step, ...]:
    """Merge consecutive takes of the same stage into one Step each."""
    merged: list[tuple[str, int]] = []
    for stage, mask in trace:
        if not mask:
            continue
        if merged and merged[-1][0] == stage:
            merged[-1] = (stage, merged[-1][1] | mask)
        else:
            merged.append((stage, mask))
    steps = []
    for stage, mask in merged:
        aligned = stage.startswith("aligned ")
        base = stage.removeprefix("aligned ")
        if base.startswith("numa ") and ("share" in base or "remainder" in base):
            level = "numa"
            reason = (
                "distribute-cpus-across-numa: even share of this NUMA node"
                if "share" in base
                else "distribute-cpus-across-numa: remainder group"
            )
        else:
            level = _STAGE_LEVEL.get(base, base)
            reason = {
                "numa": "takeFullFirstLevel/SecondLevel: whole free NUMA node(s)",
                "socket": "takeFullFirstLevel/SecondLevel: whole free socket(s)",
                "l3": "takeUncoreCache: whole free uncore cache(s)",
                "l3-partial": "takePartialUncore: the request fits in this uncore cache",
                "core": "takeFullCores: whole free core(s)",
                "cpu": "takeRemainingCPUs: single CPUs in sorted order",
            }.get(base, base)
        if aligned:
            reason += " (inside the NUMA affinity hint)"
        steps.append(Step(level, str(CPUSet.from_bits(mask)), reason))
    return tuple(steps)


class KubeletStaticPolicy:
    """The `kubelet-static` policy (Policy protocol).

    Request.options: the six kubelet options (boolean) plus the corepin extensions
    `reserved-cpus=<cpulist>` and `num-reserved-cpus=<n>`; `available` is the kubelet's default
    (shared) cpuset: reserved CPUs are removed from it before exclusive allocation. smt
    "whole-cores" turns on full-pcpus-only and "spread" distribute-cpus-across-cores; numa_hint is
    the topology manager's NUMA affinity. Shared requests get the shared pool (minus the reserved
    CPUs with strict-cpu-reservation). CPUs to run near (`Request.near`, a corepin extension):
    the kubelet's choice out of those first (`corepin.allocation.near`).
    """

    name = "kubelet-static"

    def decide(self, topology: Topology, request: Request, available: CPUSet) -> Decision:
        if request.near is not None:
            return decide_near(self, topology, request, available)
        kubelet_opts: dict[str, object] = {}
        reserved_text: str | None = None
        num_reserved: int | None = None
        for key, value in request.options.items():
            if key == RESERVED_CPUS:
                reserved_text = value
            elif key == NUM_RESERVED_CPUS:
                try:
                    num_reserved = int(value)
                except ValueError:
                    raise RequestError(
                        f"option {NUM_RESERVED_CPUS!r} takes an integer, got {value!r}",
                        reason="bad_option_value",
                    ) from None
                if num_reserved < 0:
                    raise RequestError(
                        f"option {NUM_RESERVED_CPUS!r} must not be negative, got {value!r}",
                        reason="bad_option_value",
                    )
            else:
                kubelet_opts[key] = value
        if request.smt == "whole-cores":
            kubelet_opts.setdefault(FULL_PCPUS_ONLY, True)
        elif request.smt == "spread":
            kubelet_opts.setdefault(DISTRIBUTE_CPUS_ACROSS_CORES, True)
        if request.level != "cpu":
            raise RequestError(
                f"policy 'kubelet-static' has no exclusiveness levels; level {request.level!r} "
                "is not supported (use level 'cpu')",
                reason="bad_level",
            )
        opts = parse_options(kubelet_opts)
        validate_options_for_topology(topology, opts)
        explicit = CPUSet.parse(reserved_text) if reserved_text is not None else None
        if explicit is not None and not explicit.issubset(topology.online_cpus):
            raise RequestError(
                f"reserved CPUs {explicit - topology.online_cpus} are not online CPUs of the "
                "topology",
                reason="bad_reserved_cpus",
            )
        count = num_reserved if num_reserved is not None else len(explicit or EMPTY)
        reserved = select_reserved(topology, count, explicit, options=opts) if count else EMPTY
        t = _tables(topology)
        if not request.exclusive:
            # the kubelet knows no isolated CPUs: its default cpuset is the node's shared pool
            pool = NodePools.build(
                available, reserved=reserved, strict=opts.strict_cpu_reservation
            ).shared_pool
            steps = [Step("cpu", str(pool), "shared request: the default (shared) cpuset")]
            return Decision(pool, topology.mems_of(pool), EMPTY, self.name, tuple(steps))
        free = available - reserved
        trace: Trace = []
        bits = _allocate(
            t, free.bits, request.count, opts, request.numa_hint, 0, reserved.bits, trace
        )
        cpus = CPUSet.from_bits(bits)
        steps_list = list(_explain(trace))
        if reserved:
            steps_list.insert(0, Step("cpu", str(reserved), "reserved CPUs, never exclusive"))
        return Decision(cpus, topology.mems_of(cpus), cpus, self.name, tuple(steps_list))
