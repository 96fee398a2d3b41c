"""corepin.api.webhook.admission: AdmissionReview v1 in, AdmissionReview v1 out.

Golden tests against the published AdmissionReview sample (../shared/fixtures/peer/admission_v1,
skipped when absent), every validation rule with the message a user gets, the JSONPatch of
mutate applied by the `jsonpatch` package to pods with and without the arrays it extends,
idempotence (a mutated pod mutates to nothing; a Hypothesis property over generated pods), and
bodies that are not AdmissionReviews.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from corepin.api.webhook.admission import admit
from corepin.api.webhook.config import (
    Toleration,
    WebhookConfig,
    parse_node_selector,
    parse_toleration,
)
from corepin.api.webhook.patch import pointer
from corepin.api.webhook.review import ReviewError, decode_body
from corepin.core.errors import InputError
from support.budget import examples
from support.pods import EXCLUSIVE, container, pod
from support.webhook_helpers import (
    ADMISSION_FIXTURE,
    ADMISSION_FIXTURE_YAML,
    POD_KIND,
    POD_RESOURCE,
    apply,
    patch_ops,
    review,
)

Obj = dict[str, Any]
PLAIN = WebhookConfig()
STEERED = WebhookConfig(
    scheduler_name="corepin-scheduler",
    node_selector=(("corepin.io/node", "true"),),
    tolerations=(Toleration("corepin.io/dedicated", "", "NoSchedule"),),
)
ASSIGNMENTS_VOLUME = {
    "name": "corepin-assignments",
    "hostPath": {"path": "/run/corepin/assignments", "type": "DirectoryOrCreate"},
}
MOUNT = {"name": "corepin-assignments", "mountPath": "/etc/corepin", "readOnly": True}
POD_NAME_ENV = {
    "name": "COREPIN_POD_NAME",
    "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}},
}


def env(count: int, container_name: str = "app", namespace: str = "shop") -> list[Obj]:
    return [
        {"name": "COREPIN_NUM_CPUS", "value": str(count)},
        POD_NAME_ENV,
        {
            "name": "COREPIN_ASSIGNMENT_FILE",
            "value": f"/etc/corepin/{namespace}.$(COREPIN_POD_NAME).{container_name}",
        },
    ]


def validate(obj: Obj | None, **kw: Any) -> Obj:
    answer: Obj = admit(review(obj, **kw), "validate", PLAIN)
    return answer


def mutate(obj: Obj | None, config: WebhookConfig = PLAIN, **kw: Any) -> Obj:
    answer: Obj = admit(review(obj, **kw), "mutate", config)
    return answer


def message(answer: Obj) -> str:
    response = answer["response"]
    assert response["allowed"] is False, response
    text: str = response["status"]["message"]
    return text


# ---------------------------------------------------------------------- golden: the fixture
def fixture() -> Obj:
    if not ADMISSION_FIXTURE.exists():
        pytest.skip(f"{ADMISSION_FIXTURE} is not there")
    loaded: Obj = json.loads(ADMISSION_FIXTURE.read_text())
    return loaded


def test_the_json_and_yaml_samples_are_the_same_review() -> None:
    sample = fixture()
    assert yaml.safe_load(ADMISSION_FIXTURE_YAML.read_text()) == sample


@pytest.mark.parametrize("endpoint", ["validate", "mutate"])
def test_the_sample_review_gets_exactly_an_admission_review_v1_with_its_uid(
    endpoint: str,
) -> None:
    # The sample is about a CustomType (operation "operationValue"): not a pod, so allowed
    # untouched. Its own `response` (the request body carries one) is not echoed.
    answer = admit(fixture(), endpoint, STEERED)  # type: ignore[arg-type]
    assert answer == {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": {"uid": "uidValue", "allowed": True},
    }


def sample_with_pod(obj: Obj, operation: str = "CREATE") -> Obj:
    """The sample review, every field kept, about a pod instead of the CustomType."""
    sample = fixture()
    request = sample["request"]
    request.update(
        kind=dict(POD_KIND),
        requestKind=dict(POD_KIND),
        resource=dict(POD_RESOURCE),
        requestResource=dict(POD_RESOURCE),
        operation=operation,
        object=obj,
        oldObject=None if operation == "CREATE" else request["oldObject"],
        options={"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
    )
    del request["subResource"], request["requestSubResource"]
    return sample


def test_the_sample_request_about_a_pod_is_mutated_with_a_base64_json_patch() -> None:
    obj = pod(
        "web-0",
        container("app", "2"),
        container("sidecar"),
        annotations={
            "qos.gocrane.io/cpu-manager": "exclusive",
            "corepin.io/cpu-policy.sidecar": "none",
        },
        namespace="namespaceValue",
    )
    answer = admit(sample_with_pod(obj), "mutate", STEERED)
    assert answer["apiVersion"] == "admission.k8s.io/v1" and answer["kind"] == "AdmissionReview"
    response = answer["response"]
    assert set(response) == {"uid", "allowed", "patchType", "patch"}
    assert response["uid"] == "uidValue" and response["allowed"] is True
    assert response["patchType"] == "JSONPatch"
    expected = copy.deepcopy(obj)
    expected["metadata"]["annotations"]["corepin.io/cpu-policy"] = "exclusive"
    app = expected["spec"]["containers"][0]
    app["env"] = env(2, namespace="namespaceValue")
    app["volumeMounts"] = [MOUNT]
    expected["spec"].update(
        volumes=[ASSIGNMENTS_VOLUME],
        schedulerName="corepin-scheduler",
        nodeSelector={"corepin.io/node": "true"},
        tolerations=[{"key": "corepin.io/dedicated", "operator": "Exists", "effect": "NoSchedule"}],
    )
    assert apply(obj, answer) == expected


def test_a_refusal_has_the_status_of_a_metav1_status() -> None:
    obj = pod("web-0", container("app", "1500m"), annotations=EXCLUSIVE, namespace="namespaceValue")
    answer = admit(sample_with_pod(obj), "validate", PLAIN)
    response = answer["response"]
    assert set(response) == {"uid", "allowed", "status"}
    assert response["uid"] == "uidValue" and response["allowed"] is False
    status = response["status"]
    assert set(status) == {"status", "message", "reason", "code"}
    assert (status["status"], status["reason"], status["code"]) == ("Failure", "Forbidden", 403)
    assert "container 'app'" in status["message"]


def test_answers_are_plain_json_types_only() -> None:
    answer = mutate(pod("web-0", container("app", "2"), annotations=EXCLUSIVE), STEERED)
    assert json.loads(json.dumps(answer)) == answer


# ---------------------------------------------------------------------- validate: annotations
@pytest.mark.parametrize(
    ("annotations", "labels", "names"),
    [
        ({"corepin.io/cpu-policy": "exclusiv"}, None, ["corepin.io/cpu-policy", "'exclusiv'"]),
        ({"corepin.io/cpu-policy.app": "Exclusive"}, None, ["corepin.io/cpu-policy.app"]),
        ({"corepin.io/cpu-policy.": "share"}, None, ["names no container"]),
        ({"corepin.io/exclusiveness-level": "rack"}, None, ["exclusiveness-level", "'rack'"]),
        ({"corepin.io/workload-type": "gpu-bound"}, None, ["workload-type", "'gpu-bound'"]),
        (None, {"corepin.io/workload-type": "fast"}, ["workload-type", "'fast'"]),
        ({"qos.gocrane.io/cpu-manager": "dedicated"}, None, ["qos.gocrane.io/cpu-manager"]),
        (
            {"cslab.ece.ntua.gr/exclusiveness-level": "Rack"},
            None,
            ["cslab.ece.ntua.gr/exclusiveness-level", "'Rack'"],
        ),
        (None, {"cslab.ece.ntua.gr/workload-type": "Speedy"}, ["cslab.ece.ntua.gr/workload"]),
        # a malformed alias is refused even where a corepin.io key hides it
        (
            {"corepin.io/cpu-policy": "share", "qos.gocrane.io/cpu-manager": "shared"},
            None,
            ["qos.gocrane.io/cpu-manager", "'shared'"],
        ),
        ({"corepin.io/cpus": "{not json"}, None, ["corepin.io/cpus", "not valid JSON"]),
        ({"corepin.io/cpus": '{"app": "3-1"}'}, None, ["corepin.io/cpus", "'app'"]),
    ],
    ids=lambda v: json.dumps(v) if isinstance(v, dict) else str(v),
)
def test_malformed_corepin_and_alias_annotations_are_refused_naming_the_key(
    annotations: dict[str, str] | None, labels: dict[str, str] | None, names: list[str]
) -> None:
    text = message(
        validate(pod("web-0", container("app", "2"), annotations=annotations, labels=labels))
    )
    for name in names:
        assert name in text, text


def test_the_refusal_of_a_bad_value_lists_the_values_that_work() -> None:
    text = message(
        validate(
            pod("web-0", container("app", "2"), annotations={"corepin.io/cpu-policy": "dedicated"})
        )
    )
    assert "none, share, exclusive" in text


@pytest.mark.parametrize(
    "annotations",
    [
        {"corepin.io/cpu-policy": "exclusive", "corepin.io/exclusiveness-level": "NUMA"},
        {"qos.gocrane.io/cpu-manager": "share", "cslab.ece.ntua.gr/exclusiveness-level": "None"},
        {"corepin.io/cpu-policy": "none"},
        {"corepin.io/workload-type": "MemoryBound"},
        {"corepin.io/cpus": '{"app": "2-3"}'},
        {"unrelated.example.com/x": "anything"},
    ],
    ids=json.dumps,
)
def test_well_formed_annotations_are_allowed(annotations: dict[str, str]) -> None:
    assert validate(pod("web-0", container("app", "2"), annotations=annotations))["response"] == {
        "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
        "allowed": True,
    }


# ---------------------------------------------------------------------- validate: eligibility
@pytest.mark.parametrize(
    ("c", "why"),
    [
        (container("app"), "it has no CPU limit"),
        (container("app", "1500m"), "its CPU limit '1500m' is not a whole number >= 1"),
        (container("app", "500m", "500m"), "its CPU limit '500m' is not a whole number >= 1"),
        (container("app", "0"), "its CPU limit '0' is not a whole number >= 1"),
        (container("app", "2", "1"), "its CPU request '1' differs from its CPU limit '2'"),
        (container("app", "4", "3900m"), "its CPU request '3900m' differs from its CPU limit"),
    ],
    ids=["no limit", "fractional limit", "half a CPU", "zero", "request below limit", "3.9 of 4"],
)
@pytest.mark.parametrize("policy", ["exclusive", "share"])
def test_an_ineligible_exclusive_or_share_container_is_refused_with_what_to_change(
    c: Obj, why: str, policy: str
) -> None:
    text = message(validate(pod("web-0", c, annotations={"corepin.io/cpu-policy": policy})))
    assert text.startswith(f"container 'app': corepin.io/cpu-policy asks for {policy} CPUs")
    assert why in text
    assert "whole number >= 1" in text and "corepin.io/cpu-policy.app: none" in text


@pytest.mark.parametrize(
    "c",
    [
        container("app", "2"),
        container("app", "2", "2"),
        container("app", "2000m", "2"),
        container("app", "1", "1000m"),
        container("app", 3),  # a JSON number
    ],
    ids=["limit only", "equal", "2000m limit", "1000m request", "number"],
)
def test_an_eligible_container_is_allowed(c: Obj) -> None:
    assert validate(pod("web-0", c, annotations=EXCLUSIVE))["response"]["allowed"] is True


def test_the_refusal_names_the_annotation_the_policy_came_from() -> None:
    per_container = pod(
        "web-0", container("db", "1500m"), annotations={"corepin.io/cpu-policy.db": "share"}
    )
    assert message(validate(per_container)).startswith(
        "container 'db': corepin.io/cpu-policy.db asks for share CPUs"
    )
    crane = pod("web-0", container("db"), annotations={"qos.gocrane.io/cpu-manager": "exclusive"})
    assert "qos.gocrane.io/cpu-manager asks for exclusive" in message(validate(crane))


def test_every_ineligible_container_is_named() -> None:
    obj = pod(
        "web-0", container("a", "1500m"), container("b", "2"), container("c"), annotations=EXCLUSIVE
    )
    text = message(validate(obj))
    assert "container 'a'" in text and "container 'c'" in text and "container 'b'" not in text


def test_containers_that_ask_for_none_need_no_limit() -> None:
    obj = pod(
        "web-0",
        container("app", "2"),
        container("sidecar"),
        annotations={**EXCLUSIVE, "corepin.io/cpu-policy.sidecar": "none"},
    )
    assert validate(obj)["response"]["allowed"] is True
    plain = pod("web-0", container("app"), container("job", "250m"))
    assert validate(plain)["response"] == {
        "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
        "allowed": True,
    }


def test_a_malformed_quantity_is_refused_naming_the_container_and_field() -> None:
    text = message(validate(pod("web-0", container("app", "two"), annotations=EXCLUSIVE)))
    assert "container 'app'" in text and "spec.containers[0].resources.limits.cpu" in text


def test_a_long_list_of_problems_is_cut_to_five_and_counted() -> None:
    obj = pod("web-0", *(container(f"c{i}") for i in range(8)), annotations=EXCLUSIVE)
    text = message(validate(obj))
    assert text.count("container 'c") == 5 and text.endswith("; and 3 more")


# ---------------------------------------------------------------------- validate: warnings
def test_warnings_name_a_container_the_pod_lacks_an_init_container_and_unknown_keys() -> None:
    obj = pod(
        "web-0",
        container("app", "2"),
        annotations={
            "corepin.io/cpu-policy.ap": "exclusive",
            "corepin.io/cpu-policy.setup": "exclusive",
            "corepin.io/cpu-polcy": "exclusive",
        },
        initContainers=[container("setup", "1")],
    )
    response = validate(obj)["response"]
    assert response["allowed"] is True
    warnings = response["warnings"]
    assert len(warnings) == 3
    assert any("corepin.io/cpu-policy.ap names no container" in w and "app" in w for w in warnings)
    assert any("corepin.io/cpu-policy.setup: init containers" in w for w in warnings)
    assert any("annotation corepin.io/cpu-polcy is not one corepin reads" in w for w in warnings)
    assert all(len(w) <= 256 for w in warnings)


# ---------------------------------------------------------------------- validate: UPDATE
def test_an_update_that_leaves_the_request_alone_is_allowed_even_for_a_bad_pod() -> None:
    # a pod admitted while the webhook was down (failurePolicy Ignore) must stay updatable:
    # the agent writes corepin.io/cpus, controllers remove finalizers, users relabel
    old = pod("web-0", container("app", "1500m"), annotations={"corepin.io/cpu-policy": "exclusiv"})
    new = copy.deepcopy(old)
    new["metadata"]["annotations"]["corepin.io/cpus"] = "{}"
    new["metadata"]["labels"] = {"tier": "web"}
    new["metadata"]["finalizers"] = []
    answer = validate(new, operation="UPDATE", old=old)
    assert answer["response"] == {"uid": "705ab4f5-6393-11e8-b7cc-42010a800002", "allowed": True}


@pytest.mark.parametrize(
    ("before", "after", "expect"),
    [
        ({}, {"corepin.io/cpu-policy": "exclusiv"}, "corepin.io/cpu-policy"),
        ({"corepin.io/cpu-policy": "none"}, {"corepin.io/cpu-policy": "exclusive"}, "'app'"),
        ({}, {"qos.gocrane.io/cpu-manager": "share"}, "'app'"),
        ({}, {"corepin.io/cpu-policy.app": "share"}, "'app'"),
    ],
    ids=["to a bad value", "none to exclusive", "alias added", "per-container key added"],
)
def test_an_update_that_changes_the_request_is_judged(
    before: dict[str, str], after: dict[str, str], expect: str
) -> None:
    old = pod("web-0", container("app", "1500m"), annotations=before)
    new = pod("web-0", container("app", "1500m"), annotations=after)
    assert expect in message(validate(new, operation="UPDATE", old=old))


def test_an_update_that_changes_the_workload_label_is_judged() -> None:
    old = pod(
        "web-0", container("app", "2"), labels={"cslab.ece.ntua.gr/workload-type": "CPUBound"}
    )
    new = pod("web-0", container("app", "2"), labels={"cslab.ece.ntua.gr/workload-type": "Quick"})
    assert "cslab.ece.ntua.gr/workload-type" in message(validate(new, operation="UPDATE", old=old))


def test_an_update_without_an_old_object_is_judged_in_full() -> None:
    new = pod("web-0", container("app", "1500m"), annotations=EXCLUSIVE)
    assert "container 'app'" in message(validate(new, operation="UPDATE", old=None))


# ---------------------------------------------------------------------- not for us
@pytest.mark.parametrize(
    "change",
    [
        {"subResource": "status"},
        {"subResource": "ephemeralcontainers"},
        {"operation": "DELETE", "object": None},
        {"operation": "CONNECT"},
        {
            "kind": {"group": "apps", "version": "v1", "kind": "Deployment"},
            "resource": {"group": "apps", "version": "v1", "resource": "deployments"},
        },
        {"kind": {"group": "example.com", "version": "v1", "kind": "Pod"}, "resource": None},
        {"kind": None, "resource": None},
        {"kind": "Pod", "resource": ["pods"]},
    ],
    ids=[
        "status",
        "ephemeral",
        "delete",
        "connect",
        "deployment",
        "other group",
        "no kind",
        "odd kind types",
    ],
)
@pytest.mark.parametrize("endpoint", ["validate", "mutate"])
def test_requests_not_about_creating_or_updating_a_pod_are_allowed_untouched(
    change: Obj, endpoint: str
) -> None:
    body = review(pod("web-0", container("app"), annotations=EXCLUSIVE), operation="UPDATE")
    body["request"].update(change)
    assert admit(body, endpoint, STEERED)["response"] == {  # type: ignore[arg-type]
        "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
        "allowed": True,
    }


@pytest.mark.parametrize(
    ("obj", "field"),
    [
        (None, "request.object"),
        ("a pod", "request.object"),
        ({"metadata": "x", "spec": {}}, "metadata"),
        ({"metadata": {"annotations": ["a"]}, "spec": {}}, "metadata.annotations"),
        ({"metadata": {"annotations": {"corepin.io/cpu-policy": 1}}}, "metadata.annotations"),
        ({"metadata": {}, "spec": {"containers": {"name": "a"}}}, "spec.containers"),
        ({"metadata": {}, "spec": {"containers": [7]}}, "spec.containers[0]"),
        ({"metadata": {}, "spec": {"containers": [{"name": 7}]}}, "spec.containers[0].name"),
    ],
    ids=[
        "null",
        "string",
        "metadata string",
        "annotations list",
        "annotation number",
        "containers object",
        "container number",
        "name number",
    ],
)
@pytest.mark.parametrize("endpoint", ["validate", "mutate"])
def test_a_pod_object_that_cannot_be_read_is_refused_with_code_400_naming_the_field(
    obj: object, field: str, endpoint: str
) -> None:
    answer = admit(review(obj), endpoint, PLAIN)  # type: ignore[arg-type]
    response = answer["response"]
    assert response["allowed"] is False and response["status"]["code"] == 400
    assert response["status"]["reason"] == "BadRequest"
    assert field in response["status"]["message"]


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ([], "must be a JSON object"),
        ("review", "must be a JSON object"),
        ({}, "expected apiVersion admission.k8s.io/v1"),
        (
            {"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview", "request": {}},
            "admissionReviewVersions must be [v1]",
        ),
        ({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}, "no request"),
        ({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": 3}, "no "),
        (
            {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {}},
            "has no uid",
        ),
        (
            {
                "apiVersion": "admission.k8s.io/v1",
                "kind": "AdmissionReview",
                "request": {"uid": 12},
            },
            "has no uid",
        ),
    ],
    ids=[
        "list",
        "string",
        "empty",
        "v1beta1",
        "no request",
        "request number",
        "no uid",
        "uid number",
    ],
)
def test_a_body_that_is_not_an_admission_review_v1_is_a_review_error(
    body: object, problem: str
) -> None:
    with pytest.raises(ReviewError) as caught:
        admit(body, "validate", PLAIN)
    assert problem in str(caught.value)
    assert isinstance(caught.value, InputError)


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (b"", "not JSON"),
        (b"{", "not JSON"),
        (b"\xff\xfe\xfa", "not UTF-8"),
        (b'{"a": "\xc3\x28"}', "not UTF-8"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    ],
    ids=["empty", "truncated", "bytes", "bad utf-8 in a string", "deep"],
)
def test_decode_body_turns_every_bad_body_into_a_review_error(data: bytes, problem: str) -> None:
    with pytest.raises(ReviewError) as caught:
        decode_body(data)
    assert problem in str(caught.value)


# ---------------------------------------------------------------------- mutate
def test_a_pod_without_a_corepin_annotation_is_allowed_with_no_patch() -> None:
    obj = pod("web-0", container("app", "2"), annotations={"team": "a"}, labels={"app": "web"})
    assert mutate(obj, STEERED)["response"] == {
        "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
        "allowed": True,
    }


def test_each_exclusive_or_share_container_gets_its_count_and_the_mount() -> None:
    obj = pod(
        "web-0",
        container("app", "4"),
        container("cache", "1"),
        container("log"),
        annotations={
            "corepin.io/cpu-policy": "exclusive",
            "corepin.io/cpu-policy.cache": "share",
            "corepin.io/cpu-policy.log": "none",
        },
    )
    answer = mutate(obj)
    assert "warnings" not in answer["response"]
    out = apply(obj, answer)
    app, cache, log = out["spec"]["containers"]
    assert app["env"] == env(4, "app") and app["volumeMounts"] == [MOUNT]
    assert cache["env"] == env(1, "cache") and cache["volumeMounts"] == [MOUNT]
    assert log == obj["spec"]["containers"][2]
    assert out["spec"]["volumes"] == [ASSIGNMENTS_VOLUME]
    assert out["metadata"] == obj["metadata"]  # nothing to copy, no scheduler configured
    assert "schedulerName" not in out["spec"]


def test_the_mount_points_at_the_configured_host_directory() -> None:
    config = WebhookConfig(assignment_dir_host="/var/run/corepin/files")
    out = apply(
        pod("web-0", container("app", "2"), annotations=EXCLUSIVE),
        mutate(pod("web-0", container("app", "2"), annotations=EXCLUSIVE), config),
    )
    assert out["spec"]["volumes"] == [
        {
            "name": "corepin-assignments",
            "hostPath": {"path": "/var/run/corepin/files", "type": "DirectoryOrCreate"},
        }
    ]


def test_an_empty_host_directory_mounts_nothing_and_sets_only_the_count() -> None:
    # for namespaces whose Pod Security level forbids hostPath volumes
    obj = pod("web-0", container("app", "3"), annotations=EXCLUSIVE)
    out = apply(obj, mutate(obj, WebhookConfig(assignment_dir_host="")))
    app = out["spec"]["containers"][0]
    assert app["env"] == [{"name": "COREPIN_NUM_CPUS", "value": "3"}]
    assert "volumeMounts" not in app and "volumes" not in out["spec"]


def test_an_ineligible_container_is_not_patched() -> None:
    obj = pod("web-0", container("app", "1500m"), annotations=EXCLUSIVE)
    out = apply(obj, mutate(obj))
    assert out["spec"]["containers"] == obj["spec"]["containers"]
    assert "volumes" not in out["spec"]


@pytest.mark.parametrize(
    ("annotations", "labels", "copied"),
    [
        (
            {"qos.gocrane.io/cpu-manager": "share"},
            None,
            {"corepin.io/cpu-policy": "share"},
        ),
        (
            {"cslab.ece.ntua.gr/exclusiveness-level": "NUMA"},
            None,
            {"corepin.io/exclusiveness-level": "numa"},
        ),
        (
            {"cslab.ece.ntua.gr/exclusiveness-level": "None"},
            None,
            {"corepin.io/exclusiveness-level": "cpu"},
        ),
        (
            {"cslab.ece.ntua.gr/workload-type": "IOBound"},
            None,
            {"corepin.io/workload-type": "io-bound"},
        ),
        (
            {"qos.gocrane.io/cpu-manager": "exclusive", "corepin.io/cpu-policy": "share"},
            None,
            {},
        ),
        (None, {"cslab.ece.ntua.gr/workload-type": "MemoryBound"}, {}),
    ],
    ids=[
        "crane",
        "actimanager level",
        "level None",
        "workload annotation",
        "corepin key wins",
        "label only",
    ],
)
def test_alias_annotations_are_copied_to_their_corepin_keys(
    annotations: dict[str, str] | None, labels: dict[str, str] | None, copied: dict[str, str]
) -> None:
    obj = pod("web-0", container("app"), annotations=annotations, labels=labels)
    answer = mutate(obj)
    out = apply(obj, answer)
    if labels is not None:  # the label-only pod had no annotations at all: a new object
        copied = {"corepin.io/workload-type": "memory-bound"}
    assert out["metadata"].get("annotations", {}) == {**(annotations or {}), **copied}
    paths = [op["path"] for op in patch_ops(answer) if op["path"].startswith("/metadata")]
    if annotations is not None and copied:
        assert paths == ["/metadata/annotations/" + next(iter(copied)).replace("/", "~1")]
    elif labels is not None:
        assert paths == ["/metadata/annotations"]


def test_json_pointers_escape_slash_and_tilde() -> None:
    assert pointer("metadata", "annotations", "corepin.io/cpu-policy") == (
        "/metadata/annotations/corepin.io~1cpu-policy"
    )
    assert pointer("a~b/c", 0) == "/a~0b~1c/0"
    obj = pod("web-0", container("app", "2"), annotations=EXCLUSIVE)
    out = apply(obj, mutate(obj, WebhookConfig(node_selector=(("x.io/a~b", "1"),))))
    assert out["spec"]["nodeSelector"] == {"x.io/a~b": "1"}


def test_existing_arrays_are_appended_to() -> None:
    obj = pod(
        "web-0",
        container(
            "app",
            "2",
            env=[{"name": "MODE", "value": "fast"}],
            volumeMounts=[{"name": "data", "mountPath": "/data"}],
        ),
        annotations=EXCLUSIVE,
        volumes=[{"name": "data", "emptyDir": {}}],
        tolerations=[{"key": "gpu", "operator": "Exists"}],
        nodeSelector={"zone": "a"},
    )
    answer = mutate(obj, STEERED)
    assert all(
        op["op"] == "add" and op["path"].endswith("/-")
        for op in patch_ops(answer)
        if op["path"].split("/")[-2:][0] in ("env", "volumeMounts", "volumes", "tolerations")
    )
    out = apply(obj, answer)
    app = out["spec"]["containers"][0]
    assert app["env"] == [{"name": "MODE", "value": "fast"}, *env(2)]
    assert app["volumeMounts"] == [{"name": "data", "mountPath": "/data"}, MOUNT]
    assert out["spec"]["volumes"] == [{"name": "data", "emptyDir": {}}, ASSIGNMENTS_VOLUME]
    assert out["spec"]["tolerations"] == [
        {"key": "gpu", "operator": "Exists"},
        {"key": "corepin.io/dedicated", "operator": "Exists", "effect": "NoSchedule"},
    ]
    assert out["spec"]["nodeSelector"] == {"zone": "a", "corepin.io/node": "true"}


def test_the_volume_name_does_not_clash_with_the_pods_volumes() -> None:
    obj = pod(
        "web-0",
        container("app", "2", volumeMounts=[{"name": "corepin-assignments", "mountPath": "/x"}]),
        annotations=EXCLUSIVE,
        volumes=[
            {"name": "corepin-assignments", "emptyDir": {}},
            {"name": "corepin-assignments-2", "configMap": {"name": "c"}},
        ],
    )
    out = apply(obj, mutate(obj))
    names = [v["name"] for v in out["spec"]["volumes"]]
    assert names == ["corepin-assignments", "corepin-assignments-2", "corepin-assignments-3"]
    assert out["spec"]["volumes"][2]["hostPath"]["path"] == "/run/corepin/assignments"
    mounts = out["spec"]["containers"][0]["volumeMounts"]
    assert mounts[-1] == {**MOUNT, "name": "corepin-assignments-3"}


def test_an_existing_volume_of_the_assignment_directory_is_reused() -> None:
    obj = pod(
        "web-0",
        container("app", "2"),
        annotations=EXCLUSIVE,
        volumes=[{"name": "pins", "hostPath": {"path": "/run/corepin/assignments/"}}],
    )
    out = apply(obj, mutate(obj))
    assert out["spec"]["volumes"] == obj["spec"]["volumes"]
    assert out["spec"]["containers"][0]["volumeMounts"] == [{**MOUNT, "name": "pins"}]


def test_a_mount_path_taken_by_another_volume_is_left_with_a_warning() -> None:
    obj = pod(
        "web-0",
        container("app", "2", volumeMounts=[{"name": "cfg", "mountPath": "/etc/corepin"}]),
        annotations=EXCLUSIVE,
        volumes=[{"name": "cfg", "configMap": {"name": "cfg"}}],
    )
    answer = mutate(obj)
    (warning,) = answer["response"]["warnings"]
    assert "container 'app': /etc/corepin is taken by volume 'cfg'" in warning
    out = apply(obj, answer)
    app = out["spec"]["containers"][0]
    assert app["volumeMounts"] == obj["spec"]["containers"][0]["volumeMounts"]
    assert app["env"] == [{"name": "COREPIN_NUM_CPUS", "value": "2"}]  # no file to point at
    assert out["spec"]["volumes"] == obj["spec"]["volumes"]


def test_a_wrong_count_in_the_pods_own_env_is_replaced() -> None:
    obj = pod(
        "web-0",
        container(
            "app",
            "3",
            env=[
                {"name": "COREPIN_NUM_CPUS", "value": "8"},
                {"name": "COREPIN_POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.x"}}},
            ],
        ),
        annotations=EXCLUSIVE,
    )
    answer = mutate(obj)
    assert [op["op"] for op in patch_ops(answer) if "/env" in op["path"]] == [
        "replace",
        "replace",
        "add",
    ]
    assert apply(obj, answer)["spec"]["containers"][0]["env"] == env(3)


def test_scheduler_name_is_set_unless_the_pod_chose_another_scheduler() -> None:
    config = WebhookConfig(scheduler_name="corepin-scheduler")
    for chosen in (None, "default-scheduler"):
        obj = pod(
            "web-0",
            container("app", "2"),
            annotations=EXCLUSIVE,
            **{"schedulerName": chosen} if chosen else {},
        )
        assert apply(obj, mutate(obj, config))["spec"]["schedulerName"] == "corepin-scheduler"
    other = pod("web-0", container("app", "2"), annotations=EXCLUSIVE, schedulerName="volcano")
    answer = mutate(other, config)
    assert apply(other, answer)["spec"]["schedulerName"] == "volcano"
    assert "'volcano'" in answer["response"]["warnings"][0]
    plain = pod("web-0", container("app", "2"), annotations=EXCLUSIVE)
    assert "schedulerName" not in apply(plain, mutate(plain))["spec"]


def test_a_node_selector_key_with_another_value_is_left_with_a_warning() -> None:
    obj = pod(
        "web-0",
        container("app", "2"),
        annotations=EXCLUSIVE,
        nodeSelector={"corepin.io/node": "false"},
    )
    answer = mutate(obj, STEERED)
    assert apply(obj, answer)["spec"]["nodeSelector"] == {"corepin.io/node": "false"}
    assert any("nodeSelector['corepin.io/node']" in w for w in answer["response"]["warnings"])


def test_scheduling_fields_go_to_every_pod_with_a_corepin_annotation() -> None:
    # a pod that asks for `none` on purpose is still a corepin pod
    obj = pod("web-0", container("app"), annotations={"corepin.io/cpu-policy": "none"})
    out = apply(obj, mutate(obj, STEERED))
    assert out["spec"]["schedulerName"] == "corepin-scheduler"
    assert out["spec"]["containers"] == obj["spec"]["containers"]


def test_mutate_leaves_updates_and_malformed_pods_alone() -> None:
    obj = pod("web-0", container("app", "2"), annotations=EXCLUSIVE)
    assert "patch" not in mutate(obj, STEERED, operation="UPDATE", old=obj)["response"]
    bad = pod("web-0", container("app", "2"), annotations={"corepin.io/cpu-policy": "all"})
    response = mutate(bad, STEERED)["response"]
    assert response["allowed"] is True and "patch" not in response
    assert "corepin did not change this pod" in response["warnings"][0]


def test_the_namespace_in_the_assignment_file_comes_from_the_request() -> None:
    obj = pod("web-0", container("app", "2"), annotations=EXCLUSIVE, namespace="")
    out = apply(obj, mutate(obj, namespace="payments"))
    file_env = out["spec"]["containers"][0]["env"][2]
    assert file_env["value"] == "/etc/corepin/payments.$(COREPIN_POD_NAME).app"


# ---------------------------------------------------------------------- idempotence
IDEMPOTENT_CASES = {
    "bare": pod("web-0", container("app", "2"), annotations=EXCLUSIVE),
    "aliases and labels": pod(
        "web-0",
        container("app", "2"),
        annotations={"qos.gocrane.io/cpu-manager": "share"},
        labels={"cslab.ece.ntua.gr/workload-type": "CPUBound"},
    ),
    "many containers, odd names": pod(
        "web-0",
        container("a/b~c", "2"),
        container("x", "1", env=[{"name": "A", "value": "1"}]),
        annotations=EXCLUSIVE,
        volumes=[{"name": "corepin-assignments", "emptyDir": {}}],
        tolerations=[],
        nodeSelector={},
    ),
}


@pytest.mark.parametrize("name", list(IDEMPOTENT_CASES))
@pytest.mark.parametrize("config", [PLAIN, STEERED], ids=["plain", "steered"])
def test_mutating_a_mutated_pod_changes_nothing(name: str, config: WebhookConfig) -> None:
    obj = IDEMPOTENT_CASES[name]
    once = apply(obj, mutate(obj, config))
    assert once != obj
    again = mutate(once, config)["response"]
    assert "patch" not in again and "warnings" not in again
    assert validate(once)["response"]["allowed"] is True


label_texts = st.text(alphabet="ab-.~/", min_size=1, max_size=6)
policies = st.sampled_from(["none", "share", "exclusive"])
cpu_values = st.sampled_from([None, "1", "2", "1500m", "2000m", 3])
env_lists = st.none() | st.lists(
    st.fixed_dictionaries(
        {
            "name": st.sampled_from(["A", "COREPIN_NUM_CPUS", "COREPIN_POD_NAME"]),
            "value": label_texts,
        }
    ),
    max_size=3,
    unique_by=lambda e: e["name"],
)
mount_lists = st.none() | st.lists(
    st.fixed_dictionaries(
        {
            "name": st.sampled_from(["v1", "corepin-assignments"]),
            "mountPath": st.sampled_from(["/data", "/etc/corepin", "/etc/corepin/"]),
        }
    ),
    max_size=2,
    unique_by=lambda m: m["mountPath"].rstrip("/"),
)


@st.composite
def pods(draw: st.DrawFn) -> Obj:
    count = draw(st.integers(1, 3))
    containers = []
    volume_names: set[str] = set()
    for i in range(count):
        c = container(f"c{i}", draw(cpu_values))
        env_list = draw(env_lists)
        if env_list is not None:
            c["env"] = env_list
        mounts = draw(mount_lists)
        if mounts is not None:
            c["volumeMounts"] = mounts
            volume_names |= {m["name"] for m in mounts}
        containers.append(c)
    annotations: dict[str, str] = {"corepin.io/cpu-policy": draw(policies)}
    for i in range(count):
        if draw(st.booleans()):
            annotations[f"corepin.io/cpu-policy.c{i}"] = draw(policies)
    spec: Obj = {}
    if volume_names or draw(st.booleans()):
        spec["volumes"] = [{"name": n, "emptyDir": {}} for n in sorted(volume_names)]
    if draw(st.booleans()):
        spec["tolerations"] = [{"key": "corepin.io/dedicated", "operator": "Exists"}]
    if draw(st.booleans()):
        spec["nodeSelector"] = {draw(label_texts): "x"}
    return pod("web-0", *containers, annotations=annotations, **spec)


@settings(max_examples=examples(150))
@given(obj=pods(), steered=st.booleans())
def test_every_patch_applies_and_a_second_mutation_adds_nothing(obj: Obj, steered: bool) -> None:
    config = STEERED if steered else PLAIN
    first = mutate(obj, config)
    once = apply(obj, first)  # jsonpatch raises when an operation does not apply
    again = mutate(once, config)["response"]
    assert "patch" not in again
    for c in once["spec"]["containers"]:
        mounts = [
            m for m in c.get("volumeMounts", []) if m["mountPath"].rstrip("/") == "/etc/corepin"
        ]
        assert len(mounts) <= 1
        names = [e["name"] for e in c.get("env", [])]
        assert len(names) == len(set(names))
    volumes = [v["name"] for v in once["spec"].get("volumes", [])]
    assert len(volumes) == len(set(volumes))


# ---------------------------------------------------------------------- flags
def test_node_selector_and_toleration_flags_parse() -> None:
    assert parse_node_selector("corepin.io/node=true") == ("corepin.io/node", "true")
    assert parse_node_selector("dedicated=") == ("dedicated", "")
    assert parse_toleration("corepin.io/dedicated:NoSchedule").to_dict() == {
        "key": "corepin.io/dedicated",
        "operator": "Exists",
        "effect": "NoSchedule",
    }
    assert parse_toleration("pinned=yes:NoExecute").to_dict() == {
        "key": "pinned",
        "operator": "Equal",
        "value": "yes",
        "effect": "NoExecute",
    }
    assert parse_toleration("pinned").to_dict() == {"key": "pinned", "operator": "Exists"}


@pytest.mark.parametrize(
    ("parse", "text", "problem"),
    [
        (parse_node_selector, "zone", "expected KEY=VALUE"),
        (parse_node_selector, "=x", "not a label key"),
        (parse_node_selector, "Bad_Prefix.io/x=1", "not a label key"),
        (parse_node_selector, "a=b c", "not a label value"),
        (parse_node_selector, "a=" + "x" * 64, "not a label value"),
        (parse_toleration, "a:NoRun", "the effect must be one of"),
        (parse_toleration, ":NoSchedule", "not a label key"),
    ],
)
def test_bad_flags_are_input_errors_naming_the_flag(parse: Any, text: str, problem: str) -> None:
    with pytest.raises(InputError) as caught:
        parse(text)
    assert problem in str(caught.value) and repr(text) in str(caught.value)


def test_the_assignment_directory_must_be_absolute() -> None:
    with pytest.raises(InputError, match="absolute path"):
        WebhookConfig(assignment_dir_host="run/corepin")
