"""`corepin scheduler`: a second scheduler for pods whose `spec.schedulerName` is its name.

Threads and data flow:
- informers (`feed.PlacementFeed`, with nodes) keep NodeCPUTopologies, user PodCPUBindings,
  pods and nodes; a pending pod of ours (no node yet, not being deleted) is put on the queue
  when it appears or changes;
- one scheduling thread, while this replica holds the Lease (`corepin.kube.leader`), takes
  pods off the queue one at a time: the node checks (cordon, taints, nodeSelector), then the
  placement core on every remaining node (`Cluster.evaluate`: fit as the node's agent would
  pin, score by profile and workload family), the best node (ties: lowest name), and the
  placement is counted in flight at once (`Cluster.assume`), so the next pod already sees it;
- binder threads bind (`pods/binding`); with `bind_cpus` they first create a PodCPUBinding
  naming the exact CPUs of every exclusive container, as a user would (the agent honours it),
  and delete it again when the bind fails. A failed bind forgets the placement and retries
  the pod with a backoff;
- a pod that fits nowhere stays Pending: its `PodScheduled` condition becomes False (reason
  `Unschedulable`, via the status subresource) and a Warning Event `FailedScheduling` says why
  per node; it is tried again when a topology, a node or a pod changes (at most once a
  second) and at least every `retry_every` seconds.
"""

from __future__ import annotations

import datetime as dt
import logging
import queue
import socket
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Final

from corepin.agent.cluster.catalog import PlacementFeed
from corepin.agent.cluster.scheduler.metrics import PlacementMetrics
from corepin.core.errors import ApiAlreadyExists, ApiConflict, ApiNotFound, CorepinError
from corepin.core.record import record
from corepin.kube.models import PCB_KIND
from corepin.kube.resources import PCB
from corepin.placement.cluster import Cluster
from corepin.placement.taints import failure_message, node_refusal

if TYPE_CHECKING:
    from corepin.kube.client import KubeClient
    from corepin.placement.fit import Fit
    from corepin.placement.request import PodRequest

log = logging.getLogger("corepin.agent.cluster.scheduler")

