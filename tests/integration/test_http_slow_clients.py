"""Slow and vanishing clients against corepin's HTTP servers (the shared connection handling
of `corepin.api.http`), over real sockets on loopback, bounded in count and time:

- a trickle attack (TLS connections sending a header line now and then) while a legitimate
  client still gets its answers;
- a whole-request deadline that a trickle cannot push back, TLS handshake included;
- the server's threads stay bounded under hundreds of open connections;
- peers that reset or go away leave no traceback on stderr or in the log.
"""

from __future__ import annotations

import contextlib
import http.client
import logging
import socket
import ssl
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from corepin.api.http import OpsServer
from corepin.api.webhook.app import AdmissionApp
from corepin.api.webhook.config import WebhookConfig
from corepin.api.webhook.server import HttpsServer
from corepin.api.webhook.tls import ServingCertificate
from corepin.testing.fakeapi import TLSMaterial, make_tls
from support.helpers import wait_for

#: how many slow connections an attack opens (bounded: the machine is shared)
ATTACK = 128


@pytest.fixture
def tls(tmp_path: Path) -> TLSMaterial:
    return make_tls(tmp_path / "tls")


def _webhook(tls: TLSMaterial, **options: object) -> HttpsServer:
    app = AdmissionApp(WebhookConfig())
    ops = OpsServer("127.0.0.1:0", ready=True)
    server = HttpsServer(
        "127.0.0.1:0",
        ServingCertificate(str(tls.server.cert), str(tls.server.key)),
        routes=app.routes(),
        pages=ops.page,
        **options,  # type: ignore[arg-type]
    )
    server.start()
    return server


def _client_context(tls: TLSMaterial) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(tls.ca.cert))


def _tls_socket(tls: TLSMaterial, port: int, timeout: float = 5.0) -> ssl.SSLSocket:
    raw = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    return _client_context(tls).wrap_socket(raw, server_hostname="127.0.0.1")


@contextlib.contextmanager
def trickling(tls: TLSMaterial, port: int, count: int, every: float) -> Iterator[list[int]]:
    """`count` TLS connections that each send a request line, then one header line every
    `every` seconds (never the blank line that ends the head); yields [lines sent]."""
    socks = []
    for _ in range(count):
        with contextlib.suppress(OSError):
            socks.append(_tls_socket(tls, port))
    sent = [0]
    stop = threading.Event()

    def trickle() -> None:
        for s in socks:
            with contextlib.suppress(OSError):
                s.sendall(b"POST /validate HTTP/1.1\r\n")
        while not stop.wait(every):
            for s in socks:
                with contextlib.suppress(OSError):
                    s.sendall(b"X-Slow: 1\r\n")
                    sent[0] += 1

    thread = threading.Thread(target=trickle, daemon=True)
    thread.start()
    try:
        yield sent
    finally:
        stop.set()
        thread.join(5)
        for s in socks:
            s.close()


def test_a_trickle_attack_does_not_lock_out_a_legitimate_client(tls: TLSMaterial) -> None:
    # the connection limit is below the attack, as a real one would be below a bigger attack
    server = _webhook(tls, max_connections=ATTACK // 2, read_timeout=10.0)
    try:
        with trickling(tls, server.port, ATTACK, every=0.5) as sent:
            wait_for(lambda: sent[0] >= ATTACK, timeout=10, what="the trickle to start")
            for _ in range(5):
                conn = http.client.HTTPSConnection(
                    "127.0.0.1", server.port, context=_client_context(tls), timeout=3
                )
                conn.request("GET", "/healthz")
                assert conn.getresponse().status == 200
                conn.close()
                time.sleep(0.3)
            assert server.connections <= ATTACK // 2
    finally:
        server.stop()


def test_a_trickled_head_is_cut_off_at_the_request_deadline(tls: TLSMaterial) -> None:
    server = _webhook(tls, read_timeout=2.0, idle_timeout=30.0)
    try:
        sock = _tls_socket(tls, server.port, timeout=10)
        sock.sendall(b"POST /validate HTTP/1.1\r\n")
        sock.settimeout(0.3)
        started = time.monotonic()
        got = b""
        while time.monotonic() - started < 8 and not got:
            with contextlib.suppress(OSError):
                sock.sendall(b"X-Slow: 1\r\n")  # a line every 0.3 s: each read is quick
            try:
                got = sock.recv(4096)
            except TimeoutError:
                continue
            except OSError:
                break
        # the head did not arrive whole within 2 s: 408, then closed
        assert got.startswith(b"HTTP/1.1 408"), got[:80]
        assert time.monotonic() - started < 5
        sock.close()
    finally:
        server.stop()


def _client_hello() -> bytes:
    """The first flight of a TLS client, as bytes to trickle."""
    context = ssl.create_default_context()
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname="localhost")
    with contextlib.suppress(ssl.SSLWantReadError):
        tls.do_handshake()
    hello = outgoing.read()
    assert hello[:1] == b"\x16"  # a handshake record
    return hello


