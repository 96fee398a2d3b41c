"""Exclusiveness levels and the per-topology index the allocators work from.

A level names the unit whose *whole* CPUs an exclusive decision withholds from everyone else
(actimanager's None/CPU/Core/Socket/NUMA, plus L3): with `level="core"` a decision for CPU 3
also withholds CPU 3's SMT siblings; with `"l3"` the whole L3 (LLC, CCX) instance; with `"numa"`
the whole NUMA node; with `"socket"` the whole package.

`TopologyIndex` precomputes, once per Topology, every unit as a bitmask int (cores, L3 parts
inside NUMA nodes, NUMA nodes, sockets) and CPU -> unit masks, so that decisions are integer
operations with no per-CPU objects. `index_of(topology)` memoises it (Topology is immutable).
"""

from __future__ import annotations

from typing import Final

from corepin.allocation.types import LEVELS
from corepin.core.cpuset import CPUSet
from corepin.core.errors import RequestError, TopologyError
from corepin.core.record import record
from corepin.topology.model import Topology


@record
class Package:
    """The CPUs of one package inside an L3 part, with its cores (masks)."""

    label: str
    mask: int
    cores: tuple[int, ...]


@record
class L3Part:
    """The part of one L3 instance that lies inside one NUMA node, with its cores (masks).
    `packages` is empty unless the part holds CPUs of several packages (a DynamIQ L3 over
    clusters that the kernel numbers as packages): then one entry per package."""

    label: str
    mask: int
    cores: tuple[int, ...]
    packages: tuple[Package, ...] = ()


@record
class NumaUnit:
    """One NUMA node with online CPUs: id, mask, socket, its L3 parts and cores. A node over
    several packages (DynamIQ) counts as part of the package of its first CPU."""

    id: int
    mask: int
    socket: int
    parts: tuple[L3Part, ...]
    cores: tuple[int, ...]
    #: (socket, die) of the node's first CPU
    die: tuple[int, int] = (0, 0)
    #: every CPU of the L3 instances this node touches (0 when the machine has no L3 data)
    l3_reach: int = 0


