"""The kube-scheduler extender v1 wire format (k8s.io/kube-scheduler/extender/v1), both ways.

The Go types have no JSON tags, so their keys are the Go field names (`Pod`, `NodeNames`,
`FailedNodes`, `Score`, ...), written in field order, every field present (`null` for a nil
pointer, slice or map). Go's decoder matches keys case-insensitively (an exact match first),
and kube-scheduler relies on nothing else: `decode` does the same for every struct field of
the extender types and of the parts of the Pod and Node objects that corepin reads (map keys
such as annotations and resource names keep their case, as Go keeps them); unknown keys are
kept as they are.

Types (decoded into plain dicts with canonical keys; encoded from them):

- `ExtenderArgs` {Pod, Nodes (a NodeList), NodeNames}
- `ExtenderFilterResult` {Nodes, NodeNames, FailedNodes, FailedAndUnresolvableNodes, Error}
- `HostPriorityList` [{Host, Score}]
- `ExtenderBindingArgs` {PodName, PodNamespace, PodUID, Node}; `ExtenderBindingResult` {Error}
- `ExtenderPreemptionArgs` {Pod, NodeNameToVictims, NodeNameToMetaVictims};
  `ExtenderPreemptionResult` {NodeNameToMetaVictims} with `MetaVictims` {Pods: [{UID}],
  NumPDBViolations}

Why orjson: a request from kube-scheduler without `nodeCacheCapable` carries the whole
NodeList (megabytes at 1,000 nodes) and the answer echoes the passing nodes back; orjson
parses and writes that several times faster than the standard library, and checks UTF-8.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

import orjson

from corepin.core.errors import InputError
from corepin.kube.models import ObjectView
from corepin.kube.models.fields import FieldError, list_or_empty, object_at, string

_NAME: Final = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?\Z")
#: deepest nesting a request may have (a Pod is about 10 deep; Go's own limit is 10,000)
MAX_DEPTH: Final = 64


class WireError(InputError):
    """A request body that is not an extender message: the HTTP answer is 400 with it."""

    default_reason = "bad_request"


# ---------------------------------------------------------------------- schema
class _Struct:
    """A Go struct: canonical field name -> schema of its value (None: any value)."""

    __slots__ = ("fields", "folded")

    def __init__(self, fields: Mapping[str, Any]) -> None:
        self.fields: dict[str, Any] = dict(fields)
        self.folded: dict[str, str] = {k.lower(): k for k in fields}


class _List:
    __slots__ = ("item",)

    def __init__(self, item: Any) -> None:
        self.item = item


class _Map:
    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


STRING_MAP: Final = _Map(None)
RESOURCES: Final = _Struct({"limits": STRING_MAP, "requests": STRING_MAP, "claims": None})
CONTAINER: Final = _Struct({"name": None, "image": None, "resources": RESOURCES})
OBJECT_META: Final = _Struct(
    {
        "name": None,
        "generateName": None,
        "namespace": None,
        "uid": None,
        "resourceVersion": None,
        "generation": None,
        "creationTimestamp": None,
        "deletionTimestamp": None,
        "labels": STRING_MAP,
        "annotations": STRING_MAP,
        "ownerReferences": None,
    }
)
TOLERATION: Final = _Struct(
    {"key": None, "operator": None, "value": None, "effect": None, "tolerationSeconds": None}
)
POD_SPEC: Final = _Struct(
    {
        "containers": _List(CONTAINER),
        "initContainers": _List(CONTAINER),
        "nodeName": None,
        "nodeSelector": STRING_MAP,
        "schedulerName": None,
        "tolerations": _List(TOLERATION),
        "priority": None,
    }
)
CONTAINER_STATE: Final = _Struct({"running": None, "terminated": None, "waiting": None})
CONTAINER_STATUS: Final = _Struct(
    {"name": None, "containerID": None, "state": CONTAINER_STATE, "resources": RESOURCES}
)
POD_STATUS: Final = _Struct(
    {
        "phase": None,
        "qosClass": None,
        "conditions": None,
        "containerStatuses": _List(CONTAINER_STATUS),
        "initContainerStatuses": _List(CONTAINER_STATUS),
    }
)
POD: Final = _Struct(
    {
        "apiVersion": None,
        "kind": None,
        "metadata": OBJECT_META,
        "spec": POD_SPEC,
        "status": POD_STATUS,
    }
)
NODE_INFO: Final = _Struct(
    {
        k: None
        for k in (
            "machineID",
            "systemUUID",
            "bootID",
            "kernelVersion",
            "osImage",
            "containerRuntimeVersion",
            "kubeletVersion",
            "kubeProxyVersion",
            "operatingSystem",
            "architecture",
        )
    }
)
NODE_STATUS: Final = _Struct(
    {
        "capacity": STRING_MAP,
        "allocatable": STRING_MAP,
        "conditions": None,
        "addresses": None,
        "daemonEndpoints": _Struct({"kubeletEndpoint": _Struct({"Port": None})}),
        "nodeInfo": NODE_INFO,
    }
)
NODE_SPEC: Final = _Struct({"unschedulable": None, "taints": None, "podCIDR": None})
NODE: Final = _Struct(
    {
        "apiVersion": None,
        "kind": None,
        "metadata": OBJECT_META,
        "spec": NODE_SPEC,
        "status": NODE_STATUS,
    }
)
NODE_LIST: Final = _Struct(
    {"apiVersion": None, "kind": None, "metadata": None, "items": _List(NODE)}
)
VICTIMS: Final = _Struct({"Pods": _List(POD), "NumPDBViolations": None})
META_POD: Final = _Struct({"UID": None})
META_VICTIMS: Final = _Struct({"Pods": _List(META_POD), "NumPDBViolations": None})

EXTENDER_ARGS: Final = _Struct({"Pod": POD, "Nodes": NODE_LIST, "NodeNames": None})
FILTER_RESULT: Final = _Struct(
    {
        "Nodes": NODE_LIST,
        "NodeNames": None,
        "FailedNodes": None,
        "FailedAndUnresolvableNodes": None,
        "Error": None,
    }
)
HOST_PRIORITY: Final = _Struct({"Host": None, "Score": None})
HOST_PRIORITY_LIST: Final = _List(HOST_PRIORITY)
BINDING_ARGS: Final = _Struct({"PodName": None, "PodNamespace": None, "PodUID": None, "Node": None})
BINDING_RESULT: Final = _Struct({"Error": None})
PREEMPTION_ARGS: Final = _Struct(
    {"Pod": POD, "NodeNameToVictims": _Map(VICTIMS), "NodeNameToMetaVictims": _Map(META_VICTIMS)}
)
PREEMPTION_RESULT: Final = _Struct({"NodeNameToMetaVictims": _Map(META_VICTIMS)})

#: every extender type by its Go name (the golden tests name them so)
TYPES: Final = {
    "ExtenderArgs": EXTENDER_ARGS,
    "ExtenderFilterResult": FILTER_RESULT,
    "HostPriority": HOST_PRIORITY,
    "HostPriorityList": HOST_PRIORITY_LIST,
    "ExtenderBindingArgs": BINDING_ARGS,
    "ExtenderBindingResult": BINDING_RESULT,
    "ExtenderPreemptionArgs": PREEMPTION_ARGS,
    "ExtenderPreemptionResult": PREEMPTION_RESULT,
    "MetaVictims": META_VICTIMS,
    "Victims": VICTIMS,
}


def canonical(value: Any, schema: Any, depth: int = 0) -> Any:
    """`value` with the keys of every struct the schema knows in their canonical spelling."""
    if depth > MAX_DEPTH:
        raise WireError(f"the request nests deeper than {MAX_DEPTH} levels")
    if schema is None:
        return value
    if isinstance(schema, _Struct):
        if not isinstance(value, dict):
            return value  # the type check of the reader that needs it says what is wrong
        out: dict[str, Any] = {}
        fields: dict[str, Any] = schema.fields
        folded: dict[str, str] = schema.folded
        for key, item in value.items():
            text = str(key)
            name = text if text in fields else folded.get(text.lower(), text)
            sub = fields.get(name)
            out[name] = canonical(item, sub, depth + 1) if sub is not None else item
        return out
    if isinstance(schema, _List):
        if not isinstance(value, list) or schema.item is None:
            return value
        return [canonical(v, schema.item, depth + 1) for v in value]
    if isinstance(schema, _Map):
        if not isinstance(value, dict) or schema.value is None:
            return value
        return {k: canonical(v, schema.value, depth + 1) for k, v in value.items()}
    return value


def decode(body: bytes, schema: Any) -> Any:
    """The message in `body`, keys canonical; WireError when it is not JSON (or not UTF-8)."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise WireError(f"the request body is not JSON: {exc}") from None
    return canonical(data, schema)


