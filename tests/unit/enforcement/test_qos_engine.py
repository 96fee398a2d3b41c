"""`QosEngine.period` on fake cgroup trees laid out as v1 (cpuset, cpu and cpuacct apart) and
v2, with a stand-in /proc (the node's CPU time, processes) and a clock the test moves: the
measured usage, the BE cpuset following the budget (children included, in the order v1 takes),
cfsQuota, cpu.idle, CPU burst, resctrl tasks, the steady state writing nothing, vanished groups,
and the invariants of the BE set (Hypothesis)."""

from __future__ import annotations

import errno
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corepin.allocation.qos import (
    BeSuppress,
    ClassPolicy,
    CpuBurst,
    QosPolicy,
    be_quota_us,
    default_class_policies,
    grow_step,
)
from corepin.core.cpuset import CPUSet
from corepin.enforcement.cgroups import CgroupDriver, CgroupV1, CgroupV2, CpuQuota
from corepin.enforcement.faketree import make_fake_v1, make_fake_v2, seed_cpu_files, set_cpu_stats
from corepin.enforcement.note import Note
from corepin.enforcement.qos import CpuControl, QosEngine, QosMember, QosNode, QosReport
from corepin.enforcement.resctrl import ResctrlWriter
from corepin.enforcement.resctrl.classes import ResctrlClasses
from corepin.testing.proc_tree import ProcTree
from support.budget import examples
from support.resctrl_tree import make_resctrl_tree

C = CPUSet.parse
BE = "kubepods/besteffort"
POD1, CTR1, POD2 = f"{BE}/pod1", f"{BE}/pod1/c1", f"{BE}/pod2"
LS_GROUP = "kubepods/burstable/podA/c1"
LSE_GROUP = "kubepods/podE/c1"
HZ = os.sysconf("SC_CLK_TCK")

NODE = QosNode(
    online=C("0-7"),
    reserved=C("0"),
    exclusive=C("6-7"),
    lsr=C("5"),
    shared_pool=C("0-5"),
    be_group=BE,
)
CANDIDATES = C("1-4")
BASE = CpuQuota(200_000, 100_000)
MEMBERS = (
    QosMember("ls", "LS", LS_GROUP, base_quota=BASE),
    QosMember("lse", "LSE", LSE_GROUP),
    QosMember("be1", "BE", CTR1),
)


def cpuset_policy(min_cpus: int = 2, slo: int = 65, **kw: object) -> QosPolicy:
    return QosPolicy(be_suppress=BeSuppress("cpuset", slo, min_cpus), **kw)  # type: ignore[arg-type]


class KernelV2(CgroupV2):
    """The fake v2 tree with one more of the kernel's refusals: a group with tasks in it or
    below it cannot have its cpuset.cpus emptied (ENOSPC)."""

    def _fake_kernel_check(self, path: str, name: str, value: str) -> int | None:
        if name == "cpuset.cpus" and not value.strip() and self.read_cpus_text(path):
            for directory, _dirs, files in os.walk(self.dir(path)):
                if "cgroup.procs" in files and Path(directory, "cgroup.procs").read_text().split():
                    return errno.ENOSPC
        return super()._fake_kernel_check(path, name, value)


