"""The NRI plugin's manifests: deploy/nri (its DaemonSet) and deploy/nri-mode (deploy/default
with it in place of the node agent).

- the DaemonSet passes only flags of `corepin nri`'s contract, mounts what they point at (the
  runtime's NRI socket directory, the node's state directory shared with the agent), is not
  privileged, writes no cgroup, has health probes, and passes `kubernetes-validate --strict`;
- `kubectl kustomize deploy/nri-mode` holds the plugin and no agent (skipped without kubectl).
"""

from __future__ import annotations

import shutil
import subprocess
from typing import Any

import kubernetes_validate
import pytest
import yaml

from support.crd_schema import load_yaml_docs
from support.paths import DEPLOY

KUBECTL = shutil.which("kubectl")
#: the flags of `corepin nri` that the deployment relies on
NRI_FLAGS = {
    "--socket", "--plugin-name", "--plugin-index", "--state-dir", "--sysfs-root",
    "--cgroup-root", "--policy", "--option", "--reserved-cpus", "--kubeconfig", "--node-name",
    "--metrics-address",
}  # fmt: skip


def daemonset() -> dict[str, Any]:
    (ds,) = [d for d in load_yaml_docs(DEPLOY / "nri" / "daemonset.yaml") if d]
    return dict(ds)


def test_the_daemonset_is_valid_for_kubernetes_1_32() -> None:
    kubernetes_validate.validate(daemonset(), "1.32.0", strict=True)


def test_the_daemonset_runs_corepin_nri_with_its_contract_flags_only() -> None:
    c = daemonset()["spec"]["template"]["spec"]["containers"][0]
    assert [*c["command"], c["args"][0]] == ["corepin", "nri"]
    given = {a.split("=", 1)[0] for a in c["args"][1:]}
    assert given <= NRI_FLAGS, given - NRI_FLAGS


def test_the_daemonset_mounts_the_socket_and_the_state_and_is_not_privileged() -> None:
    spec = daemonset()["spec"]["template"]["spec"]
    c = spec["containers"][0]
    args = dict(a.split("=", 1) for a in c["args"][1:])
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["mountPath"]: volumes[m["name"]] for m in c["volumeMounts"]}
    socket_dir = args["--socket"].rsplit("/", 1)[0]
    assert mounts[socket_dir]["hostPath"]["path"] == socket_dir
    assert mounts[args["--state-dir"]]["hostPath"]["path"] == "/var/lib/corepin"
    assert not any("cgroup" in m for m in mounts), "the runtime writes the cgroups, not corepin"
    security = c["securityContext"]
    assert not security.get("privileged", False)
    assert security["capabilities"]["drop"] == ["ALL"]
    assert c["readinessProbe"]["httpGet"]["path"] == "/healthz"
    assert {"operator": "Exists"} in spec["tolerations"]


@pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed")
def test_nri_mode_replaces_the_agent_with_the_plugin() -> None:
    assert KUBECTL is not None
    done = subprocess.run(
        [KUBECTL, "kustomize", str(DEPLOY / "nri-mode")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    built = [d for d in yaml.safe_load_all(done.stdout) if d]
    daemonsets = {o["metadata"]["name"] for o in built if o["kind"] == "DaemonSet"}
    assert daemonsets == {"corepin-nri"}
    plugin = next(o for o in built if o["kind"] == "DaemonSet")
    assert plugin["metadata"]["namespace"] == "corepin-system"
    assert plugin["metadata"]["labels"]["app.kubernetes.io/part-of"] == "corepin"
    accounts = {o["metadata"]["name"] for o in built if o["kind"] == "ServiceAccount"}
    assert plugin["spec"]["template"]["spec"]["serviceAccountName"] in accounts
