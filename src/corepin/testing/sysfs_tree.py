"""Write a sysfs tree that describes a `Topology`, the way a Linux kernel would lay it out.

`write_sysfs_tree(topology, root)` creates `root/sys/devices/system/{cpu,node}/...` (and
`root/sys/devices/cpu_core|cpu_atom/cpus` for hybrid machines) such that
`corepin.discover(root) == topology` for every topology built by `corepin.testing.machines`
(and any topology that follows the same conventions: `core` = lowest online sibling, NUMA node
CPU sets = their online CPUs, complete distance rows).

Files written, per the kernel's ABI (Documentation/ABI/stable/sysfs-devices-system-cpu,
.../testing/sysfs-devices-system-cpu, .../stable/sysfs-devices-node):

- `cpu/{present,possible,online,offline,isolated,kernel_max}`;
- every present CPU: `cpuN/online`; online CPUs also `cpuN/topology/{physical_package_id,
  die_id,core_id,cluster_id,core_cpus_list,thread_siblings_list,package_cpus_list,
  core_siblings_list,die_cpus_list,cluster_cpus_list}` and
  `cpuN/cache/indexK/{level,type,shared_cpu_list,shared_cpu_map,id}` for L1d, L1i, L2, L3,
  and `cpuN/cpu_capacity` when the CPU has a capacity;
- `node/{online,possible,has_cpu,has_memory}`, `node/nodeN/{cpulist,cpumap,distance}` and
  `nodeN/meminfo` when the node has a memory size;
- the topology's PCI devices (`corepin.testing.devices.write_pci_devices`).

`omit` leaves files out to emulate older kernels or odd platforms (names in `OMISSIONS`;
`OLD_KERNEL` is the set a pre-5.2 kernel lacks). `expected_after(topology, omit)` gives the
topology discovery must then return (for example cache instances named by their lowest CPU
when cache `id` files are missing).

`overrides` writes what a kernel prints where it disagrees with the model corepin makes of it:
`{cpu: {"topology/core_id": 3, "cache/index2/shared_cpu_list": CPUSet.of(3), ...}}`, paths
relative to `cpuN/`, values written as text (a CPUSet as a list, or as a hex mask in a `*_map`
or `*_siblings` / `*_cpus` mask file; None removes the file). Overrides are written last, so
they win over `omit`. Cache indexes are numbered as
written: index0 L1d, index1 L1i, then L2, then L3. Two kernels' ways are ready-made:
`compute_unit_files(topology)` (AMD family 15h: the compute unit's two cores are listed as
thread siblings with different core ids) and `package_core_ids(topology)` (core ids that
restart in every package, as the kernel numbers them).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from corepin.core.cpuset import CPUSet
from corepin.core.errors import TopologyError
from corepin.core.record import replace
from corepin.testing.devices import write_pci_devices
from corepin.topology.model import CPUInfo, NUMANode, Topology

__all__ = [
    "OLD_KERNEL",
    "OMISSIONS",
    "Overrides",
    "compute_unit_files",
    "expected_after",
    "package_core_ids",
    "write_sysfs_tree",
]

#: Per-CPU file overrides: cpu -> path below `cpuN/` -> what the kernel prints (None: no file).
Overrides = Mapping[int, Mapping[str, "int | str | CPUSet | None"]]

OMISSIONS = frozenset(
    {
        "present",  # cpu/present
        "online",  # cpu/online (cpuN/online files remain)
        "cpu0_online",  # cpu0/online, as on kernels where CPU 0 cannot be hot-unplugged
        "isolated",  # cpu/isolated (before 3.15)
        "die_id",  # topology/die_id and die_cpus_list (before 5.2)
        "core_cpus_list",  # topology/core_cpus_list (before 5.3)
        "thread_siblings_list",  # topology/thread_siblings_list (and core_cpus_list)
        "cluster_id",  # topology/cluster_id and cluster_cpus_list (before 5.16)
        "cache_id",  # cache/indexK/id (before 4.11, or firmware without ids as on arm64)
        "shared_cpu_list",  # cache/indexK/shared_cpu_list (shared_cpu_map remains)
        "shared_cpu_map",  # cache/indexK/shared_cpu_map (kept when shared_cpu_list is omitted)
        "node_dir",  # the whole node/ directory (kernel without NUMA support)
        "node_online",  # node/online
        "node_cpulist",  # node/nodeN/cpulist (cpumap remains)
        "node_distance",  # node/nodeN/distance
    }
)

OLD_KERNEL = frozenset({"die_id", "core_cpus_list", "cluster_id", "cache_id", "isolated"})

_PMU = {"performance": "cpu_core", "efficiency": "cpu_atom"}


class _Writer:
    def __init__(self) -> None:
        self._made: set[str] = set()

    def write(self, path: str, text: str) -> None:
        parent = os.path.dirname(path)
        if parent not in self._made:
            os.makedirs(parent, exist_ok=True)
            self._made.add(parent)
        with open(path, "w", encoding="ascii") as handle:
            handle.write(text + "\n")

    def remove(self, path: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)


def _is_mask_file(rel: str) -> bool:
    """Hex mask files: `shared_cpu_map`, `cpumap`, and the topology masks without `_list`."""
    name = os.path.basename(rel)
    return name.endswith("_map") or (
        rel.startswith("topology/") and name.endswith(("_siblings", "_cpus"))
    )


def _override_text(cpu: int, rel: str, value: int | str | CPUSet) -> str:
    if isinstance(value, CPUSet):
        return value.to_mask() if _is_mask_file(rel) else str(value)
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise TypeError(f"override cpu{cpu}/{rel}: expected int, str or CPUSet, got {value!r}")
    return str(value)


def _check_overrides(topology: Topology, overrides: Overrides) -> None:
    for cpu, files in overrides.items():
        if cpu not in topology.online_cpus:
            raise ValueError(f"overrides for CPU {cpu}: only online CPUs have topology files")
        for rel in files:
            parts = rel.split("/")
            if rel.startswith("/") or ".." in parts or parts[0] not in ("topology", "cache"):
                raise ValueError(
                    f"override path {rel!r} of CPU {cpu} must lie below cpu{cpu}/topology or "
                    f"cpu{cpu}/cache"
                )


def _check_omit(omit: Iterable[str]) -> frozenset[str]:
    names = frozenset(omit)
    unknown = names - OMISSIONS
    if unknown:
        raise ValueError(
            f"unknown sysfs omissions {sorted(unknown)}; known: {', '.join(sorted(OMISSIONS))}"
        )
    return names


def write_sysfs_tree(
    topology: Topology,
    root: str | os.PathLike[str],
    *,
    omit: Iterable[str] = (),
    overrides: Overrides | None = None,
) -> Path:
    """Write the sysfs files describing `topology` under `root` (with `overrides` written over
    them, see the module docstring); returns `Path(root)`."""
    skip = _check_omit(omit)
    if overrides:
        _check_overrides(topology, overrides)
    out = _Writer()
    base = os.path.join(os.fspath(root), "sys", "devices", "system", "cpu")
    present = topology.present_cpus
    online = topology.online_cpus
    os.makedirs(base, exist_ok=True)
    if "present" not in skip:
        out.write(os.path.join(base, "present"), str(present))
    if "online" not in skip:
        out.write(os.path.join(base, "online"), str(online))
    out.write(os.path.join(base, "possible"), str(present))
    out.write(os.path.join(base, "offline"), str(present - online))
    out.write(os.path.join(base, "kernel_max"), str(max(present.last(), 7)))
    if "isolated" not in skip:
        out.write(os.path.join(base, "isolated"), str(topology.isolated_cpus))

    kinds: dict[str, int] = {}
    for info in topology.cpus:
        if info.online and info.core_type is not None:
            if info.core_type not in _PMU:
                raise TopologyError(
                    f"CPU {info.cpu}: core_type {info.core_type!r} has no sysfs form; "
                    f"use one of {sorted(_PMU)}"
                )
            kinds[info.core_type] = kinds.get(info.core_type, 0) | (1 << info.cpu)
    for kind, bits in kinds.items():
        path = os.path.join(os.fspath(root), "sys", "devices", _PMU[kind], "cpus")
        out.write(path, str(CPUSet.from_bits(bits)))

    clusters: dict[int, int] = {}
    for info in topology.cpus:
        if info.online and info.cluster is not None:
            clusters[info.cluster] = clusters.get(info.cluster, 0) | (1 << info.cpu)

    for info in topology.cpus:
        cpu_dir = os.path.join(base, f"cpu{info.cpu}")
        if not (info.cpu == 0 and info.online and "cpu0_online" in skip):
            out.write(os.path.join(cpu_dir, "online"), "1" if info.online else "0")
        else:
            os.makedirs(cpu_dir, exist_ok=True)
        if info.online:
            _write_cpu(out, topology, info, cpu_dir, skip, clusters)
            for rel, value in (overrides or {}).get(info.cpu, {}).items():
                path = os.path.join(cpu_dir, *rel.split("/"))
                if value is None:
                    out.remove(path)
                else:
                    out.write(path, _override_text(info.cpu, rel, value))

    if "node_dir" not in skip:
        _write_nodes(out, topology, os.path.join(os.fspath(root), "sys/devices/system/node"), skip)
    if topology.devices:
        write_pci_devices(topology.devices, root)
    return Path(root)


def _write_cpu(
    out: _Writer,
    topo: Topology,
    info: CPUInfo,
    cpu_dir: str,
    skip: frozenset[str],
    clusters: dict[int, int],
) -> None:
    cpu = info.cpu
    t = os.path.join(cpu_dir, "topology")
    siblings = str(topo.siblings_of(cpu))
    socket = info.socket if info.socket is not None else -1
    package = str(topo.cpus_in_sockets(socket)) if info.socket is not None else str(cpu)
    out.write(os.path.join(t, "physical_package_id"), str(socket))
    out.write(os.path.join(t, "core_id"), str(info.core if info.core is not None else cpu))
    if "die_id" not in skip:
        out.write(os.path.join(t, "die_id"), str(info.die if info.die is not None else -1))
        if info.socket is not None and info.die is not None:
            out.write(os.path.join(t, "die_cpus_list"), str(topo.cpus_in_dies((socket, info.die))))
    if "core_cpus_list" not in skip and "thread_siblings_list" not in skip:
        out.write(os.path.join(t, "core_cpus_list"), siblings)
    if "thread_siblings_list" not in skip:
        out.write(os.path.join(t, "thread_siblings_list"), siblings)
    out.write(os.path.join(t, "package_cpus_list"), package)
    out.write(os.path.join(t, "core_siblings_list"), package)
    if "cluster_id" not in skip:
        if info.cluster is not None:
            cluster_cpus = str(CPUSet.from_bits(clusters[info.cluster]))
            out.write(os.path.join(t, "cluster_id"), str(info.cluster))
            out.write(os.path.join(t, "cluster_cpus_list"), cluster_cpus)
        else:  # what arm64 prints for a CPU outside any cluster
            out.write(os.path.join(t, "cluster_id"), "-1")
            out.write(os.path.join(t, "cluster_cpus_list"), siblings)
    if info.capacity is not None:
        out.write(os.path.join(cpu_dir, "cpu_capacity"), str(info.capacity))

    caches: list[tuple[int, str, CPUSet, int]] = []
    core_cpus = topo.siblings_of(cpu)
    core = info.core if info.core is not None else cpu
    caches.append((1, "Data", core_cpus, core))
    caches.append((1, "Instruction", core_cpus, core))
    if info.l2 is not None:
        caches.append((2, "Unified", topo.cpus_in_l2s(info.l2), info.l2))
    if info.l3 is not None:
        caches.append((3, "Unified", topo.cpus_in_l3s(info.l3), info.l3))
    for index, (level, kind, shared, ident) in enumerate(caches):
        d = os.path.join(cpu_dir, "cache", f"index{index}")
        out.write(os.path.join(d, "level"), str(level))
        out.write(os.path.join(d, "type"), kind)
        if "shared_cpu_list" not in skip:
            out.write(os.path.join(d, "shared_cpu_list"), str(shared))
        if "shared_cpu_map" not in skip or "shared_cpu_list" in skip:
            out.write(os.path.join(d, "shared_cpu_map"), shared.to_mask())
        if "cache_id" not in skip:
            out.write(os.path.join(d, "id"), str(ident))


def _write_nodes(out: _Writer, topo: Topology, base: str, skip: frozenset[str]) -> None:
    nodes = topo.numa_nodes
    ids = CPUSet(n.id for n in nodes)
    os.makedirs(base, exist_ok=True)
    if "node_online" not in skip:
        out.write(os.path.join(base, "online"), str(ids))
    out.write(os.path.join(base, "possible"), str(ids))
    out.write(os.path.join(base, "has_cpu"), str(CPUSet(n.id for n in nodes if n.cpus)))
    out.write(os.path.join(base, "has_memory"), str(ids))
    order = ids.sorted()
    for node in nodes:
        d = os.path.join(base, f"node{node.id}")
        if "node_cpulist" not in skip:
            out.write(os.path.join(d, "cpulist"), str(node.cpus))
        out.write(os.path.join(d, "cpumap"), node.cpus.to_mask())
        if "node_distance" not in skip and all(o in node.distances for o in order):
            out.write(os.path.join(d, "distance"), " ".join(str(node.distances[o]) for o in order))
        if node.memory_kb is not None:
            out.write(
                os.path.join(d, "meminfo"),
                f"Node {node.id} MemTotal:       {node.memory_kb} kB\n"
                f"Node {node.id} MemFree:        {node.memory_kb // 2} kB",
            )


def package_core_ids(topology: Topology) -> dict[int, dict[str, int | str | CPUSet | None]]:
    """`topology/core_id` as kernels number it: 0, 1, ... in every package (SMT siblings share
    theirs), instead of the machine-wide ids the writer uses by default."""
    out: dict[int, dict[str, int | str | CPUSet | None]] = {}
    for socket in topology.socket_ids():
        for index, core in enumerate(topology.cores_in_socket(socket)):
            for cpu in topology.cpus_in_cores(core):
                out[cpu] = {"topology/core_id": index}
    return out


def compute_unit_files(
    topology: Topology, *, stale_lists: bool = False
) -> dict[int, dict[str, int | str | CPUSet | None]]:
    """What an AMD family 15h (Bulldozer .. Excavator) kernel prints for `topology`, whose
    single-thread cores come in compute units of the cores that share one L2: the unit is
    listed as SMT siblings (`thread_siblings_list`, `core_cpus_list`), the two cores keep
    their own `core_id` (numbered from 0 in every NUMA node of a package, as on an Opteron
    6200/6300, where each die is a node), and the unit shares its L1i as well as its L2 (the
    L1d stays private). `stale_lists=True` also reproduces a kernel seen in the wild whose
    L1i and L2 `shared_cpu_list` name the CPU alone while `shared_cpu_map` names the unit.

    ValueError when some CPU has no L2 or a core has several threads (not that machine)."""
    out: dict[int, dict[str, int | str | CPUSet | None]] = {}
    numbering: dict[tuple[int | None, int | None], int] = {}
    for info in topology.cpus:
        if not info.online:
            continue
        if info.l2 is None or len(topology.siblings_of(info.cpu)) != 1:
            raise ValueError(f"CPU {info.cpu}: compute units are single-thread cores sharing an L2")
        unit = topology.cpus_in_l2s(info.l2)
        key = (info.socket, info.numa)
        core_id = numbering.get(key, 0)
        numbering[key] = core_id + 1
        files: dict[str, int | str | CPUSet | None] = {
            "topology/core_id": core_id,
            "topology/thread_siblings_list": unit,
            "topology/core_cpus_list": unit,
            "cache/index1/shared_cpu_list": unit,
            "cache/index1/shared_cpu_map": unit,
        }
        if stale_lists:
            alone = CPUSet.of(info.cpu)
            files["cache/index1/shared_cpu_list"] = alone
            files["cache/index2/shared_cpu_list"] = alone
        out[info.cpu] = files
    return out


def expected_after(topology: Topology, omit: Iterable[str]) -> Topology:
    """The topology discovery returns for a tree written with `omit` (see the module doc)."""
    skip = _check_omit(omit)
    online = topology.online_cpus
    renamed: dict[str, dict[int, int]] = {}
    if "cache_id" in skip:
        for level in ("l2", "l3"):
            groups: dict[int, int] = {}
            for info in topology.cpus:
                value = getattr(info, level)
                if info.online and value is not None:
                    groups[value] = min(groups.get(value, info.cpu), info.cpu)
            renamed[level] = groups
    cpus: list[CPUInfo] = []
    for info in topology.cpus:
        if not info.online:
            cpus.append(
                CPUInfo.offline(info.cpu, isolated=info.isolated and "isolated" not in skip)
            )
            continue
        changes: dict[str, Any] = {}
        if "die_id" in skip:
            changes["die"] = 0
        if "cluster_id" in skip:
            changes["cluster"] = None
        if "isolated" in skip:
            changes["isolated"] = False
        if "node_dir" in skip:
            changes["numa"] = 0
        for level, groups in renamed.items():
            value = getattr(info, level)
            if value is not None:
                changes[level] = groups[value]
        cpus.append(_replace(info, changes))
    nodes: list[NUMANode]
    if "node_dir" in skip:
        nodes = [NUMANode(0, online, {0: 10})]
    else:
        nodes = []
        order = {n.id for n in topology.numa_nodes}
        for node in topology.numa_nodes:
            complete = all(o in node.distances for o in order)
            distances = {} if "node_distance" in skip or not complete else dict(node.distances)
            nodes.append(NUMANode(node.id, node.cpus & online, distances, node.memory_kb))
    return Topology(cpus, nodes, name=topology.name, devices=topology.devices)


def _replace(info: CPUInfo, changes: dict[str, Any]) -> CPUInfo:
    return replace(info, **changes) if changes else info