class Bed:
    """A node's fake cgroups (BE group with pods and a container, an LS and an LSE container),
    a stand-in /proc whose `stat` the test advances, and the engine over both."""

    def __init__(self, base: Path, version: int, online: CPUSet = NODE.online) -> None:
        self.acct: str | None = None
        driver: CgroupDriver
        if version == 1:
            driver = make_fake_v1(base, cpus=online, mems=C("0"))
            self.acct = str(base / "cpuacct")
            os.makedirs(self.acct)
        else:
            driver = KernelV2(make_fake_v2(base, cpus=online, mems=C("0")).root, fake_tree=True)
        self.driver = driver
        for group in (CTR1, POD2, LS_GROUP, LSE_GROUP):
            driver.create(group)
        for group in (BE, POD1, CTR1, POD2, LS_GROUP, LSE_GROUP):
            seed_cpu_files(driver, group, cpuacct_root=self.acct)
        if version == 2:  # pod2 has CPUs of its own; pod1 and its container inherit (empty)
            driver.write_cpus(POD2, online)
            for group in (BE, POD1, CTR1, POD2):
                Path(driver.dir(group), "cpuset.cpus.effective").write_text(f"{online}\n")
        driver.write_quota(LS_GROUP, BASE)
        self.proc = ProcTree(base / "proc")
        self.now = 1000.0
        self.busy_ticks = 0
        self.used: dict[str, int] = {}
        self.throttled: dict[str, int] = {}
        self._stat()
        self.cpu = CpuControl(driver, self.acct)
        self.engine = QosEngine(
            self.cpu, driver, proc_root=str(self.proc.root), clock=lambda: self.now
        )

    def _stat(self) -> None:
        idle = 10**9
        (self.proc.root / "stat").write_text(
            f"cpu  {self.busy_ticks} 0 0 {idle} 0 0 0 0 0 0\nintr 0\n"
        )

    def tick(self, seconds: float = 1.0, *, system: float = 0.0, **cpus: float) -> None:
        """Let `seconds` pass with the groups using `cpus` (ls=, lse=, be=) and the node
        `system` CPUs more."""
        groups = {"ls": LS_GROUP, "lse": LSE_GROUP, "be": CTR1}
        total = system
        for name, used in cpus.items():
            group = groups[name]
            self.used[group] = self.used.get(group, 0) + round(used * seconds * 1e9)
            total += used
        be_total = self.used.get(CTR1, 0)
        for group in (LS_GROUP, LSE_GROUP, CTR1, POD1, BE):
            if not os.path.isdir(self.driver.dir(group)):
                continue
            usage = be_total if group in (POD1, BE) else self.used.get(group, 0)
            set_cpu_stats(
                self.driver,
                group,
                usage_ns=usage,
                nr_periods=int(self.now),
                nr_throttled=self.throttled.get(group, 0),
                cpuacct_root=self.acct,
            )
        self.busy_ticks += round(total * seconds * HZ)
        self._stat()
        self.now += seconds

    def period(
        self,
        policy: QosPolicy,
        members: Iterable[QosMember] = MEMBERS,
        node: QosNode = NODE,
    ) -> QosReport:
        return self.engine.period(list(members), node, policy)

    def cpus(self, group: str) -> str:
        return self.driver.read_cpus_text(group)

    def quota(self, group: str) -> CpuQuota:
        return self.driver.read_quota(group)


@pytest.fixture(params=[1, 2], ids=["cgroup v1", "cgroup v2"])
def bed(request: pytest.FixtureRequest, tmp_path: Path) -> Bed:
    return Bed(tmp_path, request.param)


def test_the_first_period_primes_and_only_takes_out_what_be_may_never_use(bed: Bed) -> None:
    report = bed.period(cpuset_policy())
    assert report.usage == {} and report.be_budget is None
    assert report.be_cpus == CANDIDATES == bed.engine.be_cpus
    assert C(bed.cpus(BE)) == CANDIDATES
    assert report.writes == len(report.changes) > 0


def test_usage_per_class_from_the_groups_and_the_rest_of_the_node_is_system(bed: Bed) -> None:
    bed.period(cpuset_policy())
    bed.tick(2.0, ls=1.5, lse=1.0, be=0.5, system=0.25)
    report = bed.period(cpuset_policy())
    assert report.usage["LS"] == pytest.approx(1.5, abs=0.01)
    assert report.usage["LSE"] == pytest.approx(1.0, abs=0.01)
    assert report.usage["BE"] == pytest.approx(0.5, abs=0.01)
    assert report.usage["SYSTEM"] == pytest.approx(0.25, abs=0.02)
    assert report.usage["node"] == pytest.approx(3.25, abs=0.02)
    # budget = 8 * 65 % - LS used (1.5 + 1.0) - max(system 0.25, reserved 1)
    assert report.be_budget == pytest.approx(5.2 - 2.5 - 1.0, abs=0.02)


