"""User PodCPUBindings as the node agent meets them from tenants who want more than their pods
ask for: the fake API server (real HTTP), a real `NodeAgent` and the kubelet's cgroupfs layout
in a scratch tree (its cpuset and CFS quota files written and read back).

- a binding never gives a container CPUs its limits do not ask for, nor lifts its CFS quota,
  whatever its status says;
- a binding labelled as the agent's is not restored as the agent's record after a lost
  checkpoint unless the agent's own published allocations say so;
- CPUs are withheld only for validated bindings of pods bound to this node (or, briefly, of a
  pod the scheduler is binding here), never for a label or a binding nobody validated.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from corepin.core.cpuset import CPUSet
from corepin.enforcement.cgroups import CpuQuota
from corepin.enforcement.layout import pod_cgroup_path
from corepin.kube.client import KubeClient
from corepin.kube.resources import EVENTS, NAMESPACES, NCPT, PCB
from corepin.testing import machines as synthetic
from support.helpers import wait_for
from support.node_harness import NODE, FakeNode, fake_node
from support.pods import EXCLUSIVE, container

C = CPUSet.parse
PCB_API = "corepin.io/v1alpha1"


@pytest.fixture
def node(kube: KubeClient, fake_api: Any, tmp_path: Path) -> Iterator[FakeNode]:
    """Node node-a (dual socket, HT, CPUs 0-31) and the namespaces `evil` and `shop`."""
    for ns in ("evil", "shop"):
        kube.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    with fake_node(kube, synthetic.named("dual_socket_ht"), tmp_path) as n:
        n.api = fake_api
        yield n


def settle(node: FakeNode) -> None:
    for agent in node.agents:
        assert agent.wait_idle(20), "the agent did not settle"


def user_binding(
    node: FakeNode,
    name: str,
    pod: str,
    cpus: CPUSet,
    *,
    namespace: str = "default",
    labels: dict[str, str] | None = None,
    status: dict[str, Any] | None = None,
    owner: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Create a PodCPUBinding as a tenant would (and write its status, as a tenant allowed to
    could: the agent must not take the status on trust)."""
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": dict(labels or {})}
    if owner is not None:
        meta["ownerReferences"] = [
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": owner["metadata"]["name"],
                "uid": owner["metadata"]["uid"],
            }
        ]
    body = {
        "apiVersion": PCB_API,
        "kind": "PodCPUBinding",
        "metadata": meta,
        "spec": {"podName": pod, "cpuSet": [{"cpuID": c} for c in cpus]},
    }
    created = node.client.create(PCB, body, namespace)
    if status is not None:
        created = node.client.patch_status(PCB, name, {"status": status}, namespace)
    return created


def events(node: FakeNode, pod: dict[str, Any], reason: str) -> list[dict[str, Any]]:
    items = node.client.list(EVENTS, pod["metadata"]["namespace"])["items"]
    return [
        e
        for e in items
        if e["reason"] == reason and e["involvedObject"].get("name") == pod["metadata"]["name"]
    ]


def free(node: FakeNode) -> CPUSet:
    agent = node.agents[-1]
    agent.publisher.later(("topology",), None)
    settle(node)
    return C(node.client.get(NCPT, NODE)["status"]["free"])


# ---------------------------------------------------------------------- limits
def test_a_binding_never_gives_a_tenth_of_a_cpu_24_cpus_nor_lifts_its_quota(
    node: FakeNode,
) -> None:
    node.agent()
    pod = node.pod(
        "small", container("app", "100m", memory="64Mi")
    )  # no annotation: the shared pool
    named = C("4-27")
    user_binding(node, "grab", "small", named, status={"phase": "Validated"})
    node.run(pod)
    wait_for(lambda: events(node, pod, "CPUPolicyIgnored"), what="the binding refused")
    settle(node)
    # the quotas the kubelet writes for a 100m limit; a resync enforces every pod again
    pod_path = pod_cgroup_path("cgroupfs", "guaranteed", pod["metadata"]["uid"])
    app_path = node.container_path(node.get(pod), node.cid(pod, "app"))
    for path in (pod_path, app_path):
        node.driver.write_quota(path, CpuQuota.for_cpus(0.1))
    node.agents[-1]._enqueue(("resync",))
    settle(node)
    message = events(node, pod, "CPUPolicyIgnored")[0]["message"]
    assert "CPU limit '100m' is not a whole number" in message, message
    assert "PodCPUBinding is ignored" in message, message
    assert node.cpus(pod, "app") == node.topology.online_cpus, "it stays on the shared pool"
    assert node.quota(pod, "app") == 10000 and node.quota(pod) == 10000, "the 0.1-CPU quota stays"
    assert free(node) == node.topology.online_cpus, "nobody's shared pool shrank"


