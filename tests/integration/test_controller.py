"""`corepin controller`'s work over the fake API server (real HTTP, no patched client): each
validation rule, re-validation on changes, adoption and orphan deletion, stale heartbeats,
409 retries, and reads from informers only."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterator
from typing import Any

import pytest

from corepin.agent.cluster.controller.controller import (
    BINDINGS,
    TOPOLOGIES,
    Controller,
    ControllerSettings,
)
from corepin.core.cpuset import CPUSet
from corepin.kube.client import KubeClient
from corepin.kube.models import agent_binding_labels
from corepin.kube.resources import CRDS, EVENTS, PODS
from corepin.kube.transport import Transport
from corepin.testing.fakeapi import FakeApiServer
from corepin.testing.machines import dual_socket_ht, offline_cpus
from support.controller_helpers import (
    allocation,
    binding,
    condition,
    create_binding,
    create_pod,
    gone,
    heartbeat,
    ncpt,
    publish,
    republish,
    running,
    settle,
    status_of,
    wait_phase,
)
from support.crd_schema import crd
from support.helpers import wait_for
from support.kube_helpers import install_crds
from support.pods import container

Obj = dict[str, Any]


@pytest.fixture
def cluster(kube: KubeClient) -> KubeClient:
    """The CRDs, and node worker-1 (dual socket, HT: CPU n and n+16 are siblings; NUMA node 0
    is 0-7,16-23) published by its agent with CPUs 0 and 16 reserved."""
    install_crds(kube)
    publish(kube, ncpt("worker-1", dual_socket_ht(), reserved="0,16"))
    return kube


@pytest.fixture
def ctl(cluster: KubeClient) -> Iterator[Controller]:
    with running(cluster) as controller:
        yield controller


def events_for(kube: KubeClient, name: str, namespace: str = "default") -> list[Obj]:
    items: list[Obj] = kube.list(EVENTS, namespace)["items"]
    return [e for e in items if e["involvedObject"]["name"] == name]


def wait_event(kube: KubeClient, name: str, reason: str, namespace: str = "default") -> Obj:
    found: list[Obj] = []

    def seen() -> bool:
        found[:] = [e for e in events_for(kube, name, namespace) if e["reason"] == reason]
        return bool(found)

    wait_for(seen, 10, f"event {reason} on {name}")
    return found[0]


# ---------------------------------------------------------------------- the rules
def test_a_good_binding_is_validated_with_condition_node_and_event(
    cluster: KubeClient, ctl: Controller
) -> None:
    create_pod(cluster, "web", container("app", "2", "2"))
    create_binding(cluster, binding("web", "web", cpus="2-3", level="Core"))
    status = wait_phase(cluster, "web", "Validated")
    assert status["nodeName"] == "worker-1"
    assert status["message"] == "valid on node worker-1: CPUs 2-3 at level core"
    validated = condition(status, "Validated")
    assert validated is not None
    assert (validated["status"], validated["reason"]) == ("True", "Valid")
    event = wait_event(cluster, "web", "Validated")
    assert event["type"] == "Normal" and event["involvedObject"]["kind"] == "PodCPUBinding"


@pytest.mark.parametrize(
    ("cpus", "reason", "text"),
    [
        ("31-33", "UnknownCPUs", "spec.cpuSet: CPUs 32-33 do not exist on node worker-1"),
        ("15-16", "ReservedCPUs", "CPUs 16 are reserved for the system on node worker-1"),
    ],
    ids=["CPUs the node lacks", "reserved CPUs"],
)
def test_a_binding_on_cpus_the_node_cannot_give_fails_naming_them(
    cluster: KubeClient, ctl: Controller, cpus: str, reason: str, text: str
) -> None:
    count = str(len(CPUSet.parse(cpus)))
    create_pod(cluster, "web", container("app", count, count))
    create_binding(cluster, binding("web", "web", cpus=cpus))
    status = wait_phase(cluster, "web", "Failed")
    assert text in status["message"]
    failed = condition(status, "Validated")
    assert failed is not None and (failed["status"], failed["reason"]) == ("False", reason)
    assert wait_event(cluster, "web", reason)["type"] == "Warning"


def test_offline_cpus_fail(kube: KubeClient) -> None:
    install_crds(kube)
    publish(kube, ncpt("worker-2", offline_cpus()))  # CPUs 0,3,11,13 are offline
    create_pod(kube, "db", container("app", "2", "2"), node="worker-2")
    create_binding(kube, binding("db", "db", containers={"app": "2-3"}))
    with running(kube):
        status = wait_phase(kube, "db", "Failed")
    assert status["message"].startswith(
        "spec.containers[0].cpuSet (container 'app'): CPUs 3 are offline on node worker-2"
    )


def test_a_missing_pod_fails_naming_it(cluster: KubeClient, ctl: Controller) -> None:
    create_binding(cluster, binding("ghost", "ghost-0", cpus="2"))
    status = wait_phase(cluster, "ghost", "Failed")
    assert status["message"] == "pod default/ghost-0 not found"
    assert condition(status, "Validated")["reason"] == "PodNotFound"  # type: ignore[index]
    assert "nodeName" not in status


def test_unknown_and_overlapping_containers_fail(cluster: KubeClient, ctl: Controller) -> None:
    create_pod(cluster, "web", container("app", "1", "1"), container("side", "1", "1"))
    create_binding(cluster, binding("a", "web", containers={"feed": "2"}))
    create_binding(cluster, binding("b", "web", containers={"app": "2-3", "side": "3"}))
    assert (
        "spec.containers[0].name: pod default/web has no container 'feed'"
        in (wait_phase(cluster, "a", "Failed")["message"])
    )
    assert (
        "container 'app' and container 'side' both list CPUs 3"
        in (wait_phase(cluster, "b", "Failed")["message"])
    )


def test_a_conflict_at_the_level_fails_naming_the_other_binding_and_is_resolved_on_delete(
    cluster: KubeClient, ctl: Controller
) -> None:
    create_pod(cluster, "db", container("app", "1", "1"))
    create_pod(cluster, "web", container("app", "1", "1"))
    create_binding(cluster, binding("db", "db", cpus="2", level="Core"))
    wait_phase(cluster, "db", "Validated")
    create_binding(cluster, binding("web", "web", cpus="18"))  # CPU 2's sibling
    status = wait_phase(cluster, "web", "Failed")
    assert condition(status, "Validated")["reason"] == "Conflict"  # type: ignore[index]
    assert "CPUs 18 on node worker-1 are taken" in status["message"]
    assert "binding default/db (CPUs 2, level core) withholds 2,18" in status["message"]
    cluster.delete(BINDINGS, "db", "default")
    wait_phase(cluster, "web", "Validated")


def test_the_agents_bindings_are_not_judged_but_their_cpus_count(
    cluster: KubeClient, ctl: Controller
) -> None:
    pinned = create_pod(cluster, "pinned", container("app", "1", "1"))
    create_binding(
        cluster,
        binding("pinned-app", "pinned", containers={"app": "40"}, agent=True, owner=pinned),
        status={"phase": "Applied", "cpus": "40", "nodeName": "worker-1", "message": "app"},
    )
    pinned2 = create_pod(cluster, "pinned2", container("app", "1", "1"))
    republish(
        cluster,
        ncpt("worker-1", dual_socket_ht(), reserved="0,16",
             allocations=(allocation(pinned2, "5", level="core"),)),
    )  # fmt: skip
    create_binding(
        cluster,
        binding(
            "pinned2-app", "pinned2", containers={"app": "5"}, level="Core", agent=True,
            owner=pinned2,
        ),
        status={"phase": "Applied", "cpus": "5", "nodeName": "worker-1", "message": "app"},
    )  # fmt: skip
    create_pod(cluster, "web", container("app", "1", "1"))
    create_binding(cluster, binding("web", "web", cpus="21"))  # CPU 5's sibling
    status = wait_phase(cluster, "web", "Failed")
    assert "binding default/pinned2-app (CPUs 5, level core)" in status["message"]
    settle(ctl)
    for name in ("pinned-app", "pinned2-app"):  # not even CPU 40, which the node lacks
        agent_status = status_of(cluster, name)
        assert agent_status["phase"] == "Applied" and condition(agent_status, "Validated") is None


def test_a_forged_agent_label_unseats_no_one(kube: KubeClient) -> None:
    """A tenant labels its own binding as the agent's, naming the CPU a victim's validated
    binding holds: without an allocation of the agent's to confirm it, it counts for nothing
    (before, the victim's binding flipped to Failed/Conflict and lost its CPU)."""
    from corepin.kube.resources import NAMESPACES

    install_crds(kube)
    for ns in ("shop", "tenant"):
        kube.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    publish(kube, ncpt("worker-1", dual_socket_ht(), reserved="0,16"))
    create_pod(kube, "victim", container("app", "1", "1"), namespace="shop")
    create_binding(kube, binding("victim", "victim", cpus="20", namespace="shop"))
    tenant = create_pod(kube, "mine", container("app", "1", "1"), namespace="tenant")
    forged = binding(
        "mine-app", "mine", containers={"app": "20"}, namespace="tenant", agent=True, owner=tenant
    )
    forged["metadata"]["labels"]["corepin.io/node"] = "worker-1"
    with running(kube) as controller:
        wait_phase(kube, "victim", "Validated", namespace="shop")
        create_binding(
            kube,
            forged,
            status={"phase": "Applied", "cpus": "20", "nodeName": "worker-1", "message": "x"},
        )
        create_pod(kube, "late", container("app", "1", "1"), namespace="shop")
        create_binding(kube, binding("late", "late", cpus="4", namespace="shop"))
        wait_phase(kube, "late", "Validated", namespace="shop")  # the node was decided again
        settle(controller)
        status = status_of(kube, "victim", "shop")
        assert status["phase"] == "Validated", status
        assert condition(status, "Validated")["reason"] == "Valid"  # type: ignore[index]


def test_a_malformed_binding_fails_with_the_field_and_value(kube: KubeClient) -> None:
    """A binding written under a looser CRD (an old version, a hand-edited one): the
    controller reads it with corepin's models and says what is wrong."""
    loose = crd("podcpubindings")
    schema = loose["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    schema["properties"]["spec"] = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    kube.create(CRDS, loose)
    kube.create(CRDS, crd("nodecputopologies"))
    publish(kube, ncpt("worker-1", dual_socket_ht()))
    create_pod(kube, "web", container("app", "1", "1"))
    body = binding("web", "web", cpus="2")
    body["spec"]["exclusivenessLevel"] = "Rack"
    create_binding(kube, body)
    with running(kube):
        status = wait_phase(kube, "web", "Failed")
    assert condition(status, "Validated")["reason"] == "InvalidSpec"  # type: ignore[index]
    assert status["message"].startswith("spec.exclusivenessLevel: must be one of")
    assert "(got 'Rack')" in status["message"]


def test_an_unscheduled_pod_is_pending_until_bound(cluster: KubeClient, ctl: Controller) -> None:
    create_pod(cluster, "web", container("app", "1", "1"), node=None)
    create_binding(cluster, binding("web", "web", cpus="2"))
    status = wait_phase(cluster, "web", "Pending")
    assert condition(status, "Validated")["status"] == "Unknown"  # type: ignore[index]
    assert "not bound to a node yet" in status["message"]
    cluster.bind("default", "web", "worker-1")
    assert wait_phase(cluster, "web", "Validated")["nodeName"] == "worker-1"


def test_a_node_without_topology_is_pending_until_the_agent_publishes_it(
    kube: KubeClient,
) -> None:
    install_crds(kube)
    create_pod(kube, "web", container("app", "1", "1"), node="worker-9")
    create_binding(kube, binding("web", "web", cpus="2"))
    with running(kube):
        status = wait_phase(kube, "web", "Pending")
        assert "node worker-9 has no NodeCPUTopology yet" in status["message"]
        publish(kube, ncpt("worker-9", dual_socket_ht()))
        wait_phase(kube, "web", "Validated")


def test_a_topology_change_revalidates_the_nodes_bindings(
    cluster: KubeClient, ctl: Controller
) -> None:
    create_pod(cluster, "web", container("app", "1", "1"))
    create_binding(cluster, binding("web", "web", cpus="3"))
    wait_phase(cluster, "web", "Validated")
    current = cluster.get(TOPOLOGIES, "worker-1")
    for row in current["spec"]["topology"]["cpus"]:
        if row["cpu"] == 3:
            row.update(online=False, socket=None, die=None, numa=None, l3=None, l2=None)
            row.update(core=None)
    for node in current["spec"]["topology"]["numa_nodes"]:
        node["cpus"] = str(CPUSet.parse(node["cpus"]) - CPUSet.of(3))
    cluster.replace(TOPOLOGIES, current)
    status = wait_phase(cluster, "web", "Failed")
    assert "CPUs 3 are offline on node worker-1" in status["message"]


def test_an_applied_binding_keeps_the_agents_phase_until_it_becomes_invalid(
    cluster: KubeClient, ctl: Controller
) -> None:
    create_pod(cluster, "web", container("app", "1", "1"))
    create_binding(cluster, binding("web", "web", cpus="4"))
    current = cluster.get(BINDINGS, "web", "default")
    wait_phase(cluster, "web", "Validated")
    current = cluster.get(BINDINGS, "web", "default")
    current["status"].update(phase="Applied", cpus="4", mems="0", message="app on 4")
    cluster.replace_status(BINDINGS, current)
    settle(ctl)
    status = status_of(cluster, "web")
    assert (status["phase"], status["message"], status["cpus"]) == ("Applied", "app on 4", "4")
    topology = cluster.get(TOPOLOGIES, "worker-1")
    topology["spec"]["reservedCPUs"] = "0,4,16"
    cluster.replace(TOPOLOGIES, topology)
    status = wait_phase(cluster, "web", "Failed")
    assert "CPUs 4 are reserved" in status["message"] and status["cpus"] == "4"


# ---------------------------------------------------------------------- ownership
def test_a_user_binding_is_adopted_by_its_pod_and_goes_with_it(
    cluster: KubeClient, ctl: Controller
) -> None:
    web = create_pod(cluster, "web", container("app", "1", "1"))
    create_binding(cluster, binding("web", "web", cpus="2"))
    wait_phase(cluster, "web", "Validated")
    owners = cluster.get(BINDINGS, "web", "default")["metadata"]["ownerReferences"]
    assert owners == [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": "web",
            "uid": web["metadata"]["uid"],
            "controller": False,
            "blockOwnerDeletion": False,
        }
    ]
    cluster.delete(PODS, "web", "default")
    wait_for(lambda: gone(cluster, "web"), 10, "the binding to go with its pod")


def test_a_binding_of_a_pod_that_is_gone_is_deleted_with_an_event(
    cluster: KubeClient, ctl: Controller
) -> None:
    web = create_pod(cluster, "web", container("app", "1", "1"))
    cluster.delete(PODS, "web", "default")
    create_binding(cluster, binding("web", "web", cpus="2", owner=web))
    wait_for(lambda: gone(cluster, "web"), 10, "the orphan to be deleted")
    event = wait_event(cluster, "web", "OrphanDeleted")
    assert event["message"] == f"deleted: pod default/web (uid {web['metadata']['uid']}) is gone"


def test_a_binding_of_an_earlier_pod_of_the_same_name_is_deleted(
    cluster: KubeClient, ctl: Controller
) -> None:
    first = create_pod(cluster, "web-0", container("app", "1", "1"))
    cluster.delete(PODS, "web-0", "default")
    second = create_pod(cluster, "web-0", container("app", "1", "1"))
    create_binding(cluster, binding("old", "web-0", cpus="2", agent=True, owner=first))
    create_binding(cluster, binding("new", "web-0", cpus="3", agent=True, owner=second))
    wait_for(lambda: gone(cluster, "old"), 10, "the earlier pod's binding to be deleted")
    settle(ctl)
    assert not gone(cluster, "new")
    event = wait_event(cluster, "old", "OrphanDeleted")
    assert (
        f"is now uid {second['metadata']['uid']}, not {first['metadata']['uid']}"
        in (event["message"])
    )


def test_a_lagging_pod_cache_never_deletes_a_fresh_binding(
    fake_api: FakeApiServer, cluster: KubeClient, ctl: Controller
) -> None:
    fake_api.inject(r"^/api/v1/pods$", query={"watch": "*"}, status=500, times=None)
    fake_api.drop_watches()
    time.sleep(0.3)
    web = create_pod(
        cluster, "web", container("app", "1", "1")
    )  # the controller's pod watch is down: its cache lacks the pod
    create_binding(cluster, binding("web", "web", cpus="2", owner=web))
    wait_for(
        lambda: any(
            r.method == "GET" and r.path.endswith("/pods/web") for r in fake_api.recorded()
        ),
        10,
        "the controller to read the pod itself",
    )
    time.sleep(0.3)
    assert not gone(cluster, "web")
    fake_api.clear_faults()
    wait_phase(cluster, "web", "Validated", timeout=30)


# ---------------------------------------------------------------------- heartbeats
def ready(kube: KubeClient, node: str) -> Obj:
    conditions = kube.get(TOPOLOGIES, node)["status"]["conditions"]
    found: Obj = next(c for c in conditions if c["type"] == "Ready")
    return found


def test_a_stale_heartbeat_marks_the_topology_not_ready_with_an_event(cluster: KubeClient) -> None:
    with running(cluster, ControllerSettings(heartbeat_timeout=0.6)):
        wait_for(lambda: ready(cluster, "worker-1")["status"] == "False", 10, "Ready=False")
    found = ready(cluster, "worker-1")
    assert found["reason"] == "HeartbeatStale"
    assert "the corepin agent of node worker-1 stopped reporting" in found["message"]
    assert "(timeout 0.6 s)" in found["message"]
    items = cluster.list(EVENTS, "default")["items"]
    stale = [e for e in items if e["reason"] == "HeartbeatStale"]
    assert stale and stale[0]["type"] == "Warning"
    assert stale[0]["involvedObject"]["kind"] == "NodeCPUTopology"


def test_a_live_agent_stays_ready_and_a_returning_one_is_left_ready(cluster: KubeClient) -> None:
    with running(cluster, ControllerSettings(heartbeat_timeout=1.5)) as controller:
        until = time.monotonic() + 3.0
        while time.monotonic() < until:
            heartbeat(cluster, "worker-1")
            assert ready(cluster, "worker-1")["status"] == "True"
            time.sleep(0.15)
        wait_for(lambda: ready(cluster, "worker-1")["status"] == "False", 10, "Ready=False")
        heartbeat(cluster, "worker-1")  # the agent is back: it sets Ready=True itself
        settle(controller, quiet=0.4)
        assert ready(cluster, "worker-1")["status"] == "True"


def test_a_not_ready_condition_of_the_agents_own_is_left_alone(kube: KubeClient) -> None:
    install_crds(kube)
    obj = ncpt("worker-1", dual_socket_ht(), ready=False)
    obj["status"]["conditions"][0]["reason"] = "CgroupsUnavailable"
    publish(kube, obj)
    with running(kube, ControllerSettings(heartbeat_timeout=0.3)) as controller:
        time.sleep(0.8)
        settle(controller)
    assert ready(kube, "worker-1")["reason"] == "CgroupsUnavailable"


# ---------------------------------------------------------------------- concurrency, reads
def test_a_409_on_the_status_write_is_re_read_and_re_applied(
    fake_api: FakeApiServer, cluster: KubeClient
) -> None:
    create_pod(cluster, "web", container("app", "1", "1"))
    create_binding(cluster, binding("web", "web", cpus="2"))
    path = r"/namespaces/default/podcpubindings/web/status$"
    fault = fake_api.inject(path, method="PUT", status=None, delay=1.0, times=1)
    with running(cluster) as controller:
        wait_for(lambda: fault.hits == 1, 10, "the controller's status write")
        # meanwhile the agent writes the status: the controller's write is now stale
        agent = KubeClient(Transport(cluster.transport.config, user_agent="agent"))
        current = agent.get(BINDINGS, "web", "default")
        current["status"] = {"phase": "Pending", "cpus": "2", "mems": "0"}
        agent.replace_status(BINDINGS, current)
        agent.close()
        status = wait_phase(cluster, "web", "Validated")
        settle(controller)
    assert status["cpus"] == "2" and status["mems"] == "0", "the fresh status was re-applied"
    puts = [
        r
        for r in fake_api.recorded(method="PUT")
        if r.path.endswith("podcpubindings/web/status") and r.user_agent != "agent"
    ]
    assert [r.code for r in puts] == [409, 200]
    conflict_at = next(r.at for r in puts if r.code == 409)
    assert any(
        r.method == "GET" and r.path.endswith("podcpubindings/web") and r.at >= conflict_at
        for r in fake_api.recorded()
    ), "the 409 must be followed by a re-read"
    # the status write's 409 is counted (an adoption write racing the agent's may add more)
    assert controller.metrics.conflicts.labels("podcpubindings")._value.get() >= 1


def test_work_reads_come_from_informers_not_a_list_per_event(
    fake_api: FakeApiServer, cluster: KubeClient, ctl: Controller
) -> None:
    settle(ctl)
    lists_before = len(fake_api.recorded(verb="list"))
    for i in range(6):
        create_pod(cluster, f"web-{i}", container("app", "1", "1"))
        create_binding(cluster, binding(f"web-{i}", f"web-{i}", cpus=str(2 + i)))
    for i in range(6):
        wait_phase(cluster, f"web-{i}", "Validated")
    heartbeat(cluster, "worker-1")
    settle(ctl)
    assert len(fake_api.recorded(verb="list")) == lists_before


def test_the_bindings_gauge_and_counters_follow_the_work(
    cluster: KubeClient, ctl: Controller
) -> None:
    create_pod(cluster, "web", container("app", "1", "1"))
    create_binding(cluster, binding("web", "web", cpus="2"))
    create_binding(cluster, binding("ghost", "nobody", cpus="3"))
    wait_phase(cluster, "web", "Validated")
    wait_phase(cluster, "ghost", "Failed")
    settle(ctl)
    assert ctl.bindings_by_phase() == {("user", "Validated"): 1, ("user", "Failed"): 1}
    verdicts = ctl.metrics.verdicts
    assert verdicts.labels("Validated", "Valid")._value.get() == 1
    assert verdicts.labels("Failed", "PodNotFound")._value.get() == 1


def test_stop_ends_every_thread_quickly(cluster: KubeClient) -> None:
    controller = Controller(cluster).start()
    assert controller.wait_for_sync(10)
    started = time.monotonic()
    assert controller.stop(3.0)
    assert time.monotonic() - started < 3.0
    assert not controller.health()[0]


def test_agent_binding_labels_are_the_documented_rule() -> None:
    assert agent_binding_labels() == {"app.kubernetes.io/managed-by": "corepin-agent"}


def test_a_heartbeat_in_the_past_is_judged_by_change_not_by_wall_clock(
    cluster: KubeClient,
) -> None:
    """The controller never compares the agent's clock with its own: a heartbeat stamped
    an hour ago that keeps changing is a live agent."""
    past = dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)
    with running(cluster, ControllerSettings(heartbeat_timeout=1.5)):
        until = time.monotonic() + 3.0
        step = 0
        while time.monotonic() < until:
            step += 1
            heartbeat(cluster, "worker-1", past + dt.timedelta(seconds=step))
            time.sleep(0.15)
        assert ready(cluster, "worker-1")["status"] == "True"


