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
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from corepin.core.errors import (
    ApiAlreadyExists,
    ApiConflict,
    ApiError,
    ApiForbidden,
    ApiGone,
    ApiInvalid,
    ApiNotFound,
    ApiUnauthorized,
    ApiUnreachable,
    RequestError,
)
from corepin.kube.config import ClusterConfig
from corepin.kube.transport import Cancel, Stream, Transport

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


_BY_CODE: dict[int, type[ApiError]] = {
    401: ApiUnauthorized,
    403: ApiForbidden,
    404: ApiNotFound,
    410: ApiGone,
    422: ApiInvalid,
}


def api_error(
    code: int,
    body: bytes | Mapping[str, Any],
    *,
    http_reason: str = "",
    verb: str = "",
    target: str = "",
    headers: Mapping[str, str] | None = None,
) -> ApiError:
    """The typed error for a failed answer (HTTP status + body, or a watch ERROR Status).
    A `Retry-After` header (or the Status's `details.retryAfterSeconds`, which the API server
    sets on 429s) lands in the error's `retry_after`."""
    status: Mapping[str, Any] = {}
    if isinstance(body, Mapping):
        status = body
    else:
        try:
            decoded = json.loads(body or b"{}")
            if isinstance(decoded, dict):
                status = decoded
        except ValueError:
            status = {}
    if status.get("kind") == "Status":
        code = int(status.get("code") or code)
        reason = str(status.get("reason") or http_reason or "Unknown")
        message = str(status.get("message") or reason)
        details = status.get("details")
    else:
        reason = http_reason or "Unknown"
        text = body.decode("utf-8", "replace").strip() if isinstance(body, bytes) else ""
        message = text[:200] or reason
        details = None
    if code == 409:
        cls: type[ApiError] = ApiAlreadyExists if reason == "AlreadyExists" else ApiConflict
    else:
        cls = _BY_CODE.get(code, ApiError)
    error = cls(
        code,
        reason,
        message,
        details=dict(details) if isinstance(details, dict) else None,
        verb=verb,
        target=target,
    )
    error.retry_after = retry_after_of(headers or {}, error.details)
    return error


def retry_after_of(headers: Mapping[str, str], details: Mapping[str, object]) -> float | None:
    """Seconds from `Retry-After` (delta-seconds, the form the API server and proxies in front
    of it send; an HTTP date is ignored) or `details.retryAfterSeconds`; None when neither."""
    for name, value in headers.items():
        if name.lower() == "retry-after":
            try:
                seconds = float(str(value).strip())
            except ValueError:
                break
            if seconds >= 0 and seconds == seconds and seconds != float("inf"):
                return seconds
            break
    found = details.get("retryAfterSeconds")
    if isinstance(found, int | float) and not isinstance(found, bool) and found >= 0:
        return float(found)
    return None


def too_large_resource_version(exc: ApiError) -> bool:
    """The server does not have the resource version asked for yet (504, cause
    ResourceVersionTooLarge): it is behind us, e.g. restored from an older etcd state."""
    if exc.code != 504:
        return False
    if any(c.get("reason") == "ResourceVersionTooLarge" for c in exc.causes):
        return True
    return "too large resource version" in exc.api_message.lower()


@dataclass(frozen=True)
class WatchEvent:
    """One watch event: ADDED, MODIFIED, DELETED or BOOKMARK (ERROR events are raised)."""

    type: str
    object: Obj

    @property
    def resource_version(self) -> str:
        return str((self.object.get("metadata") or {}).get("resourceVersion") or "")


