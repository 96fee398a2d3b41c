"""Placement prefers nodes where a pod's devices and its CPUs can share a NUMA node: the device
score of `corepin.placement.score`, read from `NodeCPUTopology.status.devices` as the agent
publishes it, and what a pod asks for (`corepin.kube.podplan.device_requests`). A bonus only:
a node without the devices still passes."""

from __future__ import annotations

from typing import Any

import pytest

from corepin.kube.models import NodeCPUTopology
from corepin.kube.podplan import device_requests
from corepin.placement.cluster import Cluster
from corepin.placement.fit import fit
from corepin.placement.node import NodeView, node_view
from corepin.placement.request import pod_request
from corepin.placement.score import BALANCED, MAXIMUM_UTILIZATION, device_alignment, score
from corepin.state.model import HostState
from corepin.testing import machines as synthetic
from support.placement_helpers import EPOCH, published, run_pods
from support.pods import EXCLUSIVE, container, pod

DUAL = synthetic.named("dual_socket_ht")  # 32 CPUs, NUMA node 0: 0-7,16-23; node 1: 8-15,24-31
GPU = "nvidia.com/gpu"


def gpu_pod(name: str = "p", cpus: str = "4", gpus: str = "1", **annotations: str) -> Any:
    return pod(
        name,
        container("app", cpus, cpus, limits={GPU: gpus}),
        annotations={**EXCLUSIVE, **annotations},
    )


def node_with(
    name: str, devices: list[dict[str, Any]] | None, busy: list[Any] | None = None
) -> NodeView:
    state = run_pods(DUAL, busy or []) if busy else HostState.new(DUAL)
    body = published(state, DUAL, name=name).to_dict()
    if devices is not None:
        body["status"]["devices"] = devices
    return node_view(NodeCPUTopology.from_dict(body))


def gpus(node: int, count: int = 1, allocatable: int | None = None) -> dict[str, Any]:
    free = count if allocatable is None else allocatable
    return {"resource": GPU, "numaNode": node, "count": count, "allocatable": free}


# a pod of 14 exclusive CPUs fills NUMA node 0 (16 CPUs) up to 2
NODE0_FULL = [pod("big", container("app", "14", "14"), annotations=EXCLUSIVE, running=True)]


def device_score(view: NodeView, p: Any) -> float | None:
    return device_alignment(view, pod_request(p), view.pools)


# ---------------------------------------------------------------------- what a pod asks for
DEVICE_CASES = [
    ("one GPU in one container", [container("a", "2", limits={GPU: "1"})], {GPU: 1}),
    (
        "devices of two containers are summed",
        [container("a", limits={GPU: "1"}), container("b", limits={GPU: 2})],
        {GPU: 2 + 1},
    ),
    (
        "cpu, memory, hugepages and kubernetes.io resources are not devices",
        [
            container(
                "a",
                "2",
                memory="1Gi",
                limits={"hugepages-2Mi": "64Mi", "example.kubernetes.io/x": "1"},
            )
        ],
        {},
    ),
    (
        "several resources are each counted",
        [container("a", limits={GPU: "1", "example.com/nic": "2"})],
        {"example.com/nic": 2, GPU: 1},
    ),
]


@pytest.mark.parametrize(
    ("containers", "wanted"),
    [c[1:] for c in DEVICE_CASES],
    ids=[c[0] for c in DEVICE_CASES],
)
def test_device_requests(containers: list[Any], wanted: dict[str, int]) -> None:
    assert device_requests(pod("p", *containers)) == wanted


def test_the_request_carries_devices_and_alignment() -> None:
    request = pod_request(gpu_pod(**{"corepin.io/device-alignment": "required"}))
    assert request.devices == ((GPU, 1),)
    assert request.device_key == (((GPU, 1),), "required")
    assert pod_request(gpu_pod(**{"corepin.io/device-alignment": "none"})).device_key == (
        (),
        "none",
    )


# ---------------------------------------------------------------------- the device score
SCORE_CASES = [
    ("the GPU and 4 free CPUs on NUMA node 1", [gpus(0), gpus(1)], None, 100.0),
    ("the GPU only on node 0, whose CPUs are held", [gpus(0)], NODE0_FULL, 50.0),
    ("the GPU on node 0 held, on node 1 free", [gpus(0, 1, 0), gpus(1)], NODE0_FULL, 100.0),
    ("every GPU held by other pods", [gpus(0, 1, 0), gpus(1, 1, 0)], None, 0.0),
    ("the node published no devices", None, None, 0.0),
    (
        "other devices only",
        [{"resource": "x.io/y", "numaNode": 0, "count": 1, "allocatable": 1}],
        None,
        0.0,
    ),
    ("devices of no known NUMA node", [{"resource": GPU, "count": 2, "allocatable": 2}], None, 0.0),
]


@pytest.mark.parametrize(
    ("devices", "busy", "expected"),
    [c[1:] for c in SCORE_CASES],
    ids=[c[0] for c in SCORE_CASES],
)
def test_device_score(devices: Any, busy: Any, expected: float) -> None:
    assert device_score(node_with("n", devices, busy), gpu_pod()) == expected


def test_two_gpus_must_be_on_one_numa_node() -> None:
    split = node_with("n", [gpus(0), gpus(1)])
    together = node_with("n", [gpus(1, 2)])
    two = gpu_pod(gpus="2")
    assert device_score(split, two) == 0.0
    assert device_score(together, two) == 100.0


def test_pods_without_devices_or_alignment_are_scored_as_before() -> None:
    aligned = node_with("n", [gpus(1)])
    bare = node_with("n", None)
    plain = pod("p", container("app", "4", "4"), annotations=EXCLUSIVE)
    unaligned = gpu_pod(**{"corepin.io/device-alignment": "none"})
    for p in (plain, unaligned):
        request = pod_request(p)
        assert device_alignment(aligned, request, aligned.pools) is None
        for profile in (MAXIMUM_UTILIZATION, BALANCED):
            assert score(aligned, request, fit(aligned, request), profile) == score(
                bare, request, fit(bare, request), profile
            )


@pytest.mark.parametrize("profile", [MAXIMUM_UTILIZATION, BALANCED])
def test_the_aligned_node_scores_highest_and_no_node_is_refused(profile: str) -> None:
    nodes = [
        node_with("a-no-devices", None),
        node_with("b-gpu-on-a-full-node", [gpus(0)], NODE0_FULL),
        node_with("c-gpu-near-free-cpus", [gpus(1)]),
    ]
    cluster = Cluster(profile=profile)
    for view in nodes:
        cluster.set_node(view)
    request = pod_request(gpu_pod())
    answers = cluster.evaluate(request, [v.name for v in nodes], EPOCH)
    assert all(a.ok for a in answers), "a device bonus never refuses a node"
    by_name = {a.node: a.score for a in answers}
    assert by_name["c-gpu-near-free-cpus"] > by_name["b-gpu-on-a-full-node"]
    assert by_name["b-gpu-on-a-full-node"] > by_name["a-no-devices"]
    best = cluster.best(answers)
    assert best is not None and best.node == "c-gpu-near-free-cpus"
    # the same pod without devices: the cached answers of the device pod are not reused
    plain = pod_request(pod("p", container("app", "4", "4"), annotations=EXCLUSIVE))
    again = {a.node: a.score for a in cluster.evaluate(plain, [v.name for v in nodes], EPOCH)}
    assert again["c-gpu-near-free-cpus"] != by_name["c-gpu-near-free-cpus"]
