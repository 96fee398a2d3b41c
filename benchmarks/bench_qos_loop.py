"""The QoS loop on a busy node: what one period costs when nothing changed.

A fake node of 32 CPUs (2 reserved) with `--containers` containers (default 250) laid out in a
fake cgroup tree as the kubelet lays them out (v1: cgroupfs driver, cpuset + cpu,cpuacct
hierarchies; v2: systemd driver, one unified tree), on tmpfs when there is one:

- 10 % LSE (Guaranteed, one exclusive CPU each), 70 % LS with a CPU limit (Burstable and
  Guaranteed pods: a CFS quota of 1 or 2 CPUs, the base of their burst), 20 % BE under
  `kubepods/besteffort` (the node's BE group);
- every group has its accounting files (v1 `cpuacct.usage`, `cpu.stat`, `cpu.cfs_burst_us`; v2
  `cpu.stat` with usage_usec, `cpu.max.burst`), and the node a `/proc/stat`.

Between periods (not timed) every counter advances at a constant rate and the engine's clock by
one second: the node is busy, but steadily, so the budget, the BE CPU set and each burst stay
where they are. After the engine converged (a few periods: the BE set grows by a tenth of the
node per period), each timed period is one `QosEngine.period` call; its CPU time is
`time.process_time` around it, and its writes the drivers' write counters (target: 0).

Beside it, in the same run, the naive period: the same reads, then every QoS file rewritten
(the BE cpuset of `besteffort` and every group below it, or its quota; each LS container's
quota and burst).

Target (issue 17): one period <= 10 ms of CPU (the median) and 0 writes when nothing changed.
A third row per tree adds the resctrl classes (a fake Intel tree, `tests/support/resctrl_tree`):
each container holds one process of 2 threads, so every period also reads each container's
cgroup.procs and its processes' task lists (its naive pass rewrites no resctrl file).

    python benchmarks/bench_qos_loop.py [--containers 250] [--repeats 200] [--quick]
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from _common import REPO, median, percentile, table
from corepin.allocation.qos import BeSuppress, CpuBurst, QosPolicy
from corepin.core.cpuset import CPUSet
from corepin.enforcement.cgroups import CgroupDriver, CpuQuota
from corepin.enforcement.faketree import make_fake_v1, make_fake_v2
from corepin.enforcement.layout import container_cgroup_path, qos_cgroup_path
from corepin.enforcement.qos import CpuControl, QosEngine, QosMember, QosNode
from corepin.enforcement.resctrl import ResctrlWriter
from corepin.enforcement.resctrl.classes import ResctrlClasses

sys.path.insert(0, str(REPO))  # tests.support: the fake resctrl tree
from tests.support.resctrl_tree import make_resctrl_tree

TARGET_MS = 10.0
TOTAL = 32
ONLINE = CPUSet.parse(f"0-{TOTAL - 1}")
RESERVED = CPUSet.parse("0-1")
HZ = 100  # USER_HZ of /proc/stat


@dataclass
class FakeNode:
    """A fake tree of one node and the counters that advance between periods."""

    drv: CgroupDriver
    cpu_dir: Path  # where the cpu accounting files are (v1: the cpu,cpuacct mount)
    proc: Path
    layout: str
    members: list[QosMember] = field(default_factory=list)
    #: CPUs each group with accounting (by absolute directory) uses per second
    rates: dict[str, float] = field(default_factory=dict)
    usage_ns: dict[str, int] = field(default_factory=dict)
    periods: int = 0
    busy_ticks: int = 0
    now: float = 1000.0
    exclusive: CPUSet = field(default_factory=CPUSet)
    #: the containers' own groups (the node's busy time is their sum, not their parents')
    leaves: set[str] = field(default_factory=set)

    @property
    def v2(self) -> bool:
        return self.drv.version == 2

    def clock(self) -> float:
        return self.now

    def write_counters(self) -> None:
        for d, used in self.usage_ns.items():
            stat = (
                f"nr_periods {self.periods}\nnr_throttled 0\nthrottled_time 0\n"
                "nr_bursts 0\nburst_time 0\n"
            )
            if self.v2:
                usec = used // 1000
                stat = (
                    f"usage_usec {usec}\nuser_usec {usec}\nsystem_usec 0\n"
                    f"nr_periods {self.periods}\nnr_throttled 0\nthrottled_usec 0\n"
                    "nr_bursts 0\nburst_usec 0\n"
                )
            else:
                Path(d, "cpuacct.usage").write_text(f"{used}\n")
            Path(d, "cpu.stat").write_text(stat)
        total_ticks = int(self.now * HZ) * TOTAL
        idle = max(0, total_ticks - self.busy_ticks)
        (self.proc / "stat").write_text(
            f"cpu  {self.busy_ticks} 0 0 {idle} 0 0 0 0 0 0\n"
            + "".join(f"cpu{c} 0 0 0 0 0 0 0 0 0 0\n" for c in range(TOTAL))
            + "intr 0\nctxt 0\nbtime 0\nprocesses 1\nprocs_running 1\nprocs_blocked 0\n"
        )

    def advance(self, seconds: float = 1.0) -> None:
        """One steady second: every group used its rate, the node its sum plus 1 CPU."""
        self.now += seconds
        self.periods += int(10 * seconds)
        for d, rate in self.rates.items():
            self.usage_ns[d] += int(rate * seconds * 1e9)
        leaves = sum(rate for d, rate in self.rates.items() if d in self.leaves)
        self.busy_ticks += int((leaves + 1.0) * seconds * HZ)
        self.write_counters()


def build(base: Path, version: int, containers: int, *, tasks: bool = False) -> FakeNode:
    """The node; with `tasks`, one process of 2 threads in each container (its pid in the
    group's cgroup.procs, its threads in `tasks` (v1) or `cgroup.threads` (v2) and in the fake
    /proc) for the resctrl classes."""
    if version == 1:
        drv: CgroupDriver = make_fake_v1(base / "v1", cpus=ONLINE, mems=CPUSet.of(0))
        cpu_dir = base / "v1" / "cpu,cpuacct"
        layout = "cgroupfs"
    else:
        drv = make_fake_v2(base / "v2", cpus=ONLINE, mems=CPUSet.of(0))
        cpu_dir = base / "v2" / "unified"
        layout = "systemd"
    proc = base / f"proc{version}"
    proc.mkdir()
    node = FakeNode(drv, cpu_dir, proc, layout)
    lse = max(1, containers // 10)
    be = max(1, containers // 5)
    for i in range(containers):
        uid = str(uuid.UUID(int=i + 1))
        cid = f"{i + 1:064x}"
        if i < lse:
            cpu = CPUSet.of(2 + i % (TOTAL - 4))
            node.exclusive |= cpu
            path = container_cgroup_path(layout, "guaranteed", uid, "containerd", cid)
            drv.create(path)
            drv.write_cpus(path, cpu)
            node.members.append(QosMember(cid, "LSE", path, base_quota=CpuQuota.for_cpus(1)))
            rate = 0.3
        elif i < containers - be:
            qos = ("burstable", "guaranteed")[i % 2]
            path = container_cgroup_path(layout, qos, uid, "containerd", cid)
            drv.create(path)
            limit = CpuQuota.for_cpus(1 + i % 2)
            _make_pod_quota_room(drv, path, limit)
            drv.write_quota(path, limit)
            node.members.append(QosMember(cid, "LS", path, base_quota=limit))
            rate = 0.03
        else:
            path = container_cgroup_path(layout, "besteffort", uid, "containerd", cid)
            drv.create(path)
            node.members.append(QosMember(cid, "BE", path))
            rate = 0.03
        if tasks:
            pid = 100_000 + 2 * i
            Path(drv.dir(path), "cgroup.procs").write_text(f"{pid}\n")
            # and its threads, in the file the kernel lists them in
            threads = "tasks" if version == 1 else "cgroup.threads"
            Path(drv.dir(path), threads).write_text(f"{pid}\n{pid + 1}\n")
            for tid in (pid, pid + 1):
                (proc / str(pid) / "task" / str(tid)).mkdir(parents=True)
        leaf = str(drv.dir(path, str(cpu_dir)))
        node.rates[leaf] = rate
        node.leaves.add(leaf)
    for dirpath, _dirs, _files in os.walk(cpu_dir):
        node.usage_ns.setdefault(dirpath, 0)
        node.rates.setdefault(dirpath, 0.0)
        for name, value in (
            ("cpu.max.burst", "0") if node.v2 else ("cpu.cfs_burst_us", "0"),
            ("cpu.idle", "0"),
        ):
            if not Path(dirpath, name).exists():
                Path(dirpath, name).write_text(value + "\n")
    # a parent's counters are the sum of its children's (the kernel's hierarchical accounting)
    dirs = sorted(node.rates, key=lambda d: -d.count(os.sep))
    for d in dirs:
        parent = os.path.dirname(d)
        if parent in node.rates and d != str(cpu_dir):
            node.rates[parent] += node.rates[d]
    node.write_counters()
    return node


def _make_pod_quota_room(drv: CgroupDriver, path: str, limit: CpuQuota) -> None:
    """The kubelet gives a pod the sum of its containers' limits (one container per pod here)."""
    pod = drv.parent(path)
    assert pod is not None
    drv.write_quota(pod, limit)


