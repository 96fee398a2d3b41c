"""Prometheus metrics of the scheduler and the extender (one registry per process;
`PlacementMetrics` is the extender's `corepin.api.extender.ports.ExtenderMetrics`).

- `corepin_placement_requests_total{verb,code}` (counter): extender requests by verb
  (filter, prioritize, bind, preempt) and HTTP status; scheduling attempts by the scheduler
  (verb `schedule`, code `scheduled`, `unschedulable` or `error`);
- `corepin_placement_request_duration_seconds{verb}` (histogram): time to answer one;
- `corepin_placement_failed_nodes_total{reason}` (counter): nodes that did not pass a filter,
  by machine-readable reason (no_topology, not_ready, stale, unusable, no_fit, ...);
- `corepin_placement_in_flight_pods` (gauge): placements counted until their nodes publish them;
- `corepin_placement_nodes` (gauge): nodes with a NodeCPUTopology;
- `corepin_placement_bindings_total{result}` (counter): binds (pods/binding) by result;
- `corepin_watch_restarts_total` (counter): watches of the API that had to start again.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

#: answers take from tens of microseconds (cached) to tens of milliseconds (1,000 nodes)
BUCKETS: Final = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
)  # fmt: skip


class PlacementMetrics:
    """The metrics of one scheduler or extender process."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "corepin_placement_requests_total",
            "Extender requests and scheduling attempts, by verb and outcome.",
            ["verb", "code"],
            registry=r,
        )
        self.duration = Histogram(
            "corepin_placement_request_duration_seconds",
            "Time to answer one extender request or to schedule one pod.",
            ["verb"],
            buckets=BUCKETS,
            registry=r,
        )
        self.failed_nodes = Counter(
            "corepin_placement_failed_nodes_total",
            "Nodes that did not pass a filter, by reason.",
            ["reason"],
            registry=r,
        )
        self.in_flight = Gauge(
            "corepin_placement_in_flight_pods",
            "Placements counted until their nodes publish them.",
            registry=r,
        )
        self.nodes = Gauge("corepin_placement_nodes", "Nodes with a NodeCPUTopology.", registry=r)
        self.bindings = Counter(
            "corepin_placement_bindings_total",
            "Pods bound to nodes (pods/binding), by result.",
            ["result"],
            registry=r,
        )
        self.watch_restarts = Counter(
            "corepin_watch_restarts_total",
            "Watches of the API that had to start again.",
            registry=r,
        )

    @contextmanager
    def timed(self, verb: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.duration.labels(verb).observe(time.perf_counter() - start)

    def request(self, verb: str, outcome: str) -> None:
        self.requests.labels(verb, outcome).inc()

    def failed(self, reason: str, count: int = 1) -> None:
        if count:
            self.failed_nodes.labels(reason or "unknown").inc(count)

    def binding(self, result: str) -> None:
        self.bindings.labels(result).inc()


__all__ = ["PlacementMetrics"]
