"""The rules of the built-in kinds the fake API server applies on writes, as functions: object
names, pod defaulting and validation (resources, immutable fields, the `resize` subresource),
namespaces' and CRDs' initial state, CRD validation, and which of these a kind gets.
"""

from __future__ import annotations

import copy
import json
import re
from fractions import Fraction

from corepin.testing.fakeapi import disruption
from corepin.testing.fakeapi import errors as err
from corepin.testing.fakeapi.quantity import QuantityError, parse_quantity, qos_class
from corepin.testing.fakeapi.resources import ResourceType
from corepin.testing.fakeapi.schema import FieldError, structural_problems
from corepin.testing.fakeapi.store import Obj, meta_of

_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def check_name(rt: ResourceType, name: str) -> None:
    """Refuse (422) a name the kind does not allow."""
    pattern = _DNS_LABEL if rt.plural == "namespaces" else _DNS_SUBDOMAIN
    limit = 63 if rt.plural == "namespaces" else 253
    if rt.plural == "events":
        return
    if not pattern.match(name) or len(name) > limit:
        what = (
            "a lowercase RFC 1123 label"
            if pattern is _DNS_LABEL
            else "a lowercase RFC 1123 subdomain"
        )
        raise err.invalid(
            rt,
            name,
            [
                FieldError(
                    "metadata.name",
                    "FieldValueInvalid",
                    f"Invalid value: {json.dumps(name)}: {what} must consist of lower case "
                    f"alphanumeric characters, '-' or '.', and must start and end with an "
                    f"alphanumeric character",
                )
            ],
        )


def prepare_builtin(rt: ResourceType, obj: Obj) -> None:
    """A new object of a built-in kind as the API server stores it: defaults and status."""
    if rt.plural == "pods":
        default_pod(obj)
        obj["status"] = {"phase": "Pending", "qosClass": pod_qos_class(obj)}
    elif rt.plural == "namespaces":
        obj.setdefault("spec", {})["finalizers"] = ["kubernetes"]
        obj["status"] = {"phase": "Active"}
    elif rt.plural in ("customresourcedefinitions", "poddisruptionbudgets"):
        obj.pop("status", None)


def builtin_problems(
    rt: ResourceType, obj: Obj, old: Obj | None, subresource: str = ""
) -> list[FieldError]:
    """What validation finds wrong with an object of a built-in kind (schema-less)."""
    if rt.plural == "pods":
        return pod_problems(obj, old, resize=subresource == "resize")
    if rt.plural == "customresourcedefinitions":
        return crd_problems(obj)
    if rt.storage == disruption.PDBS:
        return disruption.pdb_problems(obj)
    return []


def default_pod(pod: Obj) -> None:
    spec = pod.setdefault("spec", {})
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("securityContext", {})
    spec.setdefault("enableServiceLinks", True)
    spec.setdefault("priority", 0)
    for kind in ("containers", "initContainers"):
        for container in spec.get(kind) or []:
            if not isinstance(container, dict):
                continue
            image = str(container.get("image", ""))
            latest = ":" not in image.rsplit("/", 1)[-1] or image.endswith(":latest")
            container.setdefault("imagePullPolicy", "Always" if latest else "IfNotPresent")
            container.setdefault("terminationMessagePath", "/dev/termination-log")
            container.setdefault("terminationMessagePolicy", "File")
            resources = container.setdefault("resources", {})
            limits = resources.get("limits") or {}
            if limits:
                requests = resources.setdefault("requests", {})
                for res, value in limits.items():
                    requests.setdefault(res, value)


def pod_qos_class(pod: Obj) -> str:
    try:
        return qos_class(pod)
    except QuantityError:
        return "BestEffort"  # the pod is refused by validation anyway


_POD_MUTABLE_TEXT = (
    "pod updates may not change fields other than `spec.containers[*].image`,"
    "`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,"
    "`spec.tolerations` (only additions to existing tolerations),"
    "`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was "
    "previously negative)"
)


_RESIZE_TEXT = "pod resize may not change fields other than cpu and memory resources"


def _resource_problems(path: str, container: Obj) -> list[FieldError]:
    """Quantities that parse, and no request above its limit."""
    problems: list[FieldError] = []
    resources = container.get("resources") or {}
    values: dict[str, dict[str, Fraction]] = {}
    for kind in ("requests", "limits"):
        for res, raw in (resources.get(kind) or {}).items():
            try:
                values.setdefault(kind, {})[res] = parse_quantity(raw)
            except QuantityError:
                problems.append(
                    FieldError(
                        f"{path}.resources.{kind}[{res}]",
                        "FieldValueInvalid",
                        f"Invalid value: {json.dumps(raw)}: quantities must match the regular "
                        "expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'",
                    )
                )
    for res, limit in (values.get("limits") or {}).items():
        request = (values.get("requests") or {}).get(res)
        if request is not None and request > limit:
            problems.append(
                FieldError(
                    f"{path}.resources.requests",
                    "FieldValueInvalid",
                    f'Invalid value: "{resources["requests"][res]}": must be less than or '
                    f"equal to {res} limit of {resources['limits'][res]}",
                )
            )
    return problems


