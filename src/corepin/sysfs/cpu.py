"""Reader of sys/devices/system/cpu (and the hybrid PMU lists under sys/devices).

Required: the directory `sys/devices/system/cpu` itself, and either its `present` / `online`
files or `cpuN/` directories to derive them from. Everything else is optional, with these
documented fallbacks (each logged once per discovery, see `corepin.sysfs.files`):

| file (kernel that added it)          | when absent                                              |
|--------------------------------------|----------------------------------------------------------|
| `present`                            | the `cpuN/` directories are the present CPUs             |
| `online`                             | `cpuN/online` per CPU; a CPU without that file (cpu0 on  |
|                                      | most kernels) is online                                  |
| `isolated` (3.15)                    | no CPU is isolated                                       |
| `cpuN/topology/` (whole directory)   | the CPU is its own core, package unknown (0)             |
| `topology/die_id` (5.2)              | one die per package: die 0 (`-1` means "no die": None)   |
| `topology/core_cpus_list` (5.3)      | `thread_siblings_list`, then grouping by core_id         |
| `topology/cluster_id` (5.16)         | no cluster information (also for -1 and 0xffff)          |
| `cache/indexK/id` (4.11)             | the cache instance is identified by its shared CPU list  |
| `cache/indexK/shared_cpu_list`       | `shared_cpu_map` (hex), then the CPU alone (when both    |
|                                      | exist and differ, the map: what hwloc and lscpu read)    |
| `sys/devices/cpu_core/cpus` et al.   | `cpuN/cpu_capacity` when present, else no core types     |
| `cpuN/cpu_capacity`                  | capacity unknown (read only when the first online CPU    |
|                                      | has the file; no warning, most x86 kernels lack it)      |

Only L2 and L3 cache directories are read in full (L1 is per core and adds nothing). Offline
CPUs expose no topology, so only online CPUs get a `CPURecord`.
"""

from __future__ import annotations

import os

from corepin.core.cpuset import CPUSet
from corepin.core.errors import SysfsError
from corepin.sysfs.files import SysfsFiles
from corepin.sysfs.records import CacheRecord, CPURecord, CPUSystem

__all__ = ["CORE_TYPE_FILES", "CPU_DIR", "NO_CLUSTER", "read_caches", "read_cpu", "read_cpu_system"]

CPU_DIR = "sys/devices/system/cpu"

#: cluster_id values meaning "no cluster": -1 (arm64), 0xffff (x86 BAD_APICID when the CPU
#: reports no L2 sharing, e.g. in many VMs), 0xffffffff; they are recorded as -1
NO_CLUSTER = frozenset({-1, 0xFFFF, 0xFFFFFFFF})

#: hybrid core kinds and the PMU device file that lists their CPUs (Intel hybrid, Linux >= 5.13)
CORE_TYPE_FILES = {
    "performance": "sys/devices/cpu_core/cpus",
    "efficiency": "sys/devices/cpu_atom/cpus",
}

_join = os.path.join


def _cpu_dirs(names: list[str]) -> dict[int, str]:
    out: dict[int, str] = {}
    for name in names:
        if name.startswith("cpu") and name[3:].isdigit():
            out[int(name[3:])] = name
    return out


def read_cpu_system(files: SysfsFiles, *, cache_levels: tuple[int, ...] = (2, 3)) -> CPUSystem:
    base = files.path(CPU_DIR)
    names = files.listdir(base)
    assert names is not None
    dirs = _cpu_dirs(names)

    present_path = _join(base, "present")
    present = files.cpulist(present_path, required=False)
    if present is None:
        if not dirs:
            raise SysfsError(present_path, "required file is missing and there are no cpuN dirs")
        files.note("present_missing", present_path, "the cpuN directories are the present CPUs")
        present = CPUSet(dirs)

    online_path = _join(base, "online")
    online = files.cpulist(online_path, required=False)
    if online is None:
        if not dirs:
            raise SysfsError(online_path, "required file is missing and there are no cpuN dirs")
        files.note("online_missing", online_path, "reading cpuN/online of every CPU")
        ids = []
        for cpu in present:
            if cpu not in dirs:
                continue
            flag = files.integer(_join(base, dirs[cpu], "online"), required=False)
            if flag is None or flag == 1:
                ids.append(cpu)
        online = CPUSet(ids)
    online = online & present

    possible = files.cpulist(_join(base, "possible"), required=False)
    isolated_path = _join(base, "isolated")
    isolated = files.cpulist(isolated_path, required=False)
    if isolated is None:
        files.note("isolated_missing", isolated_path, "no CPU is isolated")
        isolated = CPUSet()

    core_types: dict[str, CPUSet] = {}
    for kind, rel in CORE_TYPE_FILES.items():
        listed = files.cpulist(files.path(rel), required=False)
        if listed is not None:
            core_types[kind] = listed

    want_capacity = False
    if online:
        first = online.first()
        if first in dirs:
            want_capacity = files.exists(_join(base, dirs[first], "cpu_capacity"))

    records: dict[int, CPURecord] = {}
    for cpu in online:
        name = dirs.get(cpu)
        if name is None:
            path = _join(base, f"cpu{cpu}")
            files.note("cpu_dir_missing", path, "online CPU without a directory is its own core")
            records[cpu] = CPURecord(cpu)
            continue
        records[cpu] = read_cpu(
            files,
            _join(base, name),
            cpu,
            cache_levels=cache_levels,
            capacity=want_capacity,
            online=online,
        )
    return CPUSystem(
        present=present,
        online=online,
        possible=possible,
        isolated=isolated,
        cpus=records,
        core_types=core_types,
    )


