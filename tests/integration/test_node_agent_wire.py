"""The node agent's writes of its custom resources, byte for byte: what it sends to the API for
the NodeCPUTopology (create, spec, status), the PodCPUBinding of a pinned container (create,
patch, status) and the NodeResourceTopology, on a first start and on a restart that finds them
all there. Uids, resourceVersions and the machine's topology are replaced by placeholders; the
clock is fixed."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from corepin.agent.node.agent import NodeAgent
from corepin.agent.node.enforce import ContainerCgroups
from corepin.kube.client import KubeClient, Obj
from corepin.kube.resources import CRDS
from corepin.testing import machines as synthetic
from support.node_harness import FakeNode, fake_node
from support.paths import PEER_FIXTURES
from support.pods import container

NRT_CRD = PEER_FIXTURES / "noderesourcetopology" / "crd.yaml"
#: 2026-01-15T08:00:00Z
NOW = 1768464000.0
WATCHED = ("/apis/corepin.io/", "/apis/topology.node.k8s.io/")


class RecordingClient(KubeClient):
    """A client that keeps every write of a custom resource as the bytes it sends."""

    def __init__(self, inner: KubeClient) -> None:
        super().__init__(inner.transport, field_manager=inner.field_manager)
        self.sent: list[tuple[str, str, bytes]] = []
        self._guard = threading.Lock()

    def _call(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        raw: bytes | None = None,
        **rest: Any,
    ) -> Obj:
        if method in ("POST", "PUT", "PATCH") and path.startswith(WATCHED):
            data = raw if raw is not None else json.dumps(body).encode()
            with self._guard:
                self.sent.append((method, path, data))
        return super()._call(method, path, body=body, raw=raw, **rest)

    def take(self, replace: Mapping[str, str]) -> set[str]:
        """The distinct writes so far (`METHOD path body`), placeholders put in; forgets them."""
        with self._guard:
            sent, self.sent = self.sent, []
        out = set()
        for method, path, data in sent:
            line = f"{method} {path} {data.decode()}"
            for text, name in replace.items():
                line = line.replace(text, name)
            out.add(re.sub(r'"resourceVersion": "\d+"', '"resourceVersion": "<rv>"', line))
        return out


@pytest.fixture
def node(kube: KubeClient, fake_api: Any, tmp_path: Path) -> Iterator[FakeNode]:
    with fake_node(kube, synthetic.named("dual_socket_ht"), tmp_path) as n:
        n.api = fake_api
        yield n


def _agent(node: FakeNode, client: RecordingClient) -> NodeAgent:
    cgroups = ContainerCgroups(node.driver, node.topology)
    agent = NodeAgent(node.settings(), client, node.topology, cgroups, clock=lambda: NOW)
    node.agents.append(agent)
    agent.start(sync_timeout=30)
    assert agent.wait_idle(20)
    return agent


@pytest.mark.skipif(not NRT_CRD.exists(), reason="the NodeResourceTopology CRD fixture is absent")
def test_the_custom_resources_the_agent_writes_are_unchanged_to_the_byte(node: FakeNode) -> None:
    node.client.create(CRDS, yaml.safe_load(NRT_CRD.read_text()))
    client = RecordingClient(node.client)
    names = {
        json.dumps(node.topology.to_json()): "<topology>",
        str(node.node["metadata"]["uid"]): "<node-uid>",
    }
    first = _agent(node, client)
    first.publisher.later(("topology",), None)  # (a second time at least, as a heartbeat does)
    assert first.wait_idle(20)
    started = client.take(names)
    pod = node.pod(
        "db",
        container("app", "2", memory="64Mi"),
        annotations={"corepin.io/cpu-policy": "exclusive"},
    )
    names[str(pod["metadata"]["uid"])] = "<pod-uid>"
    node.run(pod)
    assert first.wait_idle(20)
    pinned = client.take(names)
    first.stop()
    node.agents.remove(first)
    second = _agent(node, client)
    second._enqueue(("resync",))
    assert second.wait_idle(20)
    restarted = client.take(names)
    assert (sorted(started), sorted(pinned), sorted(restarted)) == (
        STARTED,
        PINNED,
        RESTARTED,
    )


STARTED: list[str] = [
    'PATCH /apis/corepin.io/v1alpha1/nodecputopologies/node-a/status {"status": '
    '{"sharedPool": "0-31", "reservedCPUs": "", "isolatedCPUs": "", "free": "0-31", '
    '"freeByNUMA": {"0": "0-7,16-23", "1": "8-15,24-31"}, "freeByL3": {"0": "0-7,16-23", '
    '"1": "8-15,24-31"}, "allocations": [], "heartbeatTime": "2026-01-15T08:00:00Z", '
    '"conditions": [{"type": "Ready", "status": "True", "reason": "AgentRunning", '
    '"message": "the node agent publishes this node\'s CPUs", "lastTransitionTime": '
    '"2026-01-15T08:00:00Z"}]}}',
    'POST /apis/corepin.io/v1alpha1/nodecputopologies {"apiVersion": "corepin.io/v1alpha1", '
    '"kind": "NodeCPUTopology", "metadata": {"name": "node-a", "labels": '
    '{"app.kubernetes.io/managed-by": "corepin-agent"}, "ownerReferences": [{"apiVersion": '
    '"v1", "kind": "Node", "name": "node-a", "uid": "<node-uid>"}]}, "spec": {"topology": '
    '<topology>, "policy": "topology-aware", "options": {}, "reservedCPUs": ""}}',
    'POST /apis/topology.node.k8s.io/v1alpha2/noderesourcetopologies {"apiVersion": '
    '"topology.node.k8s.io/v1alpha2", "kind": "NodeResourceTopology", "metadata": {"name": '
    '"node-a"}, "topologyPolicies": ["None"], "attributes": [{"name": '
    '"topologyManagerPolicy", "value": "none"}, {"name": "topologyManagerScope", "value": '
    '"container"}], "zones": [{"name": "node-0", "type": "Node", "resources": [{"name": '
    '"cpu", "capacity": "16", "allocatable": "16", "available": "16"}], "costs": [{"name": '
    '"node-0", "value": 10}, {"name": "node-1", "value": 21}]}, {"name": "node-1", "type": '
    '"Node", "resources": [{"name": "cpu", "capacity": "16", "allocatable": "16", '
    '"available": "16"}], "costs": [{"name": "node-0", "value": 21}, {"name": "node-1", '
    '"value": 10}]}]}',
    'PUT /apis/topology.node.k8s.io/v1alpha2/noderesourcetopologies/node-a {"apiVersion": '
    '"topology.node.k8s.io/v1alpha2", "kind": "NodeResourceTopology", "metadata": {"name": '
    '"node-a", "resourceVersion": "<rv>"}, "topologyPolicies": ["None"], "attributes": '
    '[{"name": "topologyManagerPolicy", "value": "none"}, {"name": "topologyManagerScope", '
    '"value": "container"}], "zones": [{"name": "node-0", "type": "Node", "resources": '
    '[{"name": "cpu", "capacity": "16", "allocatable": "16", "available": "16"}], "costs": '
    '[{"name": "node-0", "value": 10}, {"name": "node-1", "value": 21}]}, {"name": '
    '"node-1", "type": "Node", "resources": [{"name": "cpu", "capacity": "16", '
    '"allocatable": "16", "available": "16"}], "costs": [{"name": "node-0", "value": 21}, '
    '{"name": "node-1", "value": 10}]}]}',
]
PINNED: list[str] = [
    "PATCH /apis/corepin.io/v1alpha1/namespaces/default/podcpubindings/db-app/status "
    '{"status": {"nodeName": "node-a", "phase": "Applied", "cpus": "0,16", "mems": "0", '
    '"message": "exclusive CPUs of container \'app\'", "conditions": [{"type": "Ready", '
    '"status": "True", "reason": "Applied", "message": "exclusive CPUs of container '
    '\'app\'", "lastTransitionTime": "2026-01-15T08:00:00Z"}], "qosClass": "LSE"}}',
    'PATCH /apis/corepin.io/v1alpha1/nodecputopologies/node-a/status {"status": '
    '{"sharedPool": "1-15,17-31", "reservedCPUs": "", "isolatedCPUs": "", "free": '
    '"1-15,17-31", "freeByNUMA": {"0": "1-7,17-23", "1": "8-15,24-31"}, "freeByL3": {"0": '
    '"1-7,17-23", "1": "8-15,24-31"}, "allocations": [{"namespace": "default", "pod": "db", '
    '"podUID": "<pod-uid>", "container": "app", "cpus": "0,16", "mems": "0", "policy": '
    '"exclusive", "level": "cpu", "qosClass": "LSE"}], "heartbeatTime": '
    '"2026-01-15T08:00:00Z", "conditions": '
    '[{"type": "Ready", "status": "True", "reason": "AgentRunning", "message": "the node '
    'agent publishes this node\'s CPUs", "lastTransitionTime": "2026-01-15T08:00:00Z"}]}}',
    'POST /apis/corepin.io/v1alpha1/namespaces/default/podcpubindings {"apiVersion": '
    '"corepin.io/v1alpha1", "kind": "PodCPUBinding", "metadata": {"name": "db-app", '
    '"namespace": "default", "labels": {"app.kubernetes.io/managed-by": "corepin-agent", '
    '"corepin.io/node": "node-a", "corepin.io/pod-uid": "<pod-uid>", '
    '"corepin.io/container": "app"}, "annotations": {"corepin.io/cpu-policy": "exclusive"}, '
    '"ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "db", "uid": '
    '"<pod-uid>", "controller": false, "blockOwnerDeletion": false}]}, "spec": {"podName": '
    '"db", "exclusivenessLevel": "CPU", "containers": [{"name": "app", "cpuSet": [{"cpuID": '
    '0}, {"cpuID": 16}]}]}}',
    'POST /apis/topology.node.k8s.io/v1alpha2/noderesourcetopologies {"apiVersion": '
    '"topology.node.k8s.io/v1alpha2", "kind": "NodeResourceTopology", "metadata": {"name": '
    '"node-a"}, "topologyPolicies": ["None"], "attributes": [{"name": '
    '"topologyManagerPolicy", "value": "none"}, {"name": "topologyManagerScope", "value": '
    '"container"}], "zones": [{"name": "node-0", "type": "Node", "resources": [{"name": '
    '"cpu", "capacity": "16", "allocatable": "16", "available": "14"}], "costs": [{"name": '
    '"node-0", "value": 10}, {"name": "node-1", "value": 21}]}, {"name": "node-1", "type": '
    '"Node", "resources": [{"name": "cpu", "capacity": "16", "allocatable": "16", '
    '"available": "16"}], "costs": [{"name": "node-0", "value": 21}, {"name": "node-1", '
    '"value": 10}]}]}',
    'PUT /apis/topology.node.k8s.io/v1alpha2/noderesourcetopologies/node-a {"apiVersion": '
    '"topology.node.k8s.io/v1alpha2", "kind": "NodeResourceTopology", "metadata": {"name": '
    '"node-a", "resourceVersion": "<rv>"}, "topologyPolicies": ["None"], "attributes": '
    '[{"name": "topologyManagerPolicy", "value": "none"}, {"name": "topologyManagerScope", '
    '"value": "container"}], "zones": [{"name": "node-0", "type": "Node", "resources": '
    '[{"name": "cpu", "capacity": "16", "allocatable": "16", "available": "14"}], "costs": '
    '[{"name": "node-0", "value": 10}, {"name": "node-1", "value": 21}]}, {"name": '
    '"node-1", "type": "Node", "resources": [{"name": "cpu", "capacity": "16", '
    '"allocatable": "16", "available": "16"}], "costs": [{"name": "node-0", "value": 21}, '
    '{"name": "node-1", "value": 10}]}]}',
]
RESTARTED: list[str] = [
    'PATCH /apis/corepin.io/v1alpha1/namespaces/default/podcpubindings/db-app {"metadata": '
    '{"labels": {"app.kubernetes.io/managed-by": "corepin-agent", "corepin.io/node": '
    '"node-a", "corepin.io/pod-uid": "<pod-uid>", "corepin.io/container": "app"}, '
    '"annotations": {"corepin.io/cpu-policy": "exclusive"}}, "spec": {"podName": "db", '
    '"exclusivenessLevel": "CPU", "containers": [{"name": "app", "cpuSet": [{"cpuID": 0}, '
    '{"cpuID": 16}]}]}}',
    "PATCH /apis/corepin.io/v1alpha1/namespaces/default/podcpubindings/db-app/status "
    '{"status": {"nodeName": "node-a", "phase": "Applied", "cpus": "0,16", "mems": "0", '
    '"message": "exclusive CPUs of container \'app\'", "conditions": [{"type": "Ready", '
    '"status": "True", "reason": "Applied", "message": "exclusive CPUs of container '
    '\'app\'", "lastTransitionTime": "2026-01-15T08:00:00Z"}], "qosClass": "LSE"}}',
    'PATCH /apis/corepin.io/v1alpha1/nodecputopologies/node-a [{"op": "replace", "path": '
    '"/spec", "value": {"topology": <topology>, "policy": "topology-aware", "options": {}, '
    '"reservedCPUs": ""}}]',
    'PATCH /apis/corepin.io/v1alpha1/nodecputopologies/node-a/status {"status": '
    '{"sharedPool": "1-15,17-31", "reservedCPUs": "", "isolatedCPUs": "", "free": '
    '"1-15,17-31", "freeByNUMA": {"0": "1-7,17-23", "1": "8-15,24-31"}, "freeByL3": {"0": '
    '"1-7,17-23", "1": "8-15,24-31"}, "allocations": [{"namespace": "default", "pod": "db", '
    '"podUID": "<pod-uid>", "container": "app", "cpus": "0,16", "mems": "0", "policy": '
    '"exclusive", "level": "cpu", "qosClass": "LSE"}], "heartbeatTime": '
    '"2026-01-15T08:00:00Z", "conditions": '
    '[{"type": "Ready", "status": "True", "reason": "AgentRunning", "message": "the node '
    'agent publishes this node\'s CPUs", "lastTransitionTime": "2026-01-15T08:00:00Z"}]}}',
    'POST /apis/corepin.io/v1alpha1/namespaces/default/podcpubindings {"apiVersion": '
    '"corepin.io/v1alpha1", "kind": "PodCPUBinding", "metadata": {"name": "db-app", '
    '"namespace": "default", "labels": {"app.kubernetes.io/managed-by": "corepin-agent", '
    '"corepin.io/node": "node-a", "corepin.io/pod-uid": "<pod-uid>", '
    '"corepin.io/container": "app"}, "annotations": {"corepin.io/cpu-policy": "exclusive"}, '
    '"ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "db", "uid": '
    '"<pod-uid>", "controller": false, "blockOwnerDeletion": false}]}, "spec": {"podName": '
    '"db", "exclusivenessLevel": "CPU", "containers": [{"name": "app", "cpuSet": [{"cpuID": '
    '0}, {"cpuID": 16}]}]}}',
    'POST /apis/corepin.io/v1alpha1/nodecputopologies {"apiVersion": "corepin.io/v1alpha1", '
    '"kind": "NodeCPUTopology", "metadata": {"name": "node-a", "labels": '
    '{"app.kubernetes.io/managed-by": "corepin-agent"}, "ownerReferences": [{"apiVersion": '
    '"v1", "kind": "Node", "name": "node-a", "uid": "<node-uid>"}]}, "spec": {"topology": '
    '<topology>, "policy": "topology-aware", "options": {}, "reservedCPUs": ""}}',
    'POST /apis/topology.node.k8s.io/v1alpha2/noderesourcetopologies {"apiVersion": '
    '"topology.node.k8s.io/v1alpha2", "kind": "NodeResourceTopology", "metadata": {"name": '
    '"node-a"}, "topologyPolicies": ["None"], "attributes": [{"name": '
    '"topologyManagerPolicy", "value": "none"}, {"name": "topologyManagerScope", "value": '
    '"container"}], "zones": [{"name": "node-0", "type": "Node", "resources": [{"name": '
    '"cpu", "capacity": "16", "allocatable": "16", "available": "14"}], "costs": [{"name": '
    '"node-0", "value": 10}, {"name": "node-1", "value": 21}]}, {"name": "node-1", "type": '
    '"Node", "resources": [{"name": "cpu", "capacity": "16", "allocatable": "16", '
    '"available": "16"}], "costs": [{"name": "node-0", "value": 21}, {"name": "node-1", '
    '"value": 10}]}]}',
    'PUT /apis/topology.node.k8s.io/v1alpha2/noderesourcetopologies/node-a {"apiVersion": '
    '"topology.node.k8s.io/v1alpha2", "kind": "NodeResourceTopology", "metadata": {"name": '
    '"node-a", "resourceVersion": "<rv>"}, "topologyPolicies": ["None"], "attributes": '
    '[{"name": "topologyManagerPolicy", "value": "none"}, {"name": "topologyManagerScope", '
    '"value": "container"}], "zones": [{"name": "node-0", "type": "Node", "resources": '
    '[{"name": "cpu", "capacity": "16", "allocatable": "16", "available": "14"}], "costs": '
    '[{"name": "node-0", "value": 10}, {"name": "node-1", "value": 21}]}, {"name": '
    '"node-1", "type": "Node", "resources": [{"name": "cpu", "capacity": "16", '
    '"allocatable": "16", "available": "16"}], "costs": [{"name": "node-0", "value": 21}, '
    '{"name": "node-1", "value": 10}]}]}',
]
