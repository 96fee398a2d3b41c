"""Node QoS in the node agent, its parts on their own: the class of a container (annotation,
Koordinator alias, derived; a bad value ignored and told), the class table, the policy source
(file, ConfigMap, refusals naming the field, the old policy kept), what the QoS loop hands the
engine, the BE set in the one cpuset rule, and the QoS metrics."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest

from corepin.agent.node.metrics import AgentMetrics
from corepin.agent.node.qos import is_best_effort, qos_members, qos_node
from corepin.agent.node.qosclass import (
    CLASS_IGNORED,
    ClassRequest,
    QosClasses,
    assignment_class,
    class_events,
    class_request,
)
from corepin.agent.node.qospolicy import APPLIED, REJECTED, QosPolicySource
from corepin.allocation.qos import BeSuppress, QosPolicy
from corepin.core.cpuset import CPUSet
from corepin.core.errors import InputError
from corepin.enforcement.cgroups import CpuQuota
from corepin.enforcement.resctrl.classes import ResctrlSamples
from corepin.enforcement.wanted import cpus_and_mems
from corepin.state.model import Assignment, HostState
from corepin.state.owners import ContainerOwner
from corepin.testing import machines as synthetic

C = CPUSet.parse
TOPO = synthetic.named("dual_socket_ht")
UID = "0b8f0f7e-1111-4222-8333-944455556666"


def pod(annotations: dict[str, str] | None = None, labels: dict[str, str] | None = None) -> Any:
    meta: dict[str, Any] = {"name": "p", "namespace": "ns", "uid": UID}
    if annotations is not None:
        meta["annotations"] = annotations
    if labels is not None:
        meta["labels"] = labels
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta}


def owner(container: str = "app", qos: str = "guaranteed", cgroup: str | None = None) -> Any:
    return ContainerOwner(
        pod_uid=UID, container=container, namespace="ns", pod="p", qos=qos, cgroup=cgroup
    )


def assignment(
    kind: str, cpus: str = "", container: str = "app", qos: str = "guaranteed", **kw: Any
) -> Assignment:
    return Assignment(
        f"pod/{UID}/{container}",
        kind=kind,
        cpus=C(cpus),
        owner=owner(container, qos, kw.pop("cgroup", f"kubepods/pod{UID}/{container}")),
        **kw,
    )


# ---------------------------------------------------------------------- the class a pod names
@pytest.mark.parametrize(
    ("annotations", "labels", "key", "cls"),
    [
        ({}, {}, "", None),
        ({"corepin.io/qos-class": "BE"}, {}, "corepin.io/qos-class", "BE"),
        ({"corepin.io/qos-class": "lsr"}, {}, "corepin.io/qos-class", "LSR"),
        ({}, {"koordinator.sh/qosClass": "LSE"}, "koordinator.sh/qosClass", "LSE"),
        ({"koordinator.sh/qosClass": "SYSTEM"}, {}, "koordinator.sh/qosClass", "SYSTEM"),
        (
            {"corepin.io/qos-class": "LS", "koordinator.sh/qosClass": "BE"},
            {"koordinator.sh/qosClass": "BE"},
            "corepin.io/qos-class",
            "LS",
        ),
        (
            {"koordinator.sh/qosClass": "BE"},
            {"koordinator.sh/qosClass": "LS"},
            "koordinator.sh/qosClass",
            "LS",
        ),
    ],
    ids=[
        "nothing",
        "corepin annotation",
        "any case",
        "Koordinator label",
        "Koordinator annotation",
        "corepin wins",
        "Koordinator label before its annotation",
    ],
)
def test_the_class_a_pod_names(
    annotations: dict[str, str], labels: dict[str, str], key: str, cls: str | None
) -> None:
    got = class_request(pod(annotations, labels))
    assert (got.key, got.qos_class, got.problem) == (key, cls, "")
    assert class_events(got) == []


@pytest.mark.parametrize(
    ("annotations", "labels", "key", "value"),
    [
        ({"corepin.io/qos-class": "Gold"}, {}, "corepin.io/qos-class", "Gold"),
        ({}, {"koordinator.sh/qosClass": "NONE"}, "koordinator.sh/qosClass", "NONE"),
        ({"corepin.io/qos-class": ""}, {}, "corepin.io/qos-class", ""),
    ],
)
def test_a_bad_class_is_ignored_and_told_by_name_and_value(
    annotations: dict[str, str], labels: dict[str, str], key: str, value: str
) -> None:
    got = class_request(pod(annotations, labels))
    assert got.qos_class is None and got.key == key and got.value == value
    [event] = class_events(got)
    assert event.type == "Warning" and event.reason == CLASS_IGNORED
    assert key in event.message and repr(value) in event.message
    assert "derived" in event.message


def test_a_class_request_of_a_malformed_pod_is_empty() -> None:
    assert class_request({"metadata": {"annotations": {"corepin.io/qos-class": 3}}}) == (
        ClassRequest()
    )
    assert class_request({"metadata": "nonsense"}) == ClassRequest()


@pytest.mark.parametrize(
    ("kind", "cpus", "qos", "given", "cls"),
    [
        ("exclusive", "0-1", "guaranteed", None, "LSE"),
        ("mixed", "0-1", "guaranteed", None, "LSE"),
        ("share", "2", "guaranteed", None, "LSR"),
        ("shared", "", "guaranteed", None, "LS"),
        ("shared", "", "burstable", None, "LS"),
        ("shared", "", "besteffort", None, "BE"),
        ("shared", "", "burstable", "BE", "BE"),
        ("exclusive", "0-1", "guaranteed", "LS", "LS"),
    ],
)
def test_a_class_is_derived_from_kind_and_kubernetes_qos_unless_given(
    kind: str, cpus: str, qos: str, given: str | None, cls: str
) -> None:
    assert assignment_class(assignment(kind, cpus, qos=qos), given) == cls


# ---------------------------------------------------------------------- the class table
def test_the_table_keeps_classes_and_base_quotas_per_container_and_forgets_the_pod() -> None:
    a = assignment("exclusive", "0-1")
    b = assignment("shared", container="side", qos="guaranteed")
    state = HostState.new(TOPO).add(a).add(b)
    table = QosClasses()
    assert table.of(b) == "LS", "derived before the pod was synced"
    assert table.update(state, UID, ClassRequest(), {"app": 2.0, "side": 0.5})
    assert (table.of(a), table.of(b)) == ("LSE", "LS")
    assert table.base_quota(a.id) is None, "the agent lifts an exclusive container's quota"
    assert table.base_quota(b.id) == CpuQuota.for_cpus(0.5)
    assert not table.update(state, UID, ClassRequest(), {"app": 2.0, "side": 0.5})
    given = ClassRequest("corepin.io/qos-class", "BE", "BE")
    assert table.update(state, UID, given, {})
    assert (table.of(a), table.of(b)) == ("BE", "BE")
    assert table.base_quota(b.id) is None, "no limit any more"
    smaller = HostState.new(TOPO).add(a)
    assert table.update(smaller, UID, given, {})
    table.forget(UID)
    assert table.of(a) == "LSE", "derived again once the pod is forgotten"


# ---------------------------------------------------------------------- the policy source
class Events:
    """The Events told (the recorder's interface)."""

    def __init__(self) -> None:
        self.told: list[tuple[str, str, str, str]] = []

    def event(self, involved: Any, event_type: str, reason: str, message: str) -> None:
        self.told.append((involved["metadata"]["name"], event_type, reason, message))


NODE = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a", "uid": "n-1"}}


def configmap(text: str | None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "corepin-qos", "namespace": "corepin-system", "uid": "c-1"},
    }
    if text is not None:
        body["data"] = {"qos.yaml": text}
    return body


