"""CPUReservations as a real node agent honours them: the fake API server (real HTTP), a real
`NodeAgent` and the kubelet's cgroupfs layout in a scratch tree (cpusets written and read back).

- a reservation of this node is held (status `Available`, its CPUs out of `free`, listed in
  the NodeCPUTopology), and dropped when its CPUReservation is deleted;
- a pod it matches gets exactly its CPUs (a one-time reservation is then `Succeeded`, a reusable
  one stays `Available` with the pod among its owners); a pod it does not match never does;
- reserved CPUs that containers hold: a shared container follows the smaller pool, an exclusive
  one is moved live when other CPUs fit it, else it is told and the reservation waits.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from corepin.core.cpuset import CPUSet
from corepin.kube.client import KubeClient
from corepin.kube.resources import CPUR, EVENTS, NCPT, NODES, PCB, PDBS, PODS
from corepin.testing import machines as synthetic
from support.cpur import cpur
from support.helpers import wait_for
from support.node_harness import NODE, FakeNode, fake_node
from support.pods import EXCLUSIVE, container

C = CPUSet.parse


@pytest.fixture
def node(kube: KubeClient, fake_api: Any, tmp_path: Path) -> Iterator[FakeNode]:
    """Node node-a (dual socket, HT, CPUs 0-31); corepin's CRDs served (the harness)."""
    with fake_node(kube, synthetic.named("dual_socket_ht"), tmp_path) as n:
        n.api = fake_api
        yield n


def settle(node: FakeNode) -> None:
    for agent in node.agents:
        assert agent.wait_idle(20), "the agent did not settle"


def status(node: FakeNode, name: str) -> dict[str, Any]:
    return node.client.get(CPUR, name).get("status") or {}


def phase_is(node: FakeNode, name: str, phase: str) -> dict[str, Any]:
    wait_for(lambda: status(node, name).get("phase") == phase, what=f"{name} {phase}")
    return status(node, name)


def topology_status(node: FakeNode) -> dict[str, Any]:
    node.agents[-1].publisher.later(("topology",), None)
    settle(node)
    found: dict[str, Any] = node.client.get(NCPT, NODE)["status"]
    return found


def events(node: FakeNode, pod: dict[str, Any], reason: str) -> list[dict[str, Any]]:
    items = node.client.list(EVENTS, pod["metadata"]["namespace"])["items"]
    return [
        e
        for e in items
        if e["reason"] == reason and e["involvedObject"].get("name") == pod["metadata"]["name"]
    ]


def exclusive_pod(node: FakeNode, name: str, cpus: int, **fields: Any) -> dict[str, Any]:
    pod = node.pod(
        name, container("app", str(cpus), memory="64Mi"), annotations=EXCLUSIVE, **fields
    )
    node.run(pod)
    return pod


# ---------------------------------------------------------------------- held, shown, dropped
def test_a_reservation_is_held_shown_and_dropped_with_its_object(node: FakeNode) -> None:
    node.agent()
    node.client.create(CPUR, cpur("db-cpus", cpus=4, owners=[{"name": "db"}], ttl="1h"))
    st = phase_is(node, "db-cpus", "Available")
    held = C(st["cpus"])
    assert len(held) == 4 and st["nodeName"] == NODE and st.get("expireTime")
    topo = topology_status(node)
    assert not held & C(topo["free"]), "reserved CPUs are not free"
    assert not held & C(topo["sharedPool"]), "nor in the shared pool"
    [row] = topo["reservations"]
    assert row["name"] == "db-cpus" and C(row["cpus"]) == held and row["phase"] == "Available"
    node.client.delete(CPUR, "db-cpus")
    wait_for(lambda: not topology_status(node).get("reservations"), what="the hold dropped")
    assert held <= C(topology_status(node)["free"])


def test_a_reservation_elsewhere_or_unholdable_is_not_held_here(node: FakeNode) -> None:
    node.agent()
    node.client.create(CPUR, cpur("other-node", node="node-b", cpus=2, owners=[{"name": "x"}]))
    node.client.create(CPUR, cpur("too-big", cpus=40, owners=[{"name": "x"}]))
    st = phase_is(node, "too-big", "Failed")
    assert "cannot hold 40 CPU(s)" in st["message"], st
    settle(node)
    assert status(node, "other-node").get("phase") in (None, "Pending")
    assert not topology_status(node).get("reservations")


