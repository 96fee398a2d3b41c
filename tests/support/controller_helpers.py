"""Objects and a harness for the controller's tests: NodeCPUTopologies of named machines, pods
created on the fake API server, PodCPUBindings, and a controller run against them."""

from __future__ import annotations

import contextlib
import datetime as dt
import time
from collections.abc import Iterator
from typing import Any

from corepin.agent.cluster.controller.controller import (
    BINDINGS,
    TOPOLOGIES,
    Controller,
    ControllerSettings,
)
from corepin.core.cpuset import CPUSet
from corepin.kube.client import KubeClient
from corepin.kube.models import (
    API_VERSION,
    Allocation,
    NodeCPUTopology,
    NodeCPUTopologySpec,
    NodeCPUTopologyStatus,
    ObjectMeta,
    agent_binding_labels,
    format_time,
    pod_owner,
)
from corepin.kube.resources import PODS
from corepin.topology.model import Topology
from support import pods
from support.helpers import wait_for

Obj = dict[str, Any]


def ncpt(
    node: str,
    topology: Topology,
    *,
    reserved: str = "",
    heartbeat: dt.datetime | None = None,
    ready: bool | None = True,
    allocations: tuple[Allocation, ...] = (),
) -> Obj:
    """A NodeCPUTopology as an agent would publish it (Ready=True, a heartbeat, the shared
    pool and the free CPUs, the `allocations` it holds)."""
    from corepin.allocation.levels import withheld_for
    from corepin.kube.models import Condition

    now = heartbeat or dt.datetime.now(dt.UTC)
    conditions = ()
    if ready is not None:
        status = "True" if ready else "False"
        conditions = (Condition("Ready", status, now, "AgentRunning", "test agent"),)
    held = CPUSet().union(*(withheld_for(topology, a.level, a.cpus) for a in allocations))
    model = NodeCPUTopology(
        ObjectMeta(node),
        NodeCPUTopologySpec(topology, "topology-aware", reserved_cpus=CPUSet.parse(reserved)),
        NodeCPUTopologyStatus(
            shared_pool=topology.online_cpus - held - topology.isolated_cpus,
            reserved_cpus=CPUSet.parse(reserved),
            isolated_cpus=topology.isolated_cpus,
            free=topology.online_cpus - CPUSet.parse(reserved) - held,
            allocations=allocations,
            heartbeat_time=now,
            conditions=conditions,
        ),
    )
    return model.to_dict()


def allocation(
    pod_obj: Obj, cpus: str, *, container: str = "app", level: str = "cpu"
) -> Allocation:
    """A row of `status.allocations`: the agent holds `cpus` for the pod's container."""
    meta = pod_obj["metadata"]
    held = CPUSet.parse(cpus)
    return Allocation(
        meta["namespace"],
        meta["name"],
        meta["uid"],
        container,
        held,
        CPUSet.of(0),
        "exclusive",
        level,
    )


def republish(kube: KubeClient, obj: Obj) -> Obj:
    """Write a NodeCPUTopology's status again (the agent's next report)."""
    current = kube.get(TOPOLOGIES, obj["metadata"]["name"])
    current["status"] = obj["status"]
    return kube.replace_status(TOPOLOGIES, current)


def publish(kube: KubeClient, obj: Obj) -> Obj:
    """Create a NodeCPUTopology with its status (create, then the status subresource)."""
    created = kube.create(TOPOLOGIES, {k: v for k, v in obj.items() if k != "status"})
    created["status"] = obj["status"]
    return kube.replace_status(TOPOLOGIES, created)


def heartbeat(kube: KubeClient, node: str, when: dt.datetime | None = None) -> Obj:
    """What the agent does every few seconds: a new heartbeatTime (and Ready=True)."""
    from corepin.kube.models import Condition, set_condition

    for _ in range(10):
        current = kube.get(TOPOLOGIES, node)
        stamp = when or dt.datetime.now(dt.UTC)
        status = NodeCPUTopologyStatus.from_dict(current.get("status") or {})
        conditions = set_condition(
            status.conditions, Condition("Ready", "True", stamp, "AgentRunning", "test agent")
        )
        current["status"] = {
            **current.get("status", {}),
            "heartbeatTime": format_time(stamp),
            "conditions": [c.to_dict() for c in conditions],
        }
        try:
            return kube.replace_status(TOPOLOGIES, current)
        except Exception:
            time.sleep(0.05)
    raise AssertionError("could not write a heartbeat")


