"""Random sequences of pod, binding and topology changes against a running controller: once it
settles, the bindings left match a simple oracle written here from the rules (not from the
controller's code):

- no binding is left whose owner pod is gone or is another uid now;
- a binding whose pod is missing is Failed (PodNotFound); naming more CPUs than the pod's limit
  (1): Failed (IneligibleContainer); not scheduled, or on a node without
  a topology: Pending; naming CPUs the node lacks: Failed (UnknownCPUs); reserved ones: Failed
  (ReservedCPUs);
- of the others, on each node: a pod has at most one Validated binding; no two Validated ones
  of different pods (nor a Validated one and the agent's binding) withhold a common CPU; each
  Failed one is a Conflict with a held binding of another pod, or a duplicate of its pod's
  Validated one; none is left Pending.
"""

from __future__ import annotations

import time
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from corepin.agent.cluster.controller.controller import BINDINGS, TOPOLOGIES
from corepin.core.errors import ApiError
from corepin.kube.client import KubeClient
from corepin.kube.config import load_config
from corepin.kube.resources import PODS
from corepin.testing.fakeapi import FakeApiServer
from corepin.topology.model import Topology
from support import strategies
from support.budget import examples
from support.controller_helpers import (
    allocation,
    binding,
    create_binding,
    create_pod,
    ncpt,
    publish,
    republish,
    running,
    settle,
)
from support.kube_helpers import install_crds
from support.pods import container

Obj = dict[str, Any]

# worker-1: 8 CPUs, siblings n and n+4, NUMA node 0 = 0-1,4-5 and node 1 = 2-3,6-7
SMALL = Topology.from_json(
    {
        "cpus": [
            {"cpu": c, "online": True, "socket": 0, "die": 0, "numa": 0 if c % 4 < 2 else 1,
             "l3": 0 if c % 4 < 2 else 1, "l2": c % 4, "core": c % 4, "isolated": False,
             "core_type": None}
            for c in range(8)
        ],
        "numa_nodes": [
            {"id": 0, "cpus": "0-1,4-5", "distances": {"0": 10, "1": 12}},
            {"id": 1, "cpus": "2-3,6-7", "distances": {"0": 12, "1": 10}},
        ],
    }
)  # fmt: skip
NUMA = {0: {0, 1, 4, 5}, 1: {2, 3, 6, 7}}
AGENT_CPUS = {3}  # the agent's own binding on worker-1 holds core 3 (CPUs 3 and 7)
PODS_N, BINDINGS_N = 3, 4


def withheld(level: str, cpus: set[int]) -> set[int]:
    out = set(cpus)
    for c in cpus:
        if level == "Core":
            out |= {c % 4, c % 4 + 4}
        elif level == "NUMA":
            out |= next(v for v in NUMA.values() if c in v)
    return out


pod_names = st.integers(0, PODS_N - 1).map(lambda i: f"p{i}")
binding_ops = st.tuples(
    st.just("binding"),
    st.integers(0, BINDINGS_N - 1).map(lambda i: f"b{i}"),
    pod_names,
    strategies.cpu_id_sets(st.integers(0, 8), min_size=1, max_size=2),  # CPU 8: not on the node
    st.sampled_from(["CPU", "Core", "NUMA"]),
)
ops = st.one_of(
    binding_ops,
    st.tuples(st.just("pod"), pod_names, st.sampled_from(["worker-1", "worker-2", None])),
    st.tuples(st.just("delete-pod"), pod_names),
    st.tuples(st.just("schedule"), pod_names),
    st.tuples(st.just("delete-binding"), st.integers(0, BINDINGS_N - 1).map(lambda i: f"b{i}")),
    st.tuples(st.just("reserve"), st.sampled_from(["", "0", "6"])),
    st.tuples(st.just("publish-worker-2")),
)


def apply(kube: KubeClient, op: tuple[Any, ...]) -> None:
    try:
        if op[0] == "pod":
            create_pod(kube, op[1], container("app", "1", "1"), node=op[2])
        elif op[0] == "delete-pod":
            kube.delete(PODS, op[1], "default")
        elif op[0] == "schedule":
            kube.bind("default", op[1], "worker-1")
        elif op[0] == "binding":
            cpus = ",".join(str(c) for c in sorted(op[3]))
            create_binding(kube, binding(op[1], op[2], cpus=cpus, level=op[4]))
        elif op[0] == "delete-binding":
            kube.delete(BINDINGS, op[1], "default")
        elif op[0] == "reserve":
            current = kube.get(TOPOLOGIES, "worker-1")
            current["spec"]["reservedCPUs"] = op[1]
            kube.replace(TOPOLOGIES, current)
        elif op[0] == "publish-worker-2":
            publish(kube, ncpt("worker-2", SMALL))
    except ApiError:
        pass  # exists already, not there, already scheduled: a no-op step


