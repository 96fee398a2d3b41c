"""The one Kubernetes API client of corepin: generic access to any resource by (group, version,
plural, namespaced), objects as plain JSON dicts, and the single place where API answers become
typed errors (`api_error`).

Conventions: a namespaced resource needs a namespace for single-object calls (taken from the
object's metadata when not given); list and watch without a namespace cover all namespaces.
Writes send `fieldManager` (default "corepin"). Objects returned are fresh dicts the caller owns.
"""

from __future__ import annotations

import builtins
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from corepin.core.errors import ApiGone, ApiUnreachable, RequestError
from corepin.kube.config import ClusterConfig
from corepin.kube.errors import api_error
from corepin.kube.models import ObjectView
from corepin.kube.transport import Cancel, Response, Transport
from corepin.kube.watch import Watch

Obj = dict[str, Any]
PatchType = Literal["merge", "json", "strategic", "apply"]

PATCH_CONTENT_TYPES: dict[str, str] = {
    "merge": "application/merge-patch+json",
    "json": "application/json-patch+json",
    "strategic": "application/strategic-merge-patch+json",
    "apply": "application/apply-patch+yaml",
}
DEFAULT_FIELD_MANAGER = "corepin"
# the API server's watch cache sends every watcher that allows bookmarks one per minute
BOOKMARK_INTERVAL = 60.0
WATCH_READ_MARGIN = 5.0
# how long a list/watch may go without an answer from the API before the connection counts as
# dead and `/healthz` says so; also the socket read timeout of watches (see informer.py)
DEFAULT_IDLE_TIMEOUT = 40.0


