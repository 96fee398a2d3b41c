"""The node agent's Prometheus metrics (the names are a stable contract).

- `corepin_shared_pool_cpus` (gauge): CPUs in the shared pool;
- `corepin_exclusive_cpus` (gauge): CPUs of exclusive allocations with the units their levels
  withhold;
- `corepin_allocated_cpus{numa_node}` (gauge): CPUs held by exclusive and share allocations
  (withheld units included), per NUMA node;
- `corepin_pinning_requests_total` (counter): pinning requests (a container or process to pin,
  an Allocate call);
- `corepin_pinning_errors_total{reason}` (counter): failed pinning requests by the error's
  machine-readable reason;
- `corepin_cgroup_writes_total` (counter): cgroup file writes;
- `corepin_reconcile_duration_seconds` (histogram): one reconcile pass;
- `corepin_decision_duration_seconds` (histogram): one allocation decision;
- `corepin_pod_event_to_pinned_seconds` (histogram): from the first pod update that reports a
  running container's containerID to the cgroup write;
- `corepin_watch_restarts_total` (counter): watches of the API that had to start again;
- node QoS: `corepin_be_suppressed_cpus` (gauge): the CPUs best-effort work may use (the
  budget of the last QoS period); `corepin_cpu_burst_changes_total` (counter): burst and
  quota changes of CPU burst; `corepin_qos_policy_changes_total` (counter): changes of the
  policy in force; `corepin_resctrl_llc_occupancy_bytes{class,cache_id}` (gauge) and
  `corepin_resctrl_memory_bandwidth_bytes_total{class,domain,scope}` (counter), read from
  resctrl's monitoring when scraped (`watch_resctrl`);
- rebalancing: `corepin_rebalance_advised_total` (counter): moves advised (`--rebalance
  report`, once per container and advice); `corepin_rebalance_moves_total` (counter):
  containers moved live;
  `corepin_rebalance_move_seconds` (histogram): from the start of a move to the container's
  cgroup written.

Each process builds one `AgentMetrics` on a registry of its own (never the library's global
one, so two agents in one test process do not mix) and the agent updates it:

```python
metrics = AgentMetrics()
metrics.observe_state(state, topology)        # after every committed change
metrics.pinning_request(); metrics.pinning_error("not_enough_cpus")
metrics.cgroup_writes(3)
with metrics.time_reconcile(): ...            # or metrics.observe_reconcile(seconds)
with metrics.time_decision(): ...
metrics.observe_pod_event_to_pinned(seconds)
metrics.watch_restart()
metrics.observe_qos(be_budget, burst_changes); metrics.qos_policy_changed()
metrics.watch_resctrl(classes.samples)         # resctrl monitoring, read at each scrape
metrics.rebalance_advised(); metrics.rebalance_moved(seconds)
```

`corepin.api.http` serves `metrics.registry` on GET /metrics.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Final, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from corepin.state.model import HostState
    from corepin.topology.model import Topology

log = logging.getLogger("corepin.agent.node")


class ResctrlSamplesLike(Protocol):
    """What `watch_resctrl` reads (`corepin.enforcement.resctrl.classes.ResctrlSamples`):
    label values in the metrics' label order, the value last."""

    @property
    def occupancy(self) -> list[tuple[str, str, int]]: ...

    @property
    def bandwidth(self) -> list[tuple[str, str, str, int]]: ...


class _ResctrlCollector(Collector):
    """resctrl's monitoring counters as metrics, read when scraped."""

    def __init__(self, samples: Callable[[], ResctrlSamplesLike]) -> None:
        self.samples = samples

    def collect(self) -> Iterable[Metric]:
        occupancy = GaugeMetricFamily(
            "corepin_resctrl_llc_occupancy_bytes",
            "L3 cache occupancy of a QoS class's resctrl group, per cache id.",
            labels=["class", "cache_id"],
        )
        bandwidth = CounterMetricFamily(
            "corepin_resctrl_memory_bandwidth_bytes",
            "Memory bandwidth used by a QoS class's resctrl group (bytes since the group was "
            "made), per domain; scope total or local.",
            labels=["class", "domain", "scope"],
        )
        try:
            got = self.samples()
        except Exception as err:  # a scrape never fails for resctrl
            log.warning("event=resctrl_samples_failed error=%s", err)
            return [occupancy, bandwidth]
        for name, cache, value in got.occupancy:
            occupancy.add_metric([name, cache], value)
        for name, domain, scope, value in got.bandwidth:
            bandwidth.add_metric([name, domain, scope], value)
        return [occupancy, bandwidth]

    def describe(self) -> Iterable[Metric]:
        return []


