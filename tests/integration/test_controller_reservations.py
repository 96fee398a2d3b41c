"""`corepin controller` and CPUReservations over the fake API server (the CRD as deploy/crd
ships it): expiry time written, TTL expiry, deletion once consumed under allocateOnce, Failed
on a node that does not exist, Events and metrics."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from corepin.agent.cluster.controller.controller import Controller
from corepin.core.errors import ApiNotFound
from corepin.kube.client import KubeClient
from corepin.kube.models import parse_time
from corepin.kube.resources import CPUR, EVENTS, NODES
from support.controller_helpers import running
from support.helpers import wait_for
from support.kube_helpers import install_crds

Obj = dict[str, Any]


@pytest.fixture
def ctl(kube: KubeClient) -> Iterator[Controller]:
    install_crds(kube)
    kube.create(NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "worker-1"}})
    with running(kube) as controller:
        yield controller


def reservation(name: str, **spec: Any) -> Obj:
    return {
        "apiVersion": "corepin.io/v1alpha1",
        "kind": "CPUReservation",
        "metadata": {"name": name},
        "spec": {"cpus": 2, "owners": [{"namespace": "shop"}], **spec},
    }


def status(kube: KubeClient, name: str) -> Obj:
    found: Obj = kube.get(CPUR, name).get("status") or {}
    return found


def wait_status(kube: KubeClient, name: str, **want: Any) -> Obj:
    seen: list[Obj] = [{}]

    def reached() -> bool:
        seen[0] = status(kube, name)
        return all(seen[0].get(k) == v for k, v in want.items())

    try:
        wait_for(reached, 10, f"reservation {name} status {want}")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; last status {seen[0]}") from None
    return seen[0]


def gone(kube: KubeClient, name: str) -> bool:
    try:
        kube.get(CPUR, name)
    except ApiNotFound:
        return True
    return False


def reasons(kube: KubeClient, name: str) -> list[str]:
    items: list[Obj] = kube.list(EVENTS, None)["items"]
    return [e["reason"] for e in items if e["involvedObject"].get("name") == name]


def test_the_expiry_time_is_written_and_the_reservation_expires(
    kube: KubeClient, ctl: Controller
) -> None:
    created = kube.create(CPUR, reservation("short", ttl="2s", nodeName="worker-1"))
    born = parse_time(created["metadata"]["creationTimestamp"], "creationTimestamp")
    pending = wait_status(kube, "short", phase="Pending", nodeName="worker-1")
    assert parse_time(pending["expireTime"], "expireTime").timestamp() == born.timestamp() + 2
    expired = wait_status(kube, "short", phase="Expired")
    assert "TTL of 2 s ran out" in expired["message"]
    wait_for(lambda: "ReservationExpired" in reasons(kube, "short"), 10, "the Event")
    sample = ctl.metrics.registry.get_sample_value(
        "corepin_controller_reservations_total", {"action": "expired"}
    )
    assert sample == 1.0


def test_a_reservation_consumed_under_allocate_once_is_deleted(
    kube: KubeClient, ctl: Controller
) -> None:
    kube.create(CPUR, reservation("once", nodeName="worker-1"))
    kube.create(CPUR, reservation("again", nodeName="worker-1", allocateOnce=False))
    for name in ("once", "again"):
        # as the agent writes it: a merge patch of the status (the controller writes it too)
        consumed = {
            "phase": "Succeeded",
            "nodeName": "worker-1",
            "cpus": "2-3",
            "owners": [{"namespace": "shop", "name": "web-0", "uid": "p-1"}],
        }
        kube.patch_status(CPUR, name, {"status": consumed})
    wait_for(lambda: gone(kube, "once"), 10, "the consumed reservation deleted")
    assert not gone(kube, "again")  # reusable: a Succeeded one is not the controller's
    assert status(kube, "again")["phase"] == "Succeeded"


def test_a_reservation_on_a_node_that_does_not_exist_fails(
    kube: KubeClient, ctl: Controller
) -> None:
    kube.create(CPUR, reservation("lost", nodeName="worker-9"))
    kube.create(CPUR, reservation("found", nodeName="worker-1"))
    failed = wait_status(kube, "lost", phase="Failed")
    assert failed["message"] == "node 'worker-9' (spec.nodeName) does not exist"
    assert wait_status(kube, "found", nodeName="worker-1")["phase"] == "Pending"
    wait_for(lambda: "ReservationFailed" in reasons(kube, "lost"), 10, "the Event")


def test_the_controller_runs_without_the_reservation_crd(kube: KubeClient) -> None:
    install_crds(kube, "nodecputopologies", "podcpubindings")
    with running(kube) as controller:
        assert controller.synced
