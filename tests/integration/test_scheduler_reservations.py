"""CPUReservations in `corepin scheduler` and `corepin extender` over the fake API server
(published nodes, no agents; the CRD as deploy/crd ships it): the scheduler gives a node-less
reservation a node (status.nodeName, phase still Pending) and sends a matching pod there; the
extender's filter and prioritize keep reserved CPUs from pods that do not match and send the
matching ones to the reservation's node."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from corepin.agent.cluster.scheduler.scheduler import Scheduler, SchedulerSettings
from corepin.kube.client import KubeClient
from corepin.kube.resources import CPUR, PODS
from corepin.state.model import HostState
from corepin.testing import machines as synthetic
from support.extender_harness import Extender
from support.helpers import wait_for
from support.kube_helpers import install_crds
from support.placement_helpers import run_pods
from support.placement_publish import publish
from support.pods import EXCLUSIVE, container, pod

SMALL = synthetic.named("single_socket_ht")  # 16 CPUs
NAME = "corepin-scheduler"
TRADER = {"app": "trader"}


def reservation(name: str, cpus: int, node: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "cpus": cpus,
        "owners": [{"namespace": "default", "labelSelector": {"matchLabels": TRADER}}],
    }
    if node:
        spec["nodeName"] = node
    return {
        "apiVersion": "corepin.io/v1alpha1",
        "kind": "CPUReservation",
        "metadata": {"name": name},
        "spec": spec,
    }


def a_pod(name: str, cpus: int, *, labels: dict[str, str], scheduler: str | None = None) -> Any:
    body = pod(
        name,
        container("app", cpus, cpus),
        annotations=EXCLUSIVE,
        labels=labels,
        scheduler=scheduler,
    )
    del body["metadata"]["uid"]
    return body


@contextlib.contextmanager
def scheduler(kube: KubeClient) -> Iterator[Scheduler]:
    settings = SchedulerSettings(
        name=NAME, lease_duration=3.0, renew_deadline=2.0, retry_period=0.5
    )
    s = Scheduler(kube, settings)
    s.start(30)
    try:
        yield s
    finally:
        s.stop()


def bound_to(kube: KubeClient, name: str) -> str | None:
    node: str | None = kube.get(PODS, name, "default")["spec"].get("nodeName")
    return node


def status(kube: KubeClient, name: str) -> dict[str, Any]:
    found: dict[str, Any] = kube.get(CPUR, name).get("status") or {}
    return found


def busy(cpus: int) -> HostState:
    return run_pods(
        SMALL, [pod("x", container("app", cpus, cpus), annotations=EXCLUSIVE, running=True)]
    )


def test_the_scheduler_places_a_reservation_and_sends_its_pod_there(kube: KubeClient) -> None:
    install_crds(kube)
    publish(kube, "a", busy(10), SMALL)  # 5 CPUs left for exclusive use
    publish(kube, "b", busy(2), SMALL)  # 13 left
    with scheduler(kube) as s:
        kube.create(CPUR, reservation("r", 8))
        wait_for(lambda: status(kube, "r").get("nodeName") is not None, 20, "r placed")
        placed = status(kube, "r")
        assert placed["nodeName"] == "b"  # only b can hold 8
        assert placed["phase"] == "Pending"  # until b's agent holds the CPUs
        assert "chosen by corepin-scheduler" in placed["message"]
        # b has 13 - 8 reserved = 5 left for anyone else: a pod of 6 fits nowhere
        kube.create(PODS, a_pod("web", 6, labels={"app": "web"}, scheduler=NAME), "default")
        # ... while the reservation's own pod goes to b, on the reserved CPUs
        kube.create(PODS, a_pod("trader", 8, labels=TRADER, scheduler=NAME), "default")
        wait_for(lambda: bound_to(kube, "trader") == "b", 20, "trader bound to b")
        assert s.wait_idle(10)
        assert bound_to(kube, "web") is None


def test_a_reservation_no_node_can_hold_says_why_and_waits(kube: KubeClient) -> None:
    install_crds(kube)
    publish(kube, "a", busy(10), SMALL)
    with scheduler(kube):
        kube.create(CPUR, reservation("big", 12))
        wait_for(lambda: "message" in status(kube, "big"), 20, "a message on big")
        assert status(kube, "big")["message"].startswith("0/1 nodes are available")
        assert "nodeName" not in status(kube, "big")
        publish(kube, "a", HostState.new(SMALL), SMALL)  # the busy pod has gone
        wait_for(lambda: status(kube, "big").get("nodeName") == "a", 20, "big placed on a")


def test_the_extender_counts_reservations_for_pods_that_match_and_those_that_do_not(
    kube: KubeClient,
) -> None:
    install_crds(kube)
    publish(kube, "roomy", HostState.new(SMALL), SMALL)
    publish(kube, "half", busy(7), SMALL)
    kube.create(CPUR, reservation("r", 8, node="roomy"))
    with Extender(kube) as ext:
        ext.wait_nodes("roomy", "half")
        wait_for(lambda: bool(ext.cluster.reservations()), 10, "the extender sees r")
        names = ["roomy", "half"]
        web = pod("web", container("app", 8, 8), annotations=EXCLUSIVE, labels={"app": "web"})
        code, answer = ext.post("filter", {"Pod": web, "Nodes": None, "NodeNames": names})
        assert code == 200
        # roomy: 16 - 8 reserved (one CPU stays shared); half: 16 - 7 - 1 shared = 8
        assert answer["NodeNames"] == ["half"], answer
        assert "asks for 8 exclusive CPU(s)" in answer["FailedNodes"]["roomy"]
        trader = pod("t", container("app", 8, 8), annotations=EXCLUSIVE, labels=TRADER)
        code, answer = ext.post("filter", {"Pod": trader, "Nodes": None, "NodeNames": names})
        assert code == 200 and answer["NodeNames"] == ["roomy", "half"], answer
        code, scores = ext.post("prioritize", {"Pod": trader, "Nodes": None, "NodeNames": names})
        assert code == 200
        by_node = {row["Host"]: row["Score"] for row in scores}
        assert by_node["roomy"] == 10 and by_node["half"] < 10
        code, scores = ext.post("prioritize", {"Pod": web, "Nodes": None, "NodeNames": names})
        assert {row["Host"]: row["Score"] for row in scores}["roomy"] == 0
