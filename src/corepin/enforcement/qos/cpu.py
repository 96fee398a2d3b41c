"""CPU accounting and the cpu controller's QoS files of one cgroup, on cgroup v1 and v2.

| what              | v1                                         | v2                        |
|-------------------|--------------------------------------------|---------------------------|
| usage             | `cpuacct.usage` (ns), the cpuacct mount    | `cpu.stat` usage_usec     |
| throttling        | `cpu.stat` nr_periods, nr_throttled,       | `cpu.stat` nr_periods,    |
|                   | throttled_time (ns), the cpu mount         | nr_throttled, throttled_usec |
| quota             | `cpu.cfs_quota_us`/`cpu.cfs_period_us`     | `cpu.max`                 |
| burst allowance   | `cpu.cfs_burst_us`                         | `cpu.max.burst`           |
| idle scheduling   | `cpu.idle` (kernels from 5.15)             | `cpu.idle`                |

Many v1 hosts mount `cpu,cpuacct` together, others (this project's test host) separately: the
cpuacct hierarchy is a parameter (`find_cpuacct_root` finds it), and without one the cpu mount
is used when it carries `cpuacct.usage`.

The kernel refuses a burst above the quota in force (EINVAL), and some versions refuse any
burst while the quota is unlimited: `write_burst_us` clamps to the quota first, writes, and
returns what the kernel holds afterwards (read back), so a refusal is reported, never raised.

`node_busy_ns` is the whole node's non-idle time from `/proc/stat`.
"""

from __future__ import annotations

import os
from typing import Final

from corepin.core.errors import CgroupError, CorepinError
from corepin.core.record import record
from corepin.enforcement.cgroups import (
    DEFAULT_CGROUP_ROOT,
    CgroupDriver,
    CgroupV1,
    CpuQuota,
    find_v1_controller,
)

__all__ = ["CpuControl", "Throttling", "find_cpuacct_root", "node_busy_ns"]

#: the errors a write of a QoS value may meet that mean "the kernel did not take it"
_REFUSED: Final = ("cgroup_invalid_value", "cgroup_out_of_range", "cgroup_write_failed")


@record
class Throttling:
    """A group's CFS bandwidth counters: periods with runnable tasks, periods in which the group
    was throttled, and the time it spent throttled (µs). All only grow."""

    nr_periods: int
    nr_throttled: int
    throttled_us: int


def find_cpuacct_root(
    cgroup_root: str | os.PathLike[str] = DEFAULT_CGROUP_ROOT,
    *,
    mountinfo: str = "/proc/self/mountinfo",
) -> str | None:
    """The v1 cpuacct hierarchy below `cgroup_root` (its own mount or `cpu,cpuacct`), None
    where there is none (cgroup v2, or no cpuacct)."""
    return find_v1_controller("cpuacct", cgroup_root, mountinfo=mountinfo)


def node_busy_ns(proc_root: str | os.PathLike[str] = "/proc") -> int:
    """Non-idle time of every CPU of the node since boot, in ns: the `cpu` line of /proc/stat
    less idle and iowait (guest time is already part of user time). Raises CorepinError when
    the file cannot be read or parsed."""
    path = os.path.join(os.fspath(proc_root), "stat")
    try:
        with open(path, encoding="ascii") as handle:
            first = handle.readline().split()
    except OSError as err:
        raise CorepinError(f"{path}: cannot read: {err.strerror or err}") from err
    try:
        if not first or first[0] != "cpu":
            raise ValueError(first[:1])
        ticks = [int(x) for x in first[1:]]
    except ValueError:
        raise CorepinError(f"{path}: no `cpu` line to read the node's CPU time from") from None
    # user nice system idle iowait irq softirq steal [guest guest_nice]
    busy = sum(ticks[:8]) - sum(ticks[3:5])
    hz = os.sysconf("SC_CLK_TCK")
    return busy * 1_000_000_000 // hz


