"""corepin.kube.models: the typed CRD models, the NodeResourceTopology builder, the pod and node
annotation parsers and container eligibility.

Round trips and CRD conformance are Hypothesis properties; the parsers are fuzzed with arbitrary
JSON (nothing but InputError may come out); errors are checked to name the field and the value.
"""

from __future__ import annotations

import contextlib
import copy
import json
from datetime import UTC, datetime, timedelta, timezone
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corepin.allocation.pools import KOORDINATOR_RESERVATION, Reservation
from corepin.allocation.qos import CLASSES as QOS_CLASSES
from corepin.core.cpuset import CPUSet
from corepin.core.errors import InputError
from corepin.core.quantity import parse_quantity
from corepin.kube import models as m
from corepin.testing.machines import NAMED
from support import strategies
from support.budget import examples
from support.crd_schema import crd, errors, load_yaml_docs, version_schema
from support.paths import DEPLOY, PEER_FIXTURES

NCPT_SCHEMA = version_schema(crd("nodecputopologies"), "v1alpha1")
PCB_SCHEMA = version_schema(crd("podcpubindings"), "v1alpha1")
T0 = datetime(2025, 1, 15, 10, 0, 0, tzinfo=UTC)

# ---------------------------------------------------------------------- strategies
SMALL_TOPOLOGIES = ["single_socket_ht", "dual_socket_ht", "multi_numa_per_socket", "hybrid",
                    "offline_cpus", "sixteen_numa"]  # fmt: skip
TOPOLOGIES = {name: NAMED[name]() for name in SMALL_TOPOLOGIES}

LOWER = "abcdefghijklmnopqrstuvwxyz0123456789"
names = st.text(alphabet=LOWER, min_size=1, max_size=12)
cpusets = strategies.cpusets(st.integers(0, 511), max_size=24)
nonempty_cpusets = strategies.cpusets(st.integers(0, 511), min_size=1, max_size=24)
zones = st.sampled_from(
    [UTC, timezone(timedelta(hours=5, minutes=30)), timezone(-timedelta(hours=8))]
)
stamps = st.datetimes(
    min_value=datetime(1971, 1, 1), max_value=datetime(2200, 1, 1), timezones=zones
)
short_text = st.text(max_size=20)
string_maps = st.dictionaries(names, short_text, max_size=3)

conditions = st.builds(
    m.Condition,
    type=st.sampled_from(["Ready", "Degraded", "corepin.io/Pinned"]),
    status=st.sampled_from(m.CONDITION_STATUSES),
    last_transition_time=stamps,
    reason=st.text(alphabet="AbCdEfXyZ", min_size=1, max_size=10),
    message=short_text,
    observed_generation=st.none() | st.integers(0, 2**40),
)
condition_lists = st.lists(conditions, max_size=3, unique_by=lambda c: c.type).map(tuple)

metas = st.builds(
    m.ObjectMeta,
    name=names,
    uid=st.none() | st.uuids().map(str),
    resource_version=st.none() | st.integers(1, 10**9).map(str),
    generation=st.none() | st.integers(1, 1000),
    labels=string_maps,
    annotations=string_maps,
    owner_references=st.lists(
        st.builds(m.node_owner, names, st.uuids().map(str))
        | st.builds(m.pod_owner, names, st.uuids().map(str)),
        max_size=1,
    ).map(tuple),
)

allocations = st.builds(
    m.Allocation,
    namespace=names,
    pod=names,
    pod_uid=st.uuids().map(str),
    container=names,
    cpus=nonempty_cpusets,
    mems=cpusets,
    policy=st.sampled_from(m.ALLOCATION_POLICIES),
    level=st.sampled_from(("cpu", "core", "l3", "numa", "socket")),
    qos_class=st.none() | st.sampled_from(QOS_CLASSES),
)
id_maps = st.dictionaries(st.integers(0, 64), cpusets, max_size=4)

ncpt_specs = st.builds(
    m.NodeCPUTopologySpec,
    topology=st.sampled_from(list(TOPOLOGIES.values())),
    policy=st.sampled_from(["topology-aware", "kubelet-static", "workload-aware"]),
    options=string_maps,
    reserved_cpus=cpusets,
)
ncpt_statuses = st.builds(
    m.NodeCPUTopologyStatus,
    shared_pool=cpusets,
    reserved_cpus=cpusets,
    isolated_cpus=cpusets,
    free=cpusets,
    free_by_numa=id_maps,
    free_by_l3=id_maps,
    allocations=st.lists(allocations, max_size=4, unique_by=lambda a: a.key).map(tuple),
    heartbeat_time=st.none() | stamps,
    conditions=condition_lists,
)
ncpts = st.builds(
    m.NodeCPUTopology,
    metadata=metas,
    spec=ncpt_specs,
    status=st.none() | ncpt_statuses,
)

pcb_specs = st.builds(
    m.PodCPUBindingSpec,
    pod_name=names,
    level=st.sampled_from(("cpu", "core", "l3", "numa", "socket")),
    cpus=st.none() | cpusets,
    containers=st.lists(
        st.builds(m.ContainerCPUSet, names, nonempty_cpusets),
        max_size=3,
        unique_by=lambda c: c.name,
    ).map(tuple),
)
pcb_statuses = st.builds(
    m.PodCPUBindingStatus,
    phase=st.sampled_from(m.PHASES),
    node_name=st.none() | names,
    cpus=cpusets,
    mems=cpusets,
    message=short_text,
    conditions=condition_lists,
    qos_class=st.none() | st.sampled_from(QOS_CLASSES),
)
pcbs = st.builds(
    m.PodCPUBinding,
    metadata=st.builds(
        lambda meta, ns: m.ObjectMeta(**{**_meta_fields(meta), "namespace": ns}), metas, names
    ),
    spec=pcb_specs,
    status=st.none() | pcb_statuses,
)


def _meta_fields(meta: m.ObjectMeta) -> dict[str, Any]:
    return {f: getattr(meta, f) for f in m.ObjectMeta.__dataclass_fields__}