def test_be_shrinks_at_once_when_ls_work_needs_the_cpus_and_grows_back_step_by_step(
    bed: Bed,
) -> None:
    bed.driver.record = True
    bed.period(cpuset_policy())
    bed.tick(ls=3.0, be=4.0)
    report = bed.period(cpuset_policy())
    # 5.2 - 3 - 1 = 1.2 CPUs: one, but minCPUs keeps two (the highest of those it had)
    assert report.be_cpus == C("3-4")
    groups = [BE, CTR1, POD1, POD2] if bed.driver.version == 1 else [BE, POD2]
    for group in groups:
        assert C(bed.cpus(group)) == C("3-4"), group
    if bed.driver.version == 2:
        assert bed.cpus(POD1) == bed.cpus(CTR1) == ""  # they inherit: left empty
    bed.tick(ls=0.0, be=4.0)
    assert bed.period(cpuset_policy()).be_cpus == C("2-4")  # grows by one (a tenth of 8)
    bed.tick(ls=0.0, be=4.0)
    assert bed.period(cpuset_policy()).be_cpus == C("1-4")
    bed.tick(ls=0.0, be=4.0)
    assert bed.period(cpuset_policy()).be_cpus == C("1-4")  # never beyond the candidates


def test_v1_shrinks_children_first_and_grows_the_group_first(tmp_path: Path) -> None:
    bed = Bed(tmp_path, 1)
    bed.period(cpuset_policy())
    bed.driver.record = True
    bed.tick(ls=3.0)
    bed.period(cpuset_policy())

    def written() -> list[str]:
        return [os.path.dirname(f) for f, _ in bed.driver.journal]

    shrink = written()
    assert len(shrink) == 4 and shrink[-1].endswith(BE)
    for i, group in enumerate(shrink):  # no group is written before one below it
        assert not any(later.startswith(group + "/") for later in shrink[i + 1 :])
    bed.driver.journal.clear()
    bed.tick(ls=0.0)
    bed.period(cpuset_policy())
    grow = written()
    assert len(grow) == 4 and grow[0].endswith(BE)
    for i, group in enumerate(grow):  # no group is written before the one above it
        assert not any(group.startswith(later + "/") for later in grow[i + 1 :])
    assert all(f.endswith("cpuset.cpus") for f, _ in bed.driver.journal)  # mems untouched


def test_a_steady_state_writes_nothing(bed: Bed) -> None:
    policy = cpuset_policy(cpu_burst=CpuBurst("auto", 100), be_cpu_idle=True)
    bed.period(policy)
    for _ in range(3):
        bed.tick(ls=1.0, be=1.0)
        bed.period(policy)
    writes = bed.driver.writes
    bed.tick(ls=1.0, be=1.0)
    report = bed.period(policy)
    assert report.writes == 0 and report.changes == [] and report.problems == []
    assert bed.driver.writes == writes


def test_cfs_quota_gives_the_budget_as_a_quota_and_off_puts_everything_back(bed: Bed) -> None:
    before = bed.cpus(BE)
    bed.period(cpuset_policy())
    bed.tick(ls=2.0)
    bed.period(cpuset_policy())
    assert C(bed.cpus(BE)) != C(before or "0-7")
    quota = QosPolicy(be_suppress=BeSuppress("cfsQuota", 65, 2))
    bed.tick(ls=2.0)
    report = bed.period(quota)
    budget = 5.2 - 2.0 - 1.0
    assert report.be_budget == pytest.approx(budget, abs=0.02)
    assert report.be_quota_us == be_quota_us(report.be_budget or 0, 100_000)
    assert bed.quota(BE).quota_us == report.be_quota_us
    assert report.be_cpus is None and bed.engine.be_cpus is None
    # the cpuset came back: what it was less the exclusive CPUs (v2: the BE group's empty
    # value, inheriting)
    assert bed.cpus(BE) == ("0-5" if bed.driver.version == 1 else before)
    bed.tick(ls=2.0)
    off = bed.period(QosPolicy(be_suppress=BeSuppress("off", 65, 2)))
    assert bed.quota(BE).quota_us is None and off.be_quota_us is None and off.be_budget is None
    assert [n.action for n in off.changes] == ["restored"]
    bed.tick(ls=2.0)
    assert bed.period(QosPolicy(be_suppress=BeSuppress("off", 65, 2))).writes == 0


