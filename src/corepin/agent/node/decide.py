"""The node agent's decisions for the keys of one batch, made on the worker thread inside one
state transaction: a pod's plan applied to the state (`corepin.agent.node.sync`), the pods that
are gone released, the pods that waited for CPUs tried again.

Before a pod's CPUs are decided, the NUMA nodes of the devices the kubelet gave its containers
are read (`corepin.agent.node.devices`, the kubelet's PodResources API) for the containers that
may get CPUs of their own: the decision prefers, or requires, CPUs there.

A pod's plan (`corepin.kube.podplan.plan_pod`, with absurd CPU quantities refused) is reused
while neither the pod nor its binding changed, and a pod whose plan and assignments are what
they were last time is not synced again, so a resync with nothing to change decides nothing.
Every table kept per pod goes with its pod (`forget`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from corepin.agent.node.devices import DeviceSource
from corepin.agent.node.enforce import ContainerCgroups
from corepin.agent.node.promises import Promises
from corepin.agent.node.qosclass import ClassRequest, class_events, class_request
from corepin.agent.node.quantities import refuse_absurd
from corepin.agent.node.sync import PodEvent, SyncContext, forget_pod, pod_assignments, sync_pod
from corepin.agent.node.tell import Teller
from corepin.agent.node.watches import Watches, pod_uid
from corepin.allocation.types import Policy
from corepin.core.cpuset import CPUSet
from corepin.core.errors import CorepinError
from corepin.core.ids import QOS_CLASSES
from corepin.core.record import record
from corepin.kube.client import Obj
from corepin.kube.models import ANN_CPU_POLICY_PREFIX, ObjectView, PodView
from corepin.kube.models.fields import loose_list, loose_object
from corepin.kube.podplan import PodPlan, plan_pod
from corepin.state.model import Assignment, HostState
from corepin.topology.model import Topology

log = logging.getLogger("corepin.agent.node")


@record(frozen=False)
class PodWork:
    """A pod synced in this batch, with what to tell and publish about it."""

    pod: Mapping[str, Any]
    plan: PodPlan
    events: list[PodEvent]
    #: the QoS class the pod names (`corepin.agent.node.qosclass`)
    request: ClassRequest = ClassRequest()


class Decider:
    """The decisions of the worker, and the tables it keeps per pod."""

    def __init__(
        self,
        watches: Watches,
        topology: Topology,
        policy: Policy,
        cgroups: ContainerCgroups,
        promises: Promises,
        teller: Teller,
        clock: Callable[[], float],
        devices: DeviceSource | None = None,
    ) -> None:
        self.watches = watches
        self.devices = devices
        self.machine = topology
        self.policy = policy
        self.cgroups = cgroups
        self.promises = promises
        self.teller = teller
        self.clock = clock
        self._uids: dict[tuple[str, str], str] = {}  # (namespace, pod) -> uid of what we saw
        self._seen_running: dict[tuple[str, str], float] = {}  # (uid, cid) -> first seen
        self._last_plan: dict[str, tuple[PodPlan, tuple[Assignment, ...], ClassRequest]] = {}
        self._plans: dict[str, tuple[tuple[str, str | None], PodPlan]] = {}

    # ------------------------------------------------------------------ what the watches saw
    def seen(self, pod: Mapping[str, Any]) -> tuple[str, str]:
        """(namespace, name) of a pod the watch reported, its uid remembered (so that its
        deletion is known by name)."""
        view = ObjectView(pod)
        ns, name = view.namespace or "default", view.name
        uid = view.metadata.get("uid")  # raw: a uid that is not a string is not remembered
        if isinstance(uid, str) and uid:
            self._uids[(ns, name)] = uid
        return ns, name

    def started(self, old: Mapping[str, Any], new: Mapping[str, Any]) -> None:
        """Note when containers of a pod were first reported running (for `latencies`)."""
        now = time.monotonic()
        before = _running_ids(old)
        uid = pod_uid(new)
        for cid in _running_ids(new) - before:
            self._seen_running.setdefault((uid, cid), now)

    # ------------------------------------------------------------------ decisions
    def apply_pod(
        self,
        state: HostState,
        namespace: str,
        name: str,
        resync: bool,
        bindings: Mapping[tuple[str, str], Mapping[str, Any]],
    ) -> tuple[HostState, PodWork | None, list[str]]:
        """The state after one pod's plan (None work: nothing to do for it), and the uids of
        pods it replaced or that are gone; `bindings` are the validated user bindings."""
        pod = self.watches.pod(name, namespace)
        if pod is None:
            uid = self._uids.pop((namespace, name), None)
            if uid is None:
                return state, None, []
            state, _ = forget_pod(state, uid)
            return state, None, [uid]  # (every table of the pod goes, held CPUs or not)
        plan = self._plan(pod, bindings.get((namespace, name)))
        held = tuple(pod_assignments(state, plan.uid))
        request = class_request(pod)
        if self._last_plan.get(plan.uid) == (plan, held, request):
            return state, (PodWork(pod, plan, [], request) if resync else None), []
        stale = _uids_gone(state, namespace, name, plan.uid)
        for uid in stale:
            state, _ = forget_pod(state, uid)
        promised = self.promises.promised(state, exclude=(namespace, name))
        ctx = SyncContext(
            self.machine, self.policy, self.clock(), promised, self._device_numa(plan)
        )
        state, events = sync_pod(state, plan, ctx)
        events.extend(_annotation_events(pod, plan))
        if request.problem:
            log.warning(
                "event=qos_class_ignored pod=%s/%s key=%s value=%r",
                namespace,
                name,
                request.key,
                request.value,
            )
            events.extend(class_events(request))
        state = self.cgroups.attach(state, plan)
        self._last_plan[plan.uid] = (plan, tuple(pod_assignments(state, plan.uid)), request)
        return state, PodWork(pod, plan, events, request), stale

    def _device_numa(self, plan: PodPlan) -> dict[str, CPUSet]:
        """Container -> NUMA nodes of its devices, asked of the kubelet only when a running
        container of the pod may get CPUs of its own chosen by the policy."""
        if self.devices is None or not any(
            c.holds and c.running and c.cpus is None and c.device_alignment != "none"
            for c in plan.containers
        ):
            return {}
        return self.devices.container_numa(plan.namespace, plan.name)

    def _plan(self, pod: Obj, binding: Mapping[str, Any] | None) -> PodPlan:
        """`plan_pod`, reused while neither the pod nor its binding changed (their
        resourceVersions), so a resync with nothing to change plans nothing again."""
        version = (
            ObjectView(pod).resource_version,
            None if binding is None else ObjectView(binding).resource_version,
        )
        uid = pod_uid(pod)
        cached = self._plans.get(uid)
        if cached is not None and cached[0] == version and version[0]:
            return cached[1]
        plan = refuse_absurd(pod, plan_pod(pod, binding))
        self._plans[uid] = (version, plan)
        return plan

    def plan_of(self, pod: Obj) -> PodPlan:
        """The plan of a pod the watch shows (with its validated user binding, if any)."""
        view = ObjectView(pod)
        binding = self.promises.user_bindings().get((view.namespace or "default", view.name))
        return self._plan(pod, binding)

    def apply_orphans(self, state: HostState) -> tuple[HostState, list[str]]:
        """Release assignments of pods that no longer exist (checked at start-up)."""
        live = self.watches.live_uids()
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

    def to_retry(self, state: HostState) -> list[Obj]:
        """Pods with a container that asked for CPUs but runs on the shared pool: to be tried
        again (their last plan forgotten: same plan, but now CPUs may be there)."""
        out = []
        for p in self.watches.pod_list():
            uid = pod_uid(p)
            for a in pod_assignments(state, uid):
                owner = a.container
                if (
                    a.kind == "shared"
                    and owner is not None
                    and self.teller.waits_for_cpus(uid, owner.container)
                ):
                    self._last_plan.pop(uid, None)
                    out.append(p)
                    break
        return out

    def latencies(self, plan: PodPlan) -> list[float]:
        """Seconds from the first report of each container of `plan` running until now."""
        now = time.monotonic()
        out = []
        for c in plan.containers:
            first = self._seen_running.pop((plan.uid, c.container_id), None)
            if first is not None:
                out.append(now - first)
        return out

    def forget(self, uid: str) -> None:
        """Everything the worker remembers about a pod that is gone."""
        self._last_plan.pop(uid, None)
        self._plans.pop(uid, None)
        self.teller.forget(uid)
        for seen in [k for k in self._seen_running if k[0] == uid]:
            self._seen_running.pop(seen, None)
        for qos in QOS_CLASSES:
            try:
                self.cgroups.driver.forget(self.cgroups.pod_path(qos, uid))
            except CorepinError:
                break  # (a uid no cgroup path is made of: nothing was cached for it)


def _annotation_events(pod: Mapping[str, Any], plan: PodPlan) -> list[PodEvent]:
    """A Warning for every `corepin.io/cpu-policy.<container>` annotation that names no
    app container of the pod (a typo would otherwise be ignored without a word)."""
    # every key, whatever its value (`ObjectView.annotations` keeps the strings only)
    annotations = loose_object(ObjectView(pod).metadata.get("annotations"))
    names = [c.name for c in plan.containers]
    inits = {c.name for c in plan.init_containers}
    events = []
    for key in sorted(k for k in annotations if isinstance(k, str)):
        if not key.startswith(ANN_CPU_POLICY_PREFIX):
            continue
        target = key[len(ANN_CPU_POLICY_PREFIX) :]
        if not target or target in names:
            continue
        why = (
            f"names init container {target!r}, and init containers always run on the shared pool"
            if target in inits
            else f"names no container of this pod (its containers: {', '.join(names)})"
        )
        events.append(
            PodEvent("Warning", "CPUPolicyIgnored", f"annotation {key}: {why}; ignored", target)
        )
    return events


def _uids_gone(state: HostState, namespace: str, name: str, uid: str) -> list[str]:
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


def _running_ids(pod: Mapping[str, Any]) -> set[str]:
    out = set()
    for row in loose_list(PodView(pod).status.get("containerStatuses")):
        if isinstance(row, Mapping) and isinstance(
            (row.get("state") or {}).get("running"), Mapping
        ):
            cid = row.get("containerID")
            if isinstance(cid, str) and "://" in cid:
                out.add(cid.split("://", 1)[1])
    return out


__all__ = ["Decider", "PodWork"]
