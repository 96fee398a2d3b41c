"""The Kubernetes manifests under deploy/.

- `kubectl kustomize` builds deploy/default and deploy/with-cert-manager (skipped without kubectl;
  the CRD, RBAC and workload checks then read the component files directly);
- every object passes `kubernetes-validate --strict` for Kubernetes 1.32;
- the CRDs are structural, name every field the contract names, and accept the examples and the
  models' output while refusing broken objects;
- RBAC grants each component the verbs it needs and nothing from a list it must not have;
- the agent DaemonSet passes the contract's flags and mounts what they point at.
"""

from __future__ import annotations

import argparse
import copy
import re
import shutil
import subprocess
from collections.abc import Iterable, Iterator
from functools import cache
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import SchemaNotFoundError

from corepin.cli.main import build_parser
from support import pods
from support.crd_schema import crd, errors, load_yaml_docs, version_schema
from support.paths import DEPLOY, REPO

KUBECTL = shutil.which("kubectl")
K8S_VERSION = "1.32.0"
NAMESPACE = "corepin-system"
IMAGE = "ghcr.io/corepin/corepin:0.1.0"
CERT_MANAGER_KINDS = {("cert-manager.io/v1", "Issuer"), ("cert-manager.io/v1", "Certificate")}
COMPONENT_DIRS = (
    "crd",
    "rbac",
    "admission",
    "agent",
    "controller",
    "scheduler",
    "extender",
    "webhook",
)

needs_kubectl = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed")


