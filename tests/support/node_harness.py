"""A node for node-agent tests: the fake API server, corepin's CRDs, a Node object, a fake cgroup
v1 tree in the kubelet's cgroupfs layout, and a stand-in kubelet that reports containers.

`FakeNode.pod(...)` creates a pod (`support.pods.pod`) bound to the node through the API;
`run(pod)` creates its container cgroups (with the files the kernel shows) and reports the
containers running in the pod's status as the kubelet does (`containerd://<64 hex>` ids, QoS
class); `restart`, `terminate` and `delete` do what their names say. `agent()` starts a real
`NodeAgent` against all of it (the same classes `corepin agent` wires), `cpus(pod, container)`
reads back what the agent wrote into the container's cgroup. The real-container version of
this (containerd, real cgroups) is `tests/support/kubelet_harness.py`.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import time
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from corepin.agent.node.agent import NodeAgent
from corepin.agent.node.enforce import ContainerCgroups
from corepin.agent.node.settings import NodeSettings
from corepin.core.cpuset import CPUSet
from corepin.enforcement.cgroups import CgroupV1
from corepin.enforcement.faketree import make_fake_v1
from corepin.enforcement.layout import container_cgroup_path, pod_cgroup_path
from corepin.kube.client import KubeClient
from corepin.kube.resources import NODES, PODS
from corepin.topology.model import Topology
from support import pods
from support.kube_helpers import install_crds

NODE = "node-a"


def qos_of(containers: list[Mapping[str, Any]]) -> str:
    limits = [(c.get("resources") or {}).get("limits") or {} for c in containers]
    requests = [(c.get("resources") or {}).get("requests") or {} for c in containers]
    if not any(limits) and not any(requests):
        return "BestEffort"
    for lim, req in zip(limits, requests, strict=True):
        for res in ("cpu", "memory"):
            if res not in lim or str(req.get(res, lim[res])) != str(lim[res]):
                return "Burstable"
    return "Guaranteed"


class FakeNode:
    """One node (`name`, default node-a) on a fake API server that may hold several."""

    def __init__(
        self, client: KubeClient, topology: Topology, tmp: Path, *, name: str = NODE
    ) -> None:
        self.client = client
        self.topology = topology
        self.tmp = tmp
        self.name = name
        self.driver: CgroupV1 = make_fake_v1(
            tmp / "cgroup",
            cpus=topology.online_cpus,
            mems=CPUSet(n.id for n in topology.numa_nodes),
        )
        self.driver.create("kubepods")
        self.state_dir = tmp / "state"
        self.agents: list[NodeAgent] = []
        self.api: Any = None  # the fake API server, when a test needs its controls
        install_crds(client)
        self.node = client.create(
            NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}
        )

    # ------------------------------------------------------------------ agent
    def settings(self, **changes: Any) -> NodeSettings:
        base: dict[str, Any] = {
            "node_name": self.name,
            "state_dir": str(self.state_dir),
            "kubelet_state": str(self.tmp / "no-kubelet-state"),
            "assignment_dir": str(self.tmp / "assignments"),
            "resync_period": 3600.0,
            "heartbeat_period": 3600.0,
            # no QoS loop unless a test asks for one: its suppression would measure this
            # machine's /proc/stat against the synthetic topology and squeeze BE pods
            "qos_period": 0.0,
        }
        base.update(changes)
        return NodeSettings(**base)

    def agent(self, *, start: bool = True, **changes: Any) -> NodeAgent:
        cgroups = ContainerCgroups(self.driver, self.topology)
        agent = NodeAgent(self.settings(**changes), self.client, self.topology, cgroups)
        if start:
            agent.start(sync_timeout=30)
        self.agents.append(agent)
        return agent

    def close(self) -> None:
        for agent in self.agents:
            agent.stop()

    # ------------------------------------------------------------------ pods
    def pod(self, name: str, *containers: dict[str, Any], **fields: Any) -> dict[str, Any]:
        """Create `support.pods.pod(name, *containers, **fields)` through the API, bound to
        this node unless `node` names another; the pod as the API server stored it."""
        body = pods.pod(name, *containers, **{"node": self.name, **fields})
        return self.client.create(PODS, body, body["metadata"]["namespace"])

    def get(self, pod: Mapping[str, Any]) -> dict[str, Any]:
        meta = pod["metadata"]
        return self.client.get(PODS, meta["name"], meta["namespace"])

    def qos(self, pod: Mapping[str, Any]) -> str:
        return qos_of(pod["spec"]["containers"]).lower()

    def container_path(self, pod: Mapping[str, Any], cid: str) -> str:
        return container_cgroup_path(
            "cgroupfs", self.qos(pod), pod["metadata"]["uid"], "containerd", cid
        )

    def run(self, pod: Mapping[str, Any], *only: str) -> dict[str, Any]:
        """Start the pod's containers (or `only` these): cgroups plus a Running status."""
        pod = self.get(pod)
        uid = pod["metadata"]["uid"]
        self.driver.create(pod_cgroup_path("cgroupfs", self.qos(pod), uid))
        statuses = {s["name"]: s for s in (pod.get("status") or {}).get("containerStatuses", [])}
        for c in pod["spec"]["containers"]:
            name = c["name"]
            if only and name not in only:
                continue
            cid = secrets.token_hex(32)
            self.driver.create(self.container_path(pod, cid))
            old = statuses.get(name)
            restarts = (old["restartCount"] + 1) if old else 0
            statuses[name] = pods.running_container(name, cid, restarts=restarts)
        return self._status(pod, list(statuses.values()))

    def _status(self, pod: Mapping[str, Any], statuses: list[dict[str, Any]]) -> dict[str, Any]:
        qos = qos_of(pod["spec"]["containers"])
        meta = pod["metadata"]
        written = self.client.patch_status(
            PODS,
            meta["name"],
            {"status": {"phase": "Running", "qosClass": qos, "containerStatuses": statuses}},
            meta["namespace"],
        )
        self.seen(written)
        return written

    def seen(self, pod: Mapping[str, Any], *, or_gone: bool = False) -> None:
        """Wait (up to 10 s) until every running agent of this node has the pod at this
        version or later in its pod informer (`or_gone`: or no longer has it), so that a
        test's next `wait_idle` covers the work this write causes (a watch event can arrive
        after a loaded machine answered the write)."""
        meta = pod["metadata"]
        key, version = (meta["name"], meta["namespace"]), int(meta["resourceVersion"])
        deadline = time.monotonic() + 10
        for agent in self.agents:
            if agent._stop.is_set() or not agent.synced.is_set():
                continue
            while time.monotonic() < deadline:
                cached = agent.watches.pods.cache.get(*key)
                if cached is None and or_gone:
                    break
                have = ((cached or {}).get("metadata") or {}).get("resourceVersion")
                if have is not None and int(have) >= version:
                    break
                time.sleep(0.005)

    def restart(self, pod: Mapping[str, Any], name: str) -> dict[str, Any]:
        return self.run(pod, name)

    def terminate(self, pod: Mapping[str, Any], name: str) -> dict[str, Any]:
        pod = self.get(pod)
        statuses = []
        for s in pod["status"]["containerStatuses"]:
            if s["name"] == name:
                s = {**s, "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}
            statuses.append(s)
        return self._status(pod, statuses)

    def resize(self, pod: Mapping[str, Any], resources: Mapping[str, Mapping[str, Any]]) -> None:
        """Report an in-place resize the way the kubelet does once it applied it."""
        pod = self.get(pod)
        statuses = []
        for s in pod["status"]["containerStatuses"]:
            if s["name"] in resources:
                s = {**s, "resources": dict(resources[s["name"]])}
            statuses.append(s)
        self._status(pod, statuses)

    def delete(self, pod: Mapping[str, Any]) -> None:
        meta = pod["metadata"]
        answer = self.client.delete(PODS, meta["name"], meta["namespace"])
        # gone, or (graceful deletion) still there at the version the delete left
        self.seen(answer if (answer or {}).get("kind") == "Pod" else pod, or_gone=True)

    def annotate(self, pod: Mapping[str, Any], annotations: Mapping[str, str | None]) -> None:
        meta = pod["metadata"]
        written = self.client.patch(
            PODS, meta["name"], {"metadata": {"annotations": dict(annotations)}}, meta["namespace"]
        )
        self.seen(written)

    # ------------------------------------------------------------------ reading back
    def cid(self, pod: Mapping[str, Any], name: str) -> str:
        pod = self.get(pod)
        for s in pod["status"]["containerStatuses"]:
            if s["name"] == name:
                return str(s["containerID"]).split("://", 1)[1]
        raise AssertionError(f"no container {name}")

    def cpus(self, pod: Mapping[str, Any], name: str) -> CPUSet:
        pod = self.get(pod)
        return CPUSet.parse(
            self.driver.read_cpus_text(self.container_path(pod, self.cid(pod, name)))
        )

    def mems(self, pod: Mapping[str, Any], name: str) -> CPUSet:
        pod = self.get(pod)
        return CPUSet.parse(
            self.driver.read_mems_text(self.container_path(pod, self.cid(pod, name)))
        )

    def quota(self, pod: Mapping[str, Any], name: str | None = None) -> int | None:
        pod = self.get(pod)
        if name is None:
            path = pod_cgroup_path("cgroupfs", self.qos(pod), pod["metadata"]["uid"])
        else:
            path = self.container_path(pod, self.cid(pod, name))
        return self.driver.read_quota(path).quota_us

    def annotation(self, pod: Mapping[str, Any]) -> str | None:
        return (self.get(pod)["metadata"].get("annotations") or {}).get("corepin.io/cpus")


@contextlib.contextmanager
def fake_node(
    client: KubeClient, topology: Topology, tmp: Path, *, name: str = NODE
) -> Iterator[FakeNode]:
    node = FakeNode(client, topology, tmp, name=name)
    try:
        yield node
    finally:
        node.close()


def new_uid() -> str:
    return str(uuid.uuid4())


__all__ = ["NODE", "FakeNode", "fake_node", "new_uid", "os"]