def test_a_v2_group_with_tasks_that_inherited_gets_what_it_had_less_the_exclusive_cpus_back(
    tmp_path: Path,
) -> None:
    bed = Bed(tmp_path, 2)
    bed.driver.write_file(CTR1, "cgroup.procs", "4321")
    bed.period(cpuset_policy())
    bed.tick(ls=3.0)
    assert bed.period(cpuset_policy()).be_cpus == C("3-4")
    bed.tick(ls=3.0)
    report = bed.period(QosPolicy(be_suppress=BeSuppress("off", 65, 2)))
    assert not report.problems
    # the kernel keeps a populated cpuset from going empty: the BE group gets the CPUs it had
    # (inheriting) less the exclusive ones; pod2 its own CPUs less the exclusive ones
    assert bed.cpus(BE) == "0-5" and bed.cpus(POD2) == "0-5"
    assert bed.cpus(POD1) == bed.cpus(CTR1) == ""
    bed.tick()
    assert bed.period(QosPolicy(be_suppress=BeSuppress("off", 65, 2))).writes == 0


def test_be_is_kept_to_cpus_its_parent_has(tmp_path: Path) -> None:
    """A cpuset partition elsewhere took CPUs 3-4 from the BE group's parent (its effective
    CPUs): BE never gets them, even when its own cpuset.cpus named them (a v2 group left with
    none of its own would run on every CPU of its parent, the exclusive ones included)."""
    bed = Bed(tmp_path, 2)
    Path(bed.driver.dir("kubepods"), "cpuset.cpus.effective").write_text("0-2,5-7\n")
    bed.driver.write_cpus(BE, C("3-4"))
    first = bed.period(cpuset_policy())
    assert first.be_cpus == C("1-2") and bed.cpus(BE) == "1-2" and bed.cpus(POD2) == "1-2"
    bed.tick(ls=1.0)
    assert (bed.period(cpuset_policy()).be_cpus or C("0-7")) <= C("1-2")


def test_off_puts_back_what_each_group_had_less_the_exclusive_cpus(tmp_path: Path) -> None:
    bed = Bed(tmp_path, 2)
    bed.driver.write_cpus(POD2, C("1-2"))
    bed.driver.create(f"{BE}/pod3")
    bed.driver.write_cpus(f"{BE}/pod3", C("0,6"))
    bed.period(cpuset_policy())
    bed.tick(ls=3.0)
    assert bed.period(cpuset_policy()).be_cpus == C("3-4")
    assert bed.cpus(POD2) == bed.cpus(f"{BE}/pod3") == "3-4"
    bed.tick(ls=3.0)
    report = bed.period(QosPolicy(be_suppress=BeSuppress("off", 65, 2)))
    assert not report.problems
    assert bed.cpus(POD2) == "1-2" and bed.cpus(f"{BE}/pod3") == "0"
    assert bed.cpus(BE) == "" and bed.cpus(POD1) == ""


def test_off_leaves_groups_corepin_never_changed(bed: Bed) -> None:
    bed.driver.write_quota(BE, CpuQuota(300_000, 100_000))
    report = bed.period(QosPolicy(be_suppress=BeSuppress("off", 65, 2)))
    bed.tick(ls=1.0)
    report = bed.period(QosPolicy(be_suppress=BeSuppress("off", 65, 2)))
    assert report.writes == 0 and bed.quota(BE).quota_us == 300_000


def test_be_cpu_idle_is_set_and_put_back_only_when_corepin_set_it(bed: Bed) -> None:
    on = cpuset_policy(be_cpu_idle=True)
    off = cpuset_policy(be_cpu_idle=False)
    bed.period(on)
    assert bed.cpu.read_idle(BE) is True
    bed.tick()
    report = bed.period(off)
    assert bed.cpu.read_idle(BE) is False
    assert [n for n in report.changes if "cpu.idle" in n.detail] == [
        Note("restored", BE, "cpu.idle 0")
    ]
    bed.driver.write_file(BE, "cpu.idle", "1", bed.cpu.cpu_root)  # someone else's setting
    bed.tick()
    bed.period(off)
    assert bed.cpu.read_idle(BE) is True