# ---------------------------------------------------------------------- loading
def kustomize(target: str) -> list[dict[str, Any]]:
    assert KUBECTL is not None
    done = subprocess.run(
        [KUBECTL, "kustomize", str(DEPLOY / target)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def _resources_of(directory: Path) -> Iterator[dict[str, Any]]:
    """Objects of a kustomization without kubectl: its `resources` files and directories."""
    spec = yaml.safe_load((directory / "kustomization.yaml").read_text())
    for entry in spec.get("resources", []):
        path = (directory / entry).resolve()
        if path.is_dir():
            yield from _resources_of(path)
        else:
            yield from load_yaml_docs(path)


@cache
def default_objects() -> tuple[dict[str, Any], ...]:
    """deploy/default as kubectl builds it, or read from the component files without kubectl."""
    if KUBECTL is not None:
        return tuple(kustomize("default"))
    return tuple(_resources_of(DEPLOY / "default"))


def objects(kind: str, name: str | None = None) -> list[dict[str, Any]]:
    return [
        o
        for o in default_objects()
        if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)
    ]


def one(kind: str, name: str) -> dict[str, Any]:
    found = objects(kind, name)
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


def pod_spec(kind: str, name: str) -> dict[str, Any]:
    spec: dict[str, Any] = one(kind, name)["spec"]["template"]["spec"]
    return spec


def container(kind: str, name: str) -> dict[str, Any]:
    containers = pod_spec(kind, name)["containers"]
    assert len(containers) == 1
    found: dict[str, Any] = containers[0]
    return found


def flags(args: list[str]) -> dict[str, str]:
    """`--name=value` arguments after the subcommand (every flag here has a value)."""
    out: dict[str, str] = {}
    for arg in args[1:]:
        assert arg.startswith("--") and "=" in arg, f"argument {arg!r} is not --flag=value"
        name, value = arg.split("=", 1)
        assert name not in out, f"{name} given twice"
        out[name] = value
    return out


def k8s_validate(obj: dict[str, Any]) -> None:
    kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


# ---------------------------------------------------------------------- kustomize and validation
@needs_kubectl
@pytest.mark.parametrize(
    "target", ["default", "with-cert-manager", "network-policies", *COMPONENT_DIRS]
)
def test_kubectl_kustomize_builds(target: str) -> None:
    built = kustomize(target)
    assert built, f"deploy/{target} built nothing"


@needs_kubectl
def test_default_build_holds_every_component_in_the_corepin_namespace() -> None:
    built = kustomize("default")
    kinds = {(o["kind"], o["metadata"]["name"]) for o in built}
    for expected in [
        ("Namespace", NAMESPACE),
        ("CustomResourceDefinition", "nodecputopologies.corepin.io"),
        ("CustomResourceDefinition", "podcpubindings.corepin.io"),
        ("CustomResourceDefinition", "cpureservations.corepin.io"),
        ("DaemonSet", "corepin-agent"),
        ("Deployment", "corepin-controller"),
        ("Deployment", "corepin-scheduler"),
        ("Deployment", "corepin-extender"),
        ("Service", "corepin-extender"),
        ("Deployment", "corepin-webhook"),
        ("Service", "corepin-webhook"),
        ("MutatingWebhookConfiguration", "corepin-webhook"),
        ("ValidatingWebhookConfiguration", "corepin-webhook"),
    ]:
        assert expected in kinds, f"{expected} missing from deploy/default"
    cluster_scoped = {
        "Namespace",
        "CustomResourceDefinition",
        "ClusterRole",
        "ClusterRoleBinding",
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
    }
    for o in built:
        if o["kind"] not in cluster_scoped:
            assert o["metadata"].get("namespace") == NAMESPACE, (o["kind"], o["metadata"])
        assert o["metadata"].get("labels", {}).get("app.kubernetes.io/part-of") == "corepin"


def test_every_object_passes_kubernetes_validate_strict_for_1_32() -> None:
    for obj in default_objects():
        try:
            k8s_validate(obj)
        except SchemaNotFoundError:
            pytest.fail(f"no Kubernetes {K8S_VERSION} schema for {obj['kind']} {obj['apiVersion']}")


def test_strict_validation_refuses_a_misspelled_field() -> None:
    broken = copy.deepcopy(one("DaemonSet", "corepin-agent"))
    broken["spec"]["template"]["spec"]["tolerances"] = [{"operator": "Exists"}]
    with pytest.raises(kubernetes_validate.ValidationError):
        k8s_validate(broken)


@needs_kubectl
def test_with_cert_manager_adds_the_certificate_and_the_ca_injection() -> None:
    built = kustomize("with-cert-manager")
    extra = [o for o in built if (o["apiVersion"], o["kind"]) in CERT_MANAGER_KINDS]
    for obj in built:
        if (obj["apiVersion"], obj["kind"]) not in CERT_MANAGER_KINDS:
            k8s_validate(obj)
    cert = next(o for o in extra if o["kind"] == "Certificate")
    service = one("Service", "corepin-webhook")
    dns = f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc"
    assert dns in cert["spec"]["dnsNames"]
    secret = pod_spec("Deployment", "corepin-webhook")["volumes"][0]["secret"]["secretName"]
    assert cert["spec"]["secretName"] == secret
    issuer = next(o for o in extra if o["kind"] == "Issuer")
    assert cert["spec"]["issuerRef"] == {"kind": "Issuer", "name": issuer["metadata"]["name"]}
    ref = f"{cert['metadata']['namespace']}/{cert['metadata']['name']}"
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        conf = next(o for o in built if o["kind"] == kind)
        assert conf["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == ref


# ---------------------------------------------------------------------- CRDs
NCPT = "nodecputopologies"
PCB = "podcpubindings"
CPUR = "cpureservations"
CPUSET = "cpuset"  # a string in Linux list form, checked by pattern

# Every field the CRD contract names, with what it must be. `[]` steps into list items, `{}` into
# map values.
CONTRACT_FIELDS: dict[str, list[tuple[str, Any]]] = {
    NCPT: [
        ("spec.topology", "object"),
        ("spec.topology.cpus", "array"),
        ("spec.topology.cpus[].cpu", "integer"),
        ("spec.topology.cpus[].online", "boolean"),
        ("spec.topology.cpus[].socket", "integer"),
        ("spec.topology.cpus[].die", "integer"),
        ("spec.topology.cpus[].numa", "integer"),
        ("spec.topology.cpus[].l3", "integer"),
        ("spec.topology.cpus[].l2", "integer"),
        ("spec.topology.cpus[].core", "integer"),
        ("spec.topology.cpus[].isolated", "boolean"),
        ("spec.topology.cpus[].core_type", "string"),
        ("spec.topology.numa_nodes", "array"),
        ("spec.topology.numa_nodes[].id", "integer"),
        ("spec.topology.numa_nodes[].cpus", CPUSET),
        ("spec.topology.numa_nodes[].distances", "object"),
        ("spec.topology.numa_nodes[].distances{}", "integer"),
        ("spec.policy", "string"),
        ("spec.options", "object"),
        ("spec.options{}", "string"),
        ("spec.reservedCPUs", CPUSET),
        ("status.sharedPool", CPUSET),
        ("status.reservedCPUs", CPUSET),
        ("status.isolatedCPUs", CPUSET),
        ("status.free", CPUSET),
        ("status.freeByNUMA", "object"),
        ("status.freeByNUMA{}", CPUSET),
        ("status.freeByL3", "object"),
        ("status.freeByL3{}", CPUSET),
        ("status.allocations", "array"),
        ("status.allocations[].namespace", "string"),
        ("status.allocations[].pod", "string"),
        ("status.allocations[].podUID", "string"),
        ("status.allocations[].container", "string"),
        ("status.allocations[].cpus", CPUSET),
        ("status.allocations[].mems", CPUSET),
        ("status.allocations[].policy", ["exclusive", "share"]),
        ("status.allocations[].level", ["cpu", "core", "l3", "numa", "socket"]),
        ("status.allocations[].qosClass", ["LSE", "LSR", "LS", "BE", "SYSTEM"]),
        ("status.heartbeatTime", "date-time"),
        ("status.conditions", "conditions"),
    ],
    PCB: [
        ("spec.podName", "string"),
        ("spec.exclusivenessLevel", ["None", "CPU", "Core", "L3", "NUMA", "Socket"]),
        ("spec.exclusivenessLevel", ["cpu", "core", "l3", "numa", "socket"]),
        ("spec.cpuSet", "array"),
        ("spec.cpuSet[].cpuID", "integer"),
        ("spec.containers", "array"),
        ("spec.containers[].name", "string"),
        ("spec.containers[].cpuSet", "array"),
        ("spec.containers[].cpuSet[].cpuID", "integer"),
        ("status.nodeName", "string"),
        ("status.phase", ["Pending", "Validated", "Applied", "Failed"]),
        ("status.cpus", CPUSET),
        ("status.mems", CPUSET),
        ("status.message", "string"),
        ("status.qosClass", ["LSE", "LSR", "LS", "BE", "SYSTEM"]),
        ("status.conditions", "conditions"),
    ],
    CPUR: [
        ("spec.nodeName", "string"),
        ("spec.cpus", "integer"),
        ("spec.cpuSet", CPUSET),
        ("spec.level", ["None", "CPU", "Core", "L3", "NUMA", "Socket"]),
        ("spec.level", ["cpu", "core", "l3", "numa", "socket"]),
        ("spec.owners", "array"),
        ("spec.owners[].namespace", "string"),
        ("spec.owners[].name", "string"),
        ("spec.owners[].labelSelector", "object"),
        ("spec.owners[].labelSelector.matchLabels", "object"),
        ("spec.owners[].labelSelector.matchLabels{}", "string"),
        ("spec.owners[].labelSelector.matchExpressions", "array"),
        ("spec.owners[].labelSelector.matchExpressions[].key", "string"),
        (
            "spec.owners[].labelSelector.matchExpressions[].operator",
            ["In", "NotIn", "Exists", "DoesNotExist"],
        ),
        ("spec.owners[].labelSelector.matchExpressions[].values", "array"),
        ("spec.ttl", "int-or-string"),
        ("spec.allocateOnce", "boolean"),
        ("status.phase", ["Pending", "Available", "Succeeded", "Expired", "Failed"]),
        ("status.nodeName", "string"),
        ("status.cpus", CPUSET),
        ("status.owners", "array"),
        ("status.owners[].namespace", "string"),
        ("status.owners[].name", "string"),
        ("status.owners[].uid", "string"),
        ("status.message", "string"),
        ("status.expireTime", "date-time"),
    ],
}


def schema_at(schema: dict[str, Any], path: str) -> dict[str, Any]:
    node = schema
    for step in re.findall(r"[^.\[\]{}]+|\[\]|\{\}", path):
        if step == "[]":
            node = node["items"]
        elif step == "{}":
            node = node["additionalProperties"]
        else:
            assert step in node.get("properties", {}), f"{path}: no field {step!r}"
            node = node["properties"][step]
    return node


@pytest.mark.parametrize(
    ("plural", "path", "expected"),
    [
        (plural, path, expected)
        for plural, rows in CONTRACT_FIELDS.items()
        for path, expected in rows
    ],
    ids=[f"{plural}.{path}" for plural, rows in CONTRACT_FIELDS.items() for path, _ in rows],
)
def test_crd_has_every_field_of_the_contract(plural: str, path: str, expected: Any) -> None:
    node = schema_at(version_schema(crd(plural), "v1alpha1"), path)
    if isinstance(expected, list):
        assert node["type"] == "string"
        assert set(expected) <= set(node["enum"]), f"{path} enum {node['enum']} lacks {expected}"
    elif expected == CPUSET:
        assert node["type"] == "string"
        pattern = re.compile(node["pattern"])
        for good in ("", "0", "0-3", "0-3,8,10-11"):
            assert pattern.search(good), f"{path} refuses {good!r}"
        for bad in ("0-", ",1", "1,,2", "a", "0-3 ", "-1"):
            assert not pattern.search(bad), f"{path} accepts {bad!r}"
    elif expected == "int-or-string":
        assert node["x-kubernetes-int-or-string"] is True
    elif expected == "date-time":
        assert node == {**node, "type": "string", "format": "date-time"}
    elif expected == "conditions":
        assert node["x-kubernetes-list-type"] == "map"
        assert node["x-kubernetes-list-map-keys"] == ["type"]
        item = node["items"]
        assert set(item["required"]) == {
            "type",
            "status",
            "lastTransitionTime",
            "reason",
            "message",
        }
        assert item["properties"]["status"]["enum"] == ["True", "False", "Unknown"]
    else:
        assert node["type"] == expected


@pytest.mark.parametrize(
    ("plural", "kind", "scope", "short"),
    [
        (NCPT, "NodeCPUTopology", "Cluster", "ncpt"),
        (PCB, "PodCPUBinding", "Namespaced", "pcb"),
        (CPUR, "CPUReservation", "Cluster", "cpur"),
    ],
)
def test_crd_names_scope_and_version(plural: str, kind: str, scope: str, short: str) -> None:
    definition = crd(plural)
    spec = definition["spec"]
    assert definition["metadata"]["name"] == f"{plural}.corepin.io"
    assert spec["group"] == "corepin.io"
    assert spec["scope"] == scope
    assert spec["names"]["kind"] == kind
    assert spec["names"]["plural"] == plural
    assert short in spec["names"]["shortNames"]
    (version,) = spec["versions"]
    assert (version["name"], version["served"], version["storage"]) == ("v1alpha1", True, True)
    assert version["subresources"] == {"status": {}}


@pytest.mark.parametrize(
    ("plural", "columns"),
    [
        (NCPT, ["Policy", "Shared", "Free", "Ready", "Age"]),
        (PCB, ["Pod", "Level", "CPUs", "Phase", "Node", "Age"]),
        (CPUR, ["Node", "CPUs", "Phase", "Age"]),
    ],
)
def test_printer_columns_point_at_fields_of_the_schema(plural: str, columns: list[str]) -> None:
    (version,) = crd(plural)["spec"]["versions"]
    found = {c["name"]: c for c in version["additionalPrinterColumns"]}
    assert set(columns) <= set(found)
    schema = version["schema"]["openAPIV3Schema"]
    for column in found.values():
        path = column["jsonPath"]
        if path.startswith(".metadata."):
            continue
        field = re.sub(r"\[\?\(@\.type==\"\w+\"\)\]", "[]", path.lstrip("."))
        schema_at(schema, field)  # fails when the column names a field that does not exist


def _structural_problems(node: dict[str, Any], path: str) -> Iterator[str]:
    preserve = node.get("x-kubernetes-preserve-unknown-fields", False)
    if "type" not in node and not node.get("x-kubernetes-int-or-string") and not preserve:
        yield f"{path}: no type"
    if "properties" in node and "additionalProperties" in node:
        yield f"{path}: both properties and additionalProperties"
    if node.get("type") == "object" and not (
        "properties" in node or "additionalProperties" in node or preserve or path == "metadata"
    ):
        yield f"{path}: an object with no fields"
    if node.get("type") == "array" and "items" not in node:
        yield f"{path}: an array without items"
    if node.get("x-kubernetes-list-type") == "map":
        required = set(node["items"].get("required", []))
        for key in node["x-kubernetes-list-map-keys"]:
            if key not in required:
                yield f"{path}: list-map key {key} is not required"
    for key, child in node.get("properties", {}).items():
        yield from _structural_problems(child, f"{path}.{key}".lstrip("."))
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            yield from _structural_problems(node[key], f"{path}{'[]' if key == 'items' else '{}'}")


@pytest.mark.parametrize("plural", [NCPT, PCB, CPUR])
def test_crd_schema_is_structural(plural: str) -> None:
    schema = version_schema(crd(plural), "v1alpha1")
    assert list(_structural_problems(schema, "")) == []


def test_topology_keeps_unknown_fields_as_section_2_allows() -> None:
    schema = version_schema(crd(NCPT), "v1alpha1")
    for path in ("spec.topology", "spec.topology.cpus[]", "spec.topology.numa_nodes[]"):
        assert schema_at(schema, path)["x-kubernetes-preserve-unknown-fields"] is True
    preserved = [
        p
        for p in ("spec", "status", "status.allocations[]")
        if schema_at(schema, p).get("x-kubernetes-preserve-unknown-fields")
    ]
    assert preserved == [], "only the topology keeps unknown fields"


# ---------------------------------------------------------------------- custom resources
EXAMPLES = DEPLOY / "samples"


def example(name: str) -> dict[str, Any]:
    (doc,) = load_yaml_docs(EXAMPLES / name)
    return doc


def schema_for(obj: dict[str, Any]) -> dict[str, Any]:
    plural = {"NodeCPUTopology": NCPT, "PodCPUBinding": PCB, "CPUReservation": CPUR}[obj["kind"]]
    return version_schema(crd(plural), obj["apiVersion"].split("/")[1])


def test_every_example_is_valid() -> None:
    names = sorted(p.name for p in EXAMPLES.glob("*.yaml") if p.name != "kustomization.yaml")
    assert len(names) >= 4
    for name in names:
        obj = example(name)
        if obj["apiVersion"].startswith("corepin.io/"):
            assert errors(schema_for(obj), obj) == [], name
        else:
            k8s_validate(obj)


def _set(obj: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    node: Any = out
    steps = [int(s) if s.isdigit() else s for s in path.split(".")]
    for step in steps[:-1]:
        node = node[step]
    if value is _DELETE:
        del node[steps[-1]]
    elif callable(value):
        node[steps[-1]] = value(node[steps[-1]])
    else:
        node[steps[-1]] = value
    return out


_DELETE = object()

INVALID = [
    ("nodecputopology.yaml", "spec.reservedCPUs", "0-3,", "a CPU list with a stray comma"),
    ("nodecputopology.yaml", "status.free", "0 - 3", "a CPU list with spaces"),
    ("nodecputopology.yaml", "status.freeByNUMA.1", "three", "a map value that is no CPU list"),
    ("nodecputopology.yaml", "status.allocations.0.policy", "none", "an allocation of policy none"),
    ("nodecputopology.yaml", "status.allocations.0.level", "Core", "a status level in CRD case"),
    ("nodecputopology.yaml", "status.allocations.0.podUID", _DELETE, "an allocation without uid"),
    (
        "nodecputopology.yaml",
        "status.allocations",
        lambda rows: [rows[0], {**rows[0], "cpus": "3"}],
        "two allocations for the same pod uid and container name",
    ),
    ("nodecputopology.yaml", "status.conditions.0.status", "yes", "a condition status not True"),
    ("nodecputopology.yaml", "status.conditions.0.reason", "not camel", "a reason with a space"),
    ("nodecputopology.yaml", "status.heartbeatTime", "yesterday", "a heartbeat that is no time"),
    ("nodecputopology.yaml", "spec.topology.cpus", [], "a topology without CPUs"),
    ("nodecputopology.yaml", "spec.topology.cpus.0.cpu", -1, "a negative CPU id"),
    ("nodecputopology.yaml", "spec.topology.cpus.0.online", "yes", "online that is not a bool"),
    ("nodecputopology.yaml", "spec.topology.numa_nodes.0.distances", {"1": "far"}, "a distance"),
    ("nodecputopology.yaml", "spec.policy", "", "an empty policy name"),
    ("nodecputopology.yaml", "spec.topology", _DELETE, "a spec without topology"),
    ("nodecputopology.yaml", "spec.options", {"level": 3}, "an option value that is no string"),
    ("nodecputopology.yaml", "spec.reservedCpus", "0", "a misspelled field"),
    ("podcpubinding-explicit.yaml", "spec.exclusivenessLevel", "Rack", "an unknown level"),
    ("podcpubinding-explicit.yaml", "spec.exclusivenessLevel", "CORE", "a level in upper case"),
    ("podcpubinding-explicit.yaml", "spec.cpuSet", [{"cpuID": 2}, {"cpuID": 2}], "a CPU twice"),
    ("podcpubinding-explicit.yaml", "spec.cpuSet", [{"cpuID": 8192}], "a CPU id beyond 8191"),
    ("podcpubinding-explicit.yaml", "spec.cpuSet", ["2"], "a CPU given as text"),
    ("podcpubinding-explicit.yaml", "spec.podName", _DELETE, "a binding without pod"),
    ("podcpubinding-containers.yaml", "spec.containers.1.name", "engine", "a container twice"),
    ("podcpubinding-containers.yaml", "spec.containers.0.cpuSet", [], "a container without CPUs"),
    ("podcpubinding-containers.yaml", "status.phase", "Done", "an unknown phase"),
    ("podcpubinding-containers.yaml", "status.cpus", "2-", "a status CPU list cut short"),
    ("cpureservation.yaml", "spec.cpus", 0, "a reservation of no CPUs"),
    ("cpureservation.yaml", "spec.cpus", "4", "a CPU count given as text"),
    ("cpureservation.yaml", "spec.cpuSet", "4-7", "both a count and a CPU list"),
    ("cpureservation.yaml", "spec.cpus", _DELETE, "neither a count nor a CPU list"),
    ("cpureservation.yaml", "spec.level", "Rack", "a reservation at an unknown level"),
    ("cpureservation.yaml", "spec.owners", [], "a reservation for no one"),
    ("cpureservation.yaml", "spec.owners", [{}], "an owner row naming nothing"),
    (
        "cpureservation.yaml",
        "spec.owners.0.labelSelector.matchExpressions",
        [{"key": "app", "operator": "Near"}],
        "an unknown selector operator",
    ),
    ("cpureservation.yaml", "spec.ttl", "soon", "a TTL that is no duration"),
    ("cpureservation.yaml", "spec.ttl", 0, "a TTL of no seconds"),
    ("cpureservation.yaml", "spec.ttl", 1.5, "a TTL of a fraction of seconds"),
    ("cpureservation.yaml", "spec.allocateOnce", "yes", "allocateOnce that is not a bool"),
    ("cpureservation.yaml", "spec.podName", "x", "a field reservations do not have"),
    ("cpureservation.yaml", "spec.owners.0.namespace", "", "an owner in an empty namespace"),
]
INVALID += [
    ("cpureservation.yaml", "status", {"phase": "Done"}, "a reservation in an unknown phase"),
    ("cpureservation.yaml", "status", {"phase": "Available", "cpus": "4-"}, "held CPUs cut short"),
    ("cpureservation.yaml", "status", {"expireTime": "later"}, "an expiry that is no time"),
]


@pytest.mark.parametrize(
    ("name", "path", "value", "what"), INVALID, ids=[row[3] for row in INVALID]
)
def test_the_crd_schema_refuses(name: str, path: str, value: Any, what: str) -> None:
    good = example(name)
    assert errors(schema_for(good), good) == []
    bad = _set(good, path, value)
    assert errors(schema_for(bad), bad) != [], f"the CRD accepts {what}"


@pytest.mark.parametrize(
    ("path", "value", "what"),
    [
        ("spec.topology.cpus.0.vendor_hint", "x", "an unknown field in a CPU row"),
        ("spec.topology.numa_nodes.0.memory_kb", 1024, "a NUMA node's memory size"),
        ("spec.topology.generator", "corepin 0.1", "an unknown field of the topology"),
        ("spec.topology.cpus.0.core_type", "performance", "a core type"),
        ("spec.topology.cpus.0.l3", None, "a null cache id"),
        ("status.freeByNUMA.1", "", "an empty CPU list"),
    ],
)
def test_the_crd_schema_accepts(path: str, value: Any, what: str) -> None:
    good = _set(example("nodecputopology.yaml"), path, value)
    assert errors(schema_for(good), good) == [], what


def test_pod_name_of_a_binding_cannot_change() -> None:
    old = example("podcpubinding-explicit.yaml")
    same = _set(old, "spec.cpuSet", [{"cpuID": 3}])
    moved = _set(old, "spec.podName", "batch-8")
    assert errors(schema_for(same), same, old=old) == []
    assert errors(schema_for(moved), moved, old=old) == ["spec.podName: spec.podName is immutable"]


def _with_status(obj: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
    return {**copy.deepcopy(obj), "status": status}


@pytest.mark.parametrize(
    ("path", "value", "what"),
    [
        ("spec.ttl", 90, "a TTL in seconds"),
        ("spec.ttl", "1h30m", "a TTL as a duration"),
        ("spec.ttl", "45", "a TTL as a digit string"),
        ("spec.level", "None", "actimanager's None level"),
        ("spec.owners", [{"name": "trader-0"}], "an owner by pod name only"),
        ("spec.allocateOnce", False, "a reusable reservation"),
    ],
)
def test_the_reservation_schema_accepts(path: str, value: Any, what: str) -> None:
    good = _set(example("cpureservation.yaml"), path, value)
    assert errors(schema_for(good), good) == [], what


def test_a_reservation_with_cpu_list_and_node_is_valid() -> None:
    obj = _set(example("cpureservation.yaml"), "spec.cpus", _DELETE)
    obj["spec"]["cpuSet"] = "4-7"
    obj["spec"]["nodeName"] = "worker-1"
    assert errors(schema_for(obj), obj) == []


def test_a_reservation_spec_is_frozen_once_it_left_pending() -> None:
    old = example("cpureservation.yaml")
    bigger = _set(old, "spec.cpus", 8)
    pending = _with_status(old, {"phase": "Pending", "nodeName": "worker-1"})
    held = _with_status(old, {"phase": "Available", "nodeName": "worker-1", "cpus": "4-7"})
    assert errors(schema_for(bigger), bigger, old=old) == []  # no status yet
    assert errors(schema_for(bigger), _with_status(bigger, pending["status"]), old=pending) == []
    refused = errors(schema_for(bigger), _with_status(bigger, held["status"]), old=held)
    assert refused == [": spec is immutable once the reservation has left Pending"]
    same = _with_status(old, {**held["status"], "message": "held"})
    assert errors(schema_for(same), same, old=held) == []


def test_the_reservation_model_reads_the_sample_and_writes_what_the_crd_accepts() -> None:
    from corepin.kube.models import CPUReservation

    sample = example("cpureservation.yaml")
    r = CPUReservation.from_dict(sample)
    assert (r.spec.count, r.spec.level, r.spec.ttl, r.spec.allocate_once) == (4, "core", 1800, True)
    written = {**sample, "spec": r.spec.to_dict(), "status": r.status.to_dict()}
    assert errors(schema_for(written), written) == []


def test_every_cel_rule_compiles() -> None:
    import celpy

    env = celpy.Environment()
    rules = []
    for plural in (NCPT, PCB, CPUR):
        rules += list(_cel_rules(crd(plural)))
    assert len(rules) >= 4, "no CEL rule found"
    for rule in rules:
        env.compile(rule)


def _cel_rules(node: Any) -> Iterator[str]:
    """Every `x-kubernetes-validations` rule under `node` (a multi-line one whole)."""
    if isinstance(node, dict):
        for row in node.get("x-kubernetes-validations", []):
            yield row["rule"]
        for value in node.values():
            yield from _cel_rules(value)
    elif isinstance(node, list):
        for value in node:
            yield from _cel_rules(value)


def test_example_node_status_follows_the_contract_definitions() -> None:
    """free = online - reserved - held; sharedPool = online - isolated - exclusive and withheld."""
    from corepin.allocation.levels import withheld_for
    from corepin.core.cpuset import CPUSet
    from corepin.kube.models import NodeCPUTopology

    ncpt = NodeCPUTopology.from_dict(example("nodecputopology.yaml"))
    topology, status = ncpt.spec.topology, ncpt.status
    assert status is not None
    online = topology.online_cpus
    held = CPUSet().union(*(withheld_for(topology, a.level, a.cpus) for a in status.allocations))
    exclusive = CPUSet().union(
        *(
            withheld_for(topology, a.level, a.cpus)
            for a in status.allocations
            if a.policy == "exclusive"
        )
    )
    assert status.free == online - status.reserved_cpus - held
    assert status.shared_pool == online - status.isolated_cpus - exclusive
    for node in topology.numa_node_ids():
        assert status.free_by_numa[node] == status.free & topology.cpus_in_numa_nodes(node)
    for l3 in topology.l3_ids():
        assert status.free_by_l3[l3] == status.free & topology.cpus_in_l3s(l3)
    assert all(a.mems == topology.mems_of(a.cpus) for a in status.allocations)


# ---------------------------------------------------------------------- RBAC
RBAC_KINDS = ("ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")


def _roles_of(account: str) -> Iterator[tuple[dict[str, Any], str | None]]:
    """(role, namespace it applies in or None for the whole cluster) bound to the account."""
    for binding in objects("ClusterRoleBinding") + objects("RoleBinding"):
        subjects = binding.get("subjects", [])
        if not any(
            s["kind"] == "ServiceAccount" and s["name"] == account and s["namespace"] == NAMESPACE
            for s in subjects
        ):
            continue
        ref = binding["roleRef"]
        where = binding["metadata"].get("namespace") if binding["kind"] == "RoleBinding" else None
        if ref["kind"] == "ClusterRole":
            yield one("ClusterRole", ref["name"]), where
        else:
            (role,) = [
                r for r in objects("Role", ref["name"]) if r["metadata"]["namespace"] == where
            ]
            yield role, where


def allowed(
    account: str,
    group: str,
    resource: str,
    verb: str,
    *,
    namespace: str | None = None,
    name: str | None = None,
) -> bool:
    for role, where in _roles_of(account):
        if where is not None and where != namespace:
            continue
        for rule in role.get("rules", []):
            names = rule.get("resourceNames")
            if (
                group in rule.get("apiGroups", [])
                and resource in rule.get("resources", [])
                and verb in rule.get("verbs", [])
                and (not names or name in names)
            ):
                return True
    return False


READ = ("get", "list", "watch")
NEEDS: dict[str, list[tuple[str, str, tuple[str, ...]]]] = {
    "corepin-agent": [
        ("", "pods", (*READ, "patch")),
        ("", "nodes", READ),
        ("", "events", ("create", "patch")),
        ("corepin.io", "nodecputopologies", (*READ, "create", "update", "patch")),
        ("corepin.io", "nodecputopologies/status", ("update", "patch")),
        ("corepin.io", "podcpubindings", (*READ, "create", "update", "patch", "delete")),
        ("corepin.io", "podcpubindings/status", ("update", "patch")),
        ("topology.node.k8s.io", "noderesourcetopologies", ("create", "get", "update")),
        ("corepin.io", "cpureservations", READ),
        ("corepin.io", "cpureservations/status", ("update", "patch")),
    ],
    "corepin-controller": [
        ("", "pods", READ),
        ("", "events", ("create", "patch")),
        ("corepin.io", "nodecputopologies", READ),
        ("corepin.io", "nodecputopologies/status", ("get", "update")),
        ("corepin.io", "podcpubindings", (*READ, "update", "delete")),
        ("corepin.io", "podcpubindings/status", ("get", "update")),
        ("corepin.io", "cpureservations", (*READ, "update", "patch", "delete")),
        ("corepin.io", "cpureservations/status", ("get", "update", "patch")),
        ("", "nodes", ("get",)),
    ],
    "corepin-scheduler": [
        ("", "pods", READ),
        ("", "pods/binding", ("create",)),
        ("", "pods/status", ("patch", "update")),
        ("", "nodes", ("list", "watch")),
        ("", "events", ("create", "patch")),
        ("events.k8s.io", "events", ("create", "patch")),
        ("corepin.io", "nodecputopologies", READ),
        ("corepin.io", "podcpubindings", (*READ, "create")),
        ("corepin.io", "cpureservations", READ),
        ("corepin.io", "cpureservations/status", ("patch",)),
    ],
    "corepin-extender": [
        ("", "pods", READ),
        ("", "pods/binding", ("create",)),
        ("", "nodes", READ),
        ("corepin.io", "nodecputopologies", READ),
        ("corepin.io", "podcpubindings", READ),
        ("corepin.io", "cpureservations", READ),
    ],
    "corepin-webhook": [("corepin.io", "nodecputopologies", READ)],
}
MUST_NOT: dict[str, list[tuple[str, str, str]]] = {
    "corepin-agent": [
        ("", "pods", "delete"),
        ("", "pods", "update"),
        ("", "nodes", "patch"),
        ("", "pods/binding", "create"),
        ("", "pods/status", "patch"),
        ("corepin.io", "nodecputopologies", "delete"),
        ("events.k8s.io", "events", "create"),
        ("corepin.io", "cpureservations", "create"),
        ("corepin.io", "cpureservations", "update"),
        ("corepin.io", "cpureservations", "delete"),
    ],
    "corepin-controller": [
        ("", "pods", "patch"),
        ("", "pods", "delete"),
        ("", "nodes", "list"),
        ("corepin.io", "nodecputopologies", "create"),
        ("corepin.io", "nodecputopologies", "update"),
        ("corepin.io", "nodecputopologies", "delete"),
        ("corepin.io", "podcpubindings", "create"),
        ("corepin.io", "cpureservations", "create"),
    ],
    "corepin-scheduler": [
        ("", "pods", "delete"),
        ("", "pods", "update"),
        ("corepin.io", "nodecputopologies", "update"),
        ("corepin.io", "podcpubindings", "delete"),
        ("", "nodes", "patch"),
        ("corepin.io", "cpureservations", "update"),
        ("corepin.io", "cpureservations", "delete"),
        ("corepin.io", "cpureservations/status", "update"),
    ],
    "corepin-extender": [
        ("", "pods", "patch"),
        ("corepin.io", "podcpubindings", "create"),
        ("corepin.io", "nodecputopologies", "update"),
        ("", "events", "create"),
        ("corepin.io", "cpureservations/status", "patch"),
    ],
    "corepin-webhook": [
        (g, r, v)
        for g, r, verbs in NEEDS["corepin-agent"]
        for v in verbs
        if (g, r, v) not in {("corepin.io", "nodecputopologies", verb) for verb in READ}
    ],
}
EVERYONE_MUST_NOT = [
    ("", "secrets", "get"),
    ("", "secrets", "list"),
    ("", "configmaps", "update"),
    ("", "pods/exec", "create"),
    ("rbac.authorization.k8s.io", "clusterroles", "create"),
]


@pytest.mark.parametrize(
    ("account", "group", "resource", "verb"),
    [(a, g, r, v) for a, rows in NEEDS.items() for g, r, verbs in rows for v in verbs],
)
def test_rbac_grants_what_the_component_needs(
    account: str, group: str, resource: str, verb: str
) -> None:
    assert allowed(account, group, resource, verb), f"{account} cannot {verb} {group}/{resource}"


@pytest.mark.parametrize(
    ("account", "group", "resource", "verb"),
    [(a, g, r, v) for a, rows in MUST_NOT.items() for g, r, v in rows]
    + [(a, g, r, v) for a in NEEDS for g, r, v in EVERYONE_MUST_NOT],
)
def test_rbac_grants_nothing_the_component_must_not_have(
    account: str, group: str, resource: str, verb: str
) -> None:
    assert not allowed(account, group, resource, verb), f"{account} may {verb} {group}/{resource}"


@pytest.mark.parametrize("account", ["corepin-scheduler", "corepin-controller"])
def test_a_leader_elected_component_may_hold_only_its_own_lease_in_its_namespace(
    account: str,
) -> None:
    lease = ("coordination.k8s.io", "leases")
    for verb in ("get", "update"):
        assert allowed(account, *lease, verb, namespace=NAMESPACE, name=account)
        assert not allowed(account, *lease, verb, namespace=NAMESPACE, name="other")
        assert not allowed(account, *lease, verb, namespace="default", name=account)
    assert allowed(account, *lease, "create", namespace=NAMESPACE)
    assert not allowed(account, *lease, "delete", namespace=NAMESPACE)


def test_the_agent_reads_configmaps_of_its_own_namespace_only() -> None:
    for verb in READ:
        assert allowed("corepin-agent", "", "configmaps", verb, namespace=NAMESPACE)
        assert not allowed("corepin-agent", "", "configmaps", verb)  # cluster wide
        assert not allowed("corepin-agent", "", "configmaps", verb, namespace="default")
    for verb in ("create", "update", "patch", "delete"):
        assert not allowed("corepin-agent", "", "configmaps", verb, namespace=NAMESPACE)


def test_the_agent_knows_its_namespace_for_the_qos_configmap() -> None:
    env = {e["name"]: e for e in container("DaemonSet", "corepin-agent")["env"]}
    assert env["POD_NAMESPACE"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}


def test_rbac_has_no_wildcards_and_every_workload_account_exists() -> None:
    for role in objects("ClusterRole") + objects("Role"):
        for rule in role["rules"]:
            for key in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule.get(key, []), f"{role['metadata']['name']}: * in {key}"
    accounts = {o["metadata"]["name"] for o in objects("ServiceAccount")}
    for kind, name in [
        ("DaemonSet", "corepin-agent"),
        ("Deployment", "corepin-controller"),
        ("Deployment", "corepin-scheduler"),
        ("Deployment", "corepin-extender"),
        ("Deployment", "corepin-webhook"),
    ]:
        assert pod_spec(kind, name)["serviceAccountName"] == name
        assert name in accounts


# ---------------------------------------------------------------------- workloads
#: The contract's flags per command.
CONTRACT_FLAGS = {
    "agent": {
        "--node-name", "--kubeconfig", "--sysfs-root", "--proc-root", "--cgroup-root",
        "--kubelet-cgroup-root", "--cgroup-driver", "--state-dir", "--policy", "--option",
        "--reserved-cpus", "--grpc-socket", "--metrics-address", "--resync-period",
    },
    "controller": {"--kubeconfig", "--metrics-address"},
    "scheduler": {"--kubeconfig", "--scheduler-name", "--metrics-address"},
    "extender": {"--kubeconfig", "--address"},
    "webhook": {"--kubeconfig", "--address", "--tls-cert", "--tls-key", "--scheduler-name"},
}  # fmt: skip


#: flags beyond the contract's that a Deployment may pass: the extender's TLS with client
#: certificates and its plain health port; the agent's node QoS (resctrl mount, QoS period)
#: and the kubelet's PodResources socket (CPUs near devices)
HARDENING_FLAGS = {
    "extender": {"--tls-cert", "--tls-key", "--client-ca", "--metrics-address"},
    "agent": {"--resctrl-root", "--qos-period", "--qos-config", "--pod-resources-socket"},
}
EXTENDER_OPS_PORT = 9468


def test_every_contract_flag_is_a_flag_of_its_command() -> None:
    """The flags above are the ones the manifests may rely on: every component command keeps
    each of them (the agent: node, kubeconfig, the host roots, the kubelet's cgroup root and
    driver, state directory, policy and options, reserved CPUs, gRPC socket, metrics address,
    resync period; the controller and scheduler: kubeconfig and metrics address, the scheduler
    its name; the extender: kubeconfig and address; the webhook: kubeconfig, address, TLS pair,
    scheduler name)."""
    for command, expected in CONTRACT_FLAGS.items():
        actions = build_parser(command)._actions
        (sub,) = [a for a in actions if isinstance(a, argparse._SubParsersAction)]
        parser = sub.choices[command]
        named = {flag for action in parser._actions for flag in action.option_strings}
        assert expected <= named, (command, expected - named)


def _mounts(kind: str, name: str) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """mountPath -> (volumeMount, volume)."""
    spec = pod_spec(kind, name)
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    return {m["mountPath"]: (m, volumes[m["name"]]) for m in container(kind, name)["volumeMounts"]}


def _host_path_of(kind: str, name: str, path: str) -> tuple[str, bool]:
    """(host path, read-only) behind a path inside the container (longest mount prefix)."""
    mounts = _mounts(kind, name)
    best = max(
        (m for m in mounts if path == m or path.startswith(m.rstrip("/") + "/")),
        key=len,
        default=None,
    )
    assert best is not None, f"{path} is on no mount"
    mount, volume = mounts[best]
    assert "hostPath" in volume, f"{path} is not on a hostPath volume"
    host = volume["hostPath"]["path"].rstrip("/") + path[len(best.rstrip("/")) :]
    return host or "/", bool(mount.get("readOnly", False))


def test_agent_daemonset_passes_the_contract_flags() -> None:
    c = container("DaemonSet", "corepin-agent")
    args = [*c.get("command", []), *c["args"]]
    assert args[:2] == ["corepin", "agent"]
    given = flags(args[1:])
    allowed_flags = CONTRACT_FLAGS["agent"] | HARDENING_FLAGS["agent"]
    assert set(given) <= allowed_flags, set(given) - allowed_flags
    assert {
        "--node-name", "--sysfs-root", "--proc-root", "--cgroup-root", "--state-dir",
        "--grpc-socket", "--metrics-address",
    } <= set(given)  # fmt: skip
    assert given["--node-name"] == "$(NODE_NAME)"
    env = {e["name"]: e for e in c["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert given["--metrics-address"] == ":9464"
    assert given["--cgroup-driver"] in ("auto", "cgroupfs", "systemd")


@pytest.mark.parametrize(
    ("flag", "suffix", "host", "writable"),
    [
        ("--sysfs-root", "/sys/devices/system/cpu", "/sys/devices/system/cpu", False),
        ("--proc-root", "", "/proc", False),
        ("--cgroup-root", "", "/sys/fs/cgroup", True),
        ("--state-dir", "", "/var/lib/corepin", True),
        ("--grpc-socket", "", "/run/corepin/corepin.sock", True),
        (
            "--pod-resources-socket",
            "",
            "/var/lib/kubelet/pod-resources/kubelet.sock",
            False,
        ),
    ],
)
def test_agent_flag_points_at_the_host_path(
    flag: str, suffix: str, host: str, writable: bool
) -> None:
    given = flags(container("DaemonSet", "corepin-agent")["args"])
    path, read_only = _host_path_of("DaemonSet", "corepin-agent", given[flag] + suffix)
    assert path == host
    assert read_only is not writable


def test_agent_reads_the_kubelet_state_and_shares_the_assignment_directory() -> None:
    path, read_only = _host_path_of(
        "DaemonSet", "corepin-agent", "/var/lib/kubelet/cpu_manager_state"
    )
    assert (path, read_only) == ("/var/lib/kubelet/cpu_manager_state", True)
    mounts = _mounts("DaemonSet", "corepin-agent")
    assignment = [
        v
        for _, v in mounts.values()
        if v.get("hostPath", {}).get("path", "").endswith("assignments")
    ]
    assert len(assignment) == 1 and assignment[0]["hostPath"]["type"] == "DirectoryOrCreate"


def test_agent_runs_everywhere_privileged_with_health_probes() -> None:
    spec = pod_spec("DaemonSet", "corepin-agent")
    assert {"operator": "Exists"} in spec["tolerations"]
    c = container("DaemonSet", "corepin-agent")
    assert c["securityContext"]["privileged"] is True
    assert c["image"] == IMAGE
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    for probe in ("readinessProbe", "startupProbe"):
        get = c[probe]["httpGet"]
        assert get["path"] == "/healthz" and ports[get["port"]] == 9464
    # /healthz fails while the API cannot be seen: liveness only asks that the port answers
    assert ports[c["livenessProbe"]["tcpSocket"]["port"]] == 9464
    assert "memory" in c["resources"]["limits"] and "cpu" not in c["resources"]["limits"]


@pytest.mark.parametrize(
    ("command", "port", "address_flag"),
    [
        ("controller", 9465, "--metrics-address"),
        ("scheduler", 9466, "--metrics-address"),
        ("extender", 9467, "--address"),
        ("webhook", 9443, "--address"),
    ],
)
def test_deployment_runs_its_command_with_contract_flags_and_probes(
    command: str, port: int, address_flag: str
) -> None:
    c = container("Deployment", f"corepin-{command}")
    assert c["command"] == ["corepin"] and c["args"][0] == command
    given = flags(c["args"])
    assert set(given) <= CONTRACT_FLAGS[command] | HARDENING_FLAGS.get(command, set())
    assert given[address_flag] == f":{port}"
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    # the extender's HTTPS port wants a client certificate: its probes use the plain one
    probe_port = EXTENDER_OPS_PORT if command == "extender" else port
    assert sorted(ports.values()) == sorted({port, probe_port})
    for probe in ("livenessProbe", "readinessProbe"):
        get = c[probe]["httpGet"]
        assert get["path"] == "/healthz" and ports[get["port"]] == probe_port
        assert get.get("scheme", "HTTP") == ("HTTPS" if command == "webhook" else "HTTP")
    assert c["image"] == IMAGE
    security = c["securityContext"]
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    assert pod_spec("Deployment", f"corepin-{command}")["securityContext"]["runAsNonRoot"] is True


def test_scheduler_is_named_as_the_contract_default() -> None:
    given = flags(container("Deployment", "corepin-scheduler")["args"])
    assert given["--scheduler-name"] == "corepin-scheduler"


def test_webhook_tls_files_come_from_the_secret() -> None:
    given = flags(container("Deployment", "corepin-webhook")["args"])
    mounts = _mounts("Deployment", "corepin-webhook")
    for flag, key in (("--tls-cert", "tls.crt"), ("--tls-key", "tls.key")):
        directory, _, filename = given[flag].rpartition("/")
        mount, volume = mounts[directory]
        assert mount["readOnly"] is True and filename == key
        assert volume["secret"]["secretName"] == "corepin-webhook-tls"


def test_extender_serves_tls_with_client_certificates_from_the_secret() -> None:
    given = flags(container("Deployment", "corepin-extender")["args"])
    assert "--insecure-http" not in given
    mounts = _mounts("Deployment", "corepin-extender")
    for flag, key in (
        ("--tls-cert", "tls.crt"),
        ("--tls-key", "tls.key"),
        ("--client-ca", "ca.crt"),
    ):
        directory, _, filename = given[flag].rpartition("/")
        mount, volume = mounts[directory]
        assert mount["readOnly"] is True and filename == key
        assert volume["secret"]["secretName"] == "corepin-extender-tls"
    assert given["--metrics-address"] == f":{EXTENDER_OPS_PORT}"


def _network_policies() -> dict[str, dict[str, Any]]:
    if KUBECTL is not None:
        built = kustomize("network-policies")
    else:
        built = list(_resources_of(DEPLOY / "network-policies"))
    return {o["metadata"]["name"]: o for o in built}


def test_network_policies_validate_and_select_the_pods_they_guard() -> None:
    policies = _network_policies()
    assert set(policies) == {"corepin-extender", "corepin-webhook"}
    for name, policy in policies.items():
        k8s_validate(policy)
        assert policy["metadata"]["namespace"] == NAMESPACE
        labels = pod_spec_labels(name)
        assert policy["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
        assert policy["spec"]["policyTypes"] == ["Ingress"]


def pod_spec_labels(name: str) -> dict[str, str]:
    labels: dict[str, str] = one("Deployment", name)["spec"]["template"]["metadata"]["labels"]
    return labels


def test_only_the_control_plane_may_open_the_extender_and_the_webhook_ports() -> None:
    policies = _network_policies()
    extender_ports = {
        p["containerPort"]: p["name"] for p in container("Deployment", "corepin-extender")["ports"]
    }
    rules = {
        r["ports"][0]["port"]: r.get("from")
        for r in policies["corepin-extender"]["spec"]["ingress"]
    }
    assert set(rules) == set(extender_ports)  # every port the pod serves has a rule
    sources = rules[9467]
    assert sources, "the extender's HTTPS port is open to everyone"
    in_pods = [s for s in sources if "podSelector" in s]
    assert in_pods and all(
        s["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "kube-system"}
        and s["podSelector"]["matchLabels"] == {"component": "kube-scheduler"}
        for s in in_pods
    )
    assert [s["ipBlock"]["cidr"] for s in sources if "ipBlock" in s] == ["192.0.2.0/24"]
    assert rules[EXTENDER_OPS_PORT] is None  # probes and scrapes
    (webhook_rule,) = policies["corepin-webhook"]["spec"]["ingress"]
    assert webhook_rule["ports"] == [{"port": 9443, "protocol": "TCP"}]
    assert webhook_rule["from"] == [{"ipBlock": {"cidr": "192.0.2.0/24"}}]


def _service_port(name: str, target: str) -> int:
    service = one("Service", name)
    pod_labels = one("Deployment", name)["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    (port,) = [p for p in service["spec"]["ports"] if p["targetPort"] == target]
    value: int = port["port"]
    return value


@pytest.mark.parametrize(
    ("kind", "path", "operations"),
    [
        ("MutatingWebhookConfiguration", "/mutate", ["CREATE"]),
        ("ValidatingWebhookConfiguration", "/validate", ["CREATE", "UPDATE"]),
    ],
)
def test_webhook_configuration_reaches_the_service(
    kind: str, path: str, operations: list[str]
) -> None:
    hooks = one(kind, "corepin-webhook")["webhooks"]
    (hook,) = [h for h in hooks if h["name"].endswith(".pods.corepin.io")]
    service = hook["clientConfig"]["service"]
    assert (service["name"], service["namespace"], service["path"]) == (
        "corepin-webhook",
        NAMESPACE,
        path,
    )
    assert service["port"] == _service_port("corepin-webhook", "https")
    assert hook["admissionReviewVersions"] == ["v1"]
    assert hook["sideEffects"] == "None"
    assert hook["failurePolicy"] in ("Ignore", "Fail")
    (rule,) = hook["rules"]
    assert rule["resources"] == ["pods"] and rule["apiGroups"] == [""]
    assert rule["operations"] == operations
    excluded = [
        e for e in hook["namespaceSelector"]["matchExpressions"]
        if e["key"] == "kubernetes.io/metadata.name" and e["operator"] == "NotIn"
    ]  # fmt: skip
    assert excluded and {"kube-system", NAMESPACE} <= set(excluded[0]["values"])


def test_reservations_are_sent_to_the_validating_webhook() -> None:
    hooks = one("ValidatingWebhookConfiguration", "corepin-webhook")["webhooks"]
    (hook,) = [h for h in hooks if h["name"] == "validate.cpureservations.corepin.io"]
    assert hook["clientConfig"]["service"]["path"] == "/validate"
    assert hook["clientConfig"]["service"]["port"] == _service_port("corepin-webhook", "https")
    (rule,) = hook["rules"]
    assert (rule["apiGroups"], rule["resources"], rule["scope"]) == (
        ["corepin.io"],
        ["cpureservations"],
        "Cluster",
    )
    assert rule["operations"] == ["CREATE", "UPDATE"]
    assert "namespaceSelector" not in hook  # cluster scoped: it would not apply
    mutating = one("MutatingWebhookConfiguration", "corepin-webhook")["webhooks"]
    assert all(r["resources"] == ["pods"] for h in mutating for r in h["rules"])


def test_corepin_namespace_is_excluded_from_the_webhook_by_its_label_too() -> None:
    labels = one("Namespace", NAMESPACE)["metadata"]["labels"]
    assert labels["corepin.io/webhook"] == "disabled"


def test_extender_scheduler_configuration_wires_the_service() -> None:
    (config,) = load_yaml_docs(DEPLOY / "extender" / "scheduler-config.yaml")
    assert config["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert config["kind"] == "KubeSchedulerConfiguration"
    (ext,) = config["extenders"]
    port = _service_port("corepin-extender", "https")
    assert ext["urlPrefix"] == f"https://corepin-extender.{NAMESPACE}.svc:{port}"
    assert ext["enableHTTPS"] is True
    assert {"certFile", "keyFile", "caFile"} <= set(ext["tlsConfig"])
    assert ext["tlsConfig"]["serverName"] == f"corepin-extender.{NAMESPACE}.svc"
    assert (ext["filterVerb"], ext["prioritizeVerb"], ext["bindVerb"]) == (
        "filter",
        "prioritize",
        "bind",
    )
    assert ext["nodeCacheCapable"] is True
    # kube-scheduler's own validation: a prioritizing extender needs a positive weight, and
    # managedResources may name extended resources only.
    assert isinstance(ext["weight"], int) and ext["weight"] > 0
    for managed in ext.get("managedResources", []):
        assert "/" in managed["name"] and not managed["name"].startswith("kubernetes.io/")
    assert set(ext) <= {
        "urlPrefix", "filterVerb", "preemptVerb", "prioritizeVerb", "bindVerb", "weight",
        "enableHTTPS", "tlsConfig", "httpTimeout", "nodeCacheCapable", "managedResources",
        "ignorable",
    }  # fmt: skip


# ---------------------------------------------------------------------- image
def test_dockerfile_builds_the_placeholder_image_from_this_project() -> None:
    text = (REPO / "Dockerfile").read_text()
    lines = [
        line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")
    ]
    froms = [line.split()[1] for line in lines if line.startswith("FROM ")]
    assert froms and all(f.startswith("python:3.11-slim") for f in froms)
    assert any("pip install" in line and "--no-cache-dir" in line for line in lines)
    entry = next(line for line in lines if line.startswith("ENTRYPOINT"))
    assert entry == 'ENTRYPOINT ["corepin"]'
    for line in lines:
        if line.startswith("COPY") and "--from" not in line:
            for source in line.split()[1:-1]:
                assert (REPO / source).exists(), f"Dockerfile copies {source}, which is not there"
    ignored = (REPO / ".dockerignore").read_text().split()
    assert ".venv" in ignored and ".git" in ignored
    readme = (DEPLOY / "README.md").read_text()
    assert IMAGE in readme and "placeholder" in readme


def _all_images(objs: Iterable[dict[str, Any]]) -> set[str]:
    found: set[str] = set()
    for obj in objs:
        spec = obj.get("spec", {}).get("template", {}).get("spec", {})
        for c in spec.get("containers", []) + spec.get("initContainers", []):
            found.add(c["image"])
    return found


def test_every_workload_runs_the_one_image() -> None:
    assert _all_images(default_objects()) == {IMAGE}


# ---------------------------------------------------------------------- admission policies
AGENT = f"system:serviceaccount:{NAMESPACE}:corepin-agent"
NODE_KEY = "authentication.kubernetes.io/node-name"


def policies() -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objects("ValidatingAdmissionPolicy")}


def admit(policy: dict[str, Any], request: dict[str, Any]) -> tuple[bool, list[str]]:
    """What the API server decides for `request` (an AdmissionRequest with object/oldObject):
    the policy's match conditions, its variables in order, then its validations, evaluated
    with cel-python. (allowed, messages of the failed validations); a request that no match
    condition selects is allowed."""
    import celpy
    from celpy import celtypes

    env = celpy.Environment()

    def run(expression: str, activation: dict[str, Any]) -> Any:
        return env.program(env.compile(expression)).evaluate(activation)

    activation: dict[str, Any] = {
        "request": celpy.json_to_cel(request),
        "object": celpy.json_to_cel(request.get("object")),
        "oldObject": celpy.json_to_cel(request.get("oldObject")),
    }
    spec = policy["spec"]
    if not all(bool(run(c["expression"], activation)) for c in spec.get("matchConditions", [])):
        return True, []
    variables = celtypes.MapType({})
    for variable in spec.get("variables", []):
        activation["variables"] = variables
        value = run(variable["expression"], activation)
        assert not isinstance(value, celpy.CELEvalError), (variable["name"], value)
        variables = celtypes.MapType({**variables, celtypes.StringType(variable["name"]): value})
    activation["variables"] = variables
    failed = []
    for check in spec["validations"]:
        verdict = run(check["expression"], activation)
        assert isinstance(verdict, celtypes.BoolType), (check["expression"], verdict)
        if not verdict:
            failed.append(check.get("message") or str(run(check["messageExpression"], activation)))
    return not failed, failed


def agent_request(
    operation: str,
    resource: str,
    name: str,
    *,
    obj: dict[str, Any] | None = None,
    old: dict[str, Any] | None = None,
    node: str | None = "worker-1",
    user: str = AGENT,
    subresource: str = "",
) -> dict[str, Any]:
    extra = {NODE_KEY: [node]} if node is not None else {}
    return {
        "operation": operation,
        "name": name,
        "resource": {"resource": resource},
        "subResource": subresource,
        "userInfo": {"username": user, "extra": extra},
        "object": obj,
        "oldObject": old,
    }


def a_pod(
    node: str, annotations: dict[str, str] | None = None, image: str = "app:1"
) -> dict[str, Any]:
    """The pod web of the admission policy tests, on `node`."""
    return pods.pod(
        "web",
        pods.container(image=image),
        labels={"app": "web"},
        annotations=annotations,
        node=node,
    )


def test_the_admission_policies_are_in_the_default_build_and_bound() -> None:
    found = policies()
    assert set(found) == {
        "corepin-agent-pods",
        "corepin-agent-node-objects",
        "corepin-agent-bindings",
    }
    bindings = {o["spec"]["policyName"]: o for o in objects("ValidatingAdmissionPolicyBinding")}
    assert set(bindings) == set(found)
    for name, policy in found.items():
        k8s_validate(policy)
        k8s_validate(bindings[name])
        assert bindings[name]["spec"]["validationActions"] == ["Deny"]
        assert policy["spec"]["failurePolicy"] == "Fail"
        (condition,) = policy["spec"]["matchConditions"]
        assert condition["expression"] == f'request.userInfo.username == "{AGENT}"'


def test_every_admission_expression_compiles() -> None:
    import celpy

    env = celpy.Environment()
    for policy in policies().values():
        spec = policy["spec"]
        for item in [*spec["matchConditions"], *spec.get("variables", []), *spec["validations"]]:
            env.compile(item["expression"])
            if "messageExpression" in item:
                env.compile(item["messageExpression"])


def test_the_agent_may_set_the_cpus_annotation_of_its_own_nodes_pods_only() -> None:
    policy = policies()["corepin-agent-pods"]
    before = a_pod("worker-1", {"team": "a"})
    pinned = a_pod("worker-1", {"team": "a", "corepin.io/cpus": '{"app": "2-3"}'})
    # allowed: its own node's pod, the corepin.io/cpus annotation added, changed, removed
    assert admit(policy, agent_request("UPDATE", "pods", "web", obj=pinned, old=before))[0]
    moved = a_pod("worker-1", {"team": "a", "corepin.io/cpus": '{"app": "4"}'})
    assert admit(policy, agent_request("UPDATE", "pods", "web", obj=moved, old=pinned))[0]
    assert admit(policy, agent_request("UPDATE", "pods", "web", obj=before, old=pinned))[0]
    bare = a_pod("worker-1")
    first = a_pod("worker-1", {"corepin.io/cpus": '{"app": "1"}'})
    assert admit(policy, agent_request("UPDATE", "pods", "web", obj=first, old=bare))[0]
    # refused: another node's pod
    theirs = a_pod("worker-2", {"team": "a"})
    taken = a_pod("worker-2", {"team": "a", "corepin.io/cpus": '{"app": "2"}'})
    allowed, why = admit(policy, agent_request("UPDATE", "pods", "web", obj=taken, old=theirs))
    assert not allowed and "its own node's pods" in why[0]
    # refused: the image, another annotation, a label
    image = a_pod("worker-1", {"team": "a"}, image="evil:1")
    assert not admit(policy, agent_request("UPDATE", "pods", "web", obj=image, old=before))[0]
    other = a_pod("worker-1", {"team": "b", "corepin.io/cpus": '{"app": "2"}'})
    allowed, why = admit(policy, agent_request("UPDATE", "pods", "web", obj=other, old=before))
    assert not allowed and why == [
        "the corepin agent may change a pod's corepin.io/cpus annotation only"
    ]
    added = a_pod("worker-1", {"team": "a", "corepin.io/cpu-policy": "exclusive"})
    assert not admit(policy, agent_request("UPDATE", "pods", "web", obj=added, old=before))[0]
    labelled = copy.deepcopy(pinned)
    labelled["metadata"]["labels"]["app"] = "other"
    assert not admit(policy, agent_request("UPDATE", "pods", "web", obj=labelled, old=before))[0]
    # refused: a token without the node claim; not matched: anyone else
    assert not admit(
        policy, agent_request("UPDATE", "pods", "web", obj=pinned, old=before, node=None)
    )[0]
    kubelet = agent_request("UPDATE", "pods", "web", obj=image, old=before, user="system:node:w")
    assert admit(policy, kubelet)[0]


def test_the_agent_may_write_only_its_own_nodes_objects() -> None:
    policy = policies()["corepin-agent-node-objects"]
    ncpt = {"metadata": {"name": "worker-1"}}
    assert admit(policy, agent_request("CREATE", "nodecputopologies", "worker-1", obj=ncpt))[0]
    assert admit(
        policy,
        agent_request(
            "UPDATE", "nodecputopologies", "worker-1", obj=ncpt, old=ncpt, subresource="status"
        ),
    )[0]
    other = {"metadata": {"name": "worker-2"}}
    for resource in ("nodecputopologies", "noderesourcetopologies", "nodes"):
        request = agent_request("UPDATE", resource, "worker-2", obj=other, old=other)
        allowed, why = admit(policy, request)
        assert not allowed and "not worker-2" in why[0], resource
    gone = agent_request("DELETE", "nodecputopologies", "worker-2", old=other)
    assert not admit(policy, gone)[0]
    assert not admit(
        policy, agent_request("CREATE", "nodecputopologies", "worker-1", obj=ncpt, node=None)
    )[0]


def test_the_agent_may_write_only_its_own_nodes_bindings() -> None:
    policy = policies()["corepin-agent-bindings"]

    def binding(node: str | None) -> dict[str, Any]:
        labels = {"app.kubernetes.io/managed-by": "corepin-agent"}
        if node is not None:
            labels["corepin.io/node"] = node
        return {"metadata": {"name": "web-app", "namespace": "default", "labels": labels}}

    mine, theirs, users = binding("worker-1"), binding("worker-2"), binding(None)
    pcb = "podcpubindings"
    assert admit(policy, agent_request("CREATE", pcb, "web-app", obj=mine))[0]
    assert admit(policy, agent_request("UPDATE", pcb, "web-app", obj=mine, old=mine))[0]
    status = agent_request("UPDATE", pcb, "web-app", obj=mine, old=mine, subresource="status")
    assert admit(policy, status)[0]
    assert admit(policy, agent_request("DELETE", pcb, "web-app", old=mine))[0]
    assert not admit(policy, agent_request("CREATE", pcb, "web-app", obj=theirs))[0]
    assert not admit(policy, agent_request("UPDATE", pcb, "web-app", obj=theirs, old=theirs))[0]
    # relabelling another node's (or a user's) binding as its own is no way in
    assert not admit(policy, agent_request("UPDATE", pcb, "web-app", obj=mine, old=theirs))[0]
    assert not admit(policy, agent_request("UPDATE", pcb, "web-app", obj=mine, old=users))[0]
    assert not admit(policy, agent_request("DELETE", pcb, "web-app", old=theirs))[0]
    assert not admit(policy, agent_request("DELETE", pcb, "web-app", old=users))[0]
