"""The HTTP endpoint of every long-running command (CONTRACTS 7.1): `GET /healthz` and
`GET /metrics` on `--metrics-address HOST:PORT`.

```python
server = OpsServer(":9465", metrics=registry, ready=lambda: healthy())
server.start()        # binds now: an address in use is an EnvironmentProblem (exit 4)
...
server.stop()
```

- `/healthz`: 200 `ok` while `ready` (a bool, or a callable asked on every request), else 503
  `not ready`;
- `/metrics`: the registry in the Prometheus text format, or OpenMetrics when the scraper's
  Accept header asks for it; HEAD works for both; other paths 404, other methods 405.

The standard library's threading server (daemon threads, a socket timeout per connection so a
silent client never holds a thread): a scrape every few seconds needs no web framework.
This is the same interface as the `OpsServer` the node agent's branch brought in, so either
file serves both commands.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any, Final

from corepin.core.errors import EnvironmentProblem, InputError

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

#: Seconds a connection may stay silent before the server drops it.
CONNECTION_TIMEOUT: Final = 5.0
#: Longest `stop()` waits for the serving thread.
STOP_TIMEOUT: Final = 3.0

log = logging.getLogger("corepin.api.http")

_TEXT: Final = "text/plain; charset=utf-8"


def parse_address(address: str) -> tuple[str, int]:
    """`HOST:PORT` -> (host, port); an empty host (`:9465`) means every interface, an IPv6
    host goes in brackets (`[::1]:9465`), port 0 lets the kernel choose. InputError naming the
    address otherwise."""
    host, sep, port_text = address.rpartition(":")
    if not sep or not port_text.isdigit() or int(port_text) > 65535:
        raise InputError(
            f'bad address {address!r}: expected HOST:PORT (":9465" for every interface)',
            reason="bad_address",
        )
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise InputError(
            f"bad address {address!r}: write an IPv6 host in brackets ([::1]:9465)",
            reason="bad_address",
        )
    return host, int(port_text)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False

    def __init__(self, host: str, port: int, handler: type[BaseHTTPRequestHandler]) -> None:
        self._dual_stack = False
        family = socket.AF_INET
        if not host:  # every interface: one socket for IPv6 and IPv4 where the host has IPv6
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


class OpsServer:
    """`/healthz` and `/metrics` of one process (see the module docstring)."""

    def __init__(
        self,
        address: str,
        *,
        metrics: CollectorRegistry | None = None,
        ready: bool | Callable[[], bool] = False,
    ) -> None:
        self.address = address
        self.host, self.requested_port = parse_address(address)
        self.registry = metrics
        self._ready = ready
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ readiness
    def set_ready(self, ready: bool | Callable[[], bool]) -> None:
        self._ready = ready

    @property
    def ready(self) -> bool:
        value = self._ready
        if not callable(value):
            return bool(value)
        try:
            return bool(value())
        except Exception:  # a readiness check that fails means: not ready
            log.exception("event=readiness_check_failed")
            return False

    # ------------------------------------------------------------------ lifecycle
    @property
    def port(self) -> int:
        """The port bound (the one asked for, or the kernel's choice for 0)."""
        if self._server is None:
            raise RuntimeError("the server is not started")
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        host = self.host or "127.0.0.1"
        return f"http://[{host}]:{self.port}" if ":" in host else f"http://{host}:{self.port}"

    def start(self) -> None:
        """Bind, then serve from a daemon thread (EnvironmentProblem when it cannot bind)."""
        if self._server is not None:
            raise RuntimeError("the server is already started")
        try:
            server = _Server(self.host, self.requested_port, _handler_for(self))
        except OSError as exc:
            raise EnvironmentProblem(
                f"cannot serve /healthz and /metrics on {self.address}: {exc.strerror or exc}",
                reason="metrics_bind",
            ) from exc
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.2},
            name="corepin-http",
            daemon=True,
        )
        self._thread.start()
        log.info("http_serving address=%s port=%d", self.address, self.port)

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        """Stop serving and close the socket, within about `timeout` seconds."""
        server, thread = self._server, self._thread
        if server is None:
            return
        self._server = self._thread = None
        closer = threading.Thread(target=server.shutdown, daemon=True)
        closer.start()
        closer.join(timeout)
        server.server_close()
        if thread is not None:
            thread.join(max(0.0, timeout))

    def __enter__(self) -> OpsServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ pages
    def page(self, path: str, accept: str | None) -> tuple[int, bytes, str]:
        """(status, body, content type) of GET `path`."""
        path = path.split("?", 1)[0]
        if path == "/healthz":
            return (200, b"ok\n", _TEXT) if self.ready else (503, b"not ready\n", _TEXT)
        if path == "/metrics":
            if self.registry is None:
                return 404, b"no metrics here\n", _TEXT
            from prometheus_client.exposition import choose_encoder

            encoder, content_type = choose_encoder(accept or "")
            return 200, encoder(self.registry), content_type
        return 404, b"not found: try /healthz or /metrics\n", _TEXT


def _handler_for(ops: OpsServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        timeout = CONNECTION_TIMEOUT
        server_version = "corepin"
        protocol_version = "HTTP/1.1"

        def _answer(self, with_body: bool) -> None:
            try:
                status, body, content_type = ops.page(self.path, self.headers.get("Accept"))
            except Exception:
                log.exception("event=http_page_failed path=%s", self.path)
                status, body, content_type = 500, b"internal error\n", _TEXT
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
            self.send_header("Content-Type", _TEXT)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_POST = do_PUT = do_DELETE = do_PATCH = _not_allowed

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("event=http_request client=%s %s", self.client_address[0], format % args)

    return Handler
