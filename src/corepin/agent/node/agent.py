"""The Kubernetes node agent (`corepin agent`): pods of one node in, pinned containers out.

Threads and data flow:
- informers (list + watch from the list's resourceVersion, relist on 410 Gone, reconnect with
  bounded backoff; `corepin.kube.informer`) for the node's pods (field selector
  `spec.nodeName`), the node itself (reservation annotation) and PodCPUBindings; their handlers
  only put keys on the work queue;
- one worker takes keys off the queue, so every decision is made in order, one at a time: for
  a pod it plans (`plan.py`), decides in one state transaction (`sync.py`, the node's one pool
  model and checkpoint shared with host mode), writes the container cgroups (`enforce.py`,
  re-pinning every shared container when the pool changed) and publishes (pod annotation
  `corepin.io/cpus`, one PodCPUBinding per pinned container, Events, the node's
  NodeCPUTopology and NodeResourceTopology);
- a timer puts a heartbeat key every `heartbeat_period` and a resync key every
  `resync_period` (every pod again, every cgroup checked for drift - zero writes when none).

Restart: the checkpoint is validated against the live topology, assignments of pods that are
gone are released, and the agent's own PodCPUBindings fill in what a lost checkpoint forgot, all
before the first pod is looked at - a CPU is never handed out twice across a restart. Agent
bindings and assignment files of pods that are gone are deleted then and on every resync, and
every table kept per pod goes with its pod.

One agent per node: `start` first takes the node lock (a `flock` on `<state dir>/agent.lock`),
so a second agent of the node reads and writes nothing until the first is gone.

One pod never stops the others: a pod whose sync, quota or Events fail is logged and told (a
Warning Event), and the batch goes on without it; each API write and assignment file is done on
its own.

The agent refuses to start next to the kubelet's static CPU manager (its cpu_manager_state
names policy `static`) unless `kubelet_compat`, which imports the kubelet's assignments and
leaves them alone.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Final

from corepin.agent.node.plan import PodPlan, plan_pod
from corepin.agent.node.sync import (
    KUBELET_POLICY,
    Note,
    SyncContext,
    forget_pod,
    pod_assignments,
    shared_pool_users,
    sync_pod,
)
from corepin.agent.ports import StateFeed
from corepin.core.cpuset import CPUSet
from corepin.core.errors import CorepinError, EnvironmentProblem
from corepin.core.ids import QOS_CLASSES
from corepin.core.record import record
from corepin.kube.models import LABEL_MANAGED_BY

if TYPE_CHECKING:
    from corepin.agent.node.enforce import ContainerCgroups
    from corepin.agent.node.settings import NodeSettings
    from corepin.agent.ports import AllocationSpec, Subscription
    from corepin.allocation.types import Policy
    from corepin.enforcement.cgroups import CpuQuota
    from corepin.kube.client import KubeClient, Resource
    from corepin.kube.events import EventRecorder
    from corepin.kube.informer import Informer
    from corepin.state.model import Assignment, HostState
    from corepin.state.store import Stamp, StateStore
    from corepin.topology.model import Topology

log = logging.getLogger("corepin.agent.node")

#: labels of the PodCPUBindings the agent writes (one per pinned container)

AGENT: Final = "corepin-agent"  # = corepin.kube.models.AGENT_MANAGER
NODE_LABEL: Final = "corepin.io/node"
POD_UID_LABEL: Final = "corepin.io/pod-uid"
CONTAINER_LABEL: Final = "corepin.io/container"
POLICY_ANNOTATION: Final = "corepin.io/cpu-policy"
#: the node lock in the state directory (see `NodeAgent.acquire_node_lock`)
LOCK_FILE: Final = "agent.lock"

Key = tuple[str, ...]
#: seconds a validated binding holds its CPUs for a pod not bound to this node yet (`_promised`)
PROMISE_GRACE: Final = 30.0
#: keys handled in one state transaction at most
BATCH: Final = 256
#: the largest CPU quantity (limit or request) the agent acts on: far above any machine (the
#: kernel counts at most 8192 CPUs) and below what a CFS quota can hold; a pod asking more is
#: told so and left on the shared pool
MAX_CPU_QUANTITY: Final = 1 << 20


@record(frozen=False)
class _PodWork:
    """A pod synced in this batch, with what to tell and publish about it."""

    pod: Mapping[str, Any]
    plan: PodPlan
    notes: list[Note]


class _NodeTransaction:
    """The agent's view of one state transaction: `state`, and `commit` (writes only when the
    state changed)."""

    def __init__(self, tx: Any, state: HostState) -> None:
        self._tx = tx
        self.state = state
        self.written: HostState | None = None

    def commit(self, state: HostState) -> HostState:
        if state == self.state:
            return state
        self.written = self._tx.commit(state)
        assert self.written is not None
        self.state = self.written
        return self.written


def _ns(pod: Mapping[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("namespace") or "default")


def _name(pod: Mapping[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("name") or "")


class Hooks:
    """What the agent reports as it works (metrics); every method is optional to override."""

    def decided(self, seconds: float) -> None: ...

    def pinning(self, ok: bool, reason: str = "") -> None: ...

    def cgroup_writes(self, count: int) -> None: ...

    def reconciled(self, seconds: float) -> None: ...

    def pinned_after(self, seconds: float) -> None: ...

    def state(self, state: HostState, topology: Topology) -> None: ...


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
    ) -> None:
        from corepin.allocation.policies import get_policy
        from corepin.kube.events import EventRecorder

        self.settings = settings
        self.client = client
        self.machine = topology
        self.cgroups = cgroups
        self.hooks = hooks or Hooks()
        self.clock = clock
        self.policy: Policy = get_policy(settings.policy)
        self.events: EventRecorder = EventRecorder(client, "corepin-agent", host=settings.node_name)
        self._queue: queue.Queue[Key | None] = queue.Queue()
        self._queued: set[Key] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._informers: list[Informer] = []
        self._uids: dict[tuple[str, str], str] = {}  # (namespace, pod) -> uid of what we saw
        self._told: dict[tuple[str, str, str], str] = {}  # (uid, container, reason) -> message
        self._annotated: dict[str, str | None] = {}  # pod uid -> corepin.io/cpus we last wrote
        # (uid, container) -> (what we wrote, namespace, binding name)
        self._bindings: dict[tuple[str, str], tuple[str, str, str]] = {}
        # binding uid -> (first seen, resourceVersion checked, its pod may come here)
        self._incoming_seen: dict[str, tuple[float, str, bool]] = {}
        self.promise_grace = PROMISE_GRACE
        self._files: dict[str, set[str]] = {}  # pod uid -> assignment files we wrote
        self._seen_running: dict[tuple[str, str], float] = {}  # (uid, cid) -> first seen
        self._nrt = True
        self._ncpt_created = False
        self._state: HostState | None = None
        self._store: StateStore | None = None
        self._cached: tuple[Stamp, HostState] | None = None
        self._last_plan: dict[str, tuple[PodPlan, tuple[Assignment, ...]]] = {}
        self._plans: dict[str, tuple[tuple[str, str | None], PodPlan]] = {}
        self._idle = threading.Event()
        self._pub_queue: queue.Queue[Key | None] = queue.Queue()
        self._to_publish: dict[Key, Any] = {}
        self._published = threading.Event()
        self._published.set()
        self.synced = threading.Event()
        self.errors = 0
        self.feed = StateFeed()
        self._shield_engine: Any = None
        self._shield_pending = False
        self._lock_fd: int | None = None
        self._spec_stored: Any = None  # NodeCPUTopology.spec as the API stored what we wrote

    # ------------------------------------------------------------------ resources
    @property
    def ncpt(self) -> Resource:
        from corepin.kube.resources import NCPT

        return NCPT

    @property
    def pcb(self) -> Resource:
        from corepin.kube.resources import PCB

        return PCB

    @property
    def nrt(self) -> Resource:
        from corepin.kube.resources import NRT

        return NRT

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
            self._release_node_lock()
            raise

    def _start(self, sync_timeout: float) -> None:
        from corepin.kube.informer import Informer
        from corepin.kube.resources import NODES, PODS

        self._say_hierarchy()
        imported = self._kubelet_assignments()
        self._restore(imported)
        node = self.settings.node_name
        pods = Informer(self.client, PODS, field_selector=f"spec.nodeName={node}", name="pods")
        nodes = Informer(self.client, NODES, field_selector=f"metadata.name={node}", name="node")
        bindings = Informer(self.client, self.pcb, name="bindings")
        pods.add_handlers(
            on_add=lambda o: self._enqueue_pod(o),
            on_update=lambda old, new: self._pod_updated(old, new),
            on_delete=lambda o: self._enqueue_pod(o),
        )
        nodes.add_handlers(
            on_add=lambda o: self._enqueue(("node",)),
            on_update=lambda old, new: self._node_updated(old, new),
        )
        bindings.add_handlers(
            on_add=lambda o: self._binding_changed(o),
            on_update=lambda old, new: self._binding_changed(new),
            on_delete=lambda o: self._binding_changed(o),
        )
        self._pods, self._nodes, self._bindings_informer = pods, nodes, bindings
        self._informers = [pods, nodes, bindings]
        self.events.start()
        for informer in self._informers:
            informer.start()
        deadline = time.monotonic() + sync_timeout
        for informer in self._informers:
            if not informer.wait_for_sync(max(0.1, deadline - time.monotonic())):
                self.stop()
                raise EnvironmentProblem(
                    f"the API did not answer the {informer.name} list within {sync_timeout:g} s",
                    reason="api_sync_timeout",
                )
        self._spawn(self._work, "agent-worker")
        self._spawn(self._publisher, "agent-publisher")
        self._enqueue(("node",))
        self._enqueue(("orphans",))
        for pod in pods.cache.list():
            self._enqueue_pod(pod)
        self._enqueue(("heartbeat",))
        self._spawn(self._timer, "agent-timer")
        self.wait_idle(sync_timeout)
        self.synced.set()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop watching and working within about `timeout` seconds."""
        self._stop.set()
        self._queue.put(None)
        self._pub_queue.put(None)
        for informer in self._informers:
            informer.stop(timeout / 2)
        for thread in self._threads:
            thread.join(timeout / 2)
        self.events.stop(timeout / 2)
        self._release_node_lock()

    # ------------------------------------------------------------------ the node lock
    def acquire_node_lock(self, stop: threading.Event | None = None, poll: float = 0.2) -> bool:
        """Hold the node lock: an exclusive `flock` on `<state dir>/agent.lock`, kept for the
        agent's life. A second agent of the same node waits here - it reads no state and
        writes no cgroup - until the first stops or dies (the kernel drops the lock of a dead
        process at once), then takes over. False when `stop` was set while waiting."""
        import fcntl
        import os

        if self._lock_fd is not None:
            return True
        path = os.path.join(self.settings.state_dir, LOCK_FILE)
        try:
            os.makedirs(self.settings.state_dir, mode=0o755, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise EnvironmentProblem(
                f"cannot open the node lock {path}: {exc.strerror or exc}",
                reason="node_lock_unusable",
            ) from exc
        told = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not told:
                    holder = os.pread(fd, 200, 0).decode("ascii", "replace").strip()
                    log.warning(
                        "event=node_lock_busy path=%s holder=%s: another agent manages node %s; "
                        "waiting until it stops",
                        path,
                        holder or "unknown",
                        self.settings.node_name,
                    )
                    told = True
                if stop is not None and stop.wait(poll):
                    os.close(fd)
                    return False
                if stop is None:
                    time.sleep(poll)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid={os.getpid()} node={self.settings.node_name}\n".encode(), 0)
        self._lock_fd = fd
        if told:
            log.info("event=node_lock_taken_over path=%s", path)
        return True

    def _release_node_lock(self) -> None:
        import os

        fd, self._lock_fd = self._lock_fd, None
        if fd is not None:
            os.close(fd)

    def _say_hierarchy(self) -> None:
        """Log the cgroup hierarchies the agent writes, once (CFS quota needs the cpu one)."""
        driver = self.cgroups.driver
        cpu = getattr(driver, "cpu_root", driver.root) if driver.version == 1 else driver.root
        log.info("event=cgroups version=%d cpuset=%s cpu=%s", driver.version, driver.root, cpu)
        if not driver.has_cpu_controller():
            log.warning(
                "event=no_cpu_controller cgroup_root=%s: no cpu controller found below the "
                "cgroup root; exclusive containers keep their CFS quota",
                self.settings.cgroup_root,
            )

    def wait_idle(self, timeout: float = 30.0) -> bool:
        """Wait until the work queue is empty, the worker rests and every API write is done
        (tests, start-up)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                empty = not self._queued and not self._to_publish
            if empty and self._idle.wait(0.02) and self._published.wait(0.02):
                with self._lock:
                    if not self._queued and not self._to_publish:
                        return True
            time.sleep(0.005)
        return False

    @property
    def state(self) -> HostState | None:
        """The node state as last committed (read-only snapshot)."""
        return self._state

    # ------------------------------------------------------------------ NodeBackend
    @property
    def node_name(self) -> str:
        return self.settings.node_name

    def topology(self) -> Topology:
        return self.machine

    def snapshot(self) -> HostState:
        """The committed state (`corepin.agent.ports.NodeBackend`)."""
        from corepin.state.model import HostState

        return self._state or HostState.new(self.machine)

    def statuses(self, state: HostState) -> Mapping[str, str]:
        """Containers of pods the agent sees run; others are `unknown` to it."""
        live = {str((p.get("metadata") or {}).get("uid")) for p in self._pods.cache.list()}
        return {
            a.id: "running"
            if a.container is not None and a.container.pod_uid in live
            else "unknown"
            for a in state
        }

    def allocate(self, spec: AllocationSpec) -> Assignment:
        from corepin.core.errors import InputError

        raise InputError(
            "the node agent pins pods from their annotations (corepin.io/cpu-policy) and "
            "PodCPUBindings; it takes no Allocate calls",
            reason="not_supported",
        )

    def release(self, assignment_id: str) -> Assignment:
        from corepin.core.errors import InputError

        raise InputError(
            f"the node agent releases {assignment_id!r} when its pod or container ends; "
            "change the pod's annotation or delete the pod instead",
            reason="not_supported",
        )

    def subscribe(self) -> Subscription:
        return self.feed.subscribe()

    def _spawn(self, target: Callable[[], None], name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    # ------------------------------------------------------------------ queue
    def _enqueue(self, key: Key) -> None:
        with self._lock:
            if key in self._queued:
                return
            self._queued.add(key)
            self._idle.clear()
        self._queue.put(key)

    def _enqueue_pod(self, pod: Mapping[str, Any]) -> None:
        meta = pod.get("metadata") or {}
        ns, name = str(meta.get("namespace") or "default"), str(meta.get("name") or "")
        uid = meta.get("uid")
        if isinstance(uid, str) and uid:
            self._uids[(ns, name)] = uid
        self._enqueue(("pod", ns, name))

    def _pod_updated(self, old: Mapping[str, Any], new: Mapping[str, Any]) -> None:
        now = time.monotonic()
        before = _running_ids(old)
        meta = new.get("metadata") or {}
        uid = str(meta.get("uid") or "")
        for cid in _running_ids(new) - before:
            self._seen_running.setdefault((uid, cid), now)
        self._enqueue_pod(new)

    def _node_updated(self, old: Mapping[str, Any], new: Mapping[str, Any]) -> None:
        if (old.get("metadata") or {}).get("annotations") != (new.get("metadata") or {}).get(
            "annotations"
        ):
            self._enqueue(("node",))

    def _binding_changed(self, binding: Mapping[str, Any]) -> None:
        meta = binding.get("metadata") or {}
        if (meta.get("labels") or {}).get(LABEL_MANAGED_BY) == AGENT:
            return  # our own record of a pin
        spec = binding.get("spec") or {}
        pod = spec.get("podName")
        if isinstance(pod, str):
            self._enqueue(("pod", str(meta.get("namespace") or "default"), pod))

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

    def _process(self, keys: list[Key]) -> None:
        """One batch of keys: every decision in one state transaction (one checkpoint write),
        then the cgroups (one reconcile pass), then the API."""
        kinds = {k[0] for k in keys}
        pods = sorted({(k[1], k[2]) for k in keys if k[0] == "pod"})
        if "resync" in kinds:
            pods = sorted({*pods, *((_ns(p), _name(p)) for p in self._pods.cache.list())})
        started = time.monotonic()
        done: list[_PodWork] = []
        forgotten: list[str] = []
        with self._transaction() as txn:
            before = txn.state
            state = before
            if "node" in kinds:
                state = self._apply_node(state)
            if "orphans" in kinds:
                state, gone = self._apply_orphans(state)
                forgotten.extend(gone)
            bindings = self._user_bindings() if pods else {}
            for namespace, name in pods:
                try:
                    state, work, gone = self._apply_pod(
                        state, namespace, name, "resync" in kinds, bindings
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
            state = txn.commit(self._shield(state, before, resync="resync" in kinds))
        targets: list[Assignment] = []
        quotas: dict[str, CpuQuota | None] = {}
        for work in done:
            targets.extend(pod_assignments(state, work.plan.uid))
            try:
                quotas.update(self._quotas(state, work.plan, work.pod))
            except Exception as exc:  # its CPUs are written all the same, its quota left
                self._pod_failed(work.plan.namespace, work.plan.name, "quota", exc)
        if "resync" in kinds:
            targets.extend(a for a in state if a.container is not None)
        elif state.shared_pool != before.shared_pool:
            targets.extend(shared_pool_users(state))
        if state.shared_pool != before.shared_pool:
            self._publish_later(("pool",), None)
        self._enforce(state, _unique(targets), quotas)
        for work in done:
            self._observe_latency(work.plan)
            try:
                self._tell(work.pod, work.plan, work.notes)
            except Exception as exc:
                self._pod_failed(work.plan.namespace, work.plan.name, "events", exc)
            self._publish_later(("pod", work.plan.uid), work)
        for uid in forgotten:
            self._forget_tables(uid)
            self._publish_later(("forget", uid), uid)
        if kinds & {"orphans", "resync"}:
            self._publish_later(("sweep",), None)
        if "resync" in kinds:
            self.hooks.reconciled(time.monotonic() - started)
        if (
            kinds & {"heartbeat", "node", "orphans"}
            or state.held != before.held
            or state.reserved != before.reserved
        ):
            self._publish_later(("topology",), None)
        if len(state.free) > len(before.free):
            self._retry_pending(state)

    # ------------------------------------------------------------------ shield
    def _shield(self, state: HostState, before: HostState, *, resync: bool) -> HostState:
        """`state` with the system shield (`--shield-system`) raised the first time, re-sized
        when the pools changed, repaired (drift, new tasks) on a resync. A shield that cannot
        be raised or synced is logged; the containers are pinned all the same."""
        if not self.settings.shield_system and state.shield is None:
            return state
        from corepin.sysfs.procfs import process_table

        changed = (state.shared_pool, state.reserved) != (before.shared_pool, before.reserved)
        if state.shield is not None and not (changed or resync or self._shield_pending):
            return state
        shield = self._system_shield()
        try:
            table = process_table(self.settings.proc_root)
            if state.shield is None:
                result = shield.on(state, table, scope="", kthreads=False, irqs=False)
                log.info("event=shield_on notes=%d", len(result.notes))
            else:
                synced = shield.sync(state, table)
                assert synced is not None
                result = synced
        except CorepinError as exc:
            if not self._shield_pending:
                log.warning("event=shield_failed error=%s", exc)
            self._shield_pending = True
            return state
        self._shield_pending = False
        for note in result.notes:
            if note.action in ("failed", "refused"):
                log.warning(
                    "event=shield_%s target=%s detail=%s", note.action, note.target, note.detail
                )
        return state.evolve(shield=result.record)

    def _system_shield(self) -> Any:
        from corepin.enforcement.cgroups import CgroupV1
        from corepin.enforcement.layout import KUBELET_PARENTS
        from corepin.enforcement.shield.control import HOST_EXCLUDED, Shield

        if self._shield_engine is None:
            driver = self.cgroups.driver
            if isinstance(driver, CgroupV1):  # the cpuset hierarchy alone, not the cpu one
                driver = CgroupV1(driver.root, None, fake_tree=driver.fake_tree)
            root = self.cgroups.kubelet_root
            kube = tuple(f"{root}/{k}" if root else k for k in KUBELET_PARENTS)
            self._shield_engine = Shield(
                cgroup_root=self.settings.cgroup_root,
                proc_root=self.settings.proc_root,
                cgroups="on",
                excluded=(*HOST_EXCLUDED, *kube),
                driver=driver,
            )
        return self._shield_engine

    # ------------------------------------------------------------------ publisher
    def _publish_later(self, key: Key, payload: Any) -> None:
        """Hand an API write to the publisher thread (the latest payload per key wins), so the
        worker pins the next container while the API is still being told about the last."""
        with self._lock:
            fresh = key not in self._to_publish
            self._to_publish[key] = payload
            self._published.clear()
        if fresh:
            self._pub_queue.put(key)

    def _publisher(self) -> None:
        while True:
            with self._lock:
                if not self._to_publish:
                    self._published.set()
            key = self._pub_queue.get()
            if key is None:
                return
            with self._lock:
                payload = self._to_publish.pop(key, None)
            state = self._state
            steps: list[tuple[Callable[..., Any], tuple[Any, ...]]] = []
            if key[0] == "pod" and state is not None:
                if not self._live(payload.plan):
                    continue  # gone meanwhile: nothing is written for it (its forget follows)
                steps = [
                    (self._publish_pod, (payload.pod, payload.plan, state)),
                    (self._write_assignment_files, (payload.plan, state)),
                ]
            elif key[0] == "forget":
                steps = [
                    (self._delete_bindings, (payload, ())),
                    (self._annotated.pop, (payload, None)),
                    (self._remove_assignment_files, (payload,)),
                ]
            elif key[0] == "topology":
                steps = [(self._publish_topology, ())]
            elif key[0] == "pool" and state is not None:
                steps = [(self._refresh_shared_files, (state,))]
            elif key[0] == "sweep" and state is not None:
                steps = [(self._sweep_assignment_files, (state,)), (self._sweep_bindings, (state,))]
            for step, args in steps:  # each on its own: one failing never skips the next
                try:
                    step(*args)
                except CorepinError as exc:
                    log.warning("event=publish_failed key=%s error=%s", "/".join(key), exc)
                except Exception:
                    log.exception("event=publish_crashed key=%s", "/".join(key))

    def _live_uids(self) -> set[str]:
        return {str((p.get("metadata") or {}).get("uid")) for p in self._pods.cache.list()}

    def _live(self, plan: PodPlan) -> bool:
        """Whether the pod of `plan` is on the node now (as the pod informer has it)."""
        pod = self._pods.cache.get(plan.name, plan.namespace)
        return pod is not None and (pod.get("metadata") or {}).get("uid") == plan.uid

    # ------------------------------------------------------------------ state
    @contextmanager
    def _transaction(self) -> Iterator[_NodeTransaction]:
        """The state transaction: locked; the checkpoint read and validated only when it is not
        the version this agent last read or wrote (another writer, or the first time)."""
        from corepin.agent.host.store import adopt
        from corepin.state.store import StateStore

        store = self._store
        if store is None:
            store = self._store = StateStore(
                self.settings.state_dir, proc_root=self.settings.proc_root
            )
        with store.transaction(cached=self._cached) as tx:
            state = tx.state if tx.reused else adopt(tx.state, self.machine, store.path)
            txn = _NodeTransaction(tx, state)
            yield txn
            if txn.written is not None:
                self._cached = (tx.stamp, txn.written) if tx.stamp is not None else None
                self._state = txn.written
                self.hooks.state(txn.written, self.machine)
                self.feed.publish(txn.written)
            elif self._state is None or tx.reused is False:
                self._state = state
                self._cached = (tx.stamp, state) if tx.stamp is not None and tx.existed else None
                self.hooks.state(state, self.machine)
                self.feed.publish(state)

    def _kubelet_assignments(self) -> HostState | None:
        """The kubelet static CPU manager's assignments when it is active and we are asked to
        coexist; EnvironmentProblem when it is active and we are not."""
        import os

        from corepin.state.kubelet import read_kubelet_state

        path = self.settings.kubelet_state
        if not os.path.exists(path):
            return None
        try:
            checkpoint = read_kubelet_state(path)
        except CorepinError as exc:
            log.warning("event=kubelet_state_unreadable path=%s error=%s", path, exc)
            return None
        if checkpoint.policy_name != "static":
            return None
        if not self.settings.kubelet_compat:
            raise EnvironmentProblem(
                f"the kubelet's static CPU manager is active on this node ({path} names policy "
                "'static'): corepin would fight it. Set the kubelet's --cpu-manager-policy=none "
                "(and remove its state file), or run the agent with --kubelet-compat to import "
                "the kubelet's assignments and leave them alone",
                reason="kubelet_static_active",
            )
        from corepin.agent.host.migrate import convert

        state, _ = convert(checkpoint, self.machine, created=self.clock())
        return state

    def _restore(self, imported: HostState | None) -> None:
        """The checkpoint (validated), the kubelet's assignments (compat), and what our own
        PodCPUBindings say we hold when the checkpoint forgot it."""
        with self._transaction() as txn:
            state = txn.state
            if imported is not None:
                for a in imported:
                    if a.id not in state:
                        try:
                            state = state.add(a.evolve(policy=KUBELET_POLICY))
                        except CorepinError as exc:
                            log.warning("event=kubelet_import_skipped id=%s error=%s", a.id, exc)
            state = self._from_bindings(state)
            txn.commit(state)

    def _from_bindings(self, state: HostState) -> HostState:
        from corepin.allocation.levels import withheld_for
        from corepin.kube.models import PodCPUBinding, pod_owner_uid
        from corepin.state.model import Assignment
        from corepin.state.owners import ContainerOwner

        selector = f"{LABEL_MANAGED_BY}={AGENT},{NODE_LABEL}={self.settings.node_name}"
        items, _ = self.client.list_all(self.pcb, label_selector=selector)
        published = self._published_allocations() if items else set()
        for raw in items:
            try:
                binding = PodCPUBinding.from_dict(raw)
            except CorepinError:
                continue
            meta = raw.get("metadata") or {}
            labels = meta.get("labels") or {}
            uid = labels.get(POD_UID_LABEL, "")
            container = labels.get(CONTAINER_LABEL, "")
            kind = (meta.get("annotations") or {}).get(POLICY_ANNOTATION, "exclusive")
            status = binding.status
            if not uid or not container or status is None or not status.cpus:
                continue
            ident = f"pod/{uid}/{container}"
            if ident in state or kind not in ("exclusive", "share"):
                continue
            level = binding.spec.level
            owner_uid = pod_owner_uid(binding.metadata.owner_references, binding.spec.pod_name)
            record_of = (binding.namespace, binding.spec.pod_name, uid, container, status.cpus)
            if owner_uid != uid or (*record_of, kind, level) not in published:
                # its labels (and status) are whatever its writer said: only what this agent
                # itself published before the restart confirms that it holds these CPUs
                log.warning("event=binding_not_ours id=%s binding=%s", ident, binding.name)
                continue
            owner = ContainerOwner(
                pod_uid=uid,
                container=container,
                namespace=binding.namespace,
                pod=binding.spec.pod_name,
            )
            try:
                state = state.add(
                    Assignment(
                        ident,
                        kind,
                        status.cpus,
                        withheld_for(self.machine, level, status.cpus),
                        self.machine.mems_of(status.cpus),
                        level,
                        owner,
                        self.clock(),
                        "restored",
                    )
                )
                log.info("event=restored_from_binding id=%s cpus=%s", ident, status.cpus)
            except CorepinError as exc:
                log.warning("event=binding_not_restored id=%s error=%s", ident, exc)
        return state

    def _published_allocations(self) -> set[tuple[str, str, str, str, CPUSet, str, str]]:
        """(namespace, pod, pod uid, container, CPUs, kind, level) of every allocation this
        node's NodeCPUTopology status shows: what this agent published before it restarted.

        Why this and not the label of a binding: a PodCPUBinding may be created (labels and
        all) by any tenant allowed to create bindings in its namespace, while the
        NodeCPUTopology is cluster scoped, and only this node's agent writes it (its status is
        rewritten from the agent's own state on every heartbeat). A binding is restored as the
        agent's record only when both agree."""
        from corepin.core.errors import ApiNotFound
        from corepin.kube.models import NodeCPUTopologyStatus

        try:
            ncpt = self.client.get(self.ncpt, self.settings.node_name)
            status = NodeCPUTopologyStatus.from_dict(ncpt.get("status") or {})
        except ApiNotFound:
            return set()
        except CorepinError as exc:
            log.warning("event=published_allocations_unreadable error=%s", exc)
            return set()
        return {
            (a.namespace, a.pod, a.pod_uid, a.container, a.cpus, a.policy, a.level)
            for a in status.allocations
        }

    # ------------------------------------------------------------------ pods
    def _user_bindings(self) -> dict[tuple[str, str], Mapping[str, Any]]:
        """(namespace, pod) -> the user's PodCPUBinding for that pod once the controller
        validated it (phase `Validated`, or `Applied`); bindings the agent wrote itself are its
        records, not requests (`corepin.kube.models.is_agent_binding`). A binding whose owner
        reference names another incarnation of the pod is not this pod's. Whether the binding
        fits the pod's limits is checked where it is applied (`plan_pod`), whatever its status
        says."""
        from corepin.kube.models import is_agent_binding

        out: dict[tuple[str, str], Mapping[str, Any]] = {}
        for b in self._bindings_informer.cache.list():
            meta = b.get("metadata") or {}
            if is_agent_binding(meta.get("labels")):
                continue
            if (b.get("status") or {}).get("phase") in ("Validated", "Applied"):
                key = (str(meta.get("namespace")), str((b.get("spec") or {}).get("podName")))
                pod = self._pods.cache.get(key[1], key[0])
                if pod is not None and not _owned_by(b, pod):
                    continue
                out.setdefault(key, b)
        return out

    def _promised(self, state: HostState, exclude: tuple[str, str] = ("", "")) -> CPUSet:
        """CPUs that validated user PodCPUBindings name for pods bound to this node whose
        containers do not hold them yet (the scheduler's --bind-cpus chose them before the pods
        ran): decisions from annotations leave them alone, and the published free set does not
        offer them.

        Who may make the agent withhold CPUs this way matters: any tenant may create a
        binding, and a label (`corepin.io/node`) is whatever its writer says. So only a binding
        in phase `Validated`/`Applied` counts (no status, `Pending`: nothing is withheld), only
        for the containers it may give CPUs to (eligible, exactly their limit), and only for a
        pod this node runs: its `spec.nodeName` as the pod informer (field selector) sees it.
        The one exception is the scheduler's own flow, which validates the binding and only
        then binds the pod: a validated binding whose status names this node (the status
        subresource, written by the controller or the scheduler) holds its CPUs for a pod that
        the API shows not bound anywhere yet (read with a GET, not from a label), for at most
        `PROMISE_GRACE` seconds - long enough for the bind to reach this node, too short for a
        binding of a pod that never comes to withhold CPUs for long."""
        from corepin.allocation.levels import withheld_for
        from corepin.kube.models import corepin_level, is_agent_binding
        from corepin.kube.podplan import binding_cpus, binding_refusals

        out = CPUSet()
        now = time.monotonic()
        live: set[str] = set()
        for b in self._bindings_informer.cache.list():
            meta = b.get("metadata") or {}
            if is_agent_binding(meta.get("labels")):
                continue
            status = b.get("status") or {}
            if status.get("phase") not in ("Validated", "Applied"):
                continue
            spec = b.get("spec") or {}
            key = (str(meta.get("namespace") or "default"), str(spec.get("podName")))
            live.add(str(meta.get("uid")))
            if key == exclude:
                continue
            pod = self._pods.cache.get(key[1], key[0])
            if pod is not None:
                here = (pod.get("spec") or {}).get("nodeName") == self.settings.node_name
                if not here or not _owned_by(b, pod) or binding_refusals(pod, spec):
                    continue
            elif status.get("nodeName") != self.settings.node_name or not self._incoming(b, now):
                continue
            uid = str(((pod or {}).get("metadata") or {}).get("uid") or "")
            held = CPUSet().union(*(a.withheld for a in pod_assignments(state, uid) if a.holds))
            try:
                level = corepin_level(spec.get("exclusivenessLevel") or "cpu")
                wanted = CPUSet().union(
                    *(
                        withheld_for(self.machine, level, cpus & self.machine.online_cpus)
                        for cpus in binding_cpus(spec).values()
                    )
                )
            except CorepinError:
                continue
            out |= wanted - held
        with self._lock:
            for gone in set(self._incoming_seen) - live:
                del self._incoming_seen[gone]
        return out & state.free

    def _incoming(self, binding: Mapping[str, Any], now: float) -> bool:
        """Whether a validated binding naming this node, whose pod this node does not run,
        holds its CPUs now: the pod (read once per binding version with a GET) exists, is
        the binding's incarnation, is bound to no node yet (or to this one: the watch is on
        its way), fits the binding, and the binding was first seen less than `PROMISE_GRACE`
        seconds ago."""
        from corepin.core.errors import ApiNotFound
        from corepin.kube.podplan import binding_refusals
        from corepin.kube.resources import PODS

        meta = binding.get("metadata") or {}
        uid, version = str(meta.get("uid")), _version(binding)
        with self._lock:
            seen = self._incoming_seen.get(uid)
        if seen is None or seen[1] != version:
            spec = binding.get("spec") or {}
            try:
                pod = self.client.get(PODS, str(spec.get("podName")), str(meta.get("namespace")))
            except ApiNotFound:
                pod = None
            except CorepinError as exc:
                log.warning("event=promise_check_failed binding=%s error=%s", meta.get("name"), exc)
                return False
            node = ((pod or {}).get("spec") or {}).get("nodeName")
            ok = (
                pod is not None
                and node in (None, "", self.settings.node_name)
                and _owned_by(binding, pod)
                and not binding_refusals(pod, spec)
            )
            # the grace runs from the first sight of the binding, not of this version: a
            # binding rewritten again and again does not hold CPUs for longer
            seen = (now if seen is None else seen[0], version, ok)
            with self._lock:
                self._incoming_seen[uid] = seen
        return seen[2] and now - seen[0] < self.promise_grace

    def _apply_pod(
        self,
        state: HostState,
        namespace: str,
        name: str,
        resync: bool,
        bindings: Mapping[tuple[str, str], Mapping[str, Any]],
    ) -> tuple[HostState, _PodWork | None, list[str]]:
        """The state after one pod's plan (None work: nothing to do for it), and the uids of
        pods it replaced or that are gone; `bindings` are the validated user bindings."""
        pod = self._pods.cache.get(name, namespace)
        if pod is None:
            uid = self._uids.pop((namespace, name), None)
            if uid is None:
                return state, None, []
            state, _ = forget_pod(state, uid)
            return state, None, [uid]  # (every table of the pod goes, held CPUs or not)
        plan = self._plan(pod, bindings.get((namespace, name)))
        held = tuple(pod_assignments(state, plan.uid))
        if self._last_plan.get(plan.uid) == (plan, held):
            return state, (_PodWork(pod, plan, []) if resync else None), []
        stale = self._uids_gone(state, namespace, name, plan.uid)
        for uid in stale:
            state, _ = forget_pod(state, uid)
        promised = self._promised(state, exclude=(namespace, name))
        ctx = SyncContext(self.machine, self.policy, self.clock(), promised)
        state, notes = sync_pod(state, plan, ctx)
        notes.extend(self._annotation_notes(pod, plan))
        state = self._attach_cgroups(state, plan)
        self._last_plan[plan.uid] = (plan, tuple(pod_assignments(state, plan.uid)))
        return state, _PodWork(pod, plan, notes), stale

    def _plan(self, pod: Mapping[str, Any], binding: Mapping[str, Any] | None) -> PodPlan:
        """`plan_pod`, reused while neither the pod nor its binding changed (their
        resourceVersions), so a resync with nothing to change plans nothing again."""
        version = (_version(pod), None if binding is None else _version(binding))
        uid = str((pod.get("metadata") or {}).get("uid") or "")
        cached = self._plans.get(uid)
        if cached is not None and cached[0] == version and version[0]:
            return cached[1]
        plan = _refuse_absurd(pod, plan_pod(pod, binding))
        self._plans[uid] = (version, plan)
        return plan

    def _annotation_notes(self, pod: Mapping[str, Any], plan: PodPlan) -> list[Note]:
        """A Warning for every `corepin.io/cpu-policy.<container>` annotation that names no
        app container of the pod (a typo would otherwise be ignored without a word)."""
        from corepin.kube.models import ANN_CPU_POLICY_PREFIX

        annotations = (pod.get("metadata") or {}).get("annotations") or {}
        if not isinstance(annotations, Mapping):
            return []
        names = [c.name for c in plan.containers]
        inits = {c.name for c in plan.init_containers}
        notes = []
        for key in sorted(k for k in annotations if isinstance(k, str)):
            if not key.startswith(ANN_CPU_POLICY_PREFIX):
                continue
            target = key[len(ANN_CPU_POLICY_PREFIX) :]
            if not target or target in names:
                continue
            why = (
                f"names init container {target!r}, and init containers always run on the "
                "shared pool"
                if target in inits
                else f"names no container of this pod (its containers: {', '.join(names)})"
            )
            notes.append(
                Note("Warning", "CPUPolicyIgnored", f"annotation {key}: {why}; ignored", target)
            )
        return notes

    def _pod_failed(self, namespace: str, name: str, stage: str, exc: BaseException) -> None:
        """One pod's failure: logged and told on the pod (a Warning Event, once per message);
        the rest of the batch goes on without it."""
        self.errors += 1
        detail = exc.message if isinstance(exc, CorepinError) else f"{type(exc).__name__}: {exc}"
        if isinstance(exc, CorepinError):
            log.warning("event=pod_failed pod=%s/%s stage=%s error=%s", namespace, name, stage, exc)
        else:
            log.exception("event=pod_crashed pod=%s/%s stage=%s", namespace, name, stage)
        pod = self._pods.cache.get(name, namespace)
        if pod is None:
            return
        uid = str((pod.get("metadata") or {}).get("uid") or "")
        message = f"the node agent could not {stage} this pod ({detail}); other pods go on"
        key = (uid, "", f"failed-{stage}")
        if self._told.get(key) == message:
            return
        self._told[key] = message
        try:
            self.events.event(pod, "Warning", "CPUPinFailed", message)
        except Exception:
            log.exception("event=event_failed pod=%s/%s", namespace, name)

    def _forget_tables(self, uid: str) -> None:
        """Everything the worker remembers about a pod that is gone."""
        self._last_plan.pop(uid, None)
        self._plans.pop(uid, None)
        for told in [k for k in self._told if k[0] == uid]:
            self._told.pop(told, None)
        for seen in [k for k in self._seen_running if k[0] == uid]:
            self._seen_running.pop(seen, None)
        for qos in QOS_CLASSES:
            try:
                self.cgroups.driver.forget(self.cgroups.pod_path(qos, uid))
            except CorepinError:
                break  # (a uid no cgroup path is made of: nothing was cached for it)

    def _uids_gone(self, state: HostState, namespace: str, name: str, uid: str) -> list[str]:
        """Uids of older pods with this name (deleted and created again) still in the state."""
        out = []
        for a in state:
            owner = a.container
            if (
                owner is not None
                and owner.namespace == namespace
                and owner.pod == name
                and owner.pod_uid != uid
            ):
                out.append(owner.pod_uid)
        return sorted(set(out))

    def _apply_orphans(self, state: HostState) -> tuple[HostState, list[str]]:
        """Release assignments of pods that no longer exist (checked at start-up)."""
        live = {str((p.get("metadata") or {}).get("uid")) for p in self._pods.cache.list()}
        gone = sorted(
            {
                a.container.pod_uid
                for a in state
                if a.container is not None and a.container.pod_uid not in live
            }
        )
        for uid in gone:
            state, released = forget_pod(state, uid)
            for a in released:
                log.info("event=released_orphan id=%s cpus=%s", a.id, a.withheld or "-")
        return state, gone

    def _retry_pending(self, state: HostState) -> None:
        """Pods with a container that asked for CPUs but runs on the shared pool: try again."""
        for p in self._pods.cache.list():
            meta = p.get("metadata") or {}
            uid = str(meta.get("uid") or "")
            for a in pod_assignments(state, uid):
                owner = a.container
                if (
                    a.kind == "shared"
                    and owner is not None
                    and (uid, owner.container, "CPUPinFailed") in self._told
                ):
                    self._last_plan.pop(uid, None)  # same plan, but now CPUs may be there
                    self._enqueue_pod(p)
                    break

    def _attach_cgroups(self, state: HostState, plan: PodPlan) -> HostState:
        """The pod's assignments with the cgroup path of their current container."""
        from corepin.core.record import replace

        for a in pod_assignments(state, plan.uid):
            owner = a.container
            if owner is None or not owner.container_id or a.policy == KUBELET_POLICY:
                continue
            path = self.cgroups.container_path(
                plan.qos, plan.uid, owner.runtime or "containerd", owner.container_id
            )
            if path != owner.cgroup:
                state = state.replace_assignment(a.evolve(owner=replace(owner, cgroup=path)))
        return state

    def _quotas(
        self, state: HostState, plan: PodPlan, pod: Mapping[str, Any]
    ) -> dict[str, CpuQuota | None]:
        """CFS quota per cgroup: none for exclusive containers (and their pod when every app
        container is exclusive), the kubelet's limit x period for the others."""
        from corepin.enforcement.cgroups import CpuQuota
        from corepin.kube.models import parse_quantity

        if not self.cgroups.driver.has_cpu_controller():
            return {}  # (said once at start-up)
        limits: dict[str, float] = {}
        for c in (pod.get("spec") or {}).get("containers") or []:
            raw = ((c.get("resources") or {}).get("limits") or {}).get("cpu")
            if raw is not None and not absurd_cpu(raw):
                try:
                    limits[c.get("name")] = float(parse_quantity(raw))
                except CorepinError:
                    continue
        out: dict[str, CpuQuota | None] = {}
        exclusive = 0
        for a in pod_assignments(state, plan.uid):
            owner = a.container
            if owner is None or a.cgroup is None or a.policy == KUBELET_POLICY:
                continue
            if plan.container(owner.container) is None:
                continue  # an init container: the kubelet's quota stays
            limit = limits.get(owner.container)
            if a.kind == "exclusive" and (limit is None or limit >= len(a.cpus)):
                # no quota: the container's CPUs bound it as tightly as its limit would. An
                # exclusive set larger than the limit (never planned so; a stale or foreign
                # record) keeps the limit's quota: a pin never lifts a limit
                out[a.cgroup] = CpuQuota.unlimited()
                exclusive += 1
            elif limit is not None:
                out[a.cgroup] = CpuQuota.for_cpus(limit)
        if plan.containers and exclusive == len(plan.containers):
            out[self.cgroups.pod_path(plan.qos, plan.uid)] = CpuQuota.unlimited()
        elif exclusive == 0 and len(limits) == len(plan.containers) and plan.containers:
            pod_path = self.cgroups.pod_path(plan.qos, plan.uid)
            try:
                current = self.cgroups.driver.read_quota_fast(pod_path, CpuQuota.unlimited())
            except CorepinError:
                current = None
            if current is not None and current.is_unlimited:
                out[pod_path] = CpuQuota.for_cpus(sum(limits.values()))
        return out

    def _enforce(
        self,
        state: HostState,
        assignments: Iterable[Assignment],
        quotas: Mapping[str, CpuQuota | None],
    ) -> None:
        chosen = [a for a in assignments if a.policy != KUBELET_POLICY]
        targets = self.cgroups.targets(state, chosen, quotas)
        if not targets:
            return
        report = self.cgroups.apply(targets)
        self.hooks.cgroup_writes(report.writes)
        for err in report.errors:
            self.hooks.pinning(False, err.reason)
            log.warning("event=cgroup_write_failed error=%s", err)
        if report.writes and not report.errors:
            self.hooks.pinning(True)

    def _observe_latency(self, plan: PodPlan) -> None:
        now = time.monotonic()
        for c in plan.containers:
            first = self._seen_running.pop((plan.uid, c.container_id), None)
            if first is not None:
                self.hooks.pinned_after(now - first)

    # ------------------------------------------------------------------ node
    def _apply_node(self, state: HostState) -> HostState:
        """The state with the node's reserved CPUs (its reservation annotation, else
        --reserved-cpus) and strict-reservation option; unchanged when the new reservation
        would take CPUs someone holds (a Warning Event on the node says so)."""
        from corepin.allocation.pools import select_reserved
        from corepin.kube.models import parse_node_reservation
        from corepin.state.model import STRICT_RESERVATION

        node = self._nodes.cache.get(self.settings.node_name)
        annotations = ((node or {}).get("metadata") or {}).get("annotations") or {}
        reserved = self.settings.reserved_cpus or CPUSet()
        try:
            reservation = parse_node_reservation(annotations)
            if reservation is not None:
                reserved = select_reserved(self.machine, reservation.count, reservation.cpus)
        except CorepinError as exc:
            self._node_event("Warning", "ReservationIgnored", exc.message)
        options = {k: v for k, v in self.settings.options.items() if k == STRICT_RESERVATION}
        wanted = state.evolve(reserved=reserved, options={**state.options, **options})
        clash = [a.id for a in wanted if a.holds and a.withheld & reserved]
        if clash:
            self._node_event(
                "Warning",
                "ReservationIgnored",
                f"reserved CPUs {reserved} overlap CPUs held by {', '.join(clash)}; keeping "
                f"reserved CPUs {state.reserved or 'none'} until they are released",
            )
            return state
        if wanted.reserved != state.reserved:
            log.info("event=reserved_changed old=%s new=%s", state.reserved, wanted.reserved)
        return wanted

    def _node_event(self, kind: str, reason: str, message: str) -> None:
        node = self._nodes.cache.get(self.settings.node_name)
        if node is not None:
            self.events.event(node, kind, reason, message)

    # ------------------------------------------------------------------ publishing
    def _tell(self, pod: Mapping[str, Any], plan: PodPlan, notes: list[Note]) -> None:
        for note in notes:
            key = (plan.uid, note.container, note.reason)
            if (
                note.reason in ("CPUPolicyIgnored", "CPUPinFailed")
                and self._told.get(key) == note.message
            ):
                continue
            self._told[key] = note.message
            self.events.event(pod, note.type, note.reason, note.message)
            if note.reason == "CPUPinFailed":
                self.hooks.pinning(False, "not_enough_cpus")
        pinned = {n.container for n in notes if n.reason in ("CPUPinned", "CPUMoved")}
        for name in pinned:
            self._told.pop((plan.uid, name, "CPUPinFailed"), None)

    def _publish_pod(self, pod: Mapping[str, Any], plan: PodPlan, state: HostState) -> None:
        from corepin.kube.models import ANN_CPUS, format_cpus_annotation
        from corepin.kube.resources import PODS

        # the containers with CPUs of their own (exclusive, share): the shared pool of the others
        # changes with every pin on the node, and rewriting every pod then would flood the API
        mine = {
            a.container.container: a.cpus
            for a in pod_assignments(state, plan.uid)
            if a.container is not None
            and a.holds
            and plan.container(a.container.container) is not None
        }
        text = format_cpus_annotation(mine) if mine else None
        current = ((pod.get("metadata") or {}).get("annotations") or {}).get(ANN_CPUS)
        if text != current and self._annotated.get(plan.uid, current) != text:
            try:
                self.client.patch(
                    PODS, plan.name, {"metadata": {"annotations": {ANN_CPUS: text}}}, plan.namespace
                )
                self._annotated[plan.uid] = text
            except CorepinError as exc:
                log.warning("event=annotate_failed pod=%s error=%s", plan.key, exc)
        holds = [
            a for a in pod_assignments(state, plan.uid) if a.holds and a.policy != KUBELET_POLICY
        ]
        for a in holds:
            self._write_binding(pod, plan, a)
        self._delete_bindings(plan.uid, keep={a.container.container for a in holds if a.container})

    # ------------------------------------------------------------------ assignment files
    def _wanted_files(self, plan: PodPlan, state: HostState) -> dict[str, str]:
        """name -> text of the pod's assignment files (`corepin.agent.node.files`): what each
        container got, in the form `corepin run` gives a command."""
        from corepin.agent.node.files import file_name

        pool = state.shared_pool
        wanted: dict[str, str] = {}
        for a in pod_assignments(state, plan.uid):
            owner = a.container
            if owner is None or plan.container(owner.container) is None:
                continue
            own = a.cpus if a.holds else CPUSet()
            shared = pool if a.with_shared else CPUSet()
            mems = a.mems if a.holds and a.mems else self.machine.mems_of(own | shared)
            exclusive = own if a.exclusive else CPUSet()
            wanted[file_name(plan.namespace, plan.name, owner.container)] = (
                f"COREPIN_CPUS={own | shared}\nCOREPIN_CPUS_EXCLUSIVE={exclusive}\n"
                f"COREPIN_CPUS_SHARED={shared}\nCOREPIN_MEMS={mems}\n"
                f"COREPIN_POLICY={a.kind}\nCOREPIN_POD_UID={plan.uid}\n"
            )
        return wanted

    def _write_assignment_files(self, plan: PodPlan, state: HostState) -> None:
        """Write the pod's files (each on its own: one that fails is logged, the others are
        written), and remove those of its containers that have none any more."""
        from corepin.agent.node.files import remove_files, write_files

        directory = self.settings.assignment_dir
        if not directory:
            return
        wanted = self._wanted_files(plan, state)
        for name, exc in write_files(directory, wanted):
            log.warning("event=assignment_file_failed pod=%s file=%s error=%s", plan.key, name, exc)
        before = self._files.get(plan.uid, set())
        remove_files(directory, before - set(wanted), plan.uid)
        if wanted:
            self._files[plan.uid] = set(wanted)
        else:
            self._files.pop(plan.uid, None)

    def _refresh_shared_files(self, state: HostState) -> None:
        """Rewrite the files of every pod with a container on the shared pool (it changed);
        one pod's failure does not stop the others'."""
        uids = {a.container.pod_uid for a in shared_pool_users(state) if a.container is not None}
        for pod in self._pods.cache.list():
            meta = pod.get("metadata") or {}
            if meta.get("uid") in uids:
                try:
                    self._write_assignment_files(plan_pod(pod), state)
                except Exception:
                    log.exception("event=assignment_files_crashed pod=%s/%s", _ns(pod), _name(pod))

    def _remove_assignment_files(self, uid: str) -> None:
        from corepin.agent.node.files import remove_files

        names = self._files.pop(uid, set())
        if self.settings.assignment_dir:
            remove_files(self.settings.assignment_dir, names, uid)

    def _sweep_assignment_files(self, state: HostState) -> None:
        """Remove every assignment file that belongs to no live pod (a previous run's, a pod
        deleted while the agent was down): at start-up and on every resync."""
        from corepin.agent.node.files import sweep

        directory = self.settings.assignment_dir
        if not directory:
            return
        keep: dict[str, str] = {}
        for pod in self._pods.cache.list():
            plan = plan_pod(pod)
            for name in self._wanted_files(plan, state):
                keep[name] = plan.uid
        removed = sweep(directory, keep)
        if removed:
            log.info("event=assignment_files_swept count=%d", len(removed))
        live = self._live_uids()
        for uid in [u for u in self._files if u not in live]:
            self._files.pop(uid, None)

    def _binding_name(self, pod: str, container: str) -> str:
        name = f"{pod}-{container}".lower()
        if len(name) <= 253:
            return name
        from corepin.agent.settings import state_dir_key

        return f"{name[:230]}-{state_dir_key(name)[3:]}"

    def _write_binding(self, pod: Mapping[str, Any], plan: PodPlan, a: Assignment) -> None:
        from corepin.kube.models import crd_level, format_time, pod_owner

        owner = a.container
        assert owner is not None
        name = self._binding_name(plan.name, owner.container)
        spec = {
            "podName": plan.name,
            "exclusivenessLevel": crd_level(a.level),
            "containers": [{"name": owner.container, "cpuSet": [{"cpuID": c} for c in a.cpus]}],
        }
        status = {
            "nodeName": self.settings.node_name,
            "phase": "Applied",
            "cpus": str(a.cpus),
            "mems": str(a.mems),
            "message": f"{a.kind} CPUs of container {owner.container!r}",
        }
        fingerprint = json.dumps([spec, status, a.kind], sort_keys=True)
        if (self._bindings.get((plan.uid, owner.container)) or ("",))[0] == fingerprint:
            return
        meta_uid = str((pod.get("metadata") or {}).get("uid") or "")
        labels = {
            LABEL_MANAGED_BY: AGENT,
            NODE_LABEL: self.settings.node_name,
            POD_UID_LABEL: plan.uid,
            CONTAINER_LABEL: owner.container,
        }
        annotations = {POLICY_ANNOTATION: a.kind}
        body: dict[str, Any] = {
            "apiVersion": self.pcb.api_version,
            "kind": "PodCPUBinding",
            "metadata": {
                "name": name,
                "namespace": plan.namespace,
                "labels": labels,
                "annotations": annotations,
                "ownerReferences": [pod_owner(plan.name, meta_uid).to_dict()],
            },
            "spec": spec,
        }
        from corepin.core.errors import ApiAlreadyExists

        try:
            try:
                self.client.create(self.pcb, body, plan.namespace)
            except ApiAlreadyExists:
                self.client.patch(
                    self.pcb,
                    name,
                    {"metadata": {"labels": labels, "annotations": annotations}, "spec": spec},
                    plan.namespace,
                )
            condition = {
                "type": "Ready",
                "status": "True",
                "reason": "Applied",
                "message": status["message"],
                "lastTransitionTime": format_time(_utc_now(self.clock)),
            }
            self.client.patch_status(
                self.pcb, name, {"status": {**status, "conditions": [condition]}}, plan.namespace
            )
            self._bindings[(plan.uid, owner.container)] = (fingerprint, plan.namespace, name)
        except CorepinError as exc:
            log.warning("event=binding_write_failed binding=%s error=%s", name, exc)
            return
        if not self._live(plan):  # the pod went while we wrote: no record of a gone pod
            self._delete_bindings(plan.uid, keep=())

    def _delete_bindings(self, uid: str, keep: Iterable[str]) -> None:
        from corepin.core.errors import ApiNotFound

        keep = set(keep)
        stale = [k for k in self._bindings if k[0] == uid and k[1] not in keep]
        selector = f"{LABEL_MANAGED_BY}={AGENT},{POD_UID_LABEL}={uid}"
        doomed: dict[tuple[str, str], None] = {}
        for b in self._bindings_informer.cache.list():
            meta = b.get("metadata") or {}
            labels = meta.get("labels") or {}
            if any(labels.get(k) != v for k, v in (s.split("=", 1) for s in selector.split(","))):
                continue
            if labels.get(CONTAINER_LABEL) not in keep:
                doomed[(str(meta.get("namespace")), str(meta.get("name")))] = None
        # and those we wrote that the informer may not show yet
        doomed.update({self._bindings[k][1:]: None for k in stale})
        failed = False
        for namespace, name in doomed:
            try:
                self.client.delete(self.pcb, name, namespace)
            except ApiNotFound:
                pass
            except CorepinError as exc:
                failed = True
                log.warning("event=binding_delete_failed binding=%s error=%s", name, exc)
        if not failed:
            for k in stale:
                self._bindings.pop(k, None)

    def _sweep_bindings(self, state: HostState) -> None:
        """Delete this node's agent PodCPUBindings whose pod is gone and holds nothing here (a
        previous run's, one that could not be restored): at start-up and on every resync."""
        from corepin.core.errors import ApiNotFound

        live = self._live_uids()
        held = {a.container.pod_uid for a in state if a.container is not None}
        for b in self._bindings_informer.cache.list():
            meta = b.get("metadata") or {}
            labels = meta.get("labels") or {}
            if labels.get(LABEL_MANAGED_BY) != AGENT or labels.get(NODE_LABEL) != self.node_name:
                continue
            uid = labels.get(POD_UID_LABEL, "")
            if uid in live or uid in held:
                continue
            try:
                self.client.delete(self.pcb, str(meta.get("name")), str(meta.get("namespace")))
                log.info("event=stale_binding_deleted binding=%s pod_uid=%s", meta.get("name"), uid)
            except ApiNotFound:
                pass
            except CorepinError as exc:
                log.warning(
                    "event=binding_delete_failed binding=%s error=%s", meta.get("name"), exc
                )
        for key in [k for k in self._bindings if k[0] not in live]:
            self._bindings.pop(key, None)
        for uid in [u for u in self._annotated if u not in live]:
            self._annotated.pop(uid, None)

    def _publish_topology(self) -> None:
        """The node's NodeCPUTopology (spec and status with a heartbeat) and, when its CRD is
        served, its NodeResourceTopology."""
        from corepin.core.errors import ApiAlreadyExists, ApiNotFound
        from corepin.kube.models import format_time

        state = self._state
        if state is None:
            return
        node = self.settings.node_name
        spec = {
            "topology": self.machine.to_json(),
            "policy": self.settings.policy,
            "options": dict(self.settings.options),
            "reservedCPUs": str(state.reserved),
        }
        now = format_time(_utc_now(self.clock))
        status = node_status(state, self.machine, now, promised=self._promised(state))
        try:
            if not self._ncpt_created:
                meta: dict[str, Any] = {"name": node, "labels": {LABEL_MANAGED_BY: AGENT}}
                owner = self._node_owner()
                if owner is not None:
                    meta["ownerReferences"] = [owner]
                body = {
                    "apiVersion": self.ncpt.api_version,
                    "kind": "NodeCPUTopology",
                    "metadata": meta,
                    "spec": spec,
                }
                try:
                    written = self.client.create(self.ncpt, body)
                except ApiAlreadyExists:
                    written = self._replace_ncpt_spec(spec)
                self._ncpt_created = True
                self._spec_stored = (written or {}).get("spec")
                self._last_reserved = spec.get("reservedCPUs")
            else:
                self._ncpt_spec(spec)
            written = self.client.patch_status(self.ncpt, node, {"status": status})
            # (the answer shows the spec as it is now: someone else's edit is put right)
            found = (written or {}).get("spec")
            if found != self._spec_stored and _plain(found) != _plain(spec):
                log.warning("event=topology_spec_repaired node=%s", node)
                self._spec_stored = (self._replace_ncpt_spec(spec) or {}).get("spec")
        except ApiNotFound:
            self._ncpt_created = False
        except CorepinError as exc:
            log.warning("event=topology_publish_failed node=%s error=%s", node, exc)
        if self._nrt:
            self._publish_nrt(state)

    def _ncpt_spec(self, spec: Mapping[str, Any]) -> None:
        if spec.get("reservedCPUs") != getattr(self, "_last_reserved", None):
            self._spec_stored = (self._replace_ncpt_spec(spec) or {}).get("spec")
            self._last_reserved = spec.get("reservedCPUs")

    def _replace_ncpt_spec(self, spec: Mapping[str, Any]) -> Any:
        """Put the whole spec (a JSON patch: a merge patch would keep keys others added)."""
        return self.client.patch(
            self.ncpt,
            self.settings.node_name,
            [{"op": "replace", "path": "/spec", "value": dict(spec)}],
            patch_type="json",
        )

    def _node_owner(self) -> dict[str, Any] | None:
        from corepin.kube.models import node_owner

        node = self._nodes.cache.get(self.settings.node_name)
        uid = ((node or {}).get("metadata") or {}).get("uid")
        return node_owner(self.settings.node_name, uid).to_dict() if uid else None

    def _publish_nrt(self, state: HostState) -> None:
        from corepin.core.errors import ApiAlreadyExists, ApiNotFound
        from corepin.kube.models import node_resource_topology

        body = node_resource_topology(
            self.settings.node_name, self.machine, free=state.free, reserved=state.reserved
        )
        try:
            try:
                self.client.create(self.nrt, body)
            except ApiAlreadyExists:
                current = self.client.get(self.nrt, self.settings.node_name)
                body["metadata"]["resourceVersion"] = (current.get("metadata") or {}).get(
                    "resourceVersion"
                )
                self.client.replace(self.nrt, body)
        except ApiNotFound:
            self._nrt = False  # the NodeResourceTopology CRD is not served: never mind
        except CorepinError as exc:
            log.warning("event=nrt_publish_failed error=%s", exc)


def node_status(
    state: HostState, topology: Topology, heartbeat: str, *, promised: CPUSet | None = None
) -> dict[str, Any]:
    """`NodeCPUTopology.status` of a node state. CPUs `promised` to pods by
    PodCPUBindings (their containers not running yet) are not offered as free."""
    free = state.free - (promised or CPUSet())
    allocations = []
    for a in state:
        owner = a.container
        if owner is None or not a.holds or not owner.namespace or not owner.pod:
            continue  # (an imported kubelet entry whose pod was not seen yet: counted, unnamed)
        row = {
            "namespace": owner.namespace,
            "pod": owner.pod,
            "podUID": owner.pod_uid,
            "container": owner.container,
            "cpus": str(a.cpus),
            "mems": str(a.mems),
            "policy": "share" if a.kind == "share" else "exclusive",
            "level": a.level,
        }
        if a.workload:
            row["workload"] = a.workload  # (the placement core scores memory-bound sockets)
        allocations.append(row)
    return {
        "sharedPool": str(state.shared_pool),
        "reservedCPUs": str(state.reserved),
        "isolatedCPUs": str(state.isolated),
        "free": str(free),
        "freeByNUMA": {
            str(n): str(free & topology.cpus_in_numa_nodes(n)) for n in topology.numa_node_ids()
        },
        "freeByL3": {str(c): str(free & topology.cpus_in_l3s(c)) for c in topology.l3_ids()},
        "allocations": allocations,
        "heartbeatTime": heartbeat,
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": "AgentRunning",
                "message": "the node agent publishes this node's CPUs",
                "lastTransitionTime": heartbeat,
            }
        ],
    }


