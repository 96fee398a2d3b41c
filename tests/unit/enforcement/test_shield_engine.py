"""The shield's engine on stand-in trees: a fake cpuset hierarchy (cgroup v1 and v2) and a fake
/proc (`corepin.testing.proc_tree`), so every path - tasks moved, groups narrowed in place,
kernel threads and IRQs confined, resizing, drift, adoption, `off` - runs without touching this
host. (The same engine on the real kernel: test_shield_realhost.py; whole machines: the guests,
test_shield_guest.py.)
"""

from __future__ import annotations

import errno
from collections.abc import Iterator
from pathlib import Path

import pytest

from corepin.core.cpuset import CPUSet
from corepin.core.errors import EnvironmentProblem
from corepin.enforcement.affinity import (
    AffinityError,
    KernelAffinity,
    StandInAffinity,
    kernel_proc,
)
from corepin.enforcement.cgroups import CgroupDriver, CgroupV1
from corepin.enforcement.faketree import make_fake_v1, make_fake_v2
from corepin.enforcement.shield.engine import ShieldEngine
from corepin.enforcement.shield.irqs import plan_irqs, read_irqs
from corepin.enforcement.shield.kthreads import plan_kernel_threads
from corepin.enforcement.shield.scope import confine
from corepin.state.shield import RestrictedGroup, ShieldRecord
from corepin.sysfs.procfs import parse_stat, read_stat
from corepin.testing.proc_tree import PF_KTHREAD, PF_NO_SETAFFINITY, ProcTree, stat_line

C = CPUSet.parse
ALL = C("0-3")


class Host:
    """A fake cpuset hierarchy and a fake /proc that agree on who is where."""

    def __init__(self, base: Path, version: int) -> None:
        self.proc = ProcTree(base / "proc")
        self.driver: CgroupDriver
        if version == 1:
            fake = make_fake_v1(base, cpus=ALL, mems=C("0"))
            self.driver = CgroupV1(fake.root, None, fake_tree=True)
            self.driver.create("scope")
        else:
            self.driver = make_fake_v2(base, cpus=ALL, mems=C("0"))
            self.driver.create("scope")
            (Path(self.driver.dir("scope")) / "cgroup.subtree_control").write_text("\n")
        self.version = version
        self.engine = ShieldEngine(self.driver, str(base / "proc"))

    def task(
        self, pid: int, group: str, *, comm: str = "task", flags: int = 0, cpus: CPUSet = ALL
    ) -> None:
        self.proc.add(pid, comm, start=1000 + pid, cpus=cpus, flags=flags, cgroup="/" + group)
        self.driver.write_file(group, "cgroup.procs", str(pid))

    def group(self, path: str, cpus: str) -> None:
        self.driver.create(path)
        if self.version == 1 or cpus:
            self.driver.write_cpus(path, C(cpus))

    def procs(self, path: str) -> list[int]:
        return sorted(self.driver.procs(path))


@pytest.fixture(params=[1, 2], ids=["cgroup v1", "cgroup v2"])
def host(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Host]:
    yield Host(tmp_path, request.param)


def record(**kw: object) -> ShieldRecord:
    version = kw.pop("version", 1)
    base: dict[str, object] = {
        "scope": "scope",
        "mode": "cpuset",
        "cgroup_version": version,
        "excluded": ("corepin", "scope/kubepods"),
    }
    base.update(kw)
    return ShieldRecord(**base)  # type: ignore[arg-type]


def test_confine_keeps_a_subset_or_falls_back_to_the_whole_system_set() -> None:
    assert confine(C("1-3"), C("0-1")) == C("1")
    assert confine(C("2-3"), C("0-1")) == C("0-1")
    assert confine(C("0-3"), C("0-3")) == C("0-3")


