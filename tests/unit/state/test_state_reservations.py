"""Reservations in the state model: CPUs held for a workload yet to come, given to exactly that
workload, released as one-time or reusable, expired, carried by the checkpoint and dropped on
restore when they no longer fit."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from corepin.core.cpuset import CPUSet
from corepin.core.errors import AllocationError, RequestError, StateFormatError
from corepin.state import Assignment, HostState, ProcessOwner
from corepin.state.checkpoint import decode_checkpoint, encode_checkpoint
from corepin.state.move import move_assignment
from corepin.state.payload import payload_to_state, state_to_payload
from corepin.state.reservations import Reservation, check_name
from corepin.state.validate import validate
from corepin.topology.model import CPUInfo, Topology

C = CPUSet.parse


def base() -> HostState:
    return HostState(online=C("0-7")).add_reservation(
        Reservation("db", C("4-5"), expires=1000.0, created=10.0)
    )


def run(ident: str, cpus: str, reservation: str | None = None) -> Assignment:
    return Assignment(ident, cpus=C(cpus), owner=ProcessOwner(100, 1), reservation=reservation)


def test_reserved_cpus_leave_the_free_set_and_the_shared_pool() -> None:
    s = base()
    assert s.free == C("0-3,6-7")
    assert s.shared_pool == C("0-3,6-7")
    assert s.owner_of(5) == "reservation db"


def test_another_workload_is_refused_the_reserved_cpus_naming_the_reservation() -> None:
    with pytest.raises(AllocationError, match="reservation db") as err:
        base().add(run("other", "5-6"))
    assert err.value.reason == "cpus_taken"


def test_the_workload_it_is_for_gets_the_cpus_and_the_reservation_is_in_use() -> None:
    s = base().add(run("r1", "4-5", "db"))
    assert s.reservations["db"].consumed_by == ("r1",)
    assert s.overlaps() == []
    assert s.free == C("0-3,6-7")
    with pytest.raises(AllocationError) as err:
        s.add(run("r2", "4", "db"))
    assert err.value.reason == "reservation_in_use"


def test_an_unknown_reservation_is_refused() -> None:
    with pytest.raises(AllocationError) as err:
        base().add(run("r1", "4-5", "nope"))
    assert err.value.reason == "unknown_reservation"


def test_cpus_beyond_the_reservation_must_be_free() -> None:
    s = base().add(run("busy", "6"))
    with pytest.raises(AllocationError, match="outside reservation 'db'"):
        s.add(run("r1", "4-6", "db"))
    assert base().add(run("r1", "3-5", "db")).assignments["r1"].cpus == C("3-5")


def test_a_one_time_reservation_ends_with_its_workload() -> None:
    s = base().add(run("r1", "4-5", "db")).remove("r1")
    assert "db" not in s.reservations
    assert s.free == C("0-7")


def test_a_reusable_reservation_comes_back_when_its_workload_ends() -> None:
    s = HostState(online=C("0-7")).add_reservation(Reservation("db", C("4-5"), reusable=True))
    s = s.add(run("r1", "4-5", "db")).remove_many(["r1"])
    assert s.reservations["db"].available
    assert s.free == C("0-3,6-7")
    assert s.add(run("r2", "4-5", "db")).reservations["db"].consumed_by == ("r2",)


def test_replacing_the_workload_on_its_reservation_keeps_the_reservation() -> None:
    s = base().add(run("r1", "4-5", "db"))
    moved = s.replace_assignment(run("r1", "4", "db"))
    assert moved.reservations["db"].consumed_by == ("r1",)
    assert moved.assignments["r1"].cpus == C("4")


def test_expiry_drops_only_reservations_whose_ttl_ran_out() -> None:
    s = base().add_reservation(Reservation("forever", C("6")))
    kept, gone = s.expire_reservations(999.0)
    assert kept is s and gone == ()
    kept, gone = s.expire_reservations(1000.0)
    assert [r.name for r in gone] == ["db"]
    assert list(kept.reservations) == ["forever"]
    assert kept.free == C("0-5,7")


def test_a_reservation_on_taken_or_reserved_cpus_is_refused() -> None:
    s = HostState(online=C("0-7"), reserved=C("0")).add(run("busy", "2"))
    with pytest.raises(AllocationError, match="already held by busy"):
        s.add_reservation(Reservation("x", C("2-3")))
    with pytest.raises(AllocationError) as err:
        s.add_reservation(Reservation("x", C("0-1")))
    assert err.value.reason == "cpus_reserved"
    with pytest.raises(RequestError, match="already exists"):
        base().add_reservation(Reservation("db", C("6")))


@pytest.mark.parametrize(
    "name",
    ["", "UPPER", "-lead", "trail-", "sp ace", "x" * 254, 7],
    ids=["empty", "upper case", "leading dash", "trailing dash", "space", "too long", "number"],
)
def test_a_bad_reservation_name_is_refused_naming_it(name: object) -> None:
    with pytest.raises(RequestError, match="reservation name"):
        check_name(name)


def test_reservations_round_trip_through_the_checkpoint() -> None:
    s = base().add(run("r1", "4-5", "db")).add_reservation(Reservation("web", C("7"), uid="u1"))
    back = decode_checkpoint(encode_checkpoint(s), "mem")
    assert back == s
    assert back.reservations["web"].uid == "u1"
    assert back.assignments["r1"].reservation == "db"


def test_a_checkpoint_without_reservations_still_reads() -> None:
    payload = state_to_payload(HostState(online=C("0-3")).add(run("a", "1")))
    del payload["reservations"]
    for row in payload["assignments"]:
        del row["reservation"]
    assert payload_to_state(payload, "old").reservations == {}


@pytest.mark.parametrize(
    ("key", "value", "path"),
    [
        ("cpus", "x", "payload.reservations[0] (name 'db').cpus"),
        ("expires", "soon", "payload.reservations[0] (name 'db').expires"),
        ("reusable", "yes", "payload.reservations[0] (name 'db').reusable"),
    ],
    ids=["bad cpus", "bad expiry", "bad reusable"],
)
def test_a_bad_reservation_row_names_its_path(key: str, value: object, path: str) -> None:
    payload = state_to_payload(base())
    payload["reservations"][0][key] = value
    with pytest.raises(StateFormatError, match=re.escape(path)):
        payload_to_state(payload, "f")


def topology(online: str) -> Topology:
    cpus = C(online)
    return Topology(
        [
            CPUInfo(cpu=c, numa=0, core=c, l3=0) if c in cpus else CPUInfo.offline(c)
            for c in range(8)
        ]
    )


def test_restore_drops_a_reservation_whose_cpus_went_offline_or_became_reserved() -> None:
    s = base().add_reservation(Reservation("web", C("1")))
    out, changes = validate(s, topology("0-4,6-7"), reserved=C("1"))
    assert out.reservations == {}
    assert any("name=db" in c and "offline" in c for c in changes)
    assert any("name=web" in c and "reserved" in c for c in changes)


@given(
    st.lists(st.integers(0, 15), min_size=1, max_size=6, unique=True),
    st.lists(st.tuples(st.integers(0, 15), st.integers(1, 3)), max_size=8),
)
def test_no_workload_but_its_own_ever_holds_a_reserved_cpu(
    reserved: list[int], attempts: list[tuple[int, int]]
) -> None:
    held = CPUSet(reserved)
    s = HostState(online=C("0-15")).add_reservation(Reservation("r", held))
    for i, (first, size) in enumerate(attempts):
        cpus = CPUSet(range(first, min(first + size, 16)))
        try:
            s = s.add(run(f"w{i}", str(cpus)))
        except AllocationError:
            continue
    for a in s:
        assert not a.withheld & held
    assert held <= C("0-15") - s.free
    assert not held & s.shared_pool


def test_a_workload_on_an_ended_reservation_keeps_its_cpus_as_its_own() -> None:
    used = base().add(run("r1", "4-5", "db"))
    for after in (used.remove_reservation("db"), used.expire_reservations(1000.0)[0]):
        assert "db" not in after.reservations
        mine = after.assignments["r1"]
        assert mine.reservation is None and mine.cpus == C("4-5")
        assert not C("4-5") & after.free
        assert after.remove("r1").free == C("0-7")


def test_a_move_keeps_size_kind_and_level_and_refuses_a_workload_on_a_reservation() -> None:
    state = base().add(Assignment("m", kind="mixed", cpus=C("0-1"), owner=ProcessOwner(1, 1)))
    moved, old, new = move_assignment(state, "m", C("2-3"), CPUSet(), C("0"))
    assert (old.cpus, new.cpus, new.kind, new.withheld) == (C("0-1"), C("2-3"), "mixed", C("2-3"))
    assert C("0-1") <= moved.free and not C("2-3") & moved.free
    with pytest.raises(AllocationError, match="cannot move 'm'"):
        move_assignment(state, "m", C("4-5"), CPUSet(), C("0"))  # the reservation's
    on = state.add(run("r1", "4-5", "db"))
    with pytest.raises(RequestError, match="reservation 'db'"):
        move_assignment(on, "r1", C("6-7"), CPUSet(), C("0"))
