"""The Eviction API of the fake API server (`pods/NAME/eviction`, PodDisruptionBudgets honoured as
the real API server and disruption controller do) through real HTTP, judged by three clients:
corepin's own (`corepin.kube.eviction.evict`), the official `kubernetes` Python client and
kubectl (`get pdb`, `drain`). The Python client's and kubectl's tests are skipped, with the
reason, where they are not installed."""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from corepin.core.errors import ApiInvalid
from corepin.kube.client import KubeClient
from corepin.kube.config import load_config
from corepin.kube.eviction import EvictionResult, evict, eviction_body
from corepin.kube.resources import PDBS, PODS
from corepin.testing.fakeapi import FakeApiServer

try:
    from kubernetes import client as k8s
    from kubernetes import config as k8s_config
    from kubernetes.client.rest import ApiException
except ImportError:  # pragma: no cover - the client is a test extra
    k8s = None

KUBECTL = shutil.which("kubectl")
needs_pyclient = pytest.mark.skipif(k8s is None, reason="the kubernetes client is not installed")
needs_kubectl = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed")

Obj = dict[str, Any]
NS = "default"


# ---------------------------------------------------------------------- set-up
def make_pod(
    kube: KubeClient,
    name: str,
    *,
    labels: dict[str, str] | None = None,
    ready: bool = True,
    phase: str = "Running",
    node: str = "node-1",
) -> Obj:
    """A pod on `node`, in `phase`, Ready or not (what a kubelet would report)."""
    kube.create(
        PODS,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "labels": labels or {"app": "web"}},
            "spec": {"nodeName": node, "containers": [{"name": "app", "image": "nginx:1.25"}]},
        },
        NS,
    )
    status = {
        "phase": phase,
        "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
    }
    return kube.patch_status(PODS, name, {"status": status}, NS)


def make_pdb(
    kube: KubeClient, name: str, selector: dict[str, str] | None = None, **spec: Any
) -> Obj:
    body = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name},
        "spec": {"selector": {"matchLabels": selector or {"app": "web"}}, **spec},
    }
    return kube.create(PDBS, body, NS)


def pdb_status(kube: KubeClient, name: str) -> Obj:
    status: Obj = kube.get(PDBS, name, NS)["status"]
    return status


def counts(status: Obj) -> tuple[int, int, int, int]:
    """(expectedPods, currentHealthy, desiredHealthy, disruptionsAllowed)."""
    return (
        status["expectedPods"],
        status["currentHealthy"],
        status["desiredHealthy"],
        status["disruptionsAllowed"],
    )


def pod_names(kube: KubeClient) -> list[str]:
    return sorted(p["metadata"]["name"] for p in kube.list(PODS, NS)["items"])


