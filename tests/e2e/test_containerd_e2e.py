"""End to end with a real container runtime: containerd + runc, kubelet cgroupfs layout.

The session's private containerd (no CRI plugin, no network, no registry; see
`containerd_harness.py`) runs a container from a busybox rootfs built on the spot, in the cgroup
the kubelet's cgroupfs driver would give a Burstable pod's container:
`/kubepods/burstable/pod<uid>/<container id>`. The agent then finds that cgroup by the container
id and pins it; the container's processes, and a process exec'ed into it afterwards, must run
only on the assigned CPUs.

Needs root, a writable cgroup v1 cpuset hierarchy, and the Debian packages `containerd`, `runc`
and `busybox-static`; skipped with the reason otherwise. Everything it starts is removed at the
end.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from corepin.agent.host.adopt import pin_container
from corepin.agent.host.agent import HostAgent
from corepin.agent.host.reconcile import reconcile_once
from corepin.agent.host.settings import HostSettings
from corepin.core.cpuset import CPUSet
from support.containerd_harness import (
    CPUSET,
    NEEDS_CONTAINERS,
    Containerd,
    cgroup_procs,
    remove_cgroup_trees,
    wait_for_procs,
)
from support.helpers import allowed_cpus

pytestmark = NEEDS_CONTAINERS


@dataclass
class Container:
    id: str
    pod_uid: str
    cgroup: str


@pytest.fixture
def container(containerd: Containerd, busybox_rootfs: Path) -> Iterator[Container]:
    pod_uid = str(uuid.uuid4())
    cid = uuid.uuid4().hex + uuid.uuid4().hex  # 64 hex digits, like a CRI container id
    cgroup = f"kubepods/burstable/pod{pod_uid}/{cid}"
    created = [
        p
        for p in (f"kubepods/burstable/pod{pod_uid}", "kubepods/burstable", "kubepods")
        if not (CPUSET / p).exists()
    ]
    out = containerd.ctr(
        "run",
        "-d",
        "--rootfs",
        "--cgroup",
        "/" + cgroup,
        str(busybox_rootfs),
        cid,
        "/bin/sh",
        "-c",
        "sleep 600 & sleep 600 & wait",
    )
    if out.returncode != 0:
        remove_cgroup_trees([cgroup, *created])
        pytest.skip(f"ctr run failed: {out.stderr.strip()[-300:]}")
    try:
        yield Container(cid, pod_uid, cgroup)
    finally:
        containerd.remove_container(cid)
        remove_cgroup_trees([cgroup, *created])


def test_a_container_in_the_kubelet_cgroupfs_layout_is_found_pinned_and_freed(
    containerd: Containerd, container: Container, tmp_path: Path
) -> None:
    before = wait_for_procs(container.cgroup, 3)
    assert len(before) >= 3, "sh and two sleeps run in the container"
    online = CPUSet(os.sched_getaffinity(0))

    agent = HostAgent(HostSettings(state_dir=str(tmp_path / "state"), cgroups="on"))
    assignment = pin_container(agent, container.id, exclusive=1, runtime="containerd")

    assert assignment.cgroup == container.cgroup
    assert len(assignment.cpus) == 1 and assignment.cpus <= online
    want = str(assignment.cpus)
    assert (CPUSet.parse((CPUSET / container.cgroup / "cpuset.cpus").read_text().strip())) == (
        assignment.cpus
    )
    assert (CPUSET / container.cgroup / "cpuset.mems").read_text().strip() == str(assignment.mems)
    for pid in cgroup_procs(container.cgroup):
        assert allowed_cpus(pid) == want, f"container process {pid} runs outside {want}"

    exec_out = containerd.ctr(
        "task",
        "exec",
        "--exec-id",
        "probe",
        container.id,
        "/bin/grep",
        "Cpus_allowed_list",
        "/proc/self/status",
    )
    assert exec_out.returncode == 0, exec_out.stderr
    assert exec_out.stdout.split(":", 1)[1].strip() == want, "a new process in it inherits"

    state = agent.read_state()
    assert state.get(assignment.id) is not None
    assert assignment.cpus.isdisjoint(state.shared_pool)

    # nothing drifted: a reconcile pass changes nothing
    assert reconcile_once(agent) == []

    # drift: someone rewrote the container's cpuset; reconcile puts it back
    (CPUSET / container.cgroup / "cpuset.cpus").write_text(str(online))
    changes = reconcile_once(agent)
    assert [c.action for c in changes] == ["repinned"]
    for pid in cgroup_procs(container.cgroup):
        assert allowed_cpus(pid) == want

    # the container ends and its cgroup goes away: reconcile frees the CPUs
    containerd.stop_task(container.id)
    deadline = time.monotonic() + 10
    while (CPUSET / container.cgroup).exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    if (CPUSET / container.cgroup).exists():
        (CPUSET / container.cgroup).rmdir()
    freed = reconcile_once(agent)
    assert [c.action for c in freed] == ["freed"]
    assert agent.read_state().get(assignment.id) is None
