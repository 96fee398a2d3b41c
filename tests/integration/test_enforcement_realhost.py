"""Real cgroups on this host: scratch groups under the real v1 cpuset (and cpu) mounts.

Every test creates `corepin-test-<random>` groups, moves real processes in, verifies through
/proc/PID/status, and removes everything again (processes killed, groups removed bottom-up) even
when it fails. Skipped with a reason where not root or without a writable v1 cpuset hierarchy.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from corepin.core.cpuset import CPUSet
from corepin.core.errors import CgroupError
from corepin.core.ids import IdError
from corepin.enforcement.affinity import AffinityError, pin_process_tree
from corepin.enforcement.cgroups import CgroupV1, CpuQuota, detect_mounts, open_cgroups
from corepin.enforcement.layout import container_cgroup_path, find_container_cgroup
from corepin.enforcement.reconcile import CgroupTarget, ProcessTarget, reconcile
from corepin.sysfs.procfs import cgroup_of, cpus_allowed_list, list_threads, read_cgroup
from support.helpers import kill_and_remove_cgroup, reap

CPUSET = Path("/sys/fs/cgroup/cpuset")
CPU = Path("/sys/fs/cgroup/cpu")


def _skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root to write cgroups"
    if not (CPUSET / "cpuset.cpus").exists():
        return f"no cgroup v1 cpuset hierarchy at {CPUSET}"
    if not os.access(CPUSET, os.W_OK):
        return f"{CPUSET} is not writable"
    return None


_REASON = _skip_reason()
pytestmark = [
    pytest.mark.realhost,
    pytest.mark.skipif(_REASON is not None, reason=_REASON or ""),
]

ONLINE = CPUSet.parse(CPUSET.joinpath("cpuset.cpus").read_text()) if _REASON is None else CPUSet()
MEMS = CPUSet.parse(CPUSET.joinpath("cpuset.mems").read_text()) if _REASON is None else CPUSet()
needs_two = pytest.mark.skipif(len(ONLINE) < 2, reason="needs two CPUs in the root cpuset")


@pytest.fixture
def scratch() -> Iterator[tuple[CgroupV1, str]]:
    """(driver over the real cpuset and cpu mounts, name of a fresh scratch group)."""
    top = f"corepin-test-{uuid.uuid4().hex[:10]}"
    cpu_root = CPU if (CPU / "cpu.cfs_quota_us").exists() and os.access(CPU, os.W_OK) else None
    drv = CgroupV1(CPUSET, cpu_root)
    try:
        drv.create(top)
        yield drv, top
    finally:
        assert kill_and_remove_cgroup(CPUSET / top), f"could not clean up {CPUSET / top}"
        if cpu_root is not None:
            assert kill_and_remove_cgroup(cpu_root / top), f"could not clean up {cpu_root / top}"


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(["sleep", "120"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_detection_finds_this_hosts_cpuset_mount() -> None:
    mounts = detect_mounts()
    assert mounts.v1.get("cpuset") == str(CPUSET)
    drv = open_cgroups(mounts)
    assert drv.version == 1 and drv.root == str(CPUSET)


@needs_two
def test_a_process_moved_into_a_scratch_cpuset_runs_only_on_its_cpus(
    scratch: tuple[CgroupV1, str], sleeper: subprocess.Popen[bytes]
) -> None:
    drv, top = scratch
    group = f"{top}/run-1"
    want = CPUSet.of(ONLINE.last())
    report = reconcile(
        [CgroupTarget(group, cpus=want, mems=CPUSet.of(MEMS.first()), create=True)], cgroups=drv
    )
    assert report.ok, report.errors
    drv.add_process(group, sleeper.pid)
    assert cpus_allowed_list(sleeper.pid) == want
    assert cgroup_of(read_cgroup(sleeper.pid), "cpuset") == f"/{group}"
    assert drv.procs(group) == [sleeper.pid]
    steady = reconcile([CgroupTarget(group, cpus=want, mems=CPUSet.of(MEMS.first()))], cgroups=drv)
    assert steady.writes == 0 and steady.changes == []


@needs_two
def test_every_thread_of_a_moved_process_is_restricted(scratch: tuple[CgroupV1, str]) -> None:
    drv, top = scratch
    group = f"{top}/threads"
    drv.create(group)
    drv.write_cpus(group, CPUSet.of(ONLINE.first()))
    code = (
        "import threading, time\n"
        "ev = threading.Event()\n"
        "[threading.Thread(target=ev.wait, daemon=True).start() for _ in range(4)]\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        proc.stdout.readline()
        drv.add_process(group, proc.pid)
        tids = list_threads(proc.pid)
        assert len(tids) == 5
        for tid in tids:
            assert cpus_allowed_list(proc.pid, tid=tid) == CPUSet.of(ONLINE.first())
    finally:
        reap(proc)


@needs_two
def test_the_real_kernel_enforces_the_orderings_and_errors_are_mapped(
    scratch: tuple[CgroupV1, str], sleeper: subprocess.Popen[bytes]
) -> None:
    drv, top = scratch
    first, second = CPUSet.of(ONLINE.first()), CPUSet.of(ONLINE.last())
    drv.create(f"{top}/pod/ctr")
    drv.write_cpus(f"{top}/pod/ctr", first)
    drv.write_cpus(f"{top}/pod", first)
    drv.add_process(f"{top}/pod/ctr", sleeper.pid)
    with pytest.raises(CgroupError) as busy:
        drv.write_cpus(f"{top}/pod", second)
    assert busy.value.reason == "cgroup_busy", "a parent cannot drop CPUs its child uses"
    with pytest.raises(CgroupError) as outside:
        drv.write_cpus(f"{top}/pod/ctr", second)
    assert outside.value.reason == "cgroup_not_within_parent"
    with pytest.raises(CgroupError) as empty:
        drv.write_cpus(f"{top}/pod/ctr", CPUSet())
    assert empty.value.reason == "cgroup_empty_cpuset", "tasks would be left without CPUs"
    with pytest.raises(CgroupError) as out_of_range:
        drv.write_cpus(f"{top}/pod/ctr", CPUSet.parse("0-4095"))
    assert out_of_range.value.reason in ("cgroup_out_of_range", "cgroup_invalid_value")
    with pytest.raises(CgroupError) as no_node:
        drv.write_mems(f"{top}/pod/ctr", CPUSet.of(MEMS.last() + 1))
    assert no_node.value.reason == "cgroup_invalid_value"

    # the reconcile engine orders the same change correctly: widen, move the child, shrink
    report = reconcile(
        [CgroupTarget(f"{top}/pod", cpus=second), CgroupTarget(f"{top}/pod/ctr", cpus=second)],
        cgroups=drv,
    )
    assert report.ok, report.errors
    assert [c.why for c in report.changes] == ["widen-first", "target", "target"]
    assert cpus_allowed_list(sleeper.pid) == second


def test_tasks_cannot_join_a_v1_cpuset_without_cpus_and_mems(
    scratch: tuple[CgroupV1, str], sleeper: subprocess.Popen[bytes]
) -> None:
    drv, top = scratch
    raw = CPUSET / top / "raw"
    raw.mkdir()  # plain mkdir: cpus and mems start empty (clone_children is off)
    if (CPUSET / top / "raw" / "cpuset.cpus").read_text().strip():
        pytest.skip("cgroup.clone_children is on: new cpusets are not empty here")
    with pytest.raises(CgroupError) as info:
        drv.add_process(f"{top}/raw", sleeper.pid)
    assert info.value.reason == "cgroup_empty_cpuset"
    assert "cpuset.mems" in str(info.value)
    drv.create(f"{top}/made")  # create() gives the new group its parent's cpus and mems
    drv.add_process(f"{top}/made", sleeper.pid)
    assert cpus_allowed_list(sleeper.pid) == drv.read_cpus(top)


def test_quota_is_removed_and_v1_refuses_a_child_quota_above_its_parent(
    scratch: tuple[CgroupV1, str],
) -> None:
    drv, top = scratch
    if drv.cpu_root is None:
        pytest.skip(f"no writable cpu controller at {CPU}")
    drv.create(f"{top}/pod/ctr")
    drv.write_quota(f"{top}/pod", CpuQuota(50000, 100000))
    with pytest.raises(CgroupError) as info:
        drv.write_quota(f"{top}/pod/ctr", CpuQuota(100000, 100000))
    assert info.value.reason == "cgroup_invalid_value"
    drv.write_quota(f"{top}/pod/ctr", CpuQuota(20000, 100000))
    report = reconcile(
        [
            CgroupTarget(f"{top}/pod/ctr", quota=CpuQuota.unlimited()),
            CgroupTarget(f"{top}/pod", quota=CpuQuota.unlimited()),
        ],
        cgroups=drv,
    )
    assert report.ok, report.errors
    assert drv.read_quota(f"{top}/pod/ctr").is_unlimited
    assert drv.read_quota(f"{top}/pod").is_unlimited
    assert (
        Path(drv.cpu_root) / top / "pod" / "ctr" / "cpu.cfs_quota_us"
    ).read_text().strip() == "-1"


@needs_two
def test_a_container_in_the_kubelet_layout_is_found_and_pinned(
    scratch: tuple[CgroupV1, str], sleeper: subprocess.Popen[bytes]
) -> None:
    drv, top = scratch
    uid = str(uuid.uuid4())
    cid = uuid.uuid4().hex * 2
    path = container_cgroup_path("cgroupfs", "burstable", uid, "containerd", cid, cgroup_root=top)
    drv.create(path)
    drv.add_process(path, sleeper.pid)
    found = find_container_cgroup(CPUSET, cid, under=[top])
    assert found == path
    want = CPUSet.of(ONLINE.last())
    report = reconcile(
        [CgroupTarget(found, cpus=want, quota=CpuQuota.unlimited() if drv.cpu_root else None)],
        cgroups=drv,
    )
    assert report.ok, report.errors
    assert cpus_allowed_list(sleeper.pid) == want


def test_a_bad_container_id_never_reaches_the_filesystem(scratch: tuple[CgroupV1, str]) -> None:
    drv, top = scratch
    with pytest.raises(IdError):
        container_cgroup_path("cgroupfs", "burstable", str(uuid.uuid4()), "containerd", "../../x")
    with pytest.raises(IdError):
        reconcile([CgroupTarget(f"{top}/../escape", cpus=ONLINE, create=True)], cgroups=drv)
    assert not (CPUSET / "escape").exists()


@needs_two
def test_affinity_outside_the_process_cpuset_is_refused_and_reported(
    scratch: tuple[CgroupV1, str], sleeper: subprocess.Popen[bytes]
) -> None:
    drv, top = scratch
    drv.create(f"{top}/narrow")
    drv.write_cpus(f"{top}/narrow", CPUSet.of(ONLINE.last()))
    drv.add_process(f"{top}/narrow", sleeper.pid)
    with pytest.raises(AffinityError) as info:
        pin_process_tree(sleeper.pid, CPUSet.of(ONLINE.first()))
    assert info.value.reason == "affinity_invalid"
    report = reconcile([ProcessTarget(sleeper.pid, ONLINE)])
    assert [e.reason for e in report.errors] == ["affinity_restricted"]
    assert cpus_allowed_list(sleeper.pid) == CPUSet.of(ONLINE.last())