json_values = strategies.json_values(max_text=12, max_leaves=20)


# ---------------------------------------------------------------------- round trips
@given(ncpts)
def test_node_cpu_topology_round_trips(ncpt: m.NodeCPUTopology) -> None:
    wire = ncpt.to_dict()
    assert m.NodeCPUTopology.from_dict(json.loads(json.dumps(wire))) == ncpt


@given(pcbs)
def test_pod_cpu_binding_round_trips(pcb: m.PodCPUBinding) -> None:
    wire = pcb.to_dict()
    assert m.PodCPUBinding.from_dict(json.loads(json.dumps(wire))) == pcb


@settings(max_examples=examples(60))
@given(ncpts)
def test_node_cpu_topology_on_the_wire_passes_the_crd_schema(ncpt: m.NodeCPUTopology) -> None:
    assert errors(NCPT_SCHEMA, ncpt.to_dict()) == []


@settings(max_examples=examples(60))
@given(pcbs)
def test_pod_cpu_binding_on_the_wire_passes_the_crd_schema(pcb: m.PodCPUBinding) -> None:
    assert errors(PCB_SCHEMA, pcb.to_dict()) == []


def _add_unknown_fields(value: Any) -> Any:
    if isinstance(value, dict):
        out = {k: _add_unknown_fields(v) for k, v in value.items()}
        out["x-future-field"] = {"nested": [1, "two"]}
        return out
    if isinstance(value, list):
        return [_add_unknown_fields(v) for v in value]
    return value


@settings(max_examples=examples(30))
@given(ncpts)
def test_unknown_fields_of_a_node_cpu_topology_are_ignored(ncpt: m.NodeCPUTopology) -> None:
    wire = _add_unknown_fields(ncpt.to_dict())
    for row in wire["spec"]["topology"]["numa_nodes"]:
        del row["distances"]["x-future-field"]  # distance keys are node ids, not fields
    del wire["spec"]["options"]["x-future-field"]  # options are a string map
    if "status" in wire:
        for key in ("freeByNUMA", "freeByL3"):
            del wire["status"][key]["x-future-field"]  # maps from ids
    for key in ("labels", "annotations"):
        wire["metadata"].pop(key, None)
    parsed = m.NodeCPUTopology.from_dict(wire)
    assert (parsed.spec, parsed.status) == (ncpt.spec, ncpt.status)


@settings(max_examples=examples(30))
@given(pcbs)
def test_unknown_fields_of_a_pod_cpu_binding_are_ignored(pcb: m.PodCPUBinding) -> None:
    wire = _add_unknown_fields(pcb.to_dict())
    for key in ("labels", "annotations"):
        wire["metadata"].pop(key, None)
    parsed = m.PodCPUBinding.from_dict(wire)
    assert (parsed.spec, parsed.status) == (pcb.spec, pcb.status)


def test_examples_read_as_models_and_write_back_the_same() -> None:

    for name in ("nodecputopology.yaml", "podcpubinding-explicit.yaml"):
        (doc,) = load_yaml_docs(DEPLOY / "samples" / name)
        model = {"NodeCPUTopology": m.NodeCPUTopology, "PodCPUBinding": m.PodCPUBinding}[
            doc["kind"]
        ]
        obj = model.from_dict(doc)
        wire = obj.to_dict()
        assert wire["spec"] == {
            **wire["spec"],
            **{k: v for k, v in doc["spec"].items() if k != "topology"},
        }
        assert model.from_dict(wire) == obj


def test_a_binding_in_annotation_spelling_is_written_in_crd_spelling() -> None:
    pcb = m.PodCPUBinding.from_dict(
        {"metadata": {"name": "b", "namespace": "ns"},
         "spec": {"podName": "p", "exclusivenessLevel": "numa",
                  "cpuSet": [{"cpuID": 3}, {"cpuID": 1}]}}
    )  # fmt: skip
    assert pcb.spec.level == "numa"
    assert pcb.to_dict()["spec"] == {
        "podName": "p",
        "exclusivenessLevel": "NUMA",
        "cpuSet": [{"cpuID": 1}, {"cpuID": 3}],
    }


def test_an_empty_cpu_list_is_the_same_as_none() -> None:
    spec = m.PodCPUBindingSpec.from_dict({"podName": "p", "cpuSet": []})
    assert spec.cpus is None
    assert m.PodCPUBindingSpec("p", cpus=CPUSet()) == m.PodCPUBindingSpec("p")
    assert "cpuSet" not in spec.to_dict()


# ---------------------------------------------------------------------- the models match the CRDs
def _enum(schema: dict[str, Any], *path: str) -> list[str]:
    node = schema
    for step in path:
        node = node["items"] if step == "[]" else node["properties"][step]
    values: list[str] = node["enum"]
    return values


def test_model_vocabularies_are_the_crd_enums() -> None:
    assert set(m.ACCEPTED_CRD_LEVELS) == set(_enum(PCB_SCHEMA, "spec", "exclusivenessLevel"))
    assert set(m.PHASES) == set(_enum(PCB_SCHEMA, "status", "phase"))
    assert set(m.ALLOCATION_POLICIES) == set(
        _enum(NCPT_SCHEMA, "status", "allocations", "[]", "policy")
    )
    assert set(_enum(NCPT_SCHEMA, "status", "allocations", "[]", "level")) == {
        "cpu", "core", "l3", "numa", "socket",
    }  # fmt: skip
    assert set(m.CONDITION_STATUSES) == set(
        _enum(NCPT_SCHEMA, "status", "conditions", "[]", "status")
    )
    assert set(QOS_CLASSES) == set(_enum(NCPT_SCHEMA, "status", "allocations", "[]", "qosClass"))
    assert set(QOS_CLASSES) == set(_enum(PCB_SCHEMA, "status", "qosClass"))
    for plural, kind in (("nodecputopologies", m.NCPT_KIND), ("podcpubindings", m.PCB_KIND)):
        spec = crd(plural)["spec"]
        assert (spec["group"], spec["names"]["kind"], spec["names"]["plural"]) == (
            m.GROUP, kind, plural,
        )  # fmt: skip
        assert spec["versions"][0]["name"] == m.VERSION
    assert m.NCPT_PLURAL == "nodecputopologies" and m.PCB_PLURAL == "podcpubindings"


