"""The HTTP/1.1 server every corepin server is built on (`ThreadedServer`): the node
agent's, the controller's and the placement commands' health and metrics server
(`corepin.api.http.ops`), the webhook's and the extender's.

How a connection is served (`ThreadedServer`), so that slow or vanishing clients cost no
thread and never crowd out the ones that send a whole request:

- one event-loop thread (the standard library's asyncio) accepts connections, runs the TLS
  handshake when the server has a certificate, and reads each request - the head and a body
  of `Content-Length` bytes - into memory. A request must arrive whole within
  `Limits.request_timeout` (counted from the accept for a connection's first request,
  handshake included, and from the first byte for the next ones): a deadline for the whole
  request, which a client trickling a byte at a time cannot push back. A request cut off by
  it gets `408` and the connection is closed; a silent one is closed without an answer;
- only a complete request goes to a worker thread (at most `Limits.workers` of them), which
  runs the `BaseHTTPRequestHandler` subclass on the buffered bytes; the event loop writes the
  answer back (within `request_timeout`) and waits for the next request on a kept-alive
  connection (at most `Limits.idle_timeout`);
- at most `Limits.max_connections` connections are open at once: a new connection beyond it
  closes the oldest one that has not sent a whole request yet (a trickler, a silent or an idle
  keep-alive connection), never one whose request is being answered; when every connection is
  busy, the new one is closed;
- a head longer than `Limits.max_head` gets `431`; a body longer than `Limits.max_body`
  (or with no usable length) is never read: the handler answers from the head (413, 411...)
  and the connection is closed;
- a peer that resets, goes away or fails its handshake is one debug line, never a traceback.

Why asyncio and not a thread per connection: a thread per trickling client is 8 MiB of
address space and a scheduler entry each; a few thousand of them exhaust a container. asyncio
is in the standard library and does the non-blocking TLS handshake itself, so the images stay
free of a web framework, and the handlers keep the standard library's request parsing.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import socket
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Any, ClassVar, Final, Self

from corepin.core.errors import EnvironmentProblem, InputError

if TYPE_CHECKING:
    import ssl

#: Seconds a request may take to arrive whole (and an idle connection may wait, by default).
CONNECTION_TIMEOUT: Final = 5.0
#: Longest `stop()` waits for the serving thread.
STOP_TIMEOUT: Final = 3.0

log = logging.getLogger("corepin.api.http")


@dataclass(frozen=True)
class Limits:
    """What one client may cost a server (see the module docstring)."""

    #: seconds for a whole request (handshake, head and body) to arrive, and for its answer
    #: to be taken by the client
    request_timeout: float = CONNECTION_TIMEOUT
    #: seconds a kept-alive connection may wait for its next request
    idle_timeout: float = CONNECTION_TIMEOUT
    #: connections open at once (see the module docstring for what happens beyond)
    max_connections: int = 512
    #: worker threads answering complete requests
    workers: int = 4
    #: longest request head (request line and headers), bytes
    max_head: int = 64 * 1024
    #: longest body read, bytes
    max_body: int = 64 * 1024


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


def _listen(host: str, port: int, backlog: int) -> socket.socket:
    """A listening TCP socket (OSError when it cannot bind): `""` is every interface, IPv6 and
    IPv4 on one socket when the host has IPv6."""
    family, dual_stack = socket.AF_INET, False
    if not host:
        if socket.has_ipv6:
            family, host, dual_stack = socket.AF_INET6, "::", True
        else:
            host = "0.0.0.0"
    elif ":" in host:
        family = socket.AF_INET6
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if dual_stack:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind((host, port))
        sock.listen(backlog)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


class RequestHandler(BaseHTTPRequestHandler):
    """A `BaseHTTPRequestHandler` run on one request already read whole (`request` is its
    bytes): it answers into `wfile` (a buffer the event loop sends) and says in
    `close_connection` whether the connection ends after it. The server answered any
    `Expect: 100-continue` itself."""

    protocol_version = "HTTP/1.1"
    server_version = "corepin"
    request: bytes
    rfile: io.BytesIO
    wfile: io.BytesIO

    def setup(self) -> None:
        self.connection = None
        self.rfile = io.BytesIO(self.request)
        self.wfile = io.BytesIO()

    def handle(self) -> None:
        self.close_connection = True
        self.handle_one_request()

    def finish(self) -> None:
        """Nothing: the event loop sends `wfile` and keeps or closes the connection."""

    def handle_expect_100(self) -> bool:
        return True

    def version_string(self) -> str:
        return self.server_version

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("event=http client=%s %s", self.client_address[0], format % args)


def _reply(status: int, reason: str, text: str) -> bytes:
    """A whole answer the event loop sends itself (the connection is closed after it)."""
    body = f"{status} {text}\n".encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


class _Framing:
    """What the head of a request says about its body."""

    __slots__ = ("close", "continue_100", "length")

    def __init__(self, head: bytes, max_body: int) -> None:
        lengths: set[str] = set()
        chunked = False
        self.continue_100 = False
        for line in head.split(b"\n")[1:]:
            name, sep, value = line.partition(b":")
            if not sep:
                continue
            key = name.strip().lower()
            text = value.strip().decode("latin-1")
            if key == b"content-length":
                lengths.add(text)
            elif key == b"transfer-encoding":
                chunked = True
            elif key == b"expect":
                self.continue_100 = text.lower() == "100-continue"
        #: body bytes to read; None: none is read and the connection closes after the answer
        self.length: int | None = 0
        if chunked or len(lengths) > 1:
            self.length = None
        elif lengths:
            text = lengths.pop()
            if not text.isdigit() or len(text) > 18 or int(text) > max_body:
                self.length = None
            else:
                self.length = int(text)
        self.close = self.length is None


@dataclass(eq=False)
class _Connection:
    writer: asyncio.StreamWriter
    peer: str
    #: handshake | reading | idle (the oldest of these goes first when the server is full),
    #: busy (a request being answered)
    state: str = "reading"
    task: asyncio.Task[None] | None = field(default=None, repr=False)

    def abort(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.transport.abort()
        if self.task is not None:
            self.task.cancel()


class _PeerGone(Exception):
    """The connection ends: `why` is the one log line it is worth."""

    def __init__(self, why: str, answer: bytes = b"") -> None:
        super().__init__(why)
        self.why = why
        self.answer = answer


class ThreadedServer:
    """The lifecycle and connection handling of corepin's HTTP servers (this module's, the
    webhook's, the extender's): `start()` binds (EnvironmentProblem when it cannot) and serves
    from a background thread, `stop()` returns within about `timeout` seconds and closes every
    connection; `with server:` does both. See the module docstring for how clients are served.

    A subclass returns its `RequestHandler` class from `_handler()` and names itself in the
    class attributes (the URL scheme, the thread, what a bind failure says, the log line);
    `tls` is a callable giving the TLS context for each new connection (None: plain HTTP)."""

    scheme: ClassVar[str] = "http"
    thread_name: ClassVar[str]
    #: a bind failure says "cannot serve {serves} on ADDRESS: why", with `bind_reason`
    serves: ClassVar[str]
    bind_reason: ClassVar[str]
    #: once bound: `{serving_event} address=... port=...` on `logger`
    logger: ClassVar[logging.Logger]
    serving_event: ClassVar[str]
    backlog: ClassVar[int] = 128

    def __init__(
        self,
        address: str,
        *,
        limits: Limits | None = None,
        tls: Callable[[], ssl.SSLContext] | None = None,
    ) -> None:
        self.address = address
        self.host, self.requested_port = parse_address(address)
        self.limits = limits or Limits()
        self.tls = tls
        self._socket: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._live: dict[_Connection, None] = {}  # in the order they came
        self._handler_class: type[RequestHandler] | None = None
        #: connections closed to make room for a new one, and new ones closed (all busy)
        self.evicted = 0
        self.refused = 0

    def _handler(self) -> type[RequestHandler]:
        """The handler class of one request (built once per `start()`)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ lifecycle
    @property
    def port(self) -> int:
        """The bound port (the requested one, or the kernel's choice for port 0)."""
        if self._socket is None:
            raise RuntimeError("the server is not started")
        return int(self._socket.getsockname()[1])

    @property
    def url(self) -> str:
        host = self.host or "127.0.0.1"
        if ":" in host:
            host = f"[{host}]"
        scheme = self.scheme if self.tls is None else "https"
        return f"{scheme}://{host}:{self.port}"

    @property
    def connections(self) -> int:
        """Connections open now."""
        return len(self._live)

    def start(self) -> None:
        """Bind and serve in a background thread (EnvironmentProblem when it cannot bind)."""
        if self._socket is not None:
            raise RuntimeError("the server is already started")
        try:
            sock = _listen(self.host, self.requested_port, self.backlog)
        except OSError as exc:
            raise EnvironmentProblem(
                f"cannot serve {self.serves} on {self.address}: {exc.strerror or exc}",
                reason=self.bind_reason,
            ) from exc
        self._handler_class = self._handler()
        self._socket = sock
        self._pool = ThreadPoolExecutor(
            max_workers=self.limits.workers, thread_name_prefix=f"{self.thread_name}-worker"
        )
        loop = asyncio.new_event_loop()
        loop.set_exception_handler(_loop_error)
        self._loop = loop
        self._stopping = asyncio.Event()
        started = threading.Event()
        failure: list[BaseException] = []

        def serve() -> None:
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self._serve(sock, started, failure))
            finally:
                with contextlib.suppress(Exception):
                    loop.run_until_complete(loop.shutdown_asyncgens())
                loop.close()
                started.set()

        self._thread = threading.Thread(target=serve, name=self.thread_name, daemon=True)
        self._thread.start()
        started.wait(10)
        if failure:
            self.stop()
            raise EnvironmentProblem(
                f"cannot serve {self.serves} on {self.address}: {failure[0]}",
                reason=self.bind_reason,
            )
        self.logger.info("%s address=%s port=%d", self.serving_event, self.address, self.port)

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        """Stop serving, close every connection; returns within about `timeout` seconds."""
        loop, thread, stopping, sock, pool = (
            self._loop,
            self._thread,
            self._stopping,
            self._socket,
            self._pool,
        )
        if sock is None:
            return
        self._loop = self._thread = self._stopping = self._pool = None
        if loop is not None and stopping is not None:
            with contextlib.suppress(RuntimeError):  # the loop has ended already
                loop.call_soon_threadsafe(stopping.set)
        if thread is not None:
            thread.join(max(0.0, timeout))
        with contextlib.suppress(OSError):
            sock.close()
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ the event loop
    async def _serve(
        self, sock: socket.socket, started: threading.Event, failure: list[BaseException]
    ) -> None:
        try:
            server = await asyncio.start_server(
                self._accepted, sock=sock, limit=self.limits.max_head
            )
        except OSError as exc:
            failure.append(exc)
            started.set()
            return
        started.set()
        assert self._stopping is not None
        try:
            await self._stopping.wait()
        finally:
            server.close()
            for conn in list(self._live):
                conn.abort()
            self._live.clear()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 1.0)

    def _admit(self, conn: _Connection) -> bool:
        """Room for `conn`: closes the oldest waiting connection when the server is full;
        False (refused) when every open connection is busy."""
        if len(self._live) >= self.limits.max_connections:
            victim = next((c for c in self._live if c.state in ("handshake", "reading")), None)
            if victim is None:
                victim = next((c for c in self._live if c.state == "idle"), None)
            if victim is None:
                self.refused += 1
                log.debug("event=connection_refused reason=all_busy client=%s", conn.peer)
                return False
            self.evicted += 1
            log.debug(
                "event=connection_evicted client=%s state=%s (a new connection needed room)",
                victim.peer,
                victim.state,
            )
            self._live.pop(victim, None)
            victim.abort()
        self._live[conn] = None
        return True

    async def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer_info = writer.get_extra_info("peername")
        peer = str(peer_info[0]) if isinstance(peer_info, tuple) and peer_info else "?"
        conn = _Connection(writer, peer, "handshake" if self.tls is not None else "reading")
        conn.task = asyncio.current_task()
        if not self._admit(conn):
            writer.transport.abort()
            return
        why = "closed"
        try:
            await self._converse(conn, reader, writer)
        except _PeerGone as gone:
            why = gone.why
            if gone.answer:
                with contextlib.suppress(Exception):
                    writer.write(gone.answer)
        except asyncio.CancelledError:
            why = "closed by the server"
        except (OSError, EOFError, asyncio.IncompleteReadError) as exc:
            why = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        except Exception:  # a bug of ours: one traceback, the server goes on
            log.exception("event=connection_failed client=%s", peer)
            why = "internal error"
        finally:
            self._live.pop(conn, None)
            log.debug("event=connection_closed client=%s why=%s", peer, why)
            with contextlib.suppress(Exception):
                writer.close()
                await asyncio.wait_for(writer.wait_closed(), 0.5)
            with contextlib.suppress(Exception):
                writer.transport.abort()

    async def _converse(
        self, conn: _Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        limits = self.limits
        loop = asyncio.get_running_loop()
        deadline = loop.time() + limits.request_timeout
        if self.tls is not None:
            try:
                async with asyncio.timeout_at(deadline):
                    await writer.start_tls(self.tls())
            except TimeoutError:
                raise _PeerGone("no TLS handshake within the request timeout") from None
            except (OSError, ValueError) as exc:
                raise _PeerGone(f"TLS handshake failed: {exc}") from None
            conn.state = "reading"
        first = True
        while True:
            if not first:
                conn.state = "idle"
                try:
                    async with asyncio.timeout(limits.idle_timeout):
                        start = await reader.read(1)
                except TimeoutError:
                    raise _PeerGone("idle for the idle timeout") from None
                if not start:
                    return
                conn.state = "reading"
                deadline = loop.time() + limits.request_timeout
            else:
                start = b""
            request = await self._read_request(reader, writer, start, deadline)
            if request is None:
                return
            data, close = request
            conn.state = "busy"
            answer, handler_close = await loop.run_in_executor(
                self._pool, self._answer, data, conn.peer
            )
            writer.write(answer)
            try:
                async with asyncio.timeout(limits.request_timeout):
                    await writer.drain()
            except TimeoutError:
                raise _PeerGone("the answer was not taken within the request timeout") from None
            if close or handler_close:
                return
            first = False

    async def _read_request(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        start: bytes,
        deadline: float,
    ) -> tuple[bytes, bool] | None:
        """(the request's bytes, close after it), None at a clean end of the connection."""
        limits = self.limits
        lines: list[bytes] = []
        size = len(start)
        try:
            async with asyncio.timeout_at(deadline):
                while True:
                    try:
                        line = start + await reader.readuntil(b"\n")
                        start = b""
                    except asyncio.LimitOverrunError:
                        raise _PeerGone(
                            "request head too long",
                            _reply(431, "Request Header Fields Too Large", "head too long"),
                        ) from None
                    except asyncio.IncompleteReadError as exc:
                        if size or exc.partial:
                            raise _PeerGone("closed in the middle of a request") from None
                        return None
                    if not lines and line in (b"\r\n", b"\n"):
                        continue  # blank lines before a request line are allowed
                    lines.append(line)
                    size += len(line)
                    if size > limits.max_head:
                        raise _PeerGone(
                            "request head too long",
                            _reply(431, "Request Header Fields Too Large", "head too long"),
                        )
                    if len(lines) > 1 and line in (b"\r\n", b"\n"):
                        break
                head = b"".join(lines)
                framing = _Framing(head, limits.max_body)
                body = b""
                if framing.length:
                    if framing.continue_100 and not reader.at_eof():
                        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                    body = await reader.readexactly(framing.length)
        except TimeoutError:
            if size:
                raise _PeerGone(
                    "the request did not arrive within the request timeout",
                    _reply(408, "Request Timeout", "the request did not arrive in time"),
                ) from None
            raise _PeerGone("silent for the request timeout") from None
        return head + body, framing.close

    # ------------------------------------------------------------------ a worker thread
    def _answer(self, data: bytes, peer: str) -> tuple[bytes, bool]:
        """Run the handler on one request: (answer bytes, close the connection after it)."""
        handler_class = self._handler_class
        assert handler_class is not None
        try:
            handler = handler_class(data, (peer, 0), self)  # type: ignore[arg-type]
        except Exception:
            log.exception("event=handler_failed client=%s", peer)
            return _reply(500, "Internal Server Error", "internal error"), True
        return handler.wfile.getvalue(), bool(handler.close_connection)


def _loop_error(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """What asyncio would print as a traceback (a transport that failed, mostly a peer that
    went away): one debug line."""
    exc = context.get("exception")
    log.debug(
        "event=connection_error message=%s error=%s",
        context.get("message", ""),
        f"{type(exc).__name__}: {exc}" if exc is not None else "",
    )


__all__ = ["Limits", "RequestHandler", "ThreadedServer", "parse_address"]
