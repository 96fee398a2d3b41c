"""What the node agent records about the containers it pinned, in the API: the pod's
`corepin.io/cpus` annotation (the containers with CPUs of their own) and one PodCPUBinding per
such container, labelled as the agent's (`app.kubernetes.io/managed-by: corepin-agent`, the
node, the pod uid, the container) and owned by the pod, so it goes with the pod; its status
says the container's QoS class (`qosClass`) when the agent keeps classes.

Each write is done on its own: one that fails is logged and the others go on. A binding is
written again only when what it says changed; the bindings of a pod that is gone are deleted,
and a sweep (at start-up and on every resync) deletes this node's agent bindings that belong to
no live pod and hold nothing here.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any, Final

from corepin.agent.node.sync import pod_assignments
from corepin.agent.node.watches import Watches, pod_uid
from corepin.agent.settings import state_dir_key
from corepin.core.errors import ApiAlreadyExists, ApiNotFound, CorepinError
from corepin.kube.models import (
    AGENT_MANAGER,
    ANN_CPUS,
    CONTAINER_LABEL,
    LABEL_MANAGED_BY,
    NODE_LABEL,
    POD_UID_LABEL,
    Condition,
    ContainerCPUSet,
    ObjectMeta,
    ObjectView,
    PodCPUBinding,
    PodCPUBindingSpec,
    PodCPUBindingStatus,
    format_cpus_annotation,
    pod_owner,
)
from corepin.kube.podplan import PodPlan
from corepin.kube.resources import PCB, PODS
from corepin.state.kubelet import KUBELET_POLICY
from corepin.state.model import Assignment, HostState

log = logging.getLogger("corepin.agent.node")

#: labels and annotation of the PodCPUBindings the agent writes (one per pinned container)
POLICY_ANNOTATION: Final = "corepin.io/cpu-policy"


def utc_now(clock: Callable[[], float]) -> datetime:
    """The clock's time in UTC, to the second (as the agent stamps what it writes)."""
    return datetime.fromtimestamp(clock(), UTC).replace(microsecond=0)


def binding_name(pod: str, container: str) -> str:
    """The name of the agent's PodCPUBinding of a container (at most 253 characters)."""
    name = f"{pod}-{container}".lower()
    if len(name) <= 253:
        return name
    return f"{name[:230]}-{state_dir_key(name)[3:]}"


