"""Pools (reserved, infra, shared, exclusive), Koordinator reservations, PoolState, and the
`corepin.allocate` Python entry point."""

from __future__ import annotations

import pytest

import alloc_topologies as T
import corepin
from corepin.allocation.api import build_request, parse_options
from corepin.allocation.policies import POLICY_NAMES, get_policy
from corepin.allocation.pools import (
    PoolState,
    Reservation,
    parse_cpu_quantity,
    parse_koordinator_reservation,
    select_reserved,
)
from corepin.allocation.types import Request
from corepin.core.cpuset import CPUSet
from corepin.core.errors import AllocationError, RequestError

# ---------------------------------------------------------------------- reservations


@pytest.mark.parametrize(
    ("text", "count", "cpus"),
    [
        ('{"resources": {"cpu": "2"}}', 2, None),
        ('{"resources": {"cpu": "1500m"}}', 2, None),
        ('{"reservedCPUs": "0-1"}', 0, "0-1"),
        ('{"resources": {"cpu": "4"}, "reservedCPUs": "0,8"}', 4, "0,8"),
        ("{}", 0, None),
    ],
    ids=[
        "a whole CPU quantity reserves that many CPUs",
        "a millicore quantity rounds up to whole CPUs",
        "an explicit list of reserved CPUs",
        "both a quantity and a list: the list is kept alongside the count",
        "an empty reservation reserves nothing",
    ],
)
def test_koordinator_reservation_annotation_is_parsed(
    text: str, count: int, cpus: str | None
) -> None:
    r = parse_koordinator_reservation(text)
    assert r.count == count
    assert (str(r.cpus) if r.cpus is not None else None) == cpus


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("{not json", "not valid JSON"),
        ("[1]", "must be a JSON object"),
        ('{"reservedCPUs": "3-1"}', "3-1"),
        ('{"resources": {"cpu": "two"}}', "'two'"),
        ('{"resources": {"cpu": "-1"}}', "negative"),
    ],
    ids=[
        "invalid JSON is rejected",
        "a JSON list is rejected",
        "a backwards CPU range is rejected by value",
        "a quantity that is not a number is rejected by value",
        "a negative quantity is rejected",
    ],
)
def test_bad_koordinator_reservations_are_request_errors(text: str, match: str) -> None:
    with pytest.raises(RequestError, match=match):
        parse_koordinator_reservation(text)


def test_cpu_quantities() -> None:
    assert parse_cpu_quantity("3") == 3
    assert parse_cpu_quantity(2) == 2
    assert parse_cpu_quantity("250m") == 1
    with pytest.raises(RequestError):
        parse_cpu_quantity(True)


def test_reserved_cpus_by_count_are_chosen_by_topology_and_by_list_as_given() -> None:
    topo = T.dual_socket_ht()
    two = select_reserved(topo, 2)
    assert len(two) == 2
    assert len(topo.cores_in(two)) == 1, "two reserved CPUs are one whole core"
    assert select_reserved(topo, explicit=CPUSet.parse("3,7")) == CPUSet.parse("3,7")
    assert select_reserved(topo, 0) == CPUSet()
    with pytest.raises(RequestError, match="99"):
        select_reserved(topo, explicit=CPUSet.of(99))
    with pytest.raises(RequestError, match="25"):
        select_reserved(topo, 25)


# ---------------------------------------------------------------------- PoolState


def test_shared_pool_shrinks_and_grows_as_exclusive_assignments_come_and_go() -> None:
    topo = T.single_socket_ht()
    state = PoolState.build(topo, reserved=CPUSet.of(0))
    assert state.shared_pool() == topo.online_cpus, "non-strict reserved CPUs run shared work"
    assert state.available_for_exclusive() == CPUSet.parse("1-7")
    policy = get_policy("topology-aware")
    state2, d = state.allocate("a", Request(2), policy)
    assert d.cpus.isdisjoint(state.reserved)
    assert state2.shared_pool() == topo.online_cpus - d.reserved
    assert state2.exclusive_cpus() == d.reserved
    state3 = state2.without("a")
    assert state3.shared_pool() == topo.online_cpus
    assert state3.without("a") is state3, "removing an unknown id changes nothing"
    assert state.assignments == {}, "states are values: the original is unchanged"


def test_strict_reservation_keeps_reserved_cpus_off_shared_work() -> None:
    topo = T.single_socket_ht()
    state = PoolState.build(topo, reserved=Reservation(count=2), strict=True)
    assert len(state.reserved) == 2
    assert state.shared_pool().isdisjoint(state.reserved)
    assert state.available_for_exclusive().isdisjoint(state.reserved)


def test_infra_cpus_are_neither_exclusive_nor_shared() -> None:
    topo = T.single_socket_ht()
    state = PoolState.build(topo, infra=CPUSet.parse("3,7"))
    assert state.shared_pool() == CPUSet.parse("0-2,4-6")
    assert state.available_for_exclusive() == CPUSet.parse("0-2,4-6")


def test_isolated_cpus_are_kept_off_the_shared_pool_unless_asked() -> None:
    topo = T.with_isolated()
    state = PoolState.build(topo)
    assert state.shared_pool() == CPUSet.parse("0-1,4-5")
    assert state.shared_pool(allow_isolated=True) == topo.online_cpus
    state, d = state.allocate("x", Request(2), get_policy("topology-aware"))
    assert d.cpus <= topo.isolated_cpus, "exclusive requests prefer isolated CPUs"


