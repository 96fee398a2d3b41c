"""HostState / Assignment / owners: immutable values, pure updates, derived pools."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_state_helpers import machine

from corepin.core.cpuset import CPUSet
from corepin.core.errors import AllocationError, RequestError
from corepin.core.record import FrozenInstanceError, replace
from corepin.state import (
    STRICT_RESERVATION,
    Assignment,
    ContainerOwner,
    HostState,
    ProcessOwner,
    fingerprint,
)
from support.budget import examples

C = CPUSet.parse


def base(**kw: object) -> HostState:
    return HostState(online=C("0-7"), reserved=C("0"), **kw)  # type: ignore[arg-type]


def test_an_exclusive_assignment_defaults_its_withheld_set_to_its_cpus() -> None:
    a = Assignment("run/1", cpus=C("2-3"))
    assert a.withheld == C("2-3")
    assert a.exclusive and not a.with_shared and a.holds


def test_a_mixed_assignment_runs_on_its_cpus_plus_the_shared_pool() -> None:
    a = Assignment("run/1", kind="mixed", cpus=C("2"))
    assert a.affinity(C("4-7")) == C("2,4-7")
    assert Assignment("s", kind="shared").affinity(C("4-7")) == C("4-7")
    assert Assignment("e", cpus=C("2")).affinity(C("4-7")) == C("2")


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"id": ""}, "non-empty"),
        ({"id": "a\nb"}, "control"),
        ({"id": "x", "kind": "greedy"}, "kind must be one of"),
        ({"id": "x", "kind": "exclusive"}, "holds no CPUs"),
        ({"id": "x", "kind": "shared", "withheld": C("1")}, "shared but withholds"),
        ({"id": "x", "cpus": C("1-2"), "withheld": C("1")}, "must contain cpus"),
        ({"id": "x", "cpus": C("1"), "level": "rack"}, "level must be one of"),
        ({"id": "x", "cpus": C("1"), "workload": "gpu"}, "workload must be one of"),
        ({"id": "x", "cpus": C("1"), "owner": "pid 3"}, "owner must be"),
    ],
    ids=[
        "an empty id is refused",
        "an id with a newline is refused",
        "an unknown kind is refused",
        "an exclusive assignment without CPUs is refused",
        "a shared assignment withholding CPUs is refused",
        "a withheld set not containing the cpus is refused",
        "an unknown level is refused",
        "an unknown workload family is refused",
        "an untyped owner is refused",
    ],
)
def test_invalid_assignments_raise_request_error_naming_the_problem(
    kwargs: dict[str, object], fragment: str
) -> None:
    with pytest.raises(RequestError, match=fragment):
        Assignment(**kwargs)  # type: ignore[arg-type]


def test_states_are_immutable_and_their_mappings_read_only() -> None:
    s = base().add(Assignment("a", cpus=C("2")))
    with pytest.raises(FrozenInstanceError):
        s.revision = 5  # type: ignore[misc]
    with pytest.raises(TypeError):
        s.assignments["b"] = Assignment("b", cpus=C("3"))  # type: ignore[index]
    with pytest.raises(TypeError):
        s.options["x"] = "y"  # type: ignore[index]
    with pytest.raises(FrozenInstanceError):
        ProcessOwner(5).pid = 6  # type: ignore[misc]


def test_add_returns_a_new_state_and_leaves_the_old_one_unchanged() -> None:
    s0 = base()
    s1 = s0.add(Assignment("a", cpus=C("2-3")))
    assert "a" not in s0 and "a" in s1
    assert s0.exclusive_cpus == C("") and s1.exclusive_cpus == C("2-3")


def test_derived_pools_follow_the_kubelet_rules_for_reserved_cpus() -> None:
    s = base().add(Assignment("a", cpus=C("2-3"), withheld=C("2-3,6-7"), level="core"))
    s = s.add(Assignment("sh", kind="shared"))
    assert s.exclusive_cpus == C("2-3,6-7")
    assert s.shared_pool == C("0-1,4-5"), "reserved CPU 0 stays in the shared pool by default"
    assert s.free == C("1,4-5")
    strict = s.with_options({STRICT_RESERVATION: "true"})
    assert strict.shared_pool == C("1,4-5")
    assert strict.free == C("1,4-5")
    assert [a.id for a in s.shared_assignments()] == ["sh"]
    assert s.owner_of(6) == "a" and s.owner_of(5) is None


@pytest.mark.parametrize(
    ("assignment", "reason"),
    [
        (Assignment("b", cpus=C("3-4")), "cpus_taken"),
        (Assignment("b", cpus=C("0")), "cpus_reserved"),
        (Assignment("b", cpus=C("9")), "cpus_offline"),
    ],
    ids=[
        "CPUs held by another exclusive assignment are refused",
        "reserved CPUs are never handed out",
        "CPUs that are not online are refused",
    ],
)
def test_add_refuses_conflicting_exclusive_cpus(assignment: Assignment, reason: str) -> None:
    s = base().add(Assignment("a", cpus=C("2-3")))
    with pytest.raises(AllocationError) as info:
        s.add(assignment)
    assert info.value.reason == reason
    assert assignment.id in str(info.value)


def test_add_refuses_a_duplicate_id_and_remove_an_unknown_one() -> None:
    s = base().add(Assignment("a", cpus=C("2")))
    with pytest.raises(RequestError, match="already exists"):
        s.add(Assignment("a", cpus=C("5")))
    with pytest.raises(RequestError, match="no assignment"):
        s.remove("zzz")
    assert s.remove("zzz", missing_ok=True) is s
    assert "a" not in s.remove("a")
    assert s.remove_many(["a", "q"]).assignments == {}


def test_replace_assignment_swaps_cpus_of_the_same_id() -> None:
    s = base().add(Assignment("a", cpus=C("2")))
    s2 = s.replace_assignment(Assignment("a", cpus=C("2-4")))
    assert s2.assignments["a"].cpus == C("2-4")


def test_new_state_takes_online_cpus_and_fingerprint_from_the_topology() -> None:
    topo = machine(8, offline=[7])
    s = HostState.new(topo, reserved=C("0"))
    assert s.online == C("0-6")
    assert s.topology == fingerprint(topo) and s.topology.startswith("sha256:")
    assert fingerprint(machine(8)) != s.topology
    assert fingerprint(machine(8, offline=[7])) == s.topology, "fingerprints are deterministic"


ids = st.integers(min_value=0, max_value=15)


@settings(max_examples=examples(120))
@given(st.lists(st.tuples(st.sets(ids, min_size=1, max_size=4), st.booleans()), max_size=12))
def test_any_sequence_of_adds_keeps_exclusive_sets_disjoint_and_pools_partitioned(
    requests: list[tuple[set[int], bool]],
) -> None:
    s = HostState(online=CPUSet.range(0, 15), reserved=C("0-1"))
    for i, (cpus, shared) in enumerate(requests):
        a = Assignment(f"s{i}", kind="shared") if shared else Assignment(f"e{i}", cpus=CPUSet(cpus))
        try:
            s = s.add(a)
        except AllocationError:
            continue
    assert s.overlaps() == []
    assert not (s.exclusive_cpus & s.reserved)
    assert s.shared_pool | s.exclusive_cpus == s.online
    assert not (s.shared_pool & s.exclusive_cpus)
    assert s.free == s.shared_pool - s.reserved


def test_evolving_the_cpus_of_a_cpu_level_assignment_moves_its_withheld_set_too() -> None:
    a = Assignment("a", cpus=C("2"))
    assert a.evolve(cpus=C("3-4")).withheld == C("3-4")
    core = Assignment("b", cpus=C("2"), withheld=C("2,6"), level="core")
    assert core.evolve(owner=ProcessOwner(5)).withheld == C("2,6")
    with pytest.raises(RequestError, match="must contain cpus"):
        core.evolve(cpus=C("3"))


def test_a_share_assignment_is_held_but_stays_in_the_shared_pool() -> None:
    s = base().add(Assignment("sh", kind="share", cpus=C("4-5")))
    assert s.shared_pool == C("0-7")
    assert s.free == C("1-3,6-7")
    assert s.held == C("4-5") and s.exclusive_cpus == C("")
    assert s.get("sh") is not None and s.get("sh").affinity(C("0-7")) == C("4-5")  # type: ignore[union-attr]
    with pytest.raises(AllocationError) as info:
        s.add(Assignment("e", cpus=C("5")))
    assert info.value.reason == "cpus_taken" and "held by sh" in str(info.value)


def test_isolated_cpus_are_free_but_never_in_the_shared_pool() -> None:
    s = HostState(online=C("0-3"), isolated=C("1"))
    assert s.shared_pool == C("0,2-3")
    assert s.free == C("0-3")
    infra = HostState(online=C("0-3"), infra=C("3"))
    assert infra.shared_pool == C("0-2") and infra.free == C("0-2")


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"pid": 0}, "pid 0"),
        ({"pid": -3}, "non-negative"),
        ({"pid": 5, "start_time": True}, "start_time"),
        ({"pid": 5, "cgroup": "corepin/a\nb"}, "control"),
        ({"pid": 5, "members": ((1,),)}, "pairs"),
    ],
    ids=[
        "pid 0 is not a process",
        "a negative pid is refused",
        "a boolean start time is refused",
        "a cgroup path with a newline is refused",
        "a member without a start time is refused",
    ],
)
def test_invalid_process_owners_are_refused(kwargs: dict[str, object], fragment: str) -> None:
    with pytest.raises(RequestError, match=fragment):
        ProcessOwner(**kwargs)  # type: ignore[arg-type]


def test_process_owner_labels_may_hold_any_text_and_members_are_kept_sorted() -> None:
    owner = ProcessOwner(7, 100, name="evil\nrow", command="sh -c 'a\nb'", members=((9, 3), (8, 2)))
    assert owner.name == "evil\nrow"
    assert owner.members == ((8, 2), (9, 3))


def test_container_identity_is_pod_uid_and_name_and_survives_a_restart() -> None:
    first = ContainerOwner(pod_uid="u1", container="app", container_id="aaa", qos="guaranteed")
    restarted = replace(first, container_id="bbb")
    assert first.key == restarted.key == "u1/app"
    s = base().add(Assignment("pod/u1/app", cpus=C("2"), owner=restarted))
    found = s.find_container("u1", "app")
    assert found is not None and found.container == restarted
    assert s.find_container("u1", "other") is None
    assert ContainerOwner(container_id="abc").key == "container/abc"
    with pytest.raises(RequestError, match="pod uid or a container id"):
        ContainerOwner()
    with pytest.raises(RequestError, match="QoS"):
        ContainerOwner(pod_uid="u", container="c", qos="premium")
    with pytest.raises(RequestError, match="no pod uid"):
        ContainerOwner(container="c", container_id="x")
