"""`corepin scheduler`: a second scheduler for pods whose `spec.schedulerName` is its name.

Threads and data flow:
- informers (`corepin.agent.cluster.catalog.PlacementFeed`, with nodes) keep
  NodeCPUTopologies, user PodCPUBindings, pods and nodes; a pending pod of ours (no node yet,
  not being deleted) is put on the queue (`pending.PendingPods`) when it appears or changes;
- one scheduling thread, while this replica holds the Lease (`corepin.kube.leader`), takes
  pods off the queue one at a time: the node checks (cordon, taints, nodeSelector), then the
  placement core on every remaining node (`Cluster.evaluate`: fit as the node's agent would
  pin, score by profile and workload family), the best node (ties: lowest name), and the
  placement is counted in flight at once (`Cluster.assume`), so the next pod already sees it;
- with `bind_cpus` the scheduling thread creates a PodCPUBinding naming the exact CPUs of
  every exclusive container, as a user would (the agent honours it; `cpu_bindings`); binder
  threads bind (`pods/binding`). A failed bind forgets the placement and retries the pod with
  a backoff (the binding stays, and is rewritten by the next try);
- a pod that fits nowhere stays Pending: its `PodScheduled` condition becomes False (reason
  `Unschedulable`, via the status subresource) and a Warning Event `FailedScheduling` says why
  per node; it is tried again when a topology, a node or a pod changes (at most once a
  second) and at least every `retry_every` seconds;
- a Pending CPUReservation without a node is queued too and placed by the same core
  (`reservations.ReservationPlacer`: `status.nodeName`); every active reservation is counted
  (`corepin.placement.reservations`): its CPUs go to the pods that match it only.
"""

from __future__ import annotations

import logging
import queue
import socket
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from corepin.agent.cluster.catalog import PlacementFeed
from corepin.agent.cluster.metrics import PlacementMetrics
from corepin.agent.cluster.scheduler.cpu_bindings import CPUBindings, api_time, with_cpus
from corepin.agent.cluster.scheduler.pending import Key, PendingPods
from corepin.agent.cluster.scheduler.reservations import (
    RESERVATIONS,
    ReservationPlacer,
    unplaced,
)
from corepin.core.errors import ApiConflict, ApiNotFound, CorepinError
from corepin.core.record import record
from corepin.kube.client import KubeClient
from corepin.kube.events import EventRecorder
from corepin.kube.leader import LeaderElector
from corepin.kube.models import ObjectView, PodView
from corepin.kube.models.fields import loose_list
from corepin.kube.resources import PODS
from corepin.placement.cluster import Cluster
from corepin.placement.fit import Fit
from corepin.placement.request import PodRequest
from corepin.placement.taints import failure_message, node_refusal

log = logging.getLogger("corepin.agent.cluster.scheduler")

#: what a binder thread is handed: the pod, its request, the node, the fit and the name of the
#: PodCPUBinding created for it (None: none)
BindJob = tuple[Mapping[str, Any], PodRequest, str, Fit, str | None]


@record
class SchedulerSettings:
    """What `corepin scheduler` is told on its command line."""

    name: str = "corepin-scheduler"
    profile: str = "MaximumUtilization"
    bind_cpus: bool = False
    stale_after: float = 60.0
    assume_ttl: float = 60.0
    lease_namespace: str = "default"
    lease_name: str = ""  # default: the scheduler name
    identity: str = ""  # default: host name and a random suffix
    binders: int = 4
    retry_every: float = 30.0
    backoff_initial: float = 0.5
    backoff_max: float = 10.0
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0


def _key(pod: Mapping[str, Any]) -> Key:
    view = ObjectView(pod)
    return (view.namespace or "default", view.name)


