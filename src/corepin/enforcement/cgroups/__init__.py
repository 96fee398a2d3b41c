"""cgroup drivers for v1 (one mount per controller) and v2 (the unified hierarchy).

A driver reads and writes the cpuset and CPU-bandwidth files of cgroups given by a path RELATIVE
to the hierarchy root (`kubepods/burstable/pod<uid>/<id>`). Every relative path is split and
validated by `corepin.core.ids.split_cgroup_path` before any file is touched, so a path holding
`..`, NUL or characters outside the expected alphabet is rejected, never written to.

The mount roots are parameters (`CgroupV1(cpuset_root, cpu_root)`, `CgroupV2(root)`), so the same
code drives a fake tree in a temp dir and the real `/sys/fs/cgroup/cpuset`. `detect_mounts` reads
them from a mountinfo file and `open_cgroups` picks the hierarchy that carries the cpuset
controller.

Kernel errors of writes are mapped to `CgroupError` with a `reason`:

- EBUSY -> cgroup_busy: a child cpuset uses CPUs/nodes the new value drops (shrink children
  first), or rmdir of a group that still has tasks or children.
- ENOSPC -> cgroup_empty_cpuset: tasks cannot join a cpuset whose cpus or mems are empty, or the
  value would leave its tasks without any.
- ERANGE -> cgroup_out_of_range: a CPU or node number beyond what the kernel supports.
- EINVAL -> cgroup_invalid_value: CPUs/nodes not present or online, a malformed value, a quota out
  of range (v1: above the parent's quota).
- EACCES at write -> cgroup_not_within_parent: a v1 cpuset must lie within its parent's.
- EACCES/EPERM/EROFS at open, EPERM at write -> cgroup_permission.

The package: `driver` (the common part, `CpuQuota`, the errno mapping), `v1`, `v2` (with cpuset
partitions), `mounts` (finding the hierarchies); every public name is importable from here.
"""

from corepin.enforcement.cgroups.driver import DEFAULT_PERIOD_US, CgroupDriver, CpuQuota
from corepin.enforcement.cgroups.mounts import (
    DEFAULT_CGROUP_ROOT,
    CgroupMounts,
    detect_mounts,
    is_cgroup_mount,
    open_cgroups,
    open_cpuset_hierarchy,
)
from corepin.enforcement.cgroups.v1 import CgroupV1
from corepin.enforcement.cgroups.v2 import PARTITION_MODES, CgroupV2, PartitionState

__all__ = [
    "DEFAULT_CGROUP_ROOT",
    "DEFAULT_PERIOD_US",
    "PARTITION_MODES",
    "CgroupDriver",
    "CgroupMounts",
    "CgroupV1",
    "CgroupV2",
    "CpuQuota",
    "PartitionState",
    "detect_mounts",
    "is_cgroup_mount",
    "open_cgroups",
    "open_cpuset_hierarchy",
]