def test_a_failing_write_is_retried_with_backoff_until_it_succeeds(
    fake_api: FakeApiServer, cluster: KubeClient, ctl: Controller
) -> None:
    fault = fake_api.inject(
        r"/namespaces/default/podcpubindings/web/status$", method="PUT", status=500, times=3
    )
    create_pod(cluster, "web", container("app", "1", "1"))
    create_binding(cluster, binding("web", "web", cpus="2"))
    wait_phase(cluster, "web", "Validated")
    assert fault.hits == 3
    settle(ctl)
    errors = ctl.metrics.work_errors.labels("node")._value.get()
    assert errors >= 1, "each failed pass is counted and the key queued again"
    assert ctl.queue.failures(("node", "worker-1")) == 0, "forgotten after the success"


def test_the_agents_record_of_a_validated_binding_keeps_it_validated(
    cluster: KubeClient, ctl: Controller
) -> None:
    """As the node agent does: it pins the containers of a Validated user binding and writes
    one binding of its own per container, on the same CPUs (its record, not a rival)."""
    web = create_pod(cluster, "web", container("app", "1", "1"))
    create_binding(cluster, binding("web", "web", cpus="2", level="Core"))
    wait_phase(cluster, "web", "Validated")
    republish(
        cluster,
        ncpt("worker-1", dual_socket_ht(), reserved="0,16",
             allocations=(allocation(web, "2", level="core"),)),
    )  # fmt: skip
    record = binding("web-app", "web", containers={"app": "2"}, level="Core", agent=True, owner=web)
    record["metadata"]["labels"]["corepin.io/node"] = "worker-1"
    create_binding(
        cluster,
        record,
        status={"phase": "Applied", "cpus": "2", "mems": "0", "nodeName": "worker-1"},
    )
    create_pod(cluster, "other", container("app", "1", "1"))
    create_binding(cluster, binding("other", "other", cpus="18"))
    assert "binding default/web" in wait_phase(cluster, "other", "Failed")["message"]
    settle(ctl)
    assert status_of(cluster, "web")["phase"] == "Validated"


