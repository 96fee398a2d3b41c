"""HTTP(S) to the API server over the standard library: `http.client` connections from a small
keep-alive pool (one connection per request in flight, so threads share a Transport safely),
an `ssl` context built from the configuration (its `tls-server-name` as the TLS server name),
an http:// `proxy-url` reached with CONNECT, the credentials of the moment on every request
(an answer 401 makes them authenticate again once: an exec plugin runs again, a token file is
read again; then the request is sent again), and cancellation of a blocked request from another
thread (its socket is shut down).

Socket, TLS and protocol failures become `ApiUnreachable` here; HTTP answers are returned as
they are (the client maps failure statuses to typed errors).
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import os
import socket
import ssl
import tempfile
import threading
import urllib.parse
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from corepin.core.errors import ApiUnreachable, CorepinError, KubeConfigError
from corepin.kube.config import ClusterConfig

_IDEMPOTENT = frozenset({"GET", "HEAD", "PUT", "DELETE"})
_POOL_SIZE = 8
_MAX_LINE = 65537
# TCP keepalive on every connection to the API server: a peer that vanished without FIN/RST
# (a node or NAT gone) is found dead after about idle + interval * count = 30 s, also on a
# pooled connection nobody reads from. A middlebox that still answers TCP but forwards nothing
# is found by the read timeouts instead (watches: see KubeClient.watch).
KEEPALIVE_IDLE = 15
KEEPALIVE_INTERVAL = 5
KEEPALIVE_COUNT = 3


def keepalive(sock: socket.socket | None) -> None:
    """Turn TCP keepalive on for `sock` with the probes above (where the platform has them)."""
    if sock is None:
        return
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for name, value in (
            ("TCP_KEEPIDLE", KEEPALIVE_IDLE),
            ("TCP_KEEPINTVL", KEEPALIVE_INTERVAL),
            ("TCP_KEEPCNT", KEEPALIVE_COUNT),
        ):
            option = getattr(socket, name, None)
            if option is not None:
                sock.setsockopt(socket.IPPROTO_TCP, option, value)


class Cancelled(CorepinError):
    """The request was cancelled from another thread (a stop)."""

    default_reason = "cancelled"


class Cancel:
    """A cancellation token: `cancel()` aborts the requests it was passed to, now and later."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def cancel(self) -> None:
        self._event.set()
        with self._lock:
            sockets = list(self._sockets)
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def wait(self, seconds: float) -> bool:
        """Sleep up to `seconds`; True when cancelled meanwhile."""
        return self._event.wait(seconds)

    def _register(self, sock: socket.socket | None) -> None:
        if sock is None:
            return
        with self._lock:
            self._sockets.add(sock)
        if self._event.is_set():
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def _unregister(self, sock: socket.socket | None) -> None:
        if sock is None:
            return
        with self._lock:
            self._sockets.discard(sock)


@dataclass(frozen=True)
class Response:
    status: int
    reason: str
    headers: Mapping[str, str]
    body: bytes
    warnings: tuple[str, ...] = ()


def _ssl_context(config: ClusterConfig, cert: tuple[Path, Path] | None) -> ssl.SSLContext:
    """The TLS context for `config`; `cert`: the client certificate and key files the
    credentials hold now (else the configuration's own, if any)."""
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    try:
        if config.insecure_skip_tls_verify:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        elif config.ca_data is not None:
            ctx.load_verify_locations(cadata=config.ca_data.decode("ascii", "replace"))
        elif config.ca_file is not None:
            ctx.load_verify_locations(cafile=str(config.ca_file))
    except (OSError, ssl.SSLError) as exc:
        raise KubeConfigError(
            str(config.ca_file or config.source), f"cannot load the certificate authority: {exc}"
        ) from exc
    if cert is not None:
        try:
            ctx.load_cert_chain(str(cert[0]), str(cert[1]))
        except (OSError, ssl.SSLError) as exc:
            raise KubeConfigError(
                str(cert[0]), f"cannot load the client certificate/key: {exc}"
            ) from exc
    elif config.client_cert_file or config.client_cert_data:
        _load_client_cert(ctx, config)
    ctx.set_alpn_protocols(["http/1.1"])
    return ctx