def read_cpu(
    files: SysfsFiles,
    cpu_dir: str,
    cpu: int,
    *,
    cache_levels: tuple[int, ...] = (2, 3),
    capacity: bool = False,
    online: CPUSet | None = None,
) -> CPURecord:
    """Read one online CPU's `topology/`, `cache/` and (optionally) `cpu_capacity`; `online`
    (when known) is what cache lists and maps are compared on."""
    topo = _join(cpu_dir, "topology")
    caches = read_caches(files, _join(cpu_dir, "cache"), cpu, levels=cache_levels, online=online)
    cap = files.integer(_join(cpu_dir, "cpu_capacity"), required=False) if capacity else None

    pkg_path = _join(topo, "physical_package_id")
    package = files.integer(pkg_path, required=False)
    if package is None and not files.is_dir(topo):
        files.note("topology_dir_missing", topo, "the CPU is its own core in package 0")
        return CPURecord(cpu, caches=caches, capacity=cap)
    if package is None:
        files.note("physical_package_id_missing", pkg_path, "deriving the package from its CPUs")

    die = files.integer_or_note(
        _join(topo, "die_id"), "die_id_missing", "one die per package (die 0)"
    )
    core_id = files.integer_or_note(_join(topo, "core_id"), "core_id_missing", "core_id unknown")

    sib_path = _join(topo, "core_cpus_list")
    siblings = files.cpulist(sib_path, required=False)
    if siblings is None:
        files.note("core_cpus_list_missing", sib_path, "using thread_siblings_list")
        sib_path = _join(topo, "thread_siblings_list")
        siblings = files.cpulist(sib_path, required=False)
        if siblings is None:
            files.note("thread_siblings_list_missing", sib_path, "grouping SMT siblings by core_id")

    package_cpus = None
    if package is None or package < 0:
        package_cpus = files.cpulist(_join(topo, "package_cpus_list"), required=False)
        if package_cpus is None:
            package_cpus = files.cpulist(_join(topo, "core_siblings_list"), required=False)

    cluster_id = files.integer_or_note(
        _join(topo, "cluster_id"), "cluster_id_missing", "no cluster information"
    )
    cluster_cpus = None
    if cluster_id in NO_CLUSTER:
        cluster_id = -1
    elif cluster_id is not None:
        cluster_cpus = files.cpulist(_join(topo, "cluster_cpus_list"), required=False)

    return CPURecord(
        cpu,
        package=package,
        die=die,
        core_id=core_id,
        cluster_id=cluster_id,
        core_cpus=siblings,
        package_cpus=package_cpus,
        cluster_cpus=cluster_cpus,
        caches=caches,
        capacity=cap,
    )


def read_caches(
    files: SysfsFiles,
    cache_dir: str,
    cpu: int,
    *,
    levels: tuple[int, ...] = (2, 3),
    online: CPUSet | None = None,
) -> tuple[CacheRecord, ...]:
    """The data/unified caches of one CPU at the given levels (instruction caches skipped)."""
    names = files.listdir(cache_dir, required=False)
    if names is None:
        files.note("cache_dir_missing", cache_dir, "no cache information for this CPU")
        return ()
    out: list[CacheRecord] = []
    for name in sorted(names):
        if not (name.startswith("index") and name[5:].isdigit()):
            continue
        index_dir = _join(cache_dir, name)
        level = files.integer(_join(index_dir, "level"))
        assert level is not None
        if level not in levels:
            continue
        kind = files.text(_join(index_dir, "type"), required=False) or "Unified"
        if kind == "Instruction":
            continue
        shared = _shared_cpus(files, index_dir, cpu, online)
        ident = files.integer_or_note(
            _join(index_dir, "id"), "cache_id_missing", "identifying caches by their shared CPUs"
        )
        out.append(CacheRecord(int(name[5:]), level, kind, shared, ident))
    return tuple(out)


def _shared_cpus(files: SysfsFiles, index_dir: str, cpu: int, online: CPUSet | None) -> CPUSet:
    """The CPUs sharing one cache: `shared_cpu_map` and `shared_cpu_list` print the same mask
    on a sound kernel; where both exist and differ on online CPUs (seen on AMD family 15h
    kernels, whose L2 lists named the CPU alone while the maps named its compute unit) the map
    is taken, as hwloc and lscpu read only the map. Either one alone is used as it is; with
    neither, the cache is private to the CPU. Offline CPUs do not count: some kernels keep them
    in one file and not the other."""
    list_path = _join(index_dir, "shared_cpu_list")
    map_path = _join(index_dir, "shared_cpu_map")
    listed = files.cpulist(list_path, required=False)
    masked = files.cpumask(map_path, required=False)
    if listed is not None:
        if masked is None:
            return listed
        seen = (listed & online, masked & online) if online is not None else (listed, masked)
        if seen[0] != seen[1]:
            files.interpret(
                "shared_cpu_list_map_differ",
                list_path,
                f"shared_cpu_list says {seen[0]}, shared_cpu_map says {seen[1]}: using the map "
                "(what hwloc and lscpu read)",
            )
            return masked
        return listed
    files.note("shared_cpu_list_missing", list_path, "using shared_cpu_map")
    if masked is not None:
        return masked
    files.note("shared_cpu_map_missing", map_path, "the cache is private to the CPU")
    return CPUSet.of(cpu)