def test_a_second_binding_of_a_pod_fails_as_a_duplicate(
    cluster: KubeClient, ctl: Controller
) -> None:
    create_pod(cluster, "web", container("app", "1", "1"))
    create_binding(cluster, binding("first", "web", cpus="2"))
    wait_phase(cluster, "first", "Validated")
    create_binding(cluster, binding("second", "web", cpus="3"))
    status = wait_phase(cluster, "second", "Failed")
    assert status["message"] == (
        "pod default/web already has the validated binding default/first: one user-written "
        "binding per pod"
    )
    cluster.delete(BINDINGS, "first", "default")
    wait_phase(cluster, "second", "Validated")


def test_a_cpu_only_a_forged_topology_spec_names_is_never_validated(
    cluster: KubeClient, ctl: Controller
) -> None:
    """Someone rewrites worker-1's NodeCPUTopology spec with a CPU 4000; the agent's status
    (rewritten from its own machine on every heartbeat) knows no such CPU."""
    forged = cluster.get(TOPOLOGIES, "worker-1")
    rows = forged["spec"]["topology"]["cpus"]
    rows.append({**next(r for r in rows if r["cpu"] == 31), "cpu": 4000})
    for numa in forged["spec"]["topology"]["numa_nodes"]:
        if 31 in CPUSet.parse(numa["cpus"]):
            numa["cpus"] = str(CPUSet.parse(numa["cpus"]) | CPUSet.of(4000))
    cluster.replace(TOPOLOGIES, forged)
    create_pod(cluster, "web", container("app", "1", "1"))
    create_binding(cluster, binding("web", "web", cpus="4000"))
    status = wait_phase(cluster, "web", "Failed")
    assert condition(status, "Validated")["reason"] == "UnknownCPUs"  # type: ignore[index]
    assert (
        "CPUs 4000 are not among the CPUs the corepin agent of node worker-1" in status["message"]
    )