def _resize_problems(pod: Obj, old: Obj) -> list[FieldError]:
    """What the pods/resize subresource refuses: changes of anything but the containers' cpu and
    memory resources (and resize policies), and a change of the QoS class."""

    def without_resizable(spec_value: Obj) -> Obj:
        out = copy.deepcopy(spec_value)
        for kind in ("containers", "initContainers"):
            for container in out.get(kind) or []:
                container.pop("resizePolicy", None)
                resources = container.get("resources") or {}
                for section in ("requests", "limits"):
                    for res in ("cpu", "memory"):
                        (resources.get(section) or {}).pop(res, None)
                    if section in resources and not resources[section]:
                        del resources[section]
        return out

    if without_resizable(pod.get("spec") or {}) != without_resizable(old.get("spec") or {}):
        return [FieldError("spec", "FieldValueForbidden", f"Forbidden: {_RESIZE_TEXT}")]
    before, after = pod_qos_class(old), pod_qos_class(pod)
    if before != after:
        return [
            FieldError(
                "spec",
                "FieldValueInvalid",
                f'Invalid value: "{after}": Pod QOS Class may not change as a result of resizing',
            )
        ]
    return []


def pod_problems(pod: Obj, old: Obj | None, *, resize: bool = False) -> list[FieldError]:
    problems: list[FieldError] = []
    spec = pod.get("spec") or {}
    containers = spec.get("containers")
    if not containers:
        problems.append(FieldError("spec.containers", "FieldValueRequired", "Required value"))
    for kind in ("containers", "initContainers"):
        for i, container in enumerate(spec.get(kind) or []):
            if isinstance(container, dict):
                problems.extend(_resource_problems(f"spec.{kind}[{i}]", container))
    seen: set[str] = set()
    for i, container in enumerate(containers or []):
        name = container.get("name") if isinstance(container, dict) else None
        if not name:
            problems.append(
                FieldError(f"spec.containers[{i}].name", "FieldValueRequired", "Required value")
            )
        elif name in seen:
            problems.append(
                FieldError(
                    f"spec.containers[{i}].name",
                    "FieldValueDuplicate",
                    f"Duplicate value: {json.dumps(name)}",
                )
            )
        else:
            seen.add(name)
        if isinstance(container, dict) and not container.get("image"):
            problems.append(
                FieldError(f"spec.containers[{i}].image", "FieldValueRequired", "Required value")
            )
    if old is not None and not problems and resize:
        problems.extend(_resize_problems(pod, old))
    elif old is not None and not problems:

        def comparable(spec_value: Obj) -> Obj:
            out = copy.deepcopy(spec_value)
            for kind in ("containers", "initContainers"):
                for container in out.get(kind) or []:
                    container.pop("image", None)
            for key in (
                "activeDeadlineSeconds",
                "tolerations",
                "terminationGracePeriodSeconds",
                "schedulingGates",
            ):
                out.pop(key, None)
            return out

        if comparable(spec) != comparable(old.get("spec") or {}):
            problems.append(
                FieldError("spec", "FieldValueForbidden", f"Forbidden: {_POD_MUTABLE_TEXT}")
            )
    return problems


def crd_problems(crd: Obj) -> list[FieldError]:
    problems: list[FieldError] = []
    spec = crd.get("spec") or {}
    names = spec.get("names") or {}
    group = spec.get("group") or ""
    if not group:
        problems.append(FieldError("spec.group", "FieldValueRequired", "Required value"))
    for key in ("plural", "kind"):
        if not names.get(key):
            problems.append(FieldError(f"spec.names.{key}", "FieldValueRequired", "Required value"))
    name = meta_of(crd).get("name")
    if names.get("plural") and group and name != f"{names['plural']}.{group}":
        problems.append(
            FieldError(
                "metadata.name",
                "FieldValueInvalid",
                f'Invalid value: {json.dumps(name)}: must be spec.names.plural+"."+spec.group',
            )
        )
    if spec.get("scope") not in ("Namespaced", "Cluster"):
        problems.append(
            FieldError(
                "spec.scope",
                "FieldValueNotSupported",
                f"Unsupported value: {json.dumps(spec.get('scope'))}: "
                'supported values: "Cluster", "Namespaced"',
            )
        )
    versions = spec.get("versions") or []
    if not versions:
        problems.append(
            FieldError(
                "spec.versions",
                "FieldValueInvalid",
                "Invalid value: null: must have exactly one version marked as storage version",
            )
        )
    elif sum(1 for v in versions if v.get("storage")) != 1:
        problems.append(
            FieldError(
                "spec.versions",
                "FieldValueInvalid",
                "Invalid value: must have exactly one version marked as storage version",
            )
        )
    for i, version in enumerate(versions):
        schema = (version.get("schema") or {}).get("openAPIV3Schema")
        for problem in structural_problems(schema):
            problems.append(
                FieldError(
                    f"spec.versions[{i}].schema.{problem.field}", problem.reason, problem.detail
                )
            )
    return problems
