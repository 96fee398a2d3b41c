"""The Helm chart deploy/helm/corepin.

- `helm lint --strict` passes, with the default values and with every mode the values offer;
- `helm template ... | kubernetes-validate --strict` passes for Kubernetes 1.32 (and fails on a
  misspelled field, so the check can fail);
- the chart cannot drift from the kustomize tree: with its default values it renders what
  `kubectl kustomize deploy/default` builds (every object, field by field, once Helm's own
  labels are set aside), `mode=nri` what deploy/nri-mode builds, `webhook.tls.mode=certManager`
  what deploy/with-cert-manager builds, `networkPolicies` what deploy/network-policies builds;
  without kubectl the kinds, names and RBAC rules are compared with the component files;
- every value reaches the flag it names, and the rendered command lines parse with corepin's
  own parser; bad values are refused naming the value.

Skipped, saying why, without helm (sh scripts/fetch-helm.sh fetches it; no Debian release
packages helm).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509

from corepin.cli.main import build_parser
from support.crd_schema import load_yaml_docs
from support.paths import DEPLOY

Obj = dict[str, Any]

CHART = DEPLOY / "helm" / "corepin"
NAMESPACE = "corepin-system"
K8S_VERSION = "1.32.0"
KUBECTL = shutil.which("kubectl")
VALIDATE = Path(sys.executable).parent / "kubernetes-validate"
# labels Helm adds to every object, which the kustomize tree has no reason to carry
HELM_LABELS = ("app.kubernetes.io/managed-by", "app.kubernetes.io/instance", "helm.sh/chart")
CLUSTER_SCOPED = {
    "Namespace",
    "CustomResourceDefinition",
    "ClusterRole",
    "ClusterRoleBinding",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
    "MutatingWebhookConfiguration",
    "ValidatingWebhookConfiguration",
}
WORKLOADS = {"Deployment", "DaemonSet"}


def find_helm() -> str | None:
    """helm from $COREPIN_HELM, else $PATH, else where scripts/fetch-helm.sh puts it."""
    given = os.environ.get("COREPIN_HELM")
    if given:
        return given
    on_path = shutil.which("helm")
    if on_path:
        return on_path
    tools = os.environ.get("COREPIN_TOOLS") or str(Path.home() / ".cache" / "corepin" / "tools")
    fetched = Path(tools) / "helm" / "helm"
    return str(fetched) if os.access(fetched, os.X_OK) else None


HELM = find_helm()
pytestmark = pytest.mark.skipif(
    HELM is None,
    reason="helm is not installed (no Debian release packages it): sh scripts/fetch-helm.sh "
    "(or sh scripts/install-deps.sh --test) fetches the official binary",
)
needs_kubectl = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed")


# ---------------------------------------------------------------------- rendering
def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    assert HELM is not None
    done = subprocess.run([HELM, *args], capture_output=True, text=True, timeout=120, check=False)
    if check:
        assert done.returncode == 0, f"helm {' '.join(args)}: {done.stderr}"
    return done


def sets(values: dict[str, str]) -> list[str]:
    """`--set-json` flags: JSON values as given, other text as a JSON string (so that a CPU
    list's commas are not taken for separators)."""
    out: list[str] = []
    for key, value in values.items():
        try:
            json.loads(value)
        except ValueError:
            value = json.dumps(value)
        out += ["--set-json", f"{key}={value}"]
    return out


@cache
def template_text(*flags: str) -> str:
    return helm(
        "template", "corepin", str(CHART), "--namespace", NAMESPACE, "--include-crds", *flags
    ).stdout


def render(**values: str) -> list[Obj]:
    """The chart's objects for these values (dotted keys with `__` for `.`)."""
    flags = sets({k.replace("__", "."): v for k, v in values.items()})
    return [o for o in yaml.safe_load_all(template_text(*flags)) if o]


def refused(**values: str) -> str:
    flags = sets({k.replace("__", "."): v for k, v in values.items()})
    done = helm("template", "corepin", str(CHART), "--namespace", NAMESPACE, *flags, check=False)
    assert done.returncode != 0, f"helm rendered {values}"
    return done.stderr


def by_key(objs: list[Obj]) -> dict[tuple[str, str], Obj]:
    out: dict[tuple[str, str], Obj] = {}
    for o in objs:
        key = (o["kind"], o["metadata"]["name"])
        assert key not in out, f"{key} rendered twice"
        out[key] = o
    return out


def one(objs: list[Obj], kind: str, name: str) -> Obj:
    return by_key(objs)[(kind, name)]


def container(obj: Obj) -> Obj:
    (found,) = obj["spec"]["template"]["spec"]["containers"]
    result: Obj = found
    return result


def args_of(objs: list[Obj], kind: str, name: str) -> list[str]:
    found: list[str] = container(one(objs, kind, name))["args"]
    return found


def without_helm_labels(obj: Obj) -> Obj:
    out: Obj = yaml.safe_load(yaml.safe_dump(obj))
    labels = out["metadata"].get("labels", {})
    for key in HELM_LABELS:
        labels.pop(key, None)
    if not labels:
        out["metadata"].pop("labels", None)
    return out


def normalised(obj: Obj) -> Obj:
    """An object as the API server keeps it: no namespace on a cluster-scoped kind (kustomize
    5.5 puts its `namespace:` on ValidatingAdmissionPolicies, which it does not know are cluster
    scoped; the API server drops it)."""
    out = without_helm_labels(obj)
    if out["kind"] in CLUSTER_SCOPED:
        out["metadata"].pop("namespace", None)
    return out


# ---------------------------------------------------------------------- the kustomize tree
def kustomize(target: str) -> list[Obj]:
    assert KUBECTL is not None
    done = subprocess.run(
        [KUBECTL, "kustomize", str(DEPLOY / target)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return [o for o in yaml.safe_load_all(done.stdout) if o]


def component_files(directory: Path) -> Iterator[Obj]:
    """The objects a kustomization lists (its `resources`, recursively), without kubectl."""
    spec = yaml.safe_load((directory / "kustomization.yaml").read_text())
    for entry in spec.get("resources", []):
        path = (directory / entry).resolve()
        if path.is_dir():
            yield from component_files(path)
        else:
            yield from load_yaml_docs(path)


def assert_same_objects(chart: list[Obj], built: list[Obj]) -> None:
    mine, theirs = by_key(chart), by_key(built)
    assert sorted(mine) == sorted(theirs)
    for key in sorted(mine):
        assert normalised(mine[key]) == normalised(theirs[key]), f"{key} differs"


# ---------------------------------------------------------------------- lint and validation
MODES = {
    "default": {},
    "nri": {"mode": "nri"},
    "cert-manager": {"webhook.tls.mode": "certManager"},
    "generated certificate": {"webhook.tls.mode": "generate"},
    "network policies": {
        "networkPolicies.enabled": "true",
        "networkPolicies.controlPlaneCIDRs": '["10.0.0.0/24"]',
    },
    "only agent and controller": {
        "scheduler.enabled": "false",
        "extender.enabled": "false",
        "webhook.enabled": "false",
        "admissionPolicies.enabled": "false",
    },
    "everything set": {
        "namespace.create": "true",
        "reservedCPUs": "0-1",
        "policyOptions": '{"prefer-smt": true, "spread": "numa"}',
        "agent.rebalance": "move",
        "agent.rebalanceRate": "3",
        "agent.evictOnReservation": "true",
        "nodeSelector": '{"corepin.io/node": "true"}',
        "tolerations": '[{"key": "dedicated", "operator": "Exists"}]',
        "scheduler.bindCPUs": "true",
        "scheduler.profile": "Balanced",
        "webhook.schedulerName": "corepin-scheduler",
        "webhook.podNodeSelector": '{"corepin.io/node": "true"}',
        "webhook.podTolerations": '["dedicated=corepin:NoSchedule"]',
        "webhook.tls.caBundle": base64.b64encode(b"not a real CA").decode(),
    },
}


@pytest.mark.parametrize("values", MODES.values(), ids=MODES.keys())
def test_helm_lint_passes(values: dict[str, str]) -> None:
    done = helm("lint", "--strict", str(CHART), "--namespace", NAMESPACE, *sets(values))
    assert "0 chart(s) failed" in done.stdout


def validate(manifests: str) -> subprocess.CompletedProcess[str]:
    """`kubernetes-validate --strict` for Kubernetes 1.32, reading the manifests on stdin."""
    return subprocess.run(
        [str(VALIDATE), "--strict", "--quiet", "-k", K8S_VERSION, "-"],
        input=manifests,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.mark.parametrize("values", MODES.values(), ids=MODES.keys())
def test_helm_template_passes_kubernetes_validate_strict(values: dict[str, str]) -> None:
    text = template_text(*sets(values))
    assert text.count("\nkind: ") >= 10
    done = validate(text)
    assert done.returncode == 0, done.stdout + done.stderr


def test_strict_validation_catches_a_misspelled_field() -> None:
    text = template_text(
        *sets({"controller.resources": '{"requests": {"cpu": "50m"}, "limit": {}}'})
    )
    done = validate(text)
    assert done.returncode != 0 and "limit" in done.stdout + done.stderr


# ---------------------------------------------------------------------- no drift from deploy/
@needs_kubectl
def test_the_default_values_render_deploy_default_less_the_namespace() -> None:
    built = kustomize("default")
    chart = render()
    assert ("Namespace", NAMESPACE) not in by_key(chart)
    assert_same_objects(chart, [o for o in built if o["kind"] != "Namespace"])


@needs_kubectl
def test_with_its_namespace_the_chart_renders_deploy_default_object_for_object() -> None:
    assert_same_objects(render(namespace__create="true"), kustomize("default"))


@needs_kubectl
def test_nri_mode_renders_deploy_nri_mode() -> None:
    assert_same_objects(render(namespace__create="true", mode="nri"), kustomize("nri-mode"))


@needs_kubectl
def test_cert_manager_mode_renders_deploy_with_cert_manager() -> None:
    chart = render(namespace__create="true", webhook__tls__mode="certManager")
    assert_same_objects(chart, kustomize("with-cert-manager"))


@needs_kubectl
def test_network_policies_render_deploy_network_policies() -> None:
    built = kustomize("network-policies")
    cidrs = {
        peer["ipBlock"]["cidr"]
        for policy in built
        for rule in policy["spec"]["ingress"]
        for peer in rule.get("from", [])
        if "ipBlock" in peer
    }
    chart = render(
        networkPolicies__enabled="true",
        networkPolicies__controlPlaneCIDRs=json.dumps(sorted(cidrs)),
    )
    policies = [o for o in chart if o["kind"] == "NetworkPolicy"]
    assert_same_objects(policies, built)


def test_kinds_names_and_rbac_rules_are_those_of_the_component_files() -> None:
    """The same comparison without kubectl: what deploy/default lists, by kind and name, and
    every Role and ClusterRole rule for rule."""
    files = [o for o in component_files(DEPLOY / "default")]
    chart = by_key(render(namespace__create="true"))
    assert sorted(chart) == sorted((o["kind"], o["metadata"]["name"]) for o in files)
    roles = [o for o in files if o["kind"] in ("Role", "ClusterRole")]
    assert len(roles) >= 7
    for role in roles:
        key = (role["kind"], role["metadata"]["name"])
        assert chart[key]["rules"] == role["rules"], key
    for binding in (o for o in files if o["kind"].endswith("RoleBinding")):
        key = (binding["kind"], binding["metadata"]["name"])
        assert chart[key]["roleRef"] == binding["roleRef"], key
        assert chart[key]["subjects"] == binding["subjects"], key


def test_the_crds_are_those_of_deploy_crd() -> None:
    chart = {o["metadata"]["name"]: o for o in render() if o["kind"] == "CustomResourceDefinition"}
    files = {
        o["metadata"]["name"]: o
        for o in component_files(DEPLOY / "crd")
        if o["kind"] == "CustomResourceDefinition"
    }
    assert sorted(chart) == sorted(files) and len(files) == 3
    for name, crd in files.items():
        assert chart[name]["spec"] == crd["spec"], name
        assert chart[name]["metadata"]["labels"] == {"app.kubernetes.io/part-of": "corepin"}


def test_the_admission_policies_name_the_agent_of_the_release_namespace() -> None:
    done = helm("template", "corepin", str(CHART), "--namespace", "pinning")
    objs = [o for o in yaml.safe_load_all(done.stdout) if o]
    policies = [o for o in objs if o["kind"] == "ValidatingAdmissionPolicy"]
    assert len(policies) == 3
    for policy in policies:
        (condition,) = policy["spec"]["matchConditions"]
        assert '"system:serviceaccount:pinning:corepin-agent"' in condition["expression"]
    assert "corepin-system" not in done.stdout


# ---------------------------------------------------------------------- values
def parse(command: str, args: list[str]) -> Any:
    """The rendered command line as corepin's own parser reads it (a flag it does not have
    exits: the test fails)."""
    return build_parser(command).parse_args(args)


def test_nri_mode_renders_the_plugin_and_no_agent() -> None:
    objs = by_key(render(mode="nri"))
    assert ("DaemonSet", "corepin-nri") in objs and ("DaemonSet", "corepin-agent") not in objs
    assert ("DaemonSet", "corepin-agent") in by_key(render())
    assert ("DaemonSet", "corepin-nri") not in by_key(render())


def test_policy_options_and_reserved_cpus_reach_the_agent_and_the_plugin() -> None:
    values = {
        "policy": "packed",
        "policyOptions": '{"prefer-smt": true, "spread": "numa"}',
        "reservedCPUs": "0-1,8",
    }
    for mode, kind, name in (
        ("agent", "DaemonSet", "corepin-agent"),
        ("nri", "DaemonSet", "corepin-nri"),
    ):
        args = args_of(render(mode=mode, **values), kind, name)
        parsed = parse(mode, args)
        assert parsed.policy == "packed"
        assert sorted(parsed.option) == ["prefer-smt", "spread=numa"]
        assert parsed.reserved_cpus == "0-1,8"
    default = parse("agent", args_of(render(), "DaemonSet", "corepin-agent"))
    assert (default.policy, default.option, default.reserved_cpus) == ("topology-aware", [], None)


def test_rebalance_and_evict_on_reservation_reach_the_agent() -> None:
    args = args_of(
        render(agent__rebalance="move", agent__rebalanceRate="2", agent__evictOnReservation="true"),
        "DaemonSet",
        "corepin-agent",
    )
    parsed = parse("agent", args)
    assert (parsed.rebalance, parsed.rebalance_rate, parsed.evict_on_reservation) == (
        "move",
        2,
        True,
    )
    parsed = parse("agent", args_of(render(agent__rebalance="off"), "DaemonSet", "corepin-agent"))
    assert (parsed.rebalance, parsed.evict_on_reservation) == ("off", False)
    default = args_of(render(), "DaemonSet", "corepin-agent")
    assert not [a for a in default if a.startswith(("--rebalance", "--evict"))]


def test_every_rendered_command_line_parses() -> None:
    objs = render(**{k.replace(".", "__"): v for k, v in MODES["everything set"].items()})
    commands = 0
    for obj in objs:
        if obj["kind"] in WORKLOADS:
            c = container(obj)
            assert c["command"] == ["corepin"]
            args = [a.replace("$(NODE_NAME)", "node-1") for a in c["args"]]
            parse(args[0], args)
            commands += 1
    assert commands == 5


def test_the_image_values_reach_every_container() -> None:
    for mode in ("agent", "nri"):
        objs = render(
            mode=mode,
            image__repository="registry.example/corepin",
            image__tag="1.2.3",
            image__pullPolicy="Always",
            imagePullSecrets='[{"name": "pull"}]',
        )
        workloads = [o for o in objs if o["kind"] in WORKLOADS]
        assert len(workloads) == 5
        for obj in workloads:
            assert container(obj)["image"] == "registry.example/corepin:1.2.3"
            assert container(obj)["imagePullPolicy"] == "Always"
            assert obj["spec"]["template"]["spec"]["imagePullSecrets"] == [{"name": "pull"}]
    for obj in render():
        if obj["kind"] in WORKLOADS:
            assert container(obj)["image"] == "ghcr.io/corepin/corepin:0.1.0"


def test_a_disabled_component_leaves_nothing_behind() -> None:
    everything = by_key(render())
    for component in ("scheduler", "extender", "webhook"):
        objs = by_key(render(**{f"{component}__enabled": "false"}))
        gone = {key for key in everything if key not in objs}
        assert ("Deployment", f"corepin-{component}") in gone
        assert ("ServiceAccount", f"corepin-{component}") in gone
        assert ("ClusterRole", f"corepin-{component}") in gone
        assert all(f"corepin-{component}" in name or "webhook" in name for _, name in gone), gone
    no_webhook = by_key(render(webhook__enabled="false"))
    assert ("MutatingWebhookConfiguration", "corepin-webhook") not in no_webhook
    assert ("ValidatingWebhookConfiguration", "corepin-webhook") not in no_webhook
    no_policies = by_key(render(admissionPolicies__enabled="false"))
    assert not [k for k in no_policies if k[0].startswith("ValidatingAdmissionPolicy")]


def test_resources_and_placement_reach_the_pods() -> None:
    objs = render(
        agent__resources='{"requests": {"cpu": "100m", "memory": "128Mi"}}',
        nodeSelector='{"pool": "corepin"}',
        tolerations='[{"key": "dedicated", "operator": "Exists"}]',
        controller__nodeSelector='{"pool": "control"}',
    )
    agent = one(objs, "DaemonSet", "corepin-agent")
    # (Helm merges a map given with the default: the memory limit stays unless set to null)
    assert container(agent)["resources"] == {
        "requests": {"cpu": "100m", "memory": "128Mi"},
        "limits": {"memory": "256Mi"},
    }
    # the DaemonSet keeps its own: every node, whatever its taints
    assert agent["spec"]["template"]["spec"]["tolerations"] == [{"operator": "Exists"}]
    assert agent["spec"]["template"]["spec"]["nodeSelector"] == {"pool": "corepin"}
    controller = one(objs, "Deployment", "corepin-controller")["spec"]["template"]["spec"]
    assert controller["nodeSelector"] == {"pool": "control"}
    assert controller["tolerations"] == [{"key": "dedicated", "operator": "Exists"}]


def test_the_generated_webhook_certificate_is_trusted_through_the_ca_bundle() -> None:
    objs = render(webhook__tls__mode="generate")
    secret = one(objs, "Secret", "corepin-webhook-tls")
    assert secret["type"] == "kubernetes.io/tls"
    ca_pem = base64.b64decode(secret["data"]["ca.crt"])
    cert = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    ca = x509.load_pem_x509_certificate(ca_pem)
    cert.verify_directly_issued_by(ca)
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "corepin-webhook.corepin-system.svc" in names.get_values_for_type(x509.DNSName)
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        for hook in one(objs, kind, "corepin-webhook")["webhooks"]:
            assert base64.b64decode(hook["clientConfig"]["caBundle"]) == ca_pem


def test_a_given_ca_bundle_is_set_and_none_is_left_out() -> None:
    bundle = base64.b64encode(b"-----BEGIN CERTIFICATE-----\n").decode()
    objs = render(webhook__tls__caBundle=bundle)
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        hooks = one(objs, kind, "corepin-webhook")["webhooks"]
        assert [h["clientConfig"]["caBundle"] for h in hooks] == [bundle] * len(hooks)
        assert all(
            "caBundle" not in h["clientConfig"]
            for h in one(render(), kind, "corepin-webhook")["webhooks"]
        )


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"mode": "kubelet"}, "mode"),
        ({"agent.rebalance": "sometimes"}, "agent.rebalance"),
        ({"webhook.tls.mode": "manual"}, "webhook.tls.mode"),
        ({"webhook.failurePolicy": "Retry"}, "webhook.failurePolicy"),
        ({"networkPolicies.enabled": "true"}, "networkPolicies.controlPlaneCIDRs"),
    ],
    ids=["mode", "rebalance", "tls mode", "failure policy", "network policies without CIDRs"],
)
def test_a_bad_value_is_refused_by_name(values: dict[str, str], named: str) -> None:
    message = refused(**{k.replace(".", "__"): v for k, v in values.items()})
    assert named in message
