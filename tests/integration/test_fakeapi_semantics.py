"""The fake API server's own semantics at the HTTP level, where no client test reaches: table
answers, typed list items, streaming-list watches, graceful pod deletion, the pods/resize
subresource and the QoS class, namespace deletion, warnings for pruned fields, the request log
and the test controls."""

from __future__ import annotations

import contextlib
import json
import time
from typing import Any

import pytest

from corepin.core.errors import ApiInvalid, ApiNotFound
from corepin.kube.client import KubeClient
from corepin.kube.config import load_config
from corepin.kube.resources import CONFIGMAPS, CRDS, NAMESPACES, PODS
from corepin.kube.transport import Response
from corepin.testing.fakeapi import FakeApiServer
from support.kube_helpers import WIDGETS, widget, widget_crd
from support.pods import container, pod

TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"


def get(kube: KubeClient, path: str, accept: str = "application/json", **query: str) -> Response:
    return kube.transport.request("GET", path, query=query or None, accept=accept)


def body(answer: Response) -> Any:
    return json.loads(answer.body)


def test_tables_for_pods_and_custom_resources(kube: KubeClient) -> None:
    kube.create(PODS, pod("web", node="n1"))
    table = body(get(kube, "/api/v1/namespaces/default/pods", TABLE))
    assert table["kind"] == "Table"
    assert [c["name"] for c in table["columnDefinitions"]][:5] == [
        "Name",
        "Ready",
        "Status",
        "Restarts",
        "Age",
    ]
    [row] = table["rows"]
    assert row["cells"][:4] == ["web", "0/1", "Pending", 0]
    assert row["object"]["kind"] == "PartialObjectMetadata"
    full = body(get(kube, "/api/v1/namespaces/default/pods", TABLE, includeObject="Object"))
    assert full["rows"][0]["object"]["spec"]["nodeName"] == "n1"
    kube.create(CRDS, widget_crd())
    kube.create(WIDGETS, widget("w", size=7))
    crs = body(get(kube, "/apis/example.com/v1/namespaces/default/widgets", TABLE))
    assert [c["name"] for c in crs["columnDefinitions"]] == ["Name", "Size"]
    assert crs["rows"][0]["cells"] == ["w", 7]


def test_built_in_list_items_have_no_kind_but_custom_resource_items_do(kube: KubeClient) -> None:
    kube.create(PODS, pod("web"))
    kube.create(CRDS, widget_crd())
    kube.create(WIDGETS, widget("w"))
    pods = body(get(kube, "/api/v1/namespaces/default/pods"))
    assert pods["kind"] == "PodList" and "kind" not in pods["items"][0]
    widgets = body(get(kube, "/apis/example.com/v1/namespaces/default/widgets"))
    assert widgets["kind"] == "WidgetList" and widgets["items"][0]["kind"] == "Widget"


def test_pagination_reports_remaining_items(kube: KubeClient) -> None:
    for i in range(5):
        kube.create(PODS, pod(f"p{i}"))
    page = kube.list(PODS, "default", limit=2)
    assert page["metadata"]["remainingItemCount"] == 3 and page["metadata"]["continue"]
    last = kube.list(PODS, "default", limit=10, continue_token=page["metadata"]["continue"])
    assert "continue" not in last["metadata"] and len(last["items"]) == 3


def watch_lines(kube: KubeClient, path: str, **query: str) -> list[dict[str, Any]]:
    stream = kube.transport.stream(path, query={"watch": "1", **query}, read_timeout=10)
    try:
        return [json.loads(line) for line in stream.lines()]
    finally:
        stream.close()


def test_a_watch_without_a_version_starts_with_the_current_state(kube: KubeClient) -> None:
    kube.create(PODS, pod("a"))
    kube.create(PODS, pod("b"))
    events = watch_lines(kube, "/api/v1/namespaces/default/pods", timeoutSeconds="1")
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
        ("ADDED", "a"),
        ("ADDED", "b"),
    ]
    assert events[0]["object"]["kind"] == "Pod"


