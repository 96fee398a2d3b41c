"""The controller's loop for one leadership term: four informers (pods, PodCPUBindings,
NodeCPUTopologies, CPUReservations), handlers that turn changes into work-queue keys, and one
worker that processes the keys. The rules themselves are in `corepin.agent.cluster.controller`
(overview) and `rules` (decisions); the work of a key in `sync` (bindings, nodes) and
`heartbeats` (topologies); the writes with optimistic concurrency in `writer`.

Work keys (deduplicated by the queue):
- `("binding", namespace, name)`: delete the binding when its pod is gone, give a user-written
  one an owner reference to its pod, then have its node decided (or decide it alone when it
  has no node: pod missing or not scheduled, spec unreadable);
- `("node", name)`: decide every user-written binding whose pod runs on the node (conflicts
  are a per-node question) and write the statuses that change;
- `("topology", name)`: the heartbeat check of the node's NodeCPUTopology (re-queued with a
  delay until its heartbeat would be stale);
- `("reservation", name)`: a CPUReservation's expiry time, TTL expiry, deletion once consumed,
  failure on a node that does not exist (`reservations`, re-queued for when its TTL runs out).

The CPUReservation informer is not waited for (`synced`): a cluster without that CRD runs the
rest of the controller as before, and reservations are handled once the CRD is there.

A write that keeps meeting 409 Conflict (`writer.ConflictsExhausted`), or an API error, puts
the key back on the queue with backoff.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Final

from corepin.agent.cluster.controller import rules
from corepin.agent.cluster.controller.heartbeats import Heartbeats
from corepin.agent.cluster.controller.metrics import ControllerMetrics
from corepin.agent.cluster.controller.reservations import ReservationSync
from corepin.agent.cluster.controller.sync import BindingSync
from corepin.agent.cluster.controller.writer import BindingWriter, ConflictsExhausted, Key
from corepin.core.errors import ApiError, ApiUnreachable
from corepin.core.record import record
from corepin.kube.client import KubeClient
from corepin.kube.events import EventRecorder
from corepin.kube.informer import Informer, InformerStats, Obj
from corepin.kube.models import (
    CPUR_PLURAL,
    NCPT_PLURAL,
    PCB_PLURAL,
    ObjectView,
    is_agent_binding,
)
from corepin.kube.resources import CPUR, NCPT, PCB, PODS
from corepin.kube.workqueue import WorkQueue

BINDINGS: Final = PCB
TOPOLOGIES: Final = NCPT

log = logging.getLogger("corepin.controller")


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


@record
class ControllerSettings:
    """How the controller behaves (the command line fills it in)."""

    heartbeat_timeout: float = 60.0
    conflict_retries: int = 5
    watch_timeout: int = 300
    component: str = "corepin-controller"


class Controller:
    """`corepin controller`'s work while it leads. `start()`, then `stop()` (once)."""

    def __init__(
        self,
        client: KubeClient,
        settings: ControllerSettings | None = None,
        *,
        metrics: ControllerMetrics | None = None,
        clock: Callable[[], dt.datetime] = _utcnow,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.settings = settings or ControllerSettings()
        self.metrics = metrics or ControllerMetrics()
        self._monotonic = monotonic
        watch = self.settings.watch_timeout
        self.pods = Informer(client, PODS, watch_timeout=watch, name="controller-pods")
        self.bindings = Informer(client, BINDINGS, watch_timeout=watch, name="controller-bindings")
        self.topologies = Informer(
            client, TOPOLOGIES, watch_timeout=watch, name="controller-topologies"
        )
        self.reservations = Informer(
            client, CPUR, watch_timeout=watch, name="controller-reservations"
        )
        self.queue: WorkQueue[Key] = WorkQueue(monotonic=monotonic)
        self.events = EventRecorder(client, self.settings.component)
        self.writer = BindingWriter(
            client,
            self.metrics,
            self.events,
            self.queue,
            conflict_retries=self.settings.conflict_retries,
            clock=clock,
        )
        self.sync = BindingSync(
            client,
            self.pods.cache,
            self.bindings.cache,
            self.topologies.cache,
            self.writer,
            self.queue,
        )
        self.heartbeats = Heartbeats(
            client,
            self.topologies.cache,
            self.metrics,
            self.events,
            self.queue,
            timeout=self.settings.heartbeat_timeout,
            conflict_retries=self.settings.conflict_retries,
            clock=clock,
            monotonic=monotonic,
        )
        self.reservation_sync = ReservationSync(
            client,
            self.reservations.cache,
            self.metrics,
            self.events,
            self.queue,
            conflict_retries=self.settings.conflict_retries,
            clock=clock,
        )
        self._lock = threading.Lock()
        self._life = threading.Lock()
        # (namespace, pod name) -> names of the bindings that name that pod
        self._by_pod: dict[tuple[str, str], set[str]] = {}
        self._worker: threading.Thread | None = None
        self._stopping = threading.Event()
        self._busy = False
        self.pods.add_handlers(
            on_add=self._pod_added, on_update=self._pod_updated, on_delete=self._pod_deleted
        )
        self.bindings.add_handlers(
            on_add=self._binding_added,
            on_update=self._binding_updated,
            on_delete=self._binding_deleted,
        )
        self.topologies.add_handlers(
            on_add=self._topology_added,
            on_update=self._topology_updated,
            on_delete=self._topology_deleted,
        )
        self.reservations.add_handlers(
            on_add=self._reservation,
            on_update=lambda _old, new: self._reservation(new),
        )

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> Controller:
        """Start the informers, the event writer and the worker (nothing once stopped)."""
        with self._life:
            if self._worker is not None:
                raise RuntimeError("the controller was started already")
            if self._stopping.is_set():
                return self
            self.events.start()
            for informer in (self.pods, self.bindings, self.topologies, self.reservations):
                informer.start()
            self._worker = threading.Thread(
                target=self._work, name="controller-worker", daemon=True
            )
            self._worker.start()
        log.info("event=started heartbeat_timeout=%s", self.settings.heartbeat_timeout)
        return self

    def stop(self, timeout: float = 3.0) -> bool:
        """Stop processing, close the watches and join the threads (True when all ended
        within `timeout`). A write in flight is left to finish in the background."""
        deadline = self._monotonic() + timeout
        with self._life:  # never in the middle of start()
            self._stopping.set()
        self.queue.shutdown()
        ended = True
        for informer in (self.pods, self.bindings, self.topologies, self.reservations):
            ended = informer.stop(max(0.05, deadline - self._monotonic())) and ended
        if self._worker is not None:
            self._worker.join(max(0.05, deadline - self._monotonic()))
            ended = ended and not self._worker.is_alive()
        self.events.stop(max(0.05, deadline - self._monotonic()))
        log.info("event=stopped clean=%s", ended)
        return ended

    @property
    def synced(self) -> bool:
        return self.pods.synced and self.bindings.synced and self.topologies.synced

    def wait_for_sync(self, timeout: float) -> bool:
        deadline = self._monotonic() + timeout
        for informer in (self.pods, self.bindings, self.topologies):
            if not informer.wait_for_sync(max(0.0, deadline - self._monotonic())):
                return False
        return True

    def health(self) -> tuple[bool, str]:
        if self._stopping.is_set():
            return False, "stopping"
        if self._worker is None or not self._worker.is_alive():
            return False, "the controller's worker is not running"
        if not self.synced:
            return False, "leading; waiting for the first lists of pods, bindings and topologies"
        return True, "leading"

    def idle(self) -> bool:
        """Synced, nothing queued and nothing being processed (delayed checks aside)."""
        with self._lock:
            busy = self._busy
        return self.synced and not busy and self.queue.idle()

    # ------------------------------------------------------------------ metrics view
    def queue_depth(self) -> int:
        return len(self.queue)

    def informer_stats(self) -> Mapping[str, InformerStats]:
        return {
            "pods": self.pods.stats,
            PCB_PLURAL: self.bindings.stats,
            NCPT_PLURAL: self.topologies.stats,
            CPUR_PLURAL: self.reservations.stats,
        }

    def bindings_by_phase(self) -> Mapping[tuple[str, str], int]:
        counts: dict[tuple[str, str], int] = {}
        for obj in self.bindings.cache.list():
            writer = "agent" if is_agent_binding(ObjectView(obj).labels) else "user"
            key = (writer, rules.status_phase(obj))
            counts[key] = counts.get(key, 0) + 1
        return counts

    # ------------------------------------------------------------------ handlers
    def _binding_added(self, obj: Obj) -> None:
        ns, name = rules.key_of(obj)
        with self._lock:
            self._by_pod.setdefault(rules.binding_pod(obj), set()).add(name)
        self.queue.add(("binding", ns, name))

    def _binding_updated(self, old: Obj, new: Obj) -> None:
        ns, name = rules.key_of(new)
        before, after = rules.binding_pod(old), rules.binding_pod(new)
        if before != after:
            with self._lock:
                self._by_pod.get(before, set()).discard(name)
                self._by_pod.setdefault(after, set()).add(name)
        self.queue.add(("binding", ns, name))

    def _binding_deleted(self, obj: Obj) -> None:
        name = ObjectView(obj).name
        pod_key = rules.binding_pod(obj)
        with self._lock:
            names = self._by_pod.get(pod_key)
            if names is not None:
                names.discard(name)
                if not names:
                    del self._by_pod[pod_key]
        node = self._node_of_deleted(obj)
        if node:
            self.queue.add(("node", node))

    def _node_of_deleted(self, obj: Obj) -> str | None:
        ns, pod_name = rules.binding_pod(obj)
        pod = self.pods.cache.get(pod_name, ns)
        if pod is not None:
            node = rules.pod_facts(pod).node
            if node:
                return node
        status = obj.get("status")
        found = status.get("nodeName") if isinstance(status, Mapping) else None
        return str(found) if found else None

    def _bindings_of_pod(self, pod: Obj) -> list[str]:
        key = rules.key_of(pod)
        with self._lock:
            return sorted(self._by_pod.get(key, ()))

    def _pod_added(self, pod: Obj) -> None:
        ns = ObjectView(pod).namespace
        for name in self._bindings_of_pod(pod):
            self.queue.add(("binding", ns, name))

    def _pod_updated(self, old: Obj, new: Obj) -> None:
        before, after = rules.pod_facts(old), rules.pod_facts(new)
        if before == after:
            return  # status churn: nothing the bindings depend on changed
        for name in self._bindings_of_pod(new):
            self.queue.add(("binding", after.namespace, name))
        if before.node and before.node != after.node:
            self.queue.add(("node", before.node))

    def _pod_deleted(self, pod: Obj) -> None:
        facts = rules.pod_facts(pod)
        for name in self._bindings_of_pod(pod):
            self.queue.add(("binding", facts.namespace, name))
        if facts.node:
            self.queue.add(("node", facts.node))

    def _topology_added(self, obj: Obj) -> None:
        name = ObjectView(obj).name
        self.heartbeats.observe(obj)
        self.queue.add(("topology", name))
        self.queue.add(("node", name))

    def _topology_updated(self, old: Obj, new: Obj) -> None:
        name = ObjectView(new).name
        self.heartbeats.observe(new)
        self.queue.add(("topology", name))
        if old.get("spec") != new.get("spec") or rules.accounting(old) != rules.accounting(new):
            self.queue.add(("node", name))

    def _topology_deleted(self, obj: Obj) -> None:
        name = ObjectView(obj).name
        self.heartbeats.forget(name)
        self.sync.forget_node(name)
        self.queue.add(("node", name))

    def _reservation(self, obj: Obj) -> None:
        name = ObjectView(obj).name
        if name:
            self.queue.add(("reservation", name))

    # ------------------------------------------------------------------ worker
    def _work(self) -> None:
        while not self._stopping.is_set() and not self.synced:
            self._stopping.wait(0.02)
        while True:
            key = self.queue.get()
            if key is None:
                return
            with self._lock:
                self._busy = True
            started = time.perf_counter()
            try:
                self._process(key)
                self.queue.forget(key)
            except (ApiError, ApiUnreachable, ConflictsExhausted) as exc:
                if not self._stopping.is_set():
                    delay = self.queue.add_rate_limited(key)
                    self.metrics.work_errors.labels(key[0]).inc()
                    log.warning(
                        "event=retry key=%s error=%r delay=%.2f", "/".join(key), str(exc), delay
                    )
            except Exception:
                delay = self.queue.add_rate_limited(key)
                self.metrics.work_errors.labels(key[0]).inc()
                log.exception("event=bug key=%s delay=%.2f", "/".join(key), delay)
            finally:
                self.metrics.duration.labels(key[0]).observe(time.perf_counter() - started)
                self.queue.done(key)
                with self._lock:
                    self._busy = False

    def _process(self, key: Key) -> None:
        kind = key[0]
        if kind == "binding":
            self.sync.sync_binding(key[1], key[2])
        elif kind == "node":
            self.sync.sync_node(key[1])
        elif kind == "topology":
            self.heartbeats.check(key[1])
        elif kind == "reservation":
            self.reservation_sync.sync(key[1])


__all__ = ["BINDINGS", "TOPOLOGIES", "Controller", "ControllerSettings"]