# ---------------------------------------------------------------------- strict errors
GOOD_NCPT = m.NodeCPUTopology(
    m.ObjectMeta("worker-1"),
    m.NodeCPUTopologySpec(TOPOLOGIES["dual_socket_ht"], "topology-aware", {"level": "core"}),
    m.NodeCPUTopologyStatus(
        free=CPUSet.parse("2-7"),
        free_by_numa={0: CPUSet.parse("2-7")},
        allocations=(
            m.Allocation("ns", "p", "uid-1", "c", CPUSet.parse("0-1"), CPUSet.of(0), "exclusive"),
        ),
        heartbeat_time=T0,
        conditions=(m.Condition("Ready", "True", T0, "AgentRunning", "ok"),),
    ),
).to_dict()
GOOD_PCB = m.PodCPUBinding(
    m.ObjectMeta("b", namespace="ns"),
    m.PodCPUBindingSpec("p", "core", CPUSet.of(2), (m.ContainerCPUSet("app", CPUSet.of(3)),)),
    m.PodCPUBindingStatus("Applied", "worker-1", CPUSet.of(2, 3), CPUSet.of(0)),
).to_dict()


def _with(doc: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    node: Any = out
    steps = [int(s) if s.isdigit() else s for s in path.split("/")]
    for step in steps[:-1]:
        node = node[step]
    if value is _GONE:
        del node[steps[-1]]
    else:
        node[steps[-1]] = value
    return out


_GONE = object()

BAD_NCPT = [
    ("spec/reservedCPUs", "0-3,", "spec.reservedCPUs", "a CPU list with a stray comma"),
    ("spec/reservedCPUs", 3, "spec.reservedCPUs", "a CPU list given as a number"),
    ("spec/policy", "", "spec.policy", "an empty policy"),
    ("spec/policy", _GONE, "spec.policy", "no policy"),
    ("spec/options", {"level": 2}, "spec.options['level']", "an option that is not a string"),
    ("spec/topology", _GONE, "spec.topology", "no topology"),
    ("spec/topology/cpus", [], "spec.topology", "a topology without CPUs"),
    ("spec/topology/cpus/0/cpu", 9000, "spec.topology", "a CPU id beyond the limit"),
    ("spec/topology/cpus/1/cpu", 0, "spec.topology", "a CPU listed twice"),
    ("status/free", "x", "status.free", "a free list that is no CPU list"),
    ("status/freeByNUMA", {"zero": "1"}, "status.freeByNUMA", "a NUMA id that is no number"),
    ("status/freeByNUMA", {"0": "1", "00": "2"}, "status.freeByNUMA", "a NUMA id twice"),
    ("status/freeByL3", {"1": 5}, "status.freeByL3['1']", "a CPU list that is a number"),
    ("status/allocations/0/policy", "none", "status.allocations[0].policy", "policy none"),
    ("status/allocations/0/level", "Core", "status.allocations[0].level", "a CRD-case level"),
    ("status/allocations/0/qosClass", "Gold", "status.allocations[0].qosClass", "a QoS class"),
    ("status/allocations/0/qosClass", 3, "status.allocations[0].qosClass", "a class number"),
    ("status/allocations/0/podUID", _GONE, "status.allocations[0].podUID", "no pod uid"),
    ("status/allocations/0/cpus", "1-0", "status.allocations[0].cpus", "a range backwards"),
    ("status/allocations", [{}], "status.allocations[0].policy", "an allocation that is empty"),
    ("status/allocations", [1], "status.allocations[0]", "an allocation that is no object"),
    ("status/heartbeatTime", "15/01/2025", "status.heartbeatTime", "a time not RFC 3339"),
    ("status/heartbeatTime", "2025-02-30T00:00:00Z", "status.heartbeatTime", "February 30th"),
    ("status/conditions/0/status", "yes", "status.conditions[0].status", "a condition status"),
    ("status/conditions/0/reason", "bad reason", "status.conditions[0].reason", "a reason"),
    ("status/conditions/0/lastTransitionTime", _GONE, "status.conditions[0].lastTransitionTime",
     "a condition without time"),
    ("status/conditions", [{"type": "Ready", "status": "True", "reason": "A", "message": "",
      "lastTransitionTime": "2025-01-01T00:00:00Z"}] * 2, "status.conditions[1]", "a type twice"),
    ("metadata/name", "", "metadata.name", "an empty name"),
    ("metadata/labels", {"a": 1}, "metadata.labels['a']", "a label that is not a string"),
    ("kind", "PodCPUBinding", "kind", "the wrong kind"),
    ("apiVersion", "corepin.io/v1", "apiVersion", "the wrong version"),
    ("status", [], "status", "a status that is a list"),
]  # fmt: skip
BAD_PCB = [
    ("spec/podName", _GONE, "spec.podName", "no pod"),
    ("spec/exclusivenessLevel", "Rack", "spec.exclusivenessLevel", "an unknown level"),
    ("spec/exclusivenessLevel", "CORE", "spec.exclusivenessLevel", "upper case, as the CRD"),
    ("spec/cpuSet", [{"cpuID": 2}, {"cpuID": 2}], "spec.cpuSet[1].cpuID", "a CPU twice"),
    ("spec/cpuSet", [{"cpuID": -1}], "spec.cpuSet[0].cpuID", "a negative CPU"),
    ("spec/cpuSet", [{"cpuID": True}], "spec.cpuSet[0].cpuID", "a CPU that is a bool"),
    ("spec/cpuSet", [{"cpu": 1}], "spec.cpuSet[0].cpuID", "a misspelled cpuID"),
    ("spec/cpuSet", "2-3", "spec.cpuSet", "a CPU list string instead of rows"),
    ("spec/containers/0/cpuSet", [], "spec.containers[0].cpuSet", "a container without CPUs"),
    ("spec/containers/0/name", "", "spec.containers[0].name", "a container without a name"),
    ("spec/containers", [{"name": "a", "cpuSet": [{"cpuID": 1}]}] * 2, "spec.containers[1]",
     "a container twice"),
    ("status/phase", "Done", "status.phase", "an unknown phase"),
    ("status/mems", "0-", "status.mems", "memory nodes cut short"),
    ("status/qosClass", "be", "status.qosClass", "a QoS class in lower case"),
    ("metadata/namespace", _GONE, "metadata.namespace", "a binding without namespace"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("path", "value", "field", "what"), BAD_NCPT, ids=[row[3] for row in BAD_NCPT]
)
def test_node_cpu_topology_refuses(path: str, value: Any, field: str, what: str) -> None:
    m.NodeCPUTopology.from_dict(GOOD_NCPT)
    with pytest.raises(m.FieldError) as caught:
        m.NodeCPUTopology.from_dict(_with(GOOD_NCPT, path, value))
    assert caught.value.path == field, str(caught.value)
    assert str(caught.value).startswith(field + ":")
    assert caught.value.exit_code == 2 and isinstance(caught.value, ValueError)


@pytest.mark.parametrize(
    ("path", "value", "field", "what"), BAD_PCB, ids=[row[3] for row in BAD_PCB]
)
def test_pod_cpu_binding_refuses(path: str, value: Any, field: str, what: str) -> None:
    m.PodCPUBinding.from_dict(GOOD_PCB)
    with pytest.raises(m.FieldError) as caught:
        m.PodCPUBinding.from_dict(_with(GOOD_PCB, path, value))
    assert caught.value.path == field, str(caught.value)


def test_error_messages_show_the_bad_value() -> None:
    with pytest.raises(m.FieldError, match=r"status\.allocations\[0\]\.cpus: .*'1-0'"):
        m.NodeCPUTopology.from_dict(_with(GOOD_NCPT, "status/allocations/0/cpus", "1-0"))
    with pytest.raises(m.FieldError, match=r"spec\.exclusivenessLevel: .*'Rack'"):
        m.PodCPUBinding.from_dict(_with(GOOD_PCB, "spec/exclusivenessLevel", "Rack"))
    huge = "9" * 500
    with pytest.raises(m.FieldError) as caught:
        m.PodCPUBinding.from_dict(_with(GOOD_PCB, "status/cpus", huge))
    assert len(str(caught.value)) < 320  # long values and problems are cut in the message


def test_models_check_their_values_when_built_in_code() -> None:
    with pytest.raises(m.FieldError, match=r"allocation\.policy"):
        m.Allocation("n", "p", "u", "c", CPUSet.of(1), CPUSet(), "none")
    with pytest.raises(m.FieldError, match=r"status\.phase"):
        m.PodCPUBindingStatus("Running")
    with pytest.raises(m.FieldError, match="timezone-aware"):
        m.Condition("Ready", "True", datetime(2025, 1, 1), "R")
    with pytest.raises(m.FieldError, match="cluster scoped"):
        m.NodeCPUTopology(
            m.ObjectMeta("n", namespace="x"), m.NodeCPUTopology.from_dict(GOOD_NCPT).spec
        )
    with pytest.raises(m.FieldError, match="listed twice"):
        m.NodeCPUTopologyStatus(allocations=(
            m.Allocation("n", "p", "u", "c", CPUSet.of(1), CPUSet(), "share"),
            m.Allocation("n", "p", "u", "c", CPUSet.of(2), CPUSet(), "share"),
        ))  # fmt: skip


# ---------------------------------------------------------------------- levels, times, conditions
@pytest.mark.parametrize(
    ("text", "corepin", "crd_spelling"),
    [("None", "cpu", "CPU"), ("none", "cpu", "CPU"), ("CPU", "cpu", "CPU"), ("cpu", "cpu", "CPU"),
     ("Core", "core", "Core"), ("CORE", "core", "Core"), ("l3", "l3", "L3"), ("L3", "l3", "L3"),
     ("NUMA", "numa", "NUMA"), ("Numa", "numa", "NUMA"), ("socket", "socket", "Socket")],
)  # fmt: skip
def test_level_spellings(text: str, corepin: str, crd_spelling: str) -> None:
    assert m.corepin_level(text) == corepin
    assert m.crd_level(text) == crd_spelling
    assert m.corepin_level(m.crd_level(corepin)) == corepin


@pytest.mark.parametrize("text", ["", "rack", "cores", "L2", " cpu", 3, None])
def test_unknown_levels_are_refused(text: Any) -> None:
    with pytest.raises(m.FieldError):
        m.corepin_level(text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2025-01-15T10:00:00Z", T0),
        ("2025-01-15t10:00:00z", T0),
        ("2025-01-15T11:30:00+01:30", T0),
        ("2025-01-15T02:00:00-08:00", T0),
        ("2025-01-15T10:00:00.5Z", T0 + timedelta(microseconds=500000)),
        ("2025-01-15T10:00:00.123456789Z", T0 + timedelta(microseconds=123456)),
    ],
)
def test_times_are_read_as_rfc3339_in_utc(text: str, expected: datetime) -> None:
    parsed = m.parse_time(text, "t")
    assert parsed == expected and parsed.tzinfo == UTC


@pytest.mark.parametrize(
    "text", ["2025-01-15", "2025-01-15T10:00:00", "2025-01-15 10:00:00Z", "2025-13-01T00:00:00Z",
             "2025-01-15T10:00:00+24:00", "٢٠٢٥-01-15T10:00:00Z", ""],
)  # fmt: skip
def test_times_that_are_not_rfc3339_are_refused(text: str) -> None:
    with pytest.raises(m.FieldError, match=r"^t: "):
        m.parse_time(text, "t")


def test_times_are_written_in_utc_with_z() -> None:
    assert m.format_time(T0) == "2025-01-15T10:00:00Z"
    assert m.format_time(T0.astimezone(timezone(timedelta(hours=2)))) == "2025-01-15T10:00:00Z"
    assert m.format_time(T0 + timedelta(microseconds=7)) == "2025-01-15T10:00:00.000007Z"


def test_set_condition_keeps_the_transition_time_while_the_status_holds() -> None:
    ready = m.Condition("Ready", "True", T0, "AgentRunning", "ok")
    other = m.Condition("Degraded", "False", T0, "Fine")
    later = T0 + timedelta(minutes=5)
    same = m.set_condition((other, ready), m.Condition("Ready", "True", later, "AgentRunning", "2"))
    assert same[0] == other
    assert same[1].last_transition_time == T0 and same[1].message == "2"
    flipped = m.set_condition(same, m.Condition("Ready", "False", later, "Stale", "no heartbeat"))
    assert flipped[1].last_transition_time == later and flipped[1].status == "False"
    added = m.set_condition((other,), ready)
    assert added == (other, ready)
    assert m.find_condition(flipped, "Ready") == flipped[1]
    assert m.find_condition(flipped, "Missing") is None
    status = m.NodeCPUTopologyStatus(conditions=same)
    assert status.ready and not m.NodeCPUTopologyStatus(conditions=flipped).ready


# ---------------------------------------------------------------------- NodeResourceTopology
def test_node_resource_topology_has_one_cpu_zone_per_numa_node() -> None:
    topology = TOPOLOGIES["multi_numa_per_socket"]  # 4 NUMA nodes of 12 CPUs
    node0 = topology.cpus_in_numa_nodes(0)
    reserved = node0.lowest(2)
    free = topology.online_cpus - reserved - topology.cpus_in_numa_nodes(1).lowest(5)
    nrt = m.node_resource_topology(
        "worker-1", topology, free=free, reserved=reserved,
        manager_policy="single-numa-node", owner=m.node_owner("worker-1", "uid-9"),
    )  # fmt: skip
    assert nrt["apiVersion"] == "topology.node.k8s.io/v1alpha2"
    assert nrt["kind"] == "NodeResourceTopology"
    assert nrt["metadata"]["name"] == "worker-1"
    assert nrt["metadata"]["ownerReferences"][0]["kind"] == "Node"
    assert [z["name"] for z in nrt["zones"]] == ["node-0", "node-1", "node-2", "node-3"]
    cpu = {z["name"]: z["resources"][0] for z in nrt["zones"]}
    assert all(z["type"] == "Node" and z["resources"][0]["name"] == "cpu" for z in nrt["zones"])
    assert cpu["node-0"] == {
        "name": "cpu",
        "capacity": "12",
        "allocatable": "10",
        "available": "10",
    }
    assert cpu["node-1"] == {"name": "cpu", "capacity": "12", "allocatable": "12", "available": "7"}
    assert cpu["node-2"]["available"] == "12"
    costs = {c["name"]: c["value"] for c in nrt["zones"][0]["costs"]}
    assert costs["node-0"] == topology.numa_node(0).distances[0]
    attributes = {a["name"]: a["value"] for a in nrt["attributes"]}
    assert attributes == {
        "topologyManagerPolicy": "single-numa-node",
        "topologyManagerScope": "container",
    }
    assert nrt["topologyPolicies"] == ["SingleNUMANodeContainerLevel"]


def test_node_resource_topology_counts_online_cpus_only() -> None:
    topology = TOPOLOGIES["offline_cpus"]
    nrt = m.node_resource_topology("n", topology, free=topology.online_cpus)
    total = sum(int(z["resources"][0]["capacity"]) for z in nrt["zones"])
    assert total == len(topology.online_cpus) < len(topology.present_cpus)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"manager_policy": "strict"}, "topologyManagerPolicy"),
     ({"manager_scope": "node"}, "topologyManagerScope")],
)  # fmt: skip
def test_node_resource_topology_refuses_unknown_manager_settings(
    kwargs: dict[str, str], field: str
) -> None:
    topology = TOPOLOGIES["single_socket_ht"]
    with pytest.raises(m.FieldError, match=field):
        m.node_resource_topology("n", topology, free=CPUSet(), **kwargs)  # type: ignore[arg-type]