def test_streaming_list_ends_its_initial_events_with_an_annotated_bookmark(
    kube: KubeClient,
) -> None:
    kube.create(PODS, pod("a"))
    events = watch_lines(
        kube,
        "/api/v1/namespaces/default/pods",
        timeoutSeconds="1",
        sendInitialEvents="true",
        resourceVersionMatch="NotOlderThan",
        allowWatchBookmarks="true",
    )
    assert events[0]["type"] == "ADDED"
    assert events[1]["type"] == "BOOKMARK"
    assert events[1]["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}
    refused = kube.transport.request(
        "GET", "/api/v1/namespaces/default/pods", query={"watch": "1", "sendInitialEvents": "true"}
    )
    assert refused.status == 422


def test_graceful_pod_deletion_waits_for_the_kubelet(tmp_path: Any) -> None:
    with contextlib.ExitStack() as stack, FakeApiServer(graceful_pod_deletion=True) as api:
        kube = KubeClient.from_config(load_config(api.write_kubeconfig(tmp_path / "kc"), env={}))
        stack.callback(kube.close)
        kube.create(PODS, pod("bound", node="n1"))
        kube.create(PODS, pod("unbound"))
        terminating = kube.delete(PODS, "bound", "default")
        assert terminating["metadata"]["deletionGracePeriodSeconds"] == 30
        assert kube.get(PODS, "bound", "default")["metadata"]["deletionTimestamp"]
        kube.delete(PODS, "unbound", "default")
        with pytest.raises(ApiNotFound):
            kube.get(PODS, "unbound", "default")
        kube.delete(PODS, "bound", "default", grace_period_seconds=0)  # the kubelet confirms
        with pytest.raises(ApiNotFound):
            kube.get(PODS, "bound", "default")


def _resources(obj: Any) -> Any:
    return obj["spec"]["containers"][0]["resources"]


def test_the_qos_class_compares_quantities_as_numbers(kube: KubeClient) -> None:
    same = pod("same")
    same["spec"]["containers"][0]["resources"] = {
        "requests": {"cpu": "1000m", "memory": "67108864"},
        "limits": {"cpu": "1", "memory": "64Mi"},
    }
    assert kube.create(PODS, same)["status"]["qosClass"] == "Guaranteed"
    zero = pod("zero")
    zero["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "0"}}
    assert kube.create(PODS, zero)["status"]["qosClass"] == "BestEffort"
    greedy = pod("greedy")
    greedy["spec"]["containers"][0]["resources"] = {
        "requests": {"cpu": "2"},
        "limits": {"cpu": "1"},
    }
    with pytest.raises(ApiInvalid, match="must be less than or equal to cpu limit of 1"):
        kube.create(PODS, greedy)


def test_only_the_resize_subresource_changes_cpu_and_memory_resources(kube: KubeClient) -> None:
    kube.create(
        PODS, pod("web", container(cpu="500m", memory="64Mi"), node="n1")
    )  # Guaranteed: 500m CPU, 64Mi
    both = {
        "spec": {
            "containers": [
                {"name": "app", "resources": {"requests": {"cpu": "1"}, "limits": {"cpu": "1"}}}
            ]
        }
    }
    with pytest.raises(ApiInvalid, match="pod updates may not change"):
        kube.patch(PODS, "web", both, "default", patch_type="strategic")

    resized = kube.patch(PODS, "web", both, "default", patch_type="strategic", subresource="resize")

    assert _resources(resized) == {
        "requests": {"cpu": "1", "memory": "64Mi"},
        "limits": {"cpu": "1", "memory": "64Mi"},
    }
    assert resized["status"]["qosClass"] == "Guaranteed"
    assert _resources(kube.get(PODS, "web", "default", subresource="resize")) == _resources(resized)
    # a limit raised alone leaves the request below it: the pod would turn Burstable
    limit_only = {"spec": {"containers": [{"name": "app", "resources": {"limits": {"cpu": "2"}}}]}}
    with pytest.raises(ApiInvalid, match="Pod QOS Class may not change"):
        kube.patch(PODS, "web", limit_only, "default", patch_type="strategic", subresource="resize")
    image = {"spec": {"containers": [{"name": "app", "image": "busybox:1.37"}]}}
    with pytest.raises(ApiInvalid, match="may not change fields other than cpu and memory"):
        kube.patch(PODS, "web", image, "default", patch_type="strategic", subresource="resize")
    storage = {
        "spec": {
            "containers": [{"name": "app", "resources": {"limits": {"ephemeral-storage": "1Gi"}}}]
        }
    }
    with pytest.raises(ApiInvalid, match="may not change fields other than cpu and memory"):
        kube.patch(PODS, "web", storage, "default", patch_type="strategic", subresource="resize")
    assert _resources(kube.get(PODS, "web", "default")) == _resources(resized)


def test_deleting_a_namespace_deletes_its_objects(kube: KubeClient) -> None:
    kube.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team"}})
    kube.create(PODS, pod("p", namespace="team"))
    kube.create(
        CONFIGMAPS,
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "team"}},
    )
    kube.delete(NAMESPACES, "team")
    assert kube.list(PODS, "team")["items"] == []
    with pytest.raises(ApiNotFound):
        kube.get(NAMESPACES, "team")


