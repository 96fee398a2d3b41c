"""Restored state against the live topology: repair what is safe, refuse what is not."""

from __future__ import annotations

import contextlib
import logging

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_state_helpers import machine

from corepin.core.cpuset import CPUSet
from corepin.core.errors import AllocationError, StateError
from corepin.state import STRICT_RESERVATION, Assignment, HostState, fingerprint, validate
from corepin.state.owners import ProcessOwner
from support.budget import examples

C = CPUSet.parse


def restored(**kw: object) -> HostState:
    """A state recorded on the 8-CPU, 2-node machine (node 0: CPUs 0-1,4-5; node 1: 2-3,6-7)."""
    topo = machine(8)
    s = HostState.new(topo, reserved=C("0"))
    s = s.add(Assignment("run/a", cpus=C("1"), mems=C("0"), owner=ProcessOwner(10, 1)))
    s = s.add(
        Assignment(
            "run/b",
            cpus=C("2"),
            withheld=C("2,6"),
            mems=C("1"),
            level="core",
            owner=ProcessOwner(11),
        )
    )
    s = s.add(Assignment("run/s", kind="shared", owner=ProcessOwner(12)))
    return s.evolve(**kw) if kw else s


def test_an_unchanged_machine_needs_no_repair() -> None:
    s = restored()
    out, changes = validate(s, machine(8))
    assert out == s and changes == []


def test_a_shared_cpu_going_offline_shrinks_the_shared_pool_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    s = restored()
    assert s.shared_pool == C("0,3-5,7")
    with caplog.at_level(logging.INFO, logger="corepin.state"):
        out, changes = validate(s, machine(8, offline=[7]))
    assert out.online == C("0-6") and out.shared_pool == C("0,3-5")
    assert out.topology == fingerprint(machine(8, offline=[7]))
    assert any(c.startswith("event=online_changed") and "offline=7" in c for c in changes)
    assert any(c.startswith("event=topology_changed") for c in changes)
    assert "event=shared_pool_changed old=0,3-5,7 new=0,3-5 removed=7 added=-" in changes
    assert [r.getMessage() for r in caplog.records] == changes, "every change is logged"
    assert out.assignments == s.assignments, "no allocation moved"


def test_a_cpu_coming_online_grows_the_shared_pool() -> None:
    s = restored(online=C("0-6"))
    out, changes = validate(s, machine(8))
    assert out.shared_pool == C("0,3-5,7")
    assert "event=shared_pool_changed old=0,3-5 new=0,3-5,7 removed=- added=7" in changes


def test_a_withheld_sibling_going_offline_is_dropped_from_the_level_reservation() -> None:
    out, changes = validate(restored(), machine(8, offline=[6]))
    assert out.assignments["run/b"].withheld == C("2")
    assert out.assignments["run/b"].cpus == C("2")
    assert "event=withheld_dropped id=run/b cpus=6 cause=offline old=2,6 new=2" in changes


def test_an_offline_reserved_cpu_is_dropped_from_the_reserved_set() -> None:
    s = restored(reserved=C("0,7"))
    out, changes = validate(s, machine(8, offline=[7]))
    assert out.reserved == C("0")
    assert "event=reserved_dropped cpus=7 cause=offline old=0,7 new=0" in changes


def test_missing_mems_are_recomputed_from_the_topology() -> None:
    s = restored()
    s = s.replace_assignment(s.assignments["run/b"].evolve(mems=C("")))
    out, changes = validate(s, machine(8))
    assert out.assignments["run/b"].mems == C("1")
    assert "event=mems_recomputed id=run/b old=- new=1" in changes


def test_a_new_reserved_set_that_touches_no_allocation_is_adopted() -> None:
    out, changes = validate(restored(), machine(8), reserved=C("0,3"))
    assert out.reserved == C("0,3")
    assert "event=reserved_changed old=0 new=0,3" in changes
    strict = restored(options={STRICT_RESERVATION: "true"})
    out2, _ = validate(strict, machine(8), reserved=C("0,3"))
    assert 3 not in out2.shared_pool


@pytest.mark.parametrize(
    ("offline", "absent", "fragment"),
    [
        ([1], [], "CPUs 1 are offline"),
        ([], [2, 6], "CPUs 2 are not present on this machine"),
    ],
    ids=[
        "an exclusive CPU that went offline is refused",
        "an exclusive CPU that disappeared from the machine is refused",
    ],
)
def test_an_exclusive_allocation_losing_cpus_is_refused_with_advice(
    offline: list[int], absent: list[int], fragment: str
) -> None:
    topo = machine(8, offline=offline, absent=absent)
    with pytest.raises(StateError) as info:
        validate(restored(), topo)
    msg = str(info.value)
    assert info.value.exit_code == 4 and info.value.reason == "unsafe_state"
    assert fragment in msg and "corepin changed nothing" in msg
    assert "echo 1 > /sys/devices/system/cpu/cpu" in msg and "corepin reconcile --once" in msg


def test_overlapping_exclusive_allocations_are_refused() -> None:
    s = restored()
    items = dict(s.assignments)
    items["run/c"] = Assignment("run/c", cpus=C("1,3"))  # bypasses add(): a hand-edited file
    bad = s.evolve(assignments=items)
    with pytest.raises(StateError) as info:
        validate(bad, machine(8))
    assert "'run/a' and 'run/c' both withhold CPUs 1" in str(info.value)


def test_a_reserved_set_covering_an_allocation_is_refused() -> None:
    with pytest.raises(StateError, match=r"'run/a' holds CPUs 1 which are configured as reserved"):
        validate(restored(), machine(8), reserved=C("0-1"))


def test_refusal_lists_every_problem_at_once() -> None:
    with pytest.raises(StateError) as info:
        validate(restored(), machine(8, offline=[1, 2]))
    assert "'run/a'" in str(info.value) and "'run/b'" in str(info.value)


@settings(max_examples=examples(60))
@given(
    st.lists(st.sets(st.integers(0, 15), min_size=1, max_size=3), max_size=5),
    st.sets(st.integers(1, 15), max_size=4),
)
def test_validation_refuses_exactly_when_an_exclusive_cpu_is_gone_and_never_moves_cpus(
    claims: list[set[int]], offline: set[int]
) -> None:
    full = machine(16)
    s = HostState.new(full, reserved=C("0"))
    for i, cpus in enumerate(claims):
        with contextlib.suppress(AllocationError):
            s = s.add(Assignment(f"run/{i}", cpus=CPUSet(cpus), mems=full.mems_of(CPUSet(cpus))))
    topo = machine(16, offline=offline)
    held = CPUSet.from_bits(sum(a.cpus.bits for a in s))
    try:
        out, changes = validate(s, topo)
    except StateError:
        assert held & CPUSet(offline), "refused although no allocated CPU went away"
        return
    assert not (held & CPUSet(offline))
    assert {k: a.cpus for k, a in out.assignments.items()} == {
        k: a.cpus for k, a in s.assignments.items()
    }
    assert out.online == topo.online_cpus and out.shared_pool <= topo.online_cpus
    assert not (out.exclusive_cpus - topo.online_cpus)
    assert bool(changes) == bool(offline)
    again, more = validate(out, topo)
    assert again == out and more == [], "validation is idempotent"
