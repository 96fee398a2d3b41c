"""`CpuControl` on fake cgroup trees laid out as v1 (cpu and cpuacct mounted apart, and
co-mounted) and v2: accounting, throttling, burst clamped and read back, cpu.idle; the
node's busy time from /proc/stat; finding the cpuacct hierarchy."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from corepin.core.cpuset import CPUSet
from corepin.core.errors import CgroupError, CorepinError
from corepin.enforcement.cgroups import CgroupDriver, CgroupV1, CpuQuota
from corepin.enforcement.faketree import make_fake_v1, make_fake_v2, seed_cpu_files, set_cpu_stats
from corepin.enforcement.qos import CpuControl, Throttling, find_cpuacct_root, node_busy_ns

ALL = CPUSet.parse("0-3")
GROUP = "besteffort/pod1"


class Tree:
    """A fake tree of one layout with the group GROUP carrying the cpu files."""

    def __init__(self, base: Path, layout: str) -> None:
        self.acct: str | None = None
        driver: CgroupDriver
        if layout == "v2":
            driver = make_fake_v2(base, cpus=ALL, mems=CPUSet.of(0))
        else:
            driver = make_fake_v1(base, cpus=ALL, mems=CPUSet.of(0))
            if layout == "v1-apart":
                self.acct = str(base / "cpuacct")
                os.makedirs(self.acct)
            else:
                assert isinstance(driver, CgroupV1) and driver.cpu_root is not None
                Path(driver.cpu_root, "cpuacct.usage").write_text("0\n")
        driver.create(GROUP)
        seed_cpu_files(driver, GROUP, cpuacct_root=self.acct)
        self.driver = driver
        self.cpu = CpuControl(driver, self.acct)

    def stats(self, **kw: int) -> None:
        set_cpu_stats(self.driver, GROUP, cpuacct_root=self.acct, **kw)


@pytest.fixture(params=["v1-apart", "v1-comounted", "v2"])
def tree(request: pytest.FixtureRequest, tmp_path: Path) -> Tree:
    return Tree(tmp_path, request.param)


def test_usage_and_throttling_are_read_in_the_units_of_each_version(tree: Tree) -> None:
    tree.stats(usage_ns=5_000_000_000, nr_periods=40, nr_throttled=7, throttled_us=1500)
    assert tree.cpu.usage_ns(GROUP) == 5_000_000_000
    assert tree.cpu.throttling(GROUP) == Throttling(40, 7, 1500)


def test_a_group_that_is_not_there_reads_as_none(tree: Tree) -> None:
    assert tree.cpu.usage_ns("besteffort/gone") is None
    assert tree.cpu.throttling("besteffort/gone") is None
    assert tree.cpu.read_burst_us("besteffort/gone") is None
    assert tree.cpu.read_idle("besteffort/gone") is None
    assert tree.cpu.read_quota("besteffort/gone") is None


def test_v1_usage_comes_from_the_cpuacct_hierarchy_not_the_cpu_one(tmp_path: Path) -> None:
    t = Tree(tmp_path, "v1-apart")
    assert t.acct is not None
    t.stats(usage_ns=123)
    assert Path(t.acct, GROUP, "cpuacct.usage").read_text().strip() == "123"
    assert t.cpu.usage_ns(GROUP) == 123
    # without the cpuacct hierarchy (and a cpu mount without cpuacct.usage) there is no usage
    assert CpuControl(t.driver).usage_ns(GROUP) is None


def test_the_burst_is_clamped_to_the_quota_and_read_back(tree: Tree) -> None:
    tree.cpu.write_quota(GROUP, CpuQuota(50_000, 100_000))
    assert tree.cpu.write_burst_us(GROUP, 400_000) == 50_000
    assert tree.cpu.read_burst_us(GROUP) == 50_000
    assert tree.cpu.write_burst_us(GROUP, 20_000) == 20_000
    assert tree.cpu.write_burst_us(GROUP, -5) == 0
    # with an unlimited quota nothing clamps it (current kernels take it)
    tree.cpu.write_quota(GROUP, CpuQuota.unlimited())
    assert tree.cpu.write_burst_us(GROUP, 300_000) == 300_000


def test_the_fake_kernel_refuses_a_quota_below_the_burst_as_the_kernel_does(tree: Tree) -> None:
    tree.cpu.write_quota(GROUP, CpuQuota(80_000, 100_000))
    assert tree.cpu.write_burst_us(GROUP, 80_000) == 80_000
    with pytest.raises(CgroupError) as info:
        tree.cpu.write_quota(GROUP, CpuQuota(40_000, 100_000))
    assert info.value.reason == "cgroup_invalid_value"


class OldKernelV1(CgroupV1):
    """A v1 kernel that refuses any burst while the quota is unlimited (EINVAL), as some
    versions do."""

    def _fake_kernel_check(self, path: str, name: str, value: str) -> int | None:
        if name == "cpu.cfs_burst_us" and int(value) > 0:
            assert self.cpu_root is not None
            if int(self.read_file(path, "cpu.cfs_quota_us", self.cpu_root)) < 0:
                return errno.EINVAL
        return super()._fake_kernel_check(path, name, value)


def test_a_refused_burst_is_not_raised_the_value_held_comes_back(tmp_path: Path) -> None:
    made = make_fake_v1(tmp_path, cpus=ALL, mems=CPUSet.of(0))
    assert made.cpu_root is not None
    driver = OldKernelV1(made.root, made.cpu_root, fake_tree=True)
    driver.create(GROUP)
    seed_cpu_files(driver, GROUP)
    cpu = CpuControl(driver)
    assert cpu.write_burst_us(GROUP, 10_000) == 0  # refused: the old value stays
    cpu.write_quota(GROUP, CpuQuota(30_000, 100_000))
    assert cpu.write_burst_us(GROUP, 10_000) == 10_000


def test_a_kernel_without_burst_raises_on_write_and_reads_none(tmp_path: Path) -> None:
    driver = make_fake_v2(tmp_path, cpus=ALL, mems=CPUSet.of(0))
    driver.create(GROUP)
    seed_cpu_files(driver, GROUP, burst=False, idle=False)
    cpu = CpuControl(driver)
    assert cpu.read_burst_us(GROUP) is None
    with pytest.raises(CgroupError):
        cpu.write_burst_us(GROUP, 1000)
    assert not Path(driver.dir(GROUP), "cpu.max.burst").exists()  # nothing made up
    assert cpu.read_idle(GROUP) is None
    assert cpu.set_idle(GROUP, True) is False
    assert not Path(driver.dir(GROUP), "cpu.idle").exists()


def test_idle_is_set_and_cleared_writing_only_when_it_differs(tree: Tree) -> None:
    assert tree.cpu.read_idle(GROUP) is False
    before = tree.driver.writes
    assert tree.cpu.set_idle(GROUP, True) is True
    assert tree.cpu.read_idle(GROUP) is True
    assert tree.cpu.set_idle(GROUP, True) is True
    assert tree.driver.writes == before + 1
    assert tree.cpu.set_idle(GROUP, False) is True
    assert tree.cpu.read_idle(GROUP) is False


def _proc_stat(root: Path, cpu_line: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "stat").write_text(f"{cpu_line}\ncpu0 1 2 3 4 5 6 7 8 0 0\nintr 1 2\n")
    return root


def test_node_busy_time_leaves_out_idle_and_iowait(tmp_path: Path) -> None:
    hz = os.sysconf("SC_CLK_TCK")
    # user nice system idle iowait irq softirq steal guest guest_nice
    root = _proc_stat(tmp_path / "proc", "cpu  100 10 50 9000 40 5 5 30 20 0")
    busy_ticks = 100 + 10 + 50 + 5 + 5 + 30
    assert node_busy_ns(root) == busy_ticks * 1_000_000_000 // hz


def test_node_busy_time_refuses_a_file_without_the_cpu_line(tmp_path: Path) -> None:
    root = tmp_path / "proc"
    root.mkdir()
    (root / "stat").write_text("intr 1 2\n")
    with pytest.raises(CorepinError, match="no `cpu` line"):
        node_busy_ns(root)
    with pytest.raises(CorepinError, match="cannot read"):
        node_busy_ns(tmp_path / "nothing")


def test_the_real_node_was_busy_for_less_than_all_its_cpus_since_boot() -> None:
    busy = node_busy_ns("/proc")
    uptime = float(Path("/proc/uptime").read_text().split()[0])
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
    online = max(cpus, os.cpu_count() or 1)
    assert 0 < busy <= uptime * online * 1e9 * 1.01


def test_the_cpuacct_hierarchy_is_found_in_mountinfo_and_below_another_root(
    tmp_path: Path,
) -> None:
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(
        "32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n"
        "33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct\n"
    )
    assert find_cpuacct_root(mountinfo=str(mountinfo)) == "/sys/fs/cgroup/cpuacct"
    comounted = tmp_path / "mountinfo2"
    comounted.write_text(
        "32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct\n"
    )
    assert find_cpuacct_root(mountinfo=str(comounted)) == "/sys/fs/cgroup/cpu,cpuacct"
    # below a bind-mounted root: the directory named after it, or cpu,cpuacct behind a link
    host = tmp_path / "host"
    (host / "cpu,cpuacct").mkdir(parents=True)
    (host / "cpuset").mkdir()
    os.symlink("cpu,cpuacct", host / "cpuacct")
    found = find_cpuacct_root(host, mountinfo=str(mountinfo))
    assert found == str((host / "cpu,cpuacct").resolve())
    assert find_cpuacct_root(tmp_path / "empty", mountinfo=str(mountinfo)) is None