def test_a_kernel_without_cpu_idle_is_said_once(tmp_path: Path) -> None:
    bed = Bed(tmp_path, 2)
    os.unlink(Path(bed.driver.dir(BE), "cpu.idle"))
    first = bed.period(cpuset_policy(be_cpu_idle=True))
    assert any("no cpu.idle" in p for p in first.problems)
    bed.tick()
    assert not bed.period(cpuset_policy(be_cpu_idle=True)).problems
    assert not Path(bed.driver.dir(BE), "cpu.idle").exists()


def test_static_burst_is_clamped_to_the_quota_and_put_back_when_off(bed: Bed) -> None:
    policy = cpuset_policy(cpu_burst=CpuBurst("cpuBurstOnly", burst_percent=1000))
    report = bed.period(policy)
    # 1000 % of 200 ms is 2 s: the kernel takes no more than the quota
    assert bed.cpu.read_burst_us(LS_GROUP) == 200_000
    assert report.burst_changes == 1
    bed.tick(ls=1.0)
    report = bed.period(cpuset_policy())
    assert bed.cpu.read_burst_us(LS_GROUP) == 0
    assert bed.quota(LS_GROUP).quota_us == BASE.quota_us
    assert report.burst_changes == 1


def test_auto_raises_the_quota_while_throttled_and_lowers_it_after(bed: Bed) -> None:
    policy = cpuset_policy(cpu_burst=CpuBurst("auto", burst_percent=50, max_quota_percent=150))
    bed.period(policy)
    quotas = []
    for step in range(4):
        bed.throttled[LS_GROUP] = bed.throttled.get(LS_GROUP, 0) + 5
        bed.tick(ls=2.0)
        bed.period(policy)
        quotas.append(bed.quota(LS_GROUP).quota_us)
        assert bed.cpu.read_burst_us(LS_GROUP) == 100_000, step  # 50 % of the base
    assert quotas == [240_000, 288_000, 300_000, 300_000]
    bed.tick(ls=0.5)
    bed.period(policy)  # not throttled: down by a fifth
    assert bed.quota(LS_GROUP).quota_us == 240_000
    bed.tick(ls=0.5, be=5.0)  # the shared pool is busy: back to the base at once
    report = bed.period(policy)
    assert bed.quota(LS_GROUP).quota_us == BASE.quota_us
    assert bed.cpu.read_burst_us(LS_GROUP) == 0
    assert report.burst_changes == 2


def test_a_quota_below_the_burst_held_is_written_after_the_burst_is_lowered(bed: Bed) -> None:
    bed.driver.write_quota(LS_GROUP, CpuQuota(400_000, 100_000))
    bed.cpu.write_burst_us(LS_GROUP, 400_000)
    report = bed.period(cpuset_policy(cpu_burst=CpuBurst("cpuBurstOnly", burst_percent=10)))
    assert bed.quota(LS_GROUP).quota_us == 200_000
    assert bed.cpu.read_burst_us(LS_GROUP) == 20_000
    assert not report.problems


def test_a_group_that_vanished_is_a_problem_line_not_a_crash(bed: Bed) -> None:
    policy = cpuset_policy(cpu_burst=CpuBurst("auto"))
    bed.period(policy)
    bed.tick(ls=1.0)
    for root in {bed.driver.root, bed.cpu.cpu_root, bed.acct} - {None}:
        group = Path(bed.driver.dir(LS_GROUP, root))
        for f in group.iterdir():
            f.unlink()
        group.rmdir()
    report = bed.period(policy)
    assert any(p.startswith("ls:") for p in report.problems), report.problems
    assert report.be_cpus is not None
    gone = QosNode(
        NODE.online, NODE.reserved, NODE.exclusive, NODE.lsr, NODE.shared_pool, f"{BE}-gone"
    )
    report = bed.period(policy, node=gone)
    assert any("not there" in p for p in report.problems)


def test_members_without_a_cgroup_are_measured_through_their_processes(tmp_path: Path) -> None:
    bed = Bed(tmp_path, 1)
    bed.proc.add(4242, "worker", cpus=C("0-7"), utime=0, stime=0)
    member = QosMember("run", "LS", None, pids=(4242,))
    bed.period(cpuset_policy(), members=[member])
    bed.proc.add(4242, "worker", cpus=C("0-7"), utime=HZ, stime=HZ)
    bed.busy_ticks += 2 * HZ
    bed.tick(1.0)
    report = bed.period(cpuset_policy(), members=[member])
    assert report.usage["LS"] == pytest.approx(2.0, abs=0.01)