def _cpu_quantities(pod: Mapping[str, Any]) -> dict[str, list[tuple[str, Any]]]:
    """container name -> [(where, raw CPU quantity)] from its spec and its applied resources."""
    out: dict[str, list[tuple[str, Any]]] = {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    rows = [*(spec.get("containers") or []), *(status.get("containerStatuses") or [])]
    for row in rows:
        if not isinstance(row, Mapping) or not isinstance(row.get("name"), str):
            continue
        resources = row.get("resources") or {}
        if not isinstance(resources, Mapping):
            continue
        for kind in ("limits", "requests"):
            values = resources.get(kind) or {}
            if isinstance(values, Mapping) and "cpu" in values:
                out.setdefault(row["name"], []).append((f"{kind[:-1]}", values["cpu"]))
    return out


def absurd_cpu(raw: Any) -> bool:
    """Whether a CPU quantity is beyond anything a node can give: negative, or more than
    `MAX_CPU_QUANTITY` CPUs (unparseable ones are the eligibility check's business)."""
    from corepin.kube.models import parse_quantity

    try:
        value = parse_quantity(raw)
    except CorepinError:
        return False
    return value < 0 or value > MAX_CPU_QUANTITY


def _refuse_absurd(pod: Mapping[str, Any], plan: PodPlan) -> PodPlan:
    """The plan with every container whose CPU limit or request is absurd (`absurd_cpu`) on
    the shared pool, its problem saying which quantity and why (a Warning Event)."""
    from corepin.core.record import replace

    bad: dict[str, str] = {}
    for name, quantities in _cpu_quantities(pod).items():
        for where, raw in quantities:
            if name not in bad and absurd_cpu(raw):
                bad[name] = (
                    f"container {name!r}: CPU {where} {raw!r} is out of range (a CPU quantity "
                    f"must lie between 0 and {MAX_CPU_QUANTITY} CPUs); it runs on the shared "
                    "pool and its CFS quota is left as the kubelet set it"
                )
    if not bad:
        return plan
    containers = tuple(
        replace(c, policy="none", count=0, cpus=None, problem=bad[c.name]) if c.name in bad else c
        for c in plan.containers
    )
    return replace(plan, containers=containers)


def _running_ids(pod: Mapping[str, Any]) -> set[str]:
    out = set()
    for row in (pod.get("status") or {}).get("containerStatuses") or []:
        if isinstance(row, Mapping) and isinstance(
            (row.get("state") or {}).get("running"), Mapping
        ):
            cid = row.get("containerID")
            if isinstance(cid, str) and "://" in cid:
                out.add(cid.split("://", 1)[1])
    return out


def _owned_by(binding: Mapping[str, Any], pod: Mapping[str, Any]) -> bool:
    """Whether `binding` may be `pod`'s: it names the pod and, when it has an owner reference
    to a pod of that name, that reference is this pod's uid (not an earlier incarnation's)."""
    from corepin.kube.models import ObjectMeta, pod_owner_uid

    name = str((pod.get("metadata") or {}).get("name") or "")
    if (binding.get("spec") or {}).get("podName") != name:
        return False
    try:
        owners = ObjectMeta.from_dict(binding.get("metadata") or {}).owner_references
    except CorepinError:
        return False
    owner = pod_owner_uid(owners, name)
    return owner is None or owner == (pod.get("metadata") or {}).get("uid")


def _plain(value: Any) -> Any:
    """`value` as JSON would give it back (tuples as lists), for comparing with the API's."""
    return json.loads(json.dumps(value))


def _version(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


def _unique(items: Iterable[Assignment]) -> list[Assignment]:
    seen: dict[str, Assignment] = {}
    for a in items:
        seen.setdefault(a.id, a)
    return list(seen.values())


def _utc_now(clock: Callable[[], float]) -> Any:
    import datetime as dt

    return dt.datetime.fromtimestamp(clock(), dt.UTC).replace(microsecond=0)
