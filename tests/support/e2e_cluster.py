"""The cluster of the end-to-end placement tests (`test_scheduler_e2e.py`,
`test_placement_e2e.py`): three nodes of different shapes on the fake API server, each a
`FakeNode` with a real node agent, a kubelet stand-in that starts whatever is bound to them,
and the 50 pods of mixed policies and levels they place."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from corepin.kube.client import KubeClient
from corepin.kube.resources import PODS
from corepin.testing import machines as synthetic
from support.node_harness import FakeNode
from support.pods import container, corepin_annotations, pod

NAME = "corepin-scheduler"
TOPOLOGIES = {
    "node-a": synthetic.named("single_socket_ht"),  # 16 CPUs
    "node-b": synthetic.named("dual_socket_ht"),  # 32 CPUs, 2 sockets
    "node-c": synthetic.named("multi_l3_per_numa"),  # 128 CPUs, 2 NUMA nodes, 16 L3s
}


class Kubelets:
    """Starts the containers of every pod bound to one of the nodes (in the order of binding),
    as the nodes' kubelets would."""

    def __init__(self, kube: KubeClient, nodes: dict[str, FakeNode]) -> None:
        self.kube = kube
        self.nodes = nodes
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self.started: set[str] = set()

    def __enter__(self) -> Kubelets:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def _loop(self) -> None:
        while not self._stop.wait(0.05):
            items = self.kube.list(PODS, "default")["items"]
            bound = [
                p
                for p in items
                if p["spec"].get("nodeName") in self.nodes
                and p["metadata"]["uid"] not in self.started
            ]
            bound.sort(key=lambda p: int(p["metadata"]["resourceVersion"]))
            for p in bound:
                with contextlib.suppress(Exception):
                    self.nodes[p["spec"]["nodeName"]].run(p)
                    self.started.add(p["metadata"]["uid"])


@contextlib.contextmanager
def cluster(kube: KubeClient, tmp: Path) -> Iterator[dict[str, FakeNode]]:
    nodes: dict[str, FakeNode] = {}
    try:
        for name, topology in TOPOLOGIES.items():
            nodes[name] = FakeNode(kube, topology, tmp / name, name=name)
            nodes[name].agent()
        yield nodes
    finally:
        for node in nodes.values():
            node.close()


def workload(i: int, scheduler: str | None = NAME) -> tuple[dict[str, Any], bool]:
    """Pod i of the 50 (name, containers, annotations) and whether some node can hold it;
    `scheduler` is its spec.schedulerName (None: left out, kube-scheduler's pod)."""
    kinds = [
        ("exclusive", "cpu", [1]),
        ("exclusive", "core", [1]),
        ("share", "cpu", [1]),
        ("none", "cpu", [1]),
        ("exclusive", "cpu", [2]),
        ("share", "core", [1]),
        ("exclusive", "cpu", [1, 1]),
        ("none", "cpu", [2]),
        ("exclusive", "core", [2, 1]),
        ("share", "cpu", [1]),
    ]
    policy, level, counts = kinds[i % len(kinds)]
    fits = True
    if i == 5:  # a whole NUMA node
        policy, level, counts = "exclusive", "numa", [2]
    if i == 15:  # a whole L3 cache
        policy, level, counts = "exclusive", "l3", [2]
    if i in (13, 27, 41):  # bigger than any node
        policy, level, counts, fits = "exclusive", "cpu", [200], False
    if i == 33:  # a socket of 70 CPUs: no node has one
        policy, level, counts, fits = "exclusive", "socket", [70], False
    annotations = corepin_annotations(
        policy, level=level, workload="memory-bound" if i % 7 == 3 else None
    )
    containers = [container(f"c{j}", str(n), memory="64Mi") for j, n in enumerate(counts)]
    body = pod(f"pod-{i:02d}", *containers, annotations=annotations, scheduler=scheduler)
    return body, fits