def create_pod(kube: KubeClient, name: str, *containers: Obj, **fields: Any) -> Obj:
    """Create `support.pods.pod(name, *containers, **fields)` through the API, bound to
    worker-1 unless `node` says otherwise; the pod as the API server stored it."""
    body = pods.pod(name, *containers, **{"node": "worker-1", **fields})
    return kube.create(PODS, body, body["metadata"]["namespace"])


def binding(
    name: str,
    pod_name: str,
    *,
    cpus: str | None = None,
    level: str = "CPU",
    containers: dict[str, str] | None = None,
    namespace: str = "default",
    agent: bool = False,
    owner: Obj | None = None,
) -> Obj:
    """A PodCPUBinding body: explicit CPUs (text such as "2-3") for the pod or per container;
    `agent` adds the agent's label; `owner` a pod object to own it."""
    spec: Obj = {"podName": pod_name, "exclusivenessLevel": level}
    if cpus is not None:
        spec["cpuSet"] = [{"cpuID": c} for c in CPUSet.parse(cpus)]
    if containers:
        spec["containers"] = [
            {"name": n, "cpuSet": [{"cpuID": c} for c in CPUSet.parse(t)]}
            for n, t in containers.items()
        ]
    meta: Obj = {"name": name, "namespace": namespace}
    if agent:
        meta["labels"] = agent_binding_labels()
    if owner is not None:
        meta["ownerReferences"] = [
            pod_owner(owner["metadata"]["name"], owner["metadata"]["uid"]).to_dict()
        ]
    return {"apiVersion": API_VERSION, "kind": "PodCPUBinding", "metadata": meta, "spec": spec}


def create_binding(kube: KubeClient, body: Obj, *, status: Obj | None = None) -> Obj:
    created = kube.create(BINDINGS, body)
    if status is not None:
        created["status"] = status
        created = kube.replace_status(BINDINGS, created)
    return created


def status_of(kube: KubeClient, name: str, namespace: str = "default") -> Obj:
    found: Obj = kube.get(BINDINGS, name, namespace).get("status") or {}
    return found


def condition(status: Obj, kind: str) -> Obj | None:
    return next((c for c in status.get("conditions") or [] if c.get("type") == kind), None)


def wait_phase(
    kube: KubeClient, name: str, phase: str, *, namespace: str = "default", timeout: float = 10
) -> Obj:
    """Wait until the binding's status.phase is `phase`; its status."""
    seen: list[Obj] = [{}]

    def reached() -> bool:
        seen[0] = status_of(kube, name, namespace)
        return seen[0].get("phase") == phase

    try:
        wait_for(reached, timeout, f"{namespace}/{name} phase {phase}")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; last status: {seen[0]}") from None
    return seen[0]


def gone(kube: KubeClient, name: str, namespace: str = "default") -> bool:
    from corepin.core.errors import ApiNotFound

    try:
        kube.get(BINDINGS, name, namespace)
    except ApiNotFound:
        return True
    return False


def settle(controller: Controller, timeout: float = 10.0, quiet: float = 0.3) -> None:
    """Wait until the controller has had nothing to do for `quiet` seconds."""
    deadline = time.monotonic() + timeout
    idle_since: float | None = None
    while time.monotonic() < deadline:
        if controller.idle():
            idle_since = idle_since or time.monotonic()
            if time.monotonic() - idle_since >= quiet:
                return
        else:
            idle_since = None
        time.sleep(0.02)
    raise AssertionError("the controller did not settle")


@contextlib.contextmanager
def running(
    kube: KubeClient, settings: ControllerSettings | None = None, **kwargs: Any
) -> Iterator[Controller]:
    controller = Controller(kube, settings or ControllerSettings(), **kwargs).start()
    try:
        assert controller.wait_for_sync(10), "the controller's informers did not sync"
        yield controller
    finally:
        assert controller.stop(5.0)
