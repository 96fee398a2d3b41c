"""The webhook's HTTPS server: `POST` routes (`/validate`, `/mutate`) and `GET` pages
(`/healthz`, `/metrics`) on one TLS port.

```python
server = HttpsServer(":9443", ServingCertificate(cert, key), routes=app.routes(),
                     pages=ops.page)    # OpsServer.page: /healthz and /metrics
server.start()                          # loads the pair and binds: errors surface here (exit 4)
server.stop()                           # returns within about `timeout` seconds
```

The standard library's threaded HTTP/1.1 server (keep-alive, one thread per connection) with
what a server facing the API server needs:
- TLS with the certificate reloaded when its files change (`tls.ServingCertificate`); the
  handshake runs on the connection's thread under `read_timeout`, never on the accept loop;
- a request body limit (`max_body`, default 3 MiB - the API server's own limit on a request
  body): a larger `Content-Length` gets 413 before the body is read (also instead of
  `100 Continue`), no `Content-Length` gets 411, a bad one 400. (The review of an UPDATE
  carries two pods; one so big that they pass 3 MiB is let through by failurePolicy Ignore.);
- timeouts: the whole body must arrive within `read_timeout`, a connection idle for
  `idle_timeout` between requests is closed; at most `max_connections` connections at once
  (more are closed at accept);
- a route that raises is answered with 500 and logged; nothing a client sends stops the server;
- `stop()` ends the accept loop and shuts down every open connection.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler
from typing import Any, Final

from corepin.api.http import ThreadedServer, _Server
from corepin.api.webhook.tls import ServingCertificate

log = logging.getLogger("corepin.api.webhook.server")

#: The API server refuses request bodies over 3 MiB; an AdmissionReview never needs more.
MAX_BODY: Final = 3 * 1024 * 1024
#: Seconds for the TLS handshake, and for a whole request body to arrive.
READ_TIMEOUT: Final = 10.0
#: Seconds a keep-alive connection may wait for its next request.
IDLE_TIMEOUT: Final = 30.0
MAX_CONNECTIONS: Final = 256
TEXT: Final = "text/plain; charset=utf-8"

Reply = tuple[int, bytes, str]
Route = Callable[[bytes], Reply]
Pages = Callable[[str, "str | None"], Reply]


class _TLSServer(_Server):
    """The threaded server of `corepin.api.http` with TLS and a connection count."""

    def __init__(self, owner: HttpsServer, host: str, port: int) -> None:
        self.owner = owner
        self._live: set[socket.socket] = set()
        self._live_lock = threading.Lock()
        super().__init__(host, port, _handler_for(owner))

    def get_request(self) -> tuple[Any, Any]:
        sock, address = super().get_request()
        sock.settimeout(self.owner.read_timeout)
        # answers go out at once: Nagle's wait for an ACK the client delays costs 40 ms
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            wrapped = self.owner.certificate.context().wrap_socket(
                sock, server_side=True, do_handshake_on_connect=False
            )
        except (OSError, ValueError):
            sock.close()
            raise
        return wrapped, address

    def verify_request(self, request: Any, client_address: Any) -> bool:
        with self._live_lock:
            if len(self._live) >= self.owner.max_connections:
                log.warning("event=connection_refused reason=too_many client=%s", client_address)
                return False
            self._live.add(request)
        return True

    def shutdown_request(self, request: Any) -> None:
        with self._live_lock:
            self._live.discard(request)
        super().shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("event=connection_error client=%s", client_address, exc_info=True)

    def close_all(self) -> None:
        with self._live_lock:
            live = list(self._live)
        for sock in live:
            with contextlib.suppress(OSError, ValueError):
                sock.shutdown(socket.SHUT_RDWR)

    @property
    def connections(self) -> int:
        with self._live_lock:
            return len(self._live)


class HttpsServer(ThreadedServer[_TLSServer]):
    """See the module docstring."""

    scheme = "https"
    thread_name = "corepin-webhook"
    serves = "HTTPS"
    bind_reason = "webhook_bind"
    logger = log
    serving_event = "event=serving"

    def __init__(
        self,
        address: str,
        certificate: ServingCertificate,
        *,
        routes: Mapping[str, Route],
        pages: Pages | None = None,
        max_body: int = MAX_BODY,
        read_timeout: float = READ_TIMEOUT,
        idle_timeout: float = IDLE_TIMEOUT,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        super().__init__(address)
        self.certificate = certificate
        self.routes = dict(routes)
        self.pages = pages
        self.max_body = max_body
        self.read_timeout = read_timeout
        self.idle_timeout = idle_timeout
        self.max_connections = max_connections

    @property
    def connections(self) -> int:
        """Connections open now."""
        return 0 if self._server is None else self._server.connections

    def start(self) -> None:
        """Load the certificate and bind (TLSFilesError or EnvironmentProblem, exit 4), then
        serve in a background thread."""
        if self._server is None:  # (started twice: RuntimeError from ThreadedServer.start)
            self.certificate.load()
        super().start()

    def _make_server(self) -> _TLSServer:
        return _TLSServer(self, self.host, self.requested_port)

    def _closed(self, server: _TLSServer) -> None:
        """`stop()` also shuts down every open connection."""
        server.close_all()


class _BodyError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _handler_for(owner: HttpsServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        timeout = owner.idle_timeout
        protocol_version = "HTTP/1.1"
        # headers and body leave in one write (one TLS record): the handler flushes after
        # every request
        wbufsize = 1 << 16
        error_content_type = TEXT
        error_message_format = "%(code)d %(message)s\n"
        _tls_ok = False

        # ------------------------------------------------------------ connection
        def setup(self) -> None:
            try:
                self.request.settimeout(owner.read_timeout)
                self.request.do_handshake()
                self._tls_ok = True
            except (OSError, ValueError) as exc:  # ssl.SSLError and timeouts are OSErrors
                log.debug("event=tls_handshake_failed client=%s error=%s", self.client_address, exc)
            super().setup()

        def handle(self) -> None:
            if self._tls_ok:
                super().handle()

        def version_string(self) -> str:
            return "corepin"

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("event=http client=%s %s", self.client_address[0], format % args)

        # ------------------------------------------------------------ replies
        def _reply(
            self, status: int, body: bytes, content_type: str, *, head: bool = False
        ) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            if self.close_connection:
                self.send_header("Connection", "close")
            self.end_headers()
            if not head:
                self.wfile.write(body)

        def _fail(self, status: int, message: str, *, close: bool = True) -> None:
            """An error reply; `close` when the request body was not read."""
            if close:
                self.close_connection = True
            self._reply(status, f"{message}\n".encode(), TEXT)

        # ------------------------------------------------------------ body
        def _length(self) -> int:
            if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
                raise _BodyError(411, "send the body with a Content-Length (no chunked encoding)")
            raw = self.headers.get("Content-Length")
            if raw is None:
                raise _BodyError(411, "a Content-Length is required")
            text = raw.strip()
            if not text.isdigit() or len(text) > 18:
                raise _BodyError(400, f"bad Content-Length {raw[:40]!r}")
            length = int(text)
            if length > owner.max_body:
                raise _BodyError(
                    413, f"the body is {length} bytes; the limit is {owner.max_body} bytes"
                )
            return length

        def handle_expect_100(self) -> bool:
            try:
                self._length()
            except _BodyError as exc:
                self._fail(exc.status, exc.message)
                return False
            return super().handle_expect_100()

        def _read_body(self, length: int) -> bytes:
            deadline = time.monotonic() + owner.read_timeout
            chunks: list[bytes] = []
            left = length
            try:
                while left > 0:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise TimeoutError
                    self.connection.settimeout(remaining)
                    chunk = self.rfile.read1(min(left, 1 << 16))
                    if not chunk:
                        raise _BodyError(400, "the connection closed in the middle of the body")
                    chunks.append(chunk)
                    left -= len(chunk)
            except TimeoutError:
                raise _BodyError(
                    408, f"the body did not arrive within {owner.read_timeout:g} s"
                ) from None
            finally:
                self.connection.settimeout(owner.idle_timeout)
            return b"".join(chunks)

        # ------------------------------------------------------------ methods
        def do_POST(self) -> None:
            path = self.path.split("?", 1)[0]
            route = owner.routes.get(path)
            try:
                length = self._length()
                if route is None:
                    self._fail(404, f"no such endpoint {path[:80]!r}: POST to /validate or /mutate")
                    return
                body = self._read_body(length)
            except _BodyError as exc:
                self._fail(exc.status, exc.message)
                return
            try:
                status, payload, content_type = route(body)
            except Exception:
                log.exception("event=route_failed path=%s", path)
                status, payload, content_type = 500, b"internal error\n", TEXT
            self._reply(status, payload, content_type)

        def _page(self, head: bool) -> None:
            if owner.pages is None:
                self._fail(404, "not found", close=False)
                return
            try:
                status, body, content_type = owner.pages(self.path, self.headers.get("Accept"))
            except Exception:
                log.exception("event=page_failed path=%s", self.path)
                status, body, content_type = 500, b"internal error\n", TEXT
            self._reply(status, body, content_type, head=head)

        def do_GET(self) -> None:
            self._page(False)

        def do_HEAD(self) -> None:
            self._page(True)

        def _not_allowed(self) -> None:
            self.close_connection = True
            body = b"method not allowed: POST /validate, POST /mutate, GET /healthz, GET /metrics\n"
            self.send_response(405)
            self.send_header("Allow", "GET, HEAD, POST")
            self.send_header("Content-Type", TEXT)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(body)

        do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_TRACE = do_CONNECT = _not_allowed

    return Handler