def _load_client_cert(ctx: ssl.SSLContext, config: ClusterConfig) -> None:
    """Load the client certificate and key; `-data` is written to a private temporary file
    for the moment `ssl` reads it (it accepts only paths) and removed right after."""
    made: list[str] = []
    try:

        def as_path(data: bytes | None, path: Path | None, what: str) -> str:
            if data is None:
                if path is None:
                    raise KubeConfigError(config.source, f"client {what} missing")
                return str(path)
            fd, name = tempfile.mkstemp(prefix="corepin-kube-", suffix=".pem")
            made.append(name)
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
            return name

        cert = as_path(config.client_cert_data, config.client_cert_file, "certificate")
        key = as_path(config.client_key_data, config.client_key_file, "key")
        ctx.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise KubeConfigError(
            str(config.client_cert_file or config.source),
            f"cannot load the client certificate/key: {exc}",
        ) from exc
    finally:
        for name in made:
            with contextlib.suppress(OSError):
                os.unlink(name)


class _HTTPSConnection(http.client.HTTPSConnection):
    """An HTTPS connection whose TLS server name (SNI, and the name the certificate must
    carry) may differ from the host it connects to: the cluster's `tls-server-name`."""

    def __init__(
        self,
        host: str,
        port: int | None,
        *,
        timeout: float | None,
        context: ssl.SSLContext,
        server_name: str | None,
    ) -> None:
        super().__init__(host, port, timeout=timeout, context=context)
        self._corepin_context = context
        self._server_name = server_name

    def connect(self) -> None:
        if self._server_name is None:
            super().connect()
            return
        http.client.HTTPConnection.connect(self)
        self.sock = self._corepin_context.wrap_socket(self.sock, server_hostname=self._server_name)


@dataclass(frozen=True)
class _Proxy:
    host: str
    port: int
    headers: Mapping[str, str]


def _proxy(config: ClusterConfig) -> _Proxy | None:
    """The cluster's `proxy-url` (an http:// proxy, reached with CONNECT), or None."""
    if not config.proxy_url:
        return None
    parsed = urllib.parse.urlsplit(config.proxy_url)
    if parsed.scheme != "http" or not parsed.hostname:
        raise KubeConfigError(
            config.source,
            f"proxy-url {config.proxy_url!r}: corepin reaches the API through http:// proxies "
            "only (CONNECT)",
        )
    headers: dict[str, str] = {}
    if parsed.username is not None:
        user = urllib.parse.unquote(parsed.username)
        password = urllib.parse.unquote(parsed.password or "")
        headers["Proxy-Authorization"] = "Basic " + base64.b64encode(
            f"{user}:{password}".encode()
        ).decode("ascii")
    return _Proxy(parsed.hostname, parsed.port or 80, headers)