#: Decisions take microseconds to milliseconds.
DECISION_BUCKETS: Final = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
)  # fmt: skip
#: A reconcile pass reads and maybe writes many cgroup files.
RECONCILE_BUCKETS: Final = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
#: A live move: one transaction and a few cgroup writes, milliseconds.
MOVE_BUCKETS: Final = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
)  # fmt: skip
#: Pod event to pinned: the agent's reaction time, from tens of milliseconds to seconds.
PINNED_BUCKETS: Final = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class AgentMetrics:
    """The metrics of one agent process on `registry` (a new one by default)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self._lock = threading.Lock()
        self._numa_nodes: set[str] = set()
        self.shared_pool_cpus = Gauge(
            "corepin_shared_pool_cpus", "CPUs in the shared pool.", registry=r
        )
        self.exclusive_cpus = Gauge(
            "corepin_exclusive_cpus",
            "CPUs of exclusive allocations, with the units their levels withhold.",
            registry=r,
        )
        self.allocated_cpus = Gauge(
            "corepin_allocated_cpus",
            "CPUs held by exclusive and share allocations (withheld units included), per NUMA "
            "node.",
            ["numa_node"],
            registry=r,
        )
        self.pinning_requests = Counter(
            "corepin_pinning_requests", "Pinning requests handled.", registry=r
        )
        self.pinning_errors = Counter(
            "corepin_pinning_errors",
            "Pinning requests that failed, by reason.",
            ["reason"],
            registry=r,
        )
        self.cgroup_writes_total = Counter(
            "corepin_cgroup_writes", "cgroup file writes.", registry=r
        )
        self.reconcile_duration = Histogram(
            "corepin_reconcile_duration_seconds",
            "Duration of one reconcile pass.",
            buckets=RECONCILE_BUCKETS,
            registry=r,
        )
        self.decision_duration = Histogram(
            "corepin_decision_duration_seconds",
            "Duration of one allocation decision.",
            buckets=DECISION_BUCKETS,
            registry=r,
        )
        self.pod_event_to_pinned = Histogram(
            "corepin_pod_event_to_pinned_seconds",
            "From the first pod update that reports a running container's containerID to the "
            "cgroup write.",
            buckets=PINNED_BUCKETS,
            registry=r,
        )
        self.watch_restarts = Counter(
            "corepin_watch_restarts", "Watches of the API that had to start again.", registry=r
        )
        self.be_suppressed_cpus = Gauge(
            "corepin_be_suppressed_cpus",
            "CPUs best-effort work may use (the budget of the last QoS period).",
            registry=r,
        )
        self.cpu_burst_changes = Counter(
            "corepin_cpu_burst_changes",
            "CPU burst allowance and quota changes made by the QoS loop.",
            registry=r,
        )
        self.qos_policy_changes = Counter(
            "corepin_qos_policy_changes",
            "Changes of the node QoS policy in force (file or ConfigMap).",
            registry=r,
        )
        self.rebalance_advised_total = Counter(
            "corepin_rebalance_advised",
            "Moves of exclusive containers to better-aligned CPUs advised (--rebalance report).",
            registry=r,
        )
        self.rebalance_moves = Counter(
            "corepin_rebalance_moves",
            "Exclusive containers moved live to better-aligned CPUs (--rebalance move).",
            registry=r,
        )
        self.rebalance_move_seconds = Histogram(
            "corepin_rebalance_move_seconds",
            "From the start of a live move to the container's cgroup written.",
            buckets=MOVE_BUCKETS,
            registry=r,
        )
        self._resctrl: _ResctrlCollector | None = None

    # ------------------------------------------------------------------ gauges
    def observe_state(self, state: HostState, topology: Topology) -> None:
        """Set the pool gauges from a state: shared pool, exclusive CPUs, and the allocated
        CPUs of every NUMA node of `topology` (0 where none are held; a node that left the
        topology is dropped)."""
        held = state.held
        per_node = {
            str(node): len(held & topology.cpus_in_numa_nodes(node))
            for node in topology.numa_node_ids()
        }
        with self._lock:
            self.shared_pool_cpus.set(len(state.shared_pool))
            self.exclusive_cpus.set(len(state.exclusive_cpus))
            for gone in self._numa_nodes - per_node.keys():
                self.allocated_cpus.remove(gone)
            for node, count in per_node.items():
                self.allocated_cpus.labels(numa_node=node).set(count)
            self._numa_nodes = set(per_node)

    # ------------------------------------------------------------------ counters
    def pinning_request(self) -> None:
        self.pinning_requests.inc()

    def pinning_error(self, reason: str) -> None:
        self.pinning_errors.labels(reason=reason or "unknown").inc()

    def cgroup_writes(self, count: int = 1) -> None:
        if count < 0:
            raise ValueError(f"a write count cannot be negative, got {count}")
        if count:
            self.cgroup_writes_total.inc(count)

    def watch_restart(self) -> None:
        self.watch_restarts.inc()

    # ------------------------------------------------------------------ node QoS
    def observe_qos(self, be_budget: float | None, burst_changes: int) -> None:
        """One QoS period: the BE budget (None: not known, the gauge keeps its value) and the
        burst changes it made."""
        if be_budget is not None:
            self.be_suppressed_cpus.set(be_budget)
        if burst_changes > 0:
            self.cpu_burst_changes.inc(burst_changes)

    def qos_policy_changed(self) -> None:
        self.qos_policy_changes.inc()

    def watch_resctrl(self, samples: Callable[[], ResctrlSamplesLike]) -> None:
        """Export resctrl's monitoring (`samples`, read at every scrape); once."""
        if self._resctrl is None:
            self._resctrl = _ResctrlCollector(samples)
            self.registry.register(self._resctrl)

    # ------------------------------------------------------------------ rebalancing
    def rebalance_advised(self) -> None:
        self.rebalance_advised_total.inc()

    def rebalance_moved(self, seconds: float) -> None:
        self.rebalance_moves.inc()
        self.rebalance_move_seconds.observe(max(0.0, seconds))

    # ------------------------------------------------------------------ histograms
    def observe_reconcile(self, seconds: float) -> None:
        self.reconcile_duration.observe(seconds)

    def observe_decision(self, seconds: float) -> None:
        self.decision_duration.observe(seconds)

    def observe_pod_event_to_pinned(self, seconds: float) -> None:
        self.pod_event_to_pinned.observe(max(0.0, seconds))

    @contextmanager
    def time_reconcile(self) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.observe_reconcile(time.perf_counter() - start)

    @contextmanager
    def time_decision(self) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.observe_decision(time.perf_counter() - start)


#: NRI requests are answered in microseconds to milliseconds (the runtime waits 2 s at most)
NRI_BUCKETS: Final = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0,
)  # fmt: skip


class NriMetrics(AgentMetrics):
    """The agent's metrics, and those of the NRI plugin (`corepin nri`):
    `corepin_nri_requests_total{event}` (counter) and `corepin_nri_request_duration_seconds`
    (histogram), one observation per request the runtime made."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        super().__init__(registry)
        self.nri_requests = Counter(
            "corepin_nri_requests",
            "NRI requests of the container runtime, by event.",
            ["event"],
            registry=self.registry,
        )
        self.nri_request_duration = Histogram(
            "corepin_nri_request_duration_seconds",
            "Time to answer one NRI request of the container runtime.",
            buckets=NRI_BUCKETS,
            registry=self.registry,
        )

    def nri_request(self, event: str, seconds: float) -> None:
        self.nri_requests.labels(event=event).inc()
        self.nri_request_duration.observe(max(0.0, seconds))


__all__ = ["AgentMetrics", "NriMetrics"]
