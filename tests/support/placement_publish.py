"""Publishing NodeCPUTopologies into the fake API server the way an agent does (for the
extender and scheduler tests that need nodes without running whole agents)."""

from __future__ import annotations

import contextlib
import time

import yaml

from corepin.agent.node.agent import node_status
from corepin.kube.client import KubeClient, Resource
from corepin.kube.resources import CRDS, NODES
from corepin.state.model import HostState
from corepin.topology.model import Topology
from support.paths import REPO
from support.placement_helpers import stamp

NCPT = Resource("corepin.io", "v1alpha1", "nodecputopologies", False, "NodeCPUTopology")
PCB = Resource("corepin.io", "v1alpha1", "podcpubindings", True, "PodCPUBinding")


def install_crds(kube: KubeClient) -> None:
    for name in ("nodecputopologies.yaml", "podcpubindings.yaml"):
        for doc in yaml.safe_load_all((REPO / "deploy" / "crd" / name).read_text()):
            with contextlib.suppress(Exception):
                kube.create(CRDS, doc)


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
