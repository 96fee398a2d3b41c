"""corepin.agent.cluster.controller.reservation_rules: what the controller does with a
CPUReservation at a given time."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from corepin.agent.cluster.controller import reservation_rules as rr

Obj = dict[str, Any]
CREATED = datetime(2025, 1, 1, tzinfo=UTC)


def cpur(status: Obj | None = None, **spec: Any) -> Obj:
    body: Obj = {"cpus": 2, "owners": [{"namespace": "shop"}], **spec}
    obj: Obj = {
        "apiVersion": "corepin.io/v1alpha1",
        "kind": "CPUReservation",
        "metadata": {"name": "r", "uid": "u-1", "creationTimestamp": "2025-01-01T00:00:00Z"},
        "spec": {k: v for k, v in body.items() if v is not None},
    }
    if status is not None:
        obj["status"] = status
    return obj


def test_the_expiry_time_and_the_node_are_written_and_the_ttl_awaited() -> None:
    got = rr.decide_reservation(cpur(ttl="90s", nodeName="worker-1"), CREATED, True)
    assert got.action == rr.UPDATED
    assert got.status == {
        "phase": "Pending",
        "expireTime": "2025-01-01T00:01:30Z",
        "nodeName": "worker-1",
    }
    assert got.recheck_after == 90.0
    again = rr.decide_reservation({**cpur(ttl="90s"), "status": got.status}, CREATED, None)
    assert again.status is None and again.recheck_after == 90.0


def test_a_reservation_without_ttl_is_never_looked_at_again() -> None:
    got = rr.decide_reservation(cpur(status={"phase": "Available"}), CREATED + timedelta(days=9))
    assert got == rr.ReservationAction()


@pytest.mark.parametrize("phase", ["Pending", "Available"])
def test_a_reservation_expires_when_its_ttl_ran_out(phase: str) -> None:
    obj = cpur(ttl=60, status={"phase": phase, "nodeName": "worker-1", "cpus": "2-3"})
    before = rr.decide_reservation(obj, CREATED + timedelta(seconds=59), True)
    assert before.status is not None and before.status["phase"] == phase
    got = rr.decide_reservation(obj, CREATED + timedelta(seconds=60), True)
    assert got.action == rr.EXPIRED
    assert got.status is not None
    assert got.status["phase"] == "Expired"
    assert got.status["cpus"] == "2-3"  # what was held stays on record
    assert got.status["message"] == (
        "its TTL of 60 s ran out at 2025-01-01T00:01:00Z unused; its CPUs are given back"
    )


def test_a_consumed_one_time_reservation_is_deleted_and_a_reusable_one_kept() -> None:
    used = {"phase": "Succeeded", "owners": [{"namespace": "shop", "name": "web-0", "uid": "p"}]}
    got = rr.decide_reservation(cpur(status=used), CREATED)
    assert got.delete and got.action == rr.DELETED
    assert got.message == "consumed by shop/web-0"
    kept = rr.decide_reservation(cpur(status=used, allocateOnce=False), CREATED)
    assert not kept.delete and kept.status is None


@pytest.mark.parametrize("phase", ["Expired", "Failed"])
def test_a_done_reservation_is_left_alone(phase: str) -> None:
    got = rr.decide_reservation(cpur(ttl=1, status={"phase": phase}), CREATED + timedelta(days=1))
    assert got == rr.ReservationAction()


def test_a_pending_reservation_on_a_node_that_does_not_exist_fails() -> None:
    obj = cpur(nodeName="worker-9")
    assert rr.node_to_check(obj) == "worker-9"
    got = rr.decide_reservation(obj, CREATED, False)
    assert got.action == rr.FAILED
    assert got.status == {
        "phase": "Failed",
        "nodeName": "worker-9",
        "message": "node 'worker-9' (spec.nodeName) does not exist",
    }
    unknown = rr.decide_reservation(obj, CREATED, None)
    assert unknown.action == rr.UPDATED  # not known: nothing failed
    held = cpur(nodeName="worker-9", status={"phase": "Available", "nodeName": "worker-9"})
    assert rr.node_to_check(held) is None
    assert rr.node_to_check(cpur()) is None  # the scheduler picks the node


def test_an_unreadable_reservation_fails_naming_the_field_once() -> None:
    obj = cpur(cpuSet="1-2")  # both a count and a CPU list
    got = rr.decide_reservation(obj, CREATED)
    assert got.action == rr.FAILED
    assert got.status is not None
    assert got.status["message"].startswith("the reservation cannot be read: spec.cpuSet:")
    assert rr.decide_reservation({**obj, "status": got.status}, CREATED) == rr.ReservationAction()
    assert rr.node_to_check(obj) is None
