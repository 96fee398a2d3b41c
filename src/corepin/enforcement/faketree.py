"""Fake cgroup trees in an ordinary directory, for tests, benchmarks and dry runs.

The drivers run unchanged against them (`fake_tree=True` lets writes create files, seeds new
groups with the files the kernel would show, and makes the v1 driver refuse what the kernel
refuses: a cpuset outside its parent, a parent dropping CPUs a child uses, tasks joining a cpuset
without CPUs or nodes, a CPU burst above the quota). `seed_cpu_files` and `set_cpu_stats` give
a group the cpu controller's accounting and QoS files (what `corepin.enforcement.qos` reads).
"""

from __future__ import annotations

import os
from pathlib import Path

from corepin.core.cpuset import CPUSet
from corepin.enforcement.cgroups import CgroupDriver, CgroupV1, CgroupV2

__all__ = ["make_fake_v1", "make_fake_v2", "seed_cpu_files", "set_cpu_stats"]


def _write(path: Path, value: str) -> None:
    path.write_text(value + "\n", encoding="ascii")


def make_fake_v1(
    base: str | os.PathLike[str],
    *,
    cpus: CPUSet,
    mems: CPUSet,
    separate_cpu_mount: bool = True,
) -> CgroupV1:
    """A v1 layout under `base`: `cpuset/` and `cpu,cpuacct/` (or cpu co-mounted with cpuset)."""
    root = Path(base) / "cpuset"
    root.mkdir(parents=True, exist_ok=True)
    _write(root / "cpuset.cpus", str(cpus))
    _write(root / "cpuset.mems", str(mems))
    _write(root / "cpuset.effective_cpus", str(cpus))
    _write(root / "cpuset.effective_mems", str(mems))
    _write(root / "cgroup.procs", "")
    _write(root / "tasks", "")
    cpu_root = Path(base) / "cpu,cpuacct" if separate_cpu_mount else root
    cpu_root.mkdir(parents=True, exist_ok=True)
    _write(cpu_root / "cpu.cfs_quota_us", "-1")
    _write(cpu_root / "cpu.cfs_period_us", "100000")
    if separate_cpu_mount:
        _write(cpu_root / "cgroup.procs", "")
    return CgroupV1(os.fspath(root), os.fspath(cpu_root), fake_tree=True)


def make_fake_v2(base: str | os.PathLike[str], *, cpus: CPUSet, mems: CPUSet) -> CgroupV2:
    """A v2 unified tree under `base/unified` with cpuset and cpu enabled at the root."""
    root = Path(base) / "unified"
    root.mkdir(parents=True, exist_ok=True)
    _write(root / "cgroup.controllers", "cpuset cpu io memory pids")
    _write(root / "cgroup.subtree_control", "cpuset cpu")
    _write(root / "cpuset.cpus.effective", str(cpus))
    _write(root / "cpuset.mems.effective", str(mems))
    _write(root / "cgroup.procs", "")
    return CgroupV2(os.fspath(root), fake_tree=True)


def _cpu_dirs(driver: CgroupDriver, path: str, cpuacct_root: str | None) -> tuple[Path, Path]:
    if isinstance(driver, CgroupV1):
        if driver.cpu_root is None:
            raise ValueError("the fake v1 tree has no cpu hierarchy")
        cpu = Path(driver.dir(path, driver.cpu_root))
        return cpu, Path(driver.dir(path, cpuacct_root)) if cpuacct_root else cpu
    return Path(driver.dir(path)), Path(driver.dir(path))


def seed_cpu_files(
    driver: CgroupDriver,
    path: str,
    *,
    cpuacct_root: str | None = None,
    burst: bool = True,
    idle: bool = True,
) -> None:
    """Give the fake group `path` (and its directory in `cpuacct_root`, v1, made if missing)
    the files of the cpu controller: zero counters, no burst, not idle; `burst`/`idle` False
    for a kernel without `cpu.cfs_burst_us`/`cpu.max.burst` or `cpu.idle`."""
    cpu, acct = _cpu_dirs(driver, path, cpuacct_root)
    cpu.mkdir(parents=True, exist_ok=True)
    acct.mkdir(parents=True, exist_ok=True)
    set_cpu_stats(driver, path, cpuacct_root=cpuacct_root)
    if burst:
        _write(cpu / ("cpu.cfs_burst_us" if driver.version == 1 else "cpu.max.burst"), "0")
    if idle:
        _write(cpu / "cpu.idle", "0")


def set_cpu_stats(
    driver: CgroupDriver,
    path: str,
    *,
    usage_ns: int = 0,
    nr_periods: int = 0,
    nr_throttled: int = 0,
    throttled_us: int = 0,
    cpuacct_root: str | None = None,
) -> None:
    """Write the fake group's CPU accounting as the kernel shows it (v1: `cpuacct.usage` and
    the cpu mount's `cpu.stat`; v2: `cpu.stat`)."""
    cpu, acct = _cpu_dirs(driver, path, cpuacct_root)
    if driver.version == 1:
        _write(acct / "cpuacct.usage", str(usage_ns))
        lines = [
            f"nr_periods {nr_periods}",
            f"nr_throttled {nr_throttled}",
            f"throttled_time {throttled_us * 1000}",
            "nr_bursts 0",
            "burst_time 0",
        ]
    else:
        lines = [
            f"usage_usec {usage_ns // 1000}",
            f"user_usec {usage_ns // 2000}",
            f"system_usec {usage_ns // 2000}",
            f"nr_periods {nr_periods}",
            f"nr_throttled {nr_throttled}",
            f"throttled_usec {throttled_us}",
            "nr_bursts 0",
            "burst_usec 0",
        ]
    _write(cpu / "cpu.stat", "\n".join(lines))
