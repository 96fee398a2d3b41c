"""What the node agent sees of the API: informers of the node's pods (field selector
`spec.nodeName`), of the node itself (its reservation annotation) and of PodCPUBindings; and,
apart from those three (the agent starts without it when the API refuses it), of the node QoS
ConfigMap `corepin-qos` in the agent's namespace (`open_qos`), and of CPUReservations
(`open_reservations`: the agent starts without their list when the API does not serve them).

List + watch from the list's resourceVersion, relist on 410 Gone, reconnect with bounded backoff
(`corepin.kube.informer`). The agent creates them when it starts (`open`) and registers its
handlers, which only put keys on its work queue; everything else reads their caches, here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from corepin.agent.node.settings import QOS_CONFIGMAP
from corepin.kube.client import KubeClient, Obj
from corepin.kube.informer import Informer
from corepin.kube.models import ObjectView
from corepin.kube.podplan import PodPlan
from corepin.kube.resources import CONFIGMAPS, CPUR, NODES, PCB, PODS


def pod_uid(pod: Mapping[str, Any]) -> str:
    """The uid of a pod (or any object): "" when it has none."""
    return ObjectView(pod).uid


class Watches:
    """The agent's three informers and reads of their caches."""

    pods: Informer
    nodes: Informer
    bindings: Informer

    def __init__(self, client: KubeClient, node_name: str) -> None:
        self.client = client
        self.node_name = node_name
        #: every informer the agent needs, once `open` made them
        self.informers: list[Informer] = []
        #: the QoS ConfigMap's, once `open_qos` made it
        self.qos_config: Informer | None = None
        #: the CPUReservations', once `open_reservations` made it
        self.reservations: Informer | None = None

    def open(self) -> None:
        """Make the informers (not started: the agent adds its handlers and starts them)."""
        node = self.node_name
        self.pods = Informer(self.client, PODS, field_selector=f"spec.nodeName={node}", name="pods")
        self.nodes = Informer(
            self.client, NODES, field_selector=f"metadata.name={node}", name="node"
        )
        self.bindings = Informer(self.client, PCB, name="bindings")
        self.informers = [self.pods, self.nodes, self.bindings]

    def open_qos(self, namespace: str) -> Informer:
        """Make the informer of the QoS ConfigMap of `namespace` (not started)."""
        self.qos_config = Informer(
            self.client,
            CONFIGMAPS,
            namespace=namespace,
            field_selector=f"metadata.name={QOS_CONFIGMAP}",
            name="qos-config",
        )
        return self.qos_config

    def open_reservations(self) -> Informer:
        """Make the informer of CPUReservations (cluster scoped; not started)."""
        self.reservations = Informer(self.client, CPUR, name="cpureservations")
        return self.reservations

    @property
    def every_informer(self) -> list[Informer]:
        """The informers the agent needs, the QoS ConfigMap's and the CPUReservations' (their
        watch restarts)."""
        extra = [i for i in (self.qos_config, self.reservations) if i is not None]
        return [*self.informers, *extra]

    # ------------------------------------------------------------------ reads
    def pod(self, name: str, namespace: str) -> Obj | None:
        return self.pods.cache.get(name, namespace)

    def pod_list(self) -> list[Obj]:
        return self.pods.cache.list()

    def live_uids(self) -> set[str]:
        """The uids of the pods on the node now (as the pod informer has them)."""
        # str() of the raw uid, as ever: a pod without one counts as "None", never as ""
        return {str(ObjectView(p).metadata.get("uid")) for p in self.pods.cache.list()}

    def is_live(self, plan: PodPlan) -> bool:
        """Whether the pod of `plan` is on the node now (as the pod informer has it)."""
        pod = self.pods.cache.get(plan.name, plan.namespace)
        # the raw uid, as ever: a pod without one (or with one not a string) is never live
        return pod is not None and ObjectView(pod).metadata.get("uid") == plan.uid

    def node(self) -> Obj | None:
        return self.nodes.cache.get(self.node_name)

    def binding_list(self) -> list[Obj]:
        return self.bindings.cache.list()

    def reservation_list(self) -> list[Obj]:
        """Every CPUReservation the informer has (none before `open_reservations`)."""
        return [] if self.reservations is None else self.reservations.cache.list()


def annotations_changed(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Whether an object's raw annotations changed (a node that gains `annotations: {}` counts):
    a node's reservation annotation may have."""
    return bool(
        ObjectView(old).metadata.get("annotations") != ObjectView(new).metadata.get("annotations")
    )


__all__ = ["Watches", "annotations_changed", "pod_uid"]