class Scheduler:
    """The second scheduler (see the module docstring)."""

    def __init__(
        self,
        client: KubeClient,
        settings: SchedulerSettings,
        *,
        metrics: PlacementMetrics | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.client = client
        self.settings = settings
        self.clock = clock
        self.metrics = metrics or PlacementMetrics()
        self.cluster = Cluster(
            profile=settings.profile,
            stale_after=settings.stale_after,
            assume_ttl=settings.assume_ttl,
        )
        self.pending = PendingPods(
            retry_every=settings.retry_every,
            backoff_initial=settings.backoff_initial,
            backoff_max=settings.backoff_max,
        )
        self.feed = PlacementFeed(
            client,
            self.cluster,
            nodes=True,
            on_pod=self._pod_event,
            on_topology=lambda _name: self.pending.changed(),
            on_reservation=self._reservation_event,
            clock=clock,
        )
        self.placer = ReservationPlacer(
            client, self.feed.reservations.cache, self.cluster, settings.name
        )
        assert self.feed.nodes is not None
        self.feed.nodes.add_handlers(
            on_add=lambda _o: self.pending.changed(),
            on_update=lambda _old, _new: self.pending.changed(),
            on_delete=lambda _o: self.pending.changed(),
        )
        self.cpu_bindings = (
            CPUBindings(client, self.feed, settings.name, clock) if settings.bind_cpus else None
        )
        self.events = EventRecorder(client, settings.name)
        identity = settings.identity or f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"
        self.elector = LeaderElector(
            client,
            settings.lease_namespace,
            settings.lease_name or settings.name,
            identity,
            lease_duration=settings.lease_duration,
            renew_deadline=settings.renew_deadline,
            retry_period=settings.retry_period,
            on_started_leading=self.pending.changed,
        )
        self._lock = threading.Lock()
        self._binding: set[str] = set()  # uids with a bind in flight
        self._binds: queue.Queue[BindJob | None] = queue.Queue()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.scheduled = 0
        self.unschedulable = 0

    # ------------------------------------------------------------------ lifecycle
    def start(self, timeout: float = 60.0) -> None:
        """Watch, elect, schedule; returns once the informers have listed everything."""
        self.events.start()
        self.feed.start(timeout)
        self.elector.start()
        self._spawn(self._loop, "scheduler")
        for i in range(max(1, self.settings.binders)):
            self._spawn(self._binder, f"binder-{i}")
        for pod in self.feed.pods.cache.list():
            self._pod_event("add", pod)
        for obj in self.feed.reservations.cache.list():
            self._reservation_event("add", obj)

    def stop(self, timeout: float = 3.0) -> None:
        """Stop within about `timeout` seconds (the Lease is released when leading)."""
        self._stop.set()
        self.pending.wake()
        for _ in self._threads:
            self._binds.put(None)
        self.elector.stop(timeout / 3)
        for thread in self._threads:
            thread.join(timeout / 3 / max(1, len(self._threads)))
        self.feed.stop(timeout / 3)
        self.events.stop(timeout / 6)

    def ready(self) -> bool:
        return self.feed.synced and not self._stop.is_set()

    @property
    def leading(self) -> bool:
        return self.elector.is_leader

    def wait_idle(self, timeout: float = 30.0) -> bool:
        """Wait until nothing is queued or being bound (tests)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                binding = bool(self._binding)
            if self.pending.empty() and not binding and self._binds.empty():
                return True
            time.sleep(0.01)
        return False

    def _spawn(self, target: Callable[[], None], name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    # ------------------------------------------------------------------ queue
    def _ours(self, pod: Mapping[str, Any]) -> bool:
        view = PodView(pod)
        return (
            view.spec.get("schedulerName") == self.settings.name
            and not view.node_name
            and not view.deleting
            and view.phase not in ("Succeeded", "Failed")
        )

    def _pod_event(self, what: str, pod: Mapping[str, Any]) -> None:
        key = _key(pod)
        if what == "delete":
            self.pending.forget(key)
            if PodView(pod).node_name:
                self.pending.changed()  # its CPUs come free
            return
        if not self._ours(pod):
            self.pending.unpark(key)
            return
        self.pending.offer(key)

    def _reservation_event(self, what: str, obj: Mapping[str, Any]) -> None:
        key = (RESERVATIONS, ObjectView(obj).name)
        if what == "delete" or not unplaced(obj):
            self.pending.forget(key)
            self.pending.changed()  # CPUs held or given back: parked pods may fit now
            return
        self.pending.offer(key)

    def _place_reservation(self, key: Key) -> None:
        try:
            placed = self.placer.place(key[1], self.clock())
        except CorepinError as exc:
            log.warning("event=reservation_place_failed reservation=%s error=%s", key[1], exc)
            self.pending.retry_later(key)
            return
        if placed:
            self.pending.unpark(key)
        else:
            self.pending.park(key)

    # ------------------------------------------------------------------ scheduling
    def _loop(self) -> None:
        while not self._stop.is_set():
            if not self.elector.is_leader:
                self._stop.wait(0.1)
                continue
            key = self.pending.next()
            if key is None:
                continue
            if key[0] == RESERVATIONS:
                self._place_reservation(key)
                continue
            pod = self.feed.pods.cache.get(key[1], key[0])
            if pod is None or not self._ours(pod):
                continue
            uid = PodView(pod).uid
            with self._lock:
                if uid in self._binding:
                    continue
            try:
                with self.metrics.timed("schedule"):
                    self._schedule(pod)
            except CorepinError as exc:
                self.metrics.request("schedule", "error")
                log.warning("event=schedule_failed pod=%s/%s error=%s", *key, exc)
                self.pending.retry_later(key)
            except Exception:  # a bug: keep scheduling the others, say what happened
                self.metrics.request("schedule", "error")
                log.exception("event=schedule_crashed pod=%s/%s", *key)
                self.pending.retry_later(key)

    def _candidates(self, pod: Mapping[str, Any]) -> tuple[list[str], dict[str, tuple[str, str]]]:
        """Nodes the pod may go to by the non-CPU checks, and the refusals of the others."""
        assert self.feed.nodes is not None
        names: list[str] = []
        refused: dict[str, tuple[str, str]] = {}
        for node in self.feed.nodes.cache.list():
            name = ObjectView(node).name
            why = node_refusal(node, pod)
            if why is None:
                names.append(name)
            else:
                refused[name] = why
        names.sort()
        return names, refused

    def _schedule(self, pod: Mapping[str, Any]) -> None:
        now = self.clock()
        request = self.feed.request_of(pod)
        names, refused = self._candidates(pod)
        answers = self.cluster.evaluate(request, names, now)
        best = self.cluster.best(answers)
        if best is None:
            failures = dict(refused)
            for a in answers:
                failures[a.node] = (a.code, a.reason)
                self.metrics.failed(a.code)
            self._unschedulable(pod, len(names) + len(refused), failures)
            return
        assert best.fit is not None
        if log.isEnabledFor(logging.DEBUG):
            self._log_placing(request, best.node, best.fit)
        created = None
        if self.cpu_bindings is not None:
            created = self.cpu_bindings.promise(request, best.node, best.fit)
        if created is not None:
            request = with_cpus(request, best.fit)
        self.cluster.assume(request, best.node, best.fit, now)
        with self._lock:
            self._binding.add(request.uid)
        self.pending.unpark(_key(pod))
        self._binds.put((pod, request, best.node, best.fit, created))

    def _log_placing(self, request: PodRequest, node: str, fit: Fit) -> None:
        view = self.cluster.view(node)
        log.debug(
            "event=placing pod=%s node=%s cpus=%s published_free=%s in_flight=%s",
            request.key,
            node,
            [str(p.withheld) for p in fit.placed],
            (
                view.pools.free,
                [(a.pod, str(a.cpus), a.level) for a in view.allocations],
            )
            if view is not None
            else "-",
            [
                (a.request.name, [str(p.withheld) for p in a.placed])
                for a in self.cluster.ledger.on_node(node)
            ],
        )

    def _unschedulable(
        self, pod: Mapping[str, Any], total: int, failures: dict[str, tuple[str, str]]
    ) -> None:
        key = _key(pod)
        message = failure_message(total, failures)
        self.unschedulable += 1
        self.metrics.request("schedule", "unschedulable")
        current = next(
            (
                c
                for c in loose_list(PodView(pod).status.get("conditions"))
                if isinstance(c, Mapping) and c.get("type") == "PodScheduled"
            ),
            None,
        )
        if (
            current is None
            or current.get("status") != "False"
            or current.get("reason") != "Unschedulable"
            or current.get("message") != message
        ):
            condition = {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": message,
                "lastProbeTime": None,
                "lastTransitionTime": api_time(self.clock),
            }
            try:
                self.client.patch_status(
                    PODS, key[1], {"status": {"conditions": [condition]}}, key[0],
                    patch_type="strategic",
                )  # fmt: skip
            except ApiNotFound:
                return
            except CorepinError as exc:
                log.warning("event=condition_failed pod=%s/%s error=%s", *key, exc)
        self.events.event(pod, "Warning", "FailedScheduling", message)
        self.pending.park(key)
        log.info("event=unschedulable pod=%s/%s why=%s", key[0], key[1], message)

    # ------------------------------------------------------------------ binding
    def _binder(self) -> None:
        while True:
            item = self._binds.get()
            if item is None or self._stop.is_set():
                return
            pod, request, node, result, created = item
            try:
                self._bind(pod, request, node, result, created)
            except Exception:
                log.exception("event=bind_crashed pod=%s", request.key)
                self.cluster.forget_pod(request.uid)
                self.pending.retry_later(_key(pod))
            finally:
                with self._lock:
                    self._binding.discard(request.uid)

    def _bind(
        self,
        pod: Mapping[str, Any],
        request: PodRequest,
        node: str,
        result: Fit,
        created: str | None,
    ) -> None:
        key = _key(pod)
        try:
            self.client.bind(key[0], key[1], node, uid=request.uid or None)
        except (ApiConflict, ApiNotFound) as exc:
            # bound meanwhile (or gone): the informer shows where; nothing to retry
            self.cluster.forget_pod(request.uid)
            self.metrics.binding("conflict")
            log.info("event=bind_skipped pod=%s/%s error=%s", *key, exc)
            return
        except CorepinError as exc:
            # our PodCPUBinding stays (the pod is not bound, so no agent applies it): the
            # next try rewrites it, and it goes with the pod (owner reference)
            self.cluster.forget_pod(request.uid)
            self.metrics.binding("failed")
            self.events.event(
                pod, "Warning", "FailedScheduling", f"binding to node {node} failed: {exc}"
            )
            self.pending.retry_later(key)
            return
        self.scheduled += 1
        self.metrics.binding("bound")
        self.metrics.request("schedule", "scheduled")
        self.pending.bound(key)
        cpus = ", ".join(f"{p.container}: {p.cpus}" for p in result.placed)
        self.events.event(
            pod,
            "Normal",
            "Scheduled",
            f"Successfully assigned {key[0]}/{key[1]} to {node}"
            + (f" (CPUs {cpus})" if cpus and self.settings.bind_cpus else ""),
        )
        log.info(
            "event=scheduled pod=%s/%s node=%s cpus=%s binding=%s",
            key[0],
            key[1],
            node,
            cpus,
            created or "-",
        )


__all__ = ["Scheduler", "SchedulerSettings"]