def test_overlapping_or_duplicate_assignments_are_refused() -> None:
    topo = T.single_socket_ht()
    state = PoolState.build(topo, reserved=CPUSet.of(7))
    state, d = state.allocate("a", Request(2, level="core"), get_policy("topology-aware"))
    with pytest.raises(AllocationError) as info:
        state.with_assignment("b", d)
    assert info.value.reason == "overlap"
    with pytest.raises(RequestError, match="'a'"):
        state.with_assignment("a", d)
    on_reserved = get_policy("topology-aware").decide(topo, Request(1), CPUSet.of(7))
    with pytest.raises(AllocationError):
        state.with_assignment("c", on_reserved)


def test_shared_and_best_effort_assignments_withhold_nothing_and_count_usage() -> None:
    topo = T.single_socket_ht()
    state = PoolState.build(topo)
    wa = get_policy("workload-aware")
    state, a = state.allocate("a", Request(1, workload="best-effort"), wa)
    state, b = state.allocate("b", Request(1, exclusive=False), get_policy("topology-aware"))
    assert not a.reserved and not b.reserved
    assert state.exclusive_cpus() == CPUSet()
    counts = state.usage_counts()
    assert counts[0] == 2
    assert counts[1] == 1 and counts[7] == 1  # the shared request runs on the whole pool


def test_best_effort_assignments_spread_over_the_least_shared_cpus() -> None:
    topo = T.single_socket_ht()
    state = PoolState.build(topo)
    wa = get_policy("workload-aware")
    chosen = []
    for i in range(10):
        state, d = state.allocate(f"be{i}", Request(1, workload="best-effort"), wa)
        chosen.append(d.cpus.first())
    assert chosen == [0, 1, 2, 3, 4, 5, 6, 7, 0, 1]


def test_filling_the_machine_then_one_more_request_is_rejected_without_overlap() -> None:
    topo = T.multi_numa_per_socket()
    state = PoolState.build(topo)
    policy = get_policy("topology-aware")
    for i in range(8):
        state, _ = state.allocate(f"p{i}", Request(4), policy)
    assert state.available_for_exclusive() == CPUSet()
    with pytest.raises(AllocationError) as info:
        state.allocate("late", Request(1), policy)
    assert info.value.reason == "not_enough_cpus"


# ---------------------------------------------------------------------- corepin.allocate


def test_the_top_level_allocate_returns_a_cpuset() -> None:
    topo = T.dual_socket_ht()
    assert corepin.allocate(topo, 2) == CPUSet.parse("0,12")
    assert corepin.allocate(topo, 2, available=CPUSet.parse("1-23")) == CPUSet.parse("1,13")
    assert corepin.allocate(topo, 1, options=("level=core",), available="1-23") == CPUSet.of(1)


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_allocate_works_with_every_policy(policy: str) -> None:
    topo = T.dual_socket_ht()
    got = corepin.allocate(topo, 4, policy=policy)
    assert len(got) == 4


def test_allocate_accepts_options_as_a_mapping() -> None:
    topo = T.single_socket_ht()
    got = corepin.allocate(topo, 2, options={"smt": "spread"})
    assert got == CPUSet.parse("0-1")
    assert corepin.allocate(topo, 2, options={"full-pcpus-only": True}) == CPUSet.parse("0,4")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"count": 0}, "got 0"),
        ({"count": 2, "available": CPUSet.of(50)}, "50"),
        ({"count": 2, "available": "9-8"}, "9-8"),
        ({"count": 2, "policy": "round-robin"}, "'round-robin'"),
        ({"count": 2, "options": ("bogus",)}, "'bogus'"),
        ({"count": 2, "options": ("level=rack",)}, "'rack'"),
        ({"count": 2, "options": ("numa=x",)}, "numa"),
        ({"count": 2, "options": ("level=core", "level=l3")}, "twice"),
        ({"count": 2, "options": ("prefer-isolated=maybe",)}, "'maybe'"),
    ],
    ids=[
        "count zero",
        "an available CPU outside the topology",
        "a backwards available range",
        "an unknown policy",
        "an unknown option",
        "an unknown level",
        "a NUMA hint that is not a list",
        "the same option twice",
        "a boolean option with a non-boolean value",
    ],
)
def test_allocate_rejects_bad_input_naming_the_value(kwargs: dict[str, object], match: str) -> None:
    topo = T.single_socket_ht()
    with pytest.raises(corepin.InputError, match=match) as info:
        corepin.allocate(topo, **kwargs)  # type: ignore[arg-type]
    assert info.value.exit_code == 2


def test_allocate_rejects_offline_available_cpus() -> None:
    topo = T.with_offline()
    with pytest.raises(RequestError, match="offline"):
        corepin.allocate(topo, 1, available=CPUSet.of(5))


def test_options_turn_into_request_fields() -> None:
    r = build_request(
        3, ["level=numa", "workload=cpu-bound", "smt=spread", "numa=1", "prefer-isolated=false"]
    )
    assert (r.level, r.workload, r.smt, r.prefer_isolated) == ("numa", "cpu-bound", "spread", False)
    assert r.numa_hint == CPUSet.of(1)
    assert dict(r.options) == {}
    assert build_request(1, ["shared"]).exclusive is False
    assert parse_options(["full-pcpus-only"]) == {"full-pcpus-only": "true"}
