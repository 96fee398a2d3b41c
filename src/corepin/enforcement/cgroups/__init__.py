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
partitions), and here where the hierarchies are (`detect_mounts`, `open_cgroups`,
`open_cpuset_hierarchy`: below a `--cgroup-root` however that is reached - the mount itself, a
bind mount, a symlink, or a plain directory tree standing in for one). Every public name is
importable from here. (Four modules, not more: `corepin run` loads them all on its way.)
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from corepin.core.errors import CgroupError, CorepinError
from corepin.core.record import record
from corepin.enforcement.cgroups.driver import (
    DEFAULT_PERIOD_US,
    CgroupDriver,
    CpuQuota,
    read_text,
)
from corepin.enforcement.cgroups.v1 import CgroupV1
from corepin.enforcement.cgroups.v2 import PARTITION_MODES, CgroupV2, PartitionState
from corepin.sysfs.procfs import read_mountinfo

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
    "find_v1_controller",
    "is_cgroup_mount",
    "open_cgroups",
    "open_cpuset_hierarchy",
]


@record
class CgroupMounts:
    """Where the cgroup hierarchies are mounted: v1 controller -> mount point, and v2."""

    v1: Mapping[str, str]
    unified: str | None
    unified_controllers: frozenset[str] = frozenset()

    @property
    def cpuset_version(self) -> int | None:
        """Which hierarchy carries the cpuset controller (v1 wins: a controller is in one)."""
        if "cpuset" in self.v1:
            return 1
        if self.unified is not None and "cpuset" in self.unified_controllers:
            return 2
        return None


def detect_mounts(mountinfo: str | os.PathLike[str] = "/proc/self/mountinfo") -> CgroupMounts:
    """Find the cgroup mounts listed in a mountinfo file (first mount of each controller)."""
    v1: dict[str, str] = {}
    unified: str | None = None
    for mount in read_mountinfo(mountinfo, fstypes=("cgroup", "cgroup2")):
        if mount.fstype == "cgroup2" and unified is None:
            unified = mount.mount_point
        elif mount.fstype == "cgroup":
            for controller in mount.cgroup_controllers:
                v1.setdefault(controller, mount.mount_point)
    controllers: frozenset[str] = frozenset()
    if unified is not None:
        try:
            controllers = frozenset(read_text(os.path.join(unified, "cgroup.controllers")).split())
        except OSError:
            controllers = frozenset()
    return CgroupMounts(v1, unified, controllers)


def open_cgroups(
    mounts: CgroupMounts | None = None,
    *,
    mountinfo: str | os.PathLike[str] = "/proc/self/mountinfo",
    version: int | None = None,
) -> CgroupDriver:
    """The driver for the hierarchy that carries the cpuset controller (or `version`)."""
    found = mounts if mounts is not None else detect_mounts(mountinfo)
    want = version or found.cpuset_version
    if want == 1 and "cpuset" in found.v1:
        return CgroupV1(found.v1["cpuset"], found.v1.get("cpu"))
    if want == 2 and found.unified is not None:
        return CgroupV2(found.unified)
    raise CgroupError(
        os.fspath(mountinfo),
        "no cgroup hierarchy with the cpuset controller is mounted"
        + (f" (asked for cgroup v{version})" if version else "")
        + ": mount cgroup v1 cpuset or enable cpuset in cgroup v2",
        reason="no_cpuset_hierarchy",
    )


#: Where cgroup hierarchies are mounted unless told otherwise.
DEFAULT_CGROUP_ROOT = "/sys/fs/cgroup"


def is_cgroup_mount(path: str | os.PathLike[str], mountinfo: str = "/proc/self/mountinfo") -> bool:
    """Whether `path` is itself the mount point of a cgroup (v1 or v2) file system."""
    target = os.path.realpath(path)
    try:
        mounts = read_mountinfo(mountinfo)
    except CorepinError:
        return False
    return any(m.mount_point == target and m.fstype in ("cgroup", "cgroup2") for m in mounts)


