"""The NRI plugin's test bed itself: a private containerd 1.7 with the CRI and NRI on
(`support.cri_harness`, fixture `cri_bed`), with no plugin connected.

It runs a pod and a container whose first command prints its allowed CPUs, and that line is
read back; the kubelet's CPU settings reach the container's cgroup; UpdateContainerResources
changes the live cpuset; a restart of the daemon leaves a running container running; the NRI
socket accepts a connection; and a bed closed after its daemon was killed with containers
running leaves nothing on the host (no process, mount, cgroup, shim socket or file), while a
process that is not the bed's survives the cleanup.

Needs root, a writable cgroup v1 cpuset hierarchy, runc, busybox-static and the fetched bed
(`scripts/fetch-containerd-nri.sh`); skipped with the reason otherwise.
"""

from __future__ import annotations

import os
import socket
import stat
import subprocess
from pathlib import Path

import pytest

from corepin.core.cpuset import CPUSet
from support.containerd_harness import CGROUP, CPUSET
from support.cri_client import CREATED, EXITED, RUNNING, report_then
from support.cri_harness import NEEDS_CRI_BED, CriBed, cri_testbed
from support.helpers import reap

pytestmark = NEEDS_CRI_BED


def gone(pid: int) -> bool:
    """Whether the process has ended (a zombie nobody reaped yet has ended too)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def host_cpus() -> CPUSet:
    return CPUSet.parse((CPUSET / "cpuset.cpus").read_text())


def test_a_pod_and_a_container_run_and_report_their_cpus(cri_bed: CriBed) -> None:
    cri = cri_bed.cri
    pod = cri.run_pod("smoke", qos="burstable")
    cid = cri.create_and_start(
        pod, "report", report_then(), cpu_request_milli=500, cpu_limit_milli=1500
    )
    assert cri.container_status(cid).state == RUNNING
    assert CPUSet.parse(cri.reported_cpus(cid)) == host_cpus()
    assert CPUSet.parse(cri_bed.live_allowed_cpus(cid)) == host_cpus()
    # the kubelet's cgroupfs layout below the bed's own cgroup root
    uid = cri.pods[pod].uid
    cgroup = cri_bed.container_cgroup(cid)
    assert cgroup == f"{cri_bed.cgroup_root.lstrip('/')}/burstable/pod{uid}/{cid}"
    # the kubelet's mapping of 500m requested, 1500m limit
    cpu = CGROUP / "cpu" / cgroup
    assert (cpu / "cpu.shares").read_text().strip() == "512"
    assert (cpu / "cpu.cfs_quota_us").read_text().strip() == "150000"
    assert (cpu / "cpu.cfs_period_us").read_text().strip() == "100000"
    assert [c.id for c in cri.list_containers(pod_id=pod)] == [cid]
    cri.stop(cid)
    assert cri.container_status(cid).state == EXITED
    cri.remove(cid)
    cri.remove_pod(pod)
    assert pod not in {p.id for p in cri.list_pods()}


def test_update_container_resources_changes_the_live_cpuset(cri_bed: CriBed) -> None:
    cpus = host_cpus()
    if len(cpus) < 2:
        pytest.skip("needs two CPUs to see a cpuset change")
    cri = cri_bed.cri
    pod = cri.run_pod("update")
    cid = cri.create_container(pod, "sleeper", report_then())
    assert cri.container_status(cid).state == CREATED
    cri.start(cid)
    assert CPUSet.parse(cri.reported_cpus(cid)) == cpus
    one = str(CPUSet.of(cpus.last()))
    cri.update_resources(cid, cpuset_cpus=one)
    assert cri_bed.live_cpuset(cid) == one
    assert cri_bed.live_allowed_cpus(cid) == one
    cri.remove_pod(pod)


def test_a_restart_of_the_daemon_keeps_a_running_container(cri_bed: CriBed) -> None:
    cri = cri_bed.cri
    pod = cri.run_pod("restart")
    cid = cri.create_and_start(pod, "survivor", report_then())
    cri.reported_cpus(cid)
    pid = cri_bed.container_pid(cid)
    cri_bed.restart()
    assert cri.container_status(cid).state == RUNNING
    assert cri_bed.container_pid(cid) == pid
    os.kill(pid, 0)  # the very process
    # and the restarted daemon runs new containers in the old pod
    after = cri.create_and_start(pod, "newcomer", report_then())
    assert CPUSet.parse(cri.reported_cpus(after)) == host_cpus()
    cri.remove_pod(pod)


def test_the_nri_socket_accepts_a_connection(cri_bed: CriBed, nri_socket: str) -> None:
    assert nri_socket.startswith(str(cri_bed.base))
    assert stat.S_ISSOCK(os.stat(nri_socket).st_mode)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(5)
        conn.connect(nri_socket)
    # no plugin is registered, and the runtime runs containers as before
    pod = cri_bed.cri.run_pod("after-nri-connection")
    cid = cri_bed.cri.create_and_start(pod, "c", report_then())
    assert cri_bed.cri.reported_cpus(cid)
    cri_bed.cri.remove_pod(pod)


@pytest.mark.parametrize("crash", [False, True], ids=["daemon-up", "daemon-killed"])
def test_cleanup_leaves_nothing_and_touches_no_other_process(
    tmp_path_factory: pytest.TempPathFactory, crash: bool
) -> None:
    bystander = subprocess.Popen(["sleep", "300"])
    try:
        with cri_testbed(
            tmp_path_factory.mktemp("cri-cleanup"), tmp_path_factory.getbasetemp() / "cri-api"
        ) as bed:
            pod = bed.cri.run_pod("left-running")
            cid = bed.cri.create_and_start(pod, "orphan", report_then())
            bed.cri.reported_cpus(cid)
            pid = bed.container_pid(cid)
            if crash:  # shims, containers, mounts and cgroups stay without their daemon
                bed.kill_daemon()
            left = bed.leftovers()
            for kind in ("process", "mount", "cgroup", "directory"):
                assert any(item.startswith(f"{kind} ") for item in left), (kind, left)
            sockets = bed.shim_sockets()
            assert any(s.is_socket() for s in sockets)
            assert not gone(pid)
        # (cri_testbed asserted that close() left nothing: checked again, in detail)
        assert bed.leftovers() == []
        assert gone(pid)
        assert not any(s.exists() for s in sockets)
        assert bystander.poll() is None
    finally:
        reap(bystander)
