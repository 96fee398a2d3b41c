"""The fake API server's HTTP plumbing: the stdlib `ThreadingHTTPServer` (TLS, client
certificates, the connections it holds) and the handler's common steps (JSON answers and
failures, the requesting user, write options, selectors, chunks of a stream).
"""

from __future__ import annotations

import contextlib
import json
import socket
import ssl
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from corepin.testing.fakeapi import errors as err
from corepin.testing.fakeapi.controls import FakeApiControls, RequestRecord
from corepin.testing.fakeapi.resources import ResourceType
from corepin.testing.fakeapi.selectors import (
    SelectorError,
    parse_field_selector,
    parse_label_selector,
)
from corepin.testing.fakeapi.store import Obj
from corepin.testing.fakeapi.writes import WriteOptions


@dataclass
class Target:
    """A parsed resource URL."""

    rt: ResourceType
    namespace: str | None
    name: str
    subresource: str


class ApiHttpServer(ThreadingHTTPServer):
    """The server: a thread per connection, TLS when the fake has certificates."""

    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True

    def __init__(
        self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], fake: FakeApiControls
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


def first_values(query: dict[str, list[str]]) -> dict[str, str]:
    return {k: v[0] for k, v in query.items() if v}


class HandlerBase(BaseHTTPRequestHandler):
    """One connection's requests; the steps every answer shares."""

    protocol_version = "HTTP/1.1"
    # headers and body leave in separate writes: with Nagle on, the body waits for the
    # client's delayed ACK (40 ms per answer), which no real API server makes anyone wait
    disable_nagle_algorithm = True
    server: ApiHttpServer
    _record: RequestRecord  # the request being answered

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

    @property
    def fake(self) -> FakeApiControls:
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

    def _chunk(self, event: Obj) -> None:
        data = json.dumps(event).encode() + b"\n"
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _end_chunks(self) -> None:
        with contextlib.suppress(OSError):
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
