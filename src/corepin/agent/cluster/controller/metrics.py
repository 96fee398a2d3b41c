"""The controller's Prometheus metrics (all named `corepin_controller_*`), in a registry of
their own so that two controllers in one process (tests) do not share counters.

Counters and the histogram are updated where the controller decides; the gauges of current
state (queue depth, bindings by phase, informer watch restarts) are read at scrape time from
the controller leading now, through the `ControllerView` protocol.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from corepin.kube.informer import InformerStats


class ControllerView(Protocol):
    """What the scrape-time collector reads of the running controller."""

    def queue_depth(self) -> int: ...

    def informer_stats(self) -> Mapping[str, InformerStats]: ...

    def bindings_by_phase(self) -> Mapping[tuple[str, str], int]: ...


class ControllerMetrics:
    """Every metric of `corepin controller`."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.leader = Gauge(
            "corepin_controller_leader",
            "1 while this replica holds the leader-election Lease and acts, else 0",
            registry=r,
        )
        self.verdicts = Counter(
            "corepin_controller_binding_verdicts",
            "Status changes the controller wrote to user-written PodCPUBindings, by phase and "
            "reason",
            ["phase", "reason"],
            registry=r,
        )
        self.orphans_deleted = Counter(
            "corepin_controller_orphans_deleted",
            "PodCPUBindings deleted because their pod is gone (or the name is another pod's)",
            registry=r,
        )
        self.adopted = Counter(
            "corepin_controller_bindings_adopted",
            "User-written PodCPUBindings given an owner reference to their pod",
            registry=r,
        )
        self.reservations = Counter(
            "corepin_controller_reservations",
            "CPUReservations the controller expired, failed, deleted once consumed, or updated "
            "(expireTime, nodeName), by action",
            ["action"],
            registry=r,
        )
        self.stale_heartbeats = Counter(
            "corepin_controller_heartbeat_stale",
            "NodeCPUTopologies marked Ready=False because the agent's heartbeat stopped",
            registry=r,
        )
        self.conflicts = Counter(
            "corepin_controller_write_conflicts",
            "409 Conflict answers to the controller's writes (each re-read and re-applied)",
            ["resource"],
            registry=r,
        )
        self.work_errors = Counter(
            "corepin_controller_work_errors",
            "Work items that failed and were queued again with backoff, by kind",
            ["kind"],
            registry=r,
        )
        self.duration = Histogram(
            "corepin_controller_reconcile_duration_seconds",
            "Time to process one work item, by kind (binding, node, topology)",
            ["kind"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
            registry=r,
        )
        self._view: Callable[[], ControllerView | None] = lambda: None
        r.register(_StateCollector(self))

    def watch(self, view: Callable[[], ControllerView | None]) -> None:
        """Read current state (queue, informers, bindings) from `view()` at scrape time."""
        self._view = view

    def current(self) -> ControllerView | None:
        return self._view()


class _StateCollector:
    def __init__(self, metrics: ControllerMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        view = self._metrics.current()
        depth = GaugeMetricFamily(
            "corepin_controller_queue_depth", "Work items ready to be processed"
        )
        phases = GaugeMetricFamily(
            "corepin_controller_bindings",
            "PodCPUBindings in the controller's cache, by writer (user or agent) and phase",
            labels=["writer", "phase"],
        )
        restarts = CounterMetricFamily(
            "corepin_controller_watch_restarts",
            "Watches opened again after the first one of a list, by resource",
            labels=["resource"],
        )
        relists = CounterMetricFamily(
            "corepin_controller_relists",
            "Full lists after a watch expired (410 Gone), by resource",
            labels=["resource"],
        )
        if view is not None:
            depth.add_metric([], view.queue_depth())
            for (writer, phase), count in sorted(view.bindings_by_phase().items()):
                phases.add_metric([writer, phase], count)
            for resource, stats in sorted(view.informer_stats().items()):
                restarts.add_metric([resource], stats.watch_restarts)
                relists.add_metric([resource], stats.relists)
        else:
            depth.add_metric([], 0)
        yield depth
        yield phases
        yield restarts
        yield relists