def test_resctrl_classes_are_applied_on_change_and_new_threads_assigned(tmp_path: Path) -> None:
    bed = Bed(tmp_path, 2)
    fs = make_resctrl_tree(tmp_path / "resctrl")
    classes = ResctrlClasses(ResctrlWriter(tmp_path / "resctrl", "intel", fs), bed.proc.root)
    bed.engine.resctrl = classes
    bed.proc.add(300, "ls", cpus=C("0-7"), threads=(301, 302))
    bed.proc.add(400, "be", cpus=C("0-7"))
    bed.driver.write_file(LS_GROUP, "cgroup.procs", "300")
    members = [*MEMBERS[:2], QosMember("be-run", "BE", None, pids=(400,))]
    wide = dict(default_class_policies())
    wide["LS"] = ClassPolicy((0, 80), 100)
    first = bed.period(cpuset_policy(classes=wide), members=members)
    assert sorted(classes.writer.tasks("corepin-ls")) == [300, 301, 302]
    assert classes.writer.tasks("corepin-be") == [400]
    assert {n.target for n in first.changes if n.action == "created"} == {
        "resctrl/corepin-be",
        "resctrl/corepin-ls",
    }
    bed.tick()
    assert bed.period(cpuset_policy(classes=wide), members=members).writes == 0
    bed.proc.add(300, "ls", cpus=C("0-7"), threads=(301, 302, 303))
    bed.tick()
    narrower = dict(wide)
    narrower["BE"] = ClassPolicy((0, 10), 100)
    report = bed.period(cpuset_policy(classes=narrower), members=members)
    assert [n.detail for n in report.changes if n.action == "moved"] == [
        "1 task(s) of class LS: 303"
    ]
    assert any(n.target == "resctrl/corepin-be" for n in report.changes if n.action != "moved")
    assert 303 in classes.writer.tasks("corepin-ls")


# ---------------------------------------------------------------------- invariants
@st.composite
def nodes(draw: st.DrawFn) -> tuple[QosNode, int]:
    n = draw(st.integers(2, 12))
    online = C(f"0-{n - 1}")
    pick = st.sets(st.integers(0, n - 1), max_size=max(1, n // 3))
    reserved, exclusive, lsr = CPUSet(draw(pick)), CPUSet(draw(pick)), CPUSet(draw(pick))
    node = QosNode(online, reserved, exclusive - reserved, lsr, online - exclusive, BE)
    return node, draw(st.integers(1, 4))


@settings(max_examples=examples(60))
@given(
    setup=nodes(),
    version=st.sampled_from([1, 2]),
    loads=st.lists(
        st.tuples(st.floats(0, 12), st.floats(0, 12), st.floats(0, 2)), min_size=1, max_size=8
    ),
)
def test_the_be_set_keeps_out_of_other_cpus_grows_slowly_and_keeps_its_minimum(
    setup: tuple[QosNode, int], version: int, loads: list[tuple[float, float, float]]
) -> None:
    node, least = setup
    candidates = node.shared_pool - node.exclusive - node.reserved - node.lsr
    step = grow_step(len(node.online))
    policy = cpuset_policy(min_cpus=least)
    with tempfile.TemporaryDirectory() as tmp:
        bed = Bed(Path(tmp), version, online=node.online)
        previous = bed.period(policy, node=node).be_cpus
        for ls, be, system in loads:
            bed.tick(ls=ls, be=be, system=system)
            report = bed.period(policy, node=node)
            now = report.be_cpus
            if not candidates:
                assert any("no CPU is left" in p for p in report.problems)
                continue
            assert now is not None and previous is not None
            assert now <= candidates
            assert now.isdisjoint(node.exclusive | node.reserved | node.lsr)
            assert len(now) >= min(least, len(candidates))
            assert len(now) <= max(len(previous) + step, min(least, len(candidates)))
            assert C(bed.cpus(BE)) == now
            if isinstance(bed.driver, CgroupV1):
                assert C(bed.cpus(CTR1)) == now
            previous = now
