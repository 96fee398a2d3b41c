"""Shared pieces of the placement tests: pods, and nodes published the way the agent does.

`published(state, topology)` is the agent's own `node_status` of a node state wrapped in a
NodeCPUTopology object (so the placement core reads exactly what an agent would publish);
`run_pods(...)` builds such a state by running the agent's own sync over pods.
"""

from __future__ import annotations

import datetime as dt
import itertools
import uuid
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
_ids = itertools.count(1)


def stamp(seconds: float = EPOCH) -> str:
    return format_time(dt.datetime.fromtimestamp(seconds, dt.UTC))


def pod(
    name: str,
    *containers: tuple[str, str | None],
    policy: str | None = "exclusive",
    level: str | None = None,
    workload: str | None = None,
    annotations: Mapping[str, str] | None = None,
    running: bool = False,
    namespace: str = "ns",
    node: str | None = None,
    scheduler: str | None = None,
) -> dict[str, Any]:
    """A pod; each container is (name, cpu) with request = limit (None: no CPU resources)."""
    notes: dict[str, str] = {}
    if policy is not None:
        notes["corepin.io/cpu-policy"] = policy
    if level is not None:
        notes["corepin.io/exclusiveness-level"] = level
    if workload is not None:
        notes["corepin.io/workload-type"] = workload
    notes.update(annotations or {})
    specs = []
    statuses = []
    for cname, cpu in containers or (("app", "1"),):
        res = {"limits": {"cpu": cpu}, "requests": {"cpu": cpu}} if cpu else {}
        specs.append({"name": cname, "image": "busybox", "resources": res})
        if running:
            cid = f"{next(_ids):064x}"
            statuses.append(
                {"name": cname, "containerID": f"containerd://{cid}", "state": {"running": {}}}
            )
    spec: dict[str, Any] = {"containers": specs}
    if node:
        spec["nodeName"] = node
    if scheduler:
        spec["schedulerName"] = scheduler
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{namespace}/{name}")),
            "annotations": notes,
        },
        "spec": spec,
        "status": {"containerStatuses": statuses} if running else {},
    }


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
