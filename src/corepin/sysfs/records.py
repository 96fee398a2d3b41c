"""Typed records of what the kernel exposes under sys/devices/system/{cpu,node}.

These are raw facts, one record per sysfs object, with the kernel's own numbering (which may be
only package-unique, or -1 for "unknown"). Turning them into a consistent machine model is the
job of `corepin.topology.build`, which is pure.
"""

from __future__ import annotations

from collections.abc import Mapping

from corepin.core.cpuset import CPUSet
from corepin.core.record import field, record

__all__ = ["CPURecord", "CPUSystem", "CacheRecord", "NodeRecord", "NodeSystem", "SysfsSnapshot"]


@record
class CacheRecord:
    """One `cpuN/cache/indexK/` directory."""

    index: int
    level: int
    type: str  # "Unified", "Data", "Instruction" as the kernel prints it
    shared_cpus: CPUSet
    id: int | None  # the `id` file; None on kernels before 4.11 or when the firmware gives none


@record
class CPURecord:
    """One `cpuN/` directory of an online CPU (offline CPUs expose no topology)."""

    cpu: int
    package: int | None = None  # physical_package_id (-1 on some platforms = unknown)
    die: int | None = None  # die_id (kernel >= 5.2); None when the file is absent
    core_id: int | None = None  # core_id (package-unique on x86)
    cluster_id: int | None = None  # cluster_id (kernel >= 5.16); -1 = no cluster
    core_cpus: CPUSet | None = None  # core_cpus_list, else thread_siblings_list
    package_cpus: CPUSet | None = None  # package_cpus_list / core_siblings_list, when needed
    cluster_cpus: CPUSet | None = None  # cluster_cpus_list
    caches: tuple[CacheRecord, ...] = ()
    capacity: int | None = None  # cpu_capacity (arm big.LITTLE and similar)


@record
class CPUSystem:
    """sys/devices/system/cpu: the CPU sets and one record per online CPU."""

    present: CPUSet
    online: CPUSet
    possible: CPUSet | None = None
    isolated: CPUSet = field(default_factory=CPUSet)
    cpus: Mapping[int, CPURecord] = field(default_factory=dict)
    #: hybrid PMU CPU lists: "performance" -> sys/devices/cpu_core/cpus,
    #: "efficiency" -> sys/devices/cpu_atom/cpus (empty when the machine is not hybrid)
    core_types: Mapping[str, CPUSet] = field(default_factory=dict)


@record
class NodeRecord:
    """One `node/nodeN/` directory."""

    id: int
    cpus: CPUSet
    distances: Mapping[int, int] = field(default_factory=dict)  # already mapped to node ids
    memory_kb: int | None = None


@record
class NodeSystem:
    """sys/devices/system/node: the NUMA nodes the kernel reports online."""

    nodes: tuple[NodeRecord, ...]
    online: CPUSet | None = None  # node ids in `node/online`, when present
    possible: CPUSet | None = None


@record
class SysfsSnapshot:
    """Everything discovery reads; `nodes` is None on kernels built without NUMA support."""

    root: str
    cpu: CPUSystem
    nodes: NodeSystem | None
