"""The HTTP endpoint of a long-running command (CONTRACTS 7.1): `GET /healthz` (200 when the
command says it is healthy, else 503; the body says what it is doing) and `GET /metrics`
(a `prometheus_client` registry in the text format, or OpenMetrics when asked for).

The standard library's threading HTTP server: two tiny endpoints scraped every few seconds
need no framework, and the server thread is stopped within a fraction of a second.
`parse_address` reads `HOST:PORT` (`:9465` = every interface, `[::1]:9465` for IPv6).
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from corepin.core.errors import EnvironmentProblem, InputError

log = logging.getLogger("corepin.api.http")

Health = Callable[[], tuple[bool, str]]


def parse_address(text: str, *, flag: str = "--metrics-address") -> tuple[str, int]:
    """`HOST:PORT` -> (host, port); an empty host means every interface. Port 0 picks one."""
    host, sep, port_text = text.rpartition(":")
    if not sep or not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise InputError(
            f"{flag} {text!r}: expected HOST:PORT with a port 0-65535 (e.g. :9465 or "
            "127.0.0.1:9465)",
            reason="bad_address",
        )
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise InputError(
            f"{flag} {text!r}: write an IPv6 address in brackets, e.g. [::1]:9465",
            reason="bad_address",
        )
    return host, int(port_text)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False

    def __init__(self, address: tuple[str, int], owner: HealthMetricsServer, family: int) -> None:
        self.address_family = family
        self.owner = owner
        super().__init__(address, _Handler, bind_and_activate=False)
        if family == socket.AF_INET6:
            with contextlib.suppress(OSError, AttributeError):
                self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        try:
            self.server_bind()
            self.server_activate()
        except BaseException:
            self.server_close()
            raise


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: probes and scrapes come every few seconds."""

    def _send(self, code: int, body: bytes, content_type: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        owner = self.server.owner
        if path == "/healthz":
            try:
                healthy, text = owner.health()
            except Exception as exc:  # a health callback must not take the server down
                healthy, text = False, f"health check failed: {exc}"
            body = f"{'ok' if healthy else 'unhealthy'}: {text}\n".encode()
            self._send(200 if healthy else 503, body, "text/plain; charset=utf-8")
        elif path == "/metrics" and owner.registry is not None:
            encoder, content_type = choose_encoder(self.headers.get("Accept") or "")
            self._send(200, encoder(owner.registry), content_type)
        else:
            self._send(404, b"not found: try /healthz or /metrics\n", "text/plain; charset=utf-8")


class HealthMetricsServer:
    """`GET /healthz` and `GET /metrics` on HOST:PORT, served from a daemon thread."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        health: Health,
        registry: CollectorRegistry | None,
    ) -> None:
        self.host = host
        self.port = port
        self.health = health
        self.registry = registry
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    def _bind(self) -> _Server:
        if self.host:
            try:
                infos = socket.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM)
            except socket.gaierror as exc:
                raise EnvironmentProblem(
                    f"cannot listen on {self.host}:{self.port}: unknown host ({exc.strerror})",
                    reason="listen_failed",
                ) from None
            family, _, _, _, sockaddr = infos[0]
            return _Server((str(sockaddr[0]), self.port), self, family)
        try:  # every interface: IPv6 and IPv4 on one socket where the host has IPv6
            return _Server(("::", self.port), self, socket.AF_INET6)
        except OSError:
            return _Server(("0.0.0.0", self.port), self, socket.AF_INET)

    def start(self) -> HealthMetricsServer:
        """Listen and serve; EnvironmentProblem (exit 4) when the address cannot be used."""
        try:
            self._server = self._bind()
        except OSError as exc:
            raise EnvironmentProblem(
                f"cannot listen on {self.host or '*'}:{self.port}: {exc.strerror or exc}",
                reason="listen_failed",
            ) from None
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.1},
            name="http-healthz-metrics",
            daemon=True,
        )
        self._thread.start()
        log.info("event=serving address=%s", self.address_text)
        return self

    @property
    def address(self) -> tuple[str, int]:
        """The address actually bound (the port chosen when 0 was asked)."""
        if self._server is None:
            return self.host, self.port
        bound = self._server.socket.getsockname()
        return str(bound[0]), int(bound[1])

    @property
    def address_text(self) -> str:
        host, port = self.address
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    def stop(self, timeout: float = 1.0) -> None:
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout)
        self._server = None