def source(path: str | None, events: Events, changes: list[QosPolicy]) -> QosPolicySource:
    return QosPolicySource(path, "corepin-system", events, lambda: NODE, changes.append)  # type: ignore[arg-type]


def test_the_configmap_wins_over_the_file_and_its_deletion_brings_the_file_back(
    tmp_path: Path,
) -> None:
    path = tmp_path / "qos.yaml"
    path.write_text("beSuppress: {sloPercent: 50}\n")
    events, changes = Events(), list[QosPolicy]()
    src = source(str(path), events, changes)
    assert src.policy.be_suppress.slo_percent == 50 and src.origin == str(path)
    src.map_changed(configmap("beSuppress: {policy: cfsQuota, sloPercent: 40}"))
    assert src.policy.be_suppress == BeSuppress("cfsQuota", 40, 2)
    assert src.origin == "ConfigMap corepin-system/corepin-qos"
    assert events.told[-1][:3] == ("node-a", "Normal", APPLIED)
    src.map_changed(configmap("beSuppress: {policy: cfsQuota, sloPercent: 40}"))
    assert len(changes) == 1, "the same text again changes nothing"
    src.map_deleted(configmap(None))
    assert src.policy.be_suppress.slo_percent == 50 and src.origin == str(path)
    assert len(changes) == 2 and "deleted" in events.told[-1][3]


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("beSuppress: {sloPercent: 150}", "beSuppress.sloPercent"),
        ("cpuBurst: {policy: turbo}", "cpuBurst.policy"),
        ("classes: {GOLD: {}}", "classes.GOLD"),
        ("beCPUIdle: maybe", "beCPUIdle"),
        ("[1, 2", "not YAML"),
        (None, "data.qos.yaml"),
    ],
)
def test_a_bad_configmap_is_rejected_by_field_and_the_old_policy_stays(
    text: str | None, field: str
) -> None:
    events, changes = Events(), list[QosPolicy]()
    src = source(None, events, changes)
    src.map_changed(configmap("beSuppress: {sloPercent: 30}"))
    good = src.policy
    src.map_changed(configmap(text))
    assert src.policy == good and len(changes) == 1
    name, kind, reason, message = events.told[-1]
    assert (name, kind, reason) == ("corepin-qos", "Warning", REJECTED)
    assert field in message and "ConfigMap corepin-system/corepin-qos" in message
    assert "stays in force" in message


