"""The fake API server's HTTP side: a stdlib `ThreadingHTTPServer` speaking HTTP/1.1 (keep-alive,
chunked watch streams), optionally over TLS with bearer tokens and client certificates.

Why the stdlib rather than aiohttp: the tests and corepin's client are synchronous and threaded;
a thread per connection lets a test block a handler (latency, a stuck watch) without an event
loop to drive from sync code, and it adds no dependency.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import queue
import re
import select
import socket
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from corepin.testing.fakeapi import errors as err
from corepin.testing.fakeapi.cluster import (
    APPLY_PATCH,
    JSON_PATCH,
    MERGE_PATCH,
    STRATEGIC_PATCH,
    Cluster,
    Snapshot,
    Watcher,
    WriteOptions,
)
from corepin.testing.fakeapi.kubeconfig import write_kubeconfig
from corepin.testing.fakeapi.resources import ResourceType
from corepin.testing.fakeapi.selectors import (
    SelectorError,
    parse_field_selector,
    parse_label_selector,
)
from corepin.testing.fakeapi.tables import table

if TYPE_CHECKING:
    from corepin.testing.fakeapi.tls import TLSMaterial

Obj = dict[str, Any]

VERSION_INFO = {
    "major": "1",
    "minor": "32",
    "gitVersion": "v1.32.0-fake",
    "gitCommit": "fake",
    "gitTreeState": "clean",
    "buildDate": "2024-12-11T00:00:00Z",
    "goVersion": "go1.23.3",
    "compiler": "gc",
    "platform": "linux/amd64",
}
PUBLIC_PATHS = ("/version", "/healthz", "/livez", "/readyz")


@dataclass
class RequestRecord:
    """One request the fake answered (for assertions such as "no list per event")."""

    method: str
    path: str
    query: dict[str, str]
    verb: str
    resource: str
    namespace: str
    name: str
    subresource: str
    user: str
    user_agent: str
    content_type: str
    code: int = 0
    at: float = field(default_factory=time.monotonic)

    @property
    def watch(self) -> bool:
        return self.verb == "watch"


@dataclass
class Fault:
    """An injected failure or delay for requests whose method and path match."""

    pattern: re.Pattern[str]
    method: str | None
    status: int | None
    delay: float
    drop: bool
    times: int | None  # None: until removed
    query: dict[str, str]
    retry_after: int | None = None  # sent as the Retry-After header (and in the Status)
    hits: int = 0

    def matches(self, method: str, path: str, query: dict[str, str]) -> bool:
        if self.times is not None and self.hits >= self.times:
            return False
        if self.method is not None and self.method != method:
            return False
        if any(k not in query if v == "*" else query.get(k) != v for k, v in self.query.items()):
            return False
        return bool(self.pattern.search(path))


@dataclass
class Target:
    """A parsed resource URL."""

    rt: ResourceType
    namespace: str | None
    name: str
    subresource: str


def _version_key(version: str) -> tuple[int, int, int, str]:
    match = re.match(r"^v(\d+)(?:(alpha|beta)(\d+))?$", version)
    if not match:
        return (3, 0, 0, version)
    stage = {"alpha": 2, "beta": 1, None: 0}[match.group(2)]
    return (stage, -int(match.group(1)), -int(match.group(3) or 0), version)


class FakeApiServer:
    """A Kubernetes API server double. Start with `start()` (or use as a context manager)."""

    def __init__(
        self,
        cluster: Cluster | None = None,
        *,
        tls: TLSMaterial | None = None,
        tokens: dict[str, str] | None = None,
        client_certs: bool = False,
        bookmark_interval: float = 5.0,
        watch_timeout: float = 1800.0,
        history_limit: int = 1000,
        graceful_pod_deletion: bool = False,
    ) -> None:
        self.cluster = cluster or Cluster(
            history_limit=history_limit, graceful_pod_deletion=graceful_pod_deletion
        )
        self.tls = tls
        self.tokens = dict(tokens or {})
        self.client_certs = client_certs and tls is not None
        self.bookmark_interval = bookmark_interval
        self.watch_timeout = watch_timeout
        self.requests: list[RequestRecord] = []
        self.faults: list[Fault] = []
        self.forbidden: list[tuple[str | None, str | None, str | None]] = []
        self._lock = threading.Lock()
        self._connections: set[socket.socket] = set()
        self._bookmark_now: set[int] = set()
        self._httpd: _Server | None = None
        self._thread: threading.Thread | None = None
        self.stopping = threading.Event()

    # ------------------------------------------------------------------ lifecycle
    @property
    def port(self) -> int:
        assert self._httpd is not None, "server not started"
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        scheme = "https" if self.tls else "http"
        return f"{scheme}://127.0.0.1:{self.port}"

    def start(self) -> FakeApiServer:
        self._httpd = _Server(("127.0.0.1", 0), _Handler, self)
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            daemon=True,
            name="fakeapi",
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        if self._httpd is not None:
            self._httpd.shutdown()
            self.cluster.drop_watches(abrupt=True)
            with self._lock:
                conns = list(self._connections)
            for conn in conns:
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
            self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> FakeApiServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ test controls
    def drop_watches(self, *, abrupt: bool = True) -> int:
        """Cut every open watch (abrupt: mid-stream, no final chunk). Returns how many."""
        return self.cluster.drop_watches(abrupt=abrupt)

    def compact(self) -> int:
        """Compact history at the current revision: older watches/continues get 410."""
        return self.cluster.compact()

    def snapshot(self) -> Snapshot:
        """The stored state now (objects, history, revision), for `restore()`."""
        return self.cluster.snapshot()

    def restore(self, snapshot: Snapshot) -> int:
        """Go back to an older stored state, as an API server whose etcd was restored from a
        backup (and which was restarted, as a restore requires): revisions go backwards and
        every open watch is cut. Returns the revision now current."""
        return self.cluster.restore(snapshot)

    def send_bookmarks(self) -> None:
        """Ask every open watch that allows bookmarks to send one now."""
        with self.cluster.lock:
            for watcher in self.cluster.watchers:
                self._bookmark_now.add(id(watcher))

    def inject(
        self,
        path: str,
        *,
        method: str | None = None,
        status: int | None = 500,
        delay: float = 0.0,
        drop: bool = False,
        times: int | None = 1,
        query: dict[str, str] | None = None,
        retry_after: int | None = None,
    ) -> Fault:
        """Fail (status), delay or drop (close without answer) requests whose path matches the
        regular expression `path` (and whose query has the given values; "*" = present);
        `times=None` keeps the fault until `clear_faults()`. `retry_after` adds the header
        `Retry-After: N` and `details.retryAfterSeconds`, as the API server's 429s (and its
        503s while it starts or stops) carry them."""
        fault = Fault(
            re.compile(path), method, status, delay, drop, times, dict(query or {}), retry_after
        )
        with self._lock:
            self.faults.append(fault)
        return fault

    def clear_faults(self) -> None:
        with self._lock:
            self.faults.clear()

    def forbid(
        self, *, user: str | None = None, verb: str | None = None, resource: str | None = None
    ) -> None:
        """Answer 403 to requests matching all the given attributes (None = any)."""
        with self._lock:
            self.forbidden.append((user, verb, resource))

    def recorded(
        self, *, verb: str | None = None, resource: str | None = None, method: str | None = None
    ) -> list[RequestRecord]:
        with self._lock:
            found = list(self.requests)
        return [
            r
            for r in found
            if (verb is None or r.verb == verb)
            and (resource is None or r.resource == resource)
            and (method is None or r.method == method)
        ]

    def clear_requests(self) -> None:
        with self._lock:
            self.requests.clear()

    def open_watches(self) -> int:
        with self.cluster.lock:
            return len(self.cluster.watchers)

    # ------------------------------------------------------------------ in-process access
    def rt(self, api_version: str, plural: str) -> ResourceType:
        group, _, version = api_version.rpartition("/")
        return self.cluster.resource(group, version, plural)

    def create(self, api_version: str, plural: str, body: Obj, namespace: str = "") -> Obj:
        """Create an object directly (same semantics as a POST), for test set-up."""
        rt = self.rt(api_version, plural)
        ns = namespace or (body.get("metadata") or {}).get("namespace") or "default"
        return self.cluster.create(
            rt, ns if rt.namespaced else "", body, WriteOptions(field_manager="fakeapi-test")
        ).obj

    def get(self, api_version: str, plural: str, name: str, namespace: str = "") -> Obj:
        return self.cluster.get(self.rt(api_version, plural), namespace, name)

    def objects(self, api_version: str, plural: str, namespace: str | None = None) -> list[Obj]:
        rt = self.rt(api_version, plural)
        listing = self.cluster.list(
            rt,
            namespace,
            parse_label_selector(None),
            parse_field_selector(None, rt.supports_field),
            typed_items=False,
        )
        items: list[Obj] = listing["items"]
        return items

    def write_kubeconfig(
        self,
        path: Path,
        *,
        token: str | None = None,
        client: tuple[Path, Path] | None = None,
        ca: bool = True,
        insecure: bool = False,
        embed: bool = False,
        context: str = "fake",
    ) -> Path:
        """A kubeconfig for this server (token, client cert/key, CA as files or -data)."""
        return write_kubeconfig(
            path,
            self.url,
            token=token,
            client=client,
            ca=self.tls.ca.cert if (self.tls and ca) else None,
            insecure=insecure,
            embed=embed,
            context=context,
        )


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True

    def __init__(
        self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], fake: FakeApiServer
    ) -> None:
        self.fake = fake
        self.ssl_context: ssl.SSLContext | None = None
        if fake.tls is not None:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(str(fake.tls.server.cert), str(fake.tls.server.key))
            if fake.client_certs:
                ctx.load_verify_locations(str(fake.tls.ca.cert))
                ctx.verify_mode = ssl.CERT_OPTIONAL
            ctx.set_alpn_protocols(["http/1.1"])
            self.ssl_context = ctx
        super().__init__(address, handler)

    def get_request(self) -> tuple[socket.socket, Any]:
        conn, addr = self.socket.accept()
        if self.ssl_context is not None:
            conn = self.ssl_context.wrap_socket(
                conn, server_side=True, do_handshake_on_connect=False
            )
        with self.fake._lock:
            self.fake._connections.add(conn)
        return conn, addr

    def shutdown_request(self, request: Any) -> None:
        with self.fake._lock:
            self.fake._connections.discard(request)
        super().shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Connection errors (clients going away, failed handshakes) are normal here."""


