"""`corepin scheduler` end to end: the fake API server, three nodes each with a real node agent
(its own synthetic topology and fake cgroup tree) and a kubelet stand-in that starts what is
bound to its node, and the scheduler (with and without --bind-cpus) placing 50 pods of mixed
policies and levels: every pod ends on a node that could hold it, pinned there as asked (read
back from the fake cgroups), no node over-booked, and the pods that fit nowhere stay Pending
with a reason."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from corepin.agent.cluster.scheduler.scheduler import Scheduler, SchedulerSettings
from corepin.core.cpuset import CPUSet
from corepin.kube.client import KubeClient
from corepin.kube.models import parse_cpus_annotation
from corepin.kube.resources import EVENTS, PCB, PODS
from support.e2e_cluster import NAME, Kubelets, cluster, workload
from support.node_harness import FakeNode


def _settled_one(p: dict[str, Any]) -> bool:
    """Pending as unschedulable, or running with every container pinned as asked."""
    conditions = {c["type"]: c for c in (p.get("status") or {}).get("conditions") or []}
    scheduled = conditions.get("PodScheduled", {})
    if not p["spec"].get("nodeName"):
        return bool(
            scheduled.get("status") == "False" and scheduled.get("reason") == "Unschedulable"
        )
    statuses = (p.get("status") or {}).get("containerStatuses") or []
    policy = p["metadata"]["annotations"]["corepin.io/cpu-policy"]
    pinned = parse_cpus_annotation(
        (p["metadata"].get("annotations") or {}).get("corepin.io/cpus") or "{}"
    )
    return len(statuses) == len(p["spec"]["containers"]) and (
        policy == "none" or len(pinned) == len(p["spec"]["containers"])
    )


def _settled(kube: KubeClient, expected: int) -> tuple[bool, list[dict[str, Any]]]:
    pods = kube.list(PODS, "default")["items"]
    return sum(1 for p in pods if _settled_one(p)) == expected, pods


@pytest.mark.slow
@pytest.mark.parametrize("bind_cpus", [False, True], ids=["agent chooses", "--bind-cpus"])
def test_fifty_pods_end_pinned_on_nodes_that_hold_them_or_pending_with_a_reason(
    kube: KubeClient, tmp_path: Path, bind_cpus: bool
) -> None:
    with cluster(kube, tmp_path) as nodes, Kubelets(kube, nodes):
        settings = SchedulerSettings(
            name=NAME,
            bind_cpus=bind_cpus,
            lease_namespace="default",
            lease_duration=3.0,
            renew_deadline=2.0,
            retry_period=0.5,
        )
        scheduler = Scheduler(kube, settings)
        scheduler.start(30)
        try:
            fits = {}
            for i in range(50):
                body, ok = workload(i)
                kube.create(PODS, body, "default")
                fits[body["metadata"]["name"]] = ok
            deadline = time.monotonic() + 90
            done, pods = _settled(kube, 50)
            while not done and time.monotonic() < deadline:
                time.sleep(0.2)
                done, pods = _settled(kube, 50)
            assert done, [
                (
                    p["metadata"]["name"],
                    p["spec"].get("nodeName"),
                    p["metadata"]["annotations"],
                    p.get("status"),
                )
                for p in pods
                if not _settled_one(p)
            ][:3] + [
                (e["involvedObject"]["name"], e["reason"], e["message"])
                for e in kube.list(EVENTS, "default")["items"]
                if e["type"] == "Warning" and e["reason"] != "FailedScheduling"
            ]
            for node in nodes.values():
                assert node.agents[0].wait_idle(30)
            _check(kube, nodes, fits, bind_cpus)
        finally:
            scheduler.stop()


def _check(
    kube: KubeClient, nodes: dict[str, FakeNode], fits: dict[str, bool], bind_cpus: bool
) -> None:
    pods = {p["metadata"]["name"]: p for p in kube.list(PODS, "default")["items"]}
    held: dict[str, CPUSet] = {n: CPUSet() for n in nodes}
    placed = 0
    for name, p in sorted(pods.items()):
        node = p["spec"].get("nodeName")
        if not fits[name]:
            assert node is None, f"{name} fits nowhere but went to {node}"
            (scheduled,) = [c for c in p["status"]["conditions"] if c["type"] == "PodScheduled"]
            assert scheduled["status"] == "False" and scheduled["reason"] == "Unschedulable"
            assert scheduled["message"].startswith("0/3 nodes are available: ")
            assert "cannot give the CPUs the pod asks for" in scheduled["message"]
            assert "node-a: container 'c0' asks for" in scheduled["message"]
            continue
        assert node is not None, f"{name} fits a node but is {p.get('status')}"
        placed += 1
        fake = nodes[node]
        annotations = p["metadata"]["annotations"]
        policy = annotations["corepin.io/cpu-policy"]
        pinned = parse_cpus_annotation(annotations.get("corepin.io/cpus") or "{}")
        for c in p["spec"]["containers"]:
            cpus = fake.cpus(p, c["name"])  # what the agent wrote into the container's cgroup
            if policy == "none":
                assert c["name"] not in pinned
                continue
            want = int(c["resources"]["limits"]["cpu"])
            assert cpus == pinned[c["name"]] and len(cpus) == want, (name, c["name"], cpus)
            if policy == "exclusive":
                assert not cpus & held[node], f"{name}/{c['name']}: CPUs {cpus} held twice"
                held[node] |= cpus
    assert placed == sum(fits.values())
    events = kube.list(EVENTS, "default")["items"]
    reasons = {(e["involvedObject"]["name"], e["reason"]) for e in events}
    assert not [r for r in reasons if r[1] == "CPUPinFailed"], "an agent could not pin a pod"
    for name, ok in fits.items():
        if not ok:
            assert (name, "FailedScheduling") in reasons
    bindings = kube.list(PCB, "default")["items"]
    ours = [b for b in bindings if "corepin.io/created-by" in (b["metadata"].get("labels") or {})]
    if not bind_cpus:
        assert ours == []
        return
    assert ours, "--bind-cpus creates PodCPUBindings"
    for b in ours:
        p = pods[b["spec"]["podName"]]
        pinned = parse_cpus_annotation(p["metadata"]["annotations"]["corepin.io/cpus"])
        for row in b["spec"]["containers"]:
            assert pinned[row["name"]] == CPUSet(r["cpuID"] for r in row["cpuSet"])
