"""`corepin scheduler` against the fake API server with published nodes (no agents): node
checks, pods that fit nowhere (condition, FailedScheduling per node, retried when a node
frees), --bind-cpus bindings, and leader election (only the leader binds; a standby takes
over)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import pytest

from corepin.agent.cluster.scheduler.scheduler import Scheduler, SchedulerSettings
from corepin.core.cpuset import CPUSet
from corepin.kube.client import KubeClient
from corepin.kube.resources import EVENTS, NODES, PCB, PODS
from corepin.placement.taints import failure_message, node_refusal
from corepin.state.model import HostState
from corepin.testing import machines as synthetic
from support.helpers import wait_for
from support.kube_helpers import install_crds
from support.placement_helpers import run_pods
from support.placement_publish import publish
from support.pods import EXCLUSIVE, container, corepin_annotations, pod

SMALL = synthetic.named("single_socket_ht")  # 16 CPUs
NAME = "corepin-scheduler"


# ---------------------------------------------------------------------- node checks
def node(name: str, **spec: Any) -> dict[str, Any]:
    labels = spec.pop("labels", {})
    return {"metadata": {"name": name, "labels": labels}, "spec": spec}


def with_spec(**spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "p"}, "spec": spec}


NODE_CASES = [
    ("a plain node takes the pod", node("n"), with_spec(), None),
    ("a cordoned node refuses it", node("n", unschedulable=True), with_spec(), "cordoned"),
    (
        "a cordoned node takes a pod that tolerates node.kubernetes.io/unschedulable",
        node("n", unschedulable=True),
        with_spec(tolerations=[{"key": "node.kubernetes.io/unschedulable", "operator": "Exists"}]),
        None,
    ),
    (
        "a NoSchedule taint the pod does not tolerate refuses it, naming the taint",
        node("n", taints=[{"key": "gpu", "value": "yes", "effect": "NoSchedule"}]),
        with_spec(),
        "taint",
    ),
    (
        "a toleration of the key and value takes it",
        node("n", taints=[{"key": "gpu", "value": "yes", "effect": "NoSchedule"}]),
        with_spec(tolerations=[{"key": "gpu", "value": "yes", "effect": "NoSchedule"}]),
        None,
    ),
    (
        "a PreferNoSchedule taint does not refuse",
        node("n", taints=[{"key": "busy", "effect": "PreferNoSchedule"}]),
        with_spec(),
        None,
    ),
    (
        "a nodeSelector the labels do not match refuses it",
        node("n", labels={"zone": "a"}),
        with_spec(nodeSelector={"zone": "b"}),
        "selector",
    ),
]


@pytest.mark.parametrize(
    ("node_obj", "pod_obj", "code"), [c[1:] for c in NODE_CASES], ids=[c[0] for c in NODE_CASES]
)
def test_node_checks(node_obj: Any, pod_obj: Any, code: str | None) -> None:
    found = node_refusal(node_obj, pod_obj)
    if code is None:
        assert found is None
    else:
        assert found is not None and found[0] == code and found[1].startswith("node n: ")


def test_the_failure_message_counts_by_reason_then_says_why_per_node() -> None:
    failures = {f"n{i}": ("no_fit", f"node n{i}: only {i} free") for i in range(8)}
    failures["bare"] = ("no_topology", "node bare: no NodeCPUTopology")
    text = failure_message(9, failures)
    assert text.startswith("0/9 nodes are available: 8 node(s) cannot give the CPUs the pod")
    assert "1 node(s) have no corepin agent" in text
    assert "bare: no NodeCPUTopology; n0: only 0 free" in text and "and 3 more node(s)" in text
    assert len(failure_message(2000, {f"n{i}": ("no_fit", "x" * 100) for i in range(20)})) <= 1024


# ---------------------------------------------------------------------- against the fake API
@contextlib.contextmanager
def scheduler(kube: KubeClient, **changes: Any) -> Iterator[Scheduler]:
    settings = SchedulerSettings(
        name=NAME,
        lease_namespace="default",
        lease_duration=3.0,
        renew_deadline=2.0,
        retry_period=0.5,
        **changes,
    )
    s = Scheduler(kube, settings)
    s.start(30)
    try:
        yield s
    finally:
        s.stop()


def pending(name: str, cpus: str, level: str | None = None) -> dict[str, Any]:
    body = pod(
        name,
        container("app", cpus, cpus),
        annotations=corepin_annotations(level=level),
        scheduler=NAME,
    )
    del body["metadata"]["uid"]
    return body


def bound_to(kube: KubeClient, name: str) -> str | None:
    node: str | None = kube.get(PODS, name, "default")["spec"].get("nodeName")
    return node


def test_a_pod_that_fits_nowhere_stays_pending_with_why_per_node_until_a_node_frees(
    kube: KubeClient,
) -> None:
    install_crds(kube)
    full = run_pods(
        SMALL, [pod("big", container("app", "12", "12"), annotations=EXCLUSIVE, running=True)]
    )
    publish(kube, "a", full, SMALL)
    publish(kube, "b", full, SMALL)
    kube.create(NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "bare"}})
    with scheduler(kube):
        kube.create(PODS, pending("p", "6"), "default")

        def condition() -> dict[str, Any] | None:
            conds = kube.get(PODS, "p", "default").get("status", {}).get("conditions") or []
            return next((c for c in conds if c["type"] == "PodScheduled"), None)

        wait_for(lambda: condition() is not None, timeout=20, what="PodScheduled")
        cond = condition()
        assert cond is not None and (cond["status"], cond["reason"]) == ("False", "Unschedulable")
        message = cond["message"]
        assert message.startswith("0/3 nodes are available: ")
        assert "a: container 'app' asks for 6 exclusive CPU(s)" in message
        assert "b: container 'app'" in message and "bare: no corepin agent" in message
        events = [
            e for e in kube.list(EVENTS, "default")["items"] if e["reason"] == "FailedScheduling"
        ]
        assert events and events[0]["type"] == "Warning" and events[0]["message"] == message
        assert bound_to(kube, "p") is None
        publish(kube, "b", HostState.new(SMALL), SMALL)  # the big pod on b has gone
        wait_for(lambda: bound_to(kube, "p") == "b", timeout=20, what="p bound to b")


def test_a_tainted_node_is_skipped(kube: KubeClient) -> None:
    install_crds(kube)
    publish(kube, "a", HostState.new(SMALL), SMALL)
    publish(
        kube,
        "b",
        run_pods(
            SMALL, [pod("x", container("app", "4", "4"), annotations=EXCLUSIVE, running=True)]
        ),
        SMALL,
    )
    taint = {"key": "dedicated", "value": "db", "effect": "NoSchedule"}
    kube.patch(NODES, "b", {"spec": {"taints": [taint]}})
    with scheduler(kube):
        kube.create(PODS, pending("p", "2"), "default")
        wait_for(lambda: bound_to(kube, "p") is not None, timeout=20, what="p bound")
    # MaximumUtilization would prefer the busier b, but b's taint is not tolerated
    assert bound_to(kube, "p") == "a"


def test_bind_cpus_creates_the_binding_a_user_would_before_binding(kube: KubeClient) -> None:
    install_crds(kube)
    publish(kube, "a", HostState.new(SMALL), SMALL)
    with scheduler(kube, bind_cpus=True):
        created = kube.create(PODS, pending("p", "2", level="core"), "default")
        wait_for(lambda: bound_to(kube, "p") == "a", timeout=20, what="p bound")
    (binding,) = kube.list(PCB, "default")["items"]
    meta, spec = binding["metadata"], binding["spec"]
    assert meta["labels"] == {"corepin.io/created-by": NAME, "corepin.io/node": "a"}
    assert meta["ownerReferences"][0]["uid"] == created["metadata"]["uid"]
    assert spec["podName"] == "p" and spec["exclusivenessLevel"] == "Core"
    (row,) = spec["containers"]
    cpus = CPUSet(c["cpuID"] for c in row["cpuSet"])
    assert row["name"] == "app" and len(cpus) == 2
    assert "managed-by" not in str(meta["labels"])  # a request, as a user writes one
    # validated by the scheduler that chose the CPUs, so the agent applies it at once
    assert binding["status"]["phase"] == "Validated"
    assert binding["status"]["nodeName"] == "a"
    (validated,) = binding["status"]["conditions"]
    assert (validated["type"], validated["status"]) == ("Validated", "True")


def test_only_the_leader_binds_and_a_standby_takes_over(kube: KubeClient) -> None:
    install_crds(kube)
    publish(kube, "a", HostState.new(SMALL), SMALL)
    with scheduler(kube, identity="one") as first:
        wait_for(lambda: first.leading, timeout=20, what="the first leads")
        with scheduler(kube, identity="two") as second:
            kube.create(PODS, pending("p1", "1"), "default")
            wait_for(lambda: first.scheduled == 1, timeout=20, what="p1 bound by the leader")
            assert bound_to(kube, "p1") == "a"
            assert not second.leading and second.scheduled == 0
            first.stop()  # releases the Lease
            wait_for(lambda: second.leading, timeout=20, what="the standby leads")
            kube.create(PODS, pending("p2", "1"), "default")
            wait_for(lambda: second.scheduled == 1, timeout=20, what="p2 bound by the standby")
            assert bound_to(kube, "p2") == "a"


def test_a_pod_deleted_while_pending_is_forgotten(kube: KubeClient) -> None:
    install_crds(kube)
    publish(
        kube,
        "a",
        run_pods(
            SMALL, [pod("x", container("app", "14", "14"), annotations=EXCLUSIVE, running=True)]
        ),
        SMALL,
    )
    with scheduler(kube) as s:
        kube.create(PODS, pending("p", "4"), "default")
        wait_for(lambda: s.unschedulable >= 1, timeout=20, what="p found unschedulable")
        kube.delete(PODS, "p", "default")
        time.sleep(0.5)
        assert s.wait_idle(5) and len(s.cluster.ledger) == 0


# ---------------------------------------------------------------------- the agent keeps promises
def test_the_agent_keeps_cpus_promised_by_a_binding_for_a_pod_not_running_yet(
    kube: KubeClient, tmp_path: Any
) -> None:
    from support.node_harness import FakeNode

    fake = FakeNode(kube, SMALL, tmp_path, name="a")
    try:
        agent = fake.agent()
        promised = {
            "apiVersion": "corepin.io/v1alpha1",
            "kind": "PodCPUBinding",
            "metadata": {
                "name": "later.corepin-scheduler",
                "namespace": "default",
                "labels": {"corepin.io/node": "a"},
            },
            "spec": {
                "podName": "later",
                "exclusivenessLevel": "Core",
                "containers": [{"name": "app", "cpuSet": [{"cpuID": 0}]}],
            },
        }
        # the scheduler's flow: the pod waits unbound, its binding is created and marked
        # Validated for node a (the agent holds CPUs only for validated bindings, and for a
        # pod not bound yet only when the status names its node), then the pod is bound
        body = pod("later", container("app", "1", memory="64Mi"), annotations=EXCLUSIVE)
        kube.create(PODS, body, "default")
        kube.create(PCB, promised, "default")
        kube.patch_status(
            PCB,
            "later.corepin-scheduler",
            {"status": {"phase": "Validated", "nodeName": "a"}},
            "default",
        )
        time.sleep(0.3)
        # a pod pinned from its annotation meanwhile leaves the promised core alone
        now = fake.pod("now", container("app", "2", memory="64Mi"), annotations=EXCLUSIVE)
        fake.run(now)
        assert agent.wait_idle(10)
        assert not fake.cpus(now, "app") & CPUSet.parse("0,8")
        from corepin.kube.resources import NCPT

        free = CPUSet.parse(kube.get(NCPT, "a")["status"]["free"])
        assert not free & CPUSet.parse("0,8"), "promised CPUs are not published as free"
        kube.bind("default", "later", "a")
        later = kube.get(PODS, "later", "default")
        fake.seen(later)
        fake.run(later)
        assert agent.wait_idle(10)
        assert fake.cpus(later, "app") == CPUSet.of(0)
    finally:
        fake.close()


# ---------------------------------------------------------------------- the feed
def test_a_heartbeat_revives_a_stale_node_and_keeps_its_answers_while_a_change_drops_them(
    kube: KubeClient,
) -> None:
    from corepin.agent.cluster.catalog import PlacementFeed
    from corepin.placement.cluster import Cluster
    from corepin.placement.request import pod_request

    install_crds(kube)
    publish(kube, "a", HostState.new(SMALL), SMALL, heartbeat=time.time() - 600)
    cluster = Cluster(stale_after=60.0)
    feed = PlacementFeed(kube, cluster)
    feed.start(20)
    try:
        wait_for(lambda: cluster.view("a") is not None, what="node a read")
        ask = pod_request(pod("p", container("app", "2", "2"), annotations=EXCLUSIVE))
        (stale,) = cluster.evaluate(ask, ["a"], time.time())
        assert not stale.ok and stale.code == "stale"
        view = cluster.view("a")
        publish(kube, "a", HostState.new(SMALL), SMALL)  # the agent is back: heartbeat only
        wait_for(lambda: cluster.evaluate(ask, ["a"], time.time())[0].ok, what="a fresh again")
        assert cluster.view("a") is view, "a heartbeat alone keeps the view and its answers"
        busy = run_pods(
            SMALL, [pod("x", container("app", "14", "14"), annotations=EXCLUSIVE, running=True)]
        )
        publish(kube, "a", busy, SMALL)
        wait_for(lambda: cluster.view("a") is not view, what="the change read")
        (full,) = cluster.evaluate(ask, ["a"], time.time())
        assert not full.ok and full.code == "no_fit"
    finally:
        feed.stop()
