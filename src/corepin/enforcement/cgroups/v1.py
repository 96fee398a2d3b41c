"""cgroup v1: one mount per controller; cpusets in the cpuset hierarchy, CFS quota in the cpu
one (the same mount when they are co-mounted). In a fake tree the driver refuses what the v1
kernel refuses (a cpuset outside its parent, a parent dropping CPUs a child uses, tasks joining
a cpuset without CPUs or nodes, a quota above an ancestor's).
"""

from __future__ import annotations

import errno
import os
import time

from corepin.core.cpuset import CPUSet
from corepin.core.errors import CgroupError, CPUSetParseError
from corepin.core.ids import split_cgroup_path, validate_pid
from corepin.core.record import record
from corepin.enforcement.cgroups.driver import UNPARSEABLE, CgroupDriver, CpuQuota

__all__ = ["CgroupV1"]


@record(frozen=False, slots=False)
class CgroupV1(CgroupDriver):
    """cgroup v1: the cpuset controller at `root`, the cpu controller (quota) at `cpu_root`.

    `cpu_root` may be the same mount as `root` (co-mounted controllers) or None when CFS quota is
    not managed. File names follow the mount: `cpuset.cpus`, or `cpus` with `noprefix`.
    """

    cpu_root: str | None = None

    def __post_init__(self) -> None:
        self.version = 1
        self.root = os.fspath(self.root)
        if self.cpu_root is not None:
            self.cpu_root = os.fspath(self.cpu_root)
        if not os.path.exists(os.path.join(self.root, "cpuset.cpus")) and os.path.exists(
            os.path.join(self.root, "cpus")
        ):
            self.cpus_file, self.mems_file = "cpus", "mems"

    def effective_cpus(self, path: str) -> CPUSet:
        return self._read_set(path, "cpuset.effective_cpus")

    def effective_mems(self, path: str) -> CPUSet:
        return self._read_set(path, "cpuset.effective_mems")

    def has_cpu_controller(self) -> bool:
        return self.cpu_root is not None

    def _cpu_root(self, path: str) -> str:
        if self.cpu_root is None:
            raise CgroupError(
                self.dir(path), "no cpu controller mount is configured", reason="no_cpu_controller"
            )
        return self.cpu_root

    def read_quota(self, path: str) -> CpuQuota:
        quota = self._read_int(path, "cpu.cfs_quota_us")
        period = self._read_int(path, "cpu.cfs_period_us")
        return CpuQuota(None if quota < 0 else quota, period)

    def read_quota_fast(self, path: str, want: CpuQuota) -> CpuQuota | None:
        try:
            quota = self._read_int(path, "cpu.cfs_quota_us")
            period = None
            if want.period_us is not None:
                period = self._read_int(path, "cpu.cfs_period_us")
        except CgroupError as err:
            if err.reason == UNPARSEABLE:
                return None
            raise
        return CpuQuota(None if quota < 0 else quota, period)

    def _read_int(self, path: str, name: str) -> int:
        root = self._cpu_root(path)
        text = self.read_file(path, name, root)
        try:
            return int(text)
        except ValueError as err:
            raise CgroupError(
                os.path.join(self.dir(path, root), name),
                f"unparseable value {text!r}",
                reason=UNPARSEABLE,
            ) from err

    def write_quota(self, path: str, quota: CpuQuota) -> None:
        root = self._cpu_root(path)
        if quota.quota_us is None:
            self.write_file(path, "cpu.cfs_quota_us", "-1", root)
            if quota.period_us is not None:
                self.write_file(path, "cpu.cfs_period_us", str(quota.period_us), root)
            return
        if quota.period_us is not None:
            # The quota must stay >= 1ms for either period: write the period first.
            self.write_file(path, "cpu.cfs_period_us", str(quota.period_us), root)
        self.write_file(path, "cpu.cfs_quota_us", str(quota.quota_us), root)

    def create(self, path: str) -> list[str]:
        """mkdir `path` (and missing ancestors) in the cpuset and cpu hierarchies.

        A new v1 cpuset starts with empty cpus and mems (unless cgroup.clone_children is set):
        tasks could not join, so each new group gets its parent's values, mems first.
        """
        parts = split_cgroup_path(path)
        created: list[str] = []
        for depth in range(1, len(parts) + 1):
            rel = "/".join(parts[:depth])
            if self.cpu_root is not None and self.cpu_root != self.root:
                self._mkdir(rel, self.cpu_root)
            if self._mkdir(rel, self.root):
                created.append(rel)
                if self.fake_tree:
                    self._fake_seed(rel)
                parent = "/".join(parts[: depth - 1])
                for name in (self.mems_file, self.cpus_file):
                    current = self.read_file(rel, name) if self._has(rel, name) else ""
                    if not current:
                        self.write_file(rel, name, self.read_file(parent, name) or "\n")
        return created

    def add_process(self, path: str, pid: int) -> None:
        """Move `pid` into the group in the cpuset hierarchy (and the cpu one when separate)."""
        self.write_file(path, "cgroup.procs", str(validate_pid(pid)))
        cpu_root = self.cpu_root
        if (
            cpu_root is not None
            and cpu_root != self.root
            and os.path.isdir(self.dir(path, cpu_root))
        ):
            self.write_file(path, "cgroup.procs", str(pid), cpu_root)

    def _fake_seed(self, path: str) -> None:
        for name in (self.cpus_file, self.mems_file, "cgroup.procs", "tasks"):
            file = os.path.join(self.dir(path), name)
            if not os.path.exists(file):
                with open(file, "w", encoding="ascii") as handle:
                    handle.write("\n")
        if self.cpu_root is not None:
            base = self.dir(path, self.cpu_root)
            for name, value in (("cpu.cfs_quota_us", "-1"), ("cpu.cfs_period_us", "100000")):
                file = os.path.join(base, name)
                if not os.path.exists(file):
                    with open(file, "w", encoding="ascii") as handle:
                        handle.write(value + "\n")

    def _fake_kernel_check(self, path: str, name: str, value: str) -> int | None:
        """The v1 cpuset rules, so a fake tree refuses what the kernel refuses."""
        parts = split_cgroup_path(path)
        if name == "cpu.cfs_quota_us":
            return self._fake_burst_check(path, int(value), None) or self._fake_quota_check(
                path, int(value)
            )
        if name == "cpu.cfs_burst_us":
            return self._fake_burst_check(path, None, int(value))
        if name in ("cgroup.procs", "tasks"):
            if not self.read_file(path, self.cpus_file) or not self.read_file(path, self.mems_file):
                return errno.ENOSPC
            return None
        if name not in (self.cpus_file, self.mems_file):
            return None
        try:
            new = CPUSet.parse(value)
        except CPUSetParseError:
            return errno.EINVAL
        if not parts:
            return None
        top = CPUSet.parse(self.read_file("", name))
        if not new <= top:
            return errno.EINVAL
        parent = CPUSet.parse(self.read_file("/".join(parts[:-1]), name))
        for child in self.child_groups(path):
            if not CPUSet.parse(self.read_file(child, name)) <= new:
                return errno.EBUSY
        if not new <= parent:
            return errno.EACCES
        if not new and self.procs(path):
            return errno.ENOSPC
        return None

    def _fake_int(self, path: str, name: str, root: str) -> int:
        """An integer file of the fake tree, as the kernel would show it. A fake file is
        truncated before it is written, so a check on another thread may find it empty for an
        instant (a kernel file never is): it is read again then."""
        for _ in range(100):
            text = self.read_file(path, name, root)
            if text:
                return int(text)
            time.sleep(0.001)
        return int(text)

    def _fake_burst_check(self, path: str, quota: int | None, burst: int | None) -> int | None:
        """v1 refuses a burst above a finite quota (either written: the other is read)."""
        root = self.cpu_root
        if root is None or not os.path.exists(
            os.path.join(self.dir(path, root), "cpu.cfs_burst_us")
        ):
            return None
        if quota is None:
            quota = self._fake_int(path, "cpu.cfs_quota_us", root)
        if burst is None:
            burst = self._fake_int(path, "cpu.cfs_burst_us", root)
        return errno.EINVAL if burst < 0 or (quota >= 0 and burst > quota) else None

    def _fake_quota_check(self, path: str, quota: int) -> int | None:
        """v1 refuses a finite quota above an ancestor's, or below a child's (as a ratio)."""
        if quota == -1 or self.cpu_root is None:
            return None
        root = self.cpu_root
        period = self._fake_int(path, "cpu.cfs_period_us", root)
        mine = quota / period
        parts = split_cgroup_path(path)
        for depth in range(len(parts) - 1, -1, -1):
            above = "/".join(parts[:depth])
            theirs = self._fake_int(above, "cpu.cfs_quota_us", root)
            if theirs >= 0:
                if mine > theirs / self._fake_int(above, "cpu.cfs_period_us", root):
                    return errno.EINVAL
                break
        with os.scandir(self.dir(path, root)) as entries:  # (closed when a child vanishes)
            children = [child.name for child in entries if child.is_dir()]
        for name in children:
            rel = "/".join((*parts, name))
            theirs = self._fake_int(rel, "cpu.cfs_quota_us", root)
            if theirs >= 0 and theirs / self._fake_int(rel, "cpu.cfs_period_us", root) > mine:
                return errno.EINVAL
        return None

    def _has(self, path: str, name: str) -> bool:
        return os.path.exists(os.path.join(self.dir(path), name))

    def remove(self, path: str) -> None:
        if not split_cgroup_path(path):
            raise CgroupError(os.fspath(self.root), "refusing to remove the hierarchy root")
        self._rmdir(path, self.root)
        if self.cpu_root is not None and self.cpu_root != self.root:
            self._rmdir(path, self.cpu_root)