def _first(query: dict[str, list[str]]) -> dict[str, str]:
    return {k: v[0] for k, v in query.items() if v}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # headers and body leave in separate writes: with Nagle on, the body waits for the
    # client's delayed ACK (40 ms per answer), which no real API server makes anyone wait
    disable_nagle_algorithm = True
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the request log is `FakeApiServer.requests`."""

    def setup(self) -> None:
        super().setup()
        if isinstance(self.connection, ssl.SSLSocket):
            try:
                self.connection.do_handshake()
            except (ssl.SSLError, OSError):
                self.close_connection = True
                raise

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

    @property
    def fake(self) -> FakeApiServer:
        return self.server.fake

    # ------------------------------------------------------------------ plumbing
    def _body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _send_json(
        self,
        code: int,
        body: Obj,
        warnings: list[str] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        data = json.dumps(body).encode()
        self._record.code = code  # recorded before the client can read the answer
        self.send_response(code)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-cache, private")
        for warning in warnings or []:
            self.send_header("Warning", f'299 - "{warning.replace(chr(34), chr(92) + chr(34))}"')
        self.end_headers()
        self.wfile.write(data)

    def _fail(self, failure: err.ApiFailure) -> None:
        # as the API server: a Status asking to be retried later says so in Retry-After too
        retry = (failure.details or {}).get("retryAfterSeconds")
        extra = {"Retry-After": str(retry)} if isinstance(retry, int) and retry > 0 else None
        self._send_json(failure.code, failure.status(), headers=extra)

    def _user(self) -> str | None:
        """The authenticated user, "" when anonymous access is fine, None when refused."""
        auth = self.headers.get("Authorization") or ""
        if auth.startswith("Bearer "):
            return self.fake.tokens.get(auth[len("Bearer ") :].strip())
        if isinstance(self.connection, ssl.SSLSocket) and self.fake.client_certs:
            cert = self.connection.getpeercert()
            if cert:
                subject: Any = cert.get("subject", ())
                for rdn in subject:
                    for key, value in rdn:
                        if key == "commonName":
                            return str(value)
        if self.fake.tokens or self.fake.client_certs:
            return None
        return "system:anonymous"

    def _serve(self, method: str) -> None:
        parsed = urllib.parse.urlsplit(self.path)
        path = parsed.path.rstrip("/") or "/"
        query = _first(urllib.parse.parse_qs(parsed.query, keep_blank_values=True))
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
            self._openapi(path, query)
            return
        segments = [urllib.parse.unquote(s) for s in path.strip("/").split("/")]
        if segments[0] == "api":
            if len(segments) == 1:
                self._send_json(
                    200,
                    {
                        "kind": "APIVersions",
                        "versions": ["v1"],
                        "serverAddressByClientCIDRs": [
                            {
                                "clientCIDR": "0.0.0.0/0",
                                "serverAddress": f"127.0.0.1:{self.fake.port}",
                            }
                        ],
                    },
                )
                return
            group, version, rest = "", segments[1], segments[2:]
        elif segments[0] == "apis":
            if len(segments) == 1:
                self._send_json(200, self._group_list())
                return
            if len(segments) == 2:
                self._send_json(200, self._group(segments[1]))
                return
            group, version, rest = segments[1], segments[2], segments[3:]
        else:
            raise err.ApiFailure(
                404, "NotFound", "the server could not find the requested resource", {}
            )
        if not rest:
            self._send_json(200, self._resource_list(group, version))
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

    # ------------------------------------------------------------------ discovery
    def _group_entry(self, group: str, versions: list[str]) -> Obj:
        ordered = sorted(versions, key=_version_key)
        entries = [{"groupVersion": f"{group}/{v}", "version": v} for v in ordered]
        return {"name": group, "versions": entries, "preferredVersion": entries[0]}

    def _group_list(self) -> Obj:
        served = self.fake.cluster.group_versions()
        groups = [
            self._group_entry(g, served[g]) for g in self.fake.cluster.group_order if g in served
        ]
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}

    def _group(self, group: str) -> Obj:
        served = self.fake.cluster.group_versions()
        if group not in served:
            raise err.ApiFailure(
                404, "NotFound", "the server could not find the requested resource", {}
            )
        return {"kind": "APIGroup", "apiVersion": "v1", **self._group_entry(group, served[group])}

    def _resource_list(self, group: str, version: str) -> Obj:
        types = self.fake.cluster.resources_of(group, version)
        if not types:
            raise err.ApiFailure(
                404, "NotFound", "the server could not find the requested resource", {}
            )
        resources: list[Obj] = []
        for rt in types:
            entry: Obj = {
                "name": rt.plural,
                "singularName": rt.singular,
                "namespaced": rt.namespaced,
                "kind": rt.kind,
                "verbs": list(rt.verbs),
                "storageVersionHash": hashlib.sha256(
                    f"{rt.group}/{rt.plural}".encode()
                ).hexdigest()[:12],
            }
            if rt.short_names:
                entry["shortNames"] = list(rt.short_names)
            if rt.categories:
                entry["categories"] = list(rt.categories)
            resources.append(entry)
            for sub in sorted(rt.subresources):
                if sub == "eviction":
                    resources.append(
                        {
                            "name": f"{rt.plural}/eviction",
                            "singularName": "",
                            "namespaced": True,
                            "group": "policy",
                            "version": "v1",
                            "kind": "Eviction",
                            "verbs": ["create"],
                        }
                    )
                elif sub == "binding":
                    resources.append(
                        {
                            "name": f"{rt.plural}/binding",
                            "singularName": "",
                            "namespaced": True,
                            "kind": "Binding",
                            "verbs": ["create"],
                        }
                    )
                elif sub in ("status", "finalize"):
                    verbs = ["get", "patch", "update"] if sub == "status" else ["update"]
                    resources.append(
                        {
                            "name": f"{rt.plural}/{sub}",
                            "singularName": "",
                            "namespaced": rt.namespaced,
                            "kind": rt.kind,
                            "verbs": verbs,
                        }
                    )
        gv = f"{group}/{version}" if group else version
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": gv,
            "resources": resources,
        }

    def _openapi_doc(self, group: str, version: str) -> Obj:
        """A minimal OpenAPI v3 document: enough for kubectl to see that PATCH accepts the
        `fieldValidation` parameter (so it validates on the server, as with a real one)."""
        paths: Obj = {}
        prefix = f"/apis/{group}/{version}" if group else f"/api/{version}"
        for rt in self.fake.cluster.resources_of(group, version):
            item = (
                f"{prefix}/namespaces/{{namespace}}/{rt.plural}/{{name}}"
                if rt.namespaced
                else f"{prefix}/{rt.plural}/{{name}}"
            )
            operation = {
                "x-kubernetes-group-version-kind": {
                    "group": group,
                    "version": version,
                    "kind": rt.kind,
                },
                "parameters": [
                    {
                        "name": "fieldValidation",
                        "in": "query",
                        "schema": {"type": "string", "uniqueItems": True},
                    },
                    {
                        "name": "fieldManager",
                        "in": "query",
                        "schema": {"type": "string", "uniqueItems": True},
                    },
                ],
                "responses": {"200": {"description": "OK"}},
            }
            paths[item] = {"patch": operation}
        return {
            "openapi": "3.0.0",
            "info": {"title": "Kubernetes", "version": "v1.32.0"},
            "paths": paths,
            "components": {"schemas": {}},
        }

    def _openapi(self, path: str, query: dict[str, str]) -> None:
        if path == "/openapi/v3":
            paths: Obj = {}
            for group, versions in self.fake.cluster.group_versions().items():
                for version in versions:
                    key = f"apis/{group}/{version}" if group else f"api/{version}"
                    digest = hashlib.sha256(
                        json.dumps(self._openapi_doc(group, version), sort_keys=True).encode()
                    ).hexdigest()
                    paths[key] = {"serverRelativeURL": f"/openapi/v3/{key}?hash={digest[:32]}"}
            self._send_json(200, {"paths": paths})
            return
        match = re.match(r"^/openapi/v3/(?:api/(v\w+)|apis/([^/]+)/([^/]+))$", path)
        if match:
            group = match.group(2) or ""
            version = match.group(1) or match.group(3)
            if self.fake.cluster.resources_of(group, version):
                self._send_json(200, self._openapi_doc(group, version))
                return
        raise err.ApiFailure(
            404, "NotFound", "the server could not find the requested resource", {}
        )

    # ------------------------------------------------------------------ requests
    def _options(self, query: dict[str, str]) -> WriteOptions:
        validation = query.get("fieldValidation") or "Warn"
        if validation not in ("Strict", "Warn", "Ignore"):
            raise err.bad_request(
                f'fieldValidation must be one of "Strict", "Warn", "Ignore", got "{validation}"'
            )
        manager = query.get("fieldManager")
        if manager is None:
            agent = self.headers.get("User-Agent") or "unknown"
            manager = agent.split("/", 1)[0][:128]
        return WriteOptions(
            manager, validation, query.get("dryRun") == "All", query.get("force") in ("true", "1")
        )

    def _parse_json(self, body: bytes) -> Any:
        try:
            return json.loads(body or b"null")
        except ValueError as exc:
            raise err.bad_request(f"error decoding request body: {exc}") from None

    def _selectors(self, rt: ResourceType, query: dict[str, str]) -> tuple[Any, Any]:
        try:
            return (
                parse_label_selector(query.get("labelSelector")),
                parse_field_selector(query.get("fieldSelector"), rt.supports_field),
            )
        except SelectorError as exc:
            raise err.bad_request(str(exc)) from None

    def _wants_table(self) -> bool:
        return "as=Table" in (self.headers.get("Accept") or "")

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

    # ------------------------------------------------------------------ watch
    def _watch(self, target: Target, query: dict[str, str], labels: Any, fields: Any) -> None:
        cluster = self.fake.cluster
        rt = target.rt
        send_initial = query.get("sendInitialEvents") in ("true", "1")
        bookmarks = query.get("allowWatchBookmarks") in ("true", "1")
        if send_initial and (query.get("resourceVersionMatch") != "NotOlderThan" or not bookmarks):
            raise err.ApiFailure(
                422,
                "Invalid",
                'ListOptions.meta.k8s.io "" is invalid: '
                "resourceVersionMatch: Forbidden: sendInitialEvents requires "
                "setting resourceVersionMatch to NotOlderThan and "
                "allowWatchBookmarks to true",
            )
        timeout = self.fake.watch_timeout
        if query.get("timeoutSeconds"):
            timeout = float(query["timeoutSeconds"])
        as_table = self._wants_table()
        failure: err.ApiFailure | None = None
        try:
            watcher, initial, start = cluster.open_watch(
                rt,
                target.namespace,
                labels,
                fields,
                query.get("resourceVersion") or "",
                send_initial=send_initial,
            )
        except err.ApiFailure as exc:
            failure = exc
        # the watcher is registered before the answer starts: a client that has the headers
        # is watching
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Cache-Control", "no-cache, private")
        self.end_headers()
        self._record.code = 200
        self.close_connection = True
        if failure is not None:
            self._chunk({"type": "ERROR", "object": failure.status()})
            self._end_chunks()
            return
        connection = self.connection

        def cut() -> None:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)

        watcher.closers.append(cut)
        first = [True]

        def send(kind: str, obj: Obj) -> None:
            view = cluster.view(rt, obj)
            if as_table:
                view = table(
                    rt,
                    [view],
                    {"resourceVersion": view["metadata"]["resourceVersion"]},
                    query.get("includeObject") or "Metadata",
                    with_columns=first[0],
                )
                first[0] = False
            self._chunk({"type": kind, "object": view})

        try:
            for kind, obj in initial:
                send(kind, obj)
            if send_initial:
                self._bookmark(rt, start, initial_end=True)
            self._stream(watcher, send, bookmarks, time.monotonic() + timeout, timeout, rt, start)
        except (OSError, ValueError):
            cluster.close_watch(watcher)
            return
        finally:
            cluster.close_watch(watcher)

    def _stream(
        self,
        watcher: Watcher,
        send: Callable[[str, Obj], None],
        bookmarks: bool,
        deadline: float,
        timeout: float,
        rt: ResourceType,
        start: int,
    ) -> None:
        """Send the watcher's changes until `deadline`. As the API server's watch cache does:
        nothing at or below the version the watch started from (a server restored to an older
        state stays silent to a watch from a newer version, bookmarks included), a bookmark every
        `bookmark_interval` and one 2 s before the deadline (watches longer than 2 s)."""
        cluster = self.fake.cluster
        last_bookmark = time.monotonic()
        pre_deadline = deadline - 2.0 if timeout > 2.0 else None
        while not self.fake.stopping.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                change = watcher.queue.get(timeout=min(remaining, 0.1))
            except queue.Empty:
                change = False  # type: ignore[assignment]
            if change is None or watcher.dropped:
                if watcher.abrupt:
                    with contextlib.suppress(OSError):
                        self.connection.shutdown(socket.SHUT_RDWR)
                    return
                break
            if change and change.rv > start:
                event = watcher.translate(change)
                if event is not None:
                    send(*event)
            wanted = id(watcher) in self.fake._bookmark_now
            now = time.monotonic()
            due = now - last_bookmark >= self.fake.bookmark_interval
            if pre_deadline is not None and now >= pre_deadline:
                due, pre_deadline = True, None
            if bookmarks and (wanted or due):
                rv = cluster.bookmark_rv(watcher)
                if rv is not None and rv >= start:
                    self._bookmark(rt, rv)
                    self.fake._bookmark_now.discard(id(watcher))
                last_bookmark = now
            if self._client_gone():
                return
        self._end_chunks()

    def _client_gone(self) -> bool:
        sock = self.connection
        if isinstance(sock, ssl.SSLSocket):
            return False
        try:
            readable, _, _ = select.select([sock], [], [], 0)
            return bool(readable) and sock.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    def _bookmark(self, rt: ResourceType, rv: int, *, initial_end: bool = False) -> None:
        meta: Obj = {"resourceVersion": str(rv), "creationTimestamp": None}
        if initial_end:
            meta["annotations"] = {"k8s.io/initial-events-end": "true"}
        self._chunk(
            {
                "type": "BOOKMARK",
                "object": {"kind": rt.kind, "apiVersion": rt.api_version, "metadata": meta},
            }
        )

    def _chunk(self, event: Obj) -> None:
        data = json.dumps(event).encode() + b"\n"
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _end_chunks(self) -> None:
        with contextlib.suppress(OSError):
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()


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


@contextlib.contextmanager
def running(**kwargs: Any) -> Iterator[FakeApiServer]:
    """`with running() as api:` a started fake API server, stopped afterwards."""
    server = FakeApiServer(**kwargs).start()
    try:
        yield server
    finally:
        server.stop()