def test_a_bad_configmap_first_keeps_the_default_and_its_deletion_changes_nothing() -> None:
    events, changes = Events(), list[QosPolicy]()
    src = source(None, events, changes)
    src.map_changed(configmap("cpuBurst: {burstPercent: 0}"))
    assert src.policy == QosPolicy() and src.origin == "the default policy"
    src.map_deleted(configmap("cpuBurst: {burstPercent: 0}"))
    assert changes == [] and [e[2] for e in events.told] == [REJECTED]


def test_a_bad_file_refuses_the_start_and_a_bad_change_of_it_is_rejected(
    tmp_path: Path,
) -> None:
    path = tmp_path / "qos.yaml"
    path.write_text("beSuppress: {minCPUs: 0}\n")
    with pytest.raises(InputError, match=r"beSuppress\.minCPUs") as caught:
        source(str(path), Events(), [])
    assert caught.value.exit_code == 2
    with pytest.raises(InputError, match=r"absent\.yaml: no such file"):
        source(str(tmp_path / "absent.yaml"), Events(), [])
    path.write_text("cpuBurst: {policy: auto}\n")
    events, changes = Events(), list[QosPolicy]()
    src = source(str(path), events, changes)
    src.check_file()
    assert changes == [], "an unchanged file is not read again"
    path.write_text("cpuBurst: {policy: nope}\n")
    os.utime(path, ns=(1, 1))
    src.check_file()
    assert src.policy.cpu_burst.policy == "auto"
    assert events.told[-1][:3] == ("node-a", "Warning", REJECTED)
    assert "cpuBurst.policy" in events.told[-1][3]
    path.write_text("cpuBurst: {policy: none}\n")
    os.utime(path, ns=(2, 2))
    src.check_file()
    assert src.policy.cpu_burst.policy == "none" and len(changes) == 1