class PodRecords:
    """The annotation and the PodCPUBindings of the node's pods."""

    def __init__(
        self,
        watches: Watches,
        clock: Callable[[], float],
        qos_class: Callable[[Assignment], str] | None = None,
    ) -> None:
        self.watches = watches
        self.qos_class = qos_class
        self.client = watches.client
        self.node_name = watches.node_name
        self.clock = clock
        self._annotated: dict[str, str | None] = {}  # pod uid -> corepin.io/cpus we last wrote
        # (uid, container) -> (what we wrote, namespace, binding name)
        self._bindings: dict[
            tuple[str, str], tuple[tuple[PodCPUBindingSpec, PodCPUBindingStatus, str], str, str]
        ] = {}

    def publish(self, pod: Mapping[str, Any], plan: PodPlan, state: HostState) -> None:
        """The pod's annotation and bindings as `state` has its containers."""
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
        current = ObjectView(pod).annotations.get(ANN_CPUS)
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
            self.write_binding(pod, plan, a)
        self.delete_bindings(plan.uid, keep={a.container.container for a in holds if a.container})

    def write_binding(self, pod: Mapping[str, Any], plan: PodPlan, a: Assignment) -> None:
        owner = a.container
        assert owner is not None
        name = binding_name(plan.name, owner.container)
        spec = PodCPUBindingSpec(
            plan.name, a.level, containers=(ContainerCPUSet(owner.container, a.cpus),)
        )
        status = PodCPUBindingStatus(
            "Applied",
            self.node_name,
            a.cpus,
            a.mems,
            f"{a.kind} CPUs of container {owner.container!r}",
            qos_class=None if self.qos_class is None else self.qos_class(a),
        )
        wrote = (spec, status, a.kind)
        known = self._bindings.get((plan.uid, owner.container))
        if known is not None and known[0] == wrote:
            return
        labels = {
            LABEL_MANAGED_BY: AGENT_MANAGER,
            NODE_LABEL: self.node_name,
            POD_UID_LABEL: plan.uid,
            CONTAINER_LABEL: owner.container,
        }
        annotations = {POLICY_ANNOTATION: a.kind}
        meta = ObjectMeta(
            name,
            namespace=plan.namespace,
            labels=labels,
            annotations=annotations,
            owner_references=(pod_owner(plan.name, pod_uid(pod)),),
        )
        try:
            try:
                self.client.create(PCB, PodCPUBinding(meta, spec).to_dict(), plan.namespace)
            except ApiAlreadyExists:
                self.client.patch(
                    PCB,
                    name,
                    {
                        "metadata": {"labels": labels, "annotations": annotations},
                        "spec": spec.to_dict(),
                    },
                    plan.namespace,
                )
            condition = Condition("Ready", "True", utc_now(self.clock), "Applied", status.message)
            applied = dataclasses.replace(status, conditions=(condition,))
            self.client.patch_status(PCB, name, {"status": applied.to_dict()}, plan.namespace)
            self._bindings[(plan.uid, owner.container)] = (wrote, plan.namespace, name)
        except CorepinError as exc:
            log.warning("event=binding_write_failed binding=%s error=%s", name, exc)
            return
        if not self.watches.is_live(plan):  # the pod went while we wrote: no record of a gone pod
            self.delete_bindings(plan.uid, keep=())

    def delete_bindings(self, uid: str, keep: Iterable[str]) -> None:
        keep = set(keep)
        stale = [k for k in self._bindings if k[0] == uid and k[1] not in keep]
        selector = f"{LABEL_MANAGED_BY}={AGENT_MANAGER},{POD_UID_LABEL}={uid}"
        doomed: dict[tuple[str, str], None] = {}
        for b in self.watches.binding_list():
            view = ObjectView(b)
            labels = view.labels
            if any(labels.get(k) != v for k, v in (s.split("=", 1) for s in selector.split(","))):
                continue
            if labels.get(CONTAINER_LABEL) not in keep:
                # str() of the raw fields, as ever ("None" for one missing: never a collection)
                meta = view.metadata
                doomed[(str(meta.get("namespace")), str(meta.get("name")))] = None
        # and those we wrote that the informer may not show yet
        doomed.update({self._bindings[k][1:]: None for k in stale})
        failed = False
        for namespace, name in doomed:
            try:
                self.client.delete(PCB, name, namespace)
            except ApiNotFound:
                pass
            except CorepinError as exc:
                failed = True
                log.warning("event=binding_delete_failed binding=%s error=%s", name, exc)
        if not failed:
            for k in stale:
                self._bindings.pop(k, None)

    def drop_annotation(self, uid: str) -> None:
        """Forget what was written on a pod that is gone."""
        self._annotated.pop(uid, None)

    def sweep(self, state: HostState) -> None:
        """Delete this node's agent PodCPUBindings whose pod is gone and holds nothing here (a
        previous run's, one that could not be restored): at start-up and on every resync."""
        live = self.watches.live_uids()
        held = {a.container.pod_uid for a in state if a.container is not None}
        for b in self.watches.binding_list():
            view = ObjectView(b)
            labels = view.labels
            if (
                labels.get(LABEL_MANAGED_BY) != AGENT_MANAGER
                or labels.get(NODE_LABEL) != self.node_name
            ):
                continue
            uid = labels.get(POD_UID_LABEL, "")
            if uid in live or uid in held:
                continue
            meta = view.metadata  # str() of the raw fields, as ever ("None" for one missing)
            try:
                self.client.delete(PCB, str(meta.get("name")), str(meta.get("namespace")))
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


__all__ = [
    "CONTAINER_LABEL",
    "NODE_LABEL",
    "POD_UID_LABEL",
    "POLICY_ANNOTATION",
    "PodRecords",
    "binding_name",
    "utc_now",
]
