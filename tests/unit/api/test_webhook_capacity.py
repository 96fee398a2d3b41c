"""corepin.api.webhook.capacity: "levels or counts no node in the cluster could ever satisfy",
decided by the node agent's allocator on each published node's empty pools, and the catalog
the webhook keeps of NodeCPUTopologies."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from corepin.allocation.decide import decide
from corepin.allocation.policies import get_policy
from corepin.allocation.pools import NodePools
from corepin.allocation.types import Request
from corepin.api.webhook.admission import admit
from corepin.api.webhook.capacity import Catalog, ClusterCapacity, Hold
from corepin.api.webhook.config import WebhookConfig
from corepin.testing.machines import SyntheticSpec, named, synthetic
from support.paths import REPO
from support.pods import container, pod
from support.webhook_helpers import ncpt, review

Obj = dict[str, Any]
DUAL = named("dual_socket_ht")  # 2 sockets x 8 cores x 2 threads: 32 CPUs, sockets of 16
SINGLE = named("single_socket_ht")  # 1 socket: 16 CPUs
QUAD = synthetic(SyntheticSpec(sockets=4, cores_per_l3=4, name="quad"))  # 4 sockets of 8


def capacity(*objects: Obj) -> ClusterCapacity:
    catalog = Catalog()
    for obj in objects:
        catalog.on_add(obj)
    snapshot = catalog.snapshot()
    assert snapshot is not None
    return snapshot


def test_the_test_machines_are_what_the_tests_say() -> None:
    assert (len(DUAL.online_cpus), len(DUAL.socket_ids())) == (32, 2)
    assert (len(SINGLE.online_cpus), len(SINGLE.socket_ids())) == (16, 1)
    assert (len(QUAD.online_cpus), len(QUAD.socket_ids())) == (32, 4)


def test_more_cpus_than_the_biggest_node_has_are_refused_with_what_it_could_give() -> None:
    cluster = capacity(ncpt("node-a", DUAL), ncpt("node-b", SINGLE))
    text = cluster.check([Hold("app", "exclusive", 64)], "cpu")
    assert text == (
        "container 'app' asks for 64 exclusive CPUs at exclusiveness level cpu, more than any "
        "corepin node can ever give: the most is 31 (node-a: 32 online CPUs; one CPU always "
        "stays in the shared pool); ask for at most 31"
    )
    assert cluster.check([Hold("app", "exclusive", 31)], "cpu") is None


def test_level_socket_with_more_cpus_than_a_socket_has_is_refused_on_two_socket_nodes() -> None:
    cluster = capacity(ncpt("node-a", DUAL), ncpt("node-b", DUAL))
    assert cluster.check([Hold("app", "exclusive", 16)], "socket") is None
    text = cluster.check([Hold("app", "exclusive", 17)], "socket")
    assert text is not None
    assert "17 exclusive CPUs at exclusiveness level socket" in text
    assert "the most is 16 (node-a: 32 online CPUs, 2 sockets of 16 CPUs" in text
    assert text.endswith("ask for at most 16 or a narrower corepin.io/exclusiveness-level")


def test_the_same_request_passes_where_the_agent_could_pin_it() -> None:
    # on a 4-socket node 17 CPUs at level socket take 3 whole sockets and leave one shared:
    # the agent's allocator does it, so the webhook must not refuse it
    pools = NodePools.for_topology(QUAD)
    decision = decide(
        pools, QUAD, Request(17, level="socket"), get_policy("topology-aware"), keep_shared=True
    )
    assert len(decision.withheld | decision.cpus) == 24
    assert capacity(ncpt("quad", QUAD)).check([Hold("app", "exclusive", 17)], "socket") is None


def test_a_level_no_node_can_give_at_all_says_so() -> None:
    cluster = capacity(ncpt("solo", SINGLE))
    text = cluster.check([Hold("app", "exclusive", 2)], "socket")
    assert text == (
        "container 'app' asks for 2 exclusive CPUs at exclusiveness level socket, and no corepin "
        "node can give any exclusive CPUs at that level (the biggest is solo: 16 online CPUs, 1 "
        "socket of 16 CPUs; one CPU always stays in the shared pool); use a narrower "
        "corepin.io/exclusiveness-level"
    )
    assert cluster.check([Hold("app", "exclusive", 2)], "core") is None


def test_the_docs_example_message_is_what_a_user_gets() -> None:
    readme = (REPO / "docs" / "kubernetes.md").read_text()
    text = capacity(ncpt("node-a", DUAL)).check([Hold("db", "exclusive", 40)], "core")
    assert text is not None
    quoted = " ".join(text.split("; ask for")[0].split())
    assert quoted in " ".join(readme.replace("\n", " ").split())


def test_reserved_cpus_are_never_handed_out() -> None:
    # reserved CPUs still run shared work (as the kubelet's do), so all 28 others may go
    cluster = capacity(ncpt("node-a", DUAL, reserved="0-3"))
    assert cluster.check([Hold("app", "exclusive", 28)], "cpu") is None
    text = cluster.check([Hold("app", "exclusive", 29)], "cpu")
    assert text is not None and "the most is 28 (node-a: 32 online CPUs, 4 reserved" in text


def test_with_strict_reservation_one_unreserved_cpu_stays_shared() -> None:
    strict = ncpt("node-a", DUAL, reserved="0-3", options={"strict-cpu-reservation": "true"})
    cluster = capacity(strict)
    assert cluster.check([Hold("app", "exclusive", 27)], "cpu") is None
    text = cluster.check([Hold("app", "exclusive", 28)], "cpu")
    assert text is not None and "the most is 27" in text


def test_containers_that_fit_alone_but_not_together_are_refused_together() -> None:
    cluster = capacity(ncpt("node-a", DUAL), ncpt("node-b", SINGLE))
    holds = [Hold("a", "exclusive", 16), Hold("b", "exclusive", 16)]
    text = cluster.check(holds, "cpu")
    assert text is not None
    assert text.startswith(
        "containers 'a', 'b' ask for 32 exclusive CPUs together at exclusiveness level cpu, "
        "and no corepin node can ever hold them all at once (the biggest is node-a: 32 online"
    )
    assert cluster.check([Hold("a", "exclusive", 16), Hold("b", "exclusive", 15)], "cpu") is None


def test_share_cpus_stay_in_the_shared_pool_so_a_whole_node_can_be_shared() -> None:
    cluster = capacity(ncpt("node-a", DUAL))
    assert cluster.check([Hold("app", "share", 32)], "cpu") is None
    text = cluster.check([Hold("app", "share", 33)], "cpu")
    assert text is not None and "the most is 32" in text and "shared pool" not in text


def test_best_effort_workloads_run_on_the_shared_pool_and_are_never_refused() -> None:
    cluster = capacity(ncpt("node-a", SINGLE))
    assert cluster.check([Hold("app", "exclusive", 64)], "cpu", "best-effort") is None
    assert cluster.check([Hold("app", "exclusive", 64)], "cpu", "cpu-bound") is not None


def test_nodes_of_the_same_shape_are_decided_once() -> None:
    cluster = capacity(
        *(ncpt(f"n{i}", DUAL) for i in range(50)), *(ncpt(f"s{i}", SINGLE) for i in range(50))
    )
    assert len(cluster) == 100
    assert [n.online for n in cluster.distinct] == [32, 16]
    first = cluster.check([Hold("app", "exclusive", 40)], "cpu")
    assert first is not None and cluster.check([Hold("app", "exclusive", 40)], "cpu") == first


# ---------------------------------------------------------------------- the catalog
def test_the_catalog_keeps_its_snapshot_while_only_the_status_changes() -> None:
    catalog = Catalog()
    assert catalog.snapshot() is None
    obj = ncpt("node-a", DUAL)
    catalog.on_add(obj)
    first = catalog.snapshot()
    assert first is not None and len(first) == 1
    heartbeat = copy.deepcopy(obj)
    heartbeat["metadata"]["resourceVersion"] = "2"
    heartbeat["status"]["free"] = "4-31"
    heartbeat["status"]["heartbeatTime"] = "2026-01-01T00:00:00Z"
    catalog.on_update(obj, heartbeat)
    assert catalog.snapshot() is first
    reserved = copy.deepcopy(heartbeat)
    reserved["status"]["reservedCPUs"] = "0-1"
    catalog.on_update(heartbeat, reserved)
    second = catalog.snapshot()
    assert second is not first and second is not None
    assert second.nodes[0].reserved == second.nodes[0].reserved.parse("0-1")
    catalog.on_delete(reserved)
    assert catalog.snapshot() is None and len(catalog) == 0


def test_unreadable_topologies_are_skipped_and_remembered() -> None:
    catalog = Catalog()
    good = ncpt("node-a", DUAL)
    broken = ncpt("node-b", SINGLE)
    broken["spec"]["topology"] = {"cpus": "many"}
    odd_policy = ncpt("node-c", SINGLE, policy="made-up")
    for obj in (good, broken, odd_policy):
        catalog.on_add(obj)
    assert sorted(catalog.unreadable) == ["node-b", "node-c"]
    assert "spec.topology" in catalog.unreadable["node-b"]
    snapshot = catalog.snapshot()
    assert snapshot is not None and [n.name for n in snapshot.nodes] == ["node-a"]
    fixed = ncpt("node-b", SINGLE)
    catalog.on_update(broken, fixed)
    assert "node-b" not in catalog.unreadable and len(catalog) == 2


# ---------------------------------------------------------------------- through admission
def test_validate_refuses_a_pod_no_node_could_hold_and_names_the_container() -> None:
    cluster = capacity(ncpt("node-a", DUAL))
    obj = pod(
        "web-0",
        container("db", "40"),
        annotations={
            "corepin.io/cpu-policy": "exclusive",
            "corepin.io/exclusiveness-level": "core",
        },
    )
    response = admit(review(obj), "validate", WebhookConfig(), cluster)["response"]
    assert response["allowed"] is False and response["status"]["code"] == 403
    assert response["status"]["message"].startswith(
        "container 'db' asks for 40 exclusive CPUs at exclusiveness level core"
    )
    fits = pod("web-0", container("db", "8"), annotations={"corepin.io/cpu-policy": "exclusive"})
    assert admit(review(fits), "validate", WebhookConfig(), cluster)["response"]["allowed"]


def test_without_nodes_the_capacity_rule_is_skipped() -> None:
    obj = pod("web-0", container("db", "4000"), annotations={"corepin.io/cpu-policy": "exclusive"})
    assert admit(review(obj), "validate", WebhookConfig(), None)["response"]["allowed"] is True


@pytest.mark.parametrize("endpoint", ["mutate"])
def test_mutate_never_asks_the_capacity_rule(endpoint: str) -> None:
    cluster = capacity(ncpt("node-a", SINGLE))
    obj = pod("web-0", container("db", "4000"), annotations={"corepin.io/cpu-policy": "exclusive"})
    response = admit(review(obj), endpoint, WebhookConfig(), cluster)["response"]  # type: ignore[arg-type]
    assert response["allowed"] is True and "patch" in response
