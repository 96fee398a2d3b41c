"""corepin.api.webhook.server, tls and app: the webhook over real HTTPS on loopback, with
certificates made at test time (a CA and a server certificate per test,
`corepin.testing.fakeapi.make_tls`).

Keep-alive, /healthz and /metrics on the TLS port, the body limit and the timeouts, fuzzed
bodies (wrong types, missing fields, huge arrays, invalid UTF-8, deep nesting, 10 MB) that get
a 4xx or an AdmissionReview and never a 5xx, a crash or a hang, certificate rotation picked up
without a restart, and a stop that closes open connections.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import shutil
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corepin.api.http import OpsServer
from corepin.api.webhook.app import AdmissionApp
from corepin.api.webhook.config import WebhookConfig
from corepin.api.webhook.metrics import WebhookMetrics
from corepin.api.webhook.server import HttpsServer
from corepin.api.webhook.tls import ServingCertificate, TLSFilesError
from corepin.core.errors import EnvironmentProblem
from corepin.testing.fakeapi import TLSMaterial, make_tls
from support import strategies
from support.budget import examples
from support.helpers import wait_for
from support.pods import EXCLUSIVE, container, pod
from support.webhook_helpers import review

Obj = dict[str, Any]
UID = "705ab4f5-6393-11e8-b7cc-42010a800002"


class Webhook:
    """A started HttpsServer with the admission app, and clients that trust its CAs."""

    def __init__(self, cert: Path, key: Path, cas: list[Path], **options: Any) -> None:
        self.metrics = WebhookMetrics()
        self.certificate = ServingCertificate(
            str(cert), str(key), check_interval=0.05, on_reload=self.metrics.tls_reload
        )
        app = AdmissionApp(WebhookConfig(), metrics=self.metrics)
        ops = OpsServer("127.0.0.1:0", metrics=self.metrics.registry, ready=True)
        routes = options.pop("routes", app.routes())
        self.server = HttpsServer(
            "127.0.0.1:0", self.certificate, routes=routes, pages=ops.page, **options
        )
        self.cas = cas
        self.server.start()

    @property
    def port(self) -> int:
        return self.server.port

    def context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.cas[0]))
        for ca in self.cas[1:]:
            ctx.load_verify_locations(cafile=str(ca))
        return ctx

    def connection(self, timeout: float = 10.0) -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection(
            "127.0.0.1", self.port, context=self.context(), timeout=timeout
        )

    def tls_socket(self, timeout: float = 10.0) -> ssl.SSLSocket:
        raw = socket.create_connection(("127.0.0.1", self.port), timeout=timeout)
        return self.context().wrap_socket(raw, server_hostname="127.0.0.1")

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
        conn: http.client.HTTPSConnection | None = None,
    ) -> tuple[int, bytes, http.client.HTTPResponse]:
        own = conn is None
        conn = conn or self.connection()
        try:
            conn.request(method, path, body=body, headers=headers or {})
            response = conn.getresponse()
            data = response.read()
            return response.status, data, response
        finally:
            if own:
                conn.close()

    def stop(self) -> None:
        self.server.stop()


@pytest.fixture
def tls(tmp_path: Path) -> TLSMaterial:
    return make_tls(tmp_path / "tls")


@pytest.fixture
def webhook(tls: TLSMaterial) -> Iterator[Webhook]:
    hook = Webhook(tls.server.cert, tls.server.key, [tls.ca.cert], read_timeout=2.0)
    yield hook
    hook.stop()


def body_of(obj: Obj | None, **kw: Any) -> bytes:
    return json.dumps(review(obj, **kw)).encode()


def metric(hook: Webhook, name: str, **labels: str) -> float:
    value = hook.metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


# ---------------------------------------------------------------------- the endpoints
def test_validate_and_mutate_answer_admission_reviews_over_one_kept_alive_connection(
    webhook: Webhook,
) -> None:
    conn = webhook.connection()
    headers = {"Content-Type": "application/json"}
    good = body_of(pod("web-0", container("app", "2"), annotations=EXCLUSIVE))
    bad = body_of(pod("web-0", container("app", "1500m"), annotations=EXCLUSIVE))
    status, data, _ = webhook.request("POST", "/validate", good, headers, conn)
    first_socket = conn.sock
    assert status == 200
    assert json.loads(data) == {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": {"uid": UID, "allowed": True},
    }
    status, data, response = webhook.request("POST", "/validate", bad, headers, conn)
    assert status == 200 and response.getheader("Content-Type") == "application/json"
    assert json.loads(data)["response"]["status"]["code"] == 403
    status, data, _ = webhook.request("POST", "/mutate?timeout=5s", good, headers, conn)
    answer = json.loads(data)["response"]
    assert status == 200 and answer["patchType"] == "JSONPatch"
    assert conn.sock is first_socket  # the same TLS connection all along
    conn.close()
    assert metric(webhook, "corepin_webhook_requests_total", endpoint="validate", outcome="allowed")
    assert metric(webhook, "corepin_webhook_requests_total", endpoint="validate", outcome="denied")
    assert metric(webhook, "corepin_webhook_requests_total", endpoint="mutate", outcome="patched")


def test_healthz_and_metrics_are_served_on_the_tls_port(webhook: Webhook) -> None:
    webhook.request("POST", "/validate", b"{}")
    status, data, _ = webhook.request("GET", "/healthz")
    assert (status, data) == (200, b"ok\n")
    status, data, response = webhook.request("GET", "/metrics")
    assert status == 200 and response.getheader("Content-Type").startswith("text/plain")
    text = data.decode()
    assert 'corepin_webhook_requests_total{endpoint="validate",outcome="bad_request"} 1.0' in text
    assert "corepin_webhook_request_duration_seconds_bucket" in text
    status, data, _ = webhook.request("HEAD", "/healthz")
    assert status == 200 and data == b""


def test_plain_http_to_the_tls_port_gets_nothing_useful(webhook: Webhook) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", webhook.port, timeout=5)
    with pytest.raises((ConnectionError, http.client.HTTPException, OSError)):
        conn.request("GET", "/healthz")
        conn.getresponse().read()
    conn.close()
    assert webhook.request("GET", "/healthz")[0] == 200


@pytest.mark.parametrize(
    ("method", "path", "headers", "body", "status"),
    [
        ("POST", "/admit", {}, b"{}", 404),
        ("PUT", "/validate", {}, b"{}", 405),
        ("DELETE", "/mutate", {}, None, 405),
        ("GET", "/nothing", {}, None, 404),
        ("POST", "/validate", {"Content-Length": "12x"}, None, 400),
        ("POST", "/validate", {"Content-Length": "-1"}, None, 400),
        ("POST", "/validate", {"Content-Length": "99999999999999999999999"}, None, 400),
        ("POST", "/validate", {"Content-Length": str(3 * 1024 * 1024 + 1)}, None, 413),
        ("POST", "/validate", {"Transfer-Encoding": "chunked"}, None, 411),
    ],
)
def test_requests_outside_the_api_get_4xx(
    webhook: Webhook,
    method: str,
    path: str,
    headers: dict[str, str],
    body: bytes | None,
    status: int,
) -> None:
    sock = webhook.tls_socket()
    lines = [f"{method} {path} HTTP/1.1", "Host: x"] + [f"{k}: {v}" for k, v in headers.items()]
    if body is not None:
        lines.append(f"Content-Length: {len(body)}")
    sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + (body or b""))
    reply = http.client.HTTPResponse(sock)  # type: ignore[arg-type]
    reply.begin()
    assert reply.status == status
    reply.read()
    sock.close()


def test_a_post_without_content_length_gets_411(webhook: Webhook) -> None:
    sock = webhook.tls_socket()
    sock.sendall(b"POST /validate HTTP/1.1\r\nHost: x\r\n\r\n")
    reply = http.client.HTTPResponse(sock)  # type: ignore[arg-type]
    reply.begin()
    assert reply.status == 411 and reply.getheader("Connection") == "close"
    sock.close()


def test_a_route_that_raises_gets_500_and_the_server_goes_on(tls: TLSMaterial) -> None:
    def broken(body: bytes) -> tuple[int, bytes, str]:
        raise RuntimeError("bug")

    hook = Webhook(tls.server.cert, tls.server.key, [tls.ca.cert], routes={"/validate": broken})
    try:
        assert hook.request("POST", "/validate", b"{}")[0] == 500
        assert hook.request("GET", "/healthz")[0] == 200
    finally:
        hook.stop()


# ---------------------------------------------------------------------- fuzzed bodies
def nested(depth: int) -> bytes:
    return b'{"a":' * depth + b"1" + b"}" * depth


def with_request(request: object) -> bytes:
    return json.dumps(
        {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
    ).encode()


FUZZ = {
    "empty": b"",
    "null": b"null",
    "a number": b"42",
    "a string": b'"AdmissionReview"',
    "a list": b"[1, 2, 3]",
    "no request": b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}',
    "request a list": with_request([]),
    "uid a number": with_request({"uid": 5}),
    "object a number": with_request(
        {"uid": "u", "operation": "CREATE", "object": 5, "resource": {"resource": "pods"}}
    ),
    "containers a string": with_request(
        {
            "uid": "u",
            "operation": "CREATE",
            "resource": {"resource": "pods"},
            "object": {"metadata": {"annotations": EXCLUSIVE}, "spec": {"containers": "app"}},
        }
    ),
    "resources wrong types": with_request(
        {
            "uid": "u",
            "operation": "CREATE",
            "resource": {"resource": "pods"},
            "object": {
                "metadata": {"annotations": EXCLUSIVE},
                "spec": {"containers": [{"name": "a", "resources": {"limits": [1]}}]},
            },
        }
    ),
    "annotation values objects": with_request(
        {
            "uid": "u",
            "operation": "CREATE",
            "resource": {"resource": "pods"},
            "object": {"metadata": {"annotations": {"corepin.io/cpu-policy": {"a": 1}}}},
        }
    ),
    "invalid utf-8": b'{"apiVersion": "admission.k8s.io/v1", "kind": "\xff\xfe"}',
    "utf-16 bom": "{}".encode("utf-16"),
    "lone surrogate escape": b'{"apiVersion": "\\ud800", "kind": "AdmissionReview"}',
    "deep nesting": nested(200_000),
    "deep nesting in the pod": with_request(
        {"uid": "u", "operation": "CREATE", "resource": {"resource": "pods"}, "object": "x"}
    ).replace(b'"x"', nested(100_000)),
    "huge array": b"[" + b"0," * 1_400_000 + b"0]",
    "huge container list": body_of(
        pod("web-0", *(container(f"c{i}", "1") for i in range(3000)), annotations=EXCLUSIVE)
    ),
    "many annotations": body_of(
        pod(
            "web-0",
            container("app", "2"),
            annotations={f"corepin.io/k{i}": "x" * 50 for i in range(20000)},
        )
    ),
    "long string": json.dumps({"apiVersion": "x" * 2_000_000}).encode(),
}


@pytest.mark.parametrize("endpoint", ["/validate", "/mutate"])
@pytest.mark.parametrize("name", list(FUZZ))
def test_fuzzed_bodies_get_a_4xx_or_an_admission_review(
    webhook: Webhook, name: str, endpoint: str
) -> None:
    body = FUZZ[name]
    assert len(body) <= 3 * 1024 * 1024
    started = time.monotonic()
    status, data, _ = webhook.request("POST", endpoint, body, {"Content-Type": "application/json"})
    assert time.monotonic() - started < 20
    assert status in (200, 400), data[:200]
    if status == 200:
        answer = json.loads(data)
        assert answer["kind"] == "AdmissionReview" and isinstance(
            answer["response"]["allowed"], bool
        )
    else:
        assert data.endswith(b"\n") and len(data) < 400


def test_a_10_mb_body_is_refused_before_it_is_read(webhook: Webhook) -> None:
    big = b"[" + b"1," * (5 * 1024 * 1024) + b"1]"
    assert len(big) > 10 * 1024 * 1024
    # a client that waits for 100 Continue sends nothing more: 413 at once
    sock = webhook.tls_socket()
    sock.sendall(
        f"POST /validate HTTP/1.1\r\nHost: x\r\nContent-Length: {len(big)}\r\n"
        "Expect: 100-continue\r\n\r\n".encode()
    )
    reply = http.client.HTTPResponse(sock)  # type: ignore[arg-type]
    reply.begin()
    assert reply.status == 413 and b"limit is 3145728 bytes" in reply.read()
    sock.close()
    # a client that sends it all anyway: 413 or a reset, and the server goes on
    started = time.monotonic()
    try:
        status, _, _ = webhook.request("POST", "/mutate", big)
        assert status == 413
    except (ConnectionError, ssl.SSLError, http.client.HTTPException):
        pass
    assert time.monotonic() - started < 10
    assert webhook.request("GET", "/healthz")[0] == 200


def test_a_false_content_length_gets_an_answer_not_a_hang(webhook: Webhook) -> None:
    sock = webhook.tls_socket(timeout=5)
    sock.sendall(
        b"POST /validate HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}garbage\r\n\r\n"
    )
    received = b""
    while chunk := sock.recv(65536):
        received += chunk
    sock.close()
    # "{}" is not an AdmissionReview (400); "garbage" is not a request line: 400 (in the
    # HTTP/0.9 form the standard library answers a one-word request line with), then closed
    assert received.startswith(b"HTTP/1.1 400 Bad Request\r\n")
    assert received.count(b"HTTP/1.1 ") == 1
    assert received.endswith(b"\n400 Bad request syntax ('garbage')\n")


json_values = strategies.json_values(max_text=8, max_leaves=20)
POD_PATHS = [
    ("request",),
    ("request", "uid"),
    ("request", "operation"),
    ("request", "kind"),
    ("request", "resource"),
    ("request", "object"),
    ("request", "object", "metadata"),
    ("request", "object", "metadata", "annotations"),
    ("request", "object", "metadata", "annotations", "corepin.io/cpu-policy"),
    ("request", "object", "metadata", "labels"),
    ("request", "object", "spec"),
    ("request", "object", "spec", "containers"),
    ("request", "object", "spec", "containers", 0),
    ("request", "object", "spec", "containers", 0, "resources"),
    ("request", "object", "spec", "containers", 0, "env"),
    ("request", "object", "spec", "containers", 0, "volumeMounts"),
    ("request", "object", "spec", "volumes"),
    ("request", "object", "spec", "tolerations"),
    ("request", "oldObject"),
]


@settings(max_examples=examples(300))
@given(path=st.sampled_from(POD_PATHS), value=json_values, endpoint=st.sampled_from(["v", "m"]))
def test_any_value_anywhere_in_a_review_gets_400_or_an_admission_review(
    path: tuple[Any, ...], value: object, endpoint: str
) -> None:
    obj = pod("web-0", container("app", "2", env=[]), annotations=dict(EXCLUSIVE), volumes=[])
    doc: Any = review(obj)
    target = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    app = AdmissionApp(
        WebhookConfig(scheduler_name="s", node_selector=(("a", "b"),), tolerations=())
    )
    route = app.validate if endpoint == "v" else app.mutate
    status, data, _content_type = route(json.dumps(doc).encode())
    assert status in (200, 400)
    if status == 200:
        answer = json.loads(data)
        assert answer["response"]["uid"] == doc["request"]["uid"]


# ---------------------------------------------------------------------- timeouts and limits
def test_a_body_that_stops_arriving_gets_408_within_the_read_timeout(webhook: Webhook) -> None:
    sock = webhook.tls_socket()
    sock.sendall(b'POST /validate HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"a":')
    started = time.monotonic()
    reply = http.client.HTTPResponse(sock)  # type: ignore[arg-type]
    reply.begin()
    assert reply.status == 408
    assert 1.5 < time.monotonic() - started < 6
    sock.close()


def test_a_trickled_body_is_cut_off_at_the_read_timeout(webhook: Webhook) -> None:
    sock = webhook.tls_socket()
    sock.sendall(b"POST /validate HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n")
    started = time.monotonic()
    got = b""
    sock.settimeout(0.3)
    while time.monotonic() - started < 8 and not got:
        try:
            sock.sendall(b" ")
        except OSError:
            break
        try:
            got = sock.recv(4096)
        except TimeoutError:
            continue
        except OSError:
            break
    assert got.startswith(b"HTTP/1.1 408"), got[:80]
    assert time.monotonic() - started < 5
    sock.close()


def test_a_client_that_never_handshakes_does_not_block_others(webhook: Webhook) -> None:
    silent = socket.create_connection(("127.0.0.1", webhook.port))
    started = time.monotonic()
    assert webhook.request("GET", "/healthz")[0] == 200
    assert time.monotonic() - started < 1.5
    silent.settimeout(6)
    assert silent.recv(100) == b""  # closed after the read timeout (2 s here)
    assert time.monotonic() - started < 5
    silent.close()


def test_an_idle_keep_alive_connection_is_closed(tls: TLSMaterial) -> None:
    hook = Webhook(tls.server.cert, tls.server.key, [tls.ca.cert], idle_timeout=0.5)
    try:
        sock = hook.tls_socket()
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        reply = http.client.HTTPResponse(sock)  # type: ignore[arg-type]
        reply.begin()
        assert reply.status == 200
        reply.read()
        wait_for(lambda: hook.server.connections == 0, timeout=5, what="the idle connection")
        sock.close()
    finally:
        hook.stop()


def _closed(sock: ssl.SSLSocket) -> bool:
    """True when the server closed the connection (EOF or a reset), False while it is open."""
    sock.settimeout(0.2)
    try:
        return sock.recv(100) == b""
    except TimeoutError:
        return False
    except (ssl.SSLError, ConnectionError):
        return True


def test_a_connection_beyond_the_limit_closes_the_oldest_one_still_waiting(
    tls: TLSMaterial,
) -> None:
    hook = Webhook(tls.server.cert, tls.server.key, [tls.ca.cert], max_connections=2)
    try:
        held = [hook.tls_socket(), hook.tls_socket()]  # handshaken, no request sent
        wait_for(lambda: hook.server.connections == 2, timeout=5, what="two connections")
        # the newcomer is served; the oldest silent connection made room for it
        assert hook.request("GET", "/healthz")[0] == 200
        assert hook.server.evicted >= 1
        wait_for(lambda: _closed(held[0]), timeout=5, what="the oldest connection to close")
        for s in held:
            s.close()
        wait_for(lambda: hook.server.connections == 0, timeout=5, what="the connections to go")
    finally:
        hook.stop()


def test_a_connection_beyond_the_limit_is_closed_when_every_one_is_busy(
    tls: TLSMaterial,
) -> None:
    release = threading.Event()

    def slow(body: bytes) -> tuple[int, bytes, str]:
        release.wait(10)
        return 200, b"{}", "application/json"

    hook = Webhook(
        tls.server.cert, tls.server.key, [tls.ca.cert], max_connections=2, routes={"/v": slow}
    )
    busy = [hook.tls_socket(), hook.tls_socket()]
    try:
        for s in busy:
            s.sendall(b"POST /v HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
        wait_for(lambda: hook.server.connections == 2, timeout=5, what="two busy connections")
        with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
            extra = hook.tls_socket(timeout=3)
            extra.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            if not extra.recv(100):
                raise ConnectionError("closed")
        assert hook.server.refused >= 1
        release.set()
        for s in busy:
            reply = http.client.HTTPResponse(s)  # type: ignore[arg-type]
            reply.begin()
            assert reply.status == 200  # the busy ones were answered, not dropped
            reply.close()
            s.close()
        wait_for(lambda: hook.server.connections == 0, timeout=5, what="the connections to go")
        assert hook.request("GET", "/healthz")[0] == 200
    finally:
        release.set()
        hook.stop()


def test_stop_closes_open_connections_and_returns_quickly(tls: TLSMaterial) -> None:
    hook = Webhook(tls.server.cert, tls.server.key, [tls.ca.cert])
    sock = hook.tls_socket()
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    reply = http.client.HTTPResponse(sock)  # type: ignore[arg-type]
    reply.begin()
    reply.read()
    port = hook.port
    started = time.monotonic()
    hook.stop()
    assert time.monotonic() - started < 2
    sock.settimeout(3)
    with contextlib.suppress(ssl.SSLError, ConnectionError):
        assert sock.recv(10) == b""
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    sock.close()


# ---------------------------------------------------------------------- certificates
def peer_certificate(hook: Webhook) -> bytes:
    """The certificate a new connection is served (not verified: compared by the caller)."""
    unverified = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    unverified.check_hostname = False
    unverified.verify_mode = ssl.CERT_NONE
    raw = socket.create_connection(("127.0.0.1", hook.port), timeout=10)
    sock = unverified.wrap_socket(raw)
    der = sock.getpeercert(binary_form=True)
    sock.close()
    assert der is not None
    return der


def der(path: Path) -> bytes:
    return ssl.PEM_cert_to_DER_cert(path.read_text())


def kubelet_secret_dir(base: Path, material: TLSMaterial, generation: int) -> None:
    """Write the pair the way the kubelet updates a Secret volume: files in a fresh
    timestamped directory, then `..data` swapped to it by an atomic rename."""
    version = base / f"..2026_{generation}"
    version.mkdir()
    shutil.copy(material.server.cert, version / "tls.crt")
    shutil.copy(material.server.key, version / "tls.key")
    tmp = base / "..data_tmp"
    os.symlink(version.name, tmp)
    os.replace(tmp, base / "..data")
    for name in ("tls.crt", "tls.key"):
        if not (base / name).is_symlink():
            os.symlink(f"..data/{name}", base / name)


def test_a_rotated_certificate_is_served_without_a_restart(tmp_path: Path) -> None:
    first, second = make_tls(tmp_path / "a"), make_tls(tmp_path / "b")
    secret = tmp_path / "secret"
    secret.mkdir()
    kubelet_secret_dir(secret, first, 1)
    hook = Webhook(secret / "tls.crt", secret / "tls.key", [first.ca.cert])
    try:
        kept = hook.connection()
        assert hook.request("GET", "/healthz", conn=kept)[0] == 200
        assert peer_certificate(hook) == der(first.server.cert)
        kubelet_secret_dir(secret, second, 2)
        wait_for(
            lambda: peer_certificate(hook) == der(second.server.cert),
            timeout=5,
            what="the new certificate",
        )
        assert hook.certificate.reloads == 1
        assert metric(hook, "corepin_webhook_tls_reloads_total", result="ok") == 1
        # the connection opened before the rotation goes on with its session
        assert hook.request("GET", "/healthz", conn=kept)[0] == 200
        kept.close()
        hook.cas = [second.ca.cert]  # new connections verify against the new CA
        assert (
            hook.request("POST", "/validate", body_of(pod("web-0", container("app", "2"))))[0]
            == 200
        )
    finally:
        hook.stop()


def test_a_broken_rotation_keeps_the_last_good_pair(tls: TLSMaterial, tmp_path: Path) -> None:
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    shutil.copy(tls.server.cert, cert)
    shutil.copy(tls.server.key, key)
    hook = Webhook(cert, key, [tls.ca.cert])
    try:
        other = make_tls(tmp_path / "other")
        shutil.copy(other.server.cert, cert)  # a new certificate, the old key: no pair
        wait_for(lambda: hook.certificate.failures >= 1 or not peer_certificate(hook), timeout=5)
        assert "does not belong to the certificate" in hook.certificate.last_error
        assert peer_certificate(hook) == der(tls.server.cert)
        assert metric(hook, "corepin_webhook_tls_reloads_total", result="failed") == 1
        shutil.copy(other.server.key, key)  # the key arrives: the pair loads
        wait_for(
            lambda: peer_certificate(hook) == der(other.server.cert),
            timeout=5,
            what="the completed pair to load",
        )
        assert hook.certificate.reloads == 1 and hook.certificate.last_error == ""
    finally:
        hook.stop()


@pytest.mark.parametrize(
    ("which", "content", "problem"),
    [
        ("cert", None, "cannot read the TLS certificate"),
        ("cert", "hello", "no PEM certificate in it"),
        ("cert", "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n", "not a valid"),
        ("key", None, "cannot read the TLS key"),
        ("key", "hello", "no PEM private key in it"),
        ("key", "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n", "not a usable"),
    ],
)
def test_a_bad_certificate_or_key_file_is_named(
    tls: TLSMaterial, tmp_path: Path, which: str, content: str | None, problem: str
) -> None:
    cert, key = str(tls.server.cert), str(tls.server.key)
    bad = tmp_path / f"bad.{which}"
    if content is not None:
        bad.write_text(content)
    if which == "cert":
        cert = str(bad)
    else:
        key = str(bad)
    with pytest.raises(TLSFilesError) as caught:
        ServingCertificate(cert, key).load()
    assert str(caught.value).startswith(f"{bad}: ") and problem in str(caught.value)
    assert caught.value.exit_code == 4


def test_a_key_of_another_certificate_is_named(tls: TLSMaterial, tmp_path: Path) -> None:
    other = make_tls(tmp_path / "other")
    with pytest.raises(TLSFilesError) as caught:
        ServingCertificate(str(tls.server.cert), str(other.server.key)).load()
    assert str(caught.value) == (
        f"{other.server.key}: this key does not belong to the certificate {tls.server.cert}"
    )


def test_a_busy_port_is_an_environment_problem(webhook: Webhook, tls: TLSMaterial) -> None:
    certificate = ServingCertificate(str(tls.server.cert), str(tls.server.key))
    server = HttpsServer(f"127.0.0.1:{webhook.port}", certificate, routes={})
    with pytest.raises(EnvironmentProblem, match=f"cannot serve HTTPS on 127.0.0.1:{webhook.port}"):
        server.start()


def test_many_clients_at_once_all_get_answers(webhook: Webhook) -> None:
    body = body_of(pod("web-0", container("app", "2"), annotations=EXCLUSIVE))
    results: list[int] = []
    lock = threading.Lock()

    def client() -> None:
        conn = webhook.connection()
        for _ in range(10):
            status, _, _ = webhook.request("POST", "/mutate", body, conn=conn)
            with lock:
                results.append(status)
        conn.close()

    threads = [threading.Thread(target=client) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert results == [200] * 80
