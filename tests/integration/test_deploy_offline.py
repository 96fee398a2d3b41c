"""The manifests under deploy/ without a cluster, and the samples with their namespaces.

- `kubectl kustomize` builds every kustomization under deploy/ with no API server reachable
  (KUBECONFIG pointing at a closed port);
- the offline checks deploy/README.md documents run as written, with no server;
- `kubectl apply --dry-run=client` does need a server (kubectl maps every kind to its resource
  through the server's discovery, and apply reads the live object to compute its patch), with
  `--validate=false` too: deploy/README.md says so, and this holds it to kubectl 1.32;
- against an API server (the tests' fake one, with corepin's CRDs) `kubectl apply -k
  deploy/samples`, dry run and for real, needs no namespace made beforehand: every sample's
  namespace is in the samples' kustomization.

Skipped without kubectl (the structural sample checks run without it).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from corepin.kube.client import KubeClient
from support.crd_schema import load_yaml_docs
from support.kube_helpers import install_crds
from support.paths import DEPLOY

Obj = dict[str, Any]
KUBECTL = shutil.which("kubectl")
needs_kubectl = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed")
SAMPLES = DEPLOY / "samples"
CLUSTER_SCOPED = {"Namespace", "NodeCPUTopology", "CPUReservation"}


def kustomizations() -> list[str]:
    """Every directory under deploy/ with a kustomization that builds on its own (a Component
    is built only as part of another)."""
    found = []
    for path in sorted(DEPLOY.rglob("kustomization.yaml")):
        if yaml.safe_load(path.read_text())["kind"] == "Kustomization":
            found.append(str(path.parent.relative_to(DEPLOY)))
    return found


@pytest.fixture
def offline(tmp_path: Path) -> dict[str, str]:
    """An environment whose kubeconfig names a server on a port nothing listens on (and a
    home without ~/.kube)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": f"https://127.0.0.1:{port}"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "c",
    }
    (tmp_path / "kubeconfig").write_text(yaml.safe_dump(config))
    (tmp_path / "home").mkdir()
    env = dict(os.environ)
    env.update(
        KUBECONFIG=str(tmp_path / "kubeconfig"),
        HOME=str(tmp_path / "home"),
        # kubernetes-validate from this venv
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
    )
    return env


def run(args: list[str], env: dict[str, str], **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args, env=env, cwd=DEPLOY.parent, capture_output=True, text=True, timeout=300, **kw
    )


# ---------------------------------------------------------------------- no server
@needs_kubectl
@pytest.mark.parametrize("target", kustomizations())
def test_kubectl_kustomize_builds_with_no_server(target: str, offline: dict[str, str]) -> None:
    assert KUBECTL is not None
    done = run([KUBECTL, "kustomize", f"deploy/{target}"], offline, check=False)
    assert done.returncode == 0, done.stderr
    assert [o for o in yaml.safe_load_all(done.stdout) if o]


def readme_offline_commands() -> list[str]:
    """The commands of the first fenced block under deploy/README.md's heading
    "Checking the manifests without a cluster"."""
    text = (DEPLOY / "README.md").read_text()
    section = text.split("## Checking the manifests without a cluster", 1)[1]
    block = re.search(r"```\n(.*?)```", section, re.S)
    assert block is not None
    return [
        line.split("  #", 1)[0].strip()
        for line in block.group(1).splitlines()
        if line.strip() and not line.startswith("#")
    ]


@needs_kubectl
def test_the_offline_checks_of_the_readme_run_with_no_server(offline: dict[str, str]) -> None:
    commands = readme_offline_commands()
    assert any("kubernetes-validate --strict" in c for c in commands)
    assert any(c.startswith("kubectl kustomize deploy/default") for c in commands)
    for command in commands:
        done = run(["bash", "-o", "pipefail", "-c", command], offline, check=False)
        assert done.returncode == 0, f"{command}: {done.stdout[-2000:]}{done.stderr[-2000:]}"


@needs_kubectl
@pytest.mark.parametrize("validate", [[], ["--validate=false"]], ids=["validate", "no-validate"])
def test_apply_dry_run_client_needs_a_server(validate: list[str], offline: dict[str, str]) -> None:
    assert KUBECTL is not None
    done = run(
        [KUBECTL, "apply", "--dry-run=client", *validate, "-k", "deploy/default"],
        offline,
        check=False,
    )
    assert done.returncode != 0
    assert "connection refused" in done.stderr
    readme = " ".join((DEPLOY / "README.md").read_text().split())
    assert "`kubectl apply --dry-run=client` needs an API server" in readme


# ---------------------------------------------------------------------- samples
def sample_objects() -> list[Obj]:
    spec = yaml.safe_load((SAMPLES / "kustomization.yaml").read_text())
    return [o for entry in spec["resources"] for o in load_yaml_docs(SAMPLES / entry)]


def test_every_sample_is_in_the_samples_kustomization() -> None:
    spec = yaml.safe_load((SAMPLES / "kustomization.yaml").read_text())
    files = sorted(p.name for p in SAMPLES.glob("*.yaml") if p.name != "kustomization.yaml")
    assert sorted(spec["resources"]) == files


def test_every_namespace_a_sample_uses_is_created_with_the_samples() -> None:
    objs = sample_objects()
    created = {o["metadata"]["name"] for o in objs if o["kind"] == "Namespace"}
    used: set[str] = set()
    for obj in objs:
        if obj["kind"] in CLUSTER_SCOPED:
            assert "namespace" not in obj["metadata"], obj["metadata"]["name"]
        else:
            assert obj["metadata"].get("namespace"), f"{obj['kind']} without a namespace"
            used.add(obj["metadata"]["namespace"])
        for owner in obj.get("spec", {}).get("owners", []):
            used.add(owner["namespace"])
    assert used and used <= created, used - created


@pytest.fixture
def api_kubectl(fake_kubeconfig: Path, kube: KubeClient, tmp_path: Path) -> list[str]:
    """kubectl against the fake API server, which serves corepin's CRDs."""
    assert KUBECTL is not None
    install_crds(kube)
    return [KUBECTL, f"--kubeconfig={fake_kubeconfig}", f"--cache-dir={tmp_path / 'cache'}"]


@needs_kubectl
def test_the_samples_apply_with_their_namespaces(api_kubectl: list[str]) -> None:
    env = dict(os.environ)
    names = run([*api_kubectl, "get", "namespaces", "-o", "name"], env, check=True).stdout
    assert "namespace/shop" not in names and "namespace/markets" not in names
    dry = run([*api_kubectl, "apply", "--dry-run=client", "-k", "deploy/samples"], env)
    assert dry.returncode == 0, dry.stderr
    assert "pod/db-0 created (dry run)" in dry.stdout
    done = run([*api_kubectl, "apply", "-k", "deploy/samples"], env)
    assert done.returncode == 0, done.stderr
    pods = json.loads(run([*api_kubectl, "get", "pods", "-A", "-o", "json"], env).stdout)
    assert sorted((p["metadata"]["namespace"], p["metadata"]["name"]) for p in pods["items"]) == [
        ("markets", "trader-0"),
        ("shop", "db-0"),
    ]
    bindings = run([*api_kubectl, "get", "pcb", "-A", "-o", "name"], env).stdout.split()
    assert sorted(bindings) == [
        "podcpubinding.corepin.io/batch-7",
        "podcpubinding.corepin.io/trader-0",
    ]