class Watch:
    """An open watch: iterate for events; ends when the server ends it (timeout). Raises
    ApiGone on a 410 ERROR event, ApiError for other ERROR events, ApiUnreachable when the
    connection is cut. `close()` (from any thread via the Cancel token) stops it."""

    def __init__(self, stream: Stream, target: str) -> None:
        self._stream = stream
        self._target = target

    def __iter__(self) -> Iterator[WatchEvent]:
        try:
            for line in self._stream.lines():
                try:
                    event = json.loads(line)
                    kind = str(event["type"])
                    obj = event["object"]
                except (ValueError, KeyError, TypeError) as exc:
                    raise ApiUnreachable(self._target, f"malformed watch event: {exc}") from exc
                if kind == "ERROR":
                    raise api_error(
                        int(obj.get("code") or 500), obj, verb="watch", target=self._target
                    )
                yield WatchEvent(kind, obj)
        finally:
            self.close()

    def close(self) -> None:
        self._stream.close()


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
        body: Any = None,
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
            raise ApiUnreachable(
                self.transport.config.server, f"{verb} {path}: answer is not JSON"
            ) from exc
        if not isinstance(decoded, dict):
            raise ApiUnreachable(
                self.transport.config.server, f"{verb} {path}: answer is not a JSON object"
            )
        return decoded

    def _ns(
        self, resource: Resource, namespace: str | None, obj: Mapping[str, Any] | None = None
    ) -> str | None:
        if not resource.namespaced:
            return None
        found = namespace or ((obj or {}).get("metadata") or {}).get("namespace")
        if not found:
            raise RequestError(f"{resource} is namespaced: a namespace is needed")
        return str(found)

    def _write_query(
        self, field_manager: str | None, dry_run: bool, extra: Mapping[str, str] | None = None
    ) -> dict[str, str]:
        query = {"fieldManager": field_manager or self.field_manager}
        if dry_run:
            query["dryRun"] = "All"
        query.update(extra or {})
        return query

    @staticmethod
    def _name(obj: Mapping[str, Any]) -> str:
        name = (obj.get("metadata") or {}).get("name")
        if not name:
            raise RequestError("the object has no metadata.name")
        return str(name)

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
        path = resource.path(self._ns(resource, namespace), name, subresource)
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
        query: dict[str, str] = {}
        if label_selector:
            query["labelSelector"] = label_selector
        if field_selector:
            query["fieldSelector"] = field_selector
        if limit:
            query["limit"] = str(limit)
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
                    meta = page.get("metadata") or {}
                    version = version or str(meta.get("resourceVersion") or "")
                    items.extend(page.get("items") or [])
                    token = meta.get("continue") or None
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
        path = resource.path(self._ns(resource, namespace, obj))
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
        path = resource.path(self._ns(resource, namespace, obj), self._name(obj))
        return self._call(
            "PUT", path, verb="update", body=obj, query=self._write_query(field_manager, dry_run)
        )

    def patch(
        self,
        resource: Resource,
        name: str,
        patch: Any,
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
            self._ns(resource, namespace, patch if isinstance(patch, dict) else None),
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
            self._name(obj),
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
        path = resource.path(self._ns(resource, namespace), name)
        return self._call("DELETE", path, verb="delete", body=options)

    # ------------------------------------------------------------------ status subresource
    def get_status(self, resource: Resource, name: str, namespace: str | None = None) -> Obj:
        return self.get(resource, name, namespace, subresource="status")

    def replace_status(
        self,
        resource: Resource,
        obj: Mapping[str, Any],
        namespace: str | None = None,
        *,
        field_manager: str | None = None,
    ) -> Obj:
        path = resource.path(self._ns(resource, namespace, obj), self._name(obj), "status")
        return self._call(
            "PUT", path, verb="update", body=obj, query=self._write_query(field_manager, False)
        )

    def patch_status(
        self,
        resource: Resource,
        name: str,
        patch: Any,
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
        query: dict[str, str] = {"watch": "1"}
        if resource_version is not None:
            query["resourceVersion"] = resource_version
        if label_selector:
            query["labelSelector"] = label_selector
        if field_selector:
            query["fieldSelector"] = field_selector
        if timeout_seconds:
            query["timeoutSeconds"] = str(timeout_seconds)
        if allow_bookmarks:
            query["allowWatchBookmarks"] = "true"
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
