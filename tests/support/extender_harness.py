"""The scheduler extender in process: the real HTTP server and service on a loopback port, its
placement feed reading the fake API server (for the extender's tests and the placement
end-to-end test)."""

from __future__ import annotations

import http.client
import json
import time
from typing import Any

from corepin.agent.cluster.catalog import PlacementFeed
from corepin.agent.cluster.metrics import PlacementMetrics
from corepin.api.extender.server import ExtenderServer, ExtenderService
from corepin.kube.client import KubeClient
from corepin.placement.cluster import Cluster


class Extender:
    """An extender on a loopback port, fed by the fake API server."""

    def __init__(self, kube: KubeClient, service: dict[str, Any] | None = None, **kw: Any) -> None:
        service = service or {}
        self.kube = kube
        self.cluster = Cluster(**kw)
        self.metrics = PlacementMetrics()
        self.feed = PlacementFeed(kube, self.cluster, nodes=True)
        self.service = ExtenderService(
            self.cluster, self.feed, kube, metrics=self.metrics, **service
        )
        self.server = ExtenderServer(
            self.service,
            "127.0.0.1:0",
            ready=lambda: self.feed.synced,
            metrics=self.metrics.registry,
            max_body=12 * 1024 * 1024,
            timeout=2.0,
        )

    def __enter__(self) -> Extender:
        self.feed.start(30)
        self.server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.stop()
        self.feed.stop()

    def raw(
        self, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
    ) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.server.port, timeout=20)
        try:
            conn.request(method, path, body=body or None, headers=headers or {})
            answer = conn.getresponse()
            return answer.status, answer.read()
        finally:
            conn.close()

    def post(self, verb: str, payload: Any) -> tuple[int, Any]:
        code, body = self.raw("POST", f"/{verb}", json.dumps(payload).encode())
        return code, json.loads(body)

    def wait_nodes(self, *names: str) -> None:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if all(self.cluster.view(n) is not None for n in names):
                return
            time.sleep(0.02)
        raise AssertionError(f"the extender never saw {names}")
