"""Host reservations on synthetic machines (a state directory in tmp, no processes): `reserve`
chooses CPUs exactly as a run's decision would, withholds whole units of its level, never
overlaps what is held; runs never get reserved CPUs; expiry and deletion leave a run on a
reservation its CPUs; `Assignment.rebalance` survives the checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import support.alloc_topologies as T
from corepin.agent.host.agent import HostAgent
from corepin.agent.host.reserve import (
    delete,
    reservation_row,
    reserve,
    reserved_decision,
)
from corepin.agent.host.settings import HostSettings
from corepin.allocation.api import build_request
from corepin.core.cpuset import CPUSet
from corepin.core.errors import AllocationError, InputError
from corepin.core.text import utc_text
from corepin.state.model import Assignment, HostState
from corepin.state.payload import payload_to_state, state_to_payload
from corepin.state.reservations import Reservation
from corepin.topology.model import Topology
from support.budget import examples

C = CPUSet.parse


def host_for(tmp: Path, topology: Topology) -> HostAgent:
    return HostAgent(HostSettings(state_dir=str(tmp / "state"), cgroups="off"), topology)


def smt_machine() -> Topology:
    """1 socket, 2 NUMA nodes, 2 L3s each, 2 cores per L3, 2 threads per core (16 CPUs)."""
    return T.build(1, 2, 2, 2, 2)


def test_a_reservation_at_level_core_withholds_whole_cores(tmp_path: Path) -> None:
    topo = smt_machine()
    host = host_for(tmp_path, topo)
    made = reserve(host, "a", count=1, level="core")
    assert len(made.cpus) == 1 and made.level == "core"
    (core,) = {topo.cpu(c).core for c in made.cpus}
    assert made.withheld == CPUSet(c.cpu for c in topo.cpus if c.core == core)
    listed = reserve(host, "b", cpus=C("15"), level="core")
    assert listed.cpus == C("15") and len(listed.withheld) == 2 and 15 in listed.withheld
    state = host.read_state()
    assert not (made.withheld | listed.withheld) & (state.free | state.shared_pool)


def test_a_cpu_list_overlapping_another_reservation_names_it(tmp_path: Path) -> None:
    host = host_for(tmp_path, smt_machine())
    first = reserve(host, "first", count=2, level="l3")
    with pytest.raises(AllocationError, match="reservation first"):
        reserve(host, "second", cpus=CPUSet([min(first.withheld)]))
    with pytest.raises(InputError, match="already exists"):
        reserve(host, "first", count=1)
    with pytest.raises(InputError, match="not online"):
        reserve(host, "third", cpus=C("99"))
    with pytest.raises(InputError, match="--ttl"):
        reserve(host, "third", count=1, ttl=-1)
    assert set(host.read_state().reservations) == {"first"}


@settings(max_examples=examples(40))
@given(
    st.lists(
        st.tuples(st.integers(1, 4), st.sampled_from(["cpu", "core", "l3", "numa"])),
        min_size=1,
        max_size=5,
    )
)
def test_reservations_choose_what_a_run_would_get_and_runs_never_get_them(
    tmp_path_factory: pytest.TempPathFactory, requests: list[tuple[int, str]]
) -> None:
    topo = smt_machine()
    host = host_for(tmp_path_factory.mktemp("reserve"), topo)
    for i, (count, level) in enumerate(requests):
        before = host.read_state()
        request = build_request(count, {"level": level})
        try:
            expected = host.decide(before, request, "exclusive")
        except AllocationError:
            with pytest.raises(AllocationError):
                reserve(host, f"r{i}", count=count, level=level)
            continue
        made = reserve(host, f"r{i}", count=count, level=level)
        assert (made.cpus, made.withheld) == (expected.cpus, expected.withheld)
        state = host.read_state()
        held = CPUSet().union(*(r.withheld for r in state.reservations.values()))
        assert not held & state.free and not held & state.shared_pool
        assert state.overlaps() == []
        try:
            run = host.decide(state, build_request(1, {}), "exclusive")
        except AllocationError:
            continue
        assert not run.withheld & held


def test_a_run_on_a_reservation_gets_its_cpus_unless_unknown_or_in_use(tmp_path: Path) -> None:
    topo = smt_machine()
    host = host_for(tmp_path, topo)
    made = reserve(host, "job", count=2, level="core")
    state = host.read_state()
    decision = reserved_decision(state, "job", topo)
    assert (decision.cpus, decision.withheld) == (made.cpus, made.withheld)
    with pytest.raises(AllocationError, match="no reservation named 'other'") as unknown:
        reserved_decision(state, "other", topo)
    assert unknown.value.reason == "unknown_reservation"
    used = state.add(Assignment("run-1", cpus=made.cpus, withheld=made.withheld, reservation="job"))
    with pytest.raises(AllocationError, match="in use by run-1"):
        reserved_decision(used, "job", topo)


def test_expiry_ends_reservations_and_a_run_on_one_keeps_its_cpus() -> None:
    topo = smt_machine()
    state = HostState.new(topo)
    state = state.add_reservation(Reservation("old", C("0-1"), expires=100.0))
    state = state.add_reservation(Reservation("used", C("2-3"), expires=100.0))
    state = state.add_reservation(Reservation("kept", C("4"), expires=300.0))
    state = state.add(Assignment("run-1", cpus=C("2-3"), reservation="used"))
    same, gone = state.expire_reservations(99.0)
    assert same is state and gone == ()
    after, gone = state.expire_reservations(200.0)
    assert {r.name for r in gone} == {"old", "used"}
    assert set(after.reservations) == {"kept"}
    run = after.get("run-1")
    assert run is not None and run.reservation is None and run.cpus == C("2-3")
    assert C("0-1") <= after.free and not C("2-3") & after.free
    # the run can be changed and released like any other now
    assert after.replace_assignment(run.evolve(kind="shared", cpus=CPUSet())).free >= C("0-3")


def test_deleting_a_reservation_frees_its_cpus_and_a_run_on_one_keeps_them(
    tmp_path: Path,
) -> None:
    host = host_for(tmp_path, smt_machine())
    made = reserve(host, "x", count=2, level="core")
    gone = delete(host, "x")
    assert gone == made
    assert host.read_state().reservations == {} and made.withheld <= host.read_state().free
    with pytest.raises(InputError, match="no reservation named 'x'"):
        delete(host, "x")
    # in use (pure: a run of this test would be reaped as dead by the next transaction)
    state = HostState.new(smt_machine()).add_reservation(made)
    state = state.add(Assignment("run-9", cpus=made.cpus, reservation="x"))
    after = state.remove_reservation("x")
    run = after.get("run-9")
    assert run is not None and run.reservation is None and run.cpus == made.cpus
    assert not made.cpus & after.free and (made.withheld - made.cpus) <= after.free


def test_report_rows_carry_rfc3339_utc_and_the_run_on_it() -> None:
    assert utc_text(None) is None
    assert utc_text(0.0) == "1970-01-01T00:00:00Z"
    assert utc_text(1_700_000_000.5) == "2023-11-14T22:13:20Z"
    row = reservation_row(Reservation("r", C("1"), expires=0.0, consumed_by=("run-1",)))
    assert row == {
        "name": "r",
        "cpus": "1",
        "expires": "1970-01-01T00:00:00Z",
        "consumed_by": "run-1",
        "withheld": "1",
        "level": "cpu",
        "reusable": False,
    }


def test_rebalance_opt_out_survives_the_checkpoint_and_absent_reads_as_true() -> None:
    state = HostState.new(smt_machine()).add(Assignment("run-1", cpus=C("3"), rebalance=False))
    payload = state_to_payload(state)
    assert payload["assignments"][0]["rebalance"] is False
    back = payload_to_state(payload, "test")
    assert back.get("run-1") == state.get("run-1")
    del payload["assignments"][0]["rebalance"]
    loaded = payload_to_state(payload, "test").get("run-1")
    assert loaded is not None and loaded.rebalance is True
    payload["assignments"][0]["rebalance"] = "no"
    with pytest.raises(InputError, match="rebalance"):
        payload_to_state(payload, "test")