def node_of(fake: FakeNode) -> QosNode:
    return QosNode(
        online=ONLINE,
        reserved=RESERVED,
        exclusive=fake.exclusive,
        lsr=CPUSet(),
        shared_pool=ONLINE - RESERVED - fake.exclusive,
        be_group=qos_cgroup_path(fake.layout, "besteffort"),
    )


def naive_period(
    fake: FakeNode, cpu: CpuControl, node: QosNode, be_cpus: CPUSet | None, quota: int | None
) -> None:
    """Every read the engine needs, then every QoS file written again."""
    drv = fake.drv
    for m in fake.members:
        assert m.cgroup is not None
        cpu.usage_ns(m.cgroup)
        cpu.throttling(m.cgroup)
    assert node.be_group is not None
    cpu.usage_ns(node.be_group)
    (fake.proc / "stat").read_text()
    if be_cpus is not None:
        groups = [node.be_group]
        while groups:
            g = groups.pop()
            drv.write_cpus(g, be_cpus)
            groups.extend(drv.child_groups(g))
    if quota is not None:
        drv.write_quota(node.be_group, CpuQuota(quota, 100_000))
    for m in fake.members:
        if m.base_quota is not None and m.qos_class == "LS":
            assert m.cgroup is not None
            drv.write_quota(m.cgroup, m.base_quota)
            cpu.write_burst_us(m.cgroup, cpu.read_burst_us(m.cgroup) or 0)