def test_pruned_fields_are_reported_as_warnings(kube: KubeClient) -> None:
    kube.create(CRDS, widget_crd())
    answer = kube.transport.request(
        "POST",
        "/apis/example.com/v1/namespaces/default/widgets",
        body=json.dumps(widget("w", typo=1)).encode(),
        content_type="application/json",
    )
    assert answer.status == 201
    assert answer.warnings == ('299 - "unknown field \\"spec.typo\\""',)
    ignored = kube.transport.request(
        "POST",
        "/apis/example.com/v1/namespaces/default/widgets",
        query={"fieldValidation": "Ignore"},
        body=json.dumps(widget("v", typo=1)).encode(),
        content_type="application/json",
    )
    assert ignored.status == 201 and ignored.warnings == ()


def test_unknown_paths_and_methods(kube: KubeClient) -> None:
    assert get(kube, "/api/v1/widgets").status == 404
    assert get(kube, "/apis/nope.io/v1").status == 404
    status = body(get(kube, "/api/v1/namespaces/default/pods/missing"))
    assert status == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": 'pods "missing" not found',
        "reason": "NotFound",
        "details": {"name": "missing", "kind": "pods"},
        "code": 404,
    }
    posted = kube.transport.request("POST", "/api/v1/namespaces/default/pods/x", body=b"{}")
    assert posted.status == 405


def test_the_request_log_and_controls(kube: KubeClient, fake_api: FakeApiServer) -> None:
    fake_api.clear_requests()
    kube.create(PODS, pod("web"))
    kube.list(PODS, "default", label_selector="a=b")
    kube.get(PODS, "web", "default")
    assert [(r.verb, r.code) for r in fake_api.recorded(resource="pods")] == [
        ("create", 201),
        ("list", 200),
        ("get", 200),
    ]
    assert fake_api.recorded(verb="list")[0].query == {"labelSelector": "a=b"}
    began = time.monotonic()
    fake_api.inject("/api/v1/namespaces/default/pods/web$", status=None, delay=0.3, times=1)
    kube.get(PODS, "web", "default")
    assert time.monotonic() - began >= 0.3
    fake_api.forbid(user="system:anonymous", verb="delete")
    answer = kube.transport.request("DELETE", "/api/v1/namespaces/default/pods/web")
    assert answer.status == 403 and body(answer)["reason"] == "Forbidden"


def test_a_watch_ends_cleanly_at_its_timeout(kube: KubeClient) -> None:
    began = time.monotonic()
    events = watch_lines(
        kube, "/api/v1/namespaces/default/pods", timeoutSeconds="1", resourceVersion="0"
    )
    assert events == [] and 0.9 <= time.monotonic() - began < 3
