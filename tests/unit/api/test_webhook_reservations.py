"""corepin.api.webhook: AdmissionReviews of CPUReservations at /validate.

What the wire model refuses is refused with the field named; a spec changed once the
reservation has left Pending is refused; status subresource writes, DELETE and /mutate are not
judged; pods are judged as before.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from corepin.api.webhook.admission import admit
from corepin.api.webhook.config import WebhookConfig
from support.paths import DEPLOY
from support.pods import EXCLUSIVE, container, pod
from support.webhook_helpers import review

Obj = dict[str, Any]
CPUR_KIND = {"group": "corepin.io", "version": "v1alpha1", "kind": "CPUReservation"}
CPUR_RESOURCE = {"group": "corepin.io", "version": "v1alpha1", "resource": "cpureservations"}


def sample() -> Obj:
    loaded: Obj = yaml.safe_load((DEPLOY / "samples" / "cpureservation.yaml").read_text())
    loaded["metadata"]["creationTimestamp"] = "2025-01-01T00:00:00Z"
    return loaded


def reservation_review(
    obj: Obj | None, *, operation: str = "CREATE", old: Obj | None = None, sub: str = ""
) -> Obj:
    out = review(obj, operation=operation, old=old, namespace="")
    request = out["request"]
    request.update(
        kind=dict(CPUR_KIND),
        requestKind=dict(CPUR_KIND),
        resource=dict(CPUR_RESOURCE),
        requestResource=dict(CPUR_RESOURCE),
    )
    del request["namespace"]
    if sub:
        request["subResource"] = sub
    return out


def answer(obj: Obj | None, endpoint: str = "validate", **kw: Any) -> Obj:
    response: Obj = admit(reservation_review(obj, **kw), endpoint, WebhookConfig())["response"]  # type: ignore[arg-type]
    return response


def with_spec(**changes: Any) -> Obj:
    obj = sample()
    for key, value in changes.items():
        if value is None:
            obj["spec"].pop(key, None)
        else:
            obj["spec"][key] = value
    return obj


def test_the_sample_is_admitted() -> None:
    response = answer(sample())
    assert response["allowed"] is True
    assert "status" not in response


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"cpuSet": "4-7"}, "spec.cpuSet"),  # a count and a CPU list
        ({"cpus": None}, "spec.cpus"),  # neither
        ({"cpus": 0}, "spec.cpus"),
        ({"cpus": "four"}, "spec.cpus"),
        ({"cpus": None, "cpuSet": "7-4"}, "spec.cpuSet"),
        ({"level": "rack"}, "spec.level"),
        ({"owners": []}, "spec.owners"),
        ({"owners": [{}]}, "spec.owners[0]"),
        (
            {"owners": [{"labelSelector": {"matchExpressions": [{"key": "a", "operator": "In"}]}}]},
            "spec.owners[0].labelSelector.matchExpressions[0].values",
        ),
        ({"ttl": "soon"}, "spec.ttl"),
        ({"ttl": 0}, "spec.ttl"),
        ({"ttl": "400d"}, "spec.ttl"),
        ({"allocateOnce": "yes"}, "spec.allocateOnce"),
    ],
)
def test_what_the_model_refuses_is_refused_naming_the_field(spec: Obj, field: str) -> None:
    response = answer(with_spec(**spec))
    assert response["allowed"] is False
    assert response["status"]["code"] == 403
    message = response["status"]["message"]
    assert message.startswith(f"CPUReservation refused: {field}:"), message


def test_a_reservation_without_spec_is_refused() -> None:
    obj = sample()
    del obj["spec"]
    response = answer(obj)
    assert response["allowed"] is False
    assert "spec" in response["status"]["message"]


def held(obj: Obj, phase: str) -> Obj:
    out = copy.deepcopy(obj)
    out["status"] = {"phase": phase, "nodeName": "worker-1", "cpus": "4-7"}
    return out


@pytest.mark.parametrize("phase", ["Available", "Succeeded", "Expired", "Failed"])
def test_the_spec_is_frozen_once_the_reservation_left_pending(phase: str) -> None:
    old = held(sample(), phase)
    new = held(with_spec(cpus=8, ttl="1h"), phase)
    response = answer(new, operation="UPDATE", old=old)
    assert response["allowed"] is False
    message = response["status"]["message"]
    assert f"is {phase}" in message
    assert "spec.cpus, spec.ttl changed" in message


def test_a_pending_reservation_may_change_and_a_held_one_may_change_its_metadata() -> None:
    pending = held(sample(), "Pending")
    assert answer(held(with_spec(cpus=8), "Pending"), operation="UPDATE", old=pending)["allowed"]
    old = held(sample(), "Available")
    labelled = copy.deepcopy(old)
    labelled["metadata"]["labels"] = {"team": "trading"}
    assert answer(labelled, operation="UPDATE", old=old)["allowed"]
    # the same spec in another spelling is no change
    respelled = copy.deepcopy(old)
    respelled["spec"]["level"] = "core"
    respelled["spec"]["ttl"] = 1800
    assert answer(respelled, operation="UPDATE", old=old)["allowed"]
    # no status yet: Pending
    assert answer(with_spec(cpus=8), operation="UPDATE", old=sample())["allowed"]


def test_status_writes_delete_and_mutate_are_not_judged() -> None:
    broken = with_spec(cpus=0)
    assert answer(broken, sub="status", operation="UPDATE", old=sample())["allowed"]
    assert answer(broken, endpoint="mutate")["allowed"]
    assert answer(broken, operation="DELETE")["allowed"]
    assert answer(broken)["allowed"] is False


def test_pods_are_judged_as_before() -> None:
    good = pod("web-0", container("app", 2, 2), annotations=EXCLUSIVE)
    bad = pod("web-1", container("app", "500m", "500m"), annotations=EXCLUSIVE)
    validate = WebhookConfig()
    assert admit(review(good), "validate", validate)["response"]["allowed"] is True
    refused = admit(review(bad), "validate", validate)["response"]
    assert refused["allowed"] is False and "'app'" in refused["status"]["message"]