class TopologyIndex:
    """Bitmask view of a Topology for the allocators (built once, read-only)."""

    __slots__ = (
        "core_masks",
        "cpu_unit",
        "distance",
        "isolated",
        "numa",
        "numa_pos",
        "online",
        "pairs",
        "singles",
        "socket_ids",
        "socket_masks",
        "threads_per_core",
        "topology",
        "units",
    )

    def __init__(self, topology: Topology) -> None:
        self.topology = topology
        self.online: int = topology.online_cpus.bits
        self.isolated: int = topology.isolated_cpus.bits & self.online
        self.threads_per_core: int = topology.threads_per_core
        size = topology.present_cpus.last() + 1 if topology.present_cpus else 0

        numa_of: dict[int, int] = {}
        socket_of_numa: dict[int, int] = {}
        die_of_numa: dict[int, tuple[int, int]] = {}
        l3_key: dict[int, tuple[object, ...]] = {}
        cores: dict[int, int] = {}
        l3s: dict[object, int] = {}
        sockets: dict[int, int] = {}
        for info in topology.cpus:
            if not info.online:
                continue
            bit = 1 << info.cpu
            node = info.numa if info.numa is not None else -1
            sock = info.socket if info.socket is not None else -1
            numa_of[info.cpu] = node
            socket_of_numa.setdefault(node, sock)
            die_of_numa.setdefault(node, (sock, info.die if info.die is not None else 0))
            core = info.core if info.core is not None else info.cpu
            cores[core] = cores.get(core, 0) | bit
            key: tuple[object, ...] = ("l3", info.l3) if info.l3 is not None else ("numa", node)
            l3_key[info.cpu] = key
            l3s[key] = l3s.get(key, 0) | bit
            sockets[sock] = sockets.get(sock, 0) | bit

        core_list = [cores[k] for k in sorted(cores)]
        self.core_masks: tuple[int, ...] = tuple(core_list)
        # Bit-parallel view of the cores for whole_free(): one-thread cores, and two-thread
        # cores grouped by the distance d between their threads (lower thread masks); None when
        # some core has more than two threads (whole_free then walks the cores).
        singles = 0
        by_gap: dict[int, int] = {}
        wide = False
        for c in core_list:
            count = c.bit_count()
            if count == 1:
                singles |= c
            elif count == 2:
                low = c & -c
                gap = (c ^ low).bit_length() - low.bit_length()
                by_gap[gap] = by_gap.get(gap, 0) | low
            else:
                wide = True
        self.singles: int = singles
        self.pairs: tuple[tuple[int, int], ...] | None = (
            None if wide else tuple(sorted(by_gap.items()))
        )
        numa_masks: dict[int, int] = {}
        for cpu, node in numa_of.items():
            numa_masks[node] = numa_masks.get(node, 0) | (1 << cpu)

        units: list[NumaUnit] = []
        for node in sorted(numa_masks):
            nmask = numa_masks[node]
            part_masks: dict[tuple[object, ...], int] = {}
            for cpu in CPUSet.from_bits(nmask):
                k = l3_key[cpu]
                part_masks[k] = part_masks.get(k, 0) | (1 << cpu)
            parts = []
            for k in sorted(part_masks, key=lambda key: part_masks[key] & -part_masks[key]):
                pmask = part_masks[k]
                label = f"L3 {k[1]}" if k[0] == "l3" else f"node {node} (no L3 information)"
                packages = tuple(
                    Package(f"package {s}", pmask & smask, tuple(c for c in core_list if c & smask))
                    for s, smask in sorted(sockets.items())
                    if pmask & smask
                )
                parts.append(
                    L3Part(
                        label,
                        pmask,
                        tuple(c for c in core_list if c & pmask),
                        packages if len(packages) > 1 else (),
                    )
                )
            units.append(
                NumaUnit(
                    node,
                    nmask,
                    socket_of_numa[node],
                    tuple(parts),
                    tuple(c for c in core_list if c & nmask),
                    die_of_numa[node],
                    sum(l3s[k] for k in part_masks if k[0] == "l3"),
                )
            )
        self.numa: tuple[NumaUnit, ...] = tuple(units)
        self.numa_pos: dict[int, int] = {u.id: i for i, u in enumerate(units)}
        self.socket_ids: tuple[int, ...] = tuple(sorted(sockets))
        self.socket_masks: tuple[int, ...] = tuple(sockets[s] for s in self.socket_ids)

        # NUMA distances by position (10 for self, 20 when unknown and not self).
        dist: list[list[int]] = []
        for a in units:
            row = []
            try:
                given = topology.numa_node(a.id).distances if a.id >= 0 else {}
            except TopologyError:
                given = {}
            for b in units:
                d = given.get(b.id)
                row.append(d if d is not None else (10 if a.id == b.id else 20))
            dist.append(row)
        self.distance: tuple[tuple[int, ...], ...] = tuple(tuple(r) for r in dist)

        # Units per level (masks) and CPU -> unit mask per level.
        self.units: dict[str, tuple[int, ...]] = {
            "core": self.core_masks,
            "l3": tuple(l3s[k] for k in sorted(l3s, key=lambda key: l3s[key] & -l3s[key])),
            "numa": tuple(u.mask for u in units),
            "socket": self.socket_masks,
        }
        self.cpu_unit: dict[str, list[int]] = {}
        for level, masks in self.units.items():
            table = [0] * size
            for m in masks:
                for cpu in CPUSet.from_bits(m):
                    table[cpu] = m
            self.cpu_unit[level] = table

    # ------------------------------------------------------------------ level helpers
    def whole_free(self, mask: int) -> int:
        """The CPUs of the cores whose online threads are all in `mask` (bit-parallel when no
        core has more than two threads)."""
        pairs = self.pairs
        if pairs is None:
            out = 0
            for c in self.core_masks:
                if c & mask == c:
                    out |= c
            return out
        out = mask & self.singles
        for gap, low in pairs:
            both = mask & (mask >> gap) & low
            out |= both | (both << gap)
        return out

    def free_units_mask(self, level: str, available: int) -> int:
        """The union of the units of `level` whose CPUs are all in `available`."""
        if level == "cpu":
            return available & self.online
        out = 0
        for m in self.units[level]:
            if m & available == m:
                out |= m
        return out

    def withheld_mask(self, level: str, cpus: int) -> int:
        """`cpus` plus the rest of every unit of `level` that holds one of them."""
        if level == "cpu":
            return cpus
        table = self.cpu_unit[level]
        out = cpus
        mask = cpus
        while mask:
            low = mask & -mask
            out |= table[low.bit_length() - 1]
            mask ^= low
        return out


_MEMO: dict[int, TopologyIndex] = {}
_MEMO_LIMIT: Final = 32


def index_of(topology: Topology) -> TopologyIndex:
    """The (memoised) index of `topology`."""
    idx = _MEMO.get(id(topology))
    if idx is not None and idx.topology is topology:
        return idx
    if len(_MEMO) >= _MEMO_LIMIT:
        _MEMO.clear()
    idx = TopologyIndex(topology)
    _MEMO[id(topology)] = idx
    return idx


def check_level(level: str) -> str:
    if level not in LEVELS:
        raise RequestError(
            f"unknown exclusiveness level {level!r} (choose from {', '.join(LEVELS)})",
            reason="bad_level",
        )
    return level


def free_units(topology: Topology, level: str, available: CPUSet) -> CPUSet:
    """The CPUs of `available` that lie in units of `level` whose CPUs are all available."""
    return CPUSet.from_bits(index_of(topology).free_units_mask(check_level(level), available.bits))


def withheld_for(topology: Topology, level: str, cpus: CPUSet) -> CPUSet:
    """`cpus` plus the rest of their units of `level`: what a decision at `level` withholds."""
    return CPUSet.from_bits(index_of(topology).withheld_mask(check_level(level), cpus.bits))


def units_of(topology: Topology, level: str) -> list[CPUSet]:
    """Every unit of `level` (for "cpu": every online CPU) as a CPUSet, lowest CPU first."""
    idx = index_of(topology)
    if check_level(level) == "cpu":
        return [CPUSet.of(c) for c in topology.online_cpus]
    return [CPUSet.from_bits(m) for m in idx.units[level]]