def encode(value: Any) -> bytes:
    """JSON bytes as Go writes them (compact, in the order of the dict)."""
    return orjson.dumps(value)


# ---------------------------------------------------------------------- readers
# (the shared field readers of `corepin.kube.models.fields`, their errors in the extender's words)
def _object(value: object, what: str) -> Mapping[str, Any]:
    try:
        return object_at(value, what)
    except FieldError:
        raise WireError(f"{what} must be a JSON object, got {type(value).__name__}") from None


def _list(value: object, what: str, problem: str = "must be a list") -> list[Any]:
    try:
        return list_or_empty(value, what)
    except FieldError:
        raise WireError(f"{what} {problem}") from None


def _string(value: object, what: str, *, required: bool = True) -> str:
    try:
        return string(value, what, required=required)
    except FieldError:
        raise WireError(f"{what} must be a non-empty string") from None


def pod_of(args: Mapping[str, Any]) -> Mapping[str, Any]:
    """The `Pod` of ExtenderArgs or ExtenderPreemptionArgs (checked where corepin reads it)."""
    pod = _object(args.get("Pod"), "Pod")
    meta = _object(pod.get("metadata") or {}, "Pod.metadata")
    _string(meta.get("name"), "Pod.metadata.name")
    for key in ("namespace", "uid"):
        if meta.get(key) is not None:
            _string(meta[key], f"Pod.metadata.{key}")
    spec = pod.get("spec")
    if spec is not None:
        _list(_object(spec, "Pod.spec").get("containers"), "Pod.spec.containers")
    return pod