# ---------------------------------------------------------------------- pods on reservations
def test_the_matching_pod_gets_exactly_the_reserved_cpus_and_consumes_them(
    node: FakeNode,
) -> None:
    node.agent()
    node.client.create(CPUR, cpur("db-cpus", cpuSet="8-11", owners=[{"name": "db"}]))
    phase_is(node, "db-cpus", "Available")
    other = exclusive_pod(node, "web", 4)
    wait_for(lambda: len(node.cpus(other, "app")) == 4, what="web pinned")
    assert not node.cpus(other, "app") & C("8-11"), "a pod it does not match never gets them"
    pod = exclusive_pod(node, "db", 4)
    wait_for(lambda: node.cpus(pod, "app") == C("8-11"), what="db on the reserved CPUs")
    st = phase_is(node, "db-cpus", "Succeeded")
    assert st["owners"] == [
        {"namespace": "default", "name": "db", "uid": pod["metadata"]["uid"]}
    ], st
    [row] = topology_status(node)["reservations"]
    assert row["consumedBy"] == "default/db" and row["phase"] == "Succeeded"


def test_a_pod_larger_than_its_reservation_gets_it_and_more(node: FakeNode) -> None:
    node.agent()
    node.client.create(
        CPUR, cpur("r", cpuSet="8-9", owners=[{"labelSelector": {"matchLabels": {"app": "db"}}}])
    )
    phase_is(node, "r", "Available")
    pod = exclusive_pod(node, "db-0", 4, labels={"app": "db"})
    wait_for(lambda: len(node.cpus(pod, "app")) == 4, what="db pinned")
    assert C("8-9") <= node.cpus(pod, "app")
    phase_is(node, "r", "Succeeded")


def test_a_reusable_reservation_stays_available_and_serves_the_next_pod(node: FakeNode) -> None:
    node.agent()
    node.client.create(
        CPUR,
        cpur("pool", cpus=2, owners=[{"namespace": "default"}], allocateOnce=False),
    )
    held = C(phase_is(node, "pool", "Available")["cpus"])
    first = exclusive_pod(node, "batch-1", 2)
    wait_for(lambda: node.cpus(first, "app") == held, what="batch-1 on the reservation")
    wait_for(lambda: len(status(node, "pool").get("owners") or []) == 1, what="owner recorded")
    assert status(node, "pool")["phase"] == "Available"
    node.delete(first)
    settle(node)
    second = exclusive_pod(node, "batch-2", 2)
    wait_for(lambda: node.cpus(second, "app") == held, what="batch-2 on the reservation")
    wait_for(lambda: len(status(node, "pool").get("owners") or []) == 2, what="both owners")
    assert status(node, "pool")["phase"] == "Available"


# ---------------------------------------------------------------------- landing on held CPUs
def test_reserved_cpus_leave_the_shared_pool_of_running_containers(node: FakeNode) -> None:
    node.agent()
    shared = node.pod("tool", container("app", "1", memory="64Mi"))
    node.run(shared)
    wait_for(lambda: node.cpus(shared, "app") == C("0-31"), what="tool on the shared pool")
    node.client.create(CPUR, cpur("r", cpuSet="16-19", owners=[{"name": "db"}]))
    phase_is(node, "r", "Available")
    wait_for(lambda: not node.cpus(shared, "app") & C("16-19"), what="tool re-pinned")


def test_an_exclusive_container_on_newly_reserved_cpus_is_moved_live(node: FakeNode) -> None:
    node.agent()
    pod = exclusive_pod(node, "ex", 2)
    wait_for(lambda: len(node.cpus(pod, "app")) == 2, what="ex pinned")
    before = node.cpus(pod, "app")
    node.client.create(CPUR, cpur("r", cpuSet=str(before), owners=[{"name": "db"}]))
    st = phase_is(node, "r", "Available")
    assert C(st["cpus"]) == before
    wait_for(lambda: not node.cpus(pod, "app") & before, what="ex moved")
    after = node.cpus(pod, "app")
    assert len(after) == 2
    wait_for(lambda: events(node, pod, "CPUMoved"), what="the CPUMoved Event")
    wait_for(
        lambda: json.loads(node.annotation(pod) or "{}") == {"app": str(after)},
        what="the annotation follows",
    )
    wait_for(
        lambda: C(node.client.get(PCB, "ex-app", "default")["status"]["cpus"]) == after,
        what="its PodCPUBinding follows",
    )