class Transport:
    """Requests to one API server. Thread-safe."""

    def __init__(
        self, config: ClusterConfig, *, timeout: float = 30.0, user_agent: str = "corepin"
    ) -> None:
        self.config = config
        self.timeout = timeout
        self.user_agent = user_agent
        parsed = urllib.parse.urlsplit(config.server)
        self.host = parsed.hostname or "localhost"
        self.port = parsed.port or (443 if config.https else 80)
        self.base_path = parsed.path.rstrip("/")
        self._proxy = _proxy(config)
        self._cert = config.client_certificate() if config.https else None
        self._ssl = _ssl_context(config, self._cert) if config.https else None
        self._lock = threading.Lock()
        self._idle: list[http.client.HTTPConnection] = []
        self._closed = False

    # ------------------------------------------------------------------ connections
    def _tls(self) -> ssl.SSLContext | None:
        """The TLS context, made again (and the pool emptied) when the credentials' client
        certificate changed (a plugin that hands out certificates ran again)."""
        if self._ssl is None or self.config.credentials is None:
            return self._ssl
        cert = self.config.client_certificate()
        if cert != self._cert:
            context = _ssl_context(self.config, cert)
            with self._lock:
                self._cert, self._ssl = cert, context
            self.drop_idle()
        return self._ssl

    def _connect(self, timeout: float | None) -> http.client.HTTPConnection:
        host, port = (self._proxy.host, self._proxy.port) if self._proxy else (self.host, self.port)
        context = self._tls()
        conn: http.client.HTTPConnection
        if context is not None:
            conn = _HTTPSConnection(
                host,
                port,
                timeout=timeout,
                context=context,
                server_name=self.config.tls_server_name,
            )
        else:
            conn = http.client.HTTPConnection(host, port, timeout=timeout)
        if self._proxy is not None:
            conn.set_tunnel(self.host, self.port, headers=dict(self._proxy.headers))
        return conn

    def _take(self, timeout: float | None) -> tuple[http.client.HTTPConnection, bool]:
        with self._lock:
            if self._idle:
                conn = self._idle.pop()
                if conn.sock is not None:
                    conn.sock.settimeout(timeout)
                return conn, True
        return self._connect(timeout), False

    def _give_back(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            if not self._closed and len(self._idle) < _POOL_SIZE:
                self._idle.append(conn)
                return
        conn.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    def drop_idle(self) -> int:
        """Close every pooled connection (returns how many). Called when a read timed out: a
        connection that went silent without FIN/RST (a proxy or NAT that lost it) rarely goes
        alone, and a request sent on one of its dead siblings would wait its whole timeout."""
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
        return len(idle)

    # ------------------------------------------------------------------ requests
    def url(self, path: str, query: Mapping[str, str] | None = None) -> str:
        full = self.base_path + path
        if query:
            full += "?" + urllib.parse.urlencode(query)
        return full

    def _headers(self, body: bytes | None, content_type: str | None, accept: str) -> dict[str, str]:
        headers = {"Accept": accept, "User-Agent": self.user_agent}
        authorization = self.config.authorization()
        if authorization:
            headers["Authorization"] = authorization
        if body is not None:
            headers["Content-Type"] = content_type or "application/json"
        return headers

    def _unreachable(self, exc: BaseException) -> ApiUnreachable:
        if isinstance(exc, ssl.SSLCertVerificationError):
            problem = f"TLS certificate not trusted ({exc.verify_message})"
        elif isinstance(exc, ssl.SSLError):
            problem = f"TLS failure ({exc.reason or exc})"
        elif isinstance(exc, ConnectionRefusedError):
            problem = "connection refused"
        elif isinstance(exc, TimeoutError | socket.timeout):
            problem = "timed out"
        elif isinstance(exc, OSError) and exc.strerror:
            problem = exc.strerror.lower()
        elif isinstance(exc, http.client.IncompleteRead):
            problem = "connection closed mid-answer"
        elif isinstance(exc, http.client.RemoteDisconnected):
            problem = "connection closed without an answer"
        else:
            problem = f"{type(exc).__name__}: {exc}"
        return ApiUnreachable(self.config.server, problem)

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: bytes | None = None,
        content_type: str | None = None,
        accept: str = "application/json",
        timeout: float | None = None,
        cancel: Cancel | None = None,
    ) -> Response:
        """One request, its whole answer read. Retries once on a pooled connection the
        server had closed (only when the request cannot have been applied twice), and once
        after a 401 when the credentials could be renewed (nothing was applied)."""
        args = (method, path, query, body, content_type, accept, timeout, cancel)
        response = self._request(*args)
        if response.status == 401 and self.config.refresh_credentials():
            response = self._request(*args)
        return response

    def _request(
        self,
        method: str,
        path: str,
        query: Mapping[str, str] | None,
        body: bytes | None,
        content_type: str | None,
        accept: str,
        timeout: float | None,
        cancel: Cancel | None,
    ) -> Response:
        target = self.url(path, query)
        headers = self._headers(body, content_type, accept)
        wait = self.timeout if timeout is None else timeout
        for attempt in (0, 1):
            if cancel is not None and cancel.cancelled:
                raise Cancelled("request cancelled")
            conn, reused = self._take(wait)
            sent = False
            try:
                if conn.sock is None:
                    conn.connect()
                    keepalive(conn.sock)
                if cancel is not None:
                    cancel._register(conn.sock)
                conn.request(method, target, body=body, headers=headers)
                sent = True
                answer = conn.getresponse()
                data = answer.read()
            except (OSError, http.client.HTTPException) as exc:
                conn.close()
                if cancel is not None and cancel.cancelled:
                    raise Cancelled("request cancelled") from exc
                if isinstance(exc, TimeoutError):
                    self.drop_idle()
                stale = reused and isinstance(
                    exc, http.client.RemoteDisconnected | BrokenPipeError | ConnectionResetError
                )
                if attempt == 0 and stale and (method in _IDEMPOTENT or not sent):
                    continue
                raise self._unreachable(exc) from exc
            finally:
                if cancel is not None:
                    cancel._unregister(conn.sock)
            response = Response(
                answer.status,
                answer.reason,
                dict(answer.getheaders()),
                data,
                tuple(v for k, v in answer.getheaders() if k.lower() == "warning"),
            )
            if answer.will_close:
                conn.close()
            else:
                self._give_back(conn)
            return response
        raise AssertionError("unreachable")  # pragma: no cover

    def stream(
        self,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        read_timeout: float | None = None,
        cancel: Cancel | None = None,
    ) -> Stream:
        """Open a streaming GET (a watch). The caller reads lines and must close it."""
        stream = self._stream(path, query, read_timeout, cancel)
        if stream.status == 401 and self.config.refresh_credentials():
            stream.close()
            stream = self._stream(path, query, read_timeout, cancel)
        return stream

    def _stream(
        self,
        path: str,
        query: Mapping[str, str] | None,
        read_timeout: float | None,
        cancel: Cancel | None,
    ) -> Stream:
        if cancel is not None and cancel.cancelled:
            raise Cancelled("request cancelled")
        conn = self._connect(read_timeout)
        try:
            conn.connect()
            keepalive(conn.sock)
            if cancel is not None:
                cancel._register(conn.sock)
            conn.request(
                "GET", self.url(path, query), headers=self._headers(None, None, "application/json")
            )
            answer = conn.getresponse()
        except (OSError, http.client.HTTPException) as exc:
            sock = conn.sock
            conn.close()
            if cancel is not None:
                cancel._unregister(sock)
                if cancel.cancelled:
                    raise Cancelled("request cancelled") from exc
            if isinstance(exc, TimeoutError):
                self.drop_idle()
            raise self._unreachable(exc) from exc
        return Stream(self, conn, answer, cancel)


