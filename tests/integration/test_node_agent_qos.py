"""Node QoS in the node agent against the fake API server (real HTTP) and a fake cgroup v1 tree
in the kubelet's cgroupfs layout: the `corepin-qos` ConfigMap created, changed, made bad and
deleted (applied live, refusals naming the field, the old policy kept); each container's QoS
class in its NodeCPUTopology row and PodCPUBinding; a best-effort container held to the BE set
the QoS loop chose, and kept there as the pool changes.

The QoS loop's thread runs with a long period here; the tests call its period themselves (the
same call the thread makes), so what a period did is known when they look."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from corepin.agent.node.agent import NodeAgent
from corepin.core.cpuset import CPUSet
from corepin.enforcement.layout import qos_cgroup_path
from corepin.kube.client import KubeClient
from corepin.kube.resources import CONFIGMAPS, EVENTS, NCPT, PCB
from corepin.testing import machines as synthetic
from support.helpers import wait_for
from support.node_harness import NODE, FakeNode, fake_node
from support.pods import EXCLUSIVE, container

NS = "default"
#: BE work may keep the node busy up to 1 % of its 32 CPUs: less than the 2 CPUs it keeps at
#: least, whatever this machine's own load adds as system use - so exactly 2, every period
SQUEEZE = "beSuppress: {policy: cpuset, sloPercent: 1, minCPUs: 2}\n"


@pytest.fixture
def node(kube: KubeClient, fake_api: Any, tmp_path: Path) -> Iterator[FakeNode]:
    with fake_node(kube, synthetic.named("dual_socket_ht"), tmp_path) as n:
        n.api = fake_api
        yield n


def qos_agent(node: FakeNode, **changes: Any) -> NodeAgent:
    return node.agent(qos_period=3600.0, namespace=NS, **changes)


def settle(agent: NodeAgent) -> None:
    assert agent.wait_idle(20), "the agent did not settle"


def events_about(node: FakeNode, kind: str, name: str, reason: str) -> list[dict[str, Any]]:
    return [
        e
        for e in node.client.list(EVENTS, NS)["items"]
        if e["reason"] == reason
        and e["involvedObject"].get("kind") == kind
        and e["involvedObject"].get("name") == name
    ]


def put_configmap(node: FakeNode, text: str) -> None:
    body = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "corepin-qos", "namespace": NS},
        "data": {"qos.yaml": text},
    }
    try:
        node.client.get(CONFIGMAPS, "corepin-qos", NS)
    except Exception:
        node.client.create(CONFIGMAPS, body, NS)
    else:
        node.client.patch(CONFIGMAPS, "corepin-qos", {"data": {"qos.yaml": text}}, NS)


def test_the_qos_configmap_is_applied_live_refused_by_field_and_falls_back_to_the_file(
    node: FakeNode, tmp_path: Path
) -> None:
    path = tmp_path / "qos.yaml"
    path.write_text("beSuppress: {sloPercent: 55}\n")
    agent = qos_agent(node, qos_config=str(path))
    source = agent.qos.source
    assert source.policy.be_suppress.slo_percent == 55, "the file's policy at start"

    put_configmap(node, "beSuppress: {policy: cfsQuota, sloPercent: 40}\ncpuBurst: {policy: auto}")
    wait_for(lambda: source.policy.be_suppress.slo_percent == 40, what="the ConfigMap applied")
    assert source.policy.be_suppress.policy == "cfsQuota"
    assert source.policy.cpu_burst.policy == "auto"
    wait_for(lambda: events_about(node, "Node", NODE, "QoSPolicyApplied"), what="Applied")

    put_configmap(node, "beSuppress: {policy: cpuset, sloPercent: 30}")
    wait_for(lambda: source.policy.be_suppress.slo_percent == 30, what="the change applied")
    assert source.policy.cpu_burst.policy == "none", "what the ConfigMap leaves out: defaults"

    put_configmap(node, "beSuppress: {sloPercent: 250}")
    wait_for(
        lambda: events_about(node, "ConfigMap", "corepin-qos", "QoSPolicyRejected"),
        what="the refusal",
    )
    [refused] = events_about(node, "ConfigMap", "corepin-qos", "QoSPolicyRejected")
    assert refused["type"] == "Warning"
    assert "beSuppress.sloPercent" in refused["message"] and "250" in refused["message"]
    assert source.policy.be_suppress.slo_percent == 30, "the old policy stays"

    node.client.delete(CONFIGMAPS, "corepin-qos", NS)
    wait_for(lambda: source.policy.be_suppress.slo_percent == 55, what="back to the file")
    assert source.origin == str(path)
    assert agent.errors == 0


def test_qos_classes_show_in_the_node_topology_and_the_bindings(node: FakeNode) -> None:
    agent = qos_agent(node)
    db = node.pod("db", container("app", "2", memory="64Mi"), annotations=EXCLUSIVE)
    rsv = node.pod(
        "rsv",
        container("app", "1", memory="64Mi"),
        annotations={"corepin.io/cpu-policy": "share", "corepin.io/qos-class": "LS"},
        labels={"koordinator.sh/qosClass": "BE"},
    )
    odd = node.pod(
        "odd",
        container("app", "1", memory="64Mi"),
        annotations={**EXCLUSIVE, "corepin.io/qos-class": "Platinum"},
    )
    for p in (db, rsv, odd):
        node.run(p)
    wait_for(lambda: len(node.client.list(PCB)["items"]) == 3, what="three bindings")
    settle(agent)
    rows = {r["pod"]: r for r in node.client.get(NCPT, NODE)["status"]["allocations"]}
    assert {p: r.get("qosClass") for p, r in rows.items()} == {
        "db": "LSE",
        "rsv": "LS",  # corepin's annotation wins over Koordinator's label
        "odd": "LSE",  # not a class: the derived one
    }
    bindings = {b["spec"]["podName"]: b for b in node.client.list(PCB)["items"]}
    assert {p: b["status"].get("qosClass") for p, b in bindings.items()} == {
        "db": "LSE",
        "rsv": "LS",
        "odd": "LSE",
    }
    wait_for(lambda: events_about(node, "Pod", "odd", "QoSClassIgnored"), what="the Warning")
    [told] = events_about(node, "Pod", "odd", "QoSClassIgnored")
    assert "corepin.io/qos-class" in told["message"] and "'Platinum'" in told["message"]

    node.annotate(db, {"corepin.io/qos-class": "LSR"})  # a class alone changes live
    wait_for(
        lambda: (
            {
                r["pod"]: r.get("qosClass")
                for r in node.client.get(NCPT, NODE)["status"]["allocations"]
            }["db"]
            == "LSR"
        ),
        what="the new class in the NodeCPUTopology",
    )
    wait_for(
        lambda: (
            {
                b["spec"]["podName"]: b["status"].get("qosClass")
                for b in node.client.list(PCB)["items"]
            }["db"]
            == "LSR"
        ),
        what="the new class in the binding",
    )
    assert agent.errors == 0


def test_a_best_effort_container_gets_the_be_set_after_a_period(
    node: FakeNode, tmp_path: Path
) -> None:
    path = tmp_path / "qos.yaml"
    path.write_text(SQUEEZE)
    agent = qos_agent(node, qos_config=str(path))
    loop = agent.qos.loop
    assert loop is not None
    be = node.pod("be", container("app"))  # BestEffort: kubepods/besteffort/pod.../...
    ls = node.pod("ls", container("app", "2", "500m"))  # Burstable: the whole pool
    for p in (be, ls):
        node.run(p)
    settle(agent)
    online = node.topology.online_cpus
    assert node.cpus(be, "app") == online and node.cpus(ls, "app") == online
    loop.period()  # (the first period only measures)
    loop.period()
    squeezed = loop.be_cpus
    assert squeezed is not None and len(squeezed) == 2
    settle(agent)
    assert node.cpus(be, "app") == squeezed, "the BE container holds the BE set"
    be_group = qos_cgroup_path("cgroupfs", "besteffort")
    assert CPUSet.parse(node.driver.read_cpus_text(be_group)) == squeezed
    assert node.cpus(ls, "app") == online, "LS work keeps the whole pool"

    # a pin taking BE CPUs: the BE container leaves them at once, the next period moves the set
    db = node.pod("db", container("app", "4", memory="64Mi"), annotations=EXCLUSIVE)
    node.run(db)
    wait_for(lambda: node.annotation(db) is not None, what="the exclusive pod")
    settle(agent)
    taken = node.cpus(db, "app")
    assert not (node.cpus(be, "app") & taken)
    loop.period()
    settle(agent)
    assert not ((loop.be_cpus or CPUSet()) & taken)
    assert node.cpus(be, "app") == loop.be_cpus
    # a resync (every cgroup checked) agrees with the loop: nothing to undo
    agent._enqueue(("resync",))
    settle(agent)
    assert node.cpus(be, "app") == loop.be_cpus
    report = loop.period()
    assert report is not None and report.writes == 0, report.changes

    # suppression off: the BE container gets the whole pool back
    path.write_text("beSuppress: {policy: 'off'}\n")
    loop.period()
    settle(agent)
    assert loop.be_cpus is None
    assert node.cpus(be, "app") == online - taken
    assert agent.errors == 0
