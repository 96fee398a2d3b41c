"""Shared pieces of the placement tests: nodes published the way the agent does (the pods
are `support.pods`).

`published(state, topology)` is the agent's own `node_status` of a node state wrapped in a
NodeCPUTopology object (so the placement core reads exactly what an agent would publish);
`run_pods(...)` builds such a state by running the agent's own sync over pods.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from corepin.agent.node.nodetopology import node_status
from corepin.agent.node.sync import SyncContext, sync_pod
from corepin.allocation.policies import get_policy
from corepin.core.errors import CorepinError
from corepin.kube.models import NodeCPUTopology, format_time
from corepin.kube.podplan import plan_pod
from corepin.state.model import HostState
from corepin.topology.model import Topology

EPOCH = 1_800_000_000.0


def stamp(seconds: float = EPOCH) -> str:
    return format_time(dt.datetime.fromtimestamp(seconds, dt.UTC))


def run_pods(
    topology: Topology,
    pods: list[dict[str, Any]],
    *,
    policy: str = "topology-aware",
    state: HostState | None = None,
) -> HostState:
    """The agent's state after it pinned `pods` (their containers running) in order."""
    state = state or HostState.new(topology)
    ctx = SyncContext(topology, get_policy(policy), EPOCH)
    for p in pods:
        try:
            state, _ = sync_pod(state, plan_pod(p), ctx)
        except CorepinError:
            continue  # (the agent fails such a batch: see test_placement_core)
    return state


def published(
    state: HostState,
    topology: Topology,
    *,
    name: str = "node-a",
    policy: str = "topology-aware",
    options: Mapping[str, str] | None = None,
    heartbeat: float = EPOCH,
    ready: bool = True,
    status: bool = True,
) -> NodeCPUTopology:
    """The NodeCPUTopology the agent would publish for `state`."""
    body: dict[str, Any] = {
        "apiVersion": "corepin.io/v1alpha1",
        "kind": "NodeCPUTopology",
        "metadata": {"name": name, "resourceVersion": "1"},
        "spec": {
            "topology": topology.to_json(),
            "policy": policy,
            "options": dict(options or {}),
            "reservedCPUs": str(state.reserved),
        },
    }
    if status:
        body["status"] = node_status(state, topology, stamp(heartbeat))
        if not ready:
            body["status"]["conditions"][0].update(
                status="False", reason="HeartbeatStale", message="the agent stopped"
            )
    return NodeCPUTopology.from_dict(body)


def published_dict(ncpt: NodeCPUTopology) -> dict[str, Any]:
    return ncpt.to_dict()