NRT_CRD = PEER_FIXTURES / "noderesourcetopology" / "crd.yaml"


@pytest.mark.parametrize("name", SMALL_TOPOLOGIES)
def test_node_resource_topology_matches_the_upstream_crd(name: str) -> None:
    if not NRT_CRD.exists():
        pytest.skip(f"{NRT_CRD} is not there")
    (definition,) = load_yaml_docs(NRT_CRD)
    schema = version_schema(definition, "v1alpha2")
    topology = TOPOLOGIES[name]
    nrt = m.node_resource_topology(name.replace("_", "-"), topology, free=topology.online_cpus)
    assert errors(schema, nrt) == []
    broken = copy.deepcopy(nrt)
    del broken["zones"][0]["resources"][0]["available"]
    assert errors(schema, broken) != []


# ---------------------------------------------------------------------- pod annotations
@pytest.mark.parametrize(
    ("annotations", "labels", "policy", "containers", "level", "workload"),
    [
        ({}, {}, "none", {}, "cpu", None),
        ({"corepin.io/cpu-policy": "exclusive"}, {}, "exclusive", {}, "cpu", None),
        ({"qos.gocrane.io/cpu-manager": "share"}, {}, "share", {}, "cpu", None),
        ({"corepin.io/cpu-policy": "none", "qos.gocrane.io/cpu-manager": "exclusive"}, {},
         "none", {}, "cpu", None),
        ({"corepin.io/cpu-policy.db": "exclusive", "corepin.io/cpu-policy.side": "none"}, {},
         "none", {"db": "exclusive", "side": "none"}, "cpu", None),
        ({"corepin.io/exclusiveness-level": "NUMA"}, {}, "none", {}, "numa", None),
        ({"corepin.io/exclusiveness-level": "None"}, {}, "none", {}, "cpu", None),
        ({"cslab.ece.ntua.gr/exclusiveness-level": "Socket"}, {}, "none", {}, "socket", None),
        ({"corepin.io/exclusiveness-level": "l3", "cslab.ece.ntua.gr/exclusiveness-level": "Core"},
         {}, "none", {}, "l3", None),
        ({"corepin.io/workload-type": "io-bound"}, {}, "none", {}, "cpu", "io-bound"),
        ({}, {"corepin.io/workload-type": "cpu-bound"}, "none", {}, "cpu", "cpu-bound"),
        ({}, {"cslab.ece.ntua.gr/workload-type": "MemoryBound"}, "none", {}, "cpu", "memory-bound"),
        ({"corepin.io/workload-type": "best-effort"},
         {"cslab.ece.ntua.gr/workload-type": "CPUBound"}, "none", {}, "cpu", "best-effort"),
        ({}, {"corepin.io/workload-type": "cpu-bound",
              "cslab.ece.ntua.gr/workload-type": "IOBound"},
         "none", {}, "cpu", "cpu-bound"),
    ],
    ids=[
        "no annotation means none",
        "the pod policy",
        "Crane's alias alone",
        "the corepin key wins over Crane's",
        "per container policies",
        "a level in any case",
        "None as a level means cpu",
        "actimanager's level alias",
        "the corepin level wins over actimanager's",
        "a workload annotation",
        "a workload label",
        "actimanager's workload label in its spelling",
        "the corepin annotation wins over actimanager's label",
        "the corepin label wins over actimanager's label",
    ],
)  # fmt: skip
def test_pod_annotations(
    annotations: dict[str, str],
    labels: dict[str, str],
    policy: str,
    containers: dict[str, str],
    level: str,
    workload: str | None,
) -> None:
    parsed = m.parse_pod_annotations(annotations, labels)
    assert parsed.policy == policy
    assert dict(parsed.containers) == containers
    assert parsed.level == level
    assert parsed.workload == workload
    assert parsed.explicit is bool(annotations or labels)