def _v1_controller_dirs(root: str, mountinfo: str) -> dict[str, str]:
    """v1 controller -> its hierarchy's directory below `root` (symlinks resolved): the cgroup
    mounts mountinfo lists right below `root` as reached from here (a bind mount of the host's
    /sys/fs/cgroup lists its own copies of them), then the directories (and symlinks such as
    `cpu -> cpu,cpuacct`) right below `root`, named after the controllers they carry."""
    found: dict[str, str] = {}
    real = os.path.realpath(root)
    try:
        mounts = read_mountinfo(mountinfo)
    except CorepinError:
        mounts = []
    for mount in mounts:
        if mount.fstype == "cgroup" and os.path.dirname(mount.mount_point) == real:
            for controller in mount.cgroup_controllers:
                found.setdefault(controller, mount.mount_point)
    try:
        entries = sorted(os.listdir(root))
    except OSError:
        entries = []
    for entry in entries:
        target = os.path.realpath(os.path.join(root, entry))
        if not os.path.isdir(target):
            continue
        for controller in (*entry.split(","), *os.path.basename(target).split(",")):
            if controller:
                found.setdefault(controller, target)
    return found


def find_v1_controller(
    controller: str,
    cgroup_root: str | os.PathLike[str] = DEFAULT_CGROUP_ROOT,
    *,
    mountinfo: str = "/proc/self/mountinfo",
) -> str | None:
    """Where the v1 hierarchy carrying `controller` (`cpuacct`, say) is below `cgroup_root`: at
    the default root its mount point from mountinfo (its own mount, or one shared with others
    such as `cpu,cpuacct`); below another root (a bind mount, a symlink, a tree standing in for
    cgroupfs) the directory named after it. None where there is none."""
    root = os.fspath(cgroup_root).rstrip("/") or "/"
    if root == DEFAULT_CGROUP_ROOT:
        try:
            return detect_mounts(mountinfo).v1.get(controller)
        except CorepinError:
            return None
    return _v1_controller_dirs(root, mountinfo).get(controller)


def open_cpuset_hierarchy(
    cgroup_root: str | os.PathLike[str] = DEFAULT_CGROUP_ROOT,
    *,
    mountinfo: str = "/proc/self/mountinfo",
) -> CgroupDriver:
    """The driver of the cpuset hierarchy below `cgroup_root` (`--cgroup-root`):
    at the default root the mounted hierarchy found in /proc/self/mountinfo (v1 or v2); else,
    when there is no `cpuset` below it but a `cgroup.controllers` file in it, `cgroup_root`
    itself as cgroup v2 (a cgroup2 mount, or a tree standing in for one); else cgroup v1 with
    each controller found below the root, however the root is reached (a bind mount such as a
    DaemonSet's /host/sys/fs/cgroup, a symlink): `<root>/cpuset` for cpusets, and for CFS quota
    the hierarchy carrying `cpu` - `<root>/cpu`, the combined `cpu,cpuacct` mount, or a symlink
    to it - that holds `cpu.cfs_quota_us`. A plain directory tree standing in for cgroupfs
    (tests, dry runs) is driven with `fake_tree`, so the kernel's rules still apply."""
    root = os.fspath(cgroup_root).rstrip("/") or "/"
    if root == DEFAULT_CGROUP_ROOT:
        return open_cgroups()
    cpuset = os.path.join(root, "cpuset")
    if not os.path.isdir(cpuset) and os.path.isfile(os.path.join(root, "cgroup.controllers")):
        # a cgroup v2 root: a cgroup2 mount, or a directory tree standing in for one
        return CgroupV2(root, fake_tree=not is_cgroup_mount(root, mountinfo))
    dirs = _v1_controller_dirs(root, mountinfo)
    if not os.path.isdir(cpuset) and "cpuset" in dirs:
        cpuset = dirs["cpuset"]
    cpu = dirs.get("cpu")
    if cpu is not None and not os.path.isfile(os.path.join(cpu, "cpu.cfs_quota_us")):
        cpu = None  # (a kernel without CFS bandwidth control: quota is not managed)
    if (cpu is None and os.path.isfile(os.path.join(cpuset, "cpu.cfs_quota_us"))) or (
        cpu is not None and os.path.realpath(cpu) == os.path.realpath(cpuset)
    ):
        cpu = cpuset  # co-mounted with cpuset
    fake = os.path.isdir(cpuset) and not is_cgroup_mount(cpuset, mountinfo)
    return CgroupV1(cpuset, cpu, fake_tree=fake)