class Stream:
    """An open streaming answer: `status`, then `lines()` until the server ends it."""

    def __init__(
        self,
        transport: Transport,
        conn: http.client.HTTPConnection,
        answer: http.client.HTTPResponse,
        cancel: Cancel | None,
    ) -> None:
        self._transport = transport
        self._conn = conn
        self._sock = conn.sock
        self._answer = answer
        self._cancel = cancel
        self.status = answer.status
        self.reason = answer.reason
        self.headers: dict[str, str] = dict(answer.getheaders())

    def read_all(self) -> bytes:
        try:
            return self._answer.read()
        except (OSError, http.client.HTTPException) as exc:
            raise self._transport._unreachable(exc) from exc

    def lines(self) -> Iterator[bytes]:
        """Lines of the answer; ends when the server ends the stream. A connection cut
        mid-stream raises ApiUnreachable (Cancelled when it was our own cancel).

        Chunked framing is decoded here rather than by `HTTPResponse.readline`, which reports
        a connection cut between chunks as a normal end of the answer."""
        try:
            if self._answer.chunked and self._answer.fp is not None:
                yield from self._chunked_lines(self._answer.fp)
                return
            while True:
                line = self._answer.readline()
                if not line:
                    break
                if line.strip():
                    yield line
        except (OSError, http.client.HTTPException, ValueError) as exc:
            if self._cancel is not None and self._cancel.cancelled:
                raise Cancelled("watch cancelled") from exc
            if isinstance(exc, TimeoutError):
                self._transport.drop_idle()
            raise self._transport._unreachable(exc) from exc
        if self._cancel is not None and self._cancel.cancelled:
            raise Cancelled("watch cancelled")

    @staticmethod
    def _chunked_lines(fp: BinaryIO) -> Iterator[bytes]:
        pending = b""
        while True:
            size_line = fp.readline(_MAX_LINE)
            if not size_line:
                raise http.client.IncompleteRead(pending)
            size = int(size_line.split(b";", 1)[0].strip() or b"x", 16)
            if size == 0:
                while fp.readline(_MAX_LINE) not in (b"\r\n", b"\n", b""):
                    pass
                if pending.strip():
                    yield pending
                return
            data = fp.read(size)
            if len(data) < size or fp.read(2) != b"\r\n":
                raise http.client.IncompleteRead(data)
            pending += data
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                if line.strip():
                    yield line + b"\n"

    def close(self) -> None:
        if self._cancel is not None:
            self._cancel._unregister(self._sock)
        with contextlib.suppress(OSError):
            if self._sock is not None:
                self._sock.shutdown(socket.SHUT_RDWR)
        self._answer.close()
        self._conn.close()
