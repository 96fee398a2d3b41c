"""The state behind the fake API server: an etcd-like store with one global revision counter,
per-object version history (so lists can be served at an older revision for `continue` tokens
and `resourceVersionMatch=Exact`), a bounded change history for watches (older revisions get
410 Gone), and the API server's write semantics for each kind.

Every public method takes the lock; HTTP handler threads and tests may call them concurrently.
"""

from __future__ import annotations

import base64
import builtins
import copy
import datetime as dt
import json
import queue
import random
import re
import threading
import uuid
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from corepin.testing.fakeapi import apply as ssa
from corepin.testing.fakeapi import disruption
from corepin.testing.fakeapi import errors as err
from corepin.testing.fakeapi.patch import PatchError, json_patch, merge_patch, strategic_merge_patch
from corepin.testing.fakeapi.quantity import QuantityError, parse_quantity, qos_class
from corepin.testing.fakeapi.resources import (
    Column,
    ResourceType,
    builtin_types,
    event_from_events_v1,
    event_to_events_v1,
)
from corepin.testing.fakeapi.schema import (
    FieldError,
    apply_defaults,
    prune,
    structural_problems,
    validate,
)
from corepin.testing.fakeapi.selectors import FieldSelector, LabelSelector

Obj = dict[str, Any]
Storage = tuple[str, str]
Key = tuple[str, str]  # (namespace, name)

_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_GENERATE_CHARS = "bcdfghjklmnpqrstvwxz2456789"
INITIAL_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"


def now_text() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _meta(obj: Obj) -> Obj:
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        meta = {}
        obj["metadata"] = meta
    return meta


@dataclass
class Change:
    """One committed write, as a watch sees it."""

    rv: int
    storage: Storage
    namespace: str
    type: str  # ADDED, MODIFIED, DELETED
    obj: Obj
    old: Obj | None


@dataclass
class Watcher:
    """One open watch: changes are pushed into `queue` under the cluster lock."""

    storage: Storage
    namespace: str | None
    labels: LabelSelector
    fields: FieldSelector
    rt: ResourceType
    queue: queue.Queue[Change | None] = field(default_factory=queue.Queue)
    dropped: bool = False
    abrupt: bool = False
    closers: list[Any] = field(default_factory=list)

    def matches(self, obj: Obj | None) -> bool:
        if obj is None:
            return False
        return self.labels.matches(_meta(obj).get("labels")) and self.fields.matches(
            self.rt.field_values(obj)
        )

    def translate(self, change: Change) -> tuple[str, Obj] | None:
        """The event this watcher sees for a change, given its selectors (None: nothing)."""
        now = self.matches(change.obj)
        before = change.old is not None and self.matches(change.old)
        if change.type == "ADDED":
            return ("ADDED", change.obj) if now else None
        if change.type == "DELETED":
            return ("DELETED", change.obj) if now else None
        if now and before:
            return ("MODIFIED", change.obj)
        if now:
            return ("ADDED", change.obj)
        if before and change.old is not None:
            # as the watch cache does: the last state the watcher could see, at the new revision
            gone = copy.deepcopy(change.old)
            _meta(gone)["resourceVersion"] = str(change.rv)
            return ("DELETED", gone)
        return None


@dataclass(frozen=True)
class Snapshot:
    """The stored state at one revision (`Cluster.snapshot()`)."""

    rv: int
    compacted_rv: int
    objects: dict[Storage, dict[Key, Obj]]
    versions: dict[tuple[Storage, str, str], list[tuple[int, Obj | None]]]
    history: list[Change]


@dataclass
class WriteOptions:
    field_manager: str = ""
    field_validation: str = "Warn"  # Strict | Warn | Ignore
    dry_run: bool = False
    force: bool = False


@dataclass
class WriteResult:
    obj: Obj
    created: bool = False
    warnings: list[str] = field(default_factory=list)


