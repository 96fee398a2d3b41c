"""The Kubernetes node agent against the fake API server (real HTTP) and a fake cgroup tree in
the kubelet's cgroupfs layout: policies, levels, restarts, flips, deletion, shortage and
upgrade, resize, quota, reservation, restart of the agent, drift. (Real containers and real
cgroups: tests/e2e/test_node_agent_e2e.py.)"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from corepin.core.cpuset import CPUSet
from corepin.core.errors import EnvironmentProblem
from corepin.kube.client import KubeClient
from corepin.kube.resources import EVENTS, NCPT, NODES, NRT, PCB
from corepin.testing import machines as synthetic
from support.helpers import wait_for
from support.node_harness import NODE, FakeNode, fake_node
from support.paths import PEER_FIXTURES
from support.pods import EXCLUSIVE, container

C = CPUSet.parse


@pytest.fixture
def node(kube: KubeClient, fake_api: Any, tmp_path: Path) -> Iterator[FakeNode]:
    with fake_node(kube, synthetic.named("dual_socket_ht"), tmp_path) as n:
        n.api = fake_api
        yield n


def events(node: FakeNode, pod: dict[str, Any], reason: str) -> list[dict[str, Any]]:
    items = node.client.list(EVENTS, pod["metadata"]["namespace"])["items"]
    return [
        e
        for e in items
        if e["reason"] == reason and e["involvedObject"].get("name") == pod["metadata"]["name"]
    ]


def settle(node: FakeNode) -> None:
    for agent in node.agents:
        assert agent.wait_idle(20), "the agent did not settle"


def bindings(node: FakeNode) -> list[dict[str, Any]]:
    return node.client.list(PCB)["items"]


def ncpt(node: FakeNode) -> dict[str, Any]:
    return node.client.get(NCPT, NODE)


def test_an_exclusive_pod_is_pinned_annotated_bound_and_published(node: FakeNode) -> None:
    agent = node.agent()
    pod = node.pod("db", container("app", "2", memory="64Mi"), annotations=EXCLUSIVE)
    node.run(pod)
    wait_for(lambda: node.annotation(pod) is not None, what="the corepin.io/cpus annotation")
    settle(node)
    cpus = node.cpus(pod, "app")
    assert len(cpus) == 2 and len(node.topology.cores_in(cpus)) == 1, "one whole core"
    assert json.loads(node.annotation(pod) or "{}") == {"app": str(cpus)}
    assert node.mems(pod, "app") == node.topology.mems_of(cpus)
    assert node.quota(pod, "app") is None and node.quota(pod) is None, "no CFS quota any more"
    [binding] = bindings(node)
    assert binding["status"]["phase"] == "Applied" and binding["status"]["cpus"] == str(cpus)
    assert binding["spec"]["containers"] == [
        {"name": "app", "cpuSet": [{"cpuID": c} for c in cpus]}
    ]
    topo = ncpt(node)
    assert topo["status"]["allocations"][0]["cpus"] == str(cpus)
    assert CPUSet.parse(topo["status"]["free"]) == node.topology.online_cpus - cpus
    assert topo["status"]["conditions"][0]["status"] == "True"
    assert events(node, pod, "CPUPinned")
    assert agent.errors == 0
    settle(node)
    assigned = (node.tmp / "assignments" / "default.db.app").read_text().splitlines()
    assert f"COREPIN_CPUS={cpus}" in assigned and f"COREPIN_CPUS_EXCLUSIVE={cpus}" in assigned
    node.delete(pod)
    wait_for(lambda: not (node.tmp / "assignments" / "default.db.app").exists(), what="cleanup")


def test_shared_containers_follow_the_shared_pool_as_exclusive_pods_come_and_go(
    node: FakeNode,
) -> None:
    node.agent()
    web = node.pod("web", container("app", "500m", memory="64Mi"))
    node.run(web)
    settle(node)
    assert node.annotation(web) is None, "only containers with CPUs of their own are listed"
    assert node.cpus(web, "app") == node.topology.online_cpus
    db = node.pod("db", container("app", "4", memory="64Mi"), annotations=EXCLUSIVE)
    node.run(db)
    wait_for(lambda: node.annotation(db) is not None, what="the exclusive pod")
    settle(node)
    taken = node.cpus(db, "app")
    assert node.cpus(web, "app") == node.topology.online_cpus - taken
    node.delete(db)
    wait_for(lambda: node.cpus(web, "app") == node.topology.online_cpus, what="the pool to grow")
    wait_for(lambda: not bindings(node), what="the binding to go")


def test_share_and_levels_withhold_what_they_should(node: FakeNode) -> None:
    node.agent()
    share = node.pod(
        "s", container("app", "1", memory="64Mi"), annotations={"corepin.io/cpu-policy": "share"}
    )
    core = node.pod(
        "c",
        container("app", "1", memory="64Mi"),
        annotations={**EXCLUSIVE, "corepin.io/exclusiveness-level": "Core"},
    )
    web = node.pod("web", container("app"))
    for p in (share, core, web):
        node.run(p)
    wait_for(lambda: all(node.annotation(p) for p in (share, core)), what="two pinned pods")
    settle(node)
    mine = node.cpus(share, "app")
    assert len(mine) == 1
    pinned = node.cpus(core, "app")
    sibling = node.topology.siblings_of(pinned.first())
    pool = node.cpus(web, "app")
    assert mine <= pool, "a share container's CPU stays in the shared pool"
    assert not (sibling & pool), "level core withholds the whole core from the pool"
    status = ncpt(node)["status"]
    rows = {r["pod"]: r for r in status["allocations"]}
    assert rows["s"]["policy"] == "share" and rows["c"]["level"] == "core"
    assert not (sibling & CPUSet.parse(status["free"])) and not (
        mine & CPUSet.parse(status["free"])
    )


def test_an_ineligible_container_runs_shared_and_the_pod_is_told_why(node: FakeNode) -> None:
    node.agent()
    pod = node.pod("frac", container("app", "1500m", memory="64Mi"), annotations=EXCLUSIVE)
    node.run(pod)
    wait_for(lambda: events(node, pod, "CPUPolicyIgnored"), what="CPUPolicyIgnored")
    settle(node)
    assert node.cpus(pod, "app") == node.topology.online_cpus
    [event] = events(node, pod, "CPUPolicyIgnored")
    assert "1500m" in event["message"] and event["type"] == "Warning"
    bad = node.pod(
        "bad", container("app", "1", memory="64Mi"), annotations={"corepin.io/cpu-policy": "greedy"}
    )
    node.run(bad)
    wait_for(lambda: events(node, bad, "CPUPolicyIgnored"), what="a refused annotation")
    assert "greedy" in events(node, bad, "CPUPolicyIgnored")[0]["message"]


def test_when_cpus_are_short_the_pod_runs_shared_and_is_upgraded_later(node: FakeNode) -> None:
    node.agent()
    big = node.pod("big", container("app", "28", memory="64Mi"), annotations=EXCLUSIVE)
    node.run(big)
    wait_for(lambda: node.annotation(big) is not None, what="the big pod")
    late = node.pod("late", container("app", "4", memory="64Mi"), annotations=EXCLUSIVE)
    node.run(late)
    wait_for(lambda: events(node, late, "CPUPinFailed"), what="CPUPinFailed")
    settle(node)
    assert node.cpus(late, "app") == node.topology.online_cpus - node.cpus(big, "app")
    node.delete(big)
    wait_for(lambda: len(node.cpus(late, "app")) == 4, what="the upgrade")
    # the Event follows the cgroup write (the recorder sends it on its own thread)
    wait_for(
        lambda: events(node, late, "CPUMoved") or events(node, late, "CPUPinned"),
        what="the upgrade's Event",
    )


def test_policy_flips_apply_live_in_every_direction(node: FakeNode) -> None:
    node.agent()
    pod = node.pod("flip", container("app", "2", memory="64Mi"))
    node.run(pod)
    settle(node)
    online = node.topology.online_cpus
    for policy, size in (
        ("share", 2),
        ("exclusive", 2),
        ("none", len(online)),
        ("exclusive", 2),
        ("share", 2),
        ("none", len(online)),
    ):
        node.annotate(pod, {"corepin.io/cpu-policy": policy})
        wait_for(
            lambda policy=policy, size=size: (
                len(node.cpus(pod, "app")) == size  # type: ignore[misc]
                and (policy == "none") == (not bindings(node))
            ),
            what=f"policy {policy}",
        )
    settle(node)
    assert node.agents[-1].errors == 0


def test_a_restarted_container_keeps_its_cpus_in_its_new_cgroup(node: FakeNode) -> None:
    node.agent()
    pod = node.pod("r", container("app", "2", memory="64Mi"), annotations=EXCLUSIVE)
    node.run(pod)
    wait_for(lambda: node.annotation(pod) is not None, what="first pin")
    settle(node)
    before = node.cpus(pod, "app")
    old = node.cid(pod, "app")
    node.restart(pod, "app")
    wait_for(lambda: node.cid(pod, "app") != old and node.cpus(pod, "app") == before, what="repin")


def test_a_terminated_container_gives_its_cpus_back(node: FakeNode) -> None:
    node.agent()
    pod = node.pod("job", container("app", "2", memory="64Mi"), annotations=EXCLUSIVE)
    node.run(pod)
    wait_for(lambda: node.annotation(pod) is not None, what="first pin")
    node.terminate(pod, "app")
    wait_for(
        lambda: CPUSet.parse(ncpt(node)["status"]["free"]) == node.topology.online_cpus,
        what="the CPUs back",
    )


def test_in_place_resize_grows_and_shrinks_around_the_kept_cpus(node: FakeNode) -> None:
    node.agent()
    pod = node.pod("rs", container("app", "2", memory="64Mi"), annotations=EXCLUSIVE)
    node.run(pod)
    wait_for(lambda: node.annotation(pod) is not None, what="first pin")
    settle(node)
    kept = node.cpus(pod, "app")
    spec = node.get(pod)["spec"]["containers"]
    spec[0]["resources"] = {
        "limits": {"cpu": "4", "memory": "64Mi"},
        "requests": {"cpu": "4", "memory": "64Mi"},
    }
    resize(node, pod, spec)
    wait_for(lambda: len(node.cpus(pod, "app")) == 4, what="the growth")
    grown = node.cpus(pod, "app")
    assert kept <= grown, "kept CPUs never move"
    assert len(node.topology.l3s_in(grown)) == 1, "added CPUs come from the same L3"
    spec[0]["resources"] = {
        "limits": {"cpu": "1", "memory": "64Mi"},
        "requests": {"cpu": "1", "memory": "64Mi"},
    }
    resize(node, pod, spec)
    wait_for(lambda: len(node.cpus(pod, "app")) == 1, what="the shrink")
    assert node.cpus(pod, "app") <= grown


def resize(node: FakeNode, pod: dict[str, Any], containers: list[dict[str, Any]]) -> None:
    """In-place resize as the kubelet reports it once applied: the container's resources in
    `status.containerStatuses[].resources` (the spec is what the user asked)."""
    node.resize(pod, {c["name"]: c["resources"] for c in containers})


def test_a_node_reservation_annotation_keeps_cpus_out_of_every_pool(node: FakeNode) -> None:
    node.agent()
    web = node.pod("web", container("app"))
    node.run(web)
    settle(node)
    node.client.patch(
        NODES,
        NODE,
        {"metadata": {"annotations": {"corepin.io/reservation": '{"reservedCPUs": "0-1"}'}}},
    )
    wait_for(lambda: ncpt(node)["status"]["reservedCPUs"] == "0-1", what="the reservation")
    big = node.pod("big", container("app", "30", memory="64Mi"), annotations=EXCLUSIVE)
    node.run(big)
    wait_for(lambda: events(node, big, "CPUPinFailed") or node.annotation(big), what="big")
    settle(node)
    status = ncpt(node)["status"]
    assert not C("0-1") & CPUSet.parse(status["free"])
    for row in status["allocations"]:
        assert not C("0-1") & CPUSet.parse(row["cpus"])


def test_an_agent_restart_never_hands_a_cpu_out_twice(node: FakeNode) -> None:
    first = node.agent()
    a = node.pod("a", container("app", "4", memory="64Mi"), annotations=EXCLUSIVE)
    node.run(a)
    wait_for(lambda: node.annotation(a) is not None, what="a")
    settle(node)
    held = node.cpus(a, "app")
    first.stop()
    b = node.pod("b", container("app", "4", memory="64Mi"), annotations=EXCLUSIVE)
    node.run(b)
    node.agent()
    wait_for(lambda: node.annotation(b) is not None, what="b after the restart")
    settle(node)
    assert node.cpus(a, "app") == held
    assert not node.cpus(b, "app") & held


def test_a_lost_checkpoint_is_rebuilt_from_the_agents_own_bindings(node: FakeNode) -> None:
    first = node.agent()
    a = node.pod("a", container("app", "4", memory="64Mi"), annotations=EXCLUSIVE)
    node.run(a)
    wait_for(lambda: node.annotation(a) is not None, what="a")
    settle(node)
    held = node.cpus(a, "app")
    first.stop()
    (node.state_dir / "state.json").unlink()
    b = node.pod("b", container("app", "4", memory="64Mi"), annotations=EXCLUSIVE)
    node.run(b)
    node.agent()
    wait_for(lambda: node.annotation(b) is not None, what="b")
    settle(node)
    assert node.cpus(a, "app") == held and not node.cpus(b, "app") & held


def test_it_refuses_the_kubelets_static_cpu_manager_unless_asked_to_coexist(
    node: FakeNode, tmp_path: Path
) -> None:
    pod = node.pod("legacy", container("app", "2", memory="64Mi"))
    uid = pod["metadata"]["uid"]
    state = tmp_path / "cpu_manager_state"
    state.write_text(
        json.dumps(
            {
                "policyName": "static",
                "defaultCpuSet": "0-29",
                "entries": {uid: {"app": "30-31"}},
                "checksum": 0,
            }
        )
    )
    with pytest.raises(EnvironmentProblem, match="static CPU manager"):
        node.agent(kubelet_state=str(state))
    agent = node.agent(
        kubelet_state=str(state), kubelet_compat=True, state_dir=str(tmp_path / "s2")
    )
    assert agent.state is not None
    imported = agent.state.get(f"pod/{uid}/app")
    assert imported is not None and imported.cpus == C("30-31")
    node.run(pod)
    settle(node)
    assert node.cpus(pod, "app") == node.topology.online_cpus, "the kubelet's pins are left alone"
    assert not C("30-31") & CPUSet.parse(ncpt(node)["status"]["free"])


def test_resync_writes_nothing_when_nothing_drifted_and_repairs_drift(node: FakeNode) -> None:
    agent = node.agent()
    pod = node.pod("d", container("app", "2", memory="64Mi"), annotations=EXCLUSIVE)
    node.run(pod)
    wait_for(lambda: node.annotation(pod) is not None, what="d")
    settle(node)
    writes = agent.cgroups.writes
    agent._enqueue(("resync",))
    settle(node)
    assert agent.cgroups.writes == writes, "steady state: zero cgroup writes"
    want = node.cpus(pod, "app")
    path = node.container_path(node.get(pod), node.cid(pod, "app"))
    node.driver.write_cpus(path, node.topology.online_cpus)
    agent._enqueue(("resync",))
    settle(node)
    assert node.cpus(pod, "app") == want


def test_dropped_watches_and_410_gone_lose_no_pod(node: FakeNode) -> None:
    node.agent()
    a = node.pod("a", container("app", "2", memory="64Mi"), annotations=EXCLUSIVE)
    node.run(a)
    wait_for(lambda: node.annotation(a) is not None, what="a")
    api = node.api
    api.drop_watches()
    b = node.pod("b", container("app", "2", memory="64Mi"), annotations=EXCLUSIVE)
    node.run(b)
    api.compact()
    api.drop_watches()
    c = node.pod("c", container("app", "2", memory="64Mi"), annotations=EXCLUSIVE)
    node.run(c)
    wait_for(lambda: all(node.annotation(p) for p in (b, c)), what="pods after the faults")
    settle(node)
    held = [node.cpus(p, "app") for p in (a, b, c)]
    assert len(CPUSet().union(*held)) == 6, "no CPU handed out twice"


def validated(node: FakeNode, name: str) -> None:
    """Play the controller: mark a user binding Validated (the agent applies only those)."""
    node.client.patch_status(PCB, name, {"status": {"phase": "Validated"}}, "default")


def test_a_binding_naming_cpus_the_node_lacks_or_someone_holds_is_refused_with_an_event(
    node: FakeNode,
) -> None:
    node.agent()
    holder = node.pod("holder", container("app", "2", memory="64Mi"), annotations=EXCLUSIVE)
    node.run(holder)
    wait_for(lambda: node.annotation(holder) is not None, what="the holder")
    settle(node)
    taken = node.cpus(holder, "app")
    for name, cpus in (("ghost", [99]), ("thief", sorted(taken)[:1])):
        pod = node.pod(name, container("app", "1", memory="64Mi"))
        node.client.create(
            PCB,
            {
                "apiVersion": "corepin.io/v1alpha1",
                "kind": "PodCPUBinding",
                "metadata": {"name": f"{name}-binding", "namespace": "default"},
                "spec": {"podName": name, "cpuSet": [{"cpuID": c} for c in cpus]},
            },
            "default",
        )
        validated(node, f"{name}-binding")
        node.run(pod)
        wait_for(lambda pod=pod: events(node, pod, "CPUPinFailed"), what=f"{name} refused")  # type: ignore[misc]
        message = events(node, pod, "CPUPinFailed")[0]["message"]
        assert str(CPUSet(cpus)) in message
        settle(node)
        assert node.cpus(pod, "app") == node.cpus(holder, "app") ^ node.topology.online_cpus, (
            "it runs on the shared pool"
        )
    assert node.cpus(holder, "app") == taken, "nothing else was disturbed"
    good = node.pod("good", container("app", "1", memory="64Mi"))
    node.client.create(
        PCB,
        {
            "apiVersion": "corepin.io/v1alpha1",
            "kind": "PodCPUBinding",
            "metadata": {"name": "good-binding", "namespace": "default"},
            "spec": {"podName": "good", "cpuSet": [{"cpuID": 31}]},
        },
        "default",
    )
    node.run(good)
    settle(node)
    assert node.cpus(good, "app") != C("31"), "a binding the controller did not validate waits"
    validated(node, "good-binding")
    wait_for(lambda: node.cpus(good, "app") == C("31"), what="explicit CPU 31")


NRT_CRD = PEER_FIXTURES / "noderesourcetopology" / "crd.yaml"


@pytest.mark.skipif(not NRT_CRD.exists(), reason="the NodeResourceTopology CRD fixture is absent")
def test_a_node_resource_topology_is_published_when_its_crd_is_served(node: FakeNode) -> None:
    import yaml

    from corepin.kube.resources import CRDS

    node.client.create(CRDS, yaml.safe_load(NRT_CRD.read_text()))
    node.agent()
    pod = node.pod("db", container("app", "4", memory="64Mi"), annotations=EXCLUSIVE)
    node.run(pod)
    wait_for(lambda: node.annotation(pod) is not None, what="the pin")

    def published() -> dict[str, Any] | None:
        try:
            got: dict[str, Any] = node.client.get(NRT, NODE)
        except Exception:
            return None
        return got

    wait_for(published, what="the NodeResourceTopology")
    settle(node)
    nrt = published()
    assert nrt is not None
    zones = {z["name"]: z for z in nrt["zones"]}
    assert set(zones) == {"node-0", "node-1"}
    available = sum(
        int(r["available"]) for z in zones.values() for r in z["resources"] if r["name"] == "cpu"
    )
    assert available == len(node.topology.online_cpus) - 4


def test_without_the_nrt_crd_the_agent_carries_on(node: FakeNode) -> None:
    agent = node.agent()
    pod = node.pod("db", container("app", "1", memory="64Mi"), annotations=EXCLUSIVE)
    node.run(pod)
    wait_for(lambda: node.annotation(pod) is not None, what="the pin")
    settle(node)
    assert agent.errors == 0 and ncpt(node)["status"]["conditions"][0]["status"] == "True"


def test_shield_system_keeps_everything_outside_kubepods_off_exclusive_cpus(
    node: FakeNode,
) -> None:
    import subprocess

    # processes of ours standing in for system daemons in the (fake) root cpuset group
    daemons = [subprocess.Popen(["sleep", "600"]) for _ in range(2)]
    try:
        for d in daemons:
            node.driver.write_file("", "cgroup.procs", str(d.pid))
        agent = node.agent(shield_system=True)
        settle(node)
        online = node.topology.online_cpus
        assert node.driver.read_cpus("corepin.system") == online
        assert sorted(node.driver.procs("corepin.system")) == sorted(d.pid for d in daemons)
        pod = node.pod("db", container("app", "4", memory="64Mi"), annotations=EXCLUSIVE)
        node.run(pod)
        wait_for(lambda: node.annotation(pod) is not None, what="the exclusive pod")
        settle(node)
        taken = node.cpus(pod, "app")
        assert node.driver.read_cpus("corepin.system") == online - taken
        assert not node.driver.exists("kubepods/corepin.system"), "kubepods is left alone"
        state = agent.snapshot()
        assert state.shield is not None and state.shield.scope == ""
        assert "kubepods" in state.shield.excluded
        node.delete(pod)
        wait_for(
            lambda: node.driver.read_cpus("corepin.system") == online, what="the system set to grow"
        )
        assert agent.errors == 0
    finally:
        for d in daemons:
            d.kill()
            d.wait()
