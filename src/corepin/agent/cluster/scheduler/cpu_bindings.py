"""`corepin scheduler --bind-cpus`: the PodCPUBinding naming the exact CPUs the scheduler chose
for every exclusive container of a pod, written as a user would write one (the node's agent
honours it), before the pod is bound.

The binding is named `<pod>.<scheduler name>`, labelled with the scheduler (`CREATED_BY`) and
the node (`NODE_LABEL`), owned by the pod, and marked `Validated` at once (status
subresource): the CPUs were chosen against the node's published free set and the placements
in flight, so the agent need not wait for the controller.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable
from typing import Final

from corepin.agent.cluster.catalog import PlacementFeed
from corepin.core.errors import ApiAlreadyExists, CorepinError
from corepin.core.record import replace
from corepin.kube.client import KubeClient
from corepin.kube.models import (
    NODE_LABEL,
    ContainerCPUSet,
    ObjectMeta,
    ObjectView,
    PodCPUBinding,
    PodCPUBindingSpec,
    pod_owner,
)
from corepin.kube.resources import PCB
from corepin.placement.fit import Fit
from corepin.placement.request import PodRequest

log = logging.getLogger("corepin.agent.cluster.scheduler")

#: label on the PodCPUBindings the scheduler creates (they are requests, like a user's)
CREATED_BY: Final = "corepin.io/created-by"
#: the node a PodCPUBinding is meant for (the agent's own label of its records, too)


def api_time(clock: Callable[[], float]) -> str:
    """`clock()` as the API writes a time, to the second."""
    stamp = dt.datetime.fromtimestamp(clock(), dt.UTC)
    return stamp.strftime("%Y-%m-%dT%H:%M:%SZ")


def with_cpus(request: PodRequest, result: Fit) -> PodRequest:
    """`request` as the agent will read it once our PodCPUBinding is there: its exclusive
    containers on exactly the chosen CPUs."""
    chosen = {p.container: p.cpus for p in result.placed if p.kind == "exclusive"}
    containers = tuple(
        replace(c, cpus=chosen[c.name]) if c.name in chosen else c for c in request.containers
    )
    return replace(request, containers=containers)


class CPUBindings:
    """Writes the PodCPUBindings of the scheduler `scheduler` (see the module docstring)."""

    def __init__(
        self,
        client: KubeClient,
        catalog: PlacementFeed,
        scheduler: str,
        clock: Callable[[], float],
    ) -> None:
        self.client = client
        self.catalog = catalog
        self.scheduler = scheduler
        self.clock = clock

    def binding(self, request: PodRequest, result: Fit, node: str) -> PodCPUBinding | None:
        """The PodCPUBinding of the exclusive containers of `result` (None: there are none)."""
        exclusive = [p for p in result.placed if p.kind == "exclusive"]
        if not exclusive:
            return None
        meta = ObjectMeta(
            name=f"{request.name}.{self.scheduler}"[:253],
            namespace=request.namespace,
            # the node label lets the node's agent keep the CPUs for the pod before it sees
            # the pod itself (its pod watch may lag behind its binding watch)
            labels={CREATED_BY: self.scheduler, NODE_LABEL: node},
            owner_references=(pod_owner(request.name, request.uid),),
        )
        spec = PodCPUBindingSpec(
            pod_name=request.name,
            level=exclusive[0].level,
            containers=tuple(ContainerCPUSet(p.container, p.cpus) for p in exclusive),
        )
        return PodCPUBinding(meta, spec)

    def promise(self, request: PodRequest, node: str, result: Fit) -> str | None:
        """Create the pod's PodCPUBinding of the chosen CPUs (in the scheduling thread, so the
        bindings exist in the order pods are placed, before any later pod is bound), or
        rewrite ours from an earlier try; its name, or None when there is nothing to bind or
        the user wrote a binding of their own (it is honoured as it is)."""
        existing = self.catalog.binding_for(request.namespace, request.name)
        if existing is not None and ObjectView(existing).labels.get(CREATED_BY) != self.scheduler:
            return None
        binding = self.binding(request, result, node)
        if binding is None:
            return None
        body = binding.to_dict()
        try:
            self.client.create(PCB, body, request.namespace)
        except ApiAlreadyExists:
            # ours from an earlier try (a failed bind): point it at this choice
            self.client.patch(
                PCB,
                binding.name,
                {"metadata": {"labels": body["metadata"]["labels"]}, "spec": body["spec"]},
                request.namespace,
            )
        self._validate(binding.name, request.namespace, node)
        return binding.name

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
            "message": f"CPUs chosen by {self.scheduler} on node {node}",
            "lastTransitionTime": api_time(self.clock),
        }
        status = {"phase": "Validated", "nodeName": node, "conditions": [condition]}
        try:
            self.client.patch_status(PCB, name, {"status": status}, namespace)
        except CorepinError as exc:
            log.warning("event=binding_not_validated binding=%s/%s error=%s", namespace, name, exc)


__all__ = ["CREATED_BY", "NODE_LABEL", "CPUBindings", "api_time", "with_cpus"]
