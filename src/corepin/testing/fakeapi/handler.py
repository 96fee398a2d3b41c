"""The fake API server's request handler: authentication, injected faults and refusals, the
request log, routing of discovery and resource URLs, and each verb on a resource (list, get,
create, update, patch, delete, deletecollection, the pods' binding and eviction); watches are
watching.py's.
"""

from __future__ import annotations

import contextlib
import socket
import time
import urllib.parse

import yaml

from corepin.testing.fakeapi import errors as err
from corepin.testing.fakeapi.controls import RequestRecord
from corepin.testing.fakeapi.discovery import (
    VERSION_INFO,
    api_group,
    api_versions,
    group_list,
    openapi,
    resource_list,
)
from corepin.testing.fakeapi.patching import APPLY_PATCH, JSON_PATCH, MERGE_PATCH, STRATEGIC_PATCH
from corepin.testing.fakeapi.tables import table
from corepin.testing.fakeapi.transport import Target, first_values
from corepin.testing.fakeapi.watching import WatchHandler

PUBLIC_PATHS = ("/version", "/healthz", "/livez", "/readyz")


class Handler(WatchHandler):
    """Every request the fake API server answers."""

    # the five methods
    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_PUT(self) -> None:
        self._serve("PUT")

    def do_PATCH(self) -> None:
        self._serve("PATCH")

    def do_DELETE(self) -> None:
        self._serve("DELETE")

    def _serve(self, method: str) -> None:
        parsed = urllib.parse.urlsplit(self.path)
        path = parsed.path.rstrip("/") or "/"
        query = first_values(urllib.parse.parse_qs(parsed.query, keep_blank_values=True))
        self._record = RequestRecord(
            method,
            path,
            query,
            method.lower(),
            "",
            "",
            "",
            "",
            "",
            self.headers.get("User-Agent") or "",
            self.headers.get("Content-Type") or "",
        )
        if method == "GET" and query.get("watch") in ("1", "true"):
            self._record.verb = "watch"  # known before routing, also for injected faults
        body = self._body()
        with self.fake._lock:
            self.fake.requests.append(self._record)
            fault = next((f for f in self.fake.faults if f.matches(method, path, query)), None)
            if fault is not None:
                fault.hits += 1
        user = self._user()
        if user is None and path not in PUBLIC_PATHS:
            self._fail(err.ApiFailure(401, "Unauthorized", "Unauthorized"))
            return
        self._record.user = user or "system:anonymous"
        if fault is not None:
            if fault.delay:
                time.sleep(fault.delay)
            if fault.drop:
                self.close_connection = True
                with contextlib.suppress(OSError):
                    self.connection.shutdown(socket.SHUT_RDWR)
                return
            if fault.status is not None:
                failure = err.ApiFailure(
                    fault.status,
                    _reason_for(fault.status),
                    f"injected failure ({fault.status})",
                    {"retryAfterSeconds": fault.retry_after}
                    if fault.retry_after is not None
                    else None,
                )
                extra = {} if fault.retry_after is None else {"Retry-After": str(fault.retry_after)}
                self._send_json(failure.code, failure.status(), headers=extra)
                return
        try:
            self._route(method, path, query, body)
        except err.ApiFailure as failure:
            self._fail(failure)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _route(self, method: str, path: str, query: dict[str, str], body: bytes) -> None:
        if path in ("/healthz", "/livez", "/readyz"):
            data = b"ok"
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        if path == "/version":
            self._send_json(200, VERSION_INFO)
            return
        if path.startswith("/openapi/"):
            self._send_json(200, openapi(self.fake.cluster, path))
            return
        segments = [urllib.parse.unquote(s) for s in path.strip("/").split("/")]
        if segments[0] == "api":
            if len(segments) == 1:
                self._send_json(200, api_versions(int(self.server.server_address[1])))
                return
            group, version, rest = "", segments[1], segments[2:]
        elif segments[0] == "apis":
            if len(segments) == 1:
                self._send_json(200, group_list(self.fake.cluster))
                return
            if len(segments) == 2:
                self._send_json(200, api_group(self.fake.cluster, segments[1]))
                return
            group, version, rest = segments[1], segments[2], segments[3:]
        else:
            raise err.ApiFailure(
                404, "NotFound", "the server could not find the requested resource", {}
            )
        if not rest:
            self._send_json(200, resource_list(self.fake.cluster, group, version))
            return
        target = self._target(group, version, rest)
        self._record.resource = target.rt.plural
        self._record.namespace = target.namespace or ""
        self._record.name = target.name
        self._record.subresource = target.subresource
        self._record.verb = self._verb(method, target, query)
        self._authorize(target)
        self._dispatch(method, target, query, body)

    def _authorize(self, target: Target) -> None:
        record = self._record
        for user, verb, resource in self.fake.forbidden:
            if (
                user in (None, record.user)
                and verb in (None, record.verb)
                and resource in (None, target.rt.plural)
            ):
                where = (
                    f' in the namespace "{target.namespace}"'
                    if target.namespace
                    else " at the cluster scope"
                )
                resource_text = (
                    f"{target.rt.plural}/{target.subresource}"
                    if target.subresource
                    else target.rt.plural
                )
                raise err.ApiFailure(
                    403,
                    "Forbidden",
                    f'{target.rt.qualified} is forbidden: User "{record.user}" cannot '
                    f'{record.verb} resource "{resource_text}" in API group "{target.rt.group}"'
                    f"{where}",
                    {"kind": target.rt.plural, **({"name": target.name} if target.name else {})},
                )

    def _verb(self, method: str, target: Target, query: dict[str, str]) -> str:
        if method == "GET":
            if target.name:
                return "get"
            return "watch" if query.get("watch") in ("1", "true") else "list"
        return {"POST": "create", "PUT": "update", "PATCH": "patch"}.get(
            method, "delete" if target.name else "deletecollection"
        )

    def _target(self, group: str, version: str, rest: list[str]) -> Target:
        cluster = self.fake.cluster
        namespace: str | None = None
        if rest[0] == "namespaces" and len(rest) >= 3:
            candidate = cluster.find_resource(group, version, rest[2])
            if candidate is not None and candidate.namespaced:
                namespace, rest = rest[1], rest[2:]
        rt = cluster.find_resource(group, version, rest[0])
        if rt is None:
            raise err.ApiFailure(
                404, "NotFound", "the server could not find the requested resource", {}
            )
        if rt.namespaced and namespace is None and len(rest) > 1:
            raise err.ApiFailure(
                404, "NotFound", "the server could not find the requested resource", {}
            )
        name = rest[1] if len(rest) > 1 else ""
        sub = rest[2] if len(rest) > 2 else ""
        if len(rest) > 3 or (sub and sub not in rt.subresources):
            raise err.ApiFailure(
                404, "NotFound", "the server could not find the requested resource", {}
            )
        return Target(rt, namespace, name, sub)

    def _dispatch(self, method: str, target: Target, query: dict[str, str], body: bytes) -> None:
        cluster = self.fake.cluster
        rt = target.rt
        ns = target.namespace or ""
        if rt.namespaced and method in ("POST",) and target.namespace is None:
            raise err.method_not_allowed()
        if target.subresource in ("eviction", "binding") and method != "POST":
            raise err.method_not_allowed()
        if method == "GET" and not target.name:
            labels, fields = self._selectors(rt, query)
            if query.get("watch") in ("1", "true"):
                self._watch(target, query, labels, fields)
                return
            try:
                limit = int(query.get("limit") or 0)
            except ValueError:
                raise err.bad_request(f"invalid limit: {query.get('limit')}") from None
            listing = cluster.list(
                rt,
                target.namespace,
                labels,
                fields,
                limit=limit,
                continue_token=query.get("continue") or "",
                resource_version=query.get("resourceVersion") or "",
                rv_match=query.get("resourceVersionMatch") or "",
                typed_items=not self._wants_table(),
            )
            if self._wants_table():
                listing = table(
                    rt,
                    listing["items"],
                    listing["metadata"],
                    query.get("includeObject") or "Metadata",
                )
            self._send_json(200, listing)
            return
        if method == "GET":
            obj = cluster.get(rt, ns, target.name)
            if self._wants_table():
                obj = table(
                    rt,
                    [obj],
                    {"resourceVersion": obj["metadata"]["resourceVersion"]},
                    query.get("includeObject") or "Metadata",
                )
            self._send_json(200, obj)
            return
        if method == "POST":
            payload = self._parse_json(body)
            if not isinstance(payload, dict):
                raise err.bad_request("the request body must be a JSON object")
            if target.subresource == "binding":
                self._send_json(201, cluster.bind(ns, target.name, payload))
                return
            if target.subresource == "eviction":
                dry_run = [query["dryRun"]] if query.get("dryRun") else []
                self._send_json(201, cluster.evict(ns, target.name, payload, dry_run))
                return
            if target.name:
                raise err.method_not_allowed()
            result = cluster.create(rt, ns, payload, self._options(query))
            self._send_json(201, result.obj, result.warnings)
            return
        if method == "PUT":
            payload = self._parse_json(body)
            if not isinstance(payload, dict) or not target.name:
                raise err.bad_request("the request body must be a JSON object")
            result = cluster.replace(
                rt, ns, target.name, payload, self._options(query), target.subresource
            )
            self._send_json(201 if result.created else 200, result.obj, result.warnings)
            return
        if method == "PATCH":
            if not target.name:
                raise err.method_not_allowed()
            content_type = (self.headers.get("Content-Type") or "").split(";")[0].strip()
            if content_type == APPLY_PATCH:
                try:
                    payload = yaml.safe_load(body.decode() or "null")
                except yaml.YAMLError as exc:
                    raise err.bad_request(f"error decoding YAML: {exc}") from None
            elif content_type in (MERGE_PATCH, JSON_PATCH, STRATEGIC_PATCH):
                payload = self._parse_json(body)
            else:
                accepted = [JSON_PATCH, MERGE_PATCH, APPLY_PATCH]
                if rt.builtin:
                    accepted.insert(2, STRATEGIC_PATCH)
                raise err.unsupported_media(accepted)
            patch_opts = self._options(query)
            if content_type == APPLY_PATCH and "fieldManager" not in query:
                patch_opts.field_manager = ""  # apply needs it spelled out: no user-agent default
            result = cluster.patch(
                rt, ns, target.name, content_type, payload, patch_opts, target.subresource
            )
            self._send_json(201 if result.created else 200, result.obj, result.warnings)
            return
        if method == "DELETE":
            options = self._parse_json(body) if body else {}
            if not isinstance(options, dict):
                options = {}
            if "gracePeriodSeconds" in query:
                options["gracePeriodSeconds"] = int(query["gracePeriodSeconds"])
            if "propagationPolicy" in query:
                options["propagationPolicy"] = query["propagationPolicy"]
            policy = options.get("propagationPolicy")
            if policy not in (None, "Orphan", "Background", "Foreground"):
                raise err.bad_request(
                    f'propagationPolicy must be one of "Orphan", "Background",'
                    f' "Foreground", got "{policy}"'
                )
            if not target.name:
                labels, fields = self._selectors(rt, query)
                listing = cluster.delete_collection(rt, target.namespace, labels, fields)
                self._send_json(200, listing)
                return
            obj, _gone = cluster.delete(rt, ns, target.name, options, query.get("dryRun") == "All")
            self._send_json(200, obj)
            return
        raise err.method_not_allowed()


def _reason_for(code: int) -> str:
    return {
        400: "BadRequest",
        401: "Unauthorized",
        403: "Forbidden",
        404: "NotFound",
        409: "Conflict",
        410: "Expired",
        422: "Invalid",
        429: "TooManyRequests",
        500: "InternalError",
        503: "ServiceUnavailable",
        504: "Timeout",
    }.get(code, "Unknown")
