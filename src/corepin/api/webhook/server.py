"""The webhook's HTTPS server: `POST` routes (`/validate`, `/mutate`) and `GET` pages
(`/healthz`, `/metrics`) on one TLS port.

```python
server = HttpsServer(":9443", ServingCertificate(cert, key), routes=app.routes(),
                     pages=ops.page)    # OpsServer.page: /healthz and /metrics
server.start()                          # loads the pair and binds: errors surface here (exit 4)
server.stop()                           # returns within about `timeout` seconds
```

The HTTP/1.1 server of `corepin.api.http` (keep-alive; an event loop reads requests, a few
worker threads answer whole ones) with what a server facing the API server needs:
- TLS with the certificate reloaded when its files change (`tls.ServingCertificate`); the
  handshake runs on the event loop, never on a thread of its own;
- a request body limit (`max_body`, default 3 MiB - the API server's own limit on a request
  body): a larger `Content-Length` gets 413 without the body being read (also instead of
  `100 Continue`), no `Content-Length` gets 411, a bad one 400. (The review of an UPDATE
  carries two pods; one so big that they pass 3 MiB is let through by failurePolicy Ignore.);
- timeouts: the handshake, head and body of a request must arrive whole within
  `read_timeout` (a deadline that a client trickling bytes cannot push back; 408 when it
  passes), a connection idle for `idle_timeout` between requests is closed; at most
  `max_connections` connections at once: a new one beyond that closes the oldest one that
  has not sent a whole request, so slow clients cannot lock the API server out;
- a route that raises is answered with 500 and logged; nothing a client sends stops the server,
  and a client that goes away is a debug line;
- `stop()` ends the accept loop and closes every open connection.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Final

from corepin.api.http import Limits, RequestHandler, ThreadedServer
from corepin.api.webhook.tls import ServingCertificate

log = logging.getLogger("corepin.api.webhook.server")

#: The API server refuses request bodies over 3 MiB; an AdmissionReview never needs more.
MAX_BODY: Final = 3 * 1024 * 1024
#: Seconds for the TLS handshake, and for a whole request body to arrive.
READ_TIMEOUT: Final = 10.0
#: Seconds a keep-alive connection may wait for its next request.
IDLE_TIMEOUT: Final = 30.0
MAX_CONNECTIONS: Final = 512
#: Threads answering whole requests (an answer is a few milliseconds of Python).
WORKERS: Final = 4
TEXT: Final = "text/plain; charset=utf-8"

Reply = tuple[int, bytes, str]
Route = Callable[[bytes], Reply]
Pages = Callable[[str, "str | None"], Reply]


class HttpsServer(ThreadedServer):
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
        workers: int = WORKERS,
    ) -> None:
        super().__init__(
            address,
            limits=Limits(
                request_timeout=read_timeout,
                idle_timeout=idle_timeout,
                max_connections=max_connections,
                workers=workers,
                max_body=max_body,
            ),
            tls=certificate.context,
        )
        self.certificate = certificate
        self.routes = dict(routes)
        self.pages = pages
        self.max_body = max_body
        self.read_timeout = read_timeout

    def start(self) -> None:
        """Load the certificate and bind (TLSFilesError or EnvironmentProblem, exit 4), then
        serve in a background thread."""
        if self._socket is None:  # (started twice: RuntimeError from ThreadedServer.start)
            self.certificate.load()
        super().start()

    def _handler(self) -> type[RequestHandler]:
        return _handler_for(self)


class _BodyError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _handler_for(owner: HttpsServer) -> type[RequestHandler]:
    class Handler(RequestHandler):
        error_content_type = TEXT
        error_message_format = "%(code)d %(message)s\n"

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
            body = self.rfile.read(length)  # (the server read it whole, within its deadline)
            if len(body) < length:
                raise _BodyError(400, "the connection closed in the middle of the body")
            return body

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
