"""The controller's decisions as pure functions: each rule of a user-written binding, the
per-node conflict ranking, and the status transitions (who owns which phase)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from corepin.agent.cluster.controller import rules
from corepin.core.cpuset import CPUSet
from corepin.kube.models import FieldError, PodCPUBinding
from corepin.testing.machines import dual_socket_ht, offline_cpus

NOW = dt.datetime(2025, 1, 15, 10, 0, tzinfo=dt.UTC)
LATER = NOW + dt.timedelta(minutes=5)


def pcb(
    cpus: str | None = None,
    *,
    containers: dict[str, str] | None = None,
    level: str = "CPU",
    pod: str = "web",
    name: str = "web",
) -> PodCPUBinding:
    spec: dict[str, Any] = {"podName": pod, "exclusivenessLevel": level}
    if cpus is not None:
        spec["cpuSet"] = [{"cpuID": c} for c in CPUSet.parse(cpus)]
    if containers:
        spec["containers"] = [
            {"name": n, "cpuSet": [{"cpuID": c} for c in CPUSet.parse(t)]}
            for n, t in containers.items()
        ]
    return PodCPUBinding.from_dict({"metadata": {"name": name, "namespace": "shop"}, "spec": spec})


def pod(
    node: str | None = "worker-1",
    containers: tuple[str, ...] = ("app",),
    cpu: int = 1,
    sizes: dict[str, tuple[int, str]] | None = None,
) -> rules.PodFacts:
    """Facts of pod shop/web; each container has a CPU limit = request of `cpu` unless
    `sizes` says otherwise."""
    given = sizes if sizes is not None else {c: (cpu, "") for c in containers}
    return rules.PodFacts(
        "shop", "web", "uid-1", node, containers, ("init",), tuple(sorted(given.items()))
    )


HT = rules.NodeFacts("worker-1", dual_socket_ht(), CPUSet.parse("0,16"))
OFFLINE = rules.NodeFacts("worker-1", offline_cpus())

CASES = [
    ("explicit CPUs on the node pass", pcb("2-3"), pod(cpu=2), HT, "Validated", "Valid", "2-3"),
    (
        "no explicit CPUs: the agent chooses, nothing to check on the node",
        pcb(),
        pod(),
        HT,
        "Validated",
        "Valid",
        "agent chooses",
    ),
    ("a missing pod fails naming it", pcb("2"), None, HT, "Failed", "PodNotFound", "shop/web"),
    (
        "a container the pod lacks fails naming it and the pod's containers",
        pcb(containers={"feed": "2"}),
        pod(),
        HT,
        "Failed",
        "UnknownContainer",
        "no container 'feed' (its containers: 'app', 'init')",
    ),
    (
        "an init container may have a row",
        pcb(containers={"init": "2"}),
        pod(),
        HT,
        "Validated",
        "Valid",
        "",
    ),
    (
        "two containers listing the same CPU fail naming both and the CPU",
        pcb(containers={"app": "2-3", "side": "3-4"}),
        pod(containers=("app", "side")),
        HT,
        "Failed",
        "OverlappingContainers",
        "container 'app' and container 'side' both list CPUs 3",
    ),
    (
        "a container row overlapping the pod-wide set that another container uses fails",
        pcb("4-5", containers={"app": "5"}),
        pod(containers=("app", "side")),
        HT,
        "Failed",
        "OverlappingContainers",
        "spec.cpuSet both list CPUs 5",
    ),
    (
        "the pod-wide set is unused when every container has a row: no overlap",
        pcb("4-5", containers={"app": "5"}),
        pod(containers=("app",)),
        HT,
        "Validated",
        "Valid",
        "",
    ),
    (
        "a pod not bound to a node is pending",
        pcb("2"),
        pod(node=None),
        None,
        "Pending",
        "PodNotScheduled",
        "not bound to a node yet",
    ),
    (
        "a node without a NodeCPUTopology is pending",
        pcb("2"),
        pod(),
        None,
        "Pending",
        "NodeTopologyMissing",
        "node worker-1 has no NodeCPUTopology",
    ),
    (
        "an unreadable NodeCPUTopology is pending with what is wrong",
        pcb("2"),
        pod(),
        rules.NodeFacts("worker-1", None, error="spec.topology: bad"),
        "Pending",
        "NodeTopologyInvalid",
        "spec.topology: bad",
    ),
    (
        "CPUs the node does not have fail naming them and the node's CPUs",
        pcb("30-33"),
        pod(cpu=4),
        HT,
        "Failed",
        "UnknownCPUs",
        "spec.cpuSet: CPUs 32-33 do not exist on node worker-1 (its CPUs: 0-31)",
    ),
    (
        "a container's unknown CPUs name the container",
        pcb(containers={"app": "40"}),
        pod(),
        HT,
        "Failed",
        "UnknownCPUs",
        "spec.containers[0].cpuSet (container 'app'): CPUs 40",
    ),
    (
        "offline CPUs fail naming them and the online ones",
        pcb("2-3"),
        pod(cpu=2),
        OFFLINE,
        "Failed",
        "OfflineCPUs",
        "CPUs 3 are offline on node worker-1 (online: 1-2,4-10,12,14-15)",
    ),
    (
        "more CPUs than the container's limit fail naming both",
        pcb("2-25"),
        pod(node=None),
        HT,
        "Failed",
        "IneligibleContainer",
        "container 'app': the binding names 24 CPU(s) (2-25) but its CPU limit is 1",
    ),
    (
        "a container without a whole CPU limit fails, as for the annotations",
        pcb(containers={"app": "2"}),
        pod(sizes={"app": (0, "its CPU limit '100m' is not a whole number >= 1")}),
        HT,
        "Failed",
        "IneligibleContainer",
        "container 'app': its CPU limit '100m' is not a whole number >= 1",
    ),
    (
        "CPUs in a spec the agent's status does not report fail (a forged spec)",
        pcb("4"),
        pod(),
        rules.NodeFacts(
            "worker-1", dual_socket_ht(), CPUSet.parse("0,16"), accounted=CPUSet.parse("0-3,5-31")
        ),
        "Failed",
        "UnknownCPUs",
        "CPUs 4 are not among the CPUs the corepin agent of node worker-1 reports",
    ),
    (
        "a node whose agent reported no CPUs yet is pending",
        pcb("4"),
        pod(),
        rules.NodeFacts("worker-1", dual_socket_ht(), accounted=CPUSet()),
        "Pending",
        "NodeTopologyInvalid",
        "has not reported its CPUs yet",
    ),
    (
        "reserved CPUs fail naming them",
        pcb("15-16"),
        pod(cpu=2),
        HT,
        "Failed",
        "ReservedCPUs",
        "CPUs 16 are reserved for the system on node worker-1 (reserved: 0,16)",
    ),
]


@pytest.mark.parametrize(
    ("binding", "pod_facts", "node", "phase", "reason", "text"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_check_binding(
    binding: PodCPUBinding,
    pod_facts: rules.PodFacts | None,
    node: rules.NodeFacts | None,
    phase: str,
    reason: str,
    text: str,
) -> None:
    verdict = rules.check_binding(binding, pod_facts, node)
    assert (verdict.phase, verdict.reason) == (phase, reason), verdict.message
    assert text in verdict.message


def test_an_unreadable_spec_fails_with_the_field_and_the_value() -> None:
    with pytest.raises(FieldError) as caught:
        PodCPUBinding.from_dict(
            {
                "metadata": {"name": "b", "namespace": "shop"},
                "spec": {"podName": "web", "exclusivenessLevel": "Rack"},
            }
        )
    verdict = rules.invalid_spec(caught.value)
    assert (verdict.phase, verdict.reason) == ("Failed", "InvalidSpec")
    assert "spec.exclusivenessLevel" in verdict.message and "'Rack'" in verdict.message


def test_node_facts_reads_reserved_cpus_from_spec_and_status_and_reports_bad_topologies() -> None:
    from support.controller_helpers import ncpt

    obj = ncpt("worker-1", dual_socket_ht(), reserved="0")
    obj["status"]["reservedCPUs"] = "0,16"
    facts = rules.node_facts(obj)
    assert facts.topology == dual_socket_ht() and facts.reserved == CPUSet.parse("0,16")
    obj["spec"]["topology"] = {"cpus": "many"}
    bad = rules.node_facts(obj)
    assert bad.topology is None and "spec.topology" in bad.error


# ---------------------------------------------------------------------- decide_node
def entry(
    name: str,
    cpus: str,
    level: str = "cpu",
    *,
    pod: str = "",
    created: str = "2025-01-01T00:00:00Z",
    agent: bool = False,
    holding: bool = False,
    own: rules.Verdict | None = None,
    judged: bool = True,
) -> rules.Entry:
    pod = pod or f"pod-{name}"
    claim = rules.claim_of("shop", name, pod, level, CPUSet.parse(cpus), dual_socket_ht())
    if own is None and judged and not agent:
        own = rules.Verdict("Validated", "Valid", "ok", "worker-1")
    return rules.Entry("shop", name, pod, created, agent, holding, own, claim)


def test_the_older_of_two_clashing_newcomers_wins_and_the_other_names_it() -> None:
    verdicts = rules.decide_node(
        "worker-1",
        [
            entry("b", "18", created="2025-01-02T00:00:00Z"),
            entry("a", "2", "core", created="2025-01-01T00:00:00Z"),
        ],
    )
    assert verdicts[("shop", "a")].phase == "Validated"
    lost = verdicts[("shop", "b")]
    assert (lost.phase, lost.reason) == ("Failed", "Conflict")
    assert "CPUs 18 on node worker-1 are taken" in lost.message
    assert "binding shop/a (CPUs 2, level core) withholds 2,18" in lost.message


def test_a_binding_that_holds_is_never_unseated_by_an_older_newcomer() -> None:
    verdicts = rules.decide_node(
        "worker-1",
        [
            entry("old", "2", created="2025-01-01T00:00:00Z"),
            entry("holder", "2", created="2025-01-05T00:00:00Z", holding=True),
        ],
    )
    assert verdicts[("shop", "holder")].phase == "Validated"
    assert verdicts[("shop", "old")].reason == "Conflict"


def test_agent_bindings_take_their_cpus_first_and_are_never_judged() -> None:
    verdicts = rules.decide_node(
        "worker-1",
        [
            entry("user", "0-7", "numa", created="2024-01-01T00:00:00Z", holding=True),
            entry("pinned", "5", agent=True, created="2025-01-01T00:00:00Z", holding=True),
        ],
    )
    assert list(verdicts) == [("shop", "user")]
    assert verdicts[("shop", "user")].reason == "Conflict"
    assert "binding shop/pinned" in verdicts[("shop", "user")].message


def test_levels_withhold_whole_units_both_ways() -> None:
    # CPU 3 at level cpu does not clash with CPU 4 at level cpu, but does with CPU 5 at numa
    # (NUMA node 0 is 0-7,16-23), and not with CPU 12 at numa (node 1)
    apart = rules.decide_node("worker-1", [entry("a", "3"), entry("b", "4", created="2025-02")])
    assert {v.phase for v in apart.values()} == {"Validated"}
    numa = rules.decide_node(
        "worker-1", [entry("a", "3"), entry("b", "5", "numa", created="2025-02")]
    )
    assert numa[("shop", "b")].reason == "Conflict"
    other = rules.decide_node(
        "worker-1", [entry("a", "3"), entry("b", "12", "numa", created="2025-02")]
    )
    assert {v.phase for v in other.values()} == {"Validated"}


def test_own_failures_are_kept_and_take_nothing() -> None:
    failed = rules.Verdict("Failed", "ReservedCPUs", "no")
    verdicts = rules.decide_node(
        "worker-1", [entry("a", "2", own=failed), entry("b", "2", created="2025-02")]
    )
    assert verdicts[("shop", "a")] is failed
    assert verdicts[("shop", "b")].phase == "Validated"


# ---------------------------------------------------------------------- next_status
VALID = rules.Verdict("Validated", "Valid", "valid on node worker-1: CPUs 2", "worker-1")
CONFLICT = rules.Verdict("Failed", "Conflict", "CPUs 2 are taken", "worker-1")
UNSCHEDULED = rules.Verdict("Pending", "PodNotScheduled", "not bound")


def test_a_new_binding_gets_phase_message_node_and_the_validated_condition() -> None:
    status = rules.next_status(None, VALID, NOW)
    assert status is not None
    assert status["phase"] == "Validated" and status["nodeName"] == "worker-1"
    assert status["message"] == VALID.message
    assert status["conditions"] == [
        {
            "type": "Validated",
            "status": "True",
            "lastTransitionTime": "2025-01-15T10:00:00Z",
            "reason": "Valid",
            "message": VALID.message,
        }
    ]


def test_writing_the_same_verdict_again_changes_nothing() -> None:
    status = rules.next_status(None, VALID, NOW)
    assert status is not None
    assert rules.next_status(status, VALID, LATER) is None


def test_the_transition_time_moves_only_when_the_condition_status_does() -> None:
    first = rules.next_status(None, CONFLICT, NOW)
    assert first is not None
    other = rules.Verdict("Failed", "OfflineCPUs", "CPU 2 is offline", "worker-1")
    second = rules.next_status(first, other, LATER)
    assert second is not None
    assert second["conditions"][0]["lastTransitionTime"] == "2025-01-15T10:00:00Z"
    third = rules.next_status(second, VALID, LATER)
    assert third is not None
    assert third["conditions"][0]["lastTransitionTime"] == "2025-01-15T10:05:00Z"


def test_the_agents_applied_phase_and_its_fields_are_kept_for_a_valid_binding() -> None:
    validated = rules.next_status(None, VALID, NOW)
    assert validated is not None
    applied = {**validated, "phase": "Applied", "message": "app on 2", "cpus": "2", "mems": "0"}
    assert rules.next_status(applied, VALID, LATER) is None
    broken = rules.next_status(applied, CONFLICT, LATER)
    assert broken is not None
    assert broken["phase"] == "Failed" and broken["message"] == CONFLICT.message
    assert broken["cpus"] == "2" and broken["mems"] == "0"


def test_an_agent_failure_after_validation_is_kept() -> None:
    validated = rules.next_status(None, VALID, NOW)
    assert validated is not None
    agent_failed = {**validated, "phase": "Failed", "message": "cgroup write failed"}
    assert rules.next_status(agent_failed, VALID, LATER) is None


def test_a_controller_failure_turns_validated_when_the_binding_becomes_valid() -> None:
    failed = rules.next_status(None, CONFLICT, NOW)
    assert failed is not None
    fixed = rules.next_status(failed, VALID, LATER)
    assert fixed is not None and fixed["phase"] == "Validated"


def test_a_pending_verdict_keeps_a_holding_phase_and_only_says_unknown() -> None:
    validated = rules.next_status(None, VALID, NOW)
    assert validated is not None
    missing = rules.Verdict("Pending", "NodeTopologyMissing", "no topology", "worker-1")
    kept = rules.next_status(validated, missing, LATER)
    assert kept is not None
    assert kept["phase"] == "Validated" and kept["message"] == VALID.message
    assert kept["conditions"][0]["status"] == "Unknown"
    assert kept["conditions"][0]["reason"] == "NodeTopologyMissing"
    fresh = rules.next_status(None, UNSCHEDULED, NOW)
    assert fresh is not None and fresh["phase"] == "Pending" and "nodeName" not in fresh


def test_unreadable_conditions_of_others_are_dropped_and_rewritten() -> None:
    status = {"phase": "Pending", "conditions": [{"type": "Ready"}, {"type": "x y"}]}
    written = rules.next_status(status, VALID, NOW)
    assert written is not None
    assert [c["type"] for c in written["conditions"]] == ["Validated"]


def test_pod_owner_uid_reads_only_an_owner_reference_to_that_pod() -> None:
    from corepin.kube.models import OwnerReference, pod_owner, pod_owner_uid

    owners = [
        OwnerReference("apps/v1", "ReplicaSet", "web", "rs-uid"),
        OwnerReference("v1", "Pod", "other", "other-uid"),
        pod_owner("web", "pod-uid"),
    ]
    assert pod_owner_uid(owners, "web") == "pod-uid"
    assert pod_owner_uid(owners[:2], "web") is None
    assert pod_owner_uid([], "web") is None


@pytest.mark.parametrize(
    ("labels", "agent"),
    [
        ({"app.kubernetes.io/managed-by": "corepin-agent"}, True),
        ({"app.kubernetes.io/managed-by": "helm"}, False),
        ({"corepin-agent": "app.kubernetes.io/managed-by"}, False),
        ({}, False),
        (None, False),
    ],
)
def test_is_agent_binding_is_the_label_rule(labels: dict[str, str] | None, agent: bool) -> None:
    from corepin.kube.models import is_agent_binding

    assert is_agent_binding(labels) is agent


def test_the_agents_record_of_a_pods_own_pin_is_no_conflict_for_that_pod() -> None:
    verdicts = rules.decide_node(
        "worker-1",
        [
            entry("web-app", "2-3", "core", pod="web", agent=True, holding=True),
            entry("web", "2-3", pod="web", holding=True),
            entry("other", "18", pod="other"),
        ],
    )
    assert verdicts[("shop", "web")].phase == "Validated"
    other = verdicts[("shop", "other")]
    assert other.reason == "Conflict" and "binding shop/web-app" in other.message


def test_a_second_valid_binding_of_a_pod_fails_as_a_duplicate() -> None:
    verdicts = rules.decide_node(
        "worker-1",
        [
            entry("b", "5", pod="web", created="2025-01-02T00:00:00Z"),
            entry("a", "4", pod="web", created="2025-01-01T00:00:00Z"),
            entry("c", "6", pod="web", own=rules.Verdict("Failed", "UnknownCPUs", "no")),
        ],
    )
    assert verdicts[("shop", "a")].phase == "Validated"
    duplicate = verdicts[("shop", "b")]
    assert (duplicate.phase, duplicate.reason) == ("Failed", "DuplicateBinding")
    assert duplicate.message == (
        "pod shop/web already has the validated binding shop/a: one user-written binding per pod"
    )
    assert verdicts[("shop", "c")].reason == "UnknownCPUs"


def test_a_binding_that_is_not_judged_still_holds_its_cpus() -> None:
    verdicts = rules.decide_node(
        "worker-1",
        [
            entry("leaving", "7", judged=False, holding=True, created="2025-03"),
            entry("new", "7", created="2025-01"),
        ],
    )
    assert list(verdicts) == [("shop", "new")]
    assert verdicts[("shop", "new")].reason == "Conflict"