def problems(kube: KubeClient) -> list[str]:
    """Where the API's state differs from the oracle (empty when it matches)."""
    pods = {p["metadata"]["name"]: p for p in kube.list(PODS, "default")["items"]}
    topologies = {t["metadata"]["name"]: t for t in kube.list(TOPOLOGIES)["items"]}
    found: list[str] = []
    # node -> rows (binding, pod, withheld CPUs, phase, reason) of bindings passing their own rules
    passing: dict[str, list[tuple[str, str, set[int], str, str]]] = {}
    for b in kube.list(BINDINGS, "default")["items"]:
        name = b["metadata"]["name"]
        if name == "agent":
            continue
        phase = (b.get("status") or {}).get("phase", "")
        reason = next((c["reason"] for c in (b.get("status") or {}).get("conditions", [])), "")
        pod_name = b["spec"]["podName"]
        pod_obj = pods.get(pod_name)
        owners = [o["uid"] for o in b["metadata"].get("ownerReferences", [])]
        if owners and (pod_obj is None or pod_obj["metadata"]["uid"] not in owners):
            found.append(f"{name}: orphan left")
            continue
        cpus = {row["cpuID"] for row in b["spec"]["cpuSet"]}
        node = (pod_obj or {}).get("spec", {}).get("nodeName")
        topology = topologies.get(node or "")
        reserved = set()
        if topology is not None:
            text = topology["spec"].get("reservedCPUs") or ""
            reserved = {int(c) for c in text.split(",") if c}
        expected: tuple[str, str] | None
        if pod_obj is None:
            expected = ("Failed", "PodNotFound")
        elif len(cpus) != 1:  # every pod's one container has a CPU limit of 1
            expected = ("Failed", "IneligibleContainer")
        elif node is None:
            expected = ("Pending", "PodNotScheduled")
        elif topology is None:
            expected = ("Pending", "NodeTopologyMissing")
        elif cpus - set(range(8)):
            expected = ("Failed", "UnknownCPUs")
        elif cpus & reserved:
            expected = ("Failed", "ReservedCPUs")
        else:
            expected = None
            level = b["spec"]["exclusivenessLevel"]
            passing.setdefault(node, []).append(
                (name, pod_name, withheld(level, cpus), phase, reason)
            )
            allowed = {
                ("Validated", "Valid"),
                ("Failed", "Conflict"),
                ("Failed", "DuplicateBinding"),
            }
            if (phase, reason) not in allowed:
                found.append(f"{name}: {phase}/{reason}, expected Validated, Conflict or duplicate")
        if expected is not None and (phase, reason) != expected:
            found.append(f"{name}: {phase}/{reason}, expected {expected[0]}/{expected[1]}")
    for node, rows in passing.items():
        held = [("agent", "agent-pod", withheld("Core", AGENT_CPUS))] if node == "worker-1" else []
        held += [(n, p, w) for n, p, w, phase, _ in rows if phase == "Validated"]
        for i, (a, pa, wa) in enumerate(held):
            for b_name, pb, wb in held[i + 1 :]:
                if pa == pb:
                    found.append(f"{a} and {b_name} are both validated for pod {pa}")
                elif wa & wb:
                    found.append(f"{a} and {b_name} are both held and share {sorted(wa & wb)}")
        for n, p, w, phase, reason in rows:
            if phase != "Failed":
                continue
            if reason == "Conflict" and not any(w & hw for _, hp, hw in held if hp != p):
                found.append(f"{n}: Failed as a Conflict, but nothing held overlaps it")
            if reason == "DuplicateBinding" and not any(hp == p for _, hp, _ in held):
                found.append(f"{n}: Failed as a duplicate, but its pod has no validated binding")
    return found


@settings(max_examples=examples(15))
@given(
    first=st.lists(binding_ops, min_size=2, max_size=4),
    then=st.lists(ops, max_size=6),
)
def test_final_phases_match_the_oracle(
    tmp_path_factory: Any, first: list[tuple[Any, ...]], then: list[tuple[Any, ...]]
) -> None:
    steps = first + then
    with FakeApiServer(bookmark_interval=0.5) as api:
        kubeconfig = api.write_kubeconfig(tmp_path_factory.mktemp("kube") / "kubeconfig")
        kube = KubeClient.from_config(load_config(kubeconfig, env={}), timeout=10)
        try:
            install_crds(kube)
            publish(kube, ncpt("worker-1", SMALL))
            agent_pod = create_pod(kube, "agent-pod", container("a"))
            # the agent's record, confirmed by the allocation its node's status publishes
            republish(
                kube,
                ncpt("worker-1", SMALL,
                     allocations=(allocation(agent_pod, "3", container="a", level="core"),)),
            )  # fmt: skip
            create_binding(
                kube,
                binding(
                    "agent", "agent-pod", containers={"a": "3"}, level="Core", agent=True,
                    owner=agent_pod,
                ),
                status={"phase": "Applied", "cpus": "3", "nodeName": "worker-1"},
            )  # fmt: skip
            for name, node in (("p0", "worker-1"), ("p1", "worker-1"), ("p2", None)):
                apply(kube, ("pod", name, node))
            with running(kube) as controller:
                for step in steps:
                    apply(kube, step)
                deadline = time.monotonic() + 20
                seen = problems(kube)
                while seen and time.monotonic() < deadline:
                    time.sleep(0.1)
                    seen = problems(kube)
                assert seen == [], f"after {steps}: {seen}"
                settle(controller)
                assert problems(kube) == [], f"after {steps}, settled: {problems(kube)}"
        finally:
            kube.close()
