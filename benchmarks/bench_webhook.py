"""The admission webhook over HTTPS on loopback (issue 9 target: median <= 5 ms per review,
>= 500 reviews/s).

Set-up: a server process runs `corepin.api.webhook.server.HttpsServer` - the server
`corepin webhook` runs - with the real routes (`/validate`, `/mutate`) and, as the baseline
measured in the same run on the same server, `/empty`: a route that returns a constant body
without looking at the request (what TLS, HTTP parsing and the body read cost by themselves).
Its capacity rule knows 100 NodeCPUTopologies (50 nodes of 256 CPUs, 50 of 32). The
certificate is made at start (the tests' CA helper). This process is the API server: it posts
AdmissionReviews of a pod with two exclusive containers over keep-alive connections.

Figures:
- latency: one connection, one request at a time: median and p99 per review;
- throughput: reviews per second on one connection, and on 4 connections at once (threads of
  this process; the server has its own process and CPU).

Usage: .venv/bin/python benchmarks/bench_webhook.py [--quick]
"""

from __future__ import annotations

import argparse
import http.client
import json
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
from _common import median, percentile  # noqa: E402

TARGET_MEDIAN_MS = 5.0
TARGET_RATE = 500.0
EXCLUSIVE = {"corepin.io/cpu-policy": "exclusive", "corepin.io/exclusiveness-level": "core"}


# ---------------------------------------------------------------------- the server process
def serve(cert: str, key: str) -> None:
    from corepin.api.http import OpsServer
    from corepin.api.webhook.app import AdmissionApp
    from corepin.api.webhook.capacity import Catalog
    from corepin.api.webhook.config import Toleration, WebhookConfig
    from corepin.api.webhook.metrics import WebhookMetrics
    from corepin.api.webhook.server import HttpsServer
    from corepin.api.webhook.tls import ServingCertificate
    from corepin.testing.machines import named
    from support.webhook_helpers import ncpt

    catalog = Catalog()
    big, small = named("large_256"), named("dual_socket_ht")
    for i in range(50):
        catalog.on_add(ncpt(f"big-{i}", big, reserved="0-1"))
        catalog.on_add(ncpt(f"small-{i}", small))
    metrics = WebhookMetrics()
    config = WebhookConfig(
        scheduler_name="corepin-scheduler",
        node_selector=(("corepin.io/node", "true"),),
        tolerations=(Toleration("corepin.io/dedicated", "", "NoSchedule"),),
    )
    app = AdmissionApp(config, capacity=catalog.snapshot, metrics=metrics)
    routes: dict[str, Any] = dict(app.routes())
    empty = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}).encode()
    routes["/empty"] = lambda body: (200, empty, "application/json")
    ops = OpsServer("127.0.0.1:0", metrics=metrics.registry, ready=True)
    server = HttpsServer(
        "127.0.0.1:0", ServingCertificate(cert, key), routes=routes, pages=ops.page
    )
    server.start()
    print(server.port, flush=True)
    sys.stdin.read()  # until the parent closes our stdin
    server.stop()


# ---------------------------------------------------------------------- the client
def review_body(uid: int) -> bytes:
    from support.pods import container, pod
    from support.webhook_helpers import review

    obj = pod(
        "web-0",
        container("app", "4", memory="64Mi", env=[{"name": "MODE", "value": "fast"}]),
        container("cache", "2", memory="64Mi"),
        container("log"),
        namespace="shop",
        annotations={**EXCLUSIVE, "corepin.io/cpu-policy.log": "none"},
        labels={"app": "web", "tier": "front"},
        volumes=[{"name": "data", "emptyDir": {}}],
    )
    return json.dumps(review(obj, uid=f"bench-{uid}")).encode()


def connect(port: int, ca: str) -> http.client.HTTPSConnection:
    context = ssl.create_default_context(cafile=ca)
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=30)
    conn.connect()
    return conn


def post(conn: http.client.HTTPSConnection, path: str, body: bytes) -> bytes:
    conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    data = response.read()
    if response.status != 200:
        raise SystemExit(f"{path}: HTTP {response.status}: {data[:200]!r}")
    return data


def latency(port: int, ca: str, path: str, bodies: list[bytes], warmup: int) -> list[float]:
    conn = connect(port, ca)
    for body in bodies[:warmup]:
        post(conn, path, body)
    times = []
    for body in bodies:
        start = time.perf_counter()
        post(conn, path, body)
        times.append((time.perf_counter() - start) * 1000)
    conn.close()
    return sorted(times)


def throughput(port: int, ca: str, path: str, body: bytes, seconds: float, clients: int) -> float:
    counts = [0] * clients
    stop = time.monotonic() + seconds

    def run(i: int) -> None:
        conn = connect(port, ca)
        while time.monotonic() < stop:
            post(conn, path, body)
            counts[i] += 1
        conn.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(clients)]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts) / (time.monotonic() - started)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few samples (CI smoke)")
    parser.add_argument("--serve", nargs=2, metavar=("CERT", "KEY"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(*args.serve)
        return 0
    from corepin.testing.fakeapi import make_tls

    samples, seconds = (300, 1.0) if args.quick else (3000, 5.0)
    with tempfile.TemporaryDirectory() as tmp:
        tls = make_tls(Path(tmp))
        server = subprocess.Popen(
            [sys.executable, __file__, "--serve", str(tls.server.cert), str(tls.server.key)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert server.stdout is not None and server.stdin is not None
        port = int(server.stdout.readline())
        ca = str(tls.ca.cert)
        try:
            bodies = [review_body(i) for i in range(samples)]
            answer = json.loads(post(connect(port, ca), "/mutate", bodies[0]))["response"]
            assert answer["allowed"] and answer["patchType"] == "JSONPatch"
            print(
                f"webhook over HTTPS on loopback, keep-alive; review body {len(bodies[0])} bytes; "
                f"capacity rule on 100 nodes; {samples} samples per row"
            )
            print(f"{'route':<10} {'median ms':>10} {'p99 ms':>8} {'1 conn/s':>9} {'4 conn/s':>9}")
            rows: dict[str, tuple[float, float, float, float]] = {}
            for path in ("/empty", "/validate", "/mutate"):
                times = latency(port, ca, path, bodies, warmup=min(200, samples // 3))
                one = throughput(port, ca, path, bodies[1], seconds, 1)
                four = throughput(port, ca, path, bodies[1], seconds, 4)
                rows[path] = (median(times), percentile(times, 99), one, four)
                med, p99, _, _ = rows[path]
                print(f"{path:<10} {med:>10.2f} {p99:>8.2f} {one:>9.0f} {four:>9.0f}")
        finally:
            server.stdin.close()
            server.wait(timeout=10)
    base = rows["/empty"][0]
    print(f"baseline: the empty handler's median {base:.2f} ms is TLS + HTTP + body read alone")
    missed = []
    for path in ("/validate", "/mutate"):
        med, _, one, four = rows[path]
        print(f"{path}: decision cost over the baseline {med - base:+.2f} ms per review")
        if med > TARGET_MEDIAN_MS:
            missed.append(f"{path} median {med:.2f} ms > {TARGET_MEDIAN_MS} ms")
        if max(one, four) < TARGET_RATE:
            missed.append(f"{path} {max(one, four):.0f} reviews/s < {TARGET_RATE:.0f}")
    print("targets: " + ("MISSED: " + "; ".join(missed) if missed else "all met"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