def test_container_policy_overrides_the_pods() -> None:
    parsed = m.parse_pod_annotations(
        {"corepin.io/cpu-policy": "exclusive", "corepin.io/cpu-policy.sidecar": "none"}
    )
    assert parsed.policy_for("app") == "exclusive"
    assert parsed.policy_for("sidecar") == "none"


@pytest.mark.parametrize(
    ("annotations", "labels", "key", "value"),
    [
        ({"corepin.io/cpu-policy": "Exclusive"}, {}, "corepin.io/cpu-policy", "Exclusive"),
        ({"corepin.io/cpu-policy": "dedicated"}, {}, "corepin.io/cpu-policy", "dedicated"),
        ({"corepin.io/cpu-policy.app": "pinned"}, {}, "corepin.io/cpu-policy.app", "pinned"),
        ({"corepin.io/cpu-policy.": "share"}, {}, "corepin.io/cpu-policy.", "share"),
        ({"qos.gocrane.io/cpu-manager": "static"}, {}, "qos.gocrane.io/cpu-manager", "static"),
        ({"corepin.io/cpu-policy": "share", "qos.gocrane.io/cpu-manager": "x"}, {},
         "qos.gocrane.io/cpu-manager", "x"),
        ({"corepin.io/exclusiveness-level": "rack"}, {}, "corepin.io/exclusiveness-level", "rack"),
        ({"cslab.ece.ntua.gr/exclusiveness-level": "L2"}, {},
         "cslab.ece.ntua.gr/exclusiveness-level", "L2"),
        ({"corepin.io/workload-type": "gpu-bound"}, {}, "corepin.io/workload-type", "gpu-bound"),
        ({}, {"cslab.ece.ntua.gr/workload-type": "Bursty"}, "cslab.ece.ntua.gr/workload-type",
         "Bursty"),
    ],
)  # fmt: skip
def test_malformed_annotations_name_the_key_and_the_value(
    annotations: dict[str, str], labels: dict[str, str], key: str, value: str
) -> None:
    with pytest.raises(m.FieldError) as caught:
        m.parse_pod_annotations(annotations, labels)
    assert caught.value.path == f"annotation {key}"
    assert repr(value) in str(caught.value)
    assert caught.value.reason == "bad_annotation"


