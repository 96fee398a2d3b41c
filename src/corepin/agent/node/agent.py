"""The Kubernetes node agent (`corepin agent`): pods of one node in, pinned containers out.

Threads and data flow:
- informers (`watches.py`) for the node's pods, the node itself (reservation annotation) and
  PodCPUBindings; their handlers only put keys on the work queue;
- one worker takes keys off the queue, so every decision is made in order, one at a time: for
  a pod it plans and decides in one state transaction (`decide.py`, `sync.py`; `store.py`: the
  node's one pool model and checkpoint shared with host mode), raises or re-sizes the system
  shield (`shield.py`), writes the container cgroups (`enforce.py`, re-pinning every shared
  container when the pool changed) and tells Events (`tell.py`);
- one publisher (`publish.py`) writes to the API and the assignment directory: the pod
  annotation `corepin.io/cpus` and one PodCPUBinding per pinned container (`records.py`), the
  assignment files (`files.py`), the node's NodeCPUTopology and NodeResourceTopology
  (`nodetopology.py`);
- a timer puts a heartbeat key every `heartbeat_period` and a resync key every
  `resync_period` (every pod again, every cgroup checked for drift - zero writes when none);
- node QoS (`qos.py`): the class of each container (`qosclass.py`), the policy in force (the
  `corepin-qos` ConfigMap's informer, the file: `qospolicy.py`) and the QoS loop's thread,
  which puts a `qos` key when the best-effort CPU set changed (BE containers get that set).

Restart (`restore.py`): the checkpoint is validated against the live topology, assignments of
pods that are gone are released, and the agent's own PodCPUBindings fill in what a lost
checkpoint forgot, all before the first pod is looked at - a CPU is never handed out twice
across a restart. Agent bindings and assignment files of pods that are gone are deleted then and
on every resync, and every table kept per pod goes with its pod.

One agent per node: `start` first takes the node lock (`lock.py`), so a second agent of the
node reads and writes nothing until the first is gone.

One pod never stops the others: a pod whose sync, quota or Events fail is logged and told (a
Warning Event), and the batch goes on without it; each API write and assignment file is done on
its own.

The agent refuses to start next to the kubelet's static CPU manager (its cpu_manager_state
names policy `static`) unless `kubelet_compat`, which imports the kubelet's assignments and
leaves them alone.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final, NoReturn

from corepin.agent.node.decide import Decider, PodWork
from corepin.agent.node.devices import DeviceSource
from corepin.agent.node.enforce import ContainerCgroups, cpu_limits
from corepin.agent.node.files import AssignmentFiles
from corepin.agent.node.hooks import Hooks
from corepin.agent.node.lock import NodeLock
from corepin.agent.node.move import Mover
from corepin.agent.node.nodetopology import TopologyPublisher
from corepin.agent.node.promises import Promises
from corepin.agent.node.publish import Key, Publisher
from corepin.agent.node.qos import NodeQos
from corepin.agent.node.rebalance import Rebalancer
from corepin.agent.node.records import PodRecords
from corepin.agent.node.reservation import NodeReservation
from corepin.agent.node.reservations import NodeReservations
from corepin.agent.node.restore import Restore
from corepin.agent.node.settings import NodeSettings
from corepin.agent.node.shield import SystemShield
from corepin.agent.node.store import NodeStore
from corepin.agent.node.sync import pod_assignments, shared_pool_users
from corepin.agent.node.tell import Teller
from corepin.agent.node.watches import Watches, annotations_changed, pod_uid
from corepin.agent.ports import AllocationSpec, StateFeed, Subscription
from corepin.allocation.policies import get_policy
from corepin.allocation.types import Policy
from corepin.core.errors import CorepinError, EnvironmentProblem, InputError
from corepin.enforcement.cgroups import CpuQuota
from corepin.enforcement.qos.engine import QosEngine
from corepin.kube.client import KubeClient
from corepin.kube.events import EventRecorder
from corepin.kube.models import AGENT_MANAGER, LABEL_MANAGED_BY, ObjectView
from corepin.state.kubelet import KUBELET_POLICY
from corepin.state.model import Assignment, HostState
from corepin.topology.model import Topology

log = logging.getLogger("corepin.agent.node")

#: keys handled in one state transaction at most
BATCH: Final = 256


class NodeAgent:
    """One node's agent. `start()` returns once the first full sync is done; `stop()` ends it."""

    def __init__(
        self,
        settings: NodeSettings,
        client: KubeClient,
        topology: Topology,
        cgroups: ContainerCgroups,
        *,
        hooks: Hooks | None = None,
        clock: Callable[[], float] = time.time,
        qos_engine: QosEngine | None = None,
    ) -> None:
        self.settings = settings
        self.client = client
        self.machine = topology
        self.cgroups = cgroups
        self.hooks = hooks or Hooks()
        policy: Policy = get_policy(settings.policy)
        self.events = EventRecorder(client, "corepin-agent", host=settings.node_name)
        self.feed = StateFeed()
        self.synced = threading.Event()
        self.errors = 0
        self.watches = Watches(client, settings.node_name)
        self.node_lock = NodeLock(settings.state_dir, settings.node_name)
        self.store = NodeStore(settings.state_dir, settings.proc_root, topology, self._committed)
        self.restore = Restore(settings, client, topology, clock)
        self.promises = Promises(self.watches, topology)
        self.teller = Teller(self.events, lambda: self.hooks.pinning(False, "not_enough_cpus"))
        self.devices = DeviceSource(settings.pod_resources_socket)
        self.decider = Decider(
            self.watches, topology, policy, cgroups, self.promises, self.teller, clock, self.devices
        )
        self.reservation = NodeReservation(
            settings.reserved_cpus, settings.options, self.watches.node, topology, self.events
        )
        self.shield = SystemShield(settings, cgroups)
        self.qos = NodeQos(
            settings,
            self.watches,
            self.store,
            cgroups,
            self.events,
            self.hooks,
            engine=qos_engine,
            wake=lambda: self._enqueue(("qos",)),
        )
        self.classes = self.qos.classes
        self.publisher = Publisher(
            self.store,
            self.watches,
            PodRecords(self.watches, clock, self.classes.of),
            AssignmentFiles(settings.assignment_dir, topology, self.watches),
            TopologyPublisher(
                settings,
                self.watches,
                topology,
                self.promises,
                clock,
                self.classes.of,
                self.devices,
            ),
        )
        self.mover, self.cpur, self.rebalancer = _movers(self, policy, clock)
        self._queue: queue.Queue[Key | None] = queue.Queue()
        self._queued: set[Key] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._idle = threading.Event()

    # ------------------------------------------------------------------ lifecycle
    def start(self, sync_timeout: float = 60.0) -> None:
        """Check the node, restore the state, start watching and syncing (see the module
        docstring); first the node lock (`acquire_node_lock`), waiting for another agent of
        this node to go. EnvironmentProblem (exit 4) when the node cannot be managed."""
        self.client.check()
        if not self.acquire_node_lock(self._stop):
            raise EnvironmentProblem(
                "stopped while waiting for the node lock", reason="node_lock_wait_stopped"
            )
        try:
            self._start(sync_timeout)
        except BaseException:
            self.node_lock.release()
            raise

    def _start(self, sync_timeout: float) -> None:
        self.cgroups.say_hierarchy(self.settings.cgroup_root)
        imported = self.restore.kubelet_assignments()
        with self.store.transaction() as txn:
            txn.commit_if_changed(self.restore.restored(txn.state, imported))
        self.watches.open()
        self.qos.open()
        self.watches.pods.add_handlers(
            on_add=lambda o: self._enqueue_pod(o),
            on_update=lambda old, new: self._pod_updated(old, new),
            on_delete=lambda o: self._enqueue_pod(o),
        )
        self.watches.nodes.add_handlers(
            on_add=lambda o: self._enqueue(("node",)),
            on_update=lambda old, new: self._node_updated(old, new),
        )
        self.watches.bindings.add_handlers(
            on_add=lambda o: self._binding_changed(o),
            on_update=lambda old, new: self._binding_changed(new),
            on_delete=lambda o: self._binding_changed(o),
        )
        self.events.start()
        for informer in self.watches.informers:
            informer.start()
        deadline = time.monotonic() + sync_timeout
        for informer in self.watches.informers:
            if not informer.wait_for_sync(max(0.1, deadline - time.monotonic())):
                self.stop()
                raise EnvironmentProblem(
                    f"the API did not answer the {informer.name} list within {sync_timeout:g} s",
                    reason="api_sync_timeout",
                )
        self.qos.start(self._spawn, self._stop, min(10.0, max(0.1, deadline - time.monotonic())))
        self.cpur.start(self._spawn, self._stop, self._enqueue, deadline)
        self._spawn(self._work, "agent-worker")
        self._spawn(self.publisher.run, "agent-publisher")
        self._enqueue(("node",))
        self._enqueue(("orphans",))
        for pod in self.watches.pod_list():
            self._enqueue_pod(pod)
        self._enqueue(("heartbeat",))
        self._spawn(self._timer, "agent-timer")
        self.wait_idle(sync_timeout)
        self.synced.set()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop watching and working within about `timeout` seconds."""
        self._stop.set()
        self._queue.put(None)
        self.publisher.stop()
        for informer in self.watches.informers:
            informer.stop(timeout / 2)
        self.qos.stop(timeout / 2)
        for thread in self._threads:
            thread.join(timeout / 2)
        self.events.stop(timeout / 2)
        self.devices.close()
        self.node_lock.release()

    def acquire_node_lock(self, stop: threading.Event | None = None, poll: float = 0.2) -> bool:
        """Hold the node lock (`corepin.agent.node.lock`) for the agent's life, waiting while
        another agent of this node holds it. False when `stop` was set while waiting."""
        return self.node_lock.acquire(stop, poll)

    def wait_idle(self, timeout: float = 30.0) -> bool:
        """Wait until the work queue is empty, the worker rests and every API write is done
        (tests, start-up)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if (
                self._settled()
                and self._idle.wait(0.02)
                and self.publisher.published.wait(0.02)
                and self._settled()
            ):
                return True
            time.sleep(0.005)
        return False

    def _settled(self) -> bool:
        with self._lock:
            queued = bool(self._queued)
        return not queued and not self.publisher.pending

    def _committed(self, state: HostState) -> None:
        """A state committed (or first read): to the metrics and the gRPC feed."""
        self.hooks.state(state, self.machine)
        self.feed.publish(state)

    @property
    def state(self) -> HostState | None:
        """The node state as last committed (read-only snapshot)."""
        return self.store.state

    # ------------------------------------------------------------------ NodeBackend
    @property
    def node_name(self) -> str:
        return self.settings.node_name

    def topology(self) -> Topology:
        return self.machine

    def snapshot(self) -> HostState:
        """The committed state (`corepin.agent.ports.NodeBackend`)."""
        return self.store.state or HostState.new(self.machine)

    def statuses(self, state: HostState) -> Mapping[str, str]:
        """Containers of pods the agent sees run; others are `unknown` to it."""
        live = self.watches.live_uids()
        return {
            a.id: "running"
            if a.container is not None and a.container.pod_uid in live
            else "unknown"
            for a in state
        }

    def allocate(self, spec: AllocationSpec) -> NoReturn:
        raise InputError(
            "the node agent pins pods from their annotations (corepin.io/cpu-policy) and "
            "PodCPUBindings; it takes no Allocate calls",
            reason="not_supported",
        )

    def release(self, assignment_id: str) -> NoReturn:
        raise InputError(
            f"the node agent releases {assignment_id!r} when its pod or container ends; "
            "change the pod's annotation or delete the pod instead",
            reason="not_supported",
        )

    def subscribe(self) -> Subscription:
        return self.feed.subscribe()

    # ------------------------------------------------------------------ queue
    def _spawn(self, target: Callable[[], None], name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def _enqueue(self, key: Key) -> None:
        with self._lock:
            if key in self._queued:
                return
            self._queued.add(key)
            self._idle.clear()
        self._queue.put(key)

    def _enqueue_pod(self, pod: Mapping[str, Any]) -> None:
        ns, name = self.decider.seen(pod)
        self._enqueue(("pod", ns, name))

    def _pod_updated(self, old: Mapping[str, Any], new: Mapping[str, Any]) -> None:
        self.decider.started(old, new)
        self._enqueue_pod(new)

    def _node_updated(self, old: Mapping[str, Any], new: Mapping[str, Any]) -> None:
        if annotations_changed(old, new):
            self._enqueue(("node",))

    def _binding_changed(self, binding: Mapping[str, Any]) -> None:
        view = ObjectView(binding)
        if view.labels.get(LABEL_MANAGED_BY) == AGENT_MANAGER:
            return  # our own record of a pin
        pod = view.spec.get("podName")
        if isinstance(pod, str):
            self._enqueue(("pod", view.namespace or "default", pod))

    def _timer(self) -> None:
        next_beat = time.monotonic() + self.settings.heartbeat_period
        next_sync = time.monotonic() + self.settings.resync_period
        while not self._stop.wait(0.2):
            now = time.monotonic()
            if now >= next_beat:
                self._enqueue(("heartbeat",))
                next_beat = now + self.settings.heartbeat_period
            if now >= next_sync:
                self._enqueue(("resync",))
                next_sync = now + self.settings.resync_period

    def _work(self) -> None:
        while True:
            with self._lock:
                if not self._queued:
                    self._idle.set()
            key = self._queue.get()
            if key is None or self._stop.is_set():
                return
            keys = [key]
            while len(keys) < BATCH:
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    self._queue.put(None)
                    break
                keys.append(more)
            with self._lock:
                self._queued.difference_update(keys)
            try:
                self._process(keys)
            except CorepinError as exc:
                self.errors += 1
                log.warning("event=sync_failed keys=%d error=%s", len(keys), exc)
            except Exception:  # a bug: keep the agent alive, say what happened
                self.errors += 1
                log.exception("event=sync_crashed keys=%d", len(keys))

    # ------------------------------------------------------------------ one batch
    def _process(self, keys: list[Key]) -> None:
        """One batch of keys: every decision in one state transaction (one checkpoint write),
        then the cgroups (one reconcile pass), then the API."""
        kinds = {k[0] for k in keys}
        resync = "resync" in kinds
        pods = sorted({(k[1], k[2]) for k in keys if k[0] == "pod"})
        if resync:
            pods = sorted({*pods, *(_pod_key(p) for p in self.watches.pod_list())})
        started = time.monotonic()
        done: list[PodWork] = []
        forgotten: list[str] = []
        with self.store.transaction() as txn:
            before = txn.state
            state = before
            if "node" in kinds:
                state = self.reservation.apply(state)
            if "orphans" in kinds:
                state, gone = self.decider.apply_orphans(state)
                forgotten.extend(gone)
            state = self.cpur.apply(state)
            bindings = self.promises.user_bindings() if pods else {}
            for namespace, name in pods:
                try:
                    state, work, gone = self.decider.apply_pod(
                        state, namespace, name, resync, bindings
                    )
                except Exception as exc:  # this pod stays as it was; the others go on
                    self._pod_failed(namespace, name, "sync", exc)
                    continue
                forgotten.extend(gone)
                if work is not None:
                    done.append(work)
            if done:
                self.hooks.decided((time.monotonic() - started) / len(done))
            # the shield shrinks before the containers get the CPUs (after the commit)
            state = txn.commit_if_changed(self.shield.apply(state, before, resync=resync))
        classes_changed = False
        for work in done:
            limits = cpu_limits(work.pod)
            classes_changed |= self.classes.update(state, work.plan.uid, work.request, limits)
        targets: list[Assignment] = []
        quotas: dict[str, CpuQuota | None] = {}
        for work in done:
            targets.extend(pod_assignments(state, work.plan.uid))
            try:
                quotas.update(self.cgroups.quotas(state, work.plan, work.pod))
            except Exception as exc:  # its CPUs are written all the same, its quota left
                self._pod_failed(work.plan.namespace, work.plan.name, "quota", exc)
        quotas = self.qos.left_quotas(state, quotas)
        self.cpur.after_commit(state, before, forgotten)
        if "qos" in kinds:  # the QoS loop changed the BE set
            targets.extend(self.qos.be_containers(state))
        if resync:
            targets.extend(a for a in state if a.container is not None)
        elif state.shared_pool != before.shared_pool:
            targets.extend(shared_pool_users(state))
        if state.shared_pool != before.shared_pool:
            self.publisher.later(("pool",), None)
        enforce(self.cgroups, self.hooks, self.qos, state, _unique(targets), quotas)
        for work in done:
            for seconds in self.decider.latencies(work.plan):
                self.hooks.pinned_after(seconds)
            try:
                self.teller.tell(work.pod, work.plan, work.events)
            except Exception as exc:
                self._pod_failed(work.plan.namespace, work.plan.name, "events", exc)
            self.publisher.later(("pod", work.plan.uid), work)
        for uid in forgotten:
            self.decider.forget(uid)
            self.classes.forget(uid)
            self.publisher.later(("forget", uid), uid)
        if kinds & {"orphans", "resync"}:
            self.publisher.later(("sweep",), None)
        if resync:
            self.hooks.reconciled(time.monotonic() - started)
        if (
            kinds & {"heartbeat", "node", "orphans"}
            or classes_changed
            or state.held != before.held
            or state.reserved != before.reserved
        ):
            self.publisher.later(("topology",), None)
        if len(state.free) > len(before.free):
            for pod in self.decider.to_retry(state):
                self._enqueue_pod(pod)
        self.rebalancer.after_batch(kinds, before, state)  # (on this worker, after the batch)

    def _pod_failed(self, namespace: str, name: str, stage: str, exc: BaseException) -> None:
        """One pod's failure (`pod_failed`); the rest of the batch goes on without it."""
        self.errors += 1
        pod_failed(self.watches, self.teller, namespace, name, stage, exc)


def pod_failed(
    watches: Watches, teller: Teller, namespace: str, name: str, stage: str, exc: BaseException
) -> None:
    """One pod's failure: logged and told on the pod (a Warning Event, once per message)."""
    detail = exc.message if isinstance(exc, CorepinError) else f"{type(exc).__name__}: {exc}"
    if isinstance(exc, CorepinError):
        log.warning("event=pod_failed pod=%s/%s stage=%s error=%s", namespace, name, stage, exc)
    else:
        log.exception("event=pod_crashed pod=%s/%s stage=%s", namespace, name, stage)
    pod = watches.pod(name, namespace)
    if pod is None:
        return
    message = f"the node agent could not {stage} this pod ({detail}); other pods go on"
    try:
        teller.failed(pod, pod_uid(pod), stage, message)
    except Exception:
        log.exception("event=event_failed pod=%s/%s", namespace, name)


def enforce(
    cgroups: ContainerCgroups,
    hooks: Hooks,
    qos: NodeQos,
    state: HostState,
    assignments: Iterable[Assignment],
    quotas: Mapping[str, CpuQuota | None],
) -> None:
    """Write the cgroups of `assignments` (the kubelet's own left alone; BE containers held to
    the QoS loop's BE set), and count the writes and failures."""
    chosen = [a for a in assignments if a.policy != KUBELET_POLICY]
    targets = cgroups.targets(state, chosen, quotas, be_cpus=qos.be_cpus, is_be=qos.is_be)
    if not targets:
        return
    report = cgroups.apply(targets)
    hooks.cgroup_writes(report.writes)
    for err in report.errors:
        hooks.pinning(False, err.reason)
        log.warning("event=cgroup_write_failed error=%s", err)
    if report.writes and not report.errors:
        hooks.pinning(True)


def _movers(
    agent: NodeAgent, policy: Policy, clock: Callable[[], float]
) -> tuple[Mover, NodeReservations, Rebalancer]:
    """The agent's one live mover (`corepin.agent.node.move`) and the two that move with it:
    its CPUReservations (`corepin.agent.node.reservations`, wired into its decisions and its
    node reservation) and its rebalancing (`corepin.agent.node.rebalance`)."""
    mover = Mover(
        agent.store,
        agent.machine,
        agent.cgroups,
        agent.hooks,
        agent.qos,
        agent.decider,
        agent.teller,
        agent.publisher,
        agent.shield,
    )
    cpur = NodeReservations(
        agent.watches,
        agent.machine,
        policy,
        agent.events,
        mover,
        agent.publisher,
        clock,
        evict_on_reservation=agent.settings.evict_on_reservation,
    )
    agent.decider.reservation_for = cpur.reservation_for
    agent.reservation.clear = cpur.clear
    rebalancer = Rebalancer(
        agent.settings.rebalance,
        agent.settings.rebalance_rate,
        agent.machine,
        policy,
        clock,
        state=lambda: agent.store.state,
        pod_of=lambda namespace, name: agent.watches.pod(name, namespace),
        promised=agent.promises.promised,
        events=agent.events,
        hooks=agent.hooks,
        mover=mover,
    )
    return mover, cpur, rebalancer


def _pod_key(pod: Mapping[str, Any]) -> tuple[str, str]:
    view = ObjectView(pod)
    return view.namespace or "default", view.name


def _unique(items: Iterable[Assignment]) -> list[Assignment]:
    seen: dict[str, Assignment] = {}
    for a in items:
        seen.setdefault(a.id, a)
    return list(seen.values())


__all__ = ["BATCH", "NodeAgent"]
