"""The controller's loop for one leadership term: three informers (pods, PodCPUBindings,
NodeCPUTopologies), handlers that turn changes into work-queue keys, one worker that
processes the keys, and the writes with optimistic concurrency. The rules themselves are in
`corepin.agent.cluster.controller` (overview) and `rules` (decisions).

Work keys (deduplicated by the queue):
- `("binding", namespace, name)`: delete the binding when its pod is gone, give a user-written
  one an owner reference to its pod, then have its node decided (or decide it alone when it
  has no node: pod missing or not scheduled, spec unreadable);
- `("node", name)`: decide every user-written binding whose pod runs on the node (conflicts
  are a per-node question) and write the statuses that change;
- `("topology", name)`: the heartbeat check of the node's NodeCPUTopology (re-queued with a
  delay until its heartbeat would be stale).

Every write carries the resourceVersion read; a 409 Conflict re-reads the object (a GET),
decides again on what it now says, and writes again (at most `conflict_retries` times, then
the key is re-queued with backoff). Statuses go through the status subresource.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Final

from corepin.agent.cluster.controller import rules
from corepin.agent.cluster.controller.metrics import ControllerMetrics
from corepin.core.errors import (
    ApiConflict,
    ApiError,
    ApiNotFound,
    ApiUnreachable,
    CorepinError,
)
from corepin.core.record import record
from corepin.kube.client import KubeClient, Resource
from corepin.kube.events import EventRecorder
from corepin.kube.informer import Informer, InformerStats
from corepin.kube.models import (
    HEARTBEAT_STALE,
    NCPT_PLURAL,
    PCB_PLURAL,
    READY,
    VALIDATED,
    Condition,
    FieldError,
    ObjectMeta,
    PodCPUBinding,
    find_condition,
    is_agent_binding,
    pod_owner,
    pod_owner_uid,
    set_condition,
)
from corepin.kube.resources import NCPT, PCB, PODS
from corepin.kube.workqueue import WorkQueue

Obj = dict[str, Any]
Key = tuple[str, ...]

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


class ConflictsExhausted(CorepinError):
    """A write kept meeting 409 Conflict: the key is queued again with backoff."""

    default_reason = "conflicts_exhausted"


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


#: the NodeCPUTopology status fields the decisions read (not the heartbeat, not the conditions)
_ACCOUNTING: Final = (
    "reservedCPUs",
    "sharedPool",
    "free",
    "isolatedCPUs",
    "allocations",
)


def _accounting(ncpt: Mapping[str, Any]) -> tuple[Any, ...]:
    status = ncpt.get("status")
    status = status if isinstance(status, Mapping) else {}
    return tuple(status.get(k) for k in _ACCOUNTING)


def _label(namespace: str, name: str) -> str:
    return f"{namespace}/{name}" if namespace else name


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
        self._clock = clock
        self._monotonic = monotonic
        watch = self.settings.watch_timeout
        self.pods = Informer(client, PODS, watch_timeout=watch, name="controller-pods")
        self.bindings = Informer(client, BINDINGS, watch_timeout=watch, name="controller-bindings")
        self.topologies = Informer(
            client, TOPOLOGIES, watch_timeout=watch, name="controller-topologies"
        )
        self.queue: WorkQueue[Key] = WorkQueue(monotonic=monotonic)
        self.events = EventRecorder(client, self.settings.component)
        self._lock = threading.Lock()
        self._life = threading.Lock()
        # (namespace, pod name) -> names of the bindings that name that pod
        self._by_pod: dict[tuple[str, str], set[str]] = {}
        # node name -> (heartbeatTime text or None, monotonic time it was first seen)
        self._beats: dict[str, tuple[str | None, float]] = {}
        # (namespace, binding name) -> (resourceVersion our last status write replaced, the
        # object it returned): newer than a cached copy still at that version (worker only)
        self._written: dict[tuple[str, str], tuple[str, Obj]] = {}
        # node name -> (spec, status accounting, facts): NodeCPUTopology parsed once per change
        self._facts: dict[str, tuple[Any, Any, rules.NodeFacts]] = {}
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

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> Controller:
        """Start the informers, the event writer and the worker (nothing once stopped)."""
        with self._life:
            if self._worker is not None:
                raise RuntimeError("the controller was started already")
            if self._stopping.is_set():
                return self
            self.events.start()
            for informer in (self.pods, self.bindings, self.topologies):
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
        for informer in (self.pods, self.bindings, self.topologies):
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
        }

    def bindings_by_phase(self) -> Mapping[tuple[str, str], int]:
        counts: dict[tuple[str, str], int] = {}
        for obj in self.bindings.cache.list():
            writer = "agent" if is_agent_binding(_meta(obj).get("labels")) else "user"
            key = (writer, rules.status_phase(obj))
            counts[key] = counts.get(key, 0) + 1
        return counts

    # ------------------------------------------------------------------ handlers
    def _binding_pod(self, obj: Mapping[str, Any]) -> tuple[str, str]:
        spec = obj.get("spec")
        pod = spec.get("podName") if isinstance(spec, Mapping) else None
        return (str(_meta(obj).get("namespace") or ""), str(pod or ""))

    def _binding_added(self, obj: Obj) -> None:
        ns, name = str(_meta(obj).get("namespace") or ""), str(_meta(obj).get("name") or "")
        with self._lock:
            self._by_pod.setdefault(self._binding_pod(obj), set()).add(name)
        self.queue.add(("binding", ns, name))

    def _binding_updated(self, old: Obj, new: Obj) -> None:
        ns, name = str(_meta(new).get("namespace") or ""), str(_meta(new).get("name") or "")
        before, after = self._binding_pod(old), self._binding_pod(new)
        if before != after:
            with self._lock:
                self._by_pod.get(before, set()).discard(name)
                self._by_pod.setdefault(after, set()).add(name)
        self.queue.add(("binding", ns, name))

    def _binding_deleted(self, obj: Obj) -> None:
        name = str(_meta(obj).get("name") or "")
        pod_key = self._binding_pod(obj)
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
        ns, pod_name = self._binding_pod(obj)
        pod = self.pods.cache.get(pod_name, ns)
        if pod is not None:
            node = rules.pod_facts(pod).node
            if node:
                return node
        status = obj.get("status")
        found = status.get("nodeName") if isinstance(status, Mapping) else None
        return str(found) if found else None

    def _bindings_of_pod(self, pod: Obj) -> list[str]:
        key = (str(_meta(pod).get("namespace") or ""), str(_meta(pod).get("name") or ""))
        with self._lock:
            return sorted(self._by_pod.get(key, ()))

    def _pod_added(self, pod: Obj) -> None:
        ns = str(_meta(pod).get("namespace") or "")
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

    def _observe_heartbeat(self, obj: Obj) -> None:
        name = str(_meta(obj).get("name") or "")
        status = obj.get("status")
        beat = status.get("heartbeatTime") if isinstance(status, Mapping) else None
        text = str(beat) if beat else None
        with self._lock:
            seen = self._beats.get(name)
            if seen is None or seen[0] != text:
                self._beats[name] = (text, self._monotonic())

    def _topology_added(self, obj: Obj) -> None:
        name = str(_meta(obj).get("name") or "")
        self._observe_heartbeat(obj)
        self.queue.add(("topology", name))
        self.queue.add(("node", name))

    def _topology_updated(self, old: Obj, new: Obj) -> None:
        name = str(_meta(new).get("name") or "")
        self._observe_heartbeat(new)
        self.queue.add(("topology", name))
        if old.get("spec") != new.get("spec") or _accounting(old) != _accounting(new):
            self.queue.add(("node", name))

    def _topology_deleted(self, obj: Obj) -> None:
        name = str(_meta(obj).get("name") or "")
        with self._lock:
            self._beats.pop(name, None)
            self._facts.pop(name, None)
        self.queue.add(("node", name))

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
            self._sync_binding(key[1], key[2])
        elif kind == "node":
            self._sync_node(key[1])
        elif kind == "topology":
            self._sync_topology(key[1])

    # ------------------------------------------------------------------ pods
    def _cached_pod(self, namespace: str, name: str) -> rules.PodFacts | None:
        pod = self.pods.cache.get(name, namespace)
        return None if pod is None else rules.pod_facts(pod)

    def _read_pod(self, namespace: str, name: str) -> rules.PodFacts | None:
        """The pod as the API has it now (a GET: the cache may not have seen it yet)."""
        if not name:
            return None
        try:
            return rules.pod_facts(self.client.get(PODS, name, namespace))
        except ApiNotFound:
            return None

    # ------------------------------------------------------------------ bindings
    def _current(self, obj: Obj) -> Obj:
        """The cached binding, or what our last status write of it returned while the cache
        still holds the version that write replaced (its watch event is on the way): deciding
        on the older copy would write again only to get a 409."""
        meta = _meta(obj)
        key = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        written = self._written.get(key)
        if written is None:
            return obj
        if written[0] == meta.get("resourceVersion"):
            return written[1]
        del self._written[key]  # the cache has moved on (to our write or past it)
        return obj

    def _sync_binding(self, namespace: str, name: str) -> None:
        obj = self.bindings.cache.get(name, namespace)
        if obj is None:
            self._written.pop((namespace, name), None)
            return
        obj = self._current(obj)
        try:
            meta = ObjectMeta.from_dict(_meta(obj))
        except FieldError as exc:
            self._write_verdict(obj, rules.invalid_spec(exc))
            return
        agent = is_agent_binding(meta.labels)
        pod_name = self._binding_pod(obj)[1]
        owner = pod_owner_uid(meta.owner_references, pod_name)
        pod = self._cached_pod(namespace, pod_name) if pod_name else None
        if owner is not None and (pod is None or pod.uid != owner):
            pod = self._read_pod(namespace, pod_name)
            if pod is None or pod.uid != owner:
                self._delete_orphan(obj, owner, pod)
                return
        if agent:
            node = self._node_of(obj, pod)
            if node:
                self.queue.add(("node", node))
            return
        try:
            binding = PodCPUBinding.from_dict(obj)
        except FieldError as exc:
            self._write_verdict(obj, rules.invalid_spec(exc))
            return
        if pod is None:
            pod = self._read_pod(namespace, pod_name)
        if pod is not None and owner is None:
            self._adopt(obj, pod)
        if pod is not None and pod.node:
            self.queue.add(("node", pod.node))
            return
        self._write_verdict(obj, rules.check_binding(binding, pod, None))

    def _node_of(self, obj: Mapping[str, Any], pod: rules.PodFacts | None) -> str | None:
        if pod is not None and pod.node:
            return pod.node
        status = obj.get("status")
        found = status.get("nodeName") if isinstance(status, Mapping) else None
        return str(found) if found else None

    def _delete_orphan(self, obj: Obj, owner: str, pod: rules.PodFacts | None) -> None:
        """Delete a binding whose pod (uid `owner`) is gone (`pod` is what has the name now,
        if anything), with the binding's uid and resourceVersion as preconditions; on 409
        re-read and decide again."""
        for _ in range(self.settings.conflict_retries):
            meta = _meta(obj)
            ns, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
            pod_name = self._binding_pod(obj)[1]
            try:
                self.client.delete(
                    BINDINGS,
                    name,
                    ns,
                    uid=str(meta.get("uid") or "") or None,
                    resource_version=str(meta.get("resourceVersion") or "") or None,
                )
            except ApiNotFound:
                return
            except ApiConflict:
                reread = self._reread_after_conflict(BINDINGS, name, ns)
                if reread is None:
                    return
                fresh = reread
                fresh_owner = pod_owner_uid(
                    ObjectMeta.from_dict(_meta(fresh)).owner_references, pod_name
                )
                if fresh_owner is None or fresh.get("metadata", {}).get("uid") != meta.get("uid"):
                    self.queue.add(("binding", ns, name))
                    return
                obj, owner = fresh, fresh_owner
                pod = self._read_pod(ns, pod_name)
                if pod is not None and pod.uid == owner:
                    return  # the pod is there after all
                continue
            self.metrics.orphans_deleted.inc()
            why = (
                f"pod {ns}/{pod_name} (uid {owner}) is gone"
                if pod is None or not pod.uid
                else f"pod {ns}/{pod_name} is now uid {pod.uid}, not {owner}"
            )
            log.info("event=orphan_deleted binding=%s/%s pod_uid=%s", ns, name, owner)
            self.events.event(obj, "Normal", "OrphanDeleted", f"deleted: {why}")
            return
        raise ConflictsExhausted(f"deleting orphaned binding {_label(*self._key_of(obj))}")

    def _reread_after_conflict(
        self, resource: Resource, name: str, namespace: str | None = None
    ) -> Obj | None:
        """After a 409 on a write: count it and read the object again (None: it is gone, so
        there is nothing left to write)."""
        self.metrics.conflicts.labels(resource.plural).inc()
        try:
            return self.client.get(resource, name, namespace)
        except ApiNotFound:
            return None

    @staticmethod
    def _key_of(obj: Mapping[str, Any]) -> tuple[str, str]:
        meta = _meta(obj)
        return (str(meta.get("namespace") or ""), str(meta.get("name") or ""))

    def _adopt(self, obj: Obj, pod: rules.PodFacts) -> None:
        """Give a user-written binding an owner reference to its pod (so it goes with that
        pod incarnation, by the garbage collector or by this controller)."""
        for _ in range(self.settings.conflict_retries):
            body = {k: v for k, v in obj.items() if k != "status"}
            meta = dict(_meta(obj))
            owners = list(meta.get("ownerReferences") or [])
            owners.append(pod_owner(pod.name, pod.uid).to_dict())
            meta["ownerReferences"] = owners
            body["metadata"] = meta
            ns, name = self._key_of(obj)
            try:
                self.client.replace(BINDINGS, body, ns)
            except ApiNotFound:
                return
            except ApiConflict:
                reread = self._reread_after_conflict(BINDINGS, name, ns)
                if reread is None:
                    return
                obj = reread
                fresh = ObjectMeta.from_dict(_meta(obj))
                if pod_owner_uid(fresh.owner_references, pod.name) is not None:
                    return
                continue
            self.metrics.adopted.inc()
            log.info("event=adopted binding=%s/%s pod=%s pod_uid=%s", ns, name, pod.name, pod.uid)
            return
        raise ConflictsExhausted(f"adopting binding {_label(*self._key_of(obj))}")

    # ------------------------------------------------------------------ nodes
    def _node_facts(self, node: str) -> rules.NodeFacts | None:
        ncpt = self.topologies.cache.get(node)
        if ncpt is None:
            return None
        spec = ncpt.get("spec")
        accounting = _accounting(ncpt)
        with self._lock:
            cached = self._facts.get(node)
        if cached is not None and cached[0] == spec and cached[1] == accounting:
            return cached[2]
        facts = rules.node_facts(ncpt)
        with self._lock:
            self._facts[node] = (spec, accounting, facts)
        return facts

    def _entry(
        self, obj: Obj, node: str, facts: rules.NodeFacts | None
    ) -> tuple[rules.Entry, Obj] | None:
        """The binding as an entry of `node`'s decision, or None when it is not on `node`."""
        meta = _meta(obj)
        try:
            binding = PodCPUBinding.from_dict(obj)
        except FieldError:
            return None  # decided on its own (no node)
        agent = is_agent_binding(binding.metadata.labels)
        owner = pod_owner_uid(binding.metadata.owner_references, binding.spec.pod_name)
        if agent and (
            facts is None
            or not facts.confirms(
                binding.namespace, binding.spec.pod_name, owner, binding.spec.containers
            )
        ):
            # The label only says "not a request" (neither the agent nor this controller acts
            # on such a binding as one); it never makes a binding the agent's record. Anyone
            # who may create bindings may set it, so the record must be confirmed by what the
            # node's agent publishes through its NodeCPUTopology status (cluster scoped,
            # written by that node's agent only): an allocation of this pod uid and container
            # on exactly these CPUs. Unconfirmed (a forgery, or the agent's status not out
            # yet: the node is decided again when it is), it counts for nothing.
            return None
        phase = rules.status_phase(obj)
        holding = agent or phase in rules.HOLDING_PHASES
        pod = self._cached_pod(binding.namespace, binding.spec.pod_name)
        matches = pod is not None and (owner is None or owner == pod.uid)
        on = pod.node if matches and pod is not None else None
        if on is None and holding:
            on = self._node_of(obj, None)
        if on != node or not (matches or holding):
            return None
        cpus = rules.explicit_cpus(binding)
        if phase == "Applied" and not agent:
            cpus = cpus | rules.status_cpus(obj)
        claim = None
        if facts is not None and facts.topology is not None and cpus:
            claim = rules.claim_of(
                binding.namespace,
                binding.name,
                binding.spec.pod_name,
                binding.spec.level,
                cpus,
                facts.topology,
            )
        own = None if agent or not matches else rules.check_binding(binding, pod, facts)
        entry = rules.Entry(
            binding.namespace,
            binding.name,
            binding.spec.pod_name,
            str(meta.get("creationTimestamp") or ""),
            agent,
            holding,
            own,
            claim,
        )
        return entry, obj

    def _sync_node(self, node: str) -> None:
        facts = self._node_facts(node)
        entries: list[rules.Entry] = []
        objects: dict[tuple[str, str], Obj] = {}
        for cached in self.bindings.cache.list():
            obj = self._current(cached)
            found = self._entry(obj, node, facts)
            if found is not None:
                entries.append(found[0])
                objects[found[0].key] = found[1]
        for key, verdict in sorted(rules.decide_node(node, entries).items()):
            self._write_verdict(objects[key], verdict)

    # ------------------------------------------------------------------ status writes
    def _write_verdict(self, obj: Obj, verdict: rules.Verdict) -> None:
        """Write the status `verdict` calls for (nothing when it is there already)."""
        ns, name = self._key_of(obj)
        uid = _meta(obj).get("uid")
        generation = _meta(obj).get("generation")
        for _ in range(self.settings.conflict_retries):
            old = obj.get("status") if isinstance(obj.get("status"), Mapping) else None
            status = rules.next_status(old, verdict, self._clock())
            if status is None:
                return
            body = {**obj, "status": status}
            try:
                written = self.client.replace_status(BINDINGS, body, ns)
            except ApiNotFound:
                return
            except ApiConflict:
                reread = self._reread_after_conflict(BINDINGS, name, ns)
                if reread is None:
                    return
                obj = reread
                fresh = _meta(obj)
                if fresh.get("uid") != uid or fresh.get("generation") != generation:
                    # the spec (or the object) changed: decide it again from scratch
                    self.queue.add(("binding", ns, name))
                    return
                continue
            replaced = _meta(obj).get("resourceVersion")
            if replaced and isinstance(written, Mapping) and _meta(written).get("resourceVersion"):
                self._written[(ns, name)] = (str(replaced), written)
            self._report(obj, old, status, verdict)
            return
        raise ConflictsExhausted(f"writing the status of binding {ns}/{name}")

    def _report(
        self, obj: Obj, old: Mapping[str, Any] | None, new: Mapping[str, Any], v: rules.Verdict
    ) -> None:
        ns, name = self._key_of(obj)
        before = str((old or {}).get("phase") or "Pending")
        after = str(new.get("phase") or "Pending")
        self.metrics.verdicts.labels(v.phase, v.reason).inc()
        log.info(
            "event=binding_status binding=%s/%s phase=%s previous=%s reason=%s node=%s message=%r",
            ns,
            name,
            after,
            before,
            v.reason,
            v.node or "",
            v.message,
        )
        old_conditions = rules.read_conditions(old or {})
        previous = find_condition(old_conditions, VALIDATED)
        changed = (
            previous is None
            or previous.reason != v.reason
            or previous.status != v.condition_status
            or before != after
        )
        if changed:
            kind = "Warning" if v.phase == rules.FAILED else "Normal"
            reason = VALIDATED if v.phase == rules.VALID else v.reason
            self.events.event(obj, kind, reason, v.message)

    # ------------------------------------------------------------------ heartbeats
    def _sync_topology(self, name: str) -> None:
        obj = self.topologies.cache.get(name)
        if obj is None:
            return
        with self._lock:
            seen = self._beats.get(name)
        if seen is None:
            self._observe_heartbeat(obj)
            with self._lock:
                seen = self._beats[name]
        beat, since = seen
        timeout = self.settings.heartbeat_timeout
        quiet = self._monotonic() - since
        if quiet < timeout:
            self.queue.add_after(("topology", name), timeout - quiet + 0.01)
            return
        ready = find_condition(rules.read_conditions(obj.get("status") or {}), READY)
        if ready is not None and ready.status == "False":
            return  # not trusted already; the agent sets Ready=True when it is back
        self._mark_stale(obj, beat, quiet)

    def _mark_stale(self, obj: Obj, beat: str | None, quiet: float) -> None:
        name = str(_meta(obj).get("name") or "")
        timeout = self.settings.heartbeat_timeout
        if beat is None:
            message = (
                f"the corepin agent of node {name} has not reported a heartbeat "
                f"(status.heartbeatTime) in the {quiet:.0f} s this controller has watched "
                f"(timeout {timeout:g} s): do not trust this topology"
            )
        else:
            message = (
                f"status.heartbeatTime {beat} has not changed for {quiet:.0f} s (timeout "
                f"{timeout:g} s): the corepin agent of node {name} stopped reporting; do not "
                "trust this topology until it reports again"
            )
        for _ in range(self.settings.conflict_retries):
            status = dict(obj.get("status") or {})
            conditions = rules.read_conditions(status)
            condition = Condition(READY, "False", self._clock(), HEARTBEAT_STALE, message)
            status["conditions"] = [c.to_dict() for c in set_condition(conditions, condition)]
            body = {**obj, "status": status}
            try:
                self.client.replace_status(TOPOLOGIES, body)
            except ApiNotFound:
                return
            except ApiConflict:
                reread = self._reread_after_conflict(TOPOLOGIES, name)
                if reread is None:
                    return
                obj = reread
                fresh = (obj.get("status") or {}).get("heartbeatTime")
                if (str(fresh) if fresh else None) != beat:
                    self._observe_heartbeat(obj)
                    return  # the agent is alive: nothing to mark
                continue
            self.metrics.stale_heartbeats.inc()
            log.warning(
                "event=heartbeat_stale node=%s heartbeat=%s quiet_seconds=%.0f timeout=%g",
                name,
                beat or "none",
                quiet,
                timeout,
            )
            self.events.event(obj, "Warning", HEARTBEAT_STALE, message)
            return
        raise ConflictsExhausted(f"marking NodeCPUTopology {name} not Ready")


__all__ = ["BINDINGS", "TOPOLOGIES", "Controller", "ControllerSettings"]
