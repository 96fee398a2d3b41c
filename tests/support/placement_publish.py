"""Publishing NodeCPUTopologies into the fake API server the way an agent does (for the
extender and scheduler tests that need nodes without running whole agents)."""

from __future__ import annotations

import contextlib
import time

from corepin.agent.node.nodetopology import node_status
from corepin.kube.client import KubeClient
from corepin.kube.resources import NCPT, NODES
from corepin.state.model import HostState
from corepin.topology.model import Topology
from support.placement_helpers import stamp


def publish(
    kube: KubeClient,
    name: str,
    state: HostState,
    topology: Topology,
    *,
    heartbeat: float | None = None,
    policy: str = "topology-aware",
    node: bool = True,
) -> None:
    """Create (or update) the node's NodeCPUTopology with the agent's status of `state`, and
    its Node object."""
    if node:
        with contextlib.suppress(Exception):
            kube.create(NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
    spec = {
        "topology": topology.to_json(),
        "policy": policy,
        "options": {},
        "reservedCPUs": str(state.reserved),
    }
    body = {"apiVersion": NCPT.api_version, "kind": "NodeCPUTopology",
            "metadata": {"name": name}, "spec": spec}  # fmt: skip
    try:
        kube.create(NCPT, body)
    except Exception:
        kube.patch(NCPT, name, {"spec": spec})
    status = node_status(state, topology, stamp(time.time() if heartbeat is None else heartbeat))
    kube.patch_status(NCPT, name, {"status": status})
