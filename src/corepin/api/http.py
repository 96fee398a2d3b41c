"""The small HTTP server of every long-running command: `GET /healthz` and `GET /metrics`
(CONTRACTS 7.1) on `--metrics-address HOST:PORT`.

```python
server = OpsServer(":9464", metrics=registry)     # `:PORT` = every interface
server.start()                                    # binds now: errors surface here
server.set_ready(True)                            # /healthz: 503 until ready, then 200
...
server.stop()                                     # returns within about STOP_TIMEOUT seconds
```

- `/healthz`: 200 `ok` when ready, 503 `not ready` before (or after `set_ready(False)`);
  `ready` may also be a callable asked on every request.
- `/metrics`: the registry in Prometheus text format (OpenMetrics when the scraper's Accept
  header prefers it); HEAD works for both; anything else is 404, other methods 405.

Threaded (one thread per connection, daemon threads), with a per-connection socket timeout
so a stuck client never holds a thread or delays `stop()`. The standard library server is
enough for a scrape every few seconds and keeps the agent's image free of a web framework.
`ThreadedServer` is the start/stop lifecycle this server shares with the webhook's and the
extender's.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from socketserver import TCPServer
from typing import TYPE_CHECKING, Any, ClassVar, Final, Generic, Self, TypeVar

from corepin.core.errors import EnvironmentProblem, InputError

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

#: Seconds a connection may stay silent before the server drops it.
CONNECTION_TIMEOUT: Final = 5.0
#: Longest `stop()` waits for the serving thread.
STOP_TIMEOUT: Final = 3.0

log = logging.getLogger("corepin.api.http")

S = TypeVar("S", bound=TCPServer)


def parse_address(address: str) -> tuple[str, int]:
    """`HOST:PORT` -> (host, port); `:PORT` (empty host) means every interface ("");
    IPv6 hosts in brackets (`[::1]:9464`). InputError naming the address otherwise."""
    host, sep, port_text = address.rpartition(":")
    if not sep or not port_text.isdigit() or int(port_text) > 65535:
        raise InputError(
            f'bad address {address!r}: expected HOST:PORT (":9464" for every interface)',
            reason="bad_address",
        )
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise InputError(
            f"bad address {address!r}: write an IPv6 host in brackets ([::1]:9464)",
            reason="bad_address",
        )
    return host, int(port_text)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False

    def __init__(self, host: str, port: int, handler: type[BaseHTTPRequestHandler]) -> None:
        family = socket.AF_INET
        self._dual_stack = False
        if not host:  # every interface: IPv6 and IPv4 on one socket when the host has IPv6
            if socket.has_ipv6:
                family, host, self._dual_stack = socket.AF_INET6, "::", True
            else:
                host = "0.0.0.0"
        elif ":" in host:
            family = socket.AF_INET6
        self.address_family = family
        super().__init__((host, port), handler)

    def server_bind(self) -> None:
        if self._dual_stack:
            self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        super().server_bind()


class ThreadedServer(Generic[S]):
    """The lifecycle of corepin's HTTP servers (this module's, the webhook's, the extender's):
    `start()` binds (EnvironmentProblem when it cannot) and serves in a daemon thread,
    `stop()` returns within about `timeout` seconds; `with server:` does both.

    A subclass builds its socketserver in `_make_server()` and names itself in the class
    attributes (the URL scheme, the thread, what a bind failure says, the log line)."""

    scheme: ClassVar[str] = "http"
    thread_name: ClassVar[str]
    #: a bind failure says "cannot serve {serves} on ADDRESS: why", with `bind_reason`
    serves: ClassVar[str]
    bind_reason: ClassVar[str]
    #: once bound: `{serving_event} address=... port=...` on `logger`
    logger: ClassVar[logging.Logger]
    serving_event: ClassVar[str]

    def __init__(self, address: str) -> None:
        self.address = address
        self.host, self.requested_port = parse_address(address)
        self._server: S | None = None
        self._thread: threading.Thread | None = None

    def _make_server(self) -> S:
        """A new socketserver bound to `host`:`requested_port` (OSError when it cannot bind)."""
        raise NotImplementedError

    def _closed(self, server: S) -> None:
        """Called by `stop()` once the listening socket is closed (nothing here)."""

    @property
    def port(self) -> int:
        """The bound port (the requested one, or the kernel's choice for port 0)."""
        if self._server is None:
            raise RuntimeError("the server is not started")
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        host = self.host or "127.0.0.1"
        if ":" in host:
            host = f"[{host}]"
        return f"{self.scheme}://{host}:{self.port}"

    def start(self) -> None:
        """Bind and serve in a background thread (EnvironmentProblem when it cannot bind)."""
        if self._server is not None:
            raise RuntimeError("the server is already started")
        try:
            server = self._make_server()
        except OSError as exc:
            raise EnvironmentProblem(
                f"cannot serve {self.serves} on {self.address}: {exc.strerror or exc}",
                reason=self.bind_reason,
            ) from exc
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.2},
            name=self.thread_name,
            daemon=True,
        )
        self._thread.start()
        self.logger.info("%s address=%s port=%d", self.serving_event, self.address, self.port)

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        """Stop serving and close the socket; returns within about `timeout` seconds."""
        server, thread = self._server, self._thread
        if server is None:
            return
        self._server = self._thread = None
        stopper = threading.Thread(target=server.shutdown, daemon=True)
        stopper.start()
        stopper.join(timeout)
        server.server_close()
        self._closed(server)
        if thread is not None:
            thread.join(max(0.0, timeout))

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class OpsServer(ThreadedServer[_Server]):
    """`/healthz` and `/metrics` of one process (see the module docstring)."""

    thread_name = "corepin-http"
    serves = "/healthz and /metrics"
    bind_reason = "metrics_bind"
    logger = log
    serving_event = "http_serving"

    def __init__(
        self,
        address: str,
        *,
        metrics: CollectorRegistry | None = None,
        ready: bool | Callable[[], bool] = False,
    ) -> None:
        super().__init__(address)
        self.registry = metrics
        self._ready = ready

    def _make_server(self) -> _Server:
        return _Server(self.host, self.requested_port, _handler_for(self))

    # ------------------------------------------------------------------ readiness
    def set_ready(self, ready: bool | Callable[[], bool]) -> None:
        self._ready = ready

    @property
    def ready(self) -> bool:
        value = self._ready
        if callable(value):
            try:
                return bool(value())
            except Exception:  # a failing readiness check means: not ready
                log.exception("readiness_check_failed")
                return False
        return bool(value)

    # ------------------------------------------------------------------ pages
    def page(self, path: str, accept: str | None) -> tuple[int, bytes, str]:
        """(status, body, content type) for GET `path`."""
        path = path.split("?", 1)[0]
        if path == "/healthz":
            if self.ready:
                return 200, b"ok\n", "text/plain; charset=utf-8"
            return 503, b"not ready\n", "text/plain; charset=utf-8"
        if path == "/metrics":
            if self.registry is None:
                return 404, b"no metrics here\n", "text/plain; charset=utf-8"
            from corepin.api.metrics import render

            body, content_type = render(self.registry, accept)
            return 200, body, content_type
        return 404, b"not found: try /healthz or /metrics\n", "text/plain; charset=utf-8"


def _handler_for(ops: OpsServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        timeout = CONNECTION_TIMEOUT
        server_version = "corepin"
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # headers and body are two writes: no 40 ms stall

        def _answer(self, with_body: bool) -> None:
            try:
                status, body, content_type = ops.page(self.path, self.headers.get("Accept"))
            except Exception:
                log.exception("http_page_failed path=%s", self.path)
                status, body, content_type = 500, b"internal error\n", "text/plain"
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if with_body:
                self.wfile.write(body)

        def do_GET(self) -> None:
            self._answer(True)

        def do_HEAD(self) -> None:
            self._answer(False)

        def _not_allowed(self) -> None:
            body = b"method not allowed\n"
            self.send_response(405)
            self.send_header("Allow", "GET, HEAD")
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_POST = do_PUT = do_DELETE = do_PATCH = _not_allowed

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("http_request client=%s %s", self.client_address[0], format % args)

    return Handler