def test_on_moves_the_unmanaged_tasks_of_the_scope_and_leaves_managed_ones(host: Host) -> None:
    host.task(100, "scope")
    host.task(101, "scope")
    host.task(102, "scope")  # a corepin run
    host.task(103, "")  # outside the scope
    result = host.engine.on(record(version=host.version), C("0-1"), {102: C("3")})
    rec = result.record
    assert rec is not None
    assert host.procs("scope/corepin.system") == [100, 101]
    if host.version == 1:
        assert host.procs("scope") == [102]
    else:  # v2: a group giving cpuset to its children keeps no task (it would turn threaded)
        assert host.procs("scope") == []
        assert host.procs("scope/corepin.managed") == [102]
    assert 103 in host.procs("")
    assert host.driver.read_cpus("scope/corepin.system") == C("0-1")
    moved = [(t.pid, t.origin) for t in rec.moved]
    assert moved == [(100, "scope"), (101, "scope")] + ([(102, "scope")] * (host.version == 2))
    assert [t.start_time for t in rec.moved][:2] == [1100, 1101]
    assert result.failed == []


def test_a_pid_that_was_recycled_between_scan_and_move_is_not_moved(host: Host) -> None:
    host.task(100, "scope")
    host.task(101, "scope")
    scanned = host.engine.tree.table()
    # 101 exits and its pid comes back with another start time before the move
    host.proc.add(101, "other", start=99999, cpus=ALL, cgroup="/scope")
    assert not host.engine.tree.move("scope/other", 101, scanned[101].start_time, [])
    host.driver.create("scope/other")
    assert not host.engine.tree.move("scope/other", 101, scanned[101].start_time, [])
    assert host.engine.tree.move("scope/other", 100, scanned[100].start_time, [])
    assert host.procs("scope/other") == [100]


def test_groups_below_the_scope_are_narrowed_in_place_and_excluded_ones_left(
    host: Host,
) -> None:
    host.group("scope/docker", "0-3")
    host.group("scope/docker/c1", "2-3")
    host.group("scope/kubepods", "0-3")
    host.group("scope/kubepods/pod", "3")
    host.task(110, "scope/docker/c1")
    host.task(111, "scope/kubepods/pod")
    rec = host.engine.on(record(version=host.version), C("0-1"), {}).record
    assert rec is not None
    assert host.driver.read_cpus("scope/docker") == C("0-1")
    assert host.driver.read_cpus("scope/docker/c1") == C("0-1"), "none left: its parent's"
    assert host.driver.read_cpus("scope/kubepods") == ALL, "the kubelet's pods are not ours"
    assert host.driver.read_cpus("scope/kubepods/pod") == C("3")
    assert host.procs("scope/docker/c1") == [110], "narrowed in place: its task stays there"
    assert set(rec.restricted) == {
        RestrictedGroup("scope/docker", "0-3"),
        RestrictedGroup("scope/docker/c1", "2-3"),
    }


def test_a_managed_process_in_a_narrowed_group_moves_to_the_managed_group(host: Host) -> None:
    host.group("scope/app", "0-3")
    host.task(120, "scope/app")  # pinned with `corepin pin --pid` to CPU 3
    host.task(121, "scope/app")
    rec = host.engine.on(record(version=host.version), C("0-1"), {120: C("3")}).record
    assert rec is not None
    assert host.procs("scope/corepin.managed") == [120]
    assert host.procs("scope/app") == [121]
    assert rec.origin_of(120, 1120) == "scope/app"
    off = host.engine.off(rec, C("0-1"), {})
    assert off.record is None, off.notes
    assert host.procs("scope/app") == [120, 121], "back where it came from"
    assert not host.driver.exists("scope/corepin.managed")


def test_resize_follows_the_system_set_both_ways(host: Host) -> None:
    host.group("scope/docker", "1-3")
    host.task(100, "scope")
    rec = host.engine.on(record(version=host.version), C("0-1"), {}).record
    assert rec is not None
    assert host.driver.read_cpus("scope/docker") == C("1")
    grown = host.engine.reconcile(rec, C("0-2"), {}).record
    assert grown is not None
    assert host.driver.read_cpus("scope/corepin.system") == C("0-2")
    assert host.driver.read_cpus("scope/docker") == C("1-2"), "its original CPUs come back"
    shrunk = host.engine.reconcile(grown, C("0"), {}).record
    assert shrunk is not None
    assert host.driver.read_cpus("scope/corepin.system") == C("0")
    assert host.driver.read_cpus("scope/docker") == C("0")
    assert shrunk.restricted == (RestrictedGroup("scope/docker", "1-3"),), "the first original"


