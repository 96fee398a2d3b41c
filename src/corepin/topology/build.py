"""Pure construction of a `Topology` from sysfs records (`corepin.sysfs.records`).

No file access here: `corepin.topology.discover` reads, this module decides. The kernel's sysfs
is the truth: discovery never refuses a machine the kernel describes. Where its attributes
disagree, the interpretation hwloc and lscpu take is chosen and noted once through
`interpret` (INFO on the `corepin.sysfs` logger). The decisions:

- **online**: `online & present`. Offline CPUs keep only `online=False` and `isolated`; every
  topology field is None (the kernel removes their topology, cache and sibling entries).
- **socket**: `physical_package_id`; when it is missing or negative (some platforms print -1),
  the lowest CPU of `package_cpus_list`, else 0. Packages are kept as the kernel numbers them,
  also where an arm64 kernel gives every cluster of one SoC its own package.
- **die**: `die_id`; when the file is missing (kernels before 5.2) die 0, one die per package;
  when it is negative (the kernel knows no dies, e.g. arm64) None.
- **NUMA**: the node whose `cpulist` holds the CPU (None when no online node lists it, e.g. its
  node is offline); without any node directory (no CONFIG_NUMA) every CPU is in node 0.
  Node CPU sets keep online CPUs only; distances keep only nodes that are in the model. A CPU
  that two nodes list stays in the lowest of them (noted `cpu_in_several_numa_nodes`).
- **instances** of a core, cache or cluster: every CPU lists the CPUs it shares the unit with;
  the sets most CPUs list are taken first, and a list that disagrees with better-supported ones
  only keeps its CPUs that are left (see `instances`; noted as `<level>_lists_disagree` for
  caches): one wrong list cannot merge two instances, as hwloc ignores a unit that intersects
  another.
- **core**: the SMT siblings (`core_cpus_list`, else `thread_siblings_list`, else CPUs with the
  same (package, die, core_id)), named by their lowest online CPU. Then:
  siblings whose (package, die, core_id) differ are separate cores - AMD family 15h lists the
  two cores of a compute unit as thread siblings with their own core_id; hwloc makes one core
  per thread there, and cadvisor and the kubelet key cores by (package, core_id)
  (`smt_siblings_core_id_differ`, `smt_siblings_span_packages`). A core whose threads the
  node lists put in different NUMA nodes becomes one core per thread (hwloc drops a core that
  crosses a NUMA node; `smt_siblings_span_numa_nodes`).
- **L2 / L3 / cluster**: CPUs are grouped into instances by their shared CPU lists
  (`shared_cpu_map` / `shared_cpu_list`, `cluster_cpus_list`) restricted to online CPUs, and
  every core lies inside one instance of each cache level: SMT threads share their core's
  caches, so a list that leaves out a sibling is taken as incomplete (`cache_splits_core`;
  hwloc likewise uses the core's CPUs for an empty cache map). A cache may span several
  packages (one DynamIQ L3 over clusters numbered as packages; `cache_spans_packages`), as may
  a NUMA node (`numa_spans_packages`). An instance is then named by the kernel's `id` when
  every instance has exactly one id and no two instances share one; otherwise (ids missing, or
  ids that restart per package as on some machines) every instance of that level is named by
  its lowest online CPU. Either way two CPUs share a value exactly when they share that cache.
  Data caches count when a level has no unified cache; instruction caches never do.
- **core_type**: "performance" for CPUs in `sys/devices/cpu_core/cpus`, "efficiency" for
  `sys/devices/cpu_atom/cpus`; without those, from `cpu_capacity`: the CPUs with the highest
  capacity are "performance", the others "efficiency" (None when all are equal).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from corepin.core.cpuset import CPUSet
from corepin.sysfs.records import CacheRecord, CPURecord, SysfsSnapshot
from corepin.topology.model import EFFICIENCY, PERFORMANCE, CPUInfo, NUMANode, Topology

__all__ = ["EFFICIENCY", "PERFORMANCE", "build_topology", "instances", "name_instances"]

Note = Callable[[str, str, str], None]

_CPU_DIR = "sys/devices/system/cpu"


def _no_note(kind: str, path: str, action: str) -> None:
    return None


def instances(shares: Mapping[int, int]) -> dict[int, int]:
    """Partition CPUs into instances: `cpu -> bits of the CPUs it says it shares with`.

    Every CPU's set (restricted to the CPUs that are keys of `shares`, itself included) is a
    candidate. The candidates most CPUs list exactly come first (then the one with the lowest
    CPU); each becomes an instance when none of its CPUs is placed yet. CPUs still left then go
    with the first candidate that names them, as far as it has CPUs left. On a sound kernel
    every CPU of an instance lists the same set and this is just that partition; a list that
    conflicts with better-supported ones cannot merge them, the way hwloc ignores a cache or
    core whose CPU set intersects another one without containing it. Each CPU is mapped to the
    lowest CPU of its instance."""
    population = 0
    for cpu in shares:
        population |= 1 << cpu
    support: dict[int, int] = {}
    for cpu, mask in shares.items():
        own = (mask & population) | (1 << cpu)
        support[own] = support.get(own, 0) + 1
    order = sorted(support, key=lambda m: (-support[m], (m & -m).bit_length(), -m.bit_count()))
    out: dict[int, int] = {}
    unplaced = population
    for whole in (True, False):
        for mask in order:
            part = mask & unplaced
            if not part or (whole and part != mask):
                continue
            lowest = (part & -part).bit_length() - 1
            for cpu in CPUSet.from_bits(part):
                out[cpu] = lowest
            unplaced &= ~part
            if not unplaced:
                return out
    return out


def name_instances(
    groups: Mapping[int, int],
    given: Mapping[int, int | None],
    *,
    what: str,
    note: Note = _no_note,
) -> dict[int, int]:
    """Name instances (`cpu -> lowest cpu` from `instances`) by kernel ids when they are usable.

    Kernel ids are used when every CPU has one, all CPUs of an instance agree, and no two
    instances share an id; otherwise the lowest CPU names the instance.
    """
    ids: dict[int, set[int | None]] = {}
    for cpu, rep in groups.items():
        ids.setdefault(rep, set()).add(given.get(cpu))
    chosen: dict[int, int] = {}
    for rep, seen in ids.items():
        only = next(iter(seen)) if len(seen) == 1 else None
        if only is None:
            break
        chosen[rep] = only
    else:
        if len(set(chosen.values())) == len(chosen):
            return {cpu: chosen[rep] for cpu, rep in groups.items()}
    if any(v is not None for s in ids.values() for v in s):
        source = "cpu*/topology/cluster_id" if what == "cluster" else "cpu*/cache/index*/id"
        note(
            f"{what}_id_inconsistent",
            source,
            "kernel ids do not name instances uniquely: naming them by their lowest CPU",
        )
    return dict(groups)


def _masks(groups: Mapping[int, int]) -> dict[int, int]:
    """`cpu -> representative` into `representative -> bits of its CPUs`."""
    out: dict[int, int] = {}
    for cpu, rep in groups.items():
        out[rep] = out.get(rep, 0) | (1 << cpu)
    return out


def _split(groups: Mapping[int, int], key: Callable[[int], object]) -> dict[int, int]:
    """Refine `cpu -> representative` so that CPUs with different `key(cpu)` part: each part
    is represented by its lowest CPU."""
    lowest: dict[tuple[int, object], int] = {}
    for cpu in sorted(groups):
        lowest.setdefault((groups[cpu], key(cpu)), cpu)
    return {cpu: lowest[(rep, key(cpu))] for cpu, rep in groups.items()}


def _disagreement(shares: Mapping[int, int], groups: Mapping[int, int]) -> str | None:
    """What the first CPU whose list differs from its instance says (None when all agree)."""
    population = 0
    for cpu in shares:
        population |= 1 << cpu
    by_rep = _masks(groups)
    for cpu, mask in shares.items():
        own = (mask & population) | (1 << cpu)
        got = by_rep[groups[cpu]]
        if own != got:
            return (
                f"CPU {cpu} lists {CPUSet.from_bits(own)}, its instance is "
                f"{CPUSet.from_bits(got)}: the sets most CPUs list win, a conflicting list keeps "
                "only its CPUs that are left"
            )
    return None


def _cores(
    records: Mapping[int, CPURecord],
    online: int,
    sockets: Mapping[int, int],
    dies: Mapping[int, int | None],
    numa: Mapping[int, int | None],
    interpret: Note,
) -> dict[int, int]:
    """`cpu -> core` (the lowest CPU of the core), see the module docstring."""
    fallback_keys: dict[int, object] = {}
    for cpu, rec in records.items():
        if rec.core_cpus is None:
            key = (sockets[cpu], dies[cpu], rec.core_id) if rec.core_id is not None else cpu
            fallback_keys[cpu] = ("id", key)
    fallback_masks = _key_masks(fallback_keys)
    core_shares = {
        cpu: (rec.core_cpus.bits & online) if rec.core_cpus is not None else fallback_masks[cpu]
        for cpu, rec in records.items()
    }
    cores = instances(core_shares)
    odd = _disagreement(core_shares, cores)
    if odd is not None:
        interpret("smt_siblings_lists_disagree", f"{_CPU_DIR}/cpu*/topology/core_cpus_list", odd)

    def place(cpu: int) -> tuple[int, int | None]:
        return sockets[cpu], dies[cpu]

    def ident(cpu: int) -> tuple[int, int | None, int | None]:
        return sockets[cpu], dies[cpu], records[cpu].core_id

    split = _split(cores, ident)
    if split != cores:
        for rep, mask in _masks(cores).items():
            members = CPUSet.from_bits(mask)
            if len({ident(c) for c in members}) == 1:
                continue
            path = f"{_CPU_DIR}/cpu{rep}/topology/thread_siblings_list"
            if len({place(c) for c in members}) > 1:
                interpret(
                    "smt_siblings_span_packages",
                    path,
                    f"CPUs {members} are listed as SMT siblings in different packages or dies: "
                    "one core per package and core_id",
                )
            else:
                interpret(
                    "smt_siblings_core_id_differ",
                    path,
                    f"CPUs {members} are listed as SMT siblings with different core_id (an AMD "
                    "compute unit): one core per core_id, as hwloc, cadvisor and the kubelet",
                )
        cores = split
    for rep, mask in _masks(cores).items():
        members = CPUSet.from_bits(mask)
        if len({numa.get(c) for c in members}) > 1:
            interpret(
                "smt_siblings_span_numa_nodes",
                f"{_CPU_DIR}/cpu{rep}/topology/thread_siblings_list",
                f"the NUMA nodes split the SMT siblings {members}: one core per thread (hwloc "
                "drops a core that crosses a NUMA node)",
            )
            for cpu in members:
                cores[cpu] = cpu
    return cores


def _cache_of(rec: CPURecord, level: int) -> CacheRecord | None:
    best: CacheRecord | None = None
    for cache in rec.caches:
        if cache.level != level:
            continue
        if cache.type == "Unified":
            return cache
        if cache.type == "Data" and best is None:
            best = cache
    return best


def _key_masks(keys: Mapping[int, object]) -> dict[int, int]:
    """`cpu -> key` into `cpu -> bits of the CPUs with the same key`."""
    by_key: dict[object, int] = {}
    for cpu, key in keys.items():
        by_key[key] = by_key.get(key, 0) | (1 << cpu)
    return {cpu: by_key[key] for cpu, key in keys.items()}


def _socket(rec: CPURecord) -> int:
    if rec.package is not None and rec.package >= 0:
        return rec.package
    if rec.package_cpus:
        return rec.package_cpus.first()
    return 0


def _die(rec: CPURecord) -> int | None:
    if rec.die is None:
        return 0
    return rec.die if rec.die >= 0 else None


def _cache_ids(
    records: Mapping[int, CPURecord],
    online: int,
    level: int,
    cores: Mapping[int, int],
    note: Note,
    interpret: Note,
) -> dict[int, int]:
    shares: dict[int, int] = {}
    given: dict[int, int | None] = {}
    for cpu, rec in records.items():
        cache = _cache_of(rec, level)
        if cache is not None:
            shares[cpu] = cache.shared_cpus.bits & online
            given[cpu] = cache.id
    groups = instances(shares)
    where = f"{_CPU_DIR}/cpu*/cache/index*/shared_cpu_map (level {level})"
    odd = _disagreement(shares, groups)
    if odd is not None:
        interpret(f"l{level}_lists_disagree", where, odd)
    core_masks = _masks({cpu: cores[cpu] for cpu in shares})
    if any(len({groups[c] for c in CPUSet.from_bits(m)}) > 1 for m in core_masks.values()):
        interpret(
            "cache_splits_core",
            where,
            f"an L{level} list leaves out SMT siblings of the CPU: the core's threads share "
            "the instance",
        )
        shares = {cpu: mask | core_masks[cores[cpu]] for cpu, mask in shares.items()}
        groups = instances(shares)
    return name_instances(groups, given, what=f"l{level}", note=note)


def _note_spans(
    what: str, groups: Mapping[int, int | None], sockets: Mapping[int, int], interpret: Note
) -> None:
    """Note (once) a cache or NUMA node holding CPUs of several packages."""
    seen: dict[int, set[int]] = {}
    for cpu, unit in groups.items():
        if unit is not None:
            seen.setdefault(unit, set()).add(sockets[cpu])
    for unit, packages in seen.items():
        if len(packages) > 1:
            kind = "numa_spans_packages" if what == "numa" else "cache_spans_packages"
            label = "NUMA node" if what == "numa" else f"{what.upper()} instance"
            interpret(
                kind,
                f"{_CPU_DIR}/cpu*/topology/physical_package_id",
                f"{label} {unit} holds CPUs of packages {sorted(packages)}: kept as one unit "
                "over them (hwloc puts it above those packages)",
            )
            return


def _core_types(snap: SysfsSnapshot, online: CPUSet) -> tuple[dict[int, str], dict[int, int]]:
    types: dict[int, str] = {}
    capacity: dict[int, int] = {}
    for cpu in online:
        rec = snap.cpu.cpus.get(cpu)
        if rec is not None and rec.capacity is not None:
            capacity[cpu] = rec.capacity
    if snap.cpu.core_types:
        for kind in (EFFICIENCY, PERFORMANCE):
            for cpu in snap.cpu.core_types.get(kind, CPUSet()) & online:
                types[cpu] = kind
    elif capacity and len(set(capacity.values())) > 1:
        top = max(capacity.values())
        types = {cpu: PERFORMANCE if cap == top else EFFICIENCY for cpu, cap in capacity.items()}
    return types, capacity


def _numa(
    snap: SysfsSnapshot, online_set: CPUSet, interpret: Note
) -> tuple[dict[int, int], list[NUMANode]]:
    numa: dict[int, int] = {}
    nodes: list[NUMANode] = []
    if snap.nodes is None:
        numa = dict.fromkeys(online_set, 0)
        nodes.append(NUMANode(0, online_set, {0: 10}))
        return numa, nodes
    known = {rec.id for rec in snap.nodes.nodes}
    for node in sorted(snap.nodes.nodes, key=lambda rec: rec.id):
        cpus = node.cpus & online_set
        taken = CPUSet(c for c in cpus if c in numa)
        if taken:
            interpret(
                "cpu_in_several_numa_nodes",
                f"sys/devices/system/node/node{node.id}/cpulist",
                f"CPUs {taken} are listed by node {node.id} and a lower node: they stay in "
                "the lowest",
            )
            cpus = cpus - taken
        for cpu in cpus:
            numa[cpu] = node.id
        distances = {k: v for k, v in node.distances.items() if k in known}
        nodes.append(NUMANode(node.id, cpus, distances, node.memory_kb))
    return numa, nodes


def build_topology(
    snap: SysfsSnapshot,
    *,
    note: Note = _no_note,
    interpret: Note = _no_note,
    name: str = "",
) -> Topology:
    """The machine model for one sysfs snapshot (see the module docstring for each rule).
    `note` receives fallbacks for missing files, `interpret` the readings of attributes that
    disagree (kind, path, what was done)."""
    present = snap.cpu.present
    online_set = snap.cpu.online & present
    online = online_set.bits
    records: dict[int, CPURecord] = {
        cpu: snap.cpu.cpus.get(cpu) or CPURecord(cpu) for cpu in online_set
    }
    sockets = {cpu: _socket(rec) for cpu, rec in records.items()}
    dies = {cpu: _die(rec) for cpu, rec in records.items()}
    numa, nodes = _numa(snap, online_set, interpret)
    cores = _cores(records, online, sockets, dies, numa, interpret)

    l2 = _cache_ids(records, online, 2, cores, note, interpret)
    l3 = _cache_ids(records, online, 3, cores, note, interpret)
    _note_spans("l3", l3, sockets, interpret)
    _note_spans("l2", l2, sockets, interpret)
    _note_spans("numa", dict(numa), sockets, interpret)

    cluster_keys: dict[int, object] = {}
    cluster_given: dict[int, int | None] = {}
    for cpu, rec in records.items():
        if rec.cluster_id is not None and rec.cluster_id >= 0:
            cluster_keys[cpu] = (sockets[cpu], rec.cluster_id)
            cluster_given[cpu] = rec.cluster_id
    cluster_key_masks = _key_masks(cluster_keys)
    cluster_shares = {
        cpu: (records[cpu].cluster_cpus or CPUSet()).bits & online or cluster_key_masks[cpu]
        for cpu in cluster_keys
    }
    clusters = name_instances(instances(cluster_shares), cluster_given, what="cluster", note=note)

    types, capacity = _core_types(snap, online_set)
    isolated = snap.cpu.isolated
    table: list[CPUInfo] = []
    for cpu in present:
        if cpu not in online_set:
            table.append(CPUInfo.offline(cpu, isolated=cpu in isolated))
            continue
        table.append(
            CPUInfo(
                cpu,
                online=True,
                socket=sockets[cpu],
                die=dies[cpu],
                numa=numa.get(cpu),
                l3=l3.get(cpu),
                l2=l2.get(cpu),
                core=cores[cpu],
                cluster=clusters.get(cpu),
                isolated=cpu in isolated,
                core_type=types.get(cpu),
                capacity=capacity.get(cpu),
            )
        )
    return Topology(table, nodes, name=name)
