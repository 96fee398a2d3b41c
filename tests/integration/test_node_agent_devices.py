"""The node agent's CPUs near a container's devices: the agent against the fake API server with
the tests' own kubelet PodResources server on a real unix socket (a GPU per NUMA node of a
2-socket machine), and without any PodResources socket at all."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from corepin.core.cpuset import CPUSet
from corepin.kube.client import KubeClient
from corepin.kube.resources import EVENTS, NCPT
from corepin.testing import machines as synthetic
from support.helpers import wait_for
from support.node_harness import NODE, FakeNode, fake_node
from support.podresources_server import Devices, PodResourcesServer
from support.pods import EXCLUSIVE, container

GPU = "nvidia.com/gpu"


@pytest.fixture
def node(kube: KubeClient, fake_api: Any, tmp_path: Path) -> Iterator[FakeNode]:
    with fake_node(kube, synthetic.named("dual_socket_ht"), tmp_path) as n:
        n.api = fake_api
        yield n


@pytest.fixture
def kubelet(tmp_path: Path) -> Iterator[PodResourcesServer]:
    with PodResourcesServer(tmp_path / "pod-resources.sock") as server:
        server.allocatable = [Devices(GPU, ["gpu0"], [0]), Devices(GPU, ["gpu1"], [1])]
        yield server


def gpu_pod(node: FakeNode, name: str, cpus: str, **annotations: str) -> dict[str, Any]:
    return node.pod(
        name,
        container("main", cpus, memory="64Mi", limits={GPU: "1"}),
        annotations={**EXCLUSIVE, **annotations},
    )


def settle(node: FakeNode) -> None:
    for agent in node.agents:
        assert agent.wait_idle(20), "the agent did not settle"


def pinned(node: FakeNode, pod: dict[str, Any]) -> CPUSet:
    wait_for(lambda: node.annotation(pod) is not None, what="the corepin.io/cpus annotation")
    settle(node)
    return node.cpus(pod, "main")


def reasons(node: FakeNode, pod: dict[str, Any]) -> list[str]:
    items = node.client.list(EVENTS, pod["metadata"]["namespace"])["items"]
    return [
        e["reason"] for e in items if e["involvedObject"].get("name") == pod["metadata"]["name"]
    ]


def test_a_pod_with_a_gpu_on_numa_node_1_gets_cpus_of_node_1(
    node: FakeNode, kubelet: PodResourcesServer
) -> None:
    node.agent(pod_resources_socket=kubelet.socket)
    pod = gpu_pod(node, "train", "4")
    kubelet.assign("default", "train", "main", Devices(GPU, ["gpu1"], [1]))
    node.run(pod)
    cpus = pinned(node, pod)
    assert len(cpus) == 4
    assert cpus <= node.topology.cpus_in_numa_nodes(1), f"{cpus} are not on the GPU's node 1"
    assert node.mems(pod, "main") == CPUSet.of(1)
    assert kubelet.calls["List"] >= 1


def test_without_alignment_the_same_pod_lands_where_the_policy_likes(
    node: FakeNode, kubelet: PodResourcesServer
) -> None:
    # (the control of the test above: the policy's own choice is node 0)
    node.agent(pod_resources_socket=kubelet.socket)
    pod = gpu_pod(node, "train", "4", **{"corepin.io/device-alignment": "none"})
    kubelet.assign("default", "train", "main", Devices(GPU, ["gpu1"], [1]))
    node.run(pod)
    assert pinned(node, pod) <= node.topology.cpus_in_numa_nodes(0)


def test_required_alignment_that_cannot_be_had_runs_on_the_shared_pool(
    node: FakeNode, kubelet: PodResourcesServer
) -> None:
    node.agent(pod_resources_socket=kubelet.socket)
    # node 1 has 16 CPUs: 17 cannot be had there
    strict = gpu_pod(node, "strict", "17", **{"corepin.io/device-alignment": "required"})
    kubelet.assign("default", "strict", "main", Devices(GPU, ["gpu1"], [1]))
    node.run(strict)
    wait_for(lambda: "CPUPinFailed" in reasons(node, strict), what="CPUPinFailed")
    settle(node)
    assert node.annotation(strict) in (None, "{}")
    # preferred: the same request spans both nodes rather than fail
    loose = gpu_pod(node, "loose", "17")
    kubelet.assign("default", "loose", "main", Devices(GPU, ["gpu0"], [0]))
    node.run(loose)
    cpus = pinned(node, loose)
    assert len(cpus) == 17


def test_the_node_topology_lists_devices_per_numa_node(
    node: FakeNode, kubelet: PodResourcesServer
) -> None:
    node.agent(pod_resources_socket=kubelet.socket)
    pod = gpu_pod(node, "train", "2")
    kubelet.from_kubelet([node.get(pod)])  # the first free GPU: gpu0, node 0
    node.run(pod)
    pinned(node, pod)

    def devices() -> object:
        return (node.client.get(NCPT, NODE).get("status") or {}).get("devices")

    wait_for(lambda: devices() is not None, what="status.devices")
    assert devices() == [
        {"resource": GPU, "numaNode": 0, "count": 1, "allocatable": 0},
        {"resource": GPU, "numaNode": 1, "count": 1, "allocatable": 1},
    ]


def test_without_the_socket_the_agent_pins_as_before_and_says_so_once(
    node: FakeNode, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="corepin.agent.node")
    node.agent(pod_resources_socket=str(tmp_path / "no-kubelet.sock"))
    first = gpu_pod(node, "one", "2")
    node.run(first)
    assert len(pinned(node, first)) == 2
    second = gpu_pod(node, "two", "2")
    node.run(second)
    assert len(pinned(node, second)) == 2
    said = [r for r in caplog.records if "event=pod_resources_unavailable" in r.getMessage()]
    assert len(said) == 1, [r.getMessage() for r in said]
    assert "no-kubelet.sock" in said[0].getMessage()
    assert "devices" not in (node.client.get(NCPT, NODE).get("status") or {})
