"""corepin.kube.eviction: the Eviction object it sends, and how each answer of the API server
becomes an `EvictionResult` (one attempt, refusals returned, never retried); the 429 mapping of
corepin.kube.errors. Answers come from the fake API server over real HTTP, some injected."""

from __future__ import annotations

import json

import pytest

from corepin.core.errors import ApiError, ApiUnreachable, InputError
from corepin.kube.client import KubeClient
from corepin.kube.errors import ApiTooManyRequests, api_error
from corepin.kube.eviction import EvictionResult, evict, eviction_body
from corepin.kube.resources import PODS
from corepin.testing.fakeapi import FakeApiServer

NS = "default"


def make_pod(kube: KubeClient, name: str) -> str:
    created = kube.create(
        PODS,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": {"containers": [{"name": "app", "image": "nginx:1.25"}]},
        },
        NS,
    )
    return str(created["metadata"]["uid"])


def test_the_eviction_body_names_the_pod_and_its_options() -> None:
    assert eviction_body(NS, "web") == {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": "web", "namespace": NS},
    }
    body = eviction_body(NS, "web", uid="u-1", grace_seconds=0)
    assert body["deleteOptions"] == {
        "kind": "DeleteOptions",
        "apiVersion": "v1",
        "preconditions": {"uid": "u-1"},
        "gracePeriodSeconds": 0,
    }
    with pytest.raises(InputError, match="grace_seconds must be 0 or more, got -1"):
        eviction_body(NS, "web", grace_seconds=-1)


def test_the_request_goes_to_the_pods_eviction_subresource(
    fake_api: FakeApiServer, kube: KubeClient
) -> None:
    uid = make_pod(kube, "web")
    fake_api.clear_requests()
    assert evict(kube, NS, "web", uid=uid, grace_seconds=3) == EvictionResult(
        NS, "web", evicted=True
    )
    (record,) = fake_api.recorded(resource="pods", method="POST")
    assert (record.path, record.subresource, record.verb, record.code) == (
        f"/api/v1/namespaces/{NS}/pods/web/eviction",
        "eviction",
        "create",
        201,
    )
    assert "dryRun" not in record.query
    assert evict(kube, NS, "web").gone  # and a second time, it is gone


def test_a_429_is_a_refusal_with_the_servers_wish_to_wait(
    fake_api: FakeApiServer, kube: KubeClient
) -> None:
    make_pod(kube, "web")
    fake_api.inject(r"/pods/web/eviction$", status=429, retry_after=7)
    result = evict(kube, NS, "web")
    assert result.refused and result.retryable and not result.disruption_budget
    assert (result.code, result.reason, result.retry_after) == (429, "TooManyRequests", 7.0)
    assert result.describe() == (
        f"eviction of pod {NS}/web refused (429 TooManyRequests): injected failure (429)"
    )
    assert kube.get(PODS, "web", NS)  # still there
    assert evict(kube, NS, "web").evicted  # the next attempt is the caller's


def test_other_refusals_are_returned_not_raised(fake_api: FakeApiServer, kube: KubeClient) -> None:
    make_pod(kube, "web")
    fake_api.forbid(resource="pods", verb="create")
    forbidden = evict(kube, NS, "web")
    assert (forbidden.code, forbidden.reason, forbidden.retryable) == (403, "Forbidden", False)
    assert 'cannot create resource "pods/eviction"' in forbidden.message
    fake_api.forbidden.clear()
    # a 404 that is not about the pod (a server without the subresource) is no "gone"
    fake_api.inject(r"/pods/web/eviction$", status=404)
    unserved = evict(kube, NS, "web")
    assert unserved.refused and not unserved.gone and unserved.code == 404
    # a conflict that is not the uid precondition is a refusal too
    fake_api.inject(r"/pods/web/eviction$", status=409)
    assert evict(kube, NS, "web", uid="whatever").code == 409


def test_a_missing_namespace_means_the_pod_is_gone(kube: KubeClient) -> None:
    assert evict(kube, "nowhere", "web").gone


def test_an_unreachable_server_raises(fake_api: FakeApiServer, kube: KubeClient) -> None:
    fake_api.inject(r"/pods/web/eviction$", drop=True)
    with pytest.raises(ApiUnreachable):
        evict(kube, NS, "web")


def test_dry_run_asks_the_server_for_one(fake_api: FakeApiServer, kube: KubeClient) -> None:
    make_pod(kube, "web")
    fake_api.clear_requests()
    assert evict(kube, NS, "web", dry_run=True).evicted
    (record,) = fake_api.recorded(resource="pods", method="POST")
    assert record.query.get("dryRun") == "All"
    assert kube.get(PODS, "web", NS)


def test_429_maps_to_its_own_error_class_with_causes_and_retry_after() -> None:
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": "Cannot evict pod as it would violate the pod's disruption budget.",
        "reason": "TooManyRequests",
        "code": 429,
        "details": {
            "causes": [{"reason": "DisruptionBudget", "message": "The disruption budget b ..."}],
            "retryAfterSeconds": 10,
        },
    }
    error = api_error(429, json.dumps(body).encode())
    assert isinstance(error, ApiTooManyRequests) and isinstance(error, ApiError)
    assert error.retryable and error.retry_after == 10.0
    assert error.causes == body["details"]["causes"]  # type: ignore[index]
    assert type(api_error(500, b"{}")) is ApiError  # the other codes keep their classes
