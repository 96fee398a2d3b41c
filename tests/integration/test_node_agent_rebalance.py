"""Rebalancing in the node agent (`--rebalance off|report|move`) against the fake API server
(real HTTP) and the kubelet's cgroupfs layout on a synthetic machine of 2 NUMA nodes of 6 CPUs
(no SMT; NUMA node 0: CPUs 0-5, node 1: CPUs 6-11; one L3 per node).

The node is fragmented the way churn does it: two 4-CPU pods take one node each, so a 3-CPU pod
that comes next straddles both nodes; then the first pod goes, and 3 CPUs of one node are free.
`report` says so (CPURebalanceAdvised, once) and changes nothing; `move` re-pins the container
in place (its cgroup, memory nodes, PodCPUBinding, annotation, assignment file; CPUMoved); the
opt-out annotation keeps it where it is; the rate limit holds moves back until its clock
allows them."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from corepin.agent.node.agent import NodeAgent
from corepin.agent.node.enforce import ContainerCgroups
from corepin.core.cpuset import CPUSet
from corepin.enforcement.cgroups import CgroupV1
from corepin.enforcement.layout import container_cgroup_path
from corepin.kube.client import KubeClient
from corepin.kube.resources import EVENTS, PCB, PODS
from corepin.testing.machines import SyntheticSpec, synthetic
from corepin.topology.discover import discover
from corepin.topology.model import Topology
from support.helpers import wait_for
from support.node_harness import FakeNode, fake_node
from support.pods import EXCLUSIVE, container, running_container

TOPO: Topology = synthetic(
    SyntheticSpec(numa_per_socket=2, cores_per_l3=6, threads_per_core=1, numbering="linear")
)


@pytest.fixture
def node(kube: KubeClient, fake_api: Any, tmp_path: Path) -> Iterator[FakeNode]:
    with fake_node(kube, TOPO, tmp_path) as n:
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


def numa_of(cpus: CPUSet) -> set[int]:
    return set(TOPO.numa_nodes_in(cpus))


def exclusive(node: FakeNode, name: str, cpus: int, **annotations: str) -> dict[str, Any]:
    pod = node.pod(
        name,
        container("app", str(cpus), memory="64Mi"),
        annotations={**EXCLUSIVE, **annotations},
    )
    return node.run(pod)


def fragment(node: FakeNode, **annotations: str) -> dict[str, Any]:
    """A 3-CPU container straddling both NUMA nodes while 3 CPUs of node 0 or 1 are free: the
    straddling pod."""
    first = exclusive(node, "first", 4)
    exclusive(node, "second", 4)
    settle(node)
    straddler = exclusive(node, "straddler", 3, **annotations)
    settle(node)
    assert len(numa_of(node.cpus(straddler, "app"))) == 2, "the setting: it straddles"
    node.delete(first)
    settle(node)
    return straddler


def binding_cpus(node: FakeNode, pod: dict[str, Any]) -> str:
    name = f"{pod['metadata']['name']}-app"
    return str(node.client.get(PCB, name, "default")["status"]["cpus"])


def test_report_advises_once_and_moves_nothing(node: FakeNode) -> None:
    agent = node.agent()  # (report is the default)
    assert agent.settings.rebalance == "report"
    straddler = fragment(node)
    before = node.cpus(straddler, "app")
    assert len(numa_of(before)) == 2, before
    wait_for(lambda: events(node, straddler, "CPURebalanceAdvised"), what="the advice")
    [advice] = events(node, straddler, "CPURebalanceAdvised")
    assert advice["type"] == "Normal"
    assert f"CPUs {before} span 2 NUMA nodes" in advice["message"], advice["message"]
    assert "--rebalance report" in advice["message"]
    agent._enqueue(("heartbeat",))  # another pass: the same advice is not told again
    settle(node)
    assert len(events(node, straddler, "CPURebalanceAdvised")) == 1
    assert advice.get("count", 1) == 1
    assert node.cpus(straddler, "app") == before
    assert json.loads(node.annotation(straddler) or "{}") == {"app": str(before)}
    assert not events(node, straddler, "CPUMoved")
    assert agent.errors == 0


def test_move_repins_the_container_live(node: FakeNode) -> None:
    agent = node.agent(rebalance="move")
    straddler = fragment(node)
    wait_for(lambda: events(node, straddler, "CPUMoved"), what="the move")
    settle(node)
    after = node.cpus(straddler, "app")
    assert len(after) == 3 and len(numa_of(after)) == 1, after
    assert node.mems(straddler, "app") == TOPO.mems_of(after)
    state = agent.state
    assert state is not None
    [held] = [a for a in state if a.container is not None and a.container.pod == "straddler"]
    assert held.cpus == after and held.withheld == after and held.mems == TOPO.mems_of(after)
    assert json.loads(node.annotation(straddler) or "{}") == {"app": str(after)}
    wait_for(lambda: binding_cpus(node, straddler) == str(after), what="the binding updated")
    lines = (node.tmp / "assignments" / "default.straddler.app").read_text().splitlines()
    assert f"COREPIN_CPUS={after}" in lines
    [moved] = events(node, straddler, "CPUMoved")
    assert str(after) in moved["message"]
    # no two exclusive containers on one CPU, the shared pool (a "none" pod) beside them
    second = node.get({"metadata": {"name": "second", "namespace": "default"}})
    assert not node.cpus(second, "app") & after
    assert not events(node, straddler, "CPURebalanceAdvised")
    assert agent.errors == 0


def test_the_opt_out_annotation_keeps_a_container_where_it_is(node: FakeNode) -> None:
    agent = node.agent(rebalance="move")
    straddler = fragment(node, **{"corepin.io/rebalance": "never"})
    before = node.cpus(straddler, "app")
    agent._enqueue(("heartbeat",))
    settle(node)
    assert node.cpus(straddler, "app") == before and len(numa_of(before)) == 2, before
    assert not events(node, straddler, "CPUMoved")
    # the annotation taken away: it is moved at the next pass
    node.annotate(straddler, {"corepin.io/rebalance": None})
    agent._enqueue(("heartbeat",))
    wait_for(lambda: events(node, straddler, "CPUMoved"), what="the move once allowed")
    settle(node)
    assert len(numa_of(node.cpus(straddler, "app"))) == 1


def test_a_container_annotation_opts_out_that_container(node: FakeNode) -> None:
    agent = node.agent(rebalance="move")
    straddler = fragment(node, **{"corepin.io/rebalance.app": "never"})
    before = node.cpus(straddler, "app")
    agent._enqueue(("heartbeat",))
    settle(node)
    assert node.cpus(straddler, "app") == before and len(numa_of(before)) == 2, before
    assert not events(node, straddler, "CPUMoved")


def test_the_rate_limit_holds_moves_back_until_its_clock_allows(
    node: FakeNode, tmp_path: Path
) -> None:
    """Rate 1 a minute on a clock the test turns: the first move spends the token; a second
    straddler waits while the clock stands still and moves once a minute has passed."""
    now = [1_000_000.0]
    cgroups = ContainerCgroups(node.driver, TOPO)
    agent = NodeAgent(
        node.settings(rebalance="move", rebalance_rate=1),
        node.client,
        TOPO,
        cgroups,
        clock=lambda: now[0],
    )
    agent.start(sync_timeout=30)
    node.agents.append(agent)
    straddler = fragment(node)
    wait_for(lambda: events(node, straddler, "CPUMoved"), what="the first move")
    settle(node)
    # the node fragmented again: "second" goes, a new straddler
    node.delete(node.get({"metadata": {"name": "second", "namespace": "default"}}))
    settle(node)
    exclusive(node, "third", 4)
    exclusive(node, "fourth", 4)
    settle(node)
    fourth = node.get({"metadata": {"name": "fourth", "namespace": "default"}})
    before = node.cpus(fourth, "app")
    assert len(numa_of(before)) == 2, "the setting: the fourth pod straddles"
    node.delete(node.get({"metadata": {"name": "third", "namespace": "default"}}))
    settle(node)
    now[0] += 30  # half a token
    agent._enqueue(("heartbeat",))
    settle(node)
    assert node.cpus(fourth, "app") == before, "no token left: not moved yet"
    assert not events(node, fourth, "CPUMoved")
    now[0] += 30  # a minute after the first move
    agent._enqueue(("heartbeat",))
    wait_for(lambda: events(node, fourth, "CPUMoved"), what="the second move")
    settle(node)
    assert len(numa_of(node.cpus(fourth, "app"))) == 1


@pytest.mark.parametrize(("mode", "rate"), [("move", 0), ("off", 6)])
def test_rate_zero_and_off_move_and_advise_nothing(node: FakeNode, mode: str, rate: int) -> None:
    agent = node.agent(rebalance=mode, rebalance_rate=rate)
    straddler = fragment(node)
    before = node.cpus(straddler, "app")
    agent._enqueue(("heartbeat",))
    settle(node)
    assert node.cpus(straddler, "app") == before and len(numa_of(before)) == 2, before
    assert not events(node, straddler, "CPUMoved")
    assert not events(node, straddler, "CPURebalanceAdvised")


# ---------------------------------------------------------------------- a live move, real cgroups


def _real_v1() -> CgroupV1 | None:
    cpuset, cpu = "/sys/fs/cgroup/cpuset", "/sys/fs/cgroup/cpu"
    if os.geteuid() != 0 or not all(
        os.path.isfile(os.path.join(d, f))
        for d, f in ((cpuset, "cpuset.cpus"), (cpu, "cpu.cfs_quota_us"))
    ):
        return None
    return CgroupV1(cpuset, cpu)


def _allowed(pid: int) -> CPUSet:
    with open(f"/proc/{pid}/status", encoding="ascii") as handle:
        for line in handle:
            if line.startswith("Cpus_allowed_list:"):
                return CPUSet.parse(line.split(":", 1)[1].strip())
    raise AssertionError("no Cpus_allowed_list")


@pytest.mark.realhost
def test_a_live_move_on_the_real_hierarchy_keeps_the_process_on_cpus(
    kube: KubeClient, fake_api: Any, tmp_path: Path
) -> None:
    """The agent's live move (the one `--rebalance move` makes) of a container whose cgroup is a
    real cgroup v1 group with a real process in it: the group's cpuset.cpus goes from the old
    CPU to the new one in place, the process follows, and /proc sampled all through the move
    never shows it without a CPU or on a CPU of neither set. (This host is too small for a
    misaligned container, so the move is asked for directly.)"""
    real = _real_v1()
    if real is None:
        pytest.skip("needs root and the cgroup v1 cpuset and cpu hierarchies")
    online = CPUSet(os.sched_getaffinity(0)) & CPUSet.parse(real.read_cpus_text(""))
    if len(online) < 2:
        pytest.skip("needs 2 CPUs")
    topo = discover("/")
    scratch = f"corepin-test-rebalance-{uuid.uuid4().hex[:8]}"
    made: list[str] = []
    proc: subprocess.Popen[bytes] | None = None
    with fake_node(kube, topo, tmp_path) as n:  # (API objects only: its fake tree is unused)
        try:
            pod = n.pod("db", container("app", "1", memory="64Mi"), annotations=EXCLUSIVE)
            uid, cid = pod["metadata"]["uid"], "e" * 64
            path = container_cgroup_path(
                "cgroupfs", "guaranteed", uid, "containerd", cid, cgroup_root=scratch
            )
            made = real.create(path)
            proc = subprocess.Popen(["sleep", "120"])
            with open(os.path.join(real.root, path, "cgroup.procs"), "w") as procs:
                procs.write(str(proc.pid))
            status = {
                "phase": "Running",
                "qosClass": "Guaranteed",
                "containerStatuses": [running_container("app", cid)],
            }
            n.seen(kube.patch_status(PODS, "db", {"status": status}, "default"))
            cgroups = ContainerCgroups(real, topo, kubelet_root=f"/{scratch}", layout="cgroupfs")
            agent = NodeAgent(
                n.settings(kubelet_cgroup_root=f"/{scratch}", rebalance="move"),
                kube,
                topo,
                cgroups,
            )
            agent.start(sync_timeout=30)
            n.agents.append(agent)
            wait_for(lambda: len(real.read_cpus(path)) == 1, what="db pinned to one CPU")
            assert agent.wait_idle(20)
            old = real.read_cpus(path)
            state = agent.state
            assert state is not None
            [held] = [a for a in state if a.container is not None and a.container.pod == "db"]
            assert held.cpus == old and _allowed(proc.pid) == old
            new = CPUSet([min(online - state.held - old)]) if online - state.held - old else None
            if new is None:
                pytest.skip("no free CPU to move to")
            samples: list[CPUSet] = []
            done = threading.Event()

            def sample() -> None:
                assert proc is not None
                while not done.is_set():
                    samples.append(_allowed(proc.pid))

            sampler = threading.Thread(target=sample)
            sampler.start()
            try:
                agent.mover.move_container(held.id, new, new, "test")
            finally:
                done.set()
                sampler.join(5)
            assert real.read_cpus(path) == new
            assert _allowed(proc.pid) == new
            assert samples and all(s and s <= old | new for s in samples), samples[:5]
            wait_for(
                lambda: json.loads(n.annotation(pod) or "{}") == {"app": str(new)},
                what="the annotation updated",
            )
        finally:
            if proc is not None:
                proc.kill()
                proc.wait(5)
            n.close()
            n.agents.clear()
            for group in reversed(made):
                with contextlib.suppress(Exception):
                    real.remove(group)
            with contextlib.suppress(Exception):
                real.remove(scratch)