def node_names_of(args: dict[str, Any]) -> tuple[list[str], list[dict[str, Any]] | None]:
    """(names, node objects) of ExtenderArgs: from `NodeNames` (objects None) when given,
    else from `Nodes.items`."""
    names = args.get("NodeNames")
    if names is not None:
        if not isinstance(names, list) or not set(map(type, names)) <= {str}:
            raise WireError("NodeNames must be a list of node names")
        return names, None
    nodes = args.get("Nodes")
    if nodes is None:
        raise WireError("the request names no nodes: send NodeNames or Nodes")
    items = _list(_object(nodes, "Nodes").get("items") or [], "Nodes.items")
    out: list[str] = []
    for i, node in enumerate(items):
        meta = _object(_object(node, f"Nodes.items[{i}]").get("metadata"), f"Nodes.items[{i}]")
        out.append(_string(meta.get("name"), f"Nodes.items[{i}].metadata.name"))
    return out, items


def _name(value: Any, what: str) -> str:
    text = _string(value, what)
    if len(text) > 253 or not _NAME.match(text):
        raise WireError(f"{what} {text[:64]!r} is not a Kubernetes object name")
    return text


def binding_args(args: Any) -> tuple[str, str, str, str]:
    """(namespace, pod, uid, node) of ExtenderBindingArgs."""
    d = _object(args, "ExtenderBindingArgs")
    return (
        _name(d.get("PodNamespace"), "PodNamespace"),
        _name(d.get("PodName"), "PodName"),
        _string(d.get("PodUID"), "PodUID", required=False),
        _name(d.get("Node"), "Node"),
    )


def victims_of(args: dict[str, Any]) -> dict[str, tuple[list[str], int]]:
    """Node name -> (victim pod uids, PDB violations) of ExtenderPreemptionArgs."""
    out: dict[str, tuple[list[str], int]] = {}
    meta = args.get("NodeNameToMetaVictims")
    full = args.get("NodeNameToVictims")
    source, key = (meta, "UID") if meta is not None else (full, "")
    if source is None:
        return out
    for node, victims in _object(source, "NodeNameToVictims").items():
        v = _object(victims, f"victims of {node}")
        pods = _list(v.get("Pods") or [], f"victims of {node}:", "Pods must be a list")
        uids = []
        for p in pods:
            victim = _object(p, f"a victim of {node}")
            uid = victim.get(key) if key else ObjectView(victim).metadata.get("uid")
            uids.append(_string(uid, f"the uid of a victim of {node}"))
        count = v.get("NumPDBViolations") or 0
        if isinstance(count, bool) or not isinstance(count, int):
            raise WireError(f"victims of {node}: NumPDBViolations must be an integer")
        out[node] = (uids, count)
    return out


# ---------------------------------------------------------------------- writers
def filter_result(
    *,
    names: list[str] | None = None,
    nodes: list[dict[str, Any]] | None = None,
    failed: Mapping[str, str] | None = None,
    unresolvable: Mapping[str, str] | None = None,
    error: str = "",
) -> dict[str, Any]:
    """ExtenderFilterResult in Go field order; `nodes` (objects) answer a request with Nodes,
    `names` one with NodeNames."""
    return {
        "Nodes": None if nodes is None else {"metadata": {}, "items": nodes},
        "NodeNames": names,
        "FailedNodes": dict(failed or {}),
        "FailedAndUnresolvableNodes": dict(unresolvable or {}),
        "Error": error,
    }


def host_priorities(scores: list[tuple[str, int]]) -> list[dict[str, Any]]:
    return [{"Host": host, "Score": score} for host, score in scores]


def binding_result(error: str = "") -> dict[str, Any]:
    return {"Error": error}


def preemption_result(victims: Mapping[str, tuple[list[str], int]]) -> dict[str, Any]:
    return {
        "NodeNameToMetaVictims": {
            node: {"Pods": [{"UID": uid} for uid in uids], "NumPDBViolations": count}
            for node, (uids, count) in victims.items()
        }
    }


__all__ = [
    "TYPES",
    "WireError",
    "binding_args",
    "binding_result",
    "canonical",
    "decode",
    "encode",
    "filter_result",
    "host_priorities",
    "node_names_of",
    "pod_of",
    "preemption_result",
    "victims_of",
]
