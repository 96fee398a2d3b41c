"""Host mode's BE group on a cgroup v2 tree standing in for cgroupfs: `make_be_group`
enables `cpu` from the hierarchy root down (a v2 group offers `cpu` to its children only when
its parent enabled it), and `HostQos`'s engine puts back what an earlier process narrowed
(`QosEngine.adopt_be_group`)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

from corepin.agent.host.besteffort import make_be_group
from corepin.agent.host.pinning import Pinner
from corepin.agent.host.settings import HostSettings
from corepin.allocation.qos import BeSuppress, QosPolicy
from corepin.core.cpuset import CPUSet
from corepin.enforcement.cgroups import CgroupV1, CgroupV2, CpuQuota
from corepin.enforcement.faketree import make_fake_v1, make_fake_v2, seed_cpu_files
from corepin.enforcement.qos import CpuControl, QosEngine, QosMember, QosNode
from corepin.testing.machines import SyntheticSpec, synthetic
from corepin.testing.proc_tree import ProcTree

C = CPUSet.parse


def words(driver: CgroupV2, group: str) -> set[str]:
    return {w.lstrip("+") for w in driver.read_file(group, "cgroup.subtree_control").split()}


def test_the_be_group_gets_the_cpu_controller_from_the_hierarchy_root_down(
    tmp_path: Path,
) -> None:
    fake = make_fake_v2(tmp_path / "cg", cpus=C("0-7"), mems=C("0"))
    Path(fake.root, "cgroup.subtree_control").write_text("cpuset\n")  # cpu not handed down
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    settings = HostSettings(state_dir=str(state), cgroups="on", cgroup_root=fake.root)
    pinner = Pinner(settings, synthetic(SyntheticSpec(cores_per_l3=4, threads_per_core=2)))
    driver = pinner.driver
    assert isinstance(driver, CgroupV2) and driver.controllers == ("cpuset",)
    assert "cpu" not in words(driver, "corepin")
    assert make_be_group(driver, pinner.be_group) == 1
    for group in ("", "corepin", settings.cgroup_parent, pinner.be_group):
        assert "cpu" in words(driver, group), group
    assert make_be_group(driver, pinner.be_group) == 0  # a second time: nothing to make


class KernelV2(CgroupV2):
    """The fake v2 tree refusing to empty the cpuset of a group with tasks below it."""

    def _fake_kernel_check(self, path: str, name: str, value: str) -> int | None:
        if name == "cpuset.cpus" and not value.strip() and self.read_cpus_text(path):
            for directory, _dirs, files in os.walk(self.dir(path)):
                if "cgroup.procs" in files and Path(directory, "cgroup.procs").read_text().split():
                    return errno.ENOSPC
        return super()._fake_kernel_check(path, name, value)


def test_an_adopted_be_group_narrowed_by_an_earlier_process_is_put_back(tmp_path: Path) -> None:
    """A fresh engine (a later `reconcile --once`) with the policy no longer cpuset puts the
    BE group's empty cpuset (the pool where the kernel refuses: a run below it), its
    unlimited quota and cpu.idle 0 back; then nothing more is written."""
    be, run = "corepin/x/besteffort", "corepin/x/besteffort/run-1"
    fake = make_fake_v2(tmp_path / "cg", cpus=C("0-7"), mems=C("0"))
    driver = KernelV2(fake.root, fake_tree=True)
    driver.create(run)
    for group in (be, run):
        seed_cpu_files(driver, group)
        driver.write_cpus(group, C("5-6"))  # what the earlier process left
    driver.write_file(run, "cgroup.procs", "4321")
    driver.write_quota(be, CpuQuota(150_000, 100_000))
    driver.write_file(be, "cpu.idle", "1")
    proc = ProcTree(tmp_path / "proc")
    (proc.root / "stat").write_text("cpu  0 0 0 1000 0 0 0 0 0 0\n")
    cpu = CpuControl(driver)
    node = QosNode(C("0-7"), C("0"), C("7"), CPUSet(), C("0-6"), be)
    members = [QosMember("run-1", "BE", run)]
    off = QosPolicy(be_suppress=BeSuppress("off", 65, 2))

    engine = QosEngine(cpu, driver, proc_root=str(proc.root))
    assert engine.period(members, node, off).writes == 0  # not adopted: not known to be ours
    assert driver.read_cpus_text(be) == "5-6"

    engine = QosEngine(cpu, driver, proc_root=str(proc.root))
    engine.adopt_be_group(be, node.shared_pool)
    report = engine.period(members, node, off)
    assert not report.problems, report.problems
    assert driver.read_cpus_text(be) == "0-6"  # (empty refused: a task below it)
    assert driver.read_quota(be).quota_us is None
    assert cpu.read_idle(be) is False
    assert engine.period(members, node, off).writes == 0


def test_the_be_group_gets_the_lowest_cpu_weight_once(tmp_path: Path) -> None:
    """BE runs get CPU time when others leave it, as the kubelet's besteffort group: v1
    cpu.shares 2, v2 cpu.weight 1; written once, then only read."""
    v1 = make_fake_v1(tmp_path / "v1", cpus=C("0-3"), mems=C("0"))
    v2 = make_fake_v2(tmp_path / "v2", cpus=C("0-3"), mems=C("0"))
    for driver, name, value in ((v1, "cpu.shares", "2"), (v2, "cpu.weight", "1")):
        group = "corepin/sd-x/besteffort"
        make_be_group(driver, group)
        seed_cpu_files(driver, group)
        root = driver.cpu_root if isinstance(driver, CgroupV1) else driver.root
        assert root is not None
        Path(driver.dir(group, root), name).write_text(
            "1024\n" if name == "cpu.shares" else "100\n"
        )
        make_be_group(driver, group)
        assert driver.read_file(group, name, root) == value
        before = driver.writes
        make_be_group(driver, group)
        assert driver.writes == before, "a second time: nothing written"