def test_aliases_are_copied_to_corepin_keys_only_where_missing() -> None:
    assert m.aliases_to_copy(
        {
            "qos.gocrane.io/cpu-manager": "exclusive",
            "cslab.ece.ntua.gr/exclusiveness-level": "NUMA",
        },
        {"cslab.ece.ntua.gr/workload-type": "CPUBound"},
    ) == {
        "corepin.io/cpu-policy": "exclusive",
        "corepin.io/exclusiveness-level": "numa",
        "corepin.io/workload-type": "cpu-bound",
    }
    assert (
        m.aliases_to_copy(
            {"qos.gocrane.io/cpu-manager": "exclusive", "corepin.io/cpu-policy": "share"},
            {"corepin.io/workload-type": "io-bound", "cslab.ece.ntua.gr/workload-type": "CPUBound"},
        )
        == {}
    )
    assert m.aliases_to_copy({"corepin.io/cpu-policy": "share"}) == {}


def test_cpus_annotation_round_trips_and_names_bad_values() -> None:
    cpus = {"app": CPUSet.parse("2-3"), "side": CPUSet.of(8)}
    text = m.format_cpus_annotation(cpus)
    assert text == '{"app":"2-3","side":"8"}'
    assert m.parse_cpus_annotation(text) == cpus
    for bad in ['{"app": "2-"}', '["2-3"]', "{", '{"app": 2}', '{"": "1"}']:
        with pytest.raises(m.FieldError) as caught:
            m.parse_cpus_annotation(bad)
        assert caught.value.path == "annotation corepin.io/cpus" and bad in str(caught.value)