def test_a_trickled_tls_handshake_is_cut_off_at_the_request_deadline(tls: TLSMaterial) -> None:
    server = _webhook(tls, read_timeout=2.0, idle_timeout=30.0)
    try:
        hello = _client_hello()
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        sock.settimeout(0.25)
        started = time.monotonic()
        closed = False
        for i in range(len(hello) - 1):  # one byte every 0.25 s, never the whole hello
            try:
                sock.sendall(hello[i : i + 1])
                closed = sock.recv(100) == b""
            except TimeoutError:
                continue
            except OSError:
                closed = True
            if closed or time.monotonic() - started > 8:
                break
        assert closed
        assert time.monotonic() - started < 5
        sock.close()
    finally:
        server.stop()


def _threads() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise AssertionError("no Threads: line in /proc/self/status")


def test_hundreds_of_idle_connections_cost_no_thread_each() -> None:
    with OpsServer("127.0.0.1:0", ready=True) as server:
        # warm: the workers that answering needs exist already
        for _ in range(3):
            conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
            conn.request("GET", "/healthz")
            assert conn.getresponse().status == 200
            conn.close()
        before = _threads()
        socks = []
        try:
            for _ in range(60):
                s = socket.create_connection(("127.0.0.1", server.port), timeout=5)
                s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                reply = http.client.HTTPResponse(s)
                reply.begin()  # answered: the server holds the connection
                assert reply.status == 200
                reply.read()
                s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # never finished
                socks.append(s)
            during = _threads()
        finally:
            for s in socks:
                s.close()
        # the OpsServer keeps 64 connections at most: a 65th would close the oldest
        assert during - before <= 2, (before, during)


def _reset(sock: socket.socket) -> None:
    """Close with a TCP reset (SO_LINGER 0)."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def test_peers_that_reset_leave_no_traceback(
    tls: TLSMaterial, capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    ops = OpsServer("127.0.0.1:0", ready=True)
    ops.start()
    hook = _webhook(tls)
    try:
        for _ in range(5):
            # reset in the middle of a request head
            s = socket.create_connection(("127.0.0.1", ops.port), timeout=5)
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
            time.sleep(0.05)
            _reset(s)
            # reset before the answer is read (big enough not to fit a socket buffer)
            s = socket.create_connection(("127.0.0.1", ops.port), timeout=5)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n" * 50)
            time.sleep(0.05)
            _reset(s)
            # the same over TLS, and a reset in the middle of the handshake
            t = _tls_socket(tls, hook.port)
            t.sendall(b"POST /validate HTTP/1.1\r\nContent-Length: 10\r\n\r\n{")
            time.sleep(0.05)
            _reset(t)
            raw = socket.create_connection(("127.0.0.1", hook.port), timeout=5)
            raw.sendall(_client_hello()[:20])
            time.sleep(0.05)
            _reset(raw)
        time.sleep(0.3)
        for port in (ops.port,):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", "/healthz")
            assert conn.getresponse().status == 200  # and the server goes on
            conn.close()
    finally:
        hook.stop()
        ops.stop()
    err = capfd.readouterr().err
    assert "Traceback" not in err, err[-2000:]
    loud = [r for r in caplog.records if r.exc_info or r.levelno >= logging.WARNING]
    assert not loud, [r.getMessage() for r in loud]
    assert any("connection_closed" in r.getMessage() for r in caplog.records)