def test_an_exclusive_container_that_cannot_move_blocks_the_reservation(node: FakeNode) -> None:
    node.agent()
    pod = exclusive_pod(node, "ex", 2)
    wait_for(lambda: len(node.cpus(pod, "app")) == 2, what="ex pinned")
    before = node.cpus(pod, "app")
    big = exclusive_pod(node, "big", 28)
    wait_for(lambda: len(node.cpus(big, "app")) == 28, what="big pinned")
    node.client.create(CPUR, cpur("r", cpuSet=str(before), owners=[{"name": "db"}]))
    wait_for(lambda: events(node, pod, "CPUReservationBlocked"), what="the pod told")
    message = events(node, pod, "CPUReservationBlocked")[0]["message"]
    assert "CPUReservation r" in message and str(before) in message, message
    st = status(node, "r")
    assert st.get("phase") == "Pending" and "waiting" in st.get("message", ""), st
    assert node.cpus(pod, "app") == before, "it stays where it is"
    node.delete(big)
    st = phase_is(node, "r", "Available")
    assert C(st["cpus"]) == before
    wait_for(lambda: not node.cpus(pod, "app") & before, what="ex moved once CPUs freed up")


def test_the_node_reservation_moves_an_exclusive_container_off_its_cpus(node: FakeNode) -> None:
    node.agent()
    pod = exclusive_pod(node, "ex", 2)
    wait_for(lambda: len(node.cpus(pod, "app")) == 2, what="ex pinned")
    before = node.cpus(pod, "app")
    node.client.patch(
        NODES,
        NODE,
        {
            "metadata": {
                "annotations": {"corepin.io/reservation": f'{{"reservedCPUs": "{before}"}}'}
            }
        },
    )
    wait_for(lambda: C(topology_status(node)["reservedCPUs"]) == before, what="reserved")
    wait_for(lambda: not node.cpus(pod, "app") & before, what="ex moved")


# ---------------------------------------------------------------------- eviction
def _blocked_node(node: FakeNode) -> tuple[dict[str, Any], CPUSet]:
    """An agent with --evict-on-reservation, pod `ex` (2 CPUs, label app=ex) that no other
    CPUs fit (pod `big` holds 28), and a PodDisruptionBudget that forbids evicting `ex`."""
    agent = node.agent(evict_on_reservation=True)
    agent.cpur.retry = 0.3
    pod = exclusive_pod(node, "ex", 2, labels={"app": "ex"})
    wait_for(lambda: len(node.cpus(pod, "app")) == 2, what="ex pinned")
    big = exclusive_pod(node, "big", 28)
    wait_for(lambda: len(node.cpus(big, "app")) == 28, what="big pinned")
    node.client.create(
        PDBS,
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": "ex"},
            "spec": {"selector": {"matchLabels": {"app": "ex"}}, "maxUnavailable": 0},
        },
        "default",
    )
    return pod, node.cpus(pod, "app")


def test_a_refused_eviction_is_told_and_tried_again_until_it_is_allowed(
    node: FakeNode,
) -> None:
    pod, before = _blocked_node(node)
    node.client.create(CPUR, cpur("r", cpuSet=str(before), owners=[{"name": "db"}]))
    wait_for(lambda: events(node, pod, "CPUEvictionRefused"), what="the refusal told")
    message = events(node, pod, "CPUEvictionRefused")[0]["message"]
    assert "disruption budget" in message.lower(), message
    assert status(node, "r").get("phase") == "Pending"
    assert node.client.get(PODS, "ex", "default"), "the budget keeps the pod"
    assert not events(node, pod, "CPUReservationBlocked"), "evicted, not merely told"
    node.client.delete(PDBS, "ex", "default")  # the budget goes: the next try is allowed

    def evicted() -> bool:
        """`ex` is gone or being deleted (one read: it may go between two)."""
        rows = [
            p for p in node.client.list(PODS, "default")["items"] if p["metadata"]["name"] == "ex"
        ]
        return not rows or bool(rows[0]["metadata"].get("deletionTimestamp"))

    wait_for(evicted, what="ex evicted")
    st = phase_is(node, "r", "Available")
    assert C(st["cpus"]) == before