def test_reconcile_adopts_new_tasks_repairs_drift_and_then_writes_nothing(host: Host) -> None:
    host.task(100, "scope")
    rec = host.engine.on(record(version=host.version), C("0-1"), {}).record
    assert rec is not None
    host.task(105, "scope")  # started in the scope later
    host.driver.write_cpus("scope/corepin.system", ALL)  # someone widened it
    again = host.engine.reconcile(rec, C("0-1"), {})
    assert again.record is not None
    assert host.procs("scope/corepin.system") == [100, 105]
    assert host.driver.read_cpus("scope/corepin.system") == C("0-1")
    assert [n.action for n in again.notes] == ["resized", "moved"]
    writes = host.driver.writes
    steady = host.engine.reconcile(again.record, C("0-1"), {})
    assert host.driver.writes == writes and steady.notes == []
    assert steady.record == again.record


def test_records_of_tasks_that_exited_are_dropped(host: Host) -> None:
    host.task(100, "scope")
    host.task(101, "scope")
    rec = host.engine.on(record(version=host.version), C("0-1"), {}).record
    assert rec is not None
    host.proc.remove(101)
    later = host.engine.reconcile(rec, C("0-1"), {}).record
    assert later is not None and [t.pid for t in later.moved] == [100]


def test_off_puts_everything_back_and_keeps_what_someone_changed_since(host: Host) -> None:
    host.group("scope/docker", "0-3")
    host.group("scope/svc", "2-3")
    host.task(100, "scope")
    host.task(101, "scope/docker")
    rec = host.engine.on(record(version=host.version), C("0-1"), {}).record
    assert rec is not None
    host.driver.write_cpus("scope/svc", C("0"))  # its owner changed it meanwhile
    host.task(106, "scope/corepin.system")  # forked in the system set after `on`
    result = host.engine.off(rec, C("0-1"), {})
    assert result.record is None, result.notes
    assert host.procs("scope") == [100, 106]
    assert host.procs("scope/docker") == [101]
    assert host.driver.read_cpus("scope/docker") == ALL
    assert host.driver.read_cpus("scope/svc") == C("0"), "changed since: kept"
    assert any(n.action == "left" and n.target == "scope/svc" for n in result.notes)
    assert not host.driver.exists("scope/corepin.system")


def test_a_second_shield_on_the_same_scope_is_refused(host: Host) -> None:
    host.engine.on(record(version=host.version), C("0-1"), {})
    with pytest.raises(EnvironmentProblem) as info:
        host.engine.on(record(version=host.version), C("0-1"), {})
    assert info.value.reason == "shield_exists"


def test_an_empty_system_set_is_refused(host: Host) -> None:
    with pytest.raises(EnvironmentProblem) as info:
        host.engine.on(record(version=host.version), CPUSet(), {})
    assert info.value.reason == "system_set_empty"
    assert not host.driver.exists("scope/corepin.system")


def test_cgroup_v2_enables_cpuset_for_the_scope_and_restores_inheritance(tmp_path: Path) -> None:
    host = Host(tmp_path, 2)
    # a service's group; cpuset is not on for the scope's children yet (no +cpuset), so its
    # cpuset.cpus is empty: it inherits the scope's CPUs
    host.engine.tree.make_v2_group("scope/svc")
    host.task(100, "scope/svc")
    rec = host.engine.on(record(version=2), C("0-1"), {}).record
    assert rec is not None
    assert rec.enabled == ("scope",)
    control = Path(host.driver.dir("scope")) / "cgroup.subtree_control"
    assert control.read_text().strip() == "+cpuset"
    assert host.driver.read_cpus("scope/svc") == C("0-1")
    result = host.engine.off(rec, C("0-1"), {})
    assert result.record is None, result.notes
    assert host.driver.read_cpus_text("scope/svc") == "", "back to inheriting"
    assert control.read_text().strip() == "-cpuset"


# ---------------------------------------------------------------------- affinity mode


@pytest.fixture
def procs(tmp_path: Path) -> ProcTree:
    tree = ProcTree(tmp_path / "proc")
    tree.add(100, "app", start=1100, cpus=ALL, threads=(150, 151), cgroup="/scope")
    tree.add(101, "narrow", start=1101, cpus=C("1-3"), cgroup="/scope/sub")
    tree.add(102, "run", start=1102, cpus=C("3"), cgroup="/scope")
    tree.add(103, "outside", start=1103, cpus=ALL, cgroup="/other")
    return tree


