"""Fidelity of the fake API server, judged by the official `kubernetes` Python client: typed
CRUD, 409 on conflicts, status subresource, binding, watch from a version with 410, custom
objects, leases, events, https with a token."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

kubernetes = pytest.importorskip("kubernetes", reason="the kubernetes client is not installed")
from kubernetes import client as k8s  # noqa: E402
from kubernetes import config as k8s_config  # noqa: E402
from kubernetes import watch as k8s_watch  # noqa: E402
from kubernetes.client.rest import ApiException  # noqa: E402

from corepin.testing.fakeapi import FakeApiServer, TLSMaterial  # noqa: E402
from support.kube_helpers import widget_crd  # noqa: E402


@pytest.fixture
def api_client(fake_kubeconfig: Path) -> Iterator[k8s.ApiClient]:
    made = k8s_config.new_client_from_config(config_file=str(fake_kubeconfig))
    yield made
    made.close()


def v1_pod(name: str, labels: dict[str, str] | None = None) -> k8s.V1Pod:
    return k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(name=name, labels=labels),
        spec=k8s.V1PodSpec(containers=[k8s.V1Container(name="app", image="busybox:1.36")]),
    )


def test_typed_pod_lifecycle(api_client: k8s.ApiClient) -> None:
    core = k8s.CoreV1Api(api_client)
    created = core.create_namespaced_pod("default", v1_pod("web", {"app": "web"}))
    assert created.metadata.uid and created.metadata.resource_version
    assert created.status.phase == "Pending" and created.spec.scheduler_name == "default-scheduler"
    listed = core.list_namespaced_pod("default", label_selector="app=web")
    assert [p.metadata.name for p in listed.items] == ["web"]
    assert int(listed.metadata.resource_version) >= int(created.metadata.resource_version)
    with pytest.raises(ApiException) as duplicate:
        core.create_namespaced_pod("default", v1_pod("web"))
    assert duplicate.value.status == 409
    assert json.loads(duplicate.value.body)["reason"] == "AlreadyExists"
    patched = core.patch_namespaced_pod("web", "default", {"metadata": {"labels": {"x": "1"}}})
    assert patched.metadata.labels == {"app": "web", "x": "1"}
    core.delete_namespaced_pod("web", "default")
    with pytest.raises(ApiException) as missing:
        core.read_namespaced_pod("web", "default")
    assert missing.value.status == 404


def test_replace_with_a_stale_version_is_409(api_client: k8s.ApiClient) -> None:
    core = k8s.CoreV1Api(api_client)
    body = k8s.V1ConfigMap(metadata=k8s.V1ObjectMeta(name="cfg"), data={"a": "1"})
    first = core.create_namespaced_config_map("default", body)
    first.data = {"a": "2"}
    core.replace_namespaced_config_map("cfg", "default", first)
    first.data = {"a": "3"}
    with pytest.raises(ApiException) as conflict:
        core.replace_namespaced_config_map("cfg", "default", first)
    assert conflict.value.status == 409
    assert json.loads(conflict.value.body)["reason"] == "Conflict"


def test_status_and_binding(api_client: k8s.ApiClient) -> None:
    core = k8s.CoreV1Api(api_client)
    core.create_namespaced_pod("default", v1_pod("web"))
    binding = k8s.V1Binding(
        metadata=k8s.V1ObjectMeta(name="web"),
        target=k8s.V1ObjectReference(kind="Node", name="node-1"),
    )
    answer = core.create_namespaced_pod_binding("web", "default", binding, _preload_content=False)
    assert answer.status == 201
    status = core.patch_namespaced_pod_status("web", "default", {"status": {"phase": "Running"}})
    assert status.status.phase == "Running" and status.spec.node_name == "node-1"
    assert core.read_namespaced_pod_status("web", "default").status.phase == "Running"


def test_watch_from_a_version_then_410_after_compaction(
    api_client: k8s.ApiClient, fake_api: FakeApiServer
) -> None:
    core = k8s.CoreV1Api(api_client)
    start = core.list_namespaced_pod("default").metadata.resource_version
    core.create_namespaced_pod("default", v1_pod("a"))
    core.create_namespaced_pod("default", v1_pod("b"))
    core.delete_namespaced_pod("a", "default")
    seen = [
        (e["type"], e["object"].metadata.name)
        for e in k8s_watch.Watch().stream(
            core.list_namespaced_pod, "default", resource_version=start, timeout_seconds=1
        )
    ]
    assert seen == [("ADDED", "a"), ("ADDED", "b"), ("DELETED", "a")]
    fake_api.compact()
    with pytest.raises(ApiException) as gone:
        for _ in k8s_watch.Watch().stream(
            core.list_namespaced_pod, "default", resource_version=start, timeout_seconds=1
        ):
            pass
    assert gone.value.status == 410


def test_custom_objects(api_client: k8s.ApiClient) -> None:
    ext = k8s.ApiextensionsV1Api(api_client)
    ext.create_custom_resource_definition(widget_crd())
    objects = k8s.CustomObjectsApi(api_client)
    body: dict[str, Any] = {
        "apiVersion": "example.com/v1",
        "kind": "Widget",
        "metadata": {"name": "w"},
        "spec": {"size": 2, "junk": 1},
    }
    created = objects.create_namespaced_custom_object(
        "example.com", "v1", "default", "widgets", body
    )
    assert created["spec"] == {"size": 2, "color": "red"}
    patched = objects.patch_namespaced_custom_object(
        "example.com", "v1", "default", "widgets", "w", {"spec": {"size": 4}}
    )
    assert patched["spec"]["size"] == 4 and patched["metadata"]["generation"] == 2
    status = objects.patch_namespaced_custom_object_status(
        "example.com", "v1", "default", "widgets", "w", {"status": {"ready": True}}
    )
    assert status["status"] == {"ready": True} and status["metadata"]["generation"] == 2
    with pytest.raises(ApiException) as invalid:
        objects.create_namespaced_custom_object(
            "example.com",
            "v1",
            "default",
            "widgets",
            {**body, "metadata": {"name": "x"}, "spec": {"size": 0}},
        )
    assert invalid.value.status == 422
    causes = json.loads(invalid.value.body)["details"]["causes"]
    assert causes[0]["field"] == "spec.size"
    listed = objects.list_namespaced_custom_object("example.com", "v1", "default", "widgets")
    assert [i["metadata"]["name"] for i in listed["items"]] == ["w"]
    objects.delete_namespaced_custom_object("example.com", "v1", "default", "widgets", "w")
    assert (
        objects.list_namespaced_custom_object("example.com", "v1", "default", "widgets")["items"]
        == []
    )


def test_leases_and_events(api_client: k8s.ApiClient) -> None:
    leases = k8s.CoordinationV1Api(api_client)
    lease = leases.create_namespaced_lease(
        "kube-system",
        k8s.V1Lease(
            metadata=k8s.V1ObjectMeta(name="lock"),
            spec=k8s.V1LeaseSpec(holder_identity="a", lease_duration_seconds=15),
        ),
    )
    assert lease.spec.holder_identity == "a"
    core = k8s.CoreV1Api(api_client)
    # eventTime is set: the events.k8s.io view of an Event without one has `eventTime: null`
    # (as a real server answers), which this client's EventsV1Event model refuses
    core.create_namespaced_event(
        "default",
        k8s.CoreV1Event(
            metadata=k8s.V1ObjectMeta(name="e1"),
            involved_object=k8s.V1ObjectReference(kind="Pod", name="web", namespace="default"),
            reason="Test",
            message="hello",
            type="Normal",
            count=1,
            event_time=dt.datetime(2025, 1, 1, tzinfo=dt.UTC),
            reporting_component="test",
            reporting_instance="here",
            action="Testing",
        ),
    )
    events = k8s.EventsV1Api(api_client).list_namespaced_event("default")
    assert [(e.regarding.name, e.note, e.reason) for e in events.items] == [
        ("web", "hello", "Test")
    ]
    selected = core.list_namespaced_event("default", field_selector="involvedObject.name=web")
    assert len(selected.items) == 1


def test_https_with_a_token(tls_material: TLSMaterial, tmp_path: Path) -> None:
    with FakeApiServer(tls=tls_material, tokens={"abc": "erin"}) as api:
        made = k8s_config.new_client_from_config(
            config_file=str(api.write_kubeconfig(tmp_path / "kc", token="abc"))
        )
        try:
            names = [n.metadata.name for n in k8s.CoreV1Api(made).list_namespace().items]
        finally:
            made.close()
        assert "default" in names and {r.user for r in api.recorded()} == {"erin"}
