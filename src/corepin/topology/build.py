"""Pure construction of a `Topology` from sysfs records (`corepin.sysfs.records`).

No file access here: `corepin.topology.discover` reads, this module decides. The decisions:

- **online**: `online & present`. Offline CPUs keep only `online=False` and `isolated`; every
  topology field is None (the kernel removes their topology, cache and sibling entries).
- **socket**: `physical_package_id`; when it is missing or negative (some platforms print -1),
  the lowest CPU of `package_cpus_list`, else 0.
- **die**: `die_id`; when the file is missing (kernels before 5.2) die 0, one die per package;
  when it is negative (the kernel knows no dies, e.g. arm64) None.
- **core**: the lowest online CPU among the SMT siblings (`core_cpus_list`, else
  `thread_siblings_list`, else CPUs with the same (package, die, core_id)). Sibling lists are
  merged transitively, so a slightly inconsistent tree still yields a partition.
- **L2 / L3 / cluster**: CPUs are grouped into instances by their shared CPU lists
  (`shared_cpu_list`, `cluster_cpus_list`) restricted to online CPUs, merged transitively. An
  instance is then named by the kernel's `id` when every instance has exactly one id and no two
  instances share one; otherwise (ids missing, or ids that restart per package as on some
  machines) every instance of that level is named by its lowest online CPU. Either way two CPUs
  share a value exactly when they share that cache. Data caches count when a level has no
  unified cache; instruction caches never do.
- **NUMA**: the node whose `cpulist` holds the CPU (None when no online node lists it, e.g. its
  node is offline); without any node directory (no CONFIG_NUMA) every CPU is in node 0.
  Node CPU sets keep online CPUs only; distances keep only nodes that are in the model.
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


def _no_note(kind: str, path: str, action: str) -> None:
    return None


def instances(shares: Mapping[int, int]) -> dict[int, int]:
    """Partition CPUs into instances: `cpu -> bits of the CPUs it says it shares with`.

    CPUs are merged transitively (union-find over distinct masks) and each CPU is mapped to the
    lowest CPU of its instance. Only CPUs that are keys of `shares` take part.
    """
    parent: dict[int, int] = {c: c for c in shares}

    def find(x: int) -> int:
        root = x
        while parent[root] != root:
            root = parent[root]
        while parent[x] != root:
            parent[x], x = root, parent[x]
        return root

    population = 0
    for cpu in shares:
        population |= 1 << cpu
    by_mask: dict[int, list[int]] = {}
    for cpu, mask in shares.items():
        by_mask.setdefault((mask & population) | (1 << cpu), []).append(cpu)
    for mask in by_mask:
        members = CPUSet.from_bits(mask).sorted()
        first = find(members[0])
        for other in members[1:]:
            root = find(other)
            if root != first:
                if root < first:
                    parent[first] = root
                    first = root
                else:
                    parent[root] = first
    lowest: dict[int, int] = {}
    for cpu in shares:
        root = find(cpu)
        lowest[root] = min(lowest.get(root, cpu), cpu)
    return {cpu: lowest[find(cpu)] for cpu in shares}


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
    records: Mapping[int, CPURecord], online: int, level: int, note: Note
) -> dict[int, int]:
    shares: dict[int, int] = {}
    given: dict[int, int | None] = {}
    for cpu, rec in records.items():
        cache = _cache_of(rec, level)
        if cache is not None:
            shares[cpu] = cache.shared_cpus.bits & online
            given[cpu] = cache.id
    return name_instances(instances(shares), given, what=f"l{level}", note=note)


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


def build_topology(snap: SysfsSnapshot, *, note: Note = _no_note, name: str = "") -> Topology:
    """The machine model for one sysfs snapshot (see the module docstring for each rule)."""
    present = snap.cpu.present
    online_set = snap.cpu.online & present
    online = online_set.bits
    records: dict[int, CPURecord] = {
        cpu: snap.cpu.cpus.get(cpu) or CPURecord(cpu, has_topology=False) for cpu in online_set
    }
    sockets = {cpu: _socket(rec) for cpu, rec in records.items()}
    dies = {cpu: _die(rec) for cpu, rec in records.items()}

    # cores: sibling lists, else (package, die, core_id), else the CPU alone
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

    l2 = _cache_ids(records, online, 2, note)
    l3 = _cache_ids(records, online, 3, note)

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

    numa: dict[int, int] = {}
    nodes: list[NUMANode] = []
    if snap.nodes is None:
        numa = dict.fromkeys(online_set, 0)
        nodes.append(NUMANode(0, online_set, {0: 10}))
    else:
        known = {rec.id for rec in snap.nodes.nodes}
        for node in snap.nodes.nodes:
            cpus = node.cpus & online_set
            for cpu in cpus:
                numa.setdefault(cpu, node.id)
            distances = {k: v for k, v in node.distances.items() if k in known}
            nodes.append(NUMANode(node.id, cpus, distances, node.memory_kb))

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