def affinity_engine(tree: ProcTree) -> ShieldEngine:
    return ShieldEngine(None, str(tree.root), unified="cpuset")


def test_affinity_mode_confines_every_thread_of_the_scope_and_restores_it(
    procs: ProcTree,
) -> None:
    engine = affinity_engine(procs)
    rec = ShieldRecord(scope="scope", mode="affinity", cgroup_version=0)
    on = engine.on(rec, C("0-1"), {102: C("3")}).record
    assert on is not None
    assert [procs.affinity(100, t) for t in (100, 150, 151)] == [C("0-1")] * 3
    assert procs.affinity(101) == C("1"), "a narrower task keeps what it can"
    assert procs.affinity(102) == C("3"), "managed"
    assert procs.affinity(103) == ALL, "outside the scope"
    assert sorted((t.pid, str(t.cpus)) for t in on.tasks) == [(100, "0-3"), (101, "1-3")]
    procs.add(104, "new", start=1104, cpus=ALL, cgroup="/scope")  # forked later
    again = engine.reconcile(on, C("0-1"), {102: C("3")}).record
    assert again is not None and procs.affinity(104) == C("0-1")
    off = engine.off(again, C("0-1"), {})
    assert off.record is None, off.notes
    assert procs.affinity(100, 151) == ALL and procs.affinity(101) == C("1-3")
    assert procs.affinity(104) == ALL


def test_the_stand_in_is_never_the_kernel(procs: ProcTree) -> None:
    assert not kernel_proc(str(procs.root))
    assert kernel_proc("/proc")
    assert isinstance(affinity_engine(procs).affinity, StandInAffinity)
    assert isinstance(ShieldEngine(None, "/proc").affinity, KernelAffinity)


# ---------------------------------------------------------------------- kernel threads


def kthreads(tree: ProcTree) -> None:
    tree.add(2, "kthreadd", start=2, cpus=ALL, flags=PF_KTHREAD, ppid=0)
    tree.add(10, "ksoftirqd/2", start=10, cpus=C("2"), flags=PF_KTHREAD | PF_NO_SETAFFINITY)
    tree.add(11, "kworker/u8:1", start=11, cpus=ALL, flags=PF_KTHREAD, ppid=2)
    tree.add(12, "kcompactd0", start=12, cpus=C("2-3"), flags=PF_KTHREAD, ppid=2)
    tree.add(13, "irq/24-ahci", start=13, cpus=C("3"), flags=PF_KTHREAD, ppid=2)
    tree.add(14, "watchdogd", start=14, cpus=C("3"), flags=PF_KTHREAD, ppid=2)


def test_kernel_thread_plan_skips_per_cpu_and_irq_threads() -> None:
    def st(pid: int, comm: str, flags: int) -> object:
        return parse_stat(stat_line(pid, comm, start=pid, flags=flags))

    plans = plan_kernel_threads(
        [
            (st(2, "kthreadd", PF_KTHREAD), ALL),
            (st(10, "ksoftirqd/2", PF_KTHREAD | PF_NO_SETAFFINITY), C("2")),
            (st(12, "kcompactd0", PF_KTHREAD), C("2-3")),
            (st(13, "irq/24-ahci", PF_KTHREAD), C("3")),
            (st(14, "watchdogd", PF_KTHREAD), C("3")),
            (st(100, "bash", 0), ALL),
        ],  # type: ignore[misc]
        C("0-1"),
    )
    by_pid = {p.pid: p for p in plans}
    assert by_pid[2].new == C("0-1")
    assert by_pid[12].new == C("0-1"), "no CPU of it left: the whole system set"
    assert by_pid[10].new is None and "PF_NO_SETAFFINITY" in by_pid[10].why
    assert by_pid[13].new is None and "IRQ thread" in by_pid[13].why
    assert by_pid[14].new is None and "bound to CPU 3" in by_pid[14].why
    assert 100 not in by_pid, "user processes are not kernel threads"


