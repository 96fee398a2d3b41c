"""Fake cgroup trees in an ordinary directory, for tests, benchmarks and dry runs.

The drivers run unchanged against them (`fake_tree=True` lets writes create files, seeds new
groups with the files the kernel would show, and makes the v1 driver refuse what the kernel
refuses: a cpuset outside its parent, a parent dropping CPUs a child uses, tasks joining a cpuset
without CPUs or nodes).
"""

from __future__ import annotations

import os
from pathlib import Path

from corepin.core.cpuset import CPUSet
from corepin.enforcement.cgroups import CgroupV1, CgroupV2

__all__ = ["make_fake_v1", "make_fake_v2"]


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
