"""cgroup v1/v2 drivers on fake trees: reads, writes, group lifecycle, errno mapping, detection."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from corepin.core.cpuset import CPUSet
from corepin.core.errors import CgroupError, EnvironmentProblem
from corepin.core.ids import IdError
from corepin.enforcement.cgroups import (
    CgroupV1,
    CgroupV2,
    CpuQuota,
    detect_mounts,
    open_cgroups,
)
from corepin.enforcement.cgroups.driver import write_error
from corepin.enforcement.faketree import make_fake_v1, make_fake_v2

ALL = CPUSet.parse("0-7")
NODES = CPUSet.parse("0-1")


@pytest.fixture
def v1(tmp_path: Path) -> CgroupV1:
    return make_fake_v1(tmp_path, cpus=ALL, mems=NODES)


@pytest.fixture
def v2(tmp_path: Path) -> CgroupV2:
    return make_fake_v2(tmp_path, cpus=ALL, mems=NODES)


def test_v1_new_groups_inherit_parent_cpus_and_mems_so_tasks_can_join(v1: CgroupV1) -> None:
    created = v1.create("kubepods/burstable/pod1")
    assert created == ["kubepods", "kubepods/burstable", "kubepods/burstable/pod1"]
    assert v1.read_cpus("kubepods/burstable/pod1") == ALL
    assert v1.read_mems("kubepods/burstable/pod1") == NODES
    v1.add_process("kubepods/burstable/pod1", 4321)
    assert v1.procs("kubepods/burstable/pod1") == [4321]
    assert v1.create("kubepods/burstable/pod1") == [], "creating an existing group is a no-op"


def test_v1_quota_lives_in_the_cpu_hierarchy(v1: CgroupV1) -> None:
    v1.create("g")
    assert v1.read_quota("g") == CpuQuota(None, 100000)
    v1.write_quota("g", CpuQuota.for_cpus(1.5, 50000))
    assert v1.read_quota("g") == CpuQuota(75000, 50000)
    assert v1.cpu_root is not None
    assert (Path(v1.cpu_root) / "g" / "cpu.cfs_quota_us").read_text().strip() == "75000"
    v1.write_quota("g", CpuQuota.unlimited())
    assert v1.read_quota("g").is_unlimited


def test_v1_refuses_a_child_outside_its_parent_with_a_clear_reason(v1: CgroupV1) -> None:
    v1.create("parent/child")
    v1.write_cpus("parent/child", CPUSet.parse("0-1"))
    v1.write_cpus("parent", CPUSet.parse("0-3"))
    with pytest.raises(CgroupError) as info:
        v1.write_cpus("parent/child", CPUSet.parse("4"))
    assert info.value.reason == "cgroup_not_within_parent"
    assert "parent/child/cpuset.cpus" in str(info.value)
    assert isinstance(info.value, EnvironmentProblem) and info.value.exit_code == 4


def test_v1_refuses_to_shrink_a_parent_that_a_child_uses(v1: CgroupV1) -> None:
    v1.create("parent/child")
    v1.write_cpus("parent/child", CPUSet.parse("2"))
    with pytest.raises(CgroupError) as info:
        v1.write_cpus("parent", CPUSet.parse("0-1"))
    assert info.value.reason == "cgroup_busy"
    assert "shrink children first" in str(info.value)


def test_v1_refuses_tasks_in_a_cpuset_without_memory_nodes(v1: CgroupV1) -> None:
    v1.create("g")
    v1.write_mems("g", CPUSet())
    with pytest.raises(CgroupError) as info:
        v1.add_process("g", 77)
    assert info.value.reason == "cgroup_empty_cpuset"
    assert "cpuset.mems" in str(info.value)


def test_v1_refuses_cpus_the_machine_does_not_have(v1: CgroupV1) -> None:
    v1.create("g")
    with pytest.raises(CgroupError) as info:
        v1.write_cpus("g", CPUSet.parse("8-9"))
    assert info.value.reason == "cgroup_invalid_value"


@pytest.mark.parametrize(
    ("code", "at_open", "reason"),
    [
        pytest.param(errno.EBUSY, False, "cgroup_busy", id="EBUSY means a child or task blocks"),
        pytest.param(errno.ENOSPC, False, "cgroup_empty_cpuset", id="ENOSPC means empty cpuset"),
        pytest.param(errno.ERANGE, False, "cgroup_out_of_range", id="ERANGE means id too large"),
        pytest.param(errno.EINVAL, False, "cgroup_invalid_value", id="EINVAL means bad value"),
        pytest.param(
            errno.EACCES,
            False,
            "cgroup_not_within_parent",
            id="EACCES at write means outside the parent",
        ),
        pytest.param(
            errno.EACCES, True, "cgroup_permission", id="EACCES at open means no permission"
        ),
        pytest.param(errno.EPERM, False, "cgroup_permission", id="EPERM means not permitted"),
        pytest.param(errno.EIO, False, "cgroup_write_failed", id="other errnos stay generic"),
    ],
)
def test_errno_mapping(code: int, at_open: bool, reason: str) -> None:
    err = write_error("/x/cpuset.cpus", "3", OSError(code, "boom"), at_open=at_open)
    assert err.reason == reason
    assert "/x/cpuset.cpus" in str(err)


def test_remove_refuses_a_group_with_tasks_and_removes_an_empty_one(v1: CgroupV1) -> None:
    v1.create("a/b")
    v1.add_process("a/b", 99)
    with pytest.raises(CgroupError) as info:
        v1.remove("a")
    assert info.value.reason == "cgroup_busy"
    with pytest.raises(CgroupError):
        v1.remove("a/b")
    assert v1.cpu_root is not None
    assert (Path(v1.cpu_root) / "a" / "b" / "cgroup.procs").read_text().split() == ["99"]
    (Path(v1.root) / "a" / "b" / "cgroup.procs").write_text("")
    (Path(v1.cpu_root) / "a" / "b" / "cgroup.procs").write_text("")
    v1.remove("a/b")
    v1.remove("a")
    assert not v1.exists("a")
    assert v1.cpu_root is not None and not (Path(v1.cpu_root) / "a").exists()
    with pytest.raises(CgroupError, match="root"):
        v1.remove("")


def test_paths_with_traversal_are_rejected_before_any_write(v1: CgroupV1, tmp_path: Path) -> None:
    for bad in ("../escape", "a/../../b", "a\x00b", "a b"):
        with pytest.raises(IdError):
            v1.write_cpus(bad, CPUSet.of(0))
        with pytest.raises(IdError):
            v1.create(bad)
    assert v1.writes == 0
    assert not (tmp_path / "escape").exists()


def test_writes_are_counted_and_journaled(v1: CgroupV1) -> None:
    v1.create("g")
    v1.record = True
    before = v1.writes
    v1.write_cpus("g", CPUSet.of(3))
    assert v1.writes == before + 1
    assert v1.journal == [(str(Path(v1.root) / "g" / "cpuset.cpus"), "3")]


def test_v2_group_creation_enables_controllers_and_reads_cpu_max(v2: CgroupV2) -> None:
    v2.create("kubepods.slice/kubepods-pod1.slice")
    assert v2.read_cpus("kubepods.slice/kubepods-pod1.slice") == CPUSet()
    assert "cpuset" in v2.read_file("kubepods.slice", "cgroup.subtree_control")
    assert v2.read_quota("kubepods.slice") == CpuQuota(None, 100000)
    v2.write_quota("kubepods.slice", CpuQuota(200000, 100000))
    assert v2.read_file("kubepods.slice", "cpu.max") == "200000 100000"
    v2.write_quota("kubepods.slice", CpuQuota.unlimited())
    assert v2.read_file("kubepods.slice", "cpu.max") == "max"
    assert v2.read_quota("kubepods.slice") == CpuQuota(None, 100000)


def test_quota_values_below_the_kernel_minimum_are_rejected() -> None:
    with pytest.raises(ValueError, match="1000us"):
        CpuQuota(500, 100000)
    with pytest.raises(ValueError, match="period"):
        CpuQuota(None, 10)
    assert CpuQuota.for_cpus(2).quota_us == 200000
    assert CpuQuota.unlimited().at_least(CpuQuota(100000, 100000))
    assert not CpuQuota(100000, 100000).at_least(CpuQuota(150000, 100000))


MOUNTINFO_V1 = """\
31 23 0:28 / {base} rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / {base}/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
34 31 0:31 / {base}/cpuset rw,relatime - cgroup cgroup rw,cpuset
41 31 0:38 / {base}/unified rw,relatime - cgroup2 cgroup2 rw
"""


def test_detection_prefers_the_hierarchy_with_cpuset(tmp_path: Path) -> None:
    make_fake_v1(tmp_path, cpus=ALL, mems=NODES)
    (tmp_path / "unified").mkdir()
    (tmp_path / "unified" / "cgroup.controllers").write_text("hugetlb\n")
    info = tmp_path / "mountinfo"
    info.write_text(MOUNTINFO_V1.format(base=tmp_path))
    mounts = detect_mounts(info)
    assert mounts.v1["cpuset"] == str(tmp_path / "cpuset")
    assert mounts.v1["cpu"] == str(tmp_path / "cpu,cpuacct")
    assert mounts.cpuset_version == 1
    driver = open_cgroups(mountinfo=info)
    assert isinstance(driver, CgroupV1) and driver.cpu_root == str(tmp_path / "cpu,cpuacct")
    assert open_cgroups(mounts, version=2).version == 2


def test_detection_of_a_pure_v2_host(tmp_path: Path) -> None:
    make_fake_v2(tmp_path, cpus=ALL, mems=NODES)
    info = tmp_path / "mountinfo"
    info.write_text(f"41 23 0:38 / {tmp_path}/unified rw - cgroup2 cgroup2 rw\n")
    driver = open_cgroups(mountinfo=info)
    assert isinstance(driver, CgroupV2)


def test_no_cpuset_hierarchy_is_an_environment_problem(tmp_path: Path) -> None:
    info = tmp_path / "mountinfo"
    info.write_text("31 23 0:28 / /sys rw - sysfs sysfs rw\n")
    with pytest.raises(CgroupError) as err:
        open_cgroups(mountinfo=info)
    assert err.value.reason == "no_cpuset_hierarchy" and err.value.exit_code == 4


def test_this_hosts_mountinfo_is_readable() -> None:
    mounts = detect_mounts("/proc/self/mountinfo")
    assert mounts.v1 or mounts.unified is not None


def test_noprefix_v1_mounts_use_short_file_names(tmp_path: Path) -> None:
    root = tmp_path / "cpuset"
    root.mkdir()
    (root / "cpus").write_text("0-3\n")
    (root / "mems").write_text("0\n")
    driver = CgroupV1(root, None, fake_tree=True)
    assert driver.cpus_file == "cpus" and driver.read_cpus("") == CPUSet.parse("0-3")