def test_kthreads_confines_the_unbound_kernel_threads_and_off_restores_them(
    tmp_path: Path,
) -> None:
    host = Host(tmp_path, 1)
    kthreads(host.proc)
    for pid in (2, 10, 11, 12, 13, 14):
        host.driver.write_file("", "cgroup.procs", str(pid))
    rec = ShieldRecord(scope="", mode="cpuset", cgroup_version=1, kthreads=True)
    result = host.engine.on(rec, C("0-1"), {})
    on = result.record
    assert on is not None
    assert host.proc.affinity(2) == C("0-1") and host.proc.affinity(11) == C("0-1")
    assert host.proc.affinity(12) == C("0-1")
    assert host.proc.affinity(10) == C("2") and host.proc.affinity(14) == C("3")
    assert host.procs("") == [2, 10, 11, 12, 13, 14], "kernel threads never change groups"
    left = {n.target for n in result.notes if n.action == "left"}
    assert {"pid 10", "pid 13", "pid 14"} <= left
    assert sorted(t.pid for t in on.kernel_threads) == [2, 11, 12]
    off = host.engine.off(on, C("0-1"), {})
    assert off.record is None, off.notes
    assert host.proc.affinity(12) == C("2-3") and host.proc.affinity(11) == ALL


def test_without_kthreads_kernel_threads_are_counted_not_touched(tmp_path: Path) -> None:
    host = Host(tmp_path, 1)
    kthreads(host.proc)
    for pid in (2, 11):
        host.driver.write_file("", "cgroup.procs", str(pid))
    result = host.engine.on(ShieldRecord(scope="", mode="cpuset", cgroup_version=1), C("0"), {})
    assert host.proc.affinity(11) == ALL
    assert any(n.target == "kernel threads" and "2 stay" in n.detail for n in result.notes)


# ---------------------------------------------------------------------- IRQs


def test_irq_plan_confines_each_irq_from_its_original_affinity() -> None:
    current = {"24": C("0-3"), "25": C("0-1"), "26": C("3"), "default": ALL}
    plans = {p.irq: p.new for p in plan_irqs(current, C("0-1"))}
    assert plans == {"24": C("0-1"), "26": C("0-1"), "default": C("0-1")}
    grown = {p.irq: p.new for p in plan_irqs({"26": C("0-1")}, C("0-2"), {"26": C("2-3")})}
    assert grown == {"26": C("2")}, "the saved original decides, not the shielded value"


def test_irqs_move_refusals_are_reported_and_off_restores(tmp_path: Path) -> None:
    host = Host(tmp_path, 1)
    for n, cpus in ((24, ALL), (25, C("2-3")), (26, C("3"))):
        host.proc.irq(n, cpus)
    host.proc.default_irq(ALL)
    real_write = host.engine.write_irq

    def refusing(irq: str, cpus: CPUSet) -> None:
        if irq == "26":  # a managed IRQ: the kernel says EIO
            raise OSError(errno.EIO, "Input/output error")
        real_write(irq, cpus)

    host.engine.write_irq = refusing
    rec = ShieldRecord(scope="", mode="cpuset", cgroup_version=1, irqs=True)
    result = host.engine.on(rec, C("0-1"), {})
    on = result.record
    assert on is not None
    assert read_irqs(str(host.proc.root)) == {
        "24": C("0-1"),
        "25": C("0-1"),
        "26": C("3"),
        "default": C("0-1"),
    }
    assert [n.target for n in result.notes if n.action == "refused"] == ["irq 26"]
    assert sorted(i.irq for i in on.irq_affinity) == ["24", "25", "default"]
    off = host.engine.off(on, C("0-1"), {})
    assert off.record is None, off.notes
    assert host.proc.irq_affinity(25) == C("2-3") and host.proc.irq_affinity("default") == ALL


def test_the_stand_in_refuses_per_cpu_threads_as_the_kernel_does(tmp_path: Path) -> None:
    tree = ProcTree(tmp_path / "proc")
    kthreads(tree)
    stand_in = StandInAffinity(str(tree.root))
    with pytest.raises(AffinityError):
        stand_in.set(10, 10, C("0"))
    stand_in.set(11, 11, C("1"))
    assert tree.affinity(11) == C("1")
    assert read_stat(11, str(tree.root)).kernel_thread