@dataclass(frozen=True)
class Resource:
    """A resource type as the API serves it."""

    group: str
    version: str
    plural: str
    namespaced: bool
    kind: str = ""

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(
        self, namespace: str | None = None, name: str | None = None, subresource: str | None = None
    ) -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{namespace}"
        base += f"/{self.plural}"
        if name:
            base += f"/{name}"
            if subresource:
                base += f"/{subresource}"
        return base

    def __str__(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural


def _namespace_of(
    resource: Resource, namespace: str | None, obj: Mapping[str, Any] | None = None
) -> str | None:
    """The namespace of a single-object call: None for a cluster-scoped resource, else the
    one given, else the object's (RequestError when there is none)."""
    if not resource.namespaced:
        return None
    found = namespace or ObjectView(obj).metadata.get("namespace")
    if not found:
        raise RequestError(f"{resource} is namespaced: a namespace is needed")
    return str(found)


def _name_of(obj: Mapping[str, Any]) -> str:
    name = ObjectView(obj).metadata.get("name")
    if not name:
        raise RequestError("the object has no metadata.name")
    return str(name)


def _query(**params: str | int | None) -> dict[str, str]:
    """The query parameters that are set (by their API names), as text."""
    return {key: str(value) for key, value in params.items() if value}


def _object_of(answer: Response, verb: str, path: str, server: str) -> Obj:
    """The JSON object the server answered `verb` on `path` with; the typed error of a failed
    answer, ApiUnreachable for one that is not a JSON object."""
    if answer.status >= 400:
        raise api_error(
            answer.status,
            answer.body,
            http_reason=answer.reason,
            verb=verb,
            target=path,
            headers=answer.headers,
        )
    try:
        decoded = json.loads(answer.body or b"{}")
    except ValueError as exc:
        raise ApiUnreachable(server, f"{verb} {path}: answer is not JSON") from exc
    if not isinstance(decoded, dict):
        raise ApiUnreachable(server, f"{verb} {path}: answer is not a JSON object")
    return decoded


class KubeClient:
    """Generic, thread-safe access to the API server."""

    def __init__(
        self,
        transport: Transport,
        *,
        field_manager: str = DEFAULT_FIELD_MANAGER,
        idle_timeout: float = DEFAULT_IDLE_TIMEOUT,
    ) -> None:
        self.transport = transport
        self.field_manager = field_manager
        self.idle_timeout = idle_timeout

    @classmethod
    def from_config(
        cls,
        config: ClusterConfig,
        *,
        timeout: float = 30.0,
        user_agent: str = "corepin",
        field_manager: str = DEFAULT_FIELD_MANAGER,
        idle_timeout: float = DEFAULT_IDLE_TIMEOUT,
    ) -> KubeClient:
        """A client; `idle_timeout` is the default of its informers (see informer.py)."""
        return cls(
            Transport(config, timeout=timeout, user_agent=user_agent),
            field_manager=field_manager,
            idle_timeout=idle_timeout,
        )

    @property
    def default_namespace(self) -> str:
        return self.transport.config.namespace

    def close(self) -> None:
        self.transport.close()

    # ------------------------------------------------------------------ plumbing
    def _call(
        self,
        method: str,
        path: str,
        *,
        verb: str,
        query: Mapping[str, str] | None = None,
        body: object = None,
        content_type: str | None = None,
        raw: bytes | None = None,
        cancel: Cancel | None = None,
        timeout: float | None = None,
    ) -> Obj:
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        answer = self.transport.request(
            method,
            path,
            query=query,
            body=data,
            content_type=content_type,
            cancel=cancel,
            timeout=timeout,
        )
        return _object_of(answer, verb, path, self.transport.config.server)

    def _write_query(
        self, field_manager: str | None, dry_run: bool, extra: Mapping[str, str] | None = None
    ) -> dict[str, str]:
        query = {"fieldManager": field_manager or self.field_manager}
        if dry_run:
            query["dryRun"] = "All"
        query.update(extra or {})
        return query

    # ------------------------------------------------------------------ server
    def version(self) -> Obj:
        """GET /version: the cheapest check that the server is there and answers."""
        return self._call("GET", "/version", verb="get")

    def check(self) -> Obj:
        """Start-up check: the server answers /version and accepts our credentials.
        Raises ApiUnreachable or ApiError (both EnvironmentProblem, exit 4)."""
        info = self.version()
        self._call("GET", "/api", verb="get")
        return info

    # ------------------------------------------------------------------ reads
    def get(
        self,
        resource: Resource,
        name: str,
        namespace: str | None = None,
        *,
        subresource: str | None = None,
    ) -> Obj:
        path = resource.path(_namespace_of(resource, namespace), name, subresource)
        return self._call("GET", path, verb="get")

    def list(
        self,
        resource: Resource,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        limit: int | None = None,
        continue_token: str | None = None,
        resource_version: str | None = None,
        resource_version_match: str | None = None,
        cancel: Cancel | None = None,
        timeout: float | None = None,
    ) -> Obj:
        """One list call (one page when `limit` is given): the List object. `timeout` bounds
        each wait for the server (default: the transport's)."""
        query = _query(labelSelector=label_selector, fieldSelector=field_selector, limit=limit)
        if continue_token:
            query["continue"] = continue_token
        if resource_version is not None:
            query["resourceVersion"] = resource_version
        if resource_version_match:
            query["resourceVersionMatch"] = resource_version_match
        path = resource.path(namespace if resource.namespaced else None)
        return self._call("GET", path, verb="list", query=query, cancel=cancel, timeout=timeout)

    def list_all(
        self,
        resource: Resource,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        page_size: int = 500,
        cancel: Cancel | None = None,
        timeout: float | None = None,
    ) -> tuple[builtins.list[Obj], str]:
        """Every matching object, page by page, consistent at one resource version (returned
        too). A continue token that expires mid-way (410) restarts the list once, in full."""
        for attempt in (0, 1):
            items: list[Obj] = []
            token: str | None = None
            version = ""
            try:
                while True:
                    page = self.list(
                        resource,
                        namespace,
                        label_selector=label_selector,
                        field_selector=field_selector,
                        limit=page_size,
                        continue_token=token,
                        cancel=cancel,
                        timeout=timeout,
                    )
                    listed = ObjectView(page)
                    version = version or listed.resource_version
                    items.extend(page.get("items") or [])
                    token = listed.metadata.get("continue") or None
                    if not token:
                        break
            except ApiGone:
                if attempt == 0 and token:
                    continue
                raise
            for item in items:
                item.setdefault("apiVersion", resource.api_version)
                if resource.kind:
                    item.setdefault("kind", resource.kind)
            return items, version
        raise AssertionError("unreachable")  # pragma: no cover

    # ------------------------------------------------------------------ writes
    def create(
        self,
        resource: Resource,
        obj: Mapping[str, Any],
        namespace: str | None = None,
        *,
        field_manager: str | None = None,
        dry_run: bool = False,
    ) -> Obj:
        path = resource.path(_namespace_of(resource, namespace, obj))
        return self._call(
            "POST", path, verb="create", body=obj, query=self._write_query(field_manager, dry_run)
        )

    def replace(
        self,
        resource: Resource,
        obj: Mapping[str, Any],
        namespace: str | None = None,
        *,
        field_manager: str | None = None,
        dry_run: bool = False,
    ) -> Obj:
        """PUT the whole object; with metadata.resourceVersion set, a stale one is ApiConflict."""
        path = resource.path(_namespace_of(resource, namespace, obj), _name_of(obj))
        return self._call(
            "PUT", path, verb="update", body=obj, query=self._write_query(field_manager, dry_run)
        )

    def patch(
        self,
        resource: Resource,
        name: str,
        patch: object,
        namespace: str | None = None,
        *,
        patch_type: PatchType = "merge",
        field_manager: str | None = None,
        force: bool = False,
        subresource: str | None = None,
        dry_run: bool = False,
    ) -> Obj:
        """PATCH with a merge, JSON, strategic (built-in kinds only) or apply patch. For
        "apply", `patch` is the applied configuration (sent as JSON, which is YAML too) and
        `force` takes over fields other managers own."""
        if patch_type not in PATCH_CONTENT_TYPES:
            raise RequestError(f"unknown patch type {patch_type!r}")
        extra = {"force": "true"} if force and patch_type == "apply" else None
        path = resource.path(
            _namespace_of(resource, namespace, patch if isinstance(patch, dict) else None),
            name,
            subresource,
        )
        return self._call(
            "PATCH",
            path,
            verb="patch",
            raw=json.dumps(patch).encode(),
            content_type=PATCH_CONTENT_TYPES[patch_type],
            query=self._write_query(field_manager, dry_run, extra),
        )

    def apply(
        self,
        resource: Resource,
        obj: Mapping[str, Any],
        namespace: str | None = None,
        *,
        field_manager: str | None = None,
        force: bool = False,
        subresource: str | None = None,
    ) -> Obj:
        """Server-side apply of a whole applied configuration (creates when missing)."""
        return self.patch(
            resource,
            _name_of(obj),
            dict(obj),
            namespace,
            patch_type="apply",
            field_manager=field_manager,
            force=force,
            subresource=subresource,
        )

    def delete(
        self,
        resource: Resource,
        name: str,
        namespace: str | None = None,
        *,
        propagation_policy: str | None = None,
        grace_period_seconds: int | None = None,
        uid: str | None = None,
        resource_version: str | None = None,
        dry_run: bool = False,
    ) -> Obj:
        """DELETE; returns what the server answered (the object, or a Status). With finalizers
        (or a graceful pod) the object stays, with metadata.deletionTimestamp set."""
        options: Obj = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if propagation_policy:
            options["propagationPolicy"] = propagation_policy
        if grace_period_seconds is not None:
            options["gracePeriodSeconds"] = grace_period_seconds
        preconditions = {
            k: v for k, v in (("uid", uid), ("resourceVersion", resource_version)) if v
        }
        if preconditions:
            options["preconditions"] = preconditions
        if dry_run:
            options["dryRun"] = ["All"]
        path = resource.path(_namespace_of(resource, namespace), name)
        return self._call("DELETE", path, verb="delete", body=options)

    # ------------------------------------------------------------------ status subresource
    def replace_status(
        self,
        resource: Resource,
        obj: Mapping[str, Any],
        namespace: str | None = None,
        *,
        field_manager: str | None = None,
    ) -> Obj:
        path = resource.path(_namespace_of(resource, namespace, obj), _name_of(obj), "status")
        return self._call(
            "PUT", path, verb="update", body=obj, query=self._write_query(field_manager, False)
        )

    def patch_status(
        self,
        resource: Resource,
        name: str,
        patch: object,
        namespace: str | None = None,
        *,
        patch_type: PatchType = "merge",
        field_manager: str | None = None,
        force: bool = False,
    ) -> Obj:
        return self.patch(
            resource,
            name,
            patch,
            namespace,
            patch_type=patch_type,
            field_manager=field_manager,
            force=force,
            subresource="status",
        )

    # ------------------------------------------------------------------ pods/binding
    def bind(self, namespace: str, pod: str, node: str, *, uid: str | None = None) -> None:
        """Bind a pending pod to a node (what a scheduler does): POST pods/NAME/binding."""
        binding: Obj = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": pod, "namespace": namespace},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        if uid:
            binding["metadata"]["uid"] = uid
        path = f"/api/v1/namespaces/{namespace}/pods/{pod}/binding"
        self._call("POST", path, verb="create", body=binding)

    # ------------------------------------------------------------------ other subresources
    def create_subresource(
        self,
        resource: Resource,
        name: str,
        subresource: str,
        body: Mapping[str, Any],
        namespace: str | None = None,
        *,
        dry_run: bool = False,
    ) -> Obj:
        """POST to an object's subresource that takes a create (pods/NAME/eviction, ...);
        returns what the server answered (often a Status)."""
        path = resource.path(_namespace_of(resource, namespace, body), name, subresource)
        query = {"dryRun": "All"} if dry_run else None
        return self._call("POST", path, verb="create", body=body, query=query)

    # ------------------------------------------------------------------ watch
    def watch(
        self,
        resource: Resource,
        namespace: str | None = None,
        *,
        resource_version: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        timeout_seconds: int | None = None,
        allow_bookmarks: bool = True,
        read_timeout: float | None = None,
        cancel: Cancel | None = None,
    ) -> Watch:
        """Open a watch from `resource_version` ("" or None: current state first, as ADDED).
        A too-old version surfaces as ApiGone when iterating.

        `read_timeout` is the longest silence accepted on the open stream before it counts as
        dead (ApiUnreachable "timed out"). By default: the longest a healthy watch stays
        silent, plus a margin: the API server sends a bookmark every minute and one about 2 s
        before `timeout_seconds` runs out, then ends the watch."""
        query = {"watch": "1"}
        if resource_version is not None:
            query["resourceVersion"] = resource_version
        query.update(
            _query(
                labelSelector=label_selector,
                fieldSelector=field_selector,
                timeoutSeconds=timeout_seconds,
                allowWatchBookmarks="true" if allow_bookmarks else None,
            )
        )
        path = resource.path(namespace if resource.namespaced else None)
        if read_timeout is None:
            read_timeout = min(float(timeout_seconds or BOOKMARK_INTERVAL), BOOKMARK_INTERVAL)
            read_timeout += WATCH_READ_MARGIN
        stream = self.transport.stream(path, query=query, read_timeout=read_timeout, cancel=cancel)
        if stream.status >= 400:
            body = stream.read_all()
            stream.close()
            raise api_error(
                stream.status,
                body,
                http_reason=stream.reason,
                verb="watch",
                target=path,
                headers=stream.headers,
            )
        return Watch(stream, path)
