"""HostState / Assignment: immutable values, pure updates, derived pools."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corepin.core.cpuset import CPUSet
from corepin.core.errors import AllocationError, RequestError
from corepin.state import STRICT_RESERVATION, Assignment, HostState, fingerprint
from test_state_helpers import machine

C = CPUSet.parse


def base(**kw: object) -> HostState:
    return HostState(online=C("0-7"), reserved=C("0"), **kw)  # type: ignore[arg-type]


def test_an_exclusive_assignment_defaults_its_reserved_set_to_its_cpus() -> None:
    a = Assignment("run/1", cpus=C("2-3"))
    assert a.reserved == C("2-3")
    assert a.exclusive and not a.with_shared


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
        ({"id": "x", "kind": "shared", "cpus": C("1")}, "shared but holds"),
        ({"id": "x", "cpus": C("1-2"), "reserved": C("1")}, "must contain cpus"),
        ({"id": "x", "cpus": C("1"), "pid": -3}, "pid must be a non-negative"),
        ({"id": "x", "cpus": C("1"), "pid": 0}, "pid 0"),
        ({"id": "x", "cpus": C("1"), "start_time": True}, "start_time"),
    ],
    ids=[
        "an empty id is refused",
        "an id with a newline is refused",
        "an unknown kind is refused",
        "an exclusive assignment without CPUs is refused",
        "a shared assignment with exclusive CPUs is refused",
        "a reserved set not containing the cpus is refused",
        "a negative pid is refused",
        "pid 0 is refused",
        "a boolean start time is refused",
    ],
)
def test_invalid_assignments_raise_request_error_naming_the_problem(
    kwargs: dict[str, object], fragment: str
) -> None:
    with pytest.raises(RequestError, match=fragment):
        Assignment(**kwargs)  # type: ignore[arg-type]


def test_states_are_immutable_and_their_mappings_read_only() -> None:
    s = base().add(Assignment("a", cpus=C("2")))
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.revision = 5  # type: ignore[misc]
    with pytest.raises(TypeError):
        s.assignments["b"] = Assignment("b", cpus=C("3"))  # type: ignore[index]
    with pytest.raises(TypeError):
        s.options["x"] = "y"  # type: ignore[index]
    with pytest.raises(TypeError):
        s.assignments["a"].meta["k"] = "v"  # type: ignore[index]


def test_add_returns_a_new_state_and_leaves_the_old_one_unchanged() -> None:
    s0 = base()
    s1 = s0.add(Assignment("a", cpus=C("2-3")))
    assert "a" not in s0 and "a" in s1
    assert s0.exclusive_cpus == C("") and s1.exclusive_cpus == C("2-3")


def test_derived_pools_follow_the_kubelet_rules_for_reserved_cpus() -> None:
    s = base().add(Assignment("a", cpus=C("2-3"), reserved=C("2-3,6-7"), level="core"))
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


@settings(max_examples=120, deadline=None)
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


def test_evolving_the_cpus_of_a_cpu_level_assignment_moves_its_reserved_set_too() -> None:
    a = Assignment("a", cpus=C("2"))
    assert a.evolve(cpus=C("3-4")).reserved == C("3-4")
    core = Assignment("b", cpus=C("2"), reserved=C("2,6"), level="core")
    assert core.evolve(pid=5).reserved == C("2,6")
    with pytest.raises(RequestError, match="must contain cpus"):
        core.evolve(cpus=C("3"))
