"""Fidelity of the fake API server, judged by a real client: kubectl 1.32 (discovery, server-side
tables, apply client-side and server-side, create/label/annotate/patch/delete, `get -w`, CRDs,
field validation, https with a token and with a client certificate). Skipped without kubectl."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from corepin.kube.client import KubeClient
from corepin.kube.resources import PODS
from corepin.testing.fakeapi import FakeApiServer, TLSMaterial
from support.helpers import reap
from support.kube_helpers import widget_crd

KUBECTL = shutil.which("kubectl")
pytestmark = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed")

Kubectl = Callable[..., subprocess.CompletedProcess[str]]

POD = """
apiVersion: v1
kind: Pod
metadata:
  name: web
  labels: {app: web}
spec:
  containers:
  - name: app
    image: nginx:1.25
"""


def make_kubectl(kubeconfig: Path, cache: Path) -> Kubectl:
    def run(
        *args: str, stdin: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        assert KUBECTL is not None
        done = subprocess.run(
            [KUBECTL, f"--kubeconfig={kubeconfig}", f"--cache-dir={cache}", *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if check and done.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {done.stderr}")
        return done

    return run


@pytest.fixture
def kubectl(fake_kubeconfig: Path, tmp_path: Path) -> Kubectl:
    return make_kubectl(fake_kubeconfig, tmp_path / "cache")


def test_discovery_and_tables_for_get(kubectl: Kubectl) -> None:
    out = kubectl("get", "namespaces").stdout.split("\n")
    assert out[0].split() == ["NAME", "STATUS", "AGE"]
    assert sorted(line.split()[0] for line in out[1:] if line) == [
        "default",
        "kube-node-lease",
        "kube-public",
        "kube-system",
    ]
    resources = kubectl("api-resources", "--no-headers").stdout
    assert "leases" in resources and "customresourcedefinitions" in resources
    assert kubectl("version", "-o", "json").returncode == 0


def test_apply_is_create_then_unchanged_then_configured(kubectl: Kubectl) -> None:
    assert "pod/web created" in kubectl("apply", "-f", "-", stdin=POD).stdout
    assert "pod/web unchanged" in kubectl("apply", "-f", "-", stdin=POD).stdout
    changed = POD.replace("{app: web}", "{app: web, tier: front}")
    assert "pod/web configured" in kubectl("apply", "-f", "-", stdin=changed).stdout
    labels = json.loads(kubectl("get", "pod", "web", "-o", "json").stdout)["metadata"]["labels"]
    assert labels == {"app": "web", "tier": "front"}
    # dropping the label from the applied file removes it (three-way merge)
    assert "configured" in kubectl("apply", "-f", "-", stdin=POD).stdout
    labels = json.loads(kubectl("get", "pod", "web", "-o", "json").stdout)["metadata"]["labels"]
    assert labels == {"app": "web"}


def test_create_label_annotate_patch_and_delete(kubectl: Kubectl) -> None:
    kubectl("create", "-f", "-", stdin=POD)
    duplicate = kubectl("create", "-f", "-", stdin=POD, check=False)
    assert duplicate.returncode == 1 and "AlreadyExists" in duplicate.stderr
    kubectl("label", "pod", "web", "tier=front")
    kubectl("annotate", "pod", "web", "note=hello")
    kubectl("patch", "pod", "web", "-p", '{"metadata":{"labels":{"strategic":"yes"}}}')
    kubectl("patch", "pod", "web", "--type=merge", "-p", '{"metadata":{"labels":{"m":"1"}}}')
    kubectl(
        "patch",
        "pod",
        "web",
        "--type=json",
        "-p",
        '[{"op":"remove","path":"/metadata/labels/app"}]',
    )
    meta = json.loads(kubectl("get", "pod", "web", "-o", "json").stdout)["metadata"]
    assert meta["labels"] == {"tier": "front", "strategic": "yes", "m": "1"}
    assert meta["annotations"] == {"note": "hello"}
    shown = kubectl("get", "pods", "-l", "tier=front", "--show-labels").stdout
    assert "web" in shown and "tier=front" in shown
    assert kubectl("get", "pods", "-l", "tier=back", "-o", "name").stdout == ""
    assert 'pod "web" deleted' in kubectl("delete", "pod", "web").stdout
    missing = kubectl("get", "pod", "web", check=False)
    assert missing.returncode == 1
    assert 'Error from server (NotFound): pods "web" not found' in missing.stderr


def test_field_selectors(kubectl: Kubectl, kube: KubeClient) -> None:
    for name, node in (("a", "n1"), ("b", "n2")):
        kubectl(
            "create",
            "-f",
            "-",
            stdin=POD.replace("name: web", f"name: {name}").replace(
                "spec:\n", f"spec:\n  nodeName: {node}\n"
            ),
        )
    names = kubectl("get", "pods", "--field-selector", "spec.nodeName=n2", "-o", "name").stdout
    assert names.split() == ["pod/b"]
    refused = kubectl("get", "pods", "--field-selector", "spec.bogus=x", check=False)
    assert refused.returncode == 1 and "field label not supported" in refused.stderr


def test_custom_resources_with_validation_pruning_and_printer_columns(kubectl: Kubectl) -> None:
    crd = yaml.safe_dump(widget_crd())
    kubectl("apply", "-f", "-", stdin=crd)
    kubectl("wait", "--for=condition=Established", "crd/widgets.example.com", "--timeout=10s")
    widget = "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w1}\nspec: {size: 3}\n"
    assert "widget.example.com/w1 created" in kubectl("apply", "-f", "-", stdin=widget).stdout
    table = kubectl("get", "wg").stdout.split("\n")
    assert table[0].split() == ["NAME", "SIZE"] and table[1].split() == ["w1", "3"]
    too_big = kubectl(
        "patch", "wg", "w1", "--type=merge", "-p", '{"spec":{"size":40}}', check=False
    )
    assert too_big.returncode == 1
    assert (
        "spec.size: Invalid value: 40: spec.size in body should be less than or equal to 10"
        in too_big.stderr
    )
    strategic = kubectl("patch", "wg", "w1", "-p", '{"spec":{"size":4}}', check=False)
    assert (
        strategic.returncode == 1
        and "application/strategic-merge-patch+json is not supported" in strategic.stderr
    )
    unknown = kubectl(
        "apply", "-f", "-", stdin=widget.replace("size: 3", "size: 3, typo: 1"), check=False
    )
    assert (
        unknown.returncode == 1
        and 'strict decoding error: unknown field "spec.typo"' in unknown.stderr
    )
    warned = kubectl(
        "apply", "--validate=warn", "-f", "-", stdin=widget.replace("size: 3", "size: 5, typo: 1")
    )
    assert 'unknown field "spec.typo"' in warned.stderr
    spec = json.loads(kubectl("get", "wg", "w1", "-o", "json").stdout)["spec"]
    assert spec == {"size": 5, "color": "red"}


def test_server_side_apply_owns_fields_and_reports_conflicts(kubectl: Kubectl) -> None:
    applied = kubectl("apply", "--server-side", "--field-manager=team-a", "-f", "-", stdin=POD)
    assert "serverside-applied" in applied.stdout
    other = POD.replace("{app: web}", "{app: api}")
    conflict = kubectl(
        "apply", "--server-side", "--field-manager=team-b", "-f", "-", stdin=other, check=False
    )
    assert conflict.returncode == 1
    assert 'conflict with "team-a"' in conflict.stderr and ".metadata.labels.app" in conflict.stderr
    kubectl(
        "apply",
        "--server-side",
        "--force-conflicts",
        "--field-manager=team-b",
        "-f",
        "-",
        stdin=other,
    )
    pod = json.loads(kubectl("get", "pod", "web", "-o", "json", "--show-managed-fields").stdout)
    assert pod["metadata"]["labels"] == {"app": "api"}
    managers = {m["manager"] for m in pod["metadata"]["managedFields"]}
    assert "team-b" in managers


def read_lines(process: subprocess.Popen[str], lines: list[str]) -> None:
    assert process.stdout is not None
    for line in process.stdout:
        lines.append(line.rstrip("\n"))


def wait_until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not predicate():
        time.sleep(0.05)
    assert predicate()


def test_get_watch_streams_changes(
    fake_kubeconfig: Path, tmp_path: Path, kubectl: Kubectl, kube: KubeClient
) -> None:
    kubectl("create", "-f", "-", stdin=POD)
    assert KUBECTL is not None
    process = subprocess.Popen(
        [
            KUBECTL,
            f"--kubeconfig={fake_kubeconfig}",
            f"--cache-dir={tmp_path / 'cache'}",
            "get",
            "pods",
            "-w",
            "--output-watch-events",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    reader = threading.Thread(target=read_lines, args=(process, lines), daemon=True)
    reader.start()
    try:
        wait_until(lambda: len(lines) >= 2)
        kube.patch(PODS, "web", {"metadata": {"labels": {"x": "1"}}}, "default")
        kube.delete(PODS, "web", "default")
        wait_until(lambda: any(line.startswith("DELETED") for line in lines))
    finally:
        process.terminate()
        process.wait(5)
        reader.join(5)
        reap(process)
    events = [line.split()[0] for line in lines[1:]]
    assert lines[0].split()[:2] == ["EVENT", "NAME"]
    assert events == ["ADDED", "MODIFIED", "DELETED"]


def test_get_watch_on_custom_resources(
    fake_kubeconfig: Path, tmp_path: Path, kubectl: Kubectl
) -> None:
    kubectl("apply", "-f", "-", stdin=yaml.safe_dump(widget_crd()))
    assert KUBECTL is not None
    process = subprocess.Popen(
        [
            KUBECTL,
            f"--kubeconfig={fake_kubeconfig}",
            f"--cache-dir={tmp_path / 'cache'}",
            "get",
            "widgets",
            "-w",
            "-o",
            "name",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    reader = threading.Thread(target=read_lines, args=(process, lines), daemon=True)
    reader.start()
    try:
        time.sleep(1.0)
        kubectl(
            "apply",
            "-f",
            "-",
            stdin="apiVersion: example.com/v1\nkind: Widget\n"
            "metadata: {name: w9}\nspec: {size: 2}\n",
        )
        wait_until(lambda: "widget.example.com/w9" in lines)
    finally:
        process.terminate()
        process.wait(5)
        reader.join(5)
        reap(process)


def test_kubectl_over_https_with_a_token_and_with_a_client_certificate(
    tls_material: TLSMaterial, tmp_path: Path
) -> None:
    cert = tls_material.client("carol")
    with FakeApiServer(tls=tls_material, tokens={"tok": "dave"}, client_certs=True) as api:
        with_token = make_kubectl(
            api.write_kubeconfig(tmp_path / "t", token="tok"), tmp_path / "c1"
        )
        with_token("create", "-f", "-", stdin=POD)
        with_cert = make_kubectl(
            api.write_kubeconfig(tmp_path / "c", client=(cert.cert, cert.key)), tmp_path / "c2"
        )
        assert with_cert("get", "pods", "-o", "name").stdout.split() == ["pod/web"]
        users = {r.user for r in api.recorded() if r.resource == "pods"}
        assert users == {"dave", "carol"}
        wrong = make_kubectl(api.write_kubeconfig(tmp_path / "n", token="wrong"), tmp_path / "c3")
        refused = wrong("get", "pods", check=False)
        assert refused.returncode == 1
        assert "You must be logged in to the server" in refused.stderr