Key = tuple[str, str]
#: label on the PodCPUBindings the scheduler creates (they are requests, like a user's)
CREATED_BY: Final = "corepin.io/created-by"
#: the node a PodCPUBinding is meant for (the agent's own label of its records, too)
NODE_LABEL: Final = "corepin.io/node"


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
    meta = pod.get("metadata") or {}
    return (str(meta.get("namespace") or "default"), str(meta.get("name") or ""))


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
        from corepin.kube.events import EventRecorder
        from corepin.kube.leader import LeaderElector

        self.client = client
        self.settings = settings
        self.clock = clock
        self.metrics = metrics or PlacementMetrics()
        self.cluster = Cluster(
            profile=settings.profile,
            stale_after=settings.stale_after,
            assume_ttl=settings.assume_ttl,
        )
        self.feed = PlacementFeed(
            client,
            self.cluster,
            nodes=True,
            on_pod=self._pod_event,
            on_topology=lambda _name: self._changed(),
            clock=clock,
        )
        assert self.feed.nodes is not None
        self.feed.nodes.add_handlers(
            on_add=lambda _o: self._changed(),
            on_update=lambda _old, _new: self._changed(),
            on_delete=lambda _o: self._changed(),
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
            on_started_leading=self._changed,
        )
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._queue: list[Key] = []
        self._queued: set[Key] = set()
        self._parked: dict[Key, float] = {}  # unschedulable pods -> when they were last tried
        self._delayed: dict[Key, float] = {}  # pods retried after a failed bind -> when
        self._backoff: dict[Key, float] = {}
        self._binding: set[str] = set()  # uids with a bind in flight
        self._changed_at = 0.0
        self._flushed_at = 0.0
        self._binds: queue.Queue[
            tuple[Mapping[str, Any], PodRequest, str, Fit, str | None] | None
        ] = queue.Queue()
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

    def stop(self, timeout: float = 3.0) -> None:
        """Stop within about `timeout` seconds (the Lease is released when leading)."""
        self._stop.set()
        with self._wake:
            self._wake.notify_all()
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
                idle = not self._queue and not self._binding and self._binds.empty()
            if idle:
                return True
            time.sleep(0.01)
        return False

    def _spawn(self, target: Callable[[], None], name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    # ------------------------------------------------------------------ queue
    def _ours(self, pod: Mapping[str, Any]) -> bool:
        spec = pod.get("spec") or {}
        meta = pod.get("metadata") or {}
        phase = (pod.get("status") or {}).get("phase")
        return (
            spec.get("schedulerName") == self.settings.name
            and not spec.get("nodeName")
            and not meta.get("deletionTimestamp")
            and phase not in ("Succeeded", "Failed")
        )

    def _enqueue(self, key: Key) -> None:
        with self._wake:
            if key not in self._queued:
                self._queued.add(key)
                self._queue.append(key)
                self._wake.notify()

    def _pod_event(self, what: str, pod: Mapping[str, Any]) -> None:
        key = _key(pod)
        if what == "delete":
            with self._lock:
                self._parked.pop(key, None)
                self._backoff.pop(key, None)
            if (pod.get("spec") or {}).get("nodeName"):
                self._changed()  # its CPUs come free
            return
        if not self._ours(pod):
            with self._lock:
                self._parked.pop(key, None)
            return
        with self._lock:
            if key in self._parked or key in self._delayed:
                return  # tried again on a change of the cluster (or after its backoff)
        self._enqueue(key)

    def _changed(self) -> None:
        with self._wake:
            self._changed_at = time.monotonic()
            self._wake.notify()

    def _next(self) -> Key | None:
        """The next pod to schedule (None to look at the lease and the clock again)."""
        with self._wake:
            now = time.monotonic()
            flush = (self._changed_at > self._flushed_at and now - self._flushed_at >= 1.0) or (
                self._parked and now - self._flushed_at >= self.settings.retry_every
            )
            if flush and self._parked:
                self._flushed_at = now
                for key in sorted(self._parked):
                    if key not in self._queued:
                        self._queued.add(key)
                        self._queue.append(key)
                self._parked.clear()
            elif flush:
                self._flushed_at = now
            for key, when in list(self._delayed.items()):
                if when <= now:
                    del self._delayed[key]
                    if key not in self._queued:
                        self._queued.add(key)
                        self._queue.append(key)
            if not self._queue:
                self._wake.wait(0.2)
                return None
            key = self._queue.pop(0)
            self._queued.discard(key)
            return key

    # ------------------------------------------------------------------ scheduling
    def _loop(self) -> None:
        while not self._stop.is_set():
            if not self.elector.is_leader:
                self._stop.wait(0.1)
                continue
            key = self._next()
            if key is None:
                continue
            pod = self.feed.pods.cache.get(key[1], key[0])
            if pod is None or not self._ours(pod):
                continue
            uid = str((pod.get("metadata") or {}).get("uid") or "")
            with self._lock:
                if uid in self._binding:
                    continue
            try:
                with self.metrics.timed("schedule"):
                    self._schedule(pod)
            except CorepinError as exc:
                self.metrics.requests.labels("schedule", "error").inc()
                log.warning("event=schedule_failed pod=%s/%s error=%s", *key, exc)
                self._retry_later(key)
            except Exception:  # a bug: keep scheduling the others, say what happened
                self.metrics.requests.labels("schedule", "error").inc()
                log.exception("event=schedule_crashed pod=%s/%s", *key)
                self._retry_later(key)

    def _candidates(self, pod: Mapping[str, Any]) -> tuple[list[str], dict[str, tuple[str, str]]]:
        """Nodes the pod may go to by the non-CPU checks, and the refusals of the others."""
        assert self.feed.nodes is not None
        names: list[str] = []
        refused: dict[str, tuple[str, str]] = {}
        for node in self.feed.nodes.cache.list():
            name = str((node.get("metadata") or {}).get("name") or "")
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
            view = self.cluster.view(best.node)
            log.debug(
                "event=placing pod=%s node=%s cpus=%s published_free=%s in_flight=%s",
                request.key,
                best.node,
                [str(p.withheld) for p in best.fit.placed],
                (
                    view.pools.free,
                    [(a.pod, str(a.cpus), a.level) for a in view.allocations],
                )
                if view is not None
                else "-",
                [
                    (a.request.name, [str(p.withheld) for p in a.placed])
                    for a in self.cluster.ledger.on_node(best.node)
                ],
            )
        created = self._promise(request, best.node, best.fit)
        if created is not None:
            request = _with_cpus(request, best.fit)
        self.cluster.assume(request, best.node, best.fit, now)
        with self._lock:
            self._binding.add(request.uid)
            self._parked.pop(_key(pod), None)
        self._binds.put((pod, request, best.node, best.fit, created))

    def _unschedulable(
        self, pod: Mapping[str, Any], total: int, failures: dict[str, tuple[str, str]]
    ) -> None:
        from corepin.kube.resources import PODS

        key = _key(pod)
        message = failure_message(total, failures)
        self.unschedulable += 1
        self.metrics.requests.labels("schedule", "unschedulable").inc()
        current = next(
            (
                c
                for c in (pod.get("status") or {}).get("conditions") or []
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
                "lastTransitionTime": _now_text(self.clock),
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
        with self._lock:
            self._parked[key] = time.monotonic()
        log.info("event=unschedulable pod=%s/%s why=%s", key[0], key[1], message)

    def _retry_later(self, key: Key) -> None:
        with self._lock:
            delay = min(
                self.settings.backoff_max,
                self._backoff.get(key, self.settings.backoff_initial / 2) * 2,
            )
            self._backoff[key] = delay
            self._delayed[key] = time.monotonic() + delay

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
                self._retry_later(_key(pod))
            finally:
                with self._lock:
                    self._binding.discard(request.uid)

    def _binding_body(self, request: PodRequest, result: Fit, node: str) -> dict[str, Any] | None:
        from corepin.kube.models import API_VERSION, crd_level, pod_owner

        rows = [
            {"name": p.container, "cpuSet": [{"cpuID": c} for c in p.cpus]}
            for p in result.placed
            if p.kind == "exclusive"
        ]
        if not rows:
            return None
        level = next(p.level for p in result.placed if p.kind == "exclusive")
        return {
            "apiVersion": API_VERSION,
            "kind": PCB_KIND,
            "metadata": {
                "name": f"{request.name}.{self.settings.name}"[:253],
                "namespace": request.namespace,
                # the node label lets the node's agent keep the CPUs for the pod before it
                # sees the pod itself (its pod watch may lag behind its binding watch)
                "labels": {CREATED_BY: self.settings.name, NODE_LABEL: node},
                "ownerReferences": [pod_owner(request.name, request.uid).to_dict()],
            },
            "spec": {
                "podName": request.name,
                "exclusivenessLevel": crd_level(level),
                "containers": rows,
            },
        }

    def _promise(self, request: PodRequest, node: str, result: Fit) -> str | None:
        """With `bind_cpus`: create the pod's PodCPUBinding of the chosen CPUs (in the
        scheduling thread, so the bindings exist in the order pods are placed, before any later
        pod is bound), or rewrite ours from an earlier try; its name, or None when there is
        nothing to bind or the user wrote a binding of their own (it is honoured as it is)."""
        if not self.settings.bind_cpus:
            return None
        existing = self.feed.binding_for(request.namespace, request.name)
        labels = ((existing or {}).get("metadata") or {}).get("labels") or {}
        if existing is not None and labels.get(CREATED_BY) != self.settings.name:
            return None
        body = self._binding_body(request, result, node)
        if body is None:
            return None
        name = str(body["metadata"]["name"])
        try:
            self.client.create(PCB, body, request.namespace)
        except ApiAlreadyExists:
            # ours from an earlier try (a failed bind): point it at this choice
            self.client.patch(
                PCB,
                name,
                {"metadata": {"labels": body["metadata"]["labels"]}, "spec": body["spec"]},
                request.namespace,
            )
        self._validate(name, request.namespace, node)
        return name

    def _validate(self, name: str, namespace: str, node: str) -> None:
        """Mark our binding `Validated` (status subresource): the CPUs were chosen by the
        placement core against the node's published free set and the in-flight placements, so
        the node's agent applies them as soon as it sees the pod, without waiting for the
        controller (which checks the binding again like any other). Refused (no RBAC for
        `podcpubindings/status`, say): the controller validates it instead."""
        condition = {
            "type": "Validated",
            "status": "True",
            "reason": "ChosenByScheduler",
            "message": f"CPUs chosen by {self.settings.name} on node {node}",
            "lastTransitionTime": _now_text(self.clock),
        }
        status = {"phase": "Validated", "nodeName": node, "conditions": [condition]}
        try:
            self.client.patch_status(PCB, name, {"status": status}, namespace)
        except CorepinError as exc:
            log.warning("event=binding_not_validated binding=%s/%s error=%s", namespace, name, exc)

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
            self.metrics.bindings.labels("conflict").inc()
            log.info("event=bind_skipped pod=%s/%s error=%s", *key, exc)
            return
        except CorepinError as exc:
            # our PodCPUBinding stays (the pod is not bound, so no agent applies it): the
            # next try rewrites it, and it goes with the pod (owner reference)
            self.cluster.forget_pod(request.uid)
            self.metrics.bindings.labels("failed").inc()
            self.events.event(
                pod, "Warning", "FailedScheduling", f"binding to node {node} failed: {exc}"
            )
            self._retry_later(key)
            return
        self.scheduled += 1
        self.metrics.bindings.labels("bound").inc()
        self.metrics.requests.labels("schedule", "scheduled").inc()
        with self._lock:
            self._backoff.pop(key, None)
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


def _with_cpus(request: PodRequest, result: Fit) -> PodRequest:
    """`request` as the agent will read it once our PodCPUBinding is there: its exclusive
    containers on exactly the chosen CPUs."""
    from corepin.core.record import replace

    chosen = {p.container: p.cpus for p in result.placed if p.kind == "exclusive"}
    containers = tuple(
        replace(c, cpus=chosen[c.name]) if c.name in chosen else c for c in request.containers
    )
    return replace(request, containers=containers)


def _now_text(clock: Callable[[], float]) -> str:
    stamp = dt.datetime.fromtimestamp(clock(), dt.UTC)
    return stamp.strftime("%Y-%m-%dT%H:%M:%SZ")


__all__ = ["CREATED_BY", "Scheduler", "SchedulerSettings"]