# ---------------------------------------------------------------------- what the engine gets
def test_members_and_node_for_the_engine() -> None:
    lse = Assignment(
        f"pod/{UID}/a", kind="exclusive", cpus=C("0,16"), owner=owner("a", cgroup="kp/a")
    )
    lsr = Assignment(f"pod/{UID}/b", kind="share", cpus=C("1"), owner=owner("b", cgroup="kp/b"))
    be = Assignment(f"pod/{UID}/c", kind="shared", owner=owner("c", "besteffort", cgroup="kp/be/c"))
    waiting = Assignment(f"pod/{UID}/d", kind="shared", owner=owner("d"))  # no cgroup yet
    state = HostState.new(TOPO, reserved=C("31")).add(lse).add(lsr).add(be).add(waiting)
    table = QosClasses()
    table.update(state, UID, ClassRequest(), {"b": 1.0})
    members = {m.id: m for m in qos_members(state, table)}
    assert set(members) == {lse.id, lsr.id, be.id}
    assert [members[i].qos_class for i in (lse.id, lsr.id, be.id)] == ["LSE", "LSR", "BE"]
    assert members[be.id].cgroup == "kp/be/c"
    assert members[lsr.id].base_quota == CpuQuota.for_cpus(1.0)
    node = qos_node(state, table, "kubepods/besteffort")
    assert node.exclusive == C("0,16") and node.lsr == C("1")
    assert node.reserved == C("31") and node.shared_pool == state.shared_pool
    assert node.be_group == "kubepods/besteffort" and node.online == TOPO.online_cpus
    assert is_best_effort(be, table) and not is_best_effort(lsr, table)


# ---------------------------------------------------------------------- the one cpuset rule
def test_a_best_effort_container_gets_the_be_set_instead_of_the_pool() -> None:
    pool = C("2-31")
    shared = assignment("shared", qos="besteffort")
    assert cpus_and_mems(shared, pool, TOPO)[0] == pool
    assert cpus_and_mems(shared, pool, TOPO, be_cpus=C("28-31"))[0] == C("28-31")
    assert cpus_and_mems(shared, pool, TOPO, be_cpus=C("0-3"))[0] == C("2-3"), "in the pool"
    assert cpus_and_mems(shared, pool, TOPO, be_cpus=C("0-1"))[0] == C("0-1"), (
        "none of it in the pool: the set itself (within its v1 parent) until the next period"
    )
    placed = assignment("shared", "4-5", qos="besteffort")
    assert cpus_and_mems(placed, pool, TOPO, be_cpus=C("5-9"))[0] == C("5")
    own = assignment("exclusive", "0-1")
    assert cpus_and_mems(own, pool, TOPO, be_cpus=C("28-31"))[0] == C("0-1")


# ---------------------------------------------------------------------- metrics
def test_qos_metrics() -> None:
    metrics = AgentMetrics()
    metrics.observe_qos(3.5, 2)
    metrics.observe_qos(None, 0)
    metrics.qos_policy_changed()
    metrics.watch_resctrl(
        lambda: ResctrlSamples(
            [("BE", "0", 4096), ("LS", "1", 8192)], [("BE", "0", "total", 10**9)]
        )
    )
    text = generate_latest(metrics.registry).decode()
    assert "corepin_be_suppressed_cpus 3.5" in text
    assert "corepin_cpu_burst_changes_total 2.0" in text
    assert "corepin_qos_policy_changes_total 1.0" in text
    assert 'corepin_resctrl_llc_occupancy_bytes{cache_id="0",class="BE"} 4096.0' in text
    assert 'corepin_resctrl_llc_occupancy_bytes{cache_id="1",class="LS"} 8192.0' in text
    assert (
        'corepin_resctrl_memory_bandwidth_bytes_total{class="BE",domain="0",scope="total"} 1e+09'
        in text
    )


def test_a_failing_resctrl_read_never_fails_a_scrape() -> None:
    metrics = AgentMetrics()

    def broken() -> ResctrlSamples:
        raise OSError("resctrl unmounted")

    metrics.watch_resctrl(broken)
    text = generate_latest(metrics.registry).decode()
    assert "corepin_be_suppressed_cpus" in text
    assert "corepin_resctrl_llc_occupancy_bytes{" not in text
