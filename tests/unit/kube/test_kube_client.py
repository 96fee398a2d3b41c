"""corepin.kube.client against the fake API server over real HTTP: CRUD, typed errors, patches,
status subresource, binding, pagination, watch, auth modes, unreachable servers."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from corepin.core.errors import (
    EXIT_ENVIRONMENT,
    ApiAlreadyExists,
    ApiConflict,
    ApiError,
    ApiForbidden,
    ApiGone,
    ApiInvalid,
    ApiNotFound,
    ApiUnauthorized,
    ApiUnreachable,
    EnvironmentProblem,
    KubeConfigError,
)
from corepin.kube.client import KubeClient
from corepin.kube.config import load_config
from corepin.kube.errors import api_error
from corepin.kube.resources import CONFIGMAPS, CRDS, LEASES, NODES, PODS
from corepin.kube.transport import Cancel, Cancelled
from corepin.testing.fakeapi import FakeApiServer, TLSMaterial
from support.kube_helpers import WIDGETS, widget, widget_crd
from support.pods import pod

_opened: list[KubeClient] = []


def client_for(path: Path) -> KubeClient:
    """A client for the kubeconfig at `path`, closed when the test ends."""
    client = KubeClient.from_config(load_config(path, env={}), timeout=10)
    _opened.append(client)
    return client


@pytest.fixture(autouse=True)
def _close_clients() -> Iterator[None]:
    yield
    while _opened:
        _opened.pop().close()


def install_widgets(kube: KubeClient) -> None:
    kube.create(CRDS, widget_crd())


# ---------------------------------------------------------------------- CRUD and errors
def test_create_answers_201_with_server_fields_and_get_returns_the_same(
    kube: KubeClient, fake_api: FakeApiServer
) -> None:
    created = kube.create(PODS, pod("web"))
    meta = created["metadata"]
    assert meta["uid"] and meta["creationTimestamp"] and meta["resourceVersion"].isdigit()
    assert created["status"] == {"phase": "Pending", "qosClass": "BestEffort"}
    assert kube.get(PODS, "web", "default") == created
    codes = [r.code for r in fake_api.recorded(verb="create", resource="pods")]
    assert codes == [201]


def test_resource_versions_come_from_one_counter_across_kinds(kube: KubeClient) -> None:
    first = kube.create(PODS, pod("a"))
    second = kube.create(
        CONFIGMAPS,
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "c", "namespace": "default"},
        },
    )
    third = kube.create(PODS, pod("b"))
    versions = [int(o["metadata"]["resourceVersion"]) for o in (first, second, third)]
    assert versions == sorted(versions) and len(set(versions)) == 3


def test_errors_are_typed_with_code_reason_and_message(kube: KubeClient) -> None:
    with pytest.raises(ApiNotFound) as missing:
        kube.get(PODS, "nope", "default")
    assert (missing.value.code, missing.value.status_reason) == (404, "NotFound")
    assert missing.value.api_message == 'pods "nope" not found'
    assert missing.value.reason == "api_not_found"
    assert missing.value.exit_code == EXIT_ENVIRONMENT
    kube.create(PODS, pod("dup"))
    with pytest.raises(ApiAlreadyExists) as exists:
        kube.create(PODS, pod("dup"))
    assert exists.value.code == 409 and not isinstance(exists.value, ApiConflict)
    with pytest.raises(ApiInvalid) as invalid:
        kube.create(
            PODS,
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "bad", "namespace": "default"},
                "spec": {"containers": [{"name": "app"}]},
            },
        )
    assert invalid.value.code == 422
    assert [c["field"] for c in invalid.value.causes] == ["spec.containers[0].image"]


def test_creating_in_a_missing_namespace_is_not_found(kube: KubeClient) -> None:
    with pytest.raises(ApiNotFound, match='namespaces "ghost" not found'):
        kube.create(PODS, pod("p", namespace="ghost"))


def test_a_stale_replace_is_a_conflict_and_a_fresh_one_succeeds(kube: KubeClient) -> None:
    original = kube.create(PODS, pod("web"))
    fresh = dict(original, metadata={**original["metadata"], "labels": {"v": "1"}})
    updated = kube.replace(PODS, fresh)
    assert updated["metadata"]["labels"] == {"v": "1"}
    stale = dict(original, metadata={**original["metadata"], "labels": {"v": "2"}})
    with pytest.raises(ApiConflict) as conflict:
        kube.replace(PODS, stale)
    assert conflict.value.code == 409 and conflict.value.status_reason == "Conflict"
    assert kube.get(PODS, "web", "default")["metadata"]["labels"] == {"v": "1"}


def test_a_write_that_changes_nothing_keeps_the_resource_version(kube: KubeClient) -> None:
    created = kube.create(PODS, pod("web", labels={"a": "b"}))
    again = kube.patch(PODS, "web", {"metadata": {"labels": {"a": "b"}}}, "default")
    assert again["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]


def test_patch_types_merge_json_strategic_and_apply(kube: KubeClient) -> None:
    kube.create(PODS, pod("web", labels={"keep": "1", "drop": "1"}))
    merged = kube.patch(
        PODS, "web", {"metadata": {"labels": {"drop": None, "new": "1"}}}, "default"
    )
    assert merged["metadata"]["labels"] == {"keep": "1", "new": "1"}
    patched = kube.patch(
        PODS,
        "web",
        [{"op": "replace", "path": "/metadata/labels/keep", "value": "2"}],
        "default",
        patch_type="json",
    )
    assert patched["metadata"]["labels"]["keep"] == "2"
    strategic = kube.patch(
        PODS,
        "web",
        {"spec": {"containers": [{"name": "app", "image": "busybox:1.37"}]}},
        "default",
        patch_type="strategic",
    )
    containers = strategic["spec"]["containers"]
    assert len(containers) == 1 and containers[0]["image"] == "busybox:1.37"
    assert containers[0]["terminationMessagePath"] == "/dev/termination-log"
    with pytest.raises(ApiError) as failed_test:
        kube.patch(
            PODS,
            "web",
            [{"op": "test", "path": "/metadata/name", "value": "other"}],
            "default",
            patch_type="json",
        )
    assert failed_test.value.code == 422


def test_strategic_merge_patch_on_a_custom_resource_is_415(kube: KubeClient) -> None:
    install_widgets(kube)
    kube.create(WIDGETS, widget("w"))
    with pytest.raises(ApiError) as refused:
        kube.patch(WIDGETS, "w", {"spec": {"size": 4}}, "default", patch_type="strategic")
    assert refused.value.code == 415
    assert refused.value.status_reason == "UnsupportedMediaType"


def test_a_patch_carrying_a_stale_resource_version_is_a_conflict(kube: KubeClient) -> None:
    created = kube.create(PODS, pod("web"))
    kube.patch(PODS, "web", {"metadata": {"labels": {"a": "1"}}}, "default")
    with pytest.raises(ApiConflict):
        kube.patch(
            PODS,
            "web",
            {
                "metadata": {
                    "labels": {"a": "2"},
                    "resourceVersion": created["metadata"]["resourceVersion"],
                }
            },
            "default",
        )


def test_server_side_apply_creates_merges_and_reports_field_conflicts(kube: KubeClient) -> None:
    cm = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "cfg", "namespace": "default"},
        "data": {"a": "1", "b": "1"},
    }
    created = kube.apply(CONFIGMAPS, cm, field_manager="alpha")
    assert created["data"] == {"a": "1", "b": "1"}
    managers = {e["manager"]: e["operation"] for e in created["metadata"]["managedFields"]}
    assert managers == {"alpha": "Apply"}
    other = {**cm, "data": {"a": "2"}}
    with pytest.raises(ApiConflict) as conflict:
        kube.apply(CONFIGMAPS, other, field_manager="beta")
    assert [c["field"] for c in conflict.value.causes] == [".data.a"]
    forced = kube.apply(CONFIGMAPS, other, field_manager="beta", force=True)
    assert forced["data"] == {"a": "2", "b": "1"}
    # alpha no longer applies b: it is removed, since nobody else owns it
    shrunk = kube.apply(CONFIGMAPS, {**cm, "data": {}}, field_manager="alpha")
    assert shrunk["data"] == {"a": "2"}


def test_apply_without_a_field_manager_is_refused(
    fake_api: FakeApiServer, kube: KubeClient
) -> None:
    answer = kube.transport.request(
        "PATCH",
        "/api/v1/namespaces/default/configmaps/x",
        body=b'{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"x"}}',
        content_type="application/apply-patch+yaml",
    )
    assert answer.status == 422 and b"fieldManager" in answer.body


def test_delete_removes_and_a_second_delete_is_not_found(kube: KubeClient) -> None:
    kube.create(PODS, pod("web"))
    gone = kube.delete(PODS, "web", "default")
    assert gone["metadata"]["name"] == "web"
    with pytest.raises(ApiNotFound):
        kube.delete(PODS, "web", "default")


def test_finalizers_hold_an_object_until_removed(kube: KubeClient) -> None:
    cm = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "held", "namespace": "default", "finalizers": ["example.com/x"]},
    }
    kube.create(CONFIGMAPS, cm)
    answer = kube.delete(CONFIGMAPS, "held", "default")
    assert answer["metadata"]["deletionTimestamp"]
    still = kube.get(CONFIGMAPS, "held", "default")
    assert still["metadata"]["finalizers"] == ["example.com/x"]
    kube.patch(CONFIGMAPS, "held", {"metadata": {"finalizers": None}}, "default")
    with pytest.raises(ApiNotFound):
        kube.get(CONFIGMAPS, "held", "default")


def test_delete_preconditions_on_uid(kube: KubeClient) -> None:
    kube.create(PODS, pod("web"))
    with pytest.raises(ApiConflict, match="Precondition failed"):
        kube.delete(PODS, "web", "default", uid="not-the-uid")
    assert kube.get(PODS, "web", "default")


def test_owner_references_are_garbage_collected(kube: KubeClient) -> None:
    owner = kube.create(PODS, pod("owner"))
    ref = {"apiVersion": "v1", "kind": "Pod", "name": "owner", "uid": owner["metadata"]["uid"]}
    kube.create(
        CONFIGMAPS,
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "dependent", "namespace": "default", "ownerReferences": [ref]},
        },
    )
    kube.delete(PODS, "owner", "default")
    with pytest.raises(ApiNotFound):
        kube.get(CONFIGMAPS, "dependent", "default")


# ---------------------------------------------------------------------- status and binding
def test_status_subresource_and_main_endpoint_ignore_each_others_fields(kube: KubeClient) -> None:
    kube.create(PODS, pod("web"))
    current = kube.get(PODS, "web", "default")
    current["status"] = {"phase": "Running"}
    current["metadata"]["labels"] = {"via": "main"}
    after_main = kube.replace(PODS, current)
    assert after_main["status"]["phase"] == "Pending"
    assert after_main["metadata"]["labels"] == {"via": "main"}
    after_main["status"] = {"phase": "Running", "podIP": "10.0.0.5"}
    after_main["spec"]["activeDeadlineSeconds"] = 5
    after_status = kube.replace_status(PODS, after_main)
    assert after_status["status"]["phase"] == "Running"
    assert "activeDeadlineSeconds" not in after_status["spec"]
    patched = kube.patch_status(PODS, "web", {"status": {"phase": "Succeeded"}}, "default")
    assert patched["status"]["phase"] == "Succeeded"
    status = kube.get(PODS, "web", "default", subresource="status")
    assert status["status"]["phase"] == "Succeeded"


def test_custom_resource_generation_moves_with_spec_only(kube: KubeClient) -> None:
    install_widgets(kube)
    created = kube.create(WIDGETS, {**widget("w"), "status": {"ready": True}})
    assert created["metadata"]["generation"] == 1 and "status" not in created
    relabeled = kube.patch(WIDGETS, "w", {"metadata": {"labels": {"a": "b"}}}, "default")
    assert relabeled["metadata"]["generation"] == 1
    status = kube.patch_status(
        WIDGETS, "w", {"status": {"ready": True}, "spec": {"size": 9}}, "default"
    )
    assert status["metadata"]["generation"] == 1
    assert status["status"] == {"ready": True} and status["spec"]["size"] == 3
    resized = kube.patch(WIDGETS, "w", {"spec": {"size": 4}, "status": {"ready": False}}, "default")
    assert resized["metadata"]["generation"] == 2 and resized["status"] == {"ready": True}


def test_binding_sets_the_node_once(kube: KubeClient, fake_api: FakeApiServer) -> None:
    kube.create(PODS, pod("web"))
    kube.bind("default", "web", "node-1")
    bound = kube.get(PODS, "web", "default")
    assert bound["spec"]["nodeName"] == "node-1"
    scheduled = [c for c in bound["status"]["conditions"] if c["type"] == "PodScheduled"]
    assert scheduled and scheduled[0]["status"] == "True"
    with pytest.raises(ApiConflict, match="already assigned"):
        kube.bind("default", "web", "node-2")
    assert [r.code for r in fake_api.recorded(resource="pods") if r.subresource == "binding"] == [
        201,
        409,
    ]


def test_node_name_cannot_be_set_by_updating_the_pod(kube: KubeClient) -> None:
    kube.create(PODS, pod("web"))
    with pytest.raises(ApiInvalid, match="pod updates may not change"):
        kube.patch(PODS, "web", {"spec": {"nodeName": "node-1"}}, "default")


# ---------------------------------------------------------------------- custom resources
def test_custom_resource_schema_is_enforced_and_unknown_fields_pruned(kube: KubeClient) -> None:
    install_widgets(kube)
    created = kube.create(WIDGETS, widget("w", extra="dropped", free={"any": {"thing": 1}}))
    assert "extra" not in created["spec"]
    assert created["spec"]["color"] == "red"  # schema default
    assert created["spec"]["free"] == {"any": {"thing": 1}}
    with pytest.raises(ApiInvalid) as invalid:
        kube.create(WIDGETS, widget("bad", size=11, color="green", code="ABCD"))
    fields = sorted(c["field"] for c in invalid.value.causes)
    assert fields == ["spec.code", "spec.color", "spec.size"]
    with pytest.raises(ApiInvalid, match=r"spec\.size: Required value"):
        kube.create(
            WIDGETS,
            {
                "apiVersion": "example.com/v1",
                "kind": "Widget",
                "metadata": {"name": "nosize", "namespace": "default"},
                "spec": {},
            },
        )
    with pytest.raises(ApiInvalid, match="must be of type integer"):
        kube.create(WIDGETS, widget("typed", size="3"))  # type: ignore[arg-type]


def test_custom_resource_list_types_reject_duplicates(kube: KubeClient) -> None:
    install_widgets(kube)
    with pytest.raises(ApiInvalid, match="Duplicate value"):
        kube.create(WIDGETS, widget("w", cpus=[1, 1]))
    with pytest.raises(ApiInvalid, match="Duplicate value"):
        kube.create(WIDGETS, widget("w", parts=[{"name": "a"}, {"name": "a"}]))


def test_cluster_scoped_custom_resources(kube: KubeClient) -> None:
    from support.kube_helpers import GADGETS

    kube.create(CRDS, widget_crd(scope="Cluster"))
    made = kube.create(
        GADGETS,
        {
            "apiVersion": "example.com/v1",
            "kind": "Gadget",
            "metadata": {"name": "g"},
            "spec": {"size": 2},
        },
    )
    assert "namespace" not in made["metadata"]
    assert kube.get(GADGETS, "g")["spec"]["size"] == 2


def test_deleting_a_crd_removes_its_objects_and_its_api(kube: KubeClient) -> None:
    install_widgets(kube)
    kube.create(WIDGETS, widget("w"))
    kube.delete(CRDS, "widgets.example.com")
    with pytest.raises(ApiNotFound):
        kube.list(WIDGETS, "default")


# ---------------------------------------------------------------------- lists
def test_list_all_pages_through_and_returns_one_resource_version(
    kube: KubeClient, fake_api: FakeApiServer
) -> None:
    for i in range(7):
        kube.create(PODS, pod(f"p{i}"))
    items, version = kube.list_all(PODS, "default", page_size=3)
    assert [o["metadata"]["name"] for o in items] == [f"p{i}" for i in range(7)]
    assert all(o["kind"] == "Pod" and o["apiVersion"] == "v1" for o in items)
    assert version == items[-1]["metadata"]["resourceVersion"]
    assert len(fake_api.recorded(verb="list", resource="pods")) == 3


def test_list_pages_are_consistent_with_writes_in_between(kube: KubeClient) -> None:
    for i in range(4):
        kube.create(PODS, pod(f"p{i}"))
    first = kube.list(PODS, "default", limit=2)
    kube.delete(PODS, "p3", "default")
    kube.create(PODS, pod("p9"))
    rest = kube.list(PODS, "default", limit=10, continue_token=first["metadata"]["continue"])
    names = [o["metadata"]["name"] for o in first["items"] + rest["items"]]
    assert names == ["p0", "p1", "p2", "p3"]


def test_an_expired_continue_token_is_gone_and_list_all_restarts(
    kube: KubeClient, fake_api: FakeApiServer
) -> None:
    for i in range(4):
        kube.create(PODS, pod(f"p{i}"))
    first = kube.list(PODS, "default", limit=2)
    kube.create(PODS, pod("late"))
    fake_api.compact()
    with pytest.raises(ApiGone):
        kube.list(PODS, "default", limit=2, continue_token=first["metadata"]["continue"])
    fake_api.inject(
        "/api/v1/namespaces/default/pods$", status=410, times=1, query={"continue": "*"}
    )
    items, _ = kube.list_all(PODS, "default", page_size=2)
    assert len(items) == 5


def test_selectors_filter_lists(kube: KubeClient) -> None:
    kube.create(PODS, pod("a", labels={"app": "web", "tier": "1"}, node="n1"))
    kube.create(PODS, pod("b", labels={"app": "db"}, node="n2"))
    kube.create(PODS, pod("c", labels={"app": "web", "tier": "2"}))

    def names(**kwargs: str) -> list[str]:
        return [o["metadata"]["name"] for o in kube.list(PODS, "default", **kwargs)["items"]]

    assert names(label_selector="app=web") == ["a", "c"]
    assert names(label_selector="app in (web,db),tier!=2") == ["a", "b"]
    assert names(label_selector="!tier") == ["b"]
    assert names(label_selector="tier>1") == ["c"]
    assert names(field_selector="spec.nodeName=n2") == ["b"]
    assert names(field_selector="spec.nodeName=") == ["c"]
    assert names(field_selector="metadata.name!=a,status.phase=Pending") == ["b", "c"]
    assert names(field_selector="spec.schedulerName=default-scheduler") == ["a", "b", "c"]
    with pytest.raises(ApiError) as bad:
        names(field_selector="spec.hostname=x")
    assert bad.value.code == 400 and "field label not supported" in bad.value.api_message


def test_nodes_and_leases_are_served(kube: KubeClient) -> None:
    kube.create(
        NODES,
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": "n1"},
            "status": {"capacity": {"cpu": "8"}},
        },
    )
    assert kube.get(NODES, "n1")["status"]["capacity"] == {"cpu": "8"}
    lease = kube.create(
        LEASES,
        {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": "l", "namespace": "kube-system"},
            "spec": {"holderIdentity": "me"},
        },
    )
    assert lease["spec"]["holderIdentity"] == "me"


# ---------------------------------------------------------------------- watch
def test_watch_from_a_version_sees_later_changes_in_order(kube: KubeClient) -> None:
    start = kube.create(PODS, pod("a"))["metadata"]["resourceVersion"]
    kube.patch(PODS, "a", {"metadata": {"labels": {"x": "1"}}}, "default")
    kube.create(PODS, pod("b"))
    kube.delete(PODS, "a", "default")
    watch = kube.watch(
        PODS, "default", resource_version=start, timeout_seconds=1, allow_bookmarks=False
    )
    seen = [(e.type, e.object["metadata"]["name"]) for e in watch]
    assert seen == [("MODIFIED", "a"), ("ADDED", "b"), ("DELETED", "a")]


def test_watch_from_a_compacted_version_raises_gone(
    kube: KubeClient, fake_api: FakeApiServer
) -> None:
    start = kube.create(PODS, pod("a"))["metadata"]["resourceVersion"]
    kube.create(PODS, pod("b"))
    fake_api.compact()
    watch = kube.watch(PODS, "default", resource_version=start, timeout_seconds=5)
    with pytest.raises(ApiGone) as gone:
        list(watch)
    assert gone.value.status_reason == "Expired"


def test_watch_with_a_selector_sees_leaving_objects_as_deleted(kube: KubeClient) -> None:
    start = kube.create(PODS, pod("a", labels={"app": "web"}))["metadata"]["resourceVersion"]
    kube.patch(PODS, "a", {"metadata": {"labels": {"app": "db"}}}, "default")
    kube.patch(PODS, "a", {"metadata": {"labels": {"app": "web"}}}, "default")
    watch = kube.watch(
        PODS,
        "default",
        resource_version=start,
        label_selector="app=web",
        timeout_seconds=1,
        allow_bookmarks=False,
    )
    events = list(watch)
    assert [e.type for e in events] == ["DELETED", "ADDED"]
    # the object that left is shown as the watcher last saw it, at the revision it left
    assert events[0].object["metadata"]["labels"] == {"app": "web"}
    assert int(events[0].resource_version) > int(start)


def test_watch_sends_bookmarks_with_the_current_version(
    kube: KubeClient, fake_api: FakeApiServer
) -> None:
    start = kube.create(PODS, pod("a"))["metadata"]["resourceVersion"]
    other = kube.create(
        CONFIGMAPS,
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "c", "namespace": "default"},
        },
    )
    watch = kube.watch(PODS, "default", resource_version=start, timeout_seconds=2)
    events = list(watch)
    bookmarks = [e for e in events if e.type == "BOOKMARK"]
    assert bookmarks, "no bookmark within 2 s at a 0.5 s bookmark interval"
    assert int(bookmarks[-1].resource_version) >= int(other["metadata"]["resourceVersion"])


def test_a_watch_blocked_on_a_quiet_stream_is_cancelled_from_another_thread(
    kube: KubeClient,
) -> None:
    cancel = Cancel()
    watch = kube.watch(PODS, "default", allow_bookmarks=False, cancel=cancel)
    outcome: list[BaseException] = []

    def consume() -> None:
        try:
            list(watch)
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=consume)
    thread.start()
    time.sleep(0.3)
    began = time.monotonic()
    cancel.cancel()
    thread.join(3)
    assert not thread.is_alive() and time.monotonic() - began < 1.0
    assert len(outcome) == 1 and isinstance(outcome[0], Cancelled)


# ---------------------------------------------------------------------- auth and transport
def test_token_over_https_is_accepted_and_a_wrong_token_is_401(
    tls_material: TLSMaterial, tmp_path: Path
) -> None:
    with FakeApiServer(tls=tls_material, tokens={"s3cret": "alice"}) as api:
        good = client_for(api.write_kubeconfig(tmp_path / "good", token="s3cret"))
        assert good.create(PODS, pod("web"))["metadata"]["name"] == "web"
        assert api.recorded(verb="create")[0].user == "alice"
        bad = client_for(api.write_kubeconfig(tmp_path / "bad", token="wrong"))
        with pytest.raises(ApiUnauthorized):
            bad.get(PODS, "web", "default")


def test_token_file_is_read_per_request(tls_material: TLSMaterial, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("first\n")
    with FakeApiServer(tls=tls_material, tokens={"first": "a", "second": "b"}) as api:
        config = api.write_kubeconfig(tmp_path / "kc", embed=True)
        text = config.read_text().replace("user: {}", f"user:\n    tokenFile: {token}")
        config.write_text(text)
        kube = client_for(config)
        kube.get(NODES.__class__("", "v1", "namespaces", False), "default")
        token.write_text("second\n")
        kube.get(NODES.__class__("", "v1", "namespaces", False), "default")
        assert [r.user for r in api.recorded(verb="get")] == ["a", "b"]


@pytest.mark.parametrize("embed", [False, True], ids=["files", "inline -data"])
def test_client_certificate_authenticates(
    tls_material: TLSMaterial, tmp_path: Path, embed: bool
) -> None:
    cert = tls_material.client("bob", ("corepin",))
    with FakeApiServer(tls=tls_material, client_certs=True) as api:
        kube = client_for(
            api.write_kubeconfig(tmp_path / "kc", client=(cert.cert, cert.key), embed=embed)
        )
        kube.create(PODS, pod("web"))
        assert api.recorded(verb="create")[0].user == "bob"
        anonymous = client_for(api.write_kubeconfig(tmp_path / "anon"))
        with pytest.raises(ApiUnauthorized):
            anonymous.list(PODS, "default")


def test_an_untrusted_server_certificate_is_refused_unless_verification_is_off(
    tls_material: TLSMaterial, tmp_path: Path
) -> None:
    with FakeApiServer(tls=tls_material) as api:
        untrusted = client_for(api.write_kubeconfig(tmp_path / "no-ca", ca=False))
        with pytest.raises(ApiUnreachable, match="certificate"):
            untrusted.version()
        insecure = client_for(api.write_kubeconfig(tmp_path / "insecure", ca=False, insecure=True))
        assert insecure.version()["major"] == "1"


def test_forbidden_is_typed(kube: KubeClient, fake_api: FakeApiServer) -> None:
    fake_api.forbid(verb="list", resource="pods")
    with pytest.raises(ApiForbidden, match='cannot list resource "pods"'):
        kube.list(PODS, "default")


def test_an_unreachable_server_is_an_environment_problem_with_one_line(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    from corepin.testing.fakeapi import write_kubeconfig

    kube = client_for(write_kubeconfig(tmp_path / "kc", f"http://127.0.0.1:{port}"))
    with pytest.raises(ApiUnreachable) as unreachable:
        kube.check()
    assert isinstance(unreachable.value, EnvironmentProblem)
    assert unreachable.value.exit_code == EXIT_ENVIRONMENT
    assert "\n" not in str(unreachable.value) and "connection refused" in str(unreachable.value)


def test_injected_server_errors_are_retryable_api_errors(
    kube: KubeClient, fake_api: FakeApiServer
) -> None:
    fake_api.inject("/api/v1/namespaces/default/pods", status=503)
    with pytest.raises(ApiError) as failed:
        kube.list(PODS, "default")
    assert failed.value.code == 503 and failed.value.retryable
    assert kube.list(PODS, "default")["items"] == []


def test_a_dropped_connection_is_unreachable(kube: KubeClient, fake_api: FakeApiServer) -> None:
    fake_api.inject("/api/v1/namespaces/default/pods", drop=True)
    with pytest.raises(ApiUnreachable):
        kube.list(PODS, "default")


def test_a_slow_server_times_out(fake_api: FakeApiServer, fake_kubeconfig: Path) -> None:
    kube = KubeClient.from_config(load_config(fake_kubeconfig, env={}), timeout=0.3)
    fake_api.inject("/api/v1/namespaces/default/pods", delay=1.0, status=None)
    with pytest.raises(ApiUnreachable, match="timed out"):
        kube.list(PODS, "default")


def test_keep_alive_connections_are_reused(kube: KubeClient, fake_api: FakeApiServer) -> None:
    for _ in range(5):
        kube.list(PODS, "default")
    assert len(fake_api._connections) == 1


def test_api_error_maps_a_non_status_body() -> None:
    error = api_error(
        502, b"<html>bad gateway</html>", http_reason="Bad Gateway", verb="get", target="/api"
    )
    assert error.code == 502 and error.status_reason == "Bad Gateway" and error.retryable
    assert "bad gateway" in error.api_message


def test_missing_kubeconfig_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(KubeConfigError, match="no such kubeconfig"):
        load_config(tmp_path / "missing", env={})


def test_retry_after_is_read_from_the_header_or_the_status() -> None:
    from corepin.kube.errors import api_error, too_large_resource_version

    status = {"kind": "Status", "code": 429, "reason": "TooManyRequests", "message": "slow down"}
    assert (
        api_error(429, json.dumps(status).encode(), headers={"Retry-After": "3"}).retry_after == 3
    )
    with_details = {**status, "details": {"retryAfterSeconds": 2}}
    assert api_error(429, with_details).retry_after == 2
    assert (
        api_error(503, b"", headers={"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}).retry_after
        is None
    )
    assert api_error(500, b"").retry_after is None
    too_large = {
        "kind": "Status",
        "code": 504,
        "reason": "Timeout",
        "message": "Too large resource version: 159, current: 100",
        "details": {"causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large"}]},
    }
    assert too_large_resource_version(api_error(504, too_large))
    assert not too_large_resource_version(
        api_error(504, {**too_large, "details": {}, "message": "x"})
    )


@given(st.text(max_size=40), st.dictionaries(st.text(max_size=20), st.text(max_size=20)))
def test_retry_after_parsing_never_raises(header: str, details: dict[str, str]) -> None:
    from corepin.kube.errors import retry_after_of

    found = retry_after_of({"Retry-After": header}, details)
    assert found is None or found >= 0


def test_an_injected_429_carries_retry_after_to_the_error(
    kube: KubeClient, fake_api: FakeApiServer
) -> None:
    fake_api.inject("/api/v1/namespaces/default/configmaps", status=429, retry_after=7)
    with pytest.raises(ApiError) as caught:
        kube.list(CONFIGMAPS, "default")
    assert caught.value.code == 429 and caught.value.retry_after == 7
