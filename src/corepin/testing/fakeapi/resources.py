"""The kinds the fake serves: built-ins and the ones CRDs add, with what the server knows of each
(scope, names, subresources, field selector labels, table columns, list merge keys)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

Obj = dict[str, Any]
FieldFn = Callable[[Obj], dict[str, str]]


def _meta_fields(obj: Obj, namespaced: bool) -> dict[str, str]:
    meta = obj.get("metadata") or {}
    out = {"metadata.name": str(meta.get("name", ""))}
    if namespaced:
        out["metadata.namespace"] = str(meta.get("namespace", ""))
    return out


def _dig(obj: Mapping[str, Any], *path: str) -> Any:
    cur: Any = obj
    for part in path:
        if not isinstance(cur, Mapping):
            return None
        cur = cur.get(part)
    return cur


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def pod_fields(obj: Obj) -> dict[str, str]:
    out = _meta_fields(obj, True)
    for name, path in (
        ("spec.nodeName", ("spec", "nodeName")),
        ("spec.restartPolicy", ("spec", "restartPolicy")),
        ("spec.schedulerName", ("spec", "schedulerName")),
        ("spec.serviceAccountName", ("spec", "serviceAccountName")),
        ("status.phase", ("status", "phase")),
        ("status.podIP", ("status", "podIP")),
        ("status.nominatedNodeName", ("status", "nominatedNodeName")),
    ):
        out[name] = _text(_dig(obj, *path))
    out["spec.hostNetwork"] = _text(bool(_dig(obj, "spec", "hostNetwork")))
    return out


def node_fields(obj: Obj) -> dict[str, str]:
    out = _meta_fields(obj, False)
    out["spec.unschedulable"] = _text(bool(_dig(obj, "spec", "unschedulable")))
    return out


def namespace_fields(obj: Obj) -> dict[str, str]:
    out = _meta_fields(obj, False)
    out["status.phase"] = _text(_dig(obj, "status", "phase"))
    return out


def event_fields(obj: Obj) -> dict[str, str]:
    out = _meta_fields(obj, True)
    involved = obj.get("involvedObject") or {}
    for key in ("kind", "namespace", "name", "uid", "apiVersion", "resourceVersion", "fieldPath"):
        out[f"involvedObject.{key}"] = _text(involved.get(key))
    out["reason"] = _text(obj.get("reason"))
    out["reportingComponent"] = _text(obj.get("reportingComponent"))
    out["source"] = _text(_dig(obj, "source", "component"))
    out["type"] = _text(obj.get("type"))
    return out


# List merge keys of the built-in kinds (strategic merge patch and server-side apply):
# a path of field names ("*" = any list item) -> merge keys, ("set",) for a set of scalars.
BUILTIN_LIST_KEYS: dict[tuple[str, ...], tuple[str, ...]] = {
    ("metadata", "finalizers"): ("set",),
    ("metadata", "ownerReferences"): ("uid",),
    ("spec", "containers"): ("name",),
    ("spec", "initContainers"): ("name",),
    ("spec", "ephemeralContainers"): ("name",),
    ("spec", "volumes"): ("name",),
    ("spec", "imagePullSecrets"): ("name",),
    ("spec", "hostAliases"): ("ip",),
    ("spec", "readinessGates"): (),
    ("status", "conditions"): ("type",),
    ("status", "addresses"): ("type",),
    ("status", "podIPs"): ("ip",),
    ("spec", "finalizers"): ("set",),
}
for _c in ("containers", "initContainers", "ephemeralContainers"):
    BUILTIN_LIST_KEYS[("spec", _c, "*", "env")] = ("name",)
    BUILTIN_LIST_KEYS[("spec", _c, "*", "ports")] = ("containerPort", "protocol")
    BUILTIN_LIST_KEYS[("spec", _c, "*", "volumeMounts")] = ("mountPath",)
    BUILTIN_LIST_KEYS[("spec", _c, "*", "volumeDevices")] = ("devicePath",)


def builtin_list_keys(path: tuple[str, ...]) -> tuple[str, ...] | None:
    """Merge keys of the list at `path` of a built-in object; None when the list is atomic."""
    generic = tuple("*" if isinstance(p, int) or p.isdigit() else p for p in path)
    return BUILTIN_LIST_KEYS.get(generic)


def age(timestamp: str | None, now: dt.datetime | None = None) -> str:
    """The kubectl-style short age of an RFC 3339 timestamp ("5s", "3m", "2h", "4d")."""
    if not timestamp:
        return "<unknown>"
    when = dt.datetime.strptime(timestamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC)
    seconds = int(((now or dt.datetime.now(dt.UTC)) - when).total_seconds())
    seconds = max(seconds, 0)
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    if seconds < 172800:
        return f"{seconds // 3600}h"
    return f"{seconds // 86400}d"


@dataclass(frozen=True)
class Column:
    name: str
    type: str
    json_path: str = ""
    priority: int = 0
    description: str = ""
    cell: Callable[[Obj], Any] | None = None


def _pod_ready(obj: Obj) -> str:
    statuses = _dig(obj, "status", "containerStatuses") or []
    containers = _dig(obj, "spec", "containers") or []
    ready = sum(1 for s in statuses if s.get("ready"))
    return f"{ready}/{len(containers)}"


def _pod_status(obj: Obj) -> str:
    if _dig(obj, "metadata", "deletionTimestamp"):
        return "Terminating"
    for status in _dig(obj, "status", "containerStatuses") or []:
        waiting = _dig(status, "state", "waiting", "reason")
        if waiting:
            return str(waiting)
    return str(_dig(obj, "status", "reason") or _dig(obj, "status", "phase") or "Unknown")


def _pod_restarts(obj: Obj) -> int:
    return sum(
        int(s.get("restartCount", 0)) for s in _dig(obj, "status", "containerStatuses") or []
    )


def _node_status(obj: Obj) -> str:
    for cond in _dig(obj, "status", "conditions") or []:
        if cond.get("type") == "Ready":
            return "Ready" if cond.get("status") == "True" else "NotReady"
    return "Unknown"


def _age_column() -> Column:
    return Column(
        "Age",
        "string",
        description="CreationTimestamp",
        cell=lambda o: age(_dig(o, "metadata", "creationTimestamp")),
    )


POD_COLUMNS = (
    Column("Ready", "string", cell=_pod_ready),
    Column("Status", "string", cell=_pod_status),
    Column("Restarts", "string", cell=_pod_restarts),
    _age_column(),
    Column("IP", "string", priority=1, cell=lambda o: _dig(o, "status", "podIP") or "<none>"),
    Column("Node", "string", priority=1, cell=lambda o: _dig(o, "spec", "nodeName") or "<none>"),
)
NODE_COLUMNS = (
    Column("Status", "string", cell=_node_status),
    Column("Roles", "string", cell=lambda o: "<none>"),
    _age_column(),
    Column(
        "Version", "string", cell=lambda o: _dig(o, "status", "nodeInfo", "kubeletVersion") or ""
    ),
)
NAMESPACE_COLUMNS = (
    Column("Status", "string", cell=lambda o: _dig(o, "status", "phase") or ""),
    _age_column(),
)
LEASE_COLUMNS = (
    Column("Holder", "string", cell=lambda o: _dig(o, "spec", "holderIdentity") or ""),
    _age_column(),
)
CONFIGMAP_COLUMNS = (
    Column(
        "Data", "string", cell=lambda o: len(o.get("data") or {}) + len(o.get("binaryData") or {})
    ),
    _age_column(),
)
EVENT_COLUMNS = (
    Column("Last Seen", "string", cell=lambda o: age(o.get("lastTimestamp") or o.get("eventTime"))),
    Column("Type", "string", cell=lambda o: o.get("type") or ""),
    Column("Reason", "string", cell=lambda o: o.get("reason") or ""),
    Column(
        "Object",
        "string",
        cell=lambda o: "{}/{}".format(
            str(_dig(o, "involvedObject", "kind") or "").lower(),
            _dig(o, "involvedObject", "name") or "",
        ),
    ),
    Column("Message", "string", cell=lambda o: o.get("message") or o.get("note") or ""),
)


def _int_or_percent(value: Any) -> str:
    return "N/A" if value is None else str(value)


PDB_COLUMNS = (
    Column(
        "Min Available", "string", cell=lambda o: _int_or_percent(_dig(o, "spec", "minAvailable"))
    ),
    Column(
        "Max Unavailable",
        "string",
        cell=lambda o: _int_or_percent(_dig(o, "spec", "maxUnavailable")),
    ),
    Column(
        "Allowed Disruptions",
        "integer",
        cell=lambda o: int(_dig(o, "status", "disruptionsAllowed") or 0),
    ),
    _age_column(),
)
CRD_COLUMNS = (
    Column("Created At", "date", cell=lambda o: _dig(o, "metadata", "creationTimestamp") or ""),
)


@dataclass
class ResourceType:
    """One resource at one group/version as served."""

    group: str
    version: str
    plural: str
    singular: str
    kind: str
    namespaced: bool
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    subresources: frozenset[str] = frozenset()
    fields: FieldFn | None = None
    columns: tuple[Column, ...] = ()
    builtin: bool = True
    schema: Obj | None = None
    allow_create_on_update: bool = False
    track_generation: bool = False
    # the storage this resource shares (core/v1 and events.k8s.io/v1 Events share one)
    storage: tuple[str, str] = ("", "")
    verbs: tuple[str, ...] = (
        "create",
        "delete",
        "deletecollection",
        "get",
        "list",
        "patch",
        "update",
        "watch",
    )
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.storage == ("", ""):
            self.storage = (self.group, self.plural)

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def qualified(self) -> str:
        """The resource as errors name it: `pods`, `leases.coordination.k8s.io`."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    def field_values(self, obj: Obj) -> dict[str, str]:
        if self.fields is not None:
            return self.fields(obj)
        return _meta_fields(obj, self.namespaced)

    def supports_field(self, name: str) -> bool:
        return name in self.field_values({"metadata": {}})

    def list_keys(self, path: tuple[str, ...]) -> tuple[str, ...] | None:
        """Merge keys of the list at `path` (None = atomic; ("set",) = set of scalars)."""
        if self.schema is None:
            return builtin_list_keys(path)
        if path and path[0] == "metadata":
            return builtin_list_keys(path)
        node: Any = self.schema
        for part in path:
            if not isinstance(node, Mapping):
                return None
            if node.get("type") == "array" or "items" in node:
                node = node.get("items") or {}
                continue
            props = node.get("properties") or {}
            if part in props:
                node = props[part]
            elif isinstance(node.get("additionalProperties"), Mapping):
                node = node["additionalProperties"]
            else:
                return None
        if not isinstance(node, Mapping):
            return None
        list_type = node.get("x-kubernetes-list-type")
        if list_type == "map":
            return tuple(node.get("x-kubernetes-list-map-keys") or ())
        if list_type == "set":
            return ("set",)
        return None