@pytest.mark.parametrize(
    ("annotations", "expected"),
    [
        ({}, None),
        ({"corepin.io/reservation": '{"resources": {"cpu": "2"}}'}, Reservation(2)),
        ({"node.koordinator.sh/reservation": '{"reservedCPUs": "0-1"}'},
         Reservation(0, CPUSet.parse("0-1"))),
        ({"corepin.io/reservation": '{"reservedCPUs": "4"}',
          "node.koordinator.sh/reservation": '{"reservedCPUs": "0-1"}'},
         Reservation(0, CPUSet.of(4))),
    ],
    ids=["none", "a count", "Koordinator's key", "the corepin key wins"],
)  # fmt: skip
def test_node_reservation(annotations: dict[str, str], expected: Reservation | None) -> None:
    assert m.parse_node_reservation(annotations) == expected


@pytest.mark.parametrize(
    ("cpu", "count"),
    [("1.5", 2), ("1500m", 2), ("2k", 2000), ("1e1", 10), (" 3 ", 3), (3, 3), ("-500m", 0)],
)
def test_a_reserved_cpu_count_is_any_kubernetes_quantity_rounded_up(
    cpu: str | int, count: int
) -> None:
    value = json.dumps({"resources": {"cpu": cpu}})
    assert m.parse_node_reservation({"corepin.io/reservation": value}) == Reservation(count)


@pytest.mark.parametrize(
    ("key", "value"),
    [("corepin.io/reservation", "two"), ("corepin.io/reservation", "[]"),
     ("node.koordinator.sh/reservation", '{"reservedCPUs": "0-"}'),
     ("corepin.io/reservation", '{"resources": {"cpu": "-1"}}'),
     ("corepin.io/reservation", '{"resources": "2"}')],
)  # fmt: skip
def test_bad_node_reservation_names_the_annotation(key: str, value: str) -> None:
    with pytest.raises(m.FieldError) as caught:
        m.parse_node_reservation({key: value})
    assert caught.value.path == f"annotation {key}" and repr(value) in str(caught.value)


# ---------------------------------------------------------------------- quantities, eligibility
@pytest.mark.parametrize(
    ("text", "value"),
    [("2", 2), ("2000m", 2), ("2.0", 2), ("2.", 2), (".5", Fraction(1, 2)),
     ("1500m", Fraction(3, 2)),
     ("+3", 3), ("-1", -1), ("1e3", 1000), ("1E-3", Fraction(1, 1000)), ("2k", 2000),
     ("1Ki", 1024), ("3Mi", 3 * 2**20), ("500u", Fraction(1, 2000)), ("100n", Fraction(1, 10**7)),
     ("1E", 10**18), (4, 4), (2.5, Fraction(5, 2))],
)  # fmt: skip
def test_quantities(text: str | int | float, value: Fraction | int) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize(
    "text",
    ["", "two", "2 ", "1.2.3", "2cpu", "1e", "0x10", "1e99999", "٣", True, None, [2], float("inf")],
)
def test_bad_quantities(text: Any) -> None:
    with pytest.raises(m.FieldError, match=r"^limits\.cpu: "):
        m.read_quantity(text, "limits.cpu")


def _container(limit: Any = None, request: Any = None) -> dict[str, Any]:
    resources: dict[str, Any] = {}
    if limit is not None:
        resources["limits"] = {"cpu": limit, "memory": "1Gi"}
    if request is not None:
        resources["requests"] = {"cpu": request}
    return {"name": "app", "image": "x", "resources": resources}


@pytest.mark.parametrize(
    ("container", "eligible", "cpus", "why"),
    [
        (_container("2", "2"), True, 2, ""),
        (_container("2000m", "2.0"), True, 2, ""),
        (_container("4"), True, 4, ""),
        (_container(3, "3000m"), True, 3, ""),
        (_container(None, "2"), False, 0, "no CPU limit"),
        (_container("1500m", "1500m"), False, 0, "not a whole number"),
        (_container("500m", "500m"), False, 0, "not a whole number"),
        (_container("0", "0"), False, 0, "not a whole number >= 1"),
        (_container("2", "1"), False, 0, "differs"),
        ({"name": "app"}, False, 0, "no CPU limit"),
    ],
    ids=["limit equals request", "the same quantity spelled differently", "a limit alone",
         "numbers from YAML", "a request alone", "a fraction", "less than one CPU", "zero",
         "request below limit", "no resources"],
)  # fmt: skip
def test_container_eligibility(container: Any, eligible: bool, cpus: int, why: str) -> None:
    result = m.container_eligibility(container)
    assert (result.eligible, result.cpus) == (eligible, cpus)
    assert why in result.reason and (result.reason == "") is eligible


def test_malformed_container_quantity_names_the_field() -> None:
    with pytest.raises(m.FieldError) as caught:
        m.container_eligibility(_container("2", "lots"), "spec.containers[0]")
    assert caught.value.path == "spec.containers[0].resources.requests.cpu"
    assert "'lots'" in str(caught.value)


# ---------------------------------------------------------------------- fuzzing
def _only_input_errors(call: Any, *args: Any) -> None:
    with contextlib.suppress(InputError):
        call(*args)


@settings(max_examples=examples(300))
@given(json_values)
def test_arbitrary_json_raises_only_input_errors(value: Any) -> None:
    for parser in (
        m.NodeCPUTopology.from_dict,
        m.PodCPUBinding.from_dict,
        m.Condition.from_dict,
        m.parse_pod_annotations,
        m.aliases_to_copy,
        m.parse_node_reservation,
        m.container_eligibility,
        parse_quantity,
        m.parse_cpus_annotation,
        m.corepin_level,
    ):
        _only_input_errors(parser, value)
    _only_input_errors(m.parse_cpus_annotation, json.dumps(value))
    _only_input_errors(m.parse_node_reservation, {"corepin.io/reservation": json.dumps(value)})


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, (*prefix, i))
    return out


def _replace(value: Any, path: tuple[Any, ...], new: Any) -> Any:
    if not path:
        return new
    out = copy.copy(value)
    out[path[0]] = _replace(value[path[0]], path[1:], new)
    return out