def _stat_fields(text: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        try:
            out[key] = int(value.strip())
        except ValueError:
            continue
    return out


class CpuControl:
    """CPU accounting and the QoS files of the cpu controller through `driver` (v1: its
    `cpu_root`; `cpuacct_root` the cpuacct hierarchy when it is mounted apart)."""

    def __init__(self, driver: CgroupDriver, cpuacct_root: str | None = None) -> None:
        self.driver = driver
        self.version = driver.version
        self.cpu_root: str | None = None
        self.cpuacct_root: str | None = None
        if isinstance(driver, CgroupV1):
            self.cpu_root = driver.cpu_root
            if cpuacct_root is not None:
                self.cpuacct_root = os.fspath(cpuacct_root)
            elif self.cpu_root is not None and os.path.exists(
                os.path.join(self.cpu_root, "cpuacct.usage")
            ):
                self.cpuacct_root = self.cpu_root  # co-mounted cpu,cpuacct
        else:
            self.cpu_root = driver.root
        #: `cpu.stat` of each group read in the period under way (v2 keeps usage and
        #: throttling in the one file: a period reads it once per group); None: no period is
        #: under way, every read goes to the file
        self._stats: dict[str, dict[str, int] | None] | None = None

    def begin_period(self) -> None:
        """From now until `end_period`, read each group's `cpu.stat` once."""
        self._stats = {}

    def end_period(self) -> None:
        self._stats = None

    # ------------------------------------------------------------------ reading
    def _read(self, path: str, name: str, root: str | None) -> str | None:
        """A file of the group, None when the group or the file is not there."""
        if root is None:
            return None
        try:
            return self.driver.read_file(path, name, root)
        except CgroupError as err:
            if err.reason == "cgroup_missing":
                return None
            raise

    def _stat(self, path: str) -> dict[str, int] | None:
        if self._stats is not None and path in self._stats:
            return self._stats[path]
        text = self._read(path, "cpu.stat", self.cpu_root)
        stat = None if text is None else _stat_fields(text)
        if self._stats is not None:
            self._stats[path] = stat
        return stat

    def usage_ns(self, path: str) -> int | None:
        """CPU time the group's tasks used (ns, all CPUs, since the group exists); None when
        the group or its accounting is not there."""
        if self.version == 1:
            text = self._read(path, "cpuacct.usage", self.cpuacct_root)
            try:
                return None if text is None else int(text)
            except ValueError:
                return None
        stat = self._stat(path)
        if stat is None or "usage_usec" not in stat:
            return None
        return stat["usage_usec"] * 1000

    def throttling(self, path: str) -> Throttling | None:
        """The group's throttling counters; None when the group or its `cpu.stat` counters are
        not there (v2: the cpu controller is not enabled for it)."""
        stat = self._stat(path)
        if stat is None:
            return None
        throttled_us = stat.get("throttled_usec")
        if throttled_us is None and "throttled_time" in stat:
            throttled_us = stat["throttled_time"] // 1000
        if throttled_us is None or "nr_periods" not in stat or "nr_throttled" not in stat:
            return None
        return Throttling(stat["nr_periods"], stat["nr_throttled"], throttled_us)

    # ------------------------------------------------------------------ quota
    def read_quota(self, path: str) -> CpuQuota | None:
        """The group's CFS quota; None when there is no cpu controller or no such group."""
        if not self.driver.has_cpu_controller():
            return None
        try:
            return self.driver.read_quota(path)
        except CgroupError as err:
            if err.reason == "cgroup_missing":
                return None
            raise

    def write_quota(self, path: str, quota: CpuQuota) -> None:
        self.driver.write_quota(path, quota)

    # ------------------------------------------------------------------ burst
    @property
    def burst_file(self) -> str:
        return "cpu.cfs_burst_us" if self.version == 1 else "cpu.max.burst"

    def read_burst_us(self, path: str) -> int | None:
        """The group's burst allowance (µs); None when the kernel has none (before 5.14) or
        the group is not there."""
        text = self._read(path, self.burst_file, self.cpu_root)
        try:
            return None if text is None else int(text)
        except ValueError:
            return None

    def write_burst_us(self, path: str, us: int) -> int:
        """Set the burst allowance to `us`, clamped to the quota in force, and return what the
        kernel holds afterwards. A value the kernel refuses leaves the old one, which is what
        comes back; a kernel without burst, or a group that is gone, raises CgroupError."""
        if self.read_burst_us(path) is None:
            raise CgroupError(
                os.path.join(self.driver.dir(path, self.cpu_root), self.burst_file),
                "the kernel has no CPU burst here (Linux 5.14 or later) or the group is gone",
                reason="cgroup_missing",
            )
        want = max(0, us)
        quota = self.read_quota(path)
        if quota is not None and quota.quota_us is not None:
            want = min(want, quota.quota_us)
        try:
            self.driver.write_file(path, self.burst_file, str(want), self.cpu_root)
        except CgroupError as err:
            if err.reason not in _REFUSED:
                raise
        held = self.read_burst_us(path)
        if held is None:
            raise CgroupError(
                os.path.join(self.driver.dir(path, self.cpu_root), self.burst_file),
                "vanished while it was written (cgroup removed?)",
                reason="cgroup_missing",
            )
        return held

    # ------------------------------------------------------------------ idle
    def read_idle(self, path: str) -> bool | None:
        """Whether the group is SCHED_IDLE (`cpu.idle`); None where the kernel has no such
        file (before 5.15, the v2 root) or the group is not there."""
        text = self._read(path, "cpu.idle", self.cpu_root)
        if text is None:
            return None
        return text.strip() == "1"

    def set_idle(self, path: str, on: bool) -> bool:
        """Make the group SCHED_IDLE (or not). True when its `cpu.idle` holds `on` afterwards;
        False where the kernel has no `cpu.idle` or refused it. Writes only when it differs."""
        now = self.read_idle(path)
        if now is None:
            return False
        if now != on:
            try:
                self.driver.write_file(path, "cpu.idle", "1" if on else "0", self.cpu_root)
            except CgroupError as err:
                if err.reason not in _REFUSED:
                    raise
                return False
        return self.read_idle(path) == on