def builtin_types() -> list[ResourceType]:
    """The built-in kinds the fake serves at start."""
    ns_only = frozenset({"status"})
    return [
        ResourceType(
            "",
            "v1",
            "namespaces",
            "namespace",
            "Namespace",
            False,
            ("ns",),
            subresources=frozenset({"status", "finalize"}),
            fields=namespace_fields,
            columns=NAMESPACE_COLUMNS,
        ),
        ResourceType(
            "",
            "v1",
            "nodes",
            "node",
            "Node",
            False,
            ("no",),
            subresources=ns_only,
            fields=node_fields,
            columns=NODE_COLUMNS,
        ),
        ResourceType(
            "",
            "v1",
            "pods",
            "pod",
            "Pod",
            True,
            ("po",),
            ("all",),
            subresources=frozenset({"status", "binding", "resize", "eviction"}),
            fields=pod_fields,
            columns=POD_COLUMNS,
        ),
        ResourceType(
            "",
            "v1",
            "configmaps",
            "configmap",
            "ConfigMap",
            True,
            ("cm",),
            columns=CONFIGMAP_COLUMNS,
        ),
        ResourceType(
            "",
            "v1",
            "events",
            "event",
            "Event",
            True,
            ("ev",),
            fields=event_fields,
            columns=EVENT_COLUMNS,
            allow_create_on_update=True,
            storage=("", "events"),
        ),
        ResourceType(
            "events.k8s.io",
            "v1",
            "events",
            "event",
            "Event",
            True,
            ("ev",),
            fields=event_fields,
            columns=EVENT_COLUMNS,
            allow_create_on_update=True,
            storage=("", "events"),
        ),
        ResourceType(
            "coordination.k8s.io", "v1", "leases", "lease", "Lease", True, columns=LEASE_COLUMNS
        ),
        ResourceType(
            "policy",
            "v1",
            "poddisruptionbudgets",
            "poddisruptionbudget",
            "PodDisruptionBudget",
            True,
            ("pdb",),
            subresources=ns_only,
            columns=PDB_COLUMNS,
            track_generation=True,
        ),
        ResourceType(
            "apiextensions.k8s.io",
            "v1",
            "customresourcedefinitions",
            "customresourcedefinition",
            "CustomResourceDefinition",
            False,
            ("crd", "crds"),
            ("api-extensions",),
            subresources=ns_only,
            columns=CRD_COLUMNS,
            track_generation=True,
        ),
    ]