class Cluster:
    """Objects, revisions and history of one fake API server."""

    def __init__(self, *, history_limit: int = 1000, graceful_pod_deletion: bool = False) -> None:
        self.lock = threading.RLock()
        self.rv = 100
        self.compacted_rv = self.rv
        self.history_limit = history_limit
        self.graceful_pod_deletion = graceful_pod_deletion
        self.objects: dict[Storage, dict[Key, Obj]] = {}
        self.versions: dict[tuple[Storage, str, str], list[tuple[int, Obj | None]]] = {}
        self.history: deque[Change] = deque()
        self.watchers: list[Watcher] = []
        self.types: dict[tuple[str, str], dict[str, ResourceType]] = {}
        self.group_order: list[str] = []
        self._syncing = False  # the disruption controller is writing PDB statuses
        for rt in builtin_types():
            self._register(rt)
        for name in INITIAL_NAMESPACES:
            self.create(
                self.resource("", "v1", "namespaces"),
                "",
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}},
                WriteOptions(field_manager="kube-apiserver"),
            )

    # ------------------------------------------------------------------ resource types
    def _register(self, rt: ResourceType) -> None:
        self.types.setdefault((rt.group, rt.version), {})[rt.plural] = rt
        if rt.group and rt.group not in self.group_order:
            self.group_order.append(rt.group)

    def resource(self, group: str, version: str, plural: str) -> ResourceType:
        with self.lock:
            found = self.types.get((group, version), {}).get(plural)
        if found is None:
            raise err.ApiFailure(
                404, "NotFound", "the server could not find the requested resource", {}
            )
        return found

    def find_resource(self, group: str, version: str, plural: str) -> ResourceType | None:
        with self.lock:
            return self.types.get((group, version), {}).get(plural)

    def group_versions(self) -> dict[str, list[str]]:
        """Served groups (in registration order) and their versions; "" is the core group."""
        with self.lock:
            out: dict[str, list[str]] = {}
            for group, version in self.types:
                if self.types[(group, version)]:
                    out.setdefault(group, []).append(version)
            return out

    def resources_of(self, group: str, version: str) -> list[ResourceType]:
        with self.lock:
            return list(self.types.get((group, version), {}).values())

    # ------------------------------------------------------------------ views
    def view(self, rt: ResourceType, stored: Obj) -> Obj:
        obj = copy.deepcopy(stored)
        if rt.group == "events.k8s.io":
            return event_to_events_v1(obj)
        obj["apiVersion"] = rt.api_version
        obj["kind"] = rt.kind
        return obj

    def _to_storage(self, rt: ResourceType, obj: Obj) -> Obj:
        if rt.group == "events.k8s.io":
            return event_from_events_v1(obj)
        return obj

    def _store_of(self, rt: ResourceType) -> dict[Key, Obj]:
        return self.objects.setdefault(rt.storage, {})

    # ------------------------------------------------------------------ commit and history
    def commit(
        self, rt: ResourceType, namespace: str, name: str, kind: str, obj: Obj, old: Obj | None
    ) -> Obj:
        self.rv += 1
        stored = copy.deepcopy(obj)
        _meta(stored)["resourceVersion"] = str(self.rv)
        store = self._store_of(rt)
        if kind == "DELETED":
            store.pop((namespace, name), None)
            self.versions.setdefault((rt.storage, namespace, name), []).append((self.rv, None))
        else:
            store[(namespace, name)] = stored
            self.versions.setdefault((rt.storage, namespace, name), []).append((self.rv, stored))
        change = Change(self.rv, rt.storage, namespace, kind, stored, old)
        self.history.append(change)
        while len(self.history) > self.history_limit:
            dropped = self.history.popleft()
            self.compacted_rv = dropped.rv
        for watcher in self.watchers:
            if watcher.storage == rt.storage and watcher.namespace in (None, namespace):
                watcher.queue.put(change)
        if rt.storage in (disruption.PODS, disruption.PDBS) and not self._syncing:
            self._syncing = True
            try:
                disruption.sync_namespace(self, namespace)
            finally:
                self._syncing = False
        return stored

    def snapshot(self) -> Snapshot:
        with self.lock:
            return Snapshot(
                self.rv,
                self.compacted_rv,
                copy.deepcopy(self.objects),
                copy.deepcopy(self.versions),
                copy.deepcopy(list(self.history)),
            )

    def restore(self, snapshot: Snapshot) -> int:
        """Back to `snapshot` (an etcd restore): objects, history and revision; open watches
        are cut (the API server restarts). Resource types served now stay served."""
        with self.lock:
            self.rv = snapshot.rv
            self.compacted_rv = snapshot.compacted_rv
            self.objects = copy.deepcopy(snapshot.objects)
            self.versions = copy.deepcopy(snapshot.versions)
            self.history = deque(copy.deepcopy(snapshot.history))
            self.drop_watches(abrupt=True)
            return self.rv

    def compact(self, rv: int | None = None) -> int:
        """Forget history up to `rv` (default: now): watches and continue tokens from older
        revisions get 410 Gone. Returns the compacted revision."""
        with self.lock:
            target = self.rv if rv is None else min(rv, self.rv)
            self.compacted_rv = max(self.compacted_rv, target)
            while self.history and self.history[0].rv <= self.compacted_rv:
                self.history.popleft()
            for key, versions in list(self.versions.items()):
                keep = [v for v in versions if v[0] > self.compacted_rv]
                older = [v for v in versions if v[0] <= self.compacted_rv]
                if older and older[-1][1] is not None:
                    keep.insert(0, older[-1])
                if keep:
                    self.versions[key] = keep
                else:
                    del self.versions[key]
            return self.compacted_rv

    # ------------------------------------------------------------------ reads
    def get(self, rt: ResourceType, namespace: str, name: str) -> Obj:
        with self.lock:
            found = self._store_of(rt).get((namespace if rt.namespaced else "", name))
            if found is None:
                raise err.not_found(rt, name)
            return self.view(rt, found)

    def _state_at(self, rt: ResourceType, rv: int) -> dict[Key, Obj]:
        if rv < self.compacted_rv:
            raise err.gone(f"too old resource version: {rv} ({self.compacted_rv})")
        out: dict[Key, Obj] = {}
        for (storage, ns, name), versions in self.versions.items():
            if storage != rt.storage:
                continue
            latest: Obj | None = None
            for vrv, obj in versions:
                if vrv > rv:
                    break
                latest = obj
            if latest is not None:
                out[(ns, name)] = latest
        return out

    def list(
        self,
        rt: ResourceType,
        namespace: str | None,
        labels: LabelSelector,
        fields: FieldSelector,
        *,
        limit: int = 0,
        continue_token: str = "",
        resource_version: str = "",
        rv_match: str = "",
        typed_items: bool = True,
    ) -> Obj:
        """A list answer; `typed_items` drops kind/apiVersion from built-in items as the
        server's typed lists do (custom resource items keep them)."""
        with self.lock:
            start = ""
            if continue_token:
                if resource_version:
                    raise err.bad_request(
                        "specifying resource version is not allowed when using continue"
                    )
                try:
                    token = json.loads(base64.urlsafe_b64decode(continue_token.encode()))
                    at_rv = int(token["rv"])
                    start = str(token["start"])
                except (ValueError, KeyError, TypeError):
                    raise err.bad_request("continue key is not valid: invalid token") from None
                if at_rv < self.compacted_rv:
                    raise err.gone(
                        "The provided continue parameter is too old to display a "
                        "consistent list result. You can start a new list without "
                        "the continue parameter, or use the continue token in this "
                        "response to retrieve the remainder of the results. "
                        "Continuing with the provided token results in an "
                        "inconsistent list - objects that were created, modified, "
                        "or deleted between the time the first chunk was returned "
                        "and now may show up in the list."
                    )
                state = self._state_at(rt, at_rv)
            else:
                at_rv = self.rv
                exact = rv_match == "Exact" or (
                    resource_version not in ("", "0") and limit > 0 and rv_match == ""
                )
                if resource_version not in ("", "0"):
                    try:
                        wanted = int(resource_version)
                    except ValueError:
                        raise err.bad_request(
                            f"invalid resource version: {resource_version}"
                        ) from None
                    if wanted > self.rv:
                        raise err.ApiFailure(
                            504,
                            "Timeout",
                            f"Too large resource version: {wanted}, current: {self.rv}",
                            {
                                "causes": [
                                    {
                                        "reason": "ResourceVersionTooLarge",
                                        "message": "Too large resource version",
                                    }
                                ],
                                "retryAfterSeconds": 1,
                            },
                        )
                    if exact:
                        at_rv = wanted
                state = self._state_at(rt, at_rv) if at_rv != self.rv else dict(self._store_of(rt))
            keys = sorted(k for k in state if namespace in (None, k[0]))
            keys = [k for k in keys if "/".join(k) > start] if start else keys
            items: list[Obj] = []
            next_start = ""
            for i, key in enumerate(keys):
                obj = state[key]
                if not (
                    labels.matches(_meta(obj).get("labels"))
                    and fields.matches(rt.field_values(obj))
                ):
                    continue
                items.append(obj)
                if limit and len(items) >= limit:
                    if i + 1 < len(keys):
                        next_start = "/".join(key)
                    remaining = len(keys) - i - 1
                    break
            else:
                remaining = 0
            meta: Obj = {"resourceVersion": str(at_rv)}
            if next_start:
                meta["continue"] = base64.urlsafe_b64encode(
                    json.dumps({"v": "meta.k8s.io/v1", "rv": at_rv, "start": next_start}).encode()
                ).decode()
                if not labels.requirements and not fields.requirements:
                    meta["remainingItemCount"] = remaining
            views = [self.view(rt, o) for o in items]
            if rt.builtin and typed_items:
                for view in views:
                    view.pop("apiVersion", None)
                    view.pop("kind", None)
            return {
                "kind": rt.kind + "List",
                "apiVersion": rt.api_version,
                "metadata": meta,
                "items": views,
            }

    # ------------------------------------------------------------------ watch
    def open_watch(
        self,
        rt: ResourceType,
        namespace: str | None,
        labels: LabelSelector,
        fields: FieldSelector,
        resource_version: str,
        *,
        send_initial: bool = False,
    ) -> tuple[Watcher, builtins.list[tuple[str, Obj]], int]:
        """Register a watcher. Returns it, the events to send first, and the revision the
        initial state was taken at. A too-old revision raises 410 (sent as an ERROR event)."""
        with self.lock:
            watcher = Watcher(rt.storage, namespace, labels, fields, rt)
            initial: list[tuple[str, Obj]] = []
            if resource_version in ("", "0") or send_initial:
                for key in sorted(self._store_of(rt)):
                    obj = self._store_of(rt)[key]
                    if namespace in (None, key[0]) and watcher.matches(obj):
                        initial.append(("ADDED", obj))
                start = self.rv
                if send_initial and resource_version not in ("", "0"):
                    start = max(start, int(resource_version))
            else:
                try:
                    start = int(resource_version)
                except ValueError:
                    raise err.bad_request(f"invalid resource version: {resource_version}") from None
                if start < self.compacted_rv:
                    raise err.gone(f"too old resource version: {start} ({self.compacted_rv})")
                for change in self.history:
                    if (
                        change.rv > start
                        and change.storage == rt.storage
                        and namespace in (None, change.namespace)
                    ):
                        watcher.queue.put(change)
            self.watchers.append(watcher)
            return watcher, initial, start

    def close_watch(self, watcher: Watcher) -> None:
        with self.lock:
            if watcher in self.watchers:
                self.watchers.remove(watcher)

    def drop_watches(self, *, abrupt: bool = True, storage: Storage | None = None) -> int:
        """End every open watch (abrupt: the connection is cut without the final chunk)."""
        with self.lock:
            targets = [w for w in self.watchers if storage in (None, w.storage)]
            for watcher in targets:
                watcher.dropped = True
                watcher.abrupt = abrupt
                watcher.queue.put(None)
                for closer in watcher.closers:
                    closer()
            return len(targets)

    def bookmark_rv(self, watcher: Watcher) -> int | None:
        """The revision a bookmark may report now: the current one, once the watcher has been
        handed every change up to it (None while changes are still queued)."""
        with self.lock:
            return self.rv if watcher.queue.empty() else None

    # ------------------------------------------------------------------ writes: create
    def create(
        self,
        rt: ResourceType,
        namespace: str,
        body: Obj,
        options: WriteOptions | None = None,
        *,
        prechecked: bool = False,
    ) -> WriteResult:
        opts = options or WriteOptions()
        with self.lock:
            obj = self._to_storage(rt, copy.deepcopy(body))
            self._check_type(rt, obj)
            meta = _meta(obj)
            ns = self._scope_namespace(rt, namespace, meta)
            if meta.get("resourceVersion"):
                raise err.internal("resourceVersion should not be set on objects to be created")
            if not meta.get("name") and meta.get("generateName"):
                meta["name"] = meta["generateName"] + "".join(
                    random.choice(_GENERATE_CHARS) for _ in range(5)
                )
            name = str(meta.get("name") or "")
            if not name:
                raise err.invalid(
                    rt,
                    "",
                    [
                        FieldError(
                            "metadata.name",
                            "FieldValueRequired",
                            "Required value: name or generateName is required",
                        )
                    ],
                )
            self._check_name(rt, name)
            if (ns, name) in self._store_of(rt):
                raise err.already_exists(rt, name)
            for key in ("uid", "deletionTimestamp", "deletionGracePeriodSeconds", "selfLink"):
                meta.pop(key, None)
            meta["uid"] = str(uuid.uuid4())
            meta["creationTimestamp"] = now_text()
            if rt.track_generation:
                meta["generation"] = 1
            else:
                meta.pop("generation", None)
            warnings = self._prepare_create(rt, obj, opts)
            self._validate(rt, name, obj, None)
            if opts.field_manager:
                entries = ssa.track_update(
                    None, self._strip(obj), [], opts.field_manager, rt.api_version, "", rt.list_keys
                )
                meta["managedFields"] = [e.to_json() for e in entries]
            elif not prechecked:
                meta.pop("managedFields", None)
            if opts.dry_run:
                return WriteResult(self.view(rt, obj), True, warnings)
            stored = self.commit(rt, ns, name, "ADDED", obj, None)
            if rt.group == "apiextensions.k8s.io":
                self._serve_crd(stored)
                stored = self._store_of(rt)[(ns, name)]
            return WriteResult(self.view(rt, stored), True, warnings)

    def _check_type(self, rt: ResourceType, obj: Obj) -> None:
        api_version = obj.setdefault(
            "apiVersion", rt.api_version if rt.group != "events.k8s.io" else "v1"
        )
        kind = obj.setdefault("kind", rt.kind)
        expected = "v1" if rt.group == "events.k8s.io" else rt.api_version
        if kind != rt.kind:
            raise err.bad_request(
                f"the server could not find the requested resource: kind "
                f"{kind} does not match {rt.kind}"
            )
        if api_version != expected:
            raise err.bad_request(
                f"the API version in the data ({api_version}) does not match "
                f"the expected API version ({rt.api_version})"
            )

    def _scope_namespace(self, rt: ResourceType, namespace: str, meta: Obj) -> str:
        if not rt.namespaced:
            meta.pop("namespace", None)
            return ""
        given = meta.get("namespace")
        if given and given != namespace:
            raise err.bad_request(
                "the namespace of the provided object does not match the "
                "namespace sent on the request"
            )
        meta["namespace"] = namespace
        if ("", namespace) not in self.objects.get(("", "namespaces"), {}):
            raise err.ApiFailure(
                404,
                "NotFound",
                f'namespaces "{namespace}" not found',
                {"name": namespace, "kind": "namespaces"},
            )
        return namespace

    def _check_name(self, rt: ResourceType, name: str) -> None:
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

    def _prepare_create(self, rt: ResourceType, obj: Obj, opts: WriteOptions) -> builtins.list[str]:
        warnings: list[str] = []
        if rt.builtin:
            if rt.plural == "pods":
                _default_pod(obj)
                obj["status"] = {"phase": "Pending", "qosClass": _qos_class(obj)}
            elif rt.plural == "namespaces":
                obj.setdefault("spec", {})["finalizers"] = ["kubernetes"]
                obj["status"] = {"phase": "Active"}
            elif rt.plural in ("customresourcedefinitions", "poddisruptionbudgets"):
                obj.pop("status", None)
            return warnings
        if "status" in rt.subresources:
            obj.pop("status", None)
        return self._schema(rt, obj, opts)

    def _schema(self, rt: ResourceType, obj: Obj, opts: WriteOptions) -> builtins.list[str]:
        if rt.schema is None:
            return []
        dropped: list[str] = []
        prune(obj, rt.schema, "", dropped, root=True)
        apply_defaults(obj, rt.schema)
        if dropped and opts.field_validation == "Strict":
            fields = ", ".join(f'unknown field "{d}"' for d in dropped)
            raise err.bad_request(
                f'{rt.kind} in version "{rt.version}" cannot be handled as a '
                f"{rt.kind}: strict decoding error: {fields}"
            )
        if opts.field_validation == "Ignore":
            return []
        return [f'unknown field "{d}"' for d in dropped]

    def _validate(
        self, rt: ResourceType, name: str, obj: Obj, old: Obj | None, subresource: str = ""
    ) -> None:
        problems: list[FieldError] = []
        if rt.schema is not None:
            problems = validate(obj, rt.schema)
        elif rt.plural == "pods":
            problems = _pod_problems(obj, old, resize=subresource == "resize")
        elif rt.plural == "customresourcedefinitions":
            problems = _crd_problems(obj)
        elif rt.storage == disruption.PDBS:
            problems = disruption.pdb_problems(obj)
        meta = _meta(obj)
        for key in ("labels", "annotations"):
            value = meta.get(key)
            if value is not None and (
                not isinstance(value, dict) or any(not isinstance(v, str) for v in value.values())
            ):
                problems.append(
                    FieldError(
                        f"metadata.{key}",
                        "FieldValueTypeInvalid",
                        "Invalid value: must be a map of strings",
                    )
                )
        if problems:
            raise err.invalid(rt, name, problems)

    # ------------------------------------------------------------------ writes: update
    def replace(
        self,
        rt: ResourceType,
        namespace: str,
        name: str,
        body: Obj,
        options: WriteOptions | None = None,
        subresource: str = "",
    ) -> WriteResult:
        opts = options or WriteOptions()
        with self.lock:
            ns = namespace if rt.namespaced else ""
            current = self._store_of(rt).get((ns, name))
            new = self._to_storage(rt, copy.deepcopy(body))
            meta = _meta(new)
            if meta.get("name") not in (None, name):
                raise err.bad_request(
                    f"the name of the object ({meta.get('name')}) does not "
                    f"match the name on the URL ({name})"
                )
            if current is None:
                if rt.allow_create_on_update and not subresource:
                    meta["name"] = name
                    meta.pop("resourceVersion", None)
                    return self.create(rt, namespace, new, opts)
                raise err.not_found(rt, name)
            self._check_type(rt, new)
            if rt.namespaced and meta.get("namespace") not in (None, "", ns):
                raise err.bad_request(
                    "the namespace of the provided object does not match the "
                    "namespace sent on the request"
                )
            given_rv = meta.get("resourceVersion")
            if given_rv and given_rv != _meta(current)["resourceVersion"]:
                raise err.conflict(rt, name)
            entries = ssa.entries_from(current)
            if opts.field_manager:
                entries = ssa.track_update(
                    self._strip(current),
                    self._strip(new),
                    entries,
                    opts.field_manager,
                    rt.api_version,
                    subresource,
                    rt.list_keys,
                )
            return self._update(rt, ns, name, current, new, opts, subresource, entries)

    def _strip(self, obj: Obj) -> Obj:
        out = {k: v for k, v in obj.items()}
        out["metadata"] = {k: v for k, v in _meta(obj).items() if k != "managedFields"}
        return out

    def _update(
        self,
        rt: ResourceType,
        ns: str,
        name: str,
        current: Obj,
        new: Obj,
        opts: WriteOptions,
        subresource: str,
        entries: builtins.list[ssa.ManagerEntry],
    ) -> WriteResult:
        new = self._merge_scope(rt, current, new, subresource)
        meta = _meta(new)
        old_meta = _meta(current)
        for key in (
            "uid",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "namespace",
            "name",
        ):
            if key in old_meta:
                meta[key] = old_meta[key]
            else:
                meta.pop(key, None)
        meta["resourceVersion"] = old_meta["resourceVersion"]
        if old_meta.get("deletionTimestamp"):
            added = set(meta.get("finalizers") or []) - set(old_meta.get("finalizers") or [])
            if added:
                raise err.invalid(
                    rt,
                    name,
                    [
                        FieldError(
                            "metadata.finalizers",
                            "FieldValueForbidden",
                            "Forbidden: no new finalizers can be added if the object is being "
                            f"deleted, found new finalizers {json.dumps(sorted(added))}",
                        )
                    ],
                )
        warnings: list[str] = []
        if not rt.builtin and not subresource:
            warnings = self._schema(rt, new, opts)
        elif not rt.builtin and rt.schema is not None:
            apply_defaults(new, rt.schema)
            dropped: list[str] = []
            prune(new, rt.schema, "", dropped, root=True)
        self._validate(rt, name, new, current, subresource)
        if rt.track_generation:
            generation = int(old_meta.get("generation") or 1)
            ignore = {"metadata", "status"} if "status" in rt.subresources else {"metadata"}
            before = {k: v for k, v in current.items() if k not in ignore}
            after = {k: v for k, v in new.items() if k not in ignore}
            meta["generation"] = generation + 1 if before != after else generation
        meta["managedFields"] = [e.to_json() for e in entries]
        if not meta["managedFields"]:
            meta.pop("managedFields")
        if self._same(current, new):
            return WriteResult(self.view(rt, current), False, warnings)
        if opts.dry_run:
            return WriteResult(self.view(rt, new), False, warnings)
        stored = self.commit(rt, ns, name, "MODIFIED", new, current)
        if (
            meta.get("deletionTimestamp")
            and not meta.get("finalizers")
            and not self._pod_waits_for_kubelet(rt, stored)
        ):
            self._remove(rt, ns, name)
        if rt.group == "apiextensions.k8s.io" and name in {n for (_, n) in self._store_of(rt)}:
            self._serve_crd(self._store_of(rt)[(ns, name)])
            stored = self._store_of(rt)[(ns, name)]
        return WriteResult(self.view(rt, stored), False, warnings)

    def _same(self, a: Obj, b: Obj) -> bool:
        def canon(obj: Obj) -> Obj:
            out = copy.deepcopy(obj)
            meta = _meta(out)
            meta.pop("resourceVersion", None)
            for entry in meta.get("managedFields") or []:
                entry.pop("time", None)
            out.pop("apiVersion", None)
            out.pop("kind", None)
            return out

        return canon(a) == canon(b)

    def _merge_scope(self, rt: ResourceType, current: Obj, new: Obj, subresource: str) -> Obj:
        """What a write through the main endpoint or /status may change."""
        if subresource == "status":
            out = copy.deepcopy(current)
            if "status" in new:
                out["status"] = new["status"]
            else:
                out.pop("status", None)
            if rt.plural == "pods":
                new_meta, out_meta = _meta(new), _meta(out)
                for key in ("labels", "annotations"):
                    if key in new_meta:
                        out_meta[key] = new_meta[key]
            out["metadata"]["managedFields"] = _meta(new).get("managedFields")
            return out
        if subresource == "resize" and rt.plural == "pods" and rt.builtin:
            # only the spec comes from the request (validation then allows nothing but the
            # containers' resources and resize policies to differ); the API server's defaulting
            # runs on it again
            out = copy.deepcopy(current)
            out["spec"] = copy.deepcopy(new.get("spec") or {})
            out["metadata"]["managedFields"] = _meta(new).get("managedFields")
            _default_pod(out)
            return out
        if "status" in rt.subresources:
            if "status" in current:
                new["status"] = copy.deepcopy(current["status"])
            else:
                new.pop("status", None)
        return new

    # ------------------------------------------------------------------ writes: patch
    def patch(
        self,
        rt: ResourceType,
        namespace: str,
        name: str,
        patch_type: str,
        body: Any,
        options: WriteOptions | None = None,
        subresource: str = "",
    ) -> WriteResult:
        opts = options or WriteOptions()
        with self.lock:
            ns = namespace if rt.namespaced else ""
            current = self._store_of(rt).get((ns, name))
            if patch_type == APPLY_PATCH:
                return self._apply(rt, namespace, name, body, opts, subresource, current)
            if patch_type == STRATEGIC_PATCH and not rt.builtin:
                raise err.unsupported_media([JSON_PATCH, MERGE_PATCH, APPLY_PATCH])
            if patch_type not in (MERGE_PATCH, JSON_PATCH, STRATEGIC_PATCH):
                raise err.unsupported_media([JSON_PATCH, MERGE_PATCH, STRATEGIC_PATCH, APPLY_PATCH])
            if current is None:
                raise err.not_found(rt, name)
            view = self.view(rt, current)
            try:
                if patch_type == MERGE_PATCH:
                    if not isinstance(body, dict):
                        raise PatchError("json: cannot unmarshal into object", 400)
                    patched = merge_patch(view, body)
                elif patch_type == JSON_PATCH:
                    patched = json_patch(view, body)
                else:
                    if not isinstance(body, dict):
                        raise PatchError("json: cannot unmarshal into object", 400)
                    patched = strategic_merge_patch(view, body, rt.list_keys)
            except PatchError as exc:
                if exc.code == 400:
                    raise err.bad_request(str(exc)) from None
                raise err.ApiFailure(422, "Invalid", str(exc)) from None
            if not isinstance(patched, dict):
                raise err.bad_request("the patch did not produce an object")
            patched_meta = _meta(patched)
            patched_rv = patched_meta.get("resourceVersion")
            if patched_rv and patched_rv != _meta(view).get("resourceVersion"):
                raise err.conflict(rt, name)
            if patched_meta.get("uid") not in (None, _meta(view).get("uid")):
                raise err.conflict(
                    rt,
                    name,
                    "Precondition failed: UID in precondition: "
                    f"{patched_meta.get('uid')}, UID in object meta: "
                    f"{_meta(view).get('uid')}",
                )
            new = self._to_storage(rt, patched)
            entries = ssa.entries_from(current)
            if opts.field_manager:
                entries = ssa.track_update(
                    self._strip(current),
                    self._strip(new),
                    entries,
                    opts.field_manager,
                    rt.api_version,
                    subresource,
                    rt.list_keys,
                )
            return self._update(rt, ns, name, current, new, opts, subresource, entries)

    def _apply(
        self,
        rt: ResourceType,
        namespace: str,
        name: str,
        body: Any,
        opts: WriteOptions,
        subresource: str,
        current: Obj | None,
    ) -> WriteResult:
        if not opts.field_manager:
            raise err.ApiFailure(
                422,
                "Invalid",
                'PatchOptions.meta.k8s.io "" is invalid: '
                "fieldManager: Required value: is required for apply patch",
            )
        if not isinstance(body, dict):
            raise err.bad_request(
                "error decoding YAML: the applied configuration must be an object"
            )
        if body.get("apiVersion") != rt.api_version or body.get("kind") != rt.kind:
            raise err.bad_request(
                f"the API version and kind in the applied configuration "
                f"({body.get('apiVersion')}, {body.get('kind')}) must be "
                f"{rt.api_version}, {rt.kind}"
            )
        if _meta(body).get("name") not in (None, name):
            raise err.bad_request(
                f"the name of the object ({_meta(body).get('name')}) does not "
                f"match the name on the URL ({name})"
            )
        applied = self._to_storage(rt, copy.deepcopy(body))
        _meta(applied)["name"] = name
        if current is None:
            if subresource:
                raise err.not_found(rt, name)
            merged, entries = ssa.server_side_apply(
                None, applied, [], opts.field_manager, rt.api_version, "", opts.force, rt.list_keys
            )
            _meta(merged)["managedFields"] = [e.to_json() for e in entries]
            create_opts = WriteOptions("", opts.field_validation, opts.dry_run)
            result = self.create(rt, namespace, merged, create_opts, prechecked=True)
            return result
        try:
            merged, entries = ssa.server_side_apply(
                self._strip(current),
                applied,
                ssa.entries_from(current),
                opts.field_manager,
                rt.api_version,
                subresource,
                opts.force,
                rt.list_keys,
            )
        except ssa.ApplyConflicts as exc:
            causes = [
                {
                    "reason": "FieldManagerConflict",
                    "message": f'conflict with "{c.manager}" using {exc.api_version}',
                    "field": c.path,
                }
                for c in exc.conflicts
            ]
            raise err.ApiFailure(
                409, "Conflict", str(exc), {"name": name, "kind": rt.plural, "causes": causes}
            ) from None
        given_rv = _meta(applied).get("resourceVersion")
        if given_rv and given_rv != _meta(current)["resourceVersion"]:
            raise err.conflict(rt, name)
        ns = namespace if rt.namespaced else ""
        return self._update(rt, ns, name, current, merged, opts, subresource, entries)

    # ------------------------------------------------------------------ writes: delete
    def delete(
        self,
        rt: ResourceType,
        namespace: str,
        name: str,
        options: Obj | None = None,
        dry_run: bool = False,
    ) -> tuple[Obj, bool]:
        """Delete (or start deleting) one object; returns its last state and whether it is
        gone now."""
        opts = options or {}
        with self.lock:
            ns = namespace if rt.namespaced else ""
            current = self._store_of(rt).get((ns, name))
            if current is None:
                raise err.not_found(rt, name)
            meta = _meta(current)
            pre = opts.get("preconditions") or {}
            if pre.get("uid") and pre["uid"] != meta.get("uid"):
                raise err.conflict(
                    rt,
                    name,
                    f"Precondition failed: UID in precondition: "
                    f"{pre['uid']}, UID in object meta: {meta.get('uid')}",
                )
            if pre.get("resourceVersion") and pre["resourceVersion"] != meta["resourceVersion"]:
                raise err.conflict(
                    rt,
                    name,
                    "Precondition failed: ResourceVersion in "
                    f"precondition: {pre['resourceVersion']}, ResourceVersion in "
                    f"object meta: {meta['resourceVersion']}",
                )
            if dry_run:
                return self.view(rt, current), False
            grace = opts.get("gracePeriodSeconds")
            if rt.plural == "pods" and rt.builtin and self._graceful(current, grace):
                seconds = int(
                    grace
                    if grace is not None
                    else (current.get("spec") or {}).get("terminationGracePeriodSeconds", 30)
                )
                new = copy.deepcopy(current)
                new_meta = _meta(new)
                if (
                    new_meta.get("deletionGracePeriodSeconds") is not None
                    and seconds >= new_meta["deletionGracePeriodSeconds"]
                ):
                    return self.view(rt, current), False
                when = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=seconds)
                new_meta["deletionTimestamp"] = when.strftime("%Y-%m-%dT%H:%M:%SZ")
                new_meta["deletionGracePeriodSeconds"] = seconds
                stored = self.commit(rt, ns, name, "MODIFIED", new, current)
                return self.view(rt, stored), False
            if meta.get("finalizers") or (
                rt.plural == "namespaces" and rt.builtin and self._namespace_has_content(name)
            ):
                if meta.get("deletionTimestamp"):
                    return self.view(rt, current), False
                new = copy.deepcopy(current)
                _meta(new)["deletionTimestamp"] = now_text()
                _meta(new)["deletionGracePeriodSeconds"] = 0
                if rt.plural == "namespaces" and rt.builtin:
                    new.setdefault("status", {})["phase"] = "Terminating"
                stored = self.commit(rt, ns, name, "MODIFIED", new, current)
                if rt.plural == "namespaces" and rt.builtin:
                    self._empty_namespace(name)
                    if not _meta(stored).get("finalizers"):
                        return self.view(rt, self._remove(rt, ns, name)), True
                return self.view(rt, stored), False
            policy = opts.get("propagationPolicy") or "Background"
            if policy == "Orphan":
                self._orphan(meta.get("uid", ""))
            last = self._remove(rt, ns, name, dependents=policy != "Orphan")
            return self.view(rt, last), True

    def _graceful(self, pod: Obj, grace: Any) -> bool:
        if not self.graceful_pod_deletion or grace == 0:
            return False
        return bool((pod.get("spec") or {}).get("nodeName"))

    def _pod_waits_for_kubelet(self, rt: ResourceType, obj: Obj) -> bool:
        return (
            rt.plural == "pods"
            and rt.builtin
            and self._graceful(obj, None)
            and _meta(obj).get("deletionGracePeriodSeconds", 0) != 0
        )

    def _remove(self, rt: ResourceType, ns: str, name: str, *, dependents: bool = True) -> Obj:
        current = self._store_of(rt)[(ns, name)]
        last = self.commit(rt, ns, name, "DELETED", current, current)
        if rt.group == "apiextensions.k8s.io":
            self._unserve_crd(last)
        if dependents:
            self._collect_garbage(_meta(last).get("uid", ""))
        return last

    def _namespace_has_content(self, namespace: str) -> bool:
        return any(
            k[0] == namespace
            for s, objs in self.objects.items()
            if s != ("", "namespaces")
            for k in objs
        )

    def _empty_namespace(self, namespace: str) -> None:
        for storage, objs in list(self.objects.items()):
            rt = self._any_type(storage)
            if rt is None or not rt.namespaced:
                continue
            for key in [k for k in objs if k[0] == namespace]:
                if key in objs:
                    self._remove(rt, key[0], key[1])
        ns_rt = self.resource("", "v1", "namespaces")
        current = self._store_of(ns_rt).get(("", namespace))
        if current is not None:
            new = copy.deepcopy(current)
            new.setdefault("spec", {})["finalizers"] = []
            self.commit(ns_rt, "", namespace, "MODIFIED", new, current)

    def _any_type(self, storage: Storage) -> ResourceType | None:
        for types in self.types.values():
            for rt in types.values():
                if rt.storage == storage and rt.group != "events.k8s.io":
                    return rt
        return None

    def _dependents(self, uid: str) -> Iterable[tuple[ResourceType, Key, Obj]]:
        for storage, objs in list(self.objects.items()):
            rt = self._any_type(storage)
            if rt is None:
                continue
            for key, obj in list(objs.items()):
                refs = _meta(obj).get("ownerReferences") or []
                if any(r.get("uid") == uid for r in refs):
                    yield rt, key, obj

    def _collect_garbage(self, uid: str) -> None:
        """The garbage collector's background deletion: dependents whose owners are all gone."""
        if not uid:
            return
        live = {(_meta(o).get("uid")) for objs in self.objects.values() for o in objs.values()}
        for rt, key, obj in list(self._dependents(uid)):
            owners = {r.get("uid") for r in _meta(obj).get("ownerReferences") or []}
            if owners & live:
                continue
            if key in self._store_of(rt):
                self.delete(rt, key[0], key[1])

    def _orphan(self, uid: str) -> None:
        for rt, key, obj in list(self._dependents(uid)):
            new = copy.deepcopy(obj)
            refs = [r for r in _meta(new).get("ownerReferences") or [] if r.get("uid") != uid]
            if refs:
                _meta(new)["ownerReferences"] = refs
            else:
                _meta(new).pop("ownerReferences", None)
            self.commit(rt, key[0], key[1], "MODIFIED", new, obj)

    def delete_collection(
        self, rt: ResourceType, namespace: str | None, labels: LabelSelector, fields: FieldSelector
    ) -> Obj:
        with self.lock:
            listing = self.list(rt, namespace, labels, fields)
            for item in listing["items"]:
                meta = item["metadata"]
                self.delete(rt, meta.get("namespace", ""), meta["name"])
            return listing

    # ------------------------------------------------------------------ pods/eviction
    def evict(self, namespace: str, name: str, body: Obj, dry_run: builtins.list[str]) -> Obj:
        """POST pods/NAME/eviction (PodDisruptionBudgets honoured; see disruption.py)."""
        return disruption.evict(self, namespace, name, body, dry_run)

    # ------------------------------------------------------------------ pods/binding
    def bind(self, namespace: str, name: str, binding: Obj) -> Obj:
        rt = self.resource("", "v1", "pods")
        with self.lock:
            current = self._store_of(rt).get((namespace, name))
            if current is None:
                raise err.not_found(rt, name)
            bmeta = binding.get("metadata") or {}
            if bmeta.get("name") not in (None, name):
                raise err.bad_request("name in URL does not match name in Binding object")
            target = binding.get("target") or {}
            node = target.get("name")
            if not node:
                raise err.invalid(
                    rt, name, [FieldError("target.name", "FieldValueRequired", "Required value")]
                )
            if (current.get("spec") or {}).get("nodeName"):
                raise err.conflict(
                    rt,
                    name,
                    f'pod {name} is already assigned to node "{current["spec"]["nodeName"]}"',
                    resource="pods/binding",
                )
            if _meta(current).get("deletionTimestamp"):
                raise err.conflict(
                    rt,
                    name,
                    f"pod {name} is being deleted, cannot be assigned to a host",
                    resource="pods/binding",
                )
            new = copy.deepcopy(current)
            new.setdefault("spec", {})["nodeName"] = node
            if bmeta.get("annotations"):
                _meta(new).setdefault("annotations", {}).update(bmeta["annotations"])
            conditions = [
                c
                for c in (new.setdefault("status", {}).get("conditions") or [])
                if c.get("type") != "PodScheduled"
            ]
            conditions.append(
                {
                    "type": "PodScheduled",
                    "status": "True",
                    "lastProbeTime": None,
                    "lastTransitionTime": now_text(),
                }
            )
            new["status"]["conditions"] = conditions
            self.commit(rt, namespace, name, "MODIFIED", new, current)
            return {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Success",
                "code": 201,
            }

    # ------------------------------------------------------------------ CRDs
    def _serve_crd(self, crd: Obj) -> None:
        spec = crd.get("spec") or {}
        group = spec["group"]
        names = spec["names"]
        for rt_list in self.types.values():
            for plural, rt in list(rt_list.items()):
                if not rt.builtin and rt.group == group and rt.plural == names["plural"]:
                    del rt_list[plural]
        for version in spec.get("versions") or []:
            if not version.get("served", True):
                continue
            subresources = frozenset(
                k for k in (version.get("subresources") or {}) if k in ("status", "scale")
            )
            columns = tuple(
                Column(
                    c["name"],
                    c.get("type", "string"),
                    c.get("jsonPath", ""),
                    int(c.get("priority", 0)),
                    c.get("description", ""),
                )
                for c in version.get("additionalPrinterColumns") or []
            )
            if not version.get("additionalPrinterColumns"):
                columns = (Column("Age", "date", ".metadata.creationTimestamp"),)
            self._register(
                ResourceType(
                    group,
                    version["name"],
                    names["plural"],
                    names.get("singular") or names["kind"].lower(),
                    names["kind"],
                    spec.get("scope") == "Namespaced",
                    tuple(names.get("shortNames") or ()),
                    tuple(names.get("categories") or ()),
                    subresources,
                    None,
                    columns,
                    False,
                    ((version.get("schema") or {}).get("openAPIV3Schema")),
                    False,
                    True,
                    (group, names["plural"]),
                )
            )
        rt = self.resource("apiextensions.k8s.io", "v1", "customresourcedefinitions")
        name = _meta(crd)["name"]
        current = self._store_of(rt)[("", name)]
        status = {
            "acceptedNames": copy.deepcopy(names),
            "storedVersions": [v["name"] for v in spec.get("versions") or [] if v.get("storage")],
            "conditions": [
                {
                    "type": "NamesAccepted",
                    "status": "True",
                    "reason": "NoConflicts",
                    "message": "no conflicts found",
                    "lastTransitionTime": now_text(),
                },
                {
                    "type": "Established",
                    "status": "True",
                    "reason": "InitialNamesAccepted",
                    "message": "the initial names have been accepted",
                    "lastTransitionTime": now_text(),
                },
            ],
        }
        if (
            current.get("status", {}).get("acceptedNames") != status["acceptedNames"]
            or current.get("status", {}).get("storedVersions") != status["storedVersions"]
        ):
            new = copy.deepcopy(current)
            new["status"] = status
            self.commit(rt, "", name, "MODIFIED", new, current)

    def _unserve_crd(self, crd: Obj) -> None:
        spec = crd.get("spec") or {}
        group, plural = spec.get("group", ""), (spec.get("names") or {}).get("plural", "")
        storage = (group, plural)
        rt = self._any_type(storage)
        if rt is not None:
            for key in list(self.objects.get(storage, {})):
                self._remove(rt, key[0], key[1])
        self.drop_watches(abrupt=False, storage=storage)
        for gv in list(self.types):
            self.types[gv] = {p: t for p, t in self.types[gv].items() if t.storage != storage}
            if not self.types[gv]:
                del self.types[gv]


# ---------------------------------------------------------------------- built-in kind rules
def _default_pod(pod: Obj) -> None:
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


def _qos_class(pod: Obj) -> str:
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
    before, after = _qos_class(old), _qos_class(pod)
    if before != after:
        return [
            FieldError(
                "spec",
                "FieldValueInvalid",
                f'Invalid value: "{after}": Pod QOS Class may not change as a result of resizing',
            )
        ]
    return []


def _pod_problems(pod: Obj, old: Obj | None, *, resize: bool = False) -> list[FieldError]:
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


def _crd_problems(crd: Obj) -> list[FieldError]:
    problems: list[FieldError] = []
    spec = crd.get("spec") or {}
    names = spec.get("names") or {}
    group = spec.get("group") or ""
    if not group:
        problems.append(FieldError("spec.group", "FieldValueRequired", "Required value"))
    for key in ("plural", "kind"):
        if not names.get(key):
            problems.append(FieldError(f"spec.names.{key}", "FieldValueRequired", "Required value"))
    name = _meta(crd).get("name")
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