def test_a_binding_of_exactly_the_limit_is_applied(node: FakeNode) -> None:
    node.agent()
    pod = node.pod("db", container("app", "2", memory="64Mi"))
    user_binding(node, "db", "db", C("6-7"), status={"phase": "Validated"})
    node.run(pod)
    wait_for(lambda: node.cpus(pod, "app") == C("6-7"), what="CPUs 6-7")
    settle(node)
    assert node.quota(pod, "app") in (None, -1)


# ---------------------------------------------------------------------- provenance
def test_a_lost_checkpoint_restores_no_binding_a_tenant_labelled_as_the_agents(
    node: FakeNode,
) -> None:
    first = node.agent()
    victim = node.pod(
        "victim", container("app", "4", memory="64Mi"), annotations=EXCLUSIVE, namespace="shop"
    )
    node.run(victim)
    wait_for(lambda: node.annotation(victim) is not None, what="the victim pinned")
    settle(node)
    held = node.cpus(victim, "app")
    first.stop()
    (node.state_dir / "state.json").unlink()
    tenant = node.pod(
        "mine", container("app", "4", memory="64Mi"), annotations=EXCLUSIVE, namespace="evil"
    )
    uid = tenant["metadata"]["uid"]
    forged = {
        "app.kubernetes.io/managed-by": "corepin-agent",
        "corepin.io/node": NODE,
        "corepin.io/pod-uid": uid,
        "corepin.io/container": "app",
    }
    user_binding(
        node,
        "aaa-mine-app",  # listed before the victim's record
        "mine",
        held,
        namespace="evil",
        labels=forged,
        owner=tenant,
        status={"phase": "Applied", "cpus": str(held), "nodeName": NODE},
    )
    node.run(tenant)
    node.agent()
    wait_for(lambda: node.annotation(tenant) is not None, what="the tenant's pod pinned")
    settle(node)
    assert node.cpus(victim, "app") == held, "the victim keeps its CPUs"
    assert not node.cpus(tenant, "app") & held, "the tenant got none of them"


# ---------------------------------------------------------------------- withholding
@pytest.mark.parametrize(
    "status", [None, {"phase": "Pending"}], ids=["no status (controller down)", "Pending"]
)
def test_no_cpu_is_withheld_for_a_binding_nobody_validated(
    node: FakeNode, status: dict[str, Any] | None
) -> None:
    node.agent()
    # fits nowhere, never bound
    node.pod("huge", container("app", "32", memory="64Mi"), namespace="evil", node=None)
    user_binding(
        node,
        "huge",
        "huge",
        node.topology.online_cpus,
        namespace="evil",
        labels={"corepin.io/node": NODE},
        status=status,
    )
    settle(node)
    assert free(node) == node.topology.online_cpus
    pod = node.pod("db", container("app", "2", memory="64Mi"), annotations=EXCLUSIVE)
    node.run(pod)
    wait_for(lambda: node.annotation(pod) is not None, what="db pinned")
    settle(node)
    assert len(node.cpus(pod, "app")) == 2 and not events(node, pod, "CPUPinFailed")


def test_a_validated_binding_of_a_pod_being_bound_here_holds_its_cpus_briefly(
    node: FakeNode,
) -> None:
    """The scheduler's --bind-cpus flow: binding created, marked Validated for this node, and
    only then the pod bound. Meanwhile its CPUs are not handed to anyone else."""
    agent = node.agent()
    node.pod("next", container("app", "2", memory="64Mi"), node=None)
    promised = C("2-3")
    user_binding(node, "next", "next", promised, status={"phase": "Validated", "nodeName": NODE})
    settle(node)
    wait_for(lambda: not free(node) & promised, what="the promised CPUs withheld")
    other = node.pod("other", container("app", "28", memory="64Mi"), annotations=EXCLUSIVE)
    node.run(other)
    wait_for(lambda: node.annotation(other) is not None, what="other pinned")
    settle(node)
    assert not node.cpus(other, "app") & promised, "CPUs promised to next stay out of reach"
    node.client.bind("default", "next", NODE)
    wait_for(
        lambda: agent.watches.pods.cache.get("next", "default") is not None, what="the bind seen"
    )
    pod = node.run(node.get({"metadata": {"name": "next", "namespace": "default"}}))
    wait_for(lambda: node.cpus(pod, "app") == promised, what="next on its CPUs")
    # a validated binding whose pod never comes stops withholding after the grace
    node.pod("never", container("app", "1", memory="64Mi"), node=None)
    spare = CPUSet.of(min(free(node)))
    user_binding(node, "never", "never", spare, status={"phase": "Validated", "nodeName": NODE})
    settle(node)
    wait_for(lambda: not spare & free(node), what=f"CPU {spare} withheld")
    agent.promises.grace = 0.0  # as if the grace were over
    wait_for(lambda: bool(spare & free(node)), what=f"CPU {spare} offered again after the grace")