def raw_post(api: FakeApiServer, path: str, body: Obj) -> tuple[int, Obj, dict[str, str]]:
    request = urllib.request.Request(
        api.url + path,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, json.loads(answer.read()), dict(answer.headers)
    except urllib.error.HTTPError as failed:
        return failed.code, json.loads(failed.read()), dict(failed.headers)


def eviction_path(name: str) -> str:
    return f"/api/v1/namespaces/{NS}/pods/{name}/eviction"


# ---------------------------------------------------------------------- corepin's client
def test_an_allowed_eviction_deletes_the_pod_and_charges_the_budget(
    fake_api: FakeApiServer, kube: KubeClient
) -> None:
    for name in ("w0", "w1", "w2"):
        make_pod(kube, name)
    make_pdb(kube, "web", minAvailable=2)
    assert counts(pdb_status(kube, "web")) == (3, 3, 2, 1)
    fake_api.clear_requests()
    result = evict(kube, NS, "w0")
    assert result == EvictionResult(NS, "w0", evicted=True)
    assert [r.code for r in fake_api.recorded(resource="pods", method="POST")] == [201]
    assert pod_names(kube) == ["w1", "w2"]
    status = pdb_status(kube, "web")
    assert counts(status) == (2, 2, 2, 0)
    assert "disruptedPods" not in status  # the pod is gone: the controller forgot it
    allowed = [c for c in status["conditions"] if c["type"] == "DisruptionAllowed"]
    assert [(c["status"], c["reason"]) for c in allowed] == [("False", "InsufficientPods")]


def test_a_budget_that_allows_no_disruption_refuses_with_429_and_its_reason(
    fake_api: FakeApiServer, kube: KubeClient
) -> None:
    for name in ("w0", "w1"):
        make_pod(kube, name)
    make_pdb(kube, "web", minAvailable=2)
    before = kube.get(PDBS, "web", NS)
    result = evict(kube, NS, "w0", uid=kube.get(PODS, "w0", NS)["metadata"]["uid"])
    assert result.refused and not result.gone and result.retryable
    assert (result.code, result.reason, result.disruption_budget) == (429, "TooManyRequests", True)
    assert result.causes == ("The disruption budget web needs 2 healthy pods and has 2 currently",)
    assert result.message.startswith(
        "Cannot evict pod as it would violate the pod's disruption budget."
    )
    assert "needs 2 healthy pods" in result.describe()
    assert pod_names(kube) == ["w0", "w1"]
    after = kube.get(PDBS, "web", NS)
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    # the raw answer, as the API server gives it
    code, status, headers = raw_post(fake_api, eviction_path("w0"), eviction_body(NS, "w0"))
    assert code == 429 and "Retry-After" not in headers
    assert status["reason"] == "TooManyRequests" and status["status"] == "Failure"
    assert status["details"] == {
        "causes": [
            {
                "reason": "DisruptionBudget",
                "message": "The disruption budget web needs 2 healthy pods and has 2 currently",
            }
        ]
    }


def test_min_available_as_a_percent_is_rounded_up(kube: KubeClient) -> None:
    for i in range(5):
        make_pod(kube, f"w{i}")
    make_pdb(kube, "half", minAvailable="50%")
    assert counts(pdb_status(kube, "half")) == (5, 5, 3, 2)  # 2.5 healthy needed: 3
    assert evict(kube, NS, "w0").evicted
    assert counts(pdb_status(kube, "half")) == (4, 4, 2, 2)
    kube.delete(PDBS, "half", NS)
    make_pdb(kube, "all", minAvailable="100%")
    refused = evict(kube, NS, "w1")
    assert refused.code == 429
    assert refused.causes == ("The disruption budget all needs 4 healthy pods and has 4 currently",)


def test_max_unavailable_as_a_number_and_as_a_percent(kube: KubeClient) -> None:
    for i in range(3):
        make_pod(kube, f"w{i}")
    make_pdb(kube, "none", maxUnavailable=0)
    assert counts(pdb_status(kube, "none")) == (3, 3, 3, 0)
    refused = evict(kube, NS, "w0")
    assert refused.causes == (
        "The disruption budget none needs 3 healthy pods and has 3 currently",
    )
    kube.delete(PDBS, "none", NS)
    make_pdb(kube, "third", maxUnavailable="34%")  # 1.02 of 3 pods may go: 2, rounded up
    assert counts(pdb_status(kube, "third")) == (3, 3, 1, 2)
    assert evict(kube, NS, "w0").evicted
    assert pod_names(kube) == ["w1", "w2"]


def test_two_budgets_selecting_the_pod_are_a_500(fake_api: FakeApiServer, kube: KubeClient) -> None:
    make_pod(kube, "w0", labels={"app": "web", "tier": "front"})
    make_pod(kube, "w1", labels={"app": "web"})
    make_pdb(kube, "by-app", {"app": "web"}, maxUnavailable=1)
    make_pdb(kube, "by-tier", {"tier": "front"}, maxUnavailable=1)
    result = evict(kube, NS, "w0")
    assert result.refused and result.code == 500 and result.retryable
    assert result.message == (
        "This pod has more than one PodDisruptionBudget, which the eviction subresource does "
        "not support."
    )
    code, status, _ = raw_post(fake_api, eviction_path("w0"), eviction_body(NS, "w0"))
    assert code == 500 and status["status"] == "Failure" and "reason" not in status
    # w1 is selected by one budget only
    assert evict(kube, NS, "w1").evicted
    assert pod_names(kube) == ["w0"]


def test_a_missing_pod_is_a_404_and_counts_as_gone(
    fake_api: FakeApiServer, kube: KubeClient
) -> None:
    code, status, _ = raw_post(fake_api, eviction_path("nope"), eviction_body(NS, "nope"))
    assert code == 404 and status["message"] == 'pods "nope" not found'
    assert status["details"] == {"name": "nope", "kind": "pods"}
    assert evict(kube, NS, "nope") == EvictionResult(NS, "nope", evicted=True, gone=True)


def test_the_uid_precondition_spares_a_pod_recreated_under_the_same_name(
    fake_api: FakeApiServer, kube: KubeClient
) -> None:
    old_uid = make_pod(kube, "w0")["metadata"]["uid"]
    kube.delete(PODS, "w0", NS)
    new_uid = make_pod(kube, "w0")["metadata"]["uid"]
    body = eviction_body(NS, "w0", uid=old_uid)
    code, status, _ = raw_post(fake_api, eviction_path("w0"), body)
    assert code == 409 and status["reason"] == "Conflict"
    assert f"UID in precondition: {old_uid}, UID in object meta: {new_uid}" in status["message"]
    assert evict(kube, NS, "w0", uid=old_uid) == EvictionResult(NS, "w0", evicted=True, gone=True)
    assert kube.get(PODS, "w0", NS)["metadata"]["uid"] == new_uid
    assert evict(kube, NS, "w0", uid=new_uid).evicted
    assert pod_names(kube) == []


def test_dry_run_leaves_the_pod_and_the_budget(fake_api: FakeApiServer, kube: KubeClient) -> None:
    for name in ("w0", "w1"):
        make_pod(kube, name)
    make_pdb(kube, "web", minAvailable=1)
    before = kube.get(PDBS, "web", NS)
    assert evict(kube, NS, "w0", dry_run=True).evicted
    body = eviction_body(NS, "w0")
    body["deleteOptions"] = {"dryRun": ["All"]}
    code, status, _ = raw_post(fake_api, eviction_path("w0"), body)
    assert (code, status["status"]) == (201, "Success")
    assert pod_names(kube) == ["w0", "w1"]
    assert kube.get(PDBS, "web", NS) == before
    # a dry run is still refused where the real one would be
    make_pod(kube, "lone", labels={"app": "lone"})
    make_pdb(kube, "lone", {"app": "lone"}, minAvailable=1)
    assert evict(kube, NS, "lone", dry_run=True).code == 429
    # the query and the body must agree
    body["deleteOptions"] = {"dryRun": ["Other"]}
    code, status, _ = raw_post(fake_api, eviction_path("w0") + "?dryRun=All", body)
    assert code == 400 and "Non-matching dry-run options" in status["message"]


def test_pending_and_unready_pods(kube: KubeClient) -> None:
    make_pod(kube, "ready")
    make_pod(kube, "waiting", phase="Pending", ready=False)
    make_pod(kube, "unready", ready=False)
    make_pdb(kube, "web", minAvailable=1)
    assert counts(pdb_status(kube, "web")) == (3, 1, 1, 0)
    # a pending pod goes without looking at budgets; an unready one when the budget is met
    assert evict(kube, NS, "waiting").evicted
    assert evict(kube, NS, "unready").evicted
    assert evict(kube, NS, "ready").code == 429
    # an unready pod while the budget is not met is refused, unless the budget says AlwaysAllow
    kube.delete(PDBS, "web", NS)
    make_pod(kube, "sick", ready=False)
    make_pdb(kube, "strict", minAvailable=2)
    assert counts(pdb_status(kube, "strict")) == (2, 1, 2, 0)
    assert evict(kube, NS, "sick").code == 429
    kube.patch(PDBS, "strict", {"spec": {"unhealthyPodEvictionPolicy": "AlwaysAllow"}}, NS)
    assert evict(kube, NS, "sick").evicted
    assert pod_names(kube) == ["ready"]


def test_grace_period_and_a_pod_being_deleted(tmp_path: Path) -> None:
    with FakeApiServer(graceful_pod_deletion=True) as api:
        client = KubeClient.from_config(
            load_config(api.write_kubeconfig(tmp_path / "kubeconfig"), env={}), timeout=10
        )
        try:
            for name in ("w0", "w1", "w2"):
                make_pod(client, name)
            make_pdb(client, "web", minAvailable=1)
            assert evict(client, NS, "w0", grace_seconds=7).evicted
            meta = client.get(PODS, "w0", NS)["metadata"]
            assert meta["deletionGracePeriodSeconds"] == 7 and meta["deletionTimestamp"]
            # the terminating pod no longer counts as healthy
            assert counts(pdb_status(client, "web")) == (3, 2, 1, 1)
            assert evict(client, NS, "w1").evicted
            assert counts(pdb_status(client, "web")) == (3, 1, 1, 0)
            # evicting a pod that is being deleted again needs no budget
            assert evict(client, NS, "w1").evicted
            assert evict(client, NS, "w2").code == 429
        finally:
            client.close()


def test_budgets_are_validated_and_discovered(fake_api: FakeApiServer, kube: KubeClient) -> None:
    with pytest.raises(ApiInvalid) as both:
        make_pdb(kube, "both", minAvailable=1, maxUnavailable=1)
    assert "minAvailable and maxUnavailable cannot be both set" in str(both.value)
    with pytest.raises(ApiInvalid) as percent:
        make_pdb(kube, "over", minAvailable="120%")
    assert "must not be greater than 100%" in str(percent.value)
    with urllib.request.urlopen(fake_api.url + "/api/v1", timeout=10) as answer:
        resources = {r["name"]: r for r in json.loads(answer.read())["resources"]}
    assert resources["pods/eviction"] == {
        "name": "pods/eviction",
        "singularName": "",
        "namespaced": True,
        "group": "policy",
        "version": "v1",
        "kind": "Eviction",
        "verbs": ["create"],
    }
    with urllib.request.urlopen(fake_api.url + "/apis/policy/v1", timeout=10) as answer:
        policy = {r["name"]: r for r in json.loads(answer.read())["resources"]}
    assert policy["poddisruptionbudgets"]["kind"] == "PodDisruptionBudget"
    assert policy["poddisruptionbudgets"]["shortNames"] == ["pdb"]
    assert policy["poddisruptionbudgets/status"]["verbs"] == ["get", "patch", "update"]


def test_a_budget_status_change_is_seen_by_a_watch(kube: KubeClient) -> None:
    for name in ("w0", "w1"):
        make_pod(kube, name)
    version = make_pdb(kube, "web", minAvailable=1)["metadata"]["resourceVersion"]
    assert evict(kube, NS, "w0").evicted
    seen: list[tuple[int, int, int, int]] = []
    for event in kube.watch(PDBS, NS, resource_version=version, timeout_seconds=1):
        if event.type == "MODIFIED":
            seen.append(counts(event.object["status"]))
    # (expected, healthy, desired, allowed): the controller's first status; the eviction
    # handler's charge; the controller leaving the disrupted pod out; the pod deleted
    assert seen == [(2, 2, 1, 1), (2, 2, 1, 0), (2, 1, 1, 0), (1, 1, 1, 0)]


# ---------------------------------------------------------------------- the official client
@pytest.fixture
def api_client(fake_kubeconfig: Path) -> Iterator[Any]:
    made = k8s_config.new_client_from_config(config_file=str(fake_kubeconfig))
    yield made
    made.close()


def v1_eviction(name: str, **options: Any) -> Any:
    return k8s.V1Eviction(
        metadata=k8s.V1ObjectMeta(name=name, namespace=NS),
        delete_options=k8s.V1DeleteOptions(**options) if options else None,
    )


@needs_pyclient
def test_the_official_client_evicts_and_reads_budgets(api_client: Any, kube: KubeClient) -> None:
    core = k8s.CoreV1Api(api_client)
    policy = k8s.PolicyV1Api(api_client)
    for name in ("w0", "w1", "w2"):
        make_pod(kube, name)
    policy.create_namespaced_pod_disruption_budget(
        NS,
        k8s.V1PodDisruptionBudget(
            metadata=k8s.V1ObjectMeta(name="web"),
            spec=k8s.V1PodDisruptionBudgetSpec(
                min_available=2, selector=k8s.V1LabelSelector(match_labels={"app": "web"})
            ),
        ),
    )
    status = policy.read_namespaced_pod_disruption_budget_status("web", NS).status
    assert (status.expected_pods, status.current_healthy, status.desired_healthy) == (3, 3, 2)
    assert status.disruptions_allowed == 1
    core.create_namespaced_pod_eviction("w0", NS, v1_eviction("w0"))
    assert sorted(p.metadata.name for p in core.list_namespaced_pod(NS).items) == ["w1", "w2"]
    with pytest.raises(ApiException) as refused:
        core.create_namespaced_pod_eviction("w1", NS, v1_eviction("w1"))
    assert refused.value.status == 429
    body = json.loads(refused.value.body)
    assert body["details"]["causes"][0] == {
        "reason": "DisruptionBudget",
        "message": "The disruption budget web needs 2 healthy pods and has 2 currently",
    }
    listed = policy.list_namespaced_pod_disruption_budget(NS).items
    assert [(b.metadata.name, b.status.disruptions_allowed) for b in listed] == [("web", 0)]


@needs_pyclient
def test_the_official_client_sees_the_refusals(api_client: Any, kube: KubeClient) -> None:
    core = k8s.CoreV1Api(api_client)
    with pytest.raises(ApiException) as missing:
        core.create_namespaced_pod_eviction("nope", NS, v1_eviction("nope"))
    assert missing.value.status == 404
    uid = make_pod(kube, "w0", labels={"app": "web", "tier": "front"})["metadata"]["uid"]
    with pytest.raises(ApiException) as mismatch:
        core.create_namespaced_pod_eviction(
            "w0", NS, v1_eviction("w0", preconditions=k8s.V1Preconditions(uid="other"))
        )
    assert mismatch.value.status == 409
    core.create_namespaced_pod_eviction("w0", NS, v1_eviction("w0"), dry_run="All")
    assert core.read_namespaced_pod("w0", NS).metadata.uid == uid
    make_pdb(kube, "a", {"app": "web"}, maxUnavailable=1)
    make_pdb(kube, "b", {"tier": "front"}, maxUnavailable=1)
    with pytest.raises(ApiException) as two:
        core.create_namespaced_pod_eviction("w0", NS, v1_eviction("w0"))
    assert two.value.status == 500
    assert "more than one PodDisruptionBudget" in json.loads(two.value.body)["message"]
    kube.delete(PDBS, "b", NS)
    # a policy/v1beta1 Eviction body is accepted too
    beta = {"apiVersion": "policy/v1beta1", "kind": "Eviction", "metadata": {"name": "w0"}}
    core.create_namespaced_pod_eviction("w0", NS, beta)
    assert pod_names(kube) == []


# ---------------------------------------------------------------------- kubectl
PDB_YAML = """
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: web}
spec:
  minAvailable: 2
  selector: {matchLabels: {app: web}}
"""


def kubectl_run(
    kubeconfig: Path, cache: Path, *args: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    assert KUBECTL is not None
    return subprocess.run(
        [KUBECTL, f"--kubeconfig={kubeconfig}", f"--cache-dir={cache}", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@needs_kubectl
def test_kubectl_creates_and_shows_budgets(
    fake_kubeconfig: Path, tmp_path: Path, kube: KubeClient
) -> None:
    for name in ("w0", "w1", "w2"):
        make_pod(kube, name)
    created = kubectl_run(fake_kubeconfig, tmp_path, "create", "-f", "-", stdin=PDB_YAML)
    assert created.returncode == 0, created.stderr
    assert "poddisruptionbudget.policy/web created" in created.stdout
    table = kubectl_run(fake_kubeconfig, tmp_path, "get", "pdb").stdout.splitlines()
    assert table[0].split() == [
        "NAME",
        "MIN",
        "AVAILABLE",
        "MAX",
        "UNAVAILABLE",
        "ALLOWED",
        "DISRUPTIONS",
        "AGE",
    ]
    assert table[1].split()[:4] == ["web", "2", "N/A", "1"]


@needs_kubectl
def test_kubectl_drain_evicts_and_is_held_back_by_a_budget(
    fake_api: FakeApiServer, fake_kubeconfig: Path, tmp_path: Path, kube: KubeClient
) -> None:
    for node in ("node-1", "node-2"):
        fake_api.create("v1", "nodes", {"metadata": {"name": node}})
    make_pod(kube, "a0", node="node-1")
    make_pod(kube, "a1", node="node-2")
    make_pod(kube, "a2", node="node-2")
    kubectl_run(fake_kubeconfig, tmp_path, "create", "-f", "-", stdin=PDB_YAML)
    drained = kubectl_run(fake_kubeconfig, tmp_path, "drain", "node-1", "--force", "--timeout=30s")
    assert drained.returncode == 0, drained.stderr
    assert "pod/a0 evicted" in drained.stdout and "node/node-1 drained" in drained.stdout
    assert kube.get(PODS, "a1", NS) and pod_names(kube) == ["a1", "a2"]
    assert [r.code for r in fake_api.recorded(resource="pods", method="POST")][-1] == 201
    held = kubectl_run(fake_kubeconfig, tmp_path, "drain", "node-2", "--force", "--timeout=1s")
    assert held.returncode != 0
    assert "Cannot evict pod as it would violate the pod's disruption budget." in held.stderr
    assert pod_names(kube) == ["a1", "a2"]
    assert kube.get(PDBS, "web", NS)["status"]["disruptionsAllowed"] == 0