def run_row(
    name: str, fake: FakeNode, policy: QosPolicy, repeats: int, resctrl: Path | None = None
) -> list[str]:
    cpuacct = str(fake.cpu_dir) if fake.drv.version == 1 else None
    cpu = CpuControl(fake.drv, cpuacct_root=cpuacct)
    classes = None
    if resctrl is not None:
        kernel = make_resctrl_tree(resctrl)
        classes = ResctrlClasses(ResctrlWriter(resctrl, vendor="intel", fs=kernel), fake.proc)
    engine = QosEngine(cpu, fake.drv, resctrl=classes, proc_root=str(fake.proc), clock=fake.clock)
    node = node_of(fake)
    converged_after = None
    quiet = 0
    for n in range(200):
        report = engine.period(fake.members, node, policy)
        fake.advance()
        quiet = quiet + 1 if report.writes == 0 else 0
        if quiet >= 3:
            converged_after = n + 1
            break
    if converged_after is None:
        raise SystemExit(f"{name}: the engine still writes after 200 steady periods")
    cpu_ms: list[float] = []
    writes: list[int] = []
    before = fake.drv.writes
    rdt_before = classes.writes if classes is not None else 0
    gc.disable()
    try:
        for _ in range(repeats):
            start = time.process_time()
            report = engine.period(fake.members, node, policy)
            cpu_ms.append((time.process_time() - start) * 1000)
            writes.append(report.writes)
            fake.advance()
    finally:
        gc.enable()
    driver_writes = fake.drv.writes - before
    if classes is not None:
        driver_writes += classes.writes - rdt_before
    be_cpus, be_quota = report.be_cpus, report.be_quota_us
    naive_ms: list[float] = []
    naive_repeats = max(3, repeats // 10)
    before = fake.drv.writes
    for _ in range(naive_repeats):
        start = time.process_time()
        naive_period(fake, cpu, node, be_cpus, be_quota)
        naive_ms.append((time.process_time() - start) * 1000)
        fake.advance()
    naive_writes = (fake.drv.writes - before) // naive_repeats
    cpu_ms.sort()
    naive_ms.sort()
    med = median(cpu_ms)
    return [
        name,
        str(len(fake.members)),
        str(converged_after),
        f"{med:.2f}",
        f"{percentile(cpu_ms, 99):.2f}",
        f"{max(writes)} ({driver_writes})",
        f"{median(naive_ms):.2f}",
        str(naive_writes),
        str(be_cpus) if be_cpus is not None else f"quota {be_quota} us",
        "ok" if med <= TARGET_MS and max(writes) == 0 == driver_writes else "MISSED",
    ]


def fast_tmp() -> tempfile.TemporaryDirectory[str]:
    shm = Path("/dev/shm")
    usable = shm.is_dir() and os.access(shm, os.W_OK)
    return tempfile.TemporaryDirectory(prefix="corepin-bench-", dir=shm if usable else None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--containers", type=int, default=250)
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--quick", action="store_true", help="CI smoke: few repeats")
    args = parser.parse_args(argv)
    repeats = 20 if args.quick else args.repeats
    rows = [
        [
            "tree, policy",
            "containers",
            "converged after",
            "CPU ms median",
            "p99",
            "writes (driver)",
            "naive CPU ms",
            "naive writes",
            "BE in force",
            f"<= {TARGET_MS:.0f} ms, 0 writes",
        ]
    ]
    burst = CpuBurst(policy="auto")
    cases = [
        ("cpuset", BeSuppress(policy="cpuset"), False),
        ("cfsQuota", BeSuppress(policy="cfsQuota"), False),
        ("cpuset", BeSuppress(policy="cpuset"), True),
    ]
    missed = []
    with fast_tmp() as tmp:
        for version in (1, 2):
            for label, suppress, rdt in cases:
                base = Path(tmp) / f"{version}-{label}-{rdt}"
                base.mkdir()
                fake = build(base, version, args.containers, tasks=rdt)
                policy = QosPolicy(be_suppress=suppress, cpu_burst=burst)
                name = f"fake v{version} ({fake.layout}), {label} + burst auto"
                name += " + resctrl (2 threads per container)" if rdt else ""
                row = run_row(name, fake, policy, repeats, base / "resctrl" if rdt else None)
                rows.append(row)
                if row[-1] != "ok":
                    missed.append(name)
    version = sys.version.split()[0]
    print(
        f"QoS period of a steady node: {TOTAL} CPUs, {args.containers} containers, "
        f"{repeats} timed periods each (time.process_time); python {version}; 1-min load "
        f"average {os.getloadavg()[0]:.2f}"
    )
    print(table(rows))
    print(
        "\nwrites = the engine's count per period (max), then the drivers' counters over every "
        "timed period;\nnaive = the same reads, then every QoS file written again."
    )
    print("missed targets: " + (", ".join(missed) if missed else "none"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
