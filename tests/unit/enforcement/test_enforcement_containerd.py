"""End to end with containerd + runc: a real container in the kubelet's cgroupfs layout is found
by its id and pinned, and its processes run only on the assigned CPUs.

The container runs in the session's private containerd from a busybox root filesystem (fixtures
`containerd` and `busybox_rootfs`, see `containerd_harness.py`), below a scratch cgroup parent
used as the kubelet's --cgroup-root. Skipped with a reason where not root, without
containerd/ctr/runc or a static busybox, or without a writable v1 cpuset hierarchy.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from corepin.core.cpuset import CPUSet
from corepin.enforcement.cgroups import CgroupV1, CpuQuota
from corepin.enforcement.layout import (
    container_cgroup_path,
    find_container_cgroup,
    index_container_cgroups,
)
from corepin.enforcement.reconcile import CgroupTarget, reconcile
from corepin.sysfs.procfs import cgroup_of, cpus_allowed_list, list_threads, read_cgroup
from support.containerd_harness import (
    CGROUP,
    CPUSET,
    NEEDS_CONTAINERS,
    Containerd,
    cgroup_procs,
    remove_cgroup_trees,
    wait_for_procs,
)

CPU = CGROUP / "cpu"

pytestmark = NEEDS_CONTAINERS


@dataclass
class Container:
    id: str
    top: str  # scratch cgroup parent used as the kubelet's --cgroup-root
    cgroup: str


@pytest.fixture
def container(containerd: Containerd, busybox_rootfs: Path) -> Iterator[Container]:
    """`sh` with two `sleep`s in a Burstable pod's container cgroup below a scratch parent."""
    top = f"corepin-e2e-{uuid.uuid4().hex[:8]}"
    cid = uuid.uuid4().hex * 2
    path = container_cgroup_path(
        "cgroupfs", "burstable", str(uuid.uuid4()), "containerd", cid, cgroup_root=top
    )
    try:
        containerd.check(
            "run", "-d",
            "--cgroup", "/" + path,
            "--rootfs", str(busybox_rootfs),
            cid,
            "/bin/sh", "-c", "sleep 300 & sleep 300 & wait",
        )  # fmt: skip
        yield Container(cid, top, path)
    finally:
        containerd.remove_container(cid)
        remove_cgroup_trees([top])


def test_a_real_container_is_found_by_id_and_pinned(
    containerd: Containerd, container: Container
) -> None:
    cid, path, top = container.id, container.cgroup, container.top
    pids = wait_for_procs(path, 3)
    assert len(pids) >= 3, "sh and two sleeps run in the container's cgroup"

    # found by scanning for the id, in the kubelet's cgroupfs layout
    assert find_container_cgroup(CPUSET, cid, under=[top]) == path
    assert index_container_cgroups(CPUSET, under=[top]) == {cid: path}
    assert cgroup_of(read_cgroup(pids[0]), "cpuset") == "/" + path

    online = CPUSet.parse((CPUSET / "cpuset.cpus").read_text())
    want = CPUSet.of(online.last())
    cpu_root = CPU if (CPU / path).is_dir() else None
    drv = CgroupV1(CPUSET, cpu_root)
    if cpu_root is not None:  # a kubelet CPU limit on the container, removed when pinned
        drv.write_quota(path, CpuQuota(50000, 100000))
    report = reconcile(
        [
            CgroupTarget(
                path,
                cpus=want,
                mems=CPUSet.parse((CPUSET / "cpuset.mems").read_text()),
                quota=CpuQuota.unlimited() if cpu_root is not None else None,
            )
        ],
        cgroups=drv,
    )
    assert report.ok, report.errors
    assert any(c.what == "cpuset.cpus" and c.new == str(want) for c in report.changes)
    for pid in cgroup_procs(path):
        for tid in list_threads(pid):
            assert cpus_allowed_list(pid, tid=tid) == want, f"thread {tid} of container pid {pid}"
    if cpu_root is not None:
        assert (cpu_root / path / "cpu.cfs_quota_us").read_text().strip() == "-1"

    # a process started in the container afterwards lands on the same CPUs
    containerd.check("task", "exec", "-d", "--exec-id", "late", cid, "/bin/sleep", "300")
    late = sorted(set(wait_for_procs(path, len(pids) + 1)) - set(pids))
    assert late, "the exec'd process joined the container's cgroup"
    assert all(cpus_allowed_list(p) == want for p in late)

    # steady state: nothing to write
    again = reconcile(
        [CgroupTarget(path, cpus=want, quota=CpuQuota.unlimited() if cpu_root else None)],
        cgroups=drv,
    )
    assert again.writes == 0 and again.changes == []
