"""The webhook's Prometheus metrics (on a registry of its own, like the agent's):

- `corepin_webhook_requests_total{endpoint, outcome}` (counter): admission requests by endpoint
  (`validate`, `mutate`) and outcome: `allowed`, `denied`, `patched` (allowed with a JSONPatch)
  or `bad_request` (a body that is not an AdmissionReview: HTTP 4xx);
- `corepin_webhook_request_duration_seconds{endpoint}` (histogram): from the body read to the
  answer encoded;
- `corepin_webhook_tls_reloads_total{result}` (counter): certificate reloads, `ok` or `failed`;
- `corepin_webhook_node_topologies` (gauge): NodeCPUTopologies the capacity rule knows (0 when
  the webhook runs without the API).
"""

from __future__ import annotations

from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

#: A review takes from tens of microseconds to a few milliseconds.
REVIEW_BUCKETS: Final = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
)  # fmt: skip


class WebhookMetrics:
    """The metrics of one webhook process on `registry` (a new one by default)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "corepin_webhook_requests",
            "Admission requests by endpoint and outcome.",
            ["endpoint", "outcome"],
            registry=r,
        )
        self.duration = Histogram(
            "corepin_webhook_request_duration_seconds",
            "Time to decide one admission request.",
            ["endpoint"],
            buckets=REVIEW_BUCKETS,
            registry=r,
        )
        self.tls_reloads = Counter(
            "corepin_webhook_tls_reloads",
            "Reloads of the serving certificate and key, by result.",
            ["result"],
            registry=r,
        )
        self.node_topologies = Gauge(
            "corepin_webhook_node_topologies",
            "NodeCPUTopologies known to the capacity rule.",
            registry=r,
        )

    def request(self, endpoint: str, outcome: str, seconds: float) -> None:
        self.requests.labels(endpoint=endpoint, outcome=outcome).inc()
        self.duration.labels(endpoint=endpoint).observe(seconds)

    def tls_reload(self, ok: bool) -> None:
        self.tls_reloads.labels(result="ok" if ok else "failed").inc()
