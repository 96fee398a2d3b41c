"""The node QoS loop on this host's real cgroup v1 hierarchies (cpuset, cpu and cpuacct, mounted
apart here), with real busy processes of the test's own.

A scratch tree `corepin-test-<random>/{besteffort,ls}` in the three hierarchies: busy loops in
`besteffort` (the BE group, with a pod group below it), one in `ls`. Periods run with real sleeps
of about 0.3 s. Checked: the BE cpuset follows the budget (on a 2-CPU node 65 % is 1.3 CPUs, so
once the loop has measured once BE is down to minCPUs = 1, and the kernel confines the BE loops
to it), cfsQuota writes the budget as the BE group's quota, static burst writes
`cpu.cfs_burst_us` clamped to the quota and reads it back, and `auto` raises the LS group's
quota while it is throttled. Every process and group is removed afterwards, also on failure.
Skipped with a reason where not root or the hierarchies are missing.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from corepin.allocation.qos import BeSuppress, CpuBurst, QosPolicy, be_quota_us, next_be_cpus
from corepin.core.cpuset import CPUSet
from corepin.core.errors import CgroupError
from corepin.enforcement.cgroups import CgroupV1, CpuQuota
from corepin.enforcement.qos import CpuControl, QosEngine, QosMember, QosNode, find_cpuacct_root
from support.helpers import allowed_cpus, kill_and_remove_cgroup, reap

CPUSET = Path("/sys/fs/cgroup/cpuset")
CPU = Path("/sys/fs/cgroup/cpu")
ACCT = find_cpuacct_root()
PAUSE = 0.3


def _skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root to write cgroups"
    for where, name in ((CPUSET, "cpuset.cpus"), (CPU, "cpu.cfs_quota_us")):
        if not (where / name).exists():
            return f"no cgroup v1 hierarchy with {name} at {where}"
    if ACCT is None or not Path(ACCT, "cpuacct.usage").exists():
        return "no cgroup v1 cpuacct hierarchy"
    if not (CPU / "cpu.cfs_burst_us").exists():
        return "the kernel has no cpu.cfs_burst_us (Linux 5.14 or later)"
    return None


REASON = _skip_reason()
pytestmark = [pytest.mark.realhost, pytest.mark.skipif(REASON is not None, reason=REASON or "")]

SPIN = "import os\nwhile True:\n    pass\n"


class Scratch:
    """The scratch groups, the processes in them and the engine over the real mounts."""

    def __init__(self) -> None:
        self.top = f"corepin-test-{uuid.uuid4().hex[:10]}"
        self.be = f"{self.top}/besteffort"
        self.pod = f"{self.be}/pod1"
        self.ls = f"{self.top}/ls"
        self.driver = CgroupV1(str(CPUSET), str(CPU))
        self.acct = str(ACCT)
        self.procs: list[subprocess.Popen[bytes]] = []
        self.online = CPUSet.parse((CPUSET / "cpuset.cpus").read_text())
        for group in (self.pod, self.ls):
            self.driver.create(group)
            Path(self.acct, group).mkdir(parents=True, exist_ok=True)
        self.cpu = CpuControl(self.driver, self.acct)
        self.engine = QosEngine(self.cpu, self.driver)
        self.node = QosNode(
            online=self.online,
            reserved=CPUSet(),
            exclusive=CPUSet(),
            lsr=CPUSet(),
            shared_pool=self.online,
            be_group=self.be,
        )

    def spin(self, group: str) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen([sys.executable, "-c", SPIN])
        self.procs.append(proc)
        self.driver.add_process(group, proc.pid)
        Path(self.acct, group, "cgroup.procs").write_text(str(proc.pid))
        return proc

    def members(self, base: CpuQuota | None = None) -> list[QosMember]:
        return [
            QosMember("ls", "LS", self.ls, base_quota=base),
            QosMember("be", "BE", self.pod),
        ]

    def close(self) -> None:
        for proc in self.procs:
            reap(proc)
        left = [
            str(root / self.top)
            for root in (CPUSET, CPU, Path(self.acct))
            if not kill_and_remove_cgroup(root / self.top)
        ]
        assert not left, f"could not clean up {left}"


@pytest.fixture
def scratch() -> Iterator[Scratch]:
    bed = Scratch()
    try:
        yield bed
    finally:
        bed.close()


def test_the_be_cpuset_follows_the_budget_measured_on_real_groups(scratch: Scratch) -> None:
    if len(scratch.online) < 2:
        pytest.skip("needs two CPUs")
    policy = QosPolicy(be_suppress=BeSuppress("cpuset", 65, 1))
    spinners = [scratch.spin(scratch.pod), scratch.spin(scratch.pod)]
    scratch.spin(scratch.ls)
    first = scratch.engine.period(scratch.members(), scratch.node, policy)
    assert first.be_cpus == scratch.online and not first.problems
    previous = first.be_cpus
    for _ in range(3):
        time.sleep(PAUSE)
        report = scratch.engine.period(scratch.members(), scratch.node, policy)
        assert not report.problems, report.problems
        assert report.be_budget is not None
        assert report.usage["LS"] > 0.05 and report.usage["BE"] > 0.05, report.usage
        want = next_be_cpus(previous, report.be_budget, scratch.online, len(scratch.online), 1)
        assert report.be_cpus == want
        previous = want
    # 65 % of two CPUs is 1.3: BE is down to its minimum of one CPU, the highest
    assert previous == CPUSet.of(scratch.online.last())
    for group in (scratch.be, scratch.pod):
        assert CPUSet.parse(scratch.driver.read_cpus_text(group)) == previous
    for proc in spinners:
        assert CPUSet.parse(allowed_cpus(proc.pid)) == previous
    steady = scratch.engine.period(scratch.members(), scratch.node, policy)
    assert steady.be_cpus == previous and steady.writes == 0

    time.sleep(PAUSE)
    quota = scratch.engine.period(
        scratch.members(), scratch.node, QosPolicy(be_suppress=BeSuppress("cfsQuota", 65, 1))
    )
    assert quota.be_budget is not None and quota.be_quota_us is not None
    assert quota.be_quota_us == be_quota_us(quota.be_budget, 100_000)
    assert scratch.driver.read_quota(scratch.be).quota_us == quota.be_quota_us
    assert CPUSet.parse(scratch.driver.read_cpus_text(scratch.be)) == scratch.online
    off = scratch.engine.period(
        scratch.members(), scratch.node, QosPolicy(be_suppress=BeSuppress("off", 65, 1))
    )
    assert scratch.driver.read_quota(scratch.be).quota_us is None and not off.problems


def test_burst_is_clamped_to_the_quota_and_auto_raises_a_throttled_quota(
    scratch: Scratch,
) -> None:
    base = CpuQuota(50_000, 100_000)
    scratch.driver.write_quota(scratch.ls, base)
    # the kernel itself refuses a burst above the quota: what the clamp is for
    with pytest.raises(CgroupError) as refused:
        scratch.driver.write_file(scratch.ls, "cpu.cfs_burst_us", "60000", str(CPU))
    assert refused.value.reason == "cgroup_invalid_value"
    assert scratch.cpu.write_burst_us(scratch.ls, 1_000_000) == 50_000
    assert (CPU / scratch.ls / "cpu.cfs_burst_us").read_text().strip() == "50000"
    assert scratch.cpu.write_burst_us(scratch.ls, 0) == 0

    scratch.spin(scratch.ls)
    static = QosPolicy(cpu_burst=CpuBurst("cpuBurstOnly", burst_percent=1000))
    report = scratch.engine.period(scratch.members(base), scratch.node, static)
    assert scratch.cpu.read_burst_us(scratch.ls) == 50_000 and report.burst_changes == 1

    auto = QosPolicy(
        cpu_burst=CpuBurst(
            "auto", burst_percent=100, max_quota_percent=300, share_usage_limit_percent=100
        )
    )
    raised: list[int | None] = []
    for _ in range(12):  # a loop held to half a CPU is throttled: the quota goes up by 20 %
        time.sleep(PAUSE)
        scratch.engine.period(scratch.members(base), scratch.node, auto)
        raised.append(scratch.driver.read_quota(scratch.ls).quota_us)
        if (raised[-1] or 0) >= 72_000:
            break
    assert (raised[-1] or 0) >= 72_000, raised
    throttling = scratch.cpu.throttling(scratch.ls)
    assert throttling is not None and throttling.nr_throttled > 0
    held = scratch.cpu.read_burst_us(scratch.ls)
    assert held == 50_000  # 100 % of the base, within the raised quota
    off = scratch.engine.period(scratch.members(base), scratch.node, QosPolicy())
    assert scratch.driver.read_quota(scratch.ls).quota_us == base.quota_us
    assert scratch.cpu.read_burst_us(scratch.ls) == 0 and not off.problems
