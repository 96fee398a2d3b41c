"""What the node agent holds when it starts, before it looks at any pod.

The checkpoint (validated against the live topology by the state transaction), then:
- the kubelet static CPU manager's assignments when it is active on the node and the agent is
  asked to coexist (`--kubelet-compat`: imported under policy `kubelet-static` and left alone);
  the agent refuses to start beside it otherwise (EnvironmentProblem, exit 4);
- what the agent's own PodCPUBindings say it held when the checkpoint forgot it - only a binding
  that this node's NodeCPUTopology status also shows (see `published_allocations`): a CPU is
  never handed out twice across a restart.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

from corepin.agent.node.records import (
    CONTAINER_LABEL,
    NODE_LABEL,
    POD_UID_LABEL,
    POLICY_ANNOTATION,
)
from corepin.agent.node.settings import NodeSettings
from corepin.allocation.levels import withheld_for
from corepin.core.cpuset import CPUSet
from corepin.core.errors import ApiNotFound, CorepinError, EnvironmentProblem
from corepin.kube.client import KubeClient
from corepin.kube.models import (
    AGENT_MANAGER,
    LABEL_MANAGED_BY,
    NodeCPUTopologyStatus,
    PodCPUBinding,
    pod_owner_uid,
)
from corepin.kube.resources import NCPT, PCB
from corepin.state.kubelet import KUBELET_POLICY, convert, read_kubelet_state
from corepin.state.model import Assignment, HostState
from corepin.state.owners import ContainerOwner
from corepin.topology.model import Topology

log = logging.getLogger("corepin.agent.node")

#: (namespace, pod, pod uid, container, CPUs, kind, level) of a published allocation
Published = tuple[str, str, str, str, CPUSet, str, str]


class Restore:
    """The start-up restore of one node's agent (see the module docstring)."""

    def __init__(
        self,
        settings: NodeSettings,
        client: KubeClient,
        topology: Topology,
        clock: Callable[[], float],
    ) -> None:
        self.settings = settings
        self.client = client
        self.machine = topology
        self.clock = clock

    def kubelet_assignments(self) -> HostState | None:
        """The kubelet static CPU manager's assignments when it is active and we are asked to
        coexist; EnvironmentProblem when it is active and we are not."""
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
        state, _ = convert(checkpoint, self.machine, created=self.clock())
        return state

    def restored(self, state: HostState, imported: HostState | None) -> HostState:
        """`state` (the checkpoint) with the kubelet's assignments (compat), and what our own
        PodCPUBindings say we hold when the checkpoint forgot it."""
        if imported is not None:
            for a in imported:
                if a.id not in state:
                    try:
                        state = state.add(a.evolve(policy=KUBELET_POLICY))
                    except CorepinError as exc:
                        log.warning("event=kubelet_import_skipped id=%s error=%s", a.id, exc)
        return self.from_bindings(state)

    def from_bindings(self, state: HostState) -> HostState:
        selector = f"{LABEL_MANAGED_BY}={AGENT_MANAGER},{NODE_LABEL}={self.settings.node_name}"
        items, _ = self.client.list_all(PCB, label_selector=selector)
        published = self.published_allocations() if items else set()
        for raw in items:
            try:
                binding = PodCPUBinding.from_dict(raw)
            except CorepinError:
                continue
            labels = binding.metadata.labels  # (from_dict checked that they are strings)
            uid = labels.get(POD_UID_LABEL, "")
            container = labels.get(CONTAINER_LABEL, "")
            kind = binding.metadata.annotations.get(POLICY_ANNOTATION, "exclusive")
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

    def published_allocations(self) -> set[Published]:
        """(namespace, pod, pod uid, container, CPUs, kind, level) of every allocation this
        node's NodeCPUTopology status shows: what this agent published before it restarted.

        Why this and not the label of a binding: a PodCPUBinding may be created (labels and
        all) by any tenant allowed to create bindings in its namespace, while the
        NodeCPUTopology is cluster scoped, and only this node's agent writes it (its status is
        rewritten from the agent's own state on every heartbeat). A binding is restored as the
        agent's record only when both agree."""
        try:
            ncpt = self.client.get(NCPT, self.settings.node_name)
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


__all__ = ["Restore"]
