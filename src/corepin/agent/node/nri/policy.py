"""The NRI plugin's decisions: the node agent's rules, answered in the runtime's own requests.

The runtime calls the plugin (`corepin.nri.plugin.Handlers`) and `NriPolicy` answers:

- CreateContainer: the container's pod is planned as the node agent plans a pod
  (`RuntimeView.pod_object` -> `corepin.kube.podplan.plan_pod` -> `corepin.agent.node.sync.
  sync_pod`, on the node's one state and checkpoint, `NodeStore`); the reply adjusts the new
  container's `cpuset.cpus` and `cpuset.mems` (and, for an exclusive container, lifts its CFS
  quota: quota -1) and updates every other container whose CPUs changed (the shared pool shrank);
- UpdateContainer (the kubelet's UpdateContainerResources, an in-place resize): the new CPU
  request and limit are planned again and the reply re-asserts the container's pin, so nothing
  but corepin changes a pinned container's CPUs;
- StopContainer: the container's CPUs are released; the reply grows the shared pool's
  containers back;
- Synchronize (start, restart, runtime restart): the runtime's pods and containers replace the
  view; the checkpoint's assignments of containers that still run are kept, those of pods that
  are gone released; a running container the checkpoint does not know keeps the exclusive CPUs
  it already has when they are free (a lost checkpoint never moves a running container, and a
  CPU is never handed out twice); every container whose live CPUs differ from its pin is
  updated (drift repaired);
- StateChange (pod stopped or removed, container removed): the same release; the updates it
  causes go out in the next reply (see below);
- PostStartContainer: a container that was updated in a reply while it was created but not yet
  running is updated again in the next reply. containerd 1.7 applies an update of a container
  that does not run to its spec only, which is lost when it had already read the spec to start
  the container (containers created at the same moment as an exclusive one).

Every update travels in a reply, never in an unsolicited UpdateContainers call: containerd
takes its own NRI lock before the NRI library's lock for every event, and UpdateContainers takes
them the other way round (NRI releases up to 0.12), so an UpdateContainers that meets a
container event can hang containerd for good (seen on containerd 1.7.24 under load). An update
that no reply carries right away (a pod removed without its containers being stopped, a new
reservation, a repair after PostStart) is what the next reply carries: the runtime is told what
differs from what it was last told, for every container, in every reply.

When CPUs free up, pods with a container that waits for CPUs of its own (it runs on the shared
pool meanwhile) are planned again. Nothing here ever refuses a container: a decision that fails
leaves the container on the shared pool, and the reason is logged and told (`on_decided`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Final, TypeVar

from corepin.agent.node.nri.settings import NriSettings
from corepin.agent.node.nri.view import (
    ANN_CPU_LIMIT,
    CpuAsk,
    RuntimeContainer,
    RuntimeView,
    qos_of_parent,
)
from corepin.agent.node.qosclass import assignment_class, class_request
from corepin.agent.node.reservation import NodeReservation
from corepin.agent.node.store import NodeStore
from corepin.agent.node.sync import PodEvent, SyncContext, assignment_id, forget_pod, sync_pod
from corepin.allocation.policies import get_policy
from corepin.core.cpuset import CPUSet
from corepin.core.qos import class_of
from corepin.core.record import record, replace
from corepin.enforcement.wanted import cpus_and_mems
from corepin.kube.podplan import PodPlan, plan_pod
from corepin.nri.gen import api_pb2
from corepin.state.model import HostState
from corepin.topology.model import Topology

log = logging.getLogger("corepin.agent.nri")

T = TypeVar("T")

#: the runtime events the plugin subscribes to
EVENTS: Final = (
    api_pb2.RUN_POD_SANDBOX,
    api_pb2.STOP_POD_SANDBOX,
    api_pb2.REMOVE_POD_SANDBOX,
    api_pb2.CREATE_CONTAINER,
    api_pb2.POST_START_CONTAINER,
    api_pb2.UPDATE_CONTAINER,
    api_pb2.STOP_CONTAINER,
    api_pb2.REMOVE_CONTAINER,
)
#: CFS quota that lifts the limit (what runc writes as "no quota")
NO_QUOTA: Final = -1
#: the CFS period the kubelet gives every container (microseconds)
DEFAULT_PERIOD: Final = 100_000


@record
class Pin:
    """What a container should run on: CPUs, memory nodes, and whether its quota is lifted."""

    cpus: CPUSet
    mems: CPUSet
    exclusive: bool = False


@record
class Decided:
    """One pod decided: its plan and what to tell about it (for Events and the API)."""

    pod_id: str
    plan: PodPlan
    events: tuple[PodEvent, ...]


class NriPolicy:
    """The plugin logic (`corepin.nri.plugin.Handlers`) of one node."""

    def __init__(
        self,
        settings: NriSettings,
        topology: Topology,
        *,
        reservation: NodeReservation | None = None,
        on_state: Callable[[HostState], None] = lambda state: None,
        on_decided: Callable[[Decided], None] = lambda decided: None,
        on_forgotten: Callable[[str], None] = lambda uid: None,
        rdt_group: Callable[[str], str | None] = lambda qos_class: None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.machine = topology
        self.policy = get_policy(settings.policy)
        self.view = RuntimeView()
        self.store = NodeStore(settings.state_dir, settings.proc_root, topology, on_state)
        self.reservation = reservation or NodeReservation(
            settings.reserved_cpus, settings.options, lambda: None, topology, None
        )
        self.on_decided = on_decided
        self.on_forgotten = on_forgotten
        #: the RDT class (resctrl group) of a QoS class, None when it has none
        self.rdt_group = rdt_group
        self.clock = clock
        self.runtime = ("", "")
        self.synced = threading.Event()
        self._lock = threading.RLock()
        self._all_mems = CPUSet(n.id for n in topology.numa_nodes) or CPUSet.of(0)
        #: container ids whose CFS quota the plugin lifted (to put back when they stop being
        #: exclusive)
        self._lifted: set[str] = set()

    # ------------------------------------------------------------------ Handlers
    def configure(self, req: api_pb2.ConfigureRequest) -> None:
        self.runtime = (req.runtime_name, req.runtime_version)
        log.info(
            "event=nri_configured runtime=%s version=%s",
            req.runtime_name or "unknown",
            req.runtime_version or "unknown",
        )
        # what a newer NRI (0.7 and later) tells in Configure; NRI 0.6.1 (containerd 1.7)
        # sends none of it, and corepin then relies on the 0.6 behaviour only
        log.info(
            "event=nri_features nri_version=%s request_timeout=%s registration_timeout=%s",
            req.nri_version or "unknown (NRI < 0.7)",
            f"{req.request_timeout / 1e3:g}s" if req.request_timeout > 0 else "unknown (2s)",
            f"{req.registration_timeout / 1e3:g}s" if req.registration_timeout > 0 else "unknown",
        )

    def synchronize(
        self, pods: Sequence[api_pb2.PodSandbox], containers: Sequence[api_pb2.Container]
    ) -> list[api_pb2.ContainerUpdate]:
        with self._lock:
            self.view.clear()
            self._lifted.clear()
            for pod in pods:
                self.view.pod(pod)
            for container in containers:
                known = self.view.container(container)
                lifted = CpuAsk.of(
                    container.linux.resources if container.HasField("linux") else None
                )
                if lifted.quota == NO_QUOTA and known.ask.quota != NO_QUOTA:
                    self._lifted.add(known.id)  # (lifted by this plugin before)
            state = self._decide(list(self.view.pods), reserve=True, adopt=True, orphans=True)
            updates = self._updates(state)
            self.synced.set()
            log.info(
                "event=nri_synchronized pods=%d containers=%d updates=%d",
                len(self.view.pods),
                len(self.view.containers),
                len(updates),
            )
            return updates

    def create_container(
        self, req: api_pb2.CreateContainerRequest
    ) -> api_pb2.CreateContainerResponse:
        with self._lock:
            self.view.pod(req.pod)
            known = self.view.container(req.container, state=api_pb2.CONTAINER_CREATED)
            state = self._decide([known.pod_id])
            pin = self.pin_of(state, known)
            reply = api_pb2.CreateContainerResponse()
            self._fill(reply.adjust.linux.resources.cpu, known, pin)
            if pin.exclusive and known.ask.limit_text():
                reply.adjust.annotations[ANN_CPU_LIMIT] = known.ask.limit_text()
            rdt = self.rdt_group(self.qos_class_of(state, known))
            if rdt is not None:
                reply.adjust.linux.resources.rdt_class.value = rdt
            self.view.told(known.id, str(pin.cpus), str(pin.mems))
            reply.update.extend(self._updates(state, skip=known.id))
            return reply

    def update_container(
        self, req: api_pb2.UpdateContainerRequest
    ) -> api_pb2.UpdateContainerResponse:
        with self._lock:
            self.view.pod(req.pod)
            known = self.view.container(req.container)
            if req.HasField("linux_resources"):
                asked = CpuAsk.of(req.linux_resources)
                if asked.quota == NO_QUOTA and known.id in self._lifted:
                    asked = replace(asked, quota=None)  # (our own lift, not the kubelet's)
                self.view.set_ask(known.id, asked)
            state = self._decide([known.pod_id])
            known = self.view.containers[known.id]
            reply = api_pb2.UpdateContainerResponse()
            pin = self.pin_of(state, known)
            mine = reply.update.add(container_id=known.id)
            self._fill(mine.linux.resources.cpu, known, pin)
            self.view.told(known.id, str(pin.cpus), str(pin.mems))
            reply.update.extend(self._updates(state, skip=known.id))
            return reply

    def stop_container(self, req: api_pb2.StopContainerRequest) -> api_pb2.StopContainerResponse:
        with self._lock:
            self.view.pod(req.pod)
            known = self.view.container(req.container, state=api_pb2.CONTAINER_STOPPED)
            state = self._decide([known.pod_id])
            return api_pb2.StopContainerResponse(update=self._updates(state))

    def state_change(self, event: api_pb2.StateChangeEvent) -> None:
        with self._lock:
            kind = event.event
            pod_id = event.pod.id
            if kind == api_pb2.RUN_POD_SANDBOX:
                self.view.pod(event.pod)
                return
            if kind == api_pb2.POST_START_CONTAINER:
                known = self.view.container(event.container, state=api_pb2.CONTAINER_RUNNING)
                if known.stale:
                    # updated before it ran: the update may have reached only its spec after
                    # the runtime had read it, so the next reply sends it again
                    self.view.told(known.id, "", "")
                    self.view.set_stale(known.id, False)
            elif kind == api_pb2.REMOVE_CONTAINER:
                self.view.drop_container(event.container.id)
                self._lifted.discard(event.container.id)
                self._decide([pod_id])
            elif kind == api_pb2.STOP_POD_SANDBOX:
                for c in list(self.view.containers.values()):
                    if c.pod_id == pod_id and c.live:
                        self.view.set_state(c.id, api_pb2.CONTAINER_STOPPED)
                self._decide([pod_id])
            elif kind == api_pb2.REMOVE_POD_SANDBOX:
                gone = self.view.drop_pod(pod_id)
                uid = gone.uid if gone is not None else (event.pod.uid or pod_id)
                self._decide([], forget=uid)

    def shutdown(self) -> None:
        log.info("event=nri_runtime_shutdown")

    def disconnected(self) -> None:
        """The runtime went away: what it reported is stale until it synchronizes again."""
        self.synced.clear()
        log.warning("event=nri_disconnected: the runtime will synchronize again")

    # ------------------------------------------------------------------ live changes
    def refresh(self, *, reserve: bool = True) -> None:
        """Decide every pod again (a new reservation); the next reply carries what changed."""
        with self._lock:
            if self.synced.is_set():
                self._decide(list(self.view.pods), reserve=reserve)

    @property
    def state(self) -> HostState | None:
        return self.store.state

    # ------------------------------------------------------------------ decisions
    def _decide(
        self,
        pod_ids: Iterable[str],
        *,
        reserve: bool = False,
        adopt: bool = False,
        orphans: bool = False,
        forget: str = "",
    ) -> HostState:
        """Plan and sync the given pods in one state transaction (then the pods that wait for
        CPUs, when CPUs freed up); the state committed. `forget`: the uid of a pod that is
        gone, released first."""
        decided: list[Decided] = []
        gone: list[str] = [forget] if forget else []
        with self.store.transaction() as txn:
            before = state = txn.state
            if forget:
                state, _ = forget_pod(state, forget)
            if reserve:
                state = self.reservation.apply(state)
            if orphans:
                state = self._drop_orphans(state, gone)
            if adopt:
                self._restore_lifted(state)
            pods = list(dict.fromkeys(pod_ids))
            if adopt:  # containers that keep the CPUs they run on go first
                pods.sort(key=lambda p: not self._adoptions(state, p))
            for pod_id in pods:
                state = self._sync(state, pod_id, adopt, decided)
            if len(state.free) > len(before.free) or state.reserved != before.reserved:
                for pod_id in self._waiting(state, skip=set(pods)):
                    state = self._sync(state, pod_id, False, decided)
            if orphans and not txn.existed:
                state = txn.commit(state)  # (the first checkpoint: later reads reuse it)
            else:
                state = txn.commit_if_changed(state)
        for one in decided:
            self._told(one)
        for uid in gone:
            self._tell(self.on_forgotten, uid)
        return state

    def _sync(self, state: HostState, pod_id: str, adopt: bool, out: list[Decided]) -> HostState:
        if pod_id not in self.view.pods:
            return state
        plan = plan_pod(self.view.pod_object(pod_id, self.runtime[0]))
        if adopt:
            adopted = self._adoptions(state, pod_id)
            if adopted:
                plan = replace(
                    plan,
                    containers=tuple(
                        replace(c, cpus=adopted[c.name]) if c.name in adopted else c
                        for c in plan.containers
                    ),
                )
        ctx = SyncContext(self.machine, self.policy, self.clock())
        try:
            state, events = sync_pod(state, plan, ctx)
        except Exception as exc:  # this pod stays as it was; the others go on
            log.exception("event=nri_pod_failed pod=%s", plan.key)
            events = [PodEvent("Warning", "CPUPinFailed", f"corepin could not decide: {exc}")]
        out.append(Decided(pod_id, plan, tuple(events)))
        return state

    def _restore_lifted(self, state: HostState) -> None:
        """Containers the runtime reports with a lifted quota and no kept limit (pinned before
        a restart without the annotation: upgraded after waiting for CPUs) that the
        checkpoint holds as exclusive: the plugin lifts only the quota of a container whose
        limit is its request, so the limit is read as its CPU count again."""
        for c in list(self.view.live()):
            pod = self.view.pods.get(c.pod_id)
            if c.ask.quota != NO_QUOTA or pod is None:
                continue
            held = state.get(assignment_id(pod.uid, c.name))
            if held is not None and held.kind == "exclusive":
                period = c.ask.period or DEFAULT_PERIOD
                self.view.set_ask(c.id, CpuAsk(quota=period * len(held.cpus), period=period))
                self._lifted.add(c.id)

    def _adoptions(self, state: HostState, pod_id: str) -> dict[str, CPUSet]:
        """Containers of the pod that ask for exclusive CPUs, have no assignment in the state,
        and already run on as many free CPUs as they ask: name -> those CPUs."""
        out: dict[str, CPUSet] = {}
        pod = self.view.pods.get(pod_id)
        if pod is None:
            return out
        plan = plan_pod(self.view.pod_object(pod_id, self.runtime[0]))
        for c in plan.containers:
            if c.policy != "exclusive" or state.get(assignment_id(pod.uid, c.name)) is not None:
                continue
            live = [r for r in self.view.of_pod(pod_id) if r.name == c.name and r.live]
            if not live or not live[0].cpus:
                continue
            try:
                cpus = CPUSet.parse(live[0].cpus)
            except ValueError:
                continue
            if len(cpus) == c.count and cpus <= state.free:
                out[c.name] = cpus
        return out

    def _waiting(self, state: HostState, skip: set[str]) -> list[str]:
        """Pods with a container that asked for CPUs of its own but runs on the shared pool."""
        out = []
        for pod_id, pod in self.view.pods.items():
            if pod_id in skip:
                continue
            plan = plan_pod(self.view.pod_object(pod_id, self.runtime[0]))
            for c in plan.containers:
                held = state.get(assignment_id(pod.uid, c.name))
                if c.holds and c.running and held is not None and held.kind == "shared":
                    out.append(pod_id)
                    break
        return out

    def _drop_orphans(self, state: HostState, gone: list[str]) -> HostState:
        live = {p.uid for p in self.view.pods.values()}
        for uid in sorted(
            {a.container.pod_uid for a in state if a.container and a.container.pod_uid not in live}
        ):
            gone.append(uid)
            state, released = forget_pod(state, uid)
            for a in released:
                log.info("event=released_orphan id=%s cpus=%s", a.id, a.withheld or "-")
        return state

    def _told(self, decided: Decided) -> None:
        for event in decided.events:
            level = logging.WARNING if event.type == "Warning" else logging.INFO
            log.log(
                level,
                "event=%s pod=%s container=%s message=%s",
                event.reason,
                decided.plan.key,
                event.container or "-",
                event.message,
            )
        self._tell(self.on_decided, decided)

    @staticmethod
    def _tell(hook: Callable[[T], None], what: T) -> None:
        try:
            hook(what)
        except Exception:  # telling never stops a decision
            log.exception("event=nri_tell_failed about=%r", what)

    # ------------------------------------------------------------------ pins
    def pin_of(self, state: HostState, container: RuntimeContainer) -> Pin:
        """What `container` should run on in `state` (the shared pool when it holds nothing)."""
        pod = self.view.pods.get(container.pod_id)
        a = state.get(assignment_id(pod.uid, container.name)) if pod is not None else None
        if a is None or not self.view.speaks_for(container):
            return Pin(state.shared_pool, self._all_mems)
        cpus, mems = cpus_and_mems(a, state.shared_pool, self.machine, pool_mems=self._all_mems)
        return Pin(cpus, mems, exclusive=a.kind == "exclusive")

    def qos_class_of(self, state: HostState, container: RuntimeContainer) -> str:
        """The QoS class of `container`: the one its pod names, else derived from its
        assignment, or (one the plugin does not pin) from its pod's Kubernetes QoS class."""
        pod = self.view.pods.get(container.pod_id)
        if pod is None:
            return class_of("shared")
        given = class_request(
            {"metadata": {"annotations": dict(pod.annotations), "labels": dict(pod.labels)}}
        ).qos_class
        a = state.get(assignment_id(pod.uid, container.name))
        if a is not None:
            return assignment_class(a, given)
        return class_of("shared", qos_of_parent(pod.cgroup_parent) or None, given)

    def _fill(self, cpu: api_pb2.LinuxCPU, container: RuntimeContainer, pin: Pin) -> None:
        """Write the pin into NRI's Linux CPU resources: CPUs, memory nodes, and the quota
        when it is lifted (exclusive) or must come back (no longer exclusive)."""
        cpu.cpus = str(pin.cpus)
        cpu.mems = str(pin.mems)
        if pin.exclusive:
            cpu.quota.value = NO_QUOTA
            self._lifted.add(container.id)
        elif container.id in self._lifted:
            self._lifted.discard(container.id)
            ask = container.ask
            if ask.quota is not None and ask.quota != NO_QUOTA:
                cpu.quota.value = ask.quota
                if ask.period:
                    cpu.period.value = ask.period

    def _updates(self, state: HostState, skip: str = "") -> list[api_pb2.ContainerUpdate]:
        """An update for every live container whose CPUs, memory nodes or quota lift differ
        from what the runtime was last told (or reported). One that does not run yet is marked
        stale: its update may reach only its spec (checked again at PostStartContainer)."""
        out = []
        for c in list(self.view.live()):
            if c.id == skip:
                continue
            pin = self.pin_of(state, c)
            lifted = c.id in self._lifted
            if _same(c.cpus, pin.cpus) and _same(c.mems, pin.mems) and lifted == pin.exclusive:
                continue
            if not c.running:
                self.view.set_stale(c.id, True)
            update = api_pb2.ContainerUpdate(container_id=c.id, ignore_failure=True)
            self._fill(update.linux.resources.cpu, c, pin)
            self.view.told(c.id, str(pin.cpus), str(pin.mems))
            out.append(update)
        return out


def _same(reported: str, wanted: CPUSet) -> bool:
    """Whether a CPU list the runtime reported (or was told) is `wanted`, in any spelling."""
    if reported == str(wanted):  # (what corepin told, spelled as corepin spells it)
        return bool(reported)
    try:
        return CPUSet.parse(reported) == wanted if reported else False
    except ValueError:
        return False


__all__ = ["EVENTS", "NO_QUOTA", "Decided", "NriPolicy", "Pin"]