@settings(max_examples=examples(300))
@given(st.data(), st.sampled_from([GOOD_NCPT, GOOD_PCB]), json_values)
def test_valid_objects_with_one_part_replaced_raise_only_input_errors(
    data: st.DataObject, good: dict[str, Any], junk: Any
) -> None:
    path = data.draw(st.sampled_from(_paths(good)))
    broken = _replace(good, path, junk)
    model = m.NodeCPUTopology if good["kind"] == "NodeCPUTopology" else m.PodCPUBinding
    _only_input_errors(model.from_dict, broken)


annotation_keys = st.sampled_from(
    [m.ANN_CPU_POLICY, m.ANN_CPU_POLICY_PREFIX + "app", m.ANN_LEVEL, m.ANN_WORKLOAD,
     m.CRANE_CPU_MANAGER, m.ACTIMANAGER_LEVEL, m.ACTIMANAGER_WORKLOAD, m.ANN_RESERVATION,
     KOORDINATOR_RESERVATION, m.ANN_CPU_POLICY_PREFIX]
) | st.text(max_size=20)  # fmt: skip


@settings(max_examples=examples(300))
@given(st.dictionaries(annotation_keys, st.text(max_size=30) | json_values.map(json.dumps),
                       max_size=5),
       st.dictionaries(annotation_keys, st.text(max_size=30), max_size=3))  # fmt: skip
def test_arbitrary_annotations_raise_only_input_errors(
    annotations: dict[str, str], labels: dict[str, str]
) -> None:
    _only_input_errors(m.parse_pod_annotations, annotations, labels)
    _only_input_errors(m.aliases_to_copy, annotations, labels)
    _only_input_errors(m.parse_node_reservation, annotations)
    if m.ANN_CPUS in annotations:
        _only_input_errors(m.parse_cpus_annotation, annotations[m.ANN_CPUS])


# ---------------------------------------------------------------------- views of API objects
def test_a_view_reads_what_is_malformed_as_empty_and_never_raises() -> None:
    for raw in (None, [], "pod", {"metadata": [], "spec": 3, "status": "x"}):
        view = m.PodView(raw)
        assert (view.name, view.namespace, view.uid, view.resource_version) == ("", "", "", "")
        assert view.labels == {} and view.annotations == {} and not view.deleting
        assert view.containers == () and view.container_statuses == {}
        assert (view.phase, view.node_name) == ("", "")


def test_a_pod_view_reads_containers_statuses_and_string_metadata() -> None:
    raw = {
        "metadata": {"name": "web", "namespace": "shop", "uid": "u1", "resourceVersion": "7",
                     "labels": {"app": "web", "n": 3}, "annotations": {"a": "b"},
                     "deletionTimestamp": "2025-01-01T00:00:00Z"},
        "spec": {"nodeName": "node-a", "containers": [{"name": "app"}, 5, {"image": "x"}],
                 "initContainers": [{"name": "init"}]},
        "status": {"phase": "Running", "containerStatuses": [{"name": "app", "ready": True}, 1]},
    }  # fmt: skip
    view = m.PodView(raw)
    assert (view.name, view.namespace, view.uid, view.resource_version) == (
        "web",
        "shop",
        "u1",
        "7",
    )
    assert view.labels == {"app": "web"} and view.annotations == {"a": "b"} and view.deleting
    assert [c["name"] for c in view.containers] == ["app"]
    assert [c["name"] for c in view.init_containers] == ["init"]
    assert view.container_statuses == {"app": {"name": "app", "ready": True}}
    assert (view.phase, view.node_name) == ("Running", "node-a")


@pytest.mark.parametrize(
    ("raw", "path"),
    [([], "request.object"), ({"metadata": []}, "metadata"), ({"spec": "x"}, "spec"),
     ({"metadata": {"labels": {"a": 1}}}, "metadata.labels['a']"),
     ({"spec": {"containers": {}}}, "spec.containers"),
     ({"spec": {"containers": [{"name": "a"}, 3]}}, "spec.containers[1]"),
     ({"spec": {"containers": [{"image": "x"}]}}, "spec.containers[0].name")],
)  # fmt: skip
def test_a_checked_pod_view_names_the_first_malformed_field(raw: Any, path: str) -> None:
    with pytest.raises(m.FieldError) as caught:
        m.PodView.checked(raw, "request.object")
    assert caught.value.path == path


def test_objects_written_before_qos_classes_read_without_one() -> None:
    assert "qosClass" not in GOOD_NCPT["status"]["allocations"][0]
    [row] = m.NodeCPUTopology.from_dict(GOOD_NCPT).status.allocations  # type: ignore[union-attr]
    assert row.qos_class is None and "qosClass" not in row.to_dict()
    status = m.PodCPUBinding.from_dict(GOOD_PCB).status
    assert status is not None and status.qos_class is None
    told = _with(GOOD_NCPT, "status/allocations/0/qosClass", "LSR")
    [row] = m.NodeCPUTopology.from_dict(told).status.allocations  # type: ignore[union-attr]
    assert row.qos_class == "LSR" and row.to_dict()["qosClass"] == "LSR"


@pytest.mark.parametrize(
    ("annotations", "labels", "expected"),
    [
        ({}, {}, None),
        ({"corepin.io/qos-class": "BE"}, {}, ("corepin.io/qos-class", "BE")),
        ({}, {"koordinator.sh/qosClass": "LS"}, ("koordinator.sh/qosClass", "LS")),
        ({"koordinator.sh/qosClass": "LSR"}, {}, ("koordinator.sh/qosClass", "LSR")),
        (
            {"corepin.io/qos-class": "gold", "koordinator.sh/qosClass": "LS"},
            {},
            ("corepin.io/qos-class", "gold"),
        ),
    ],
)
def test_the_qos_class_a_pod_names_is_read_unchecked(
    annotations: dict[str, str], labels: dict[str, str], expected: tuple[str, str] | None
) -> None:
    assert m.qos_class_request(annotations, labels) == expected