# Event fields as events.k8s.io/v1 names them, for the two views of the one storage.
_EVENT_RENAMES = (
    ("involvedObject", "regarding"),
    ("message", "note"),
    ("source.component", "deprecatedSource.component"),
    ("source.host", "deprecatedSource.host"),
    ("firstTimestamp", "deprecatedFirstTimestamp"),
    ("lastTimestamp", "deprecatedLastTimestamp"),
    ("count", "deprecatedCount"),
    ("reportingComponent", "reportingController"),
)


def _move(src: Obj, dst: Obj, src_path: str, dst_path: str) -> None:
    sparts = src_path.split(".")
    cur: Any = src
    for part in sparts[:-1]:
        cur = cur.get(part) if isinstance(cur, dict) else None
    if not isinstance(cur, dict) or sparts[-1] not in cur:
        return
    value = cur.pop(sparts[-1])
    if not cur and len(sparts) > 1:
        src.pop(sparts[0], None)
    dparts = dst_path.split(".")
    target = dst
    for part in dparts[:-1]:
        target = target.setdefault(part, {})
    target[dparts[-1]] = value


def event_to_events_v1(obj: Obj) -> Obj:
    """core/v1 Event (the stored form) as events.k8s.io/v1 shows it."""
    out = {k: v for k, v in obj.items()}
    for old, new in _EVENT_RENAMES:
        _move(out, out, old, new)
    out.setdefault("eventTime", None)  # MicroTime zero value: the server writes null
    out["apiVersion"] = "events.k8s.io/v1"
    out["kind"] = "Event"
    return out


def event_from_events_v1(obj: Obj) -> Obj:
    """events.k8s.io/v1 Event as stored (core/v1 shape)."""
    out = {k: v for k, v in obj.items()}
    for old, new in _EVENT_RENAMES:
        _move(out, out, new, old)
    series = out.get("series")
    if isinstance(series, dict) and "count" in series:
        out["count"] = series["count"]
    out["apiVersion"] = "v1"
    out["kind"] = "Event"
    return out
