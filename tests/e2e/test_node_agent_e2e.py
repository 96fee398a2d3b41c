"""The node agent end to end with real containers: a real `corepin agent` process against the
fake API server, the kubelet harness running containerd + runc containers in a scratch kubelet
cgroup root on this host's real cgroup v1 cpuset hierarchy. Every check reads the container
processes' `Cpus_allowed_list` from /proc. Skipped (with the harness's reason) where containers
cannot run."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from corepin.core.cpuset import CPUSet
from corepin.kube.client import KubeClient
from support.helpers import corepin_argv, reap, wait_for
from support.kube_helpers import install_crds
from support.kubelet_harness import KubeletHarness
from support.pods import EXCLUSIVE, container, pod

ONLINE = CPUSet(os.sched_getaffinity(0))

pytestmark = [
    pytest.mark.realhost,
    pytest.mark.skipif(len(ONLINE) < 2, reason="needs at least 2 CPUs"),
]


@pytest.fixture
def agent(
    kubelet_harness: KubeletHarness, kube: KubeClient, tmp_path: Path
) -> Iterator[dict[str, Any]]:
    install_crds(kube)
    argv = corepin_argv(
        "agent",
        *kubelet_harness.agent_args(),
        "--state-dir",
        str(tmp_path / "state"),
        "--kubelet-state",
        str(tmp_path / "no-kubelet-state"),
        "--grpc-socket",
        str(tmp_path / "corepin.sock"),
        "--metrics-address",
        "127.0.0.1:0",
        "--assignment-dir",
        str(tmp_path / "assignments"),
        "--resync-period",
        "2",
    )
    handle: dict[str, Any] = {"argv": argv}

    def start() -> None:
        if "proc" in handle:
            reap(handle["proc"])  # the one the test stopped
        handle["proc"] = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True)

    handle["start"] = start
    start()
    try:
        yield handle
    finally:
        proc = handle["proc"]
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=10)
        reap(proc)


def allowed(kubelet: KubeletHarness, pod: str, container: str = "app") -> CPUSet:
    """The CPUs every process of a container may run on (all the same, or the test fails)."""
    view = kubelet.container_view("default", pod, container)
    cpus = {t.cpus_allowed for t in view.cgroup.tasks}
    assert len(cpus) == 1, f"processes of {pod}/{container} disagree: {cpus}"
    return CPUSet.parse(cpus.pop())


def pinned(kubelet: KubeletHarness, pod: str, want: CPUSet | int) -> bool:
    try:
        got = allowed(kubelet, pod)
    except (AssertionError, KeyError, LookupError):
        return False
    return got == want if isinstance(want, CPUSet) else len(got) == want


def test_real_containers_are_pinned_repinned_and_released(
    kubelet_harness: KubeletHarness, agent: dict[str, Any], fake_api: Any
) -> None:
    k = kubelet_harness
    k.create_pod(pod("web", container(requests={"cpu": "100m"})))
    k.wait_running("default", "web")
    db = container(requests={"cpu": "1"}, limits={"cpu": "1", "memory": "64Mi"})
    k.create_pod(pod("db", db, annotations=EXCLUSIVE))
    k.wait_running("default", "db")
    wait_for(lambda: pinned(k, "db", 1), timeout=30, what="db on one CPU of its own")
    mine = allowed(k, "db")
    wait_for(lambda: pinned(k, "web", ONLINE - mine), timeout=30, what="web on the rest")
    view = k.container_view("default", "db", "app")
    assert view.cgroup.cfs_quota_us in (None, -1), "an exclusive container has no CFS quota"

    # a container restart: the new container gets the same CPU
    k.restart_container("default", "db", "app")
    wait_for(lambda: pinned(k, "db", mine), timeout=30, what="the restarted container")

    # the agent killed with SIGKILL and restarted: pins stay right, nothing handed out twice
    agent["proc"].send_signal(signal.SIGKILL)
    agent["proc"].wait(timeout=10)
    k.create_pod(pod("late", container(requests={"cpu": "100m"})))
    k.wait_running("default", "late")
    agent["start"]()
    wait_for(lambda: pinned(k, "late", ONLINE - mine), timeout=30, what="late after the restart")
    assert allowed(k, "db") == mine

    # the watch connections dropped and the history compacted (410 Gone on the next watch)
    fake_api.drop_watches()
    fake_api.compact()
    k.create_pod(pod("after-410", container(requests={"cpu": "100m"})))
    k.wait_running("default", "after-410")
    wait_for(lambda: pinned(k, "after-410", ONLINE - mine), timeout=30, what="a pod after 410")

    # the annotation flipped: db goes to the shared pool, web and late grow back
    _annotate(k, "db", {"corepin.io/cpu-policy": "none"})
    wait_for(lambda: pinned(k, "db", ONLINE), timeout=30, what="db on the shared pool")
    wait_for(lambda: pinned(k, "web", ONLINE), timeout=30, what="web on every CPU")

    # and back: deletion releases
    _annotate(k, "db", {"corepin.io/cpu-policy": "exclusive"})
    wait_for(lambda: pinned(k, "db", 1), timeout=30, what="db exclusive again")
    k.delete_pod("default", "db")
    wait_for(lambda: pinned(k, "web", ONLINE), timeout=30, what="the CPU back to the pool")


def _annotate(k: KubeletHarness, pod: str, annotations: dict[str, str]) -> None:
    from corepin.kube.resources import PODS

    k.client.patch(PODS, pod, {"metadata": {"annotations": annotations}}, "default")
