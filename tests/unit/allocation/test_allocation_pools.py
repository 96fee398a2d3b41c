"""The one pool model (reserved, infra, isolated, shared, exclusive and share holds), Koordinator
reservations, deciding out of the right pool, and the `corepin.allocate` Python entry point."""

from __future__ import annotations

import pytest

import corepin
import support.alloc_topologies as T
from corepin.allocation.api import build_request, parse_options
from corepin.allocation.decide import decide
from corepin.allocation.policies import POLICY_NAMES, get_policy
from corepin.allocation.pools import NodePools, parse_cpu_quantity, parse_koordinator_reservation
from corepin.allocation.reserved import reserved_cpus
from corepin.allocation.types import Decision, Request
from corepin.core.cpuset import CPUSet
from corepin.core.errors import AllocationError, RequestError
from corepin.topology.model import Topology

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
    topo = T.two_sockets_24_cpus()
    two = reserved_cpus(topo, 2)
    assert len(two) == 2
    assert len(topo.cores_in(two)) == 1, "two reserved CPUs are one whole core"
    assert reserved_cpus(topo, explicit=CPUSet.parse("3,7")) == CPUSet.parse("3,7")
    assert reserved_cpus(topo, 0) == CPUSet()
    with pytest.raises(RequestError, match="99"):
        reserved_cpus(topo, explicit=CPUSet.of(99))
    with pytest.raises(RequestError, match="25"):
        reserved_cpus(topo, 25)


# ---------------------------------------------------------------------- NodePools


def _take(
    pools: NodePools, topo: Topology, request: Request, policy: str = "topology-aware"
) -> tuple[NodePools, Decision]:
    """Decide `request` out of `pools` and hold the result (as the state and simulator do)."""
    kind = "exclusive" if request.exclusive and request.workload != "best-effort" else "shared"
    d = decide(pools, topo, request, get_policy(policy), kind=kind)
    return pools.hold(kind, d.withheld), d


def test_shared_pool_shrinks_and_grows_as_exclusive_holds_come_and_go() -> None:
    topo = T.one_socket_8_cpus()
    pools = NodePools.for_topology(topo, reserved=CPUSet.of(0))
    assert pools.shared_pool == topo.online_cpus, "non-strict reserved CPUs run shared work"
    assert pools.free == CPUSet.parse("1-7")
    pools2, d = _take(pools, topo, Request(2))
    assert d.cpus.isdisjoint(CPUSet.of(0))
    assert pools2.shared_pool == topo.online_cpus - d.withheld
    assert pools2.exclusive_cpus == d.withheld
    pools3 = pools2.release("exclusive", d.withheld)
    assert pools3.shared_pool == topo.online_cpus
    assert pools3 == pools, "releasing a hold restores the pools exactly"
    assert pools.exclusive_cpus == CPUSet(), "pools are values: the original is unchanged"


def test_share_holds_leave_the_free_set_but_stay_in_the_shared_pool() -> None:
    topo = T.one_socket_8_cpus()
    pools = NodePools.for_topology(topo)
    held = pools.hold("share", CPUSet.parse("2-3"))
    assert held.shared_pool == topo.online_cpus
    assert held.free == topo.online_cpus - CPUSet.parse("2-3")
    assert held.held == CPUSet.parse("2-3")
    with pytest.raises(AllocationError) as info:
        held.hold("exclusive", CPUSet.of(3))
    assert info.value.reason == "cpus_taken"


def test_strict_reservation_keeps_reserved_cpus_off_shared_work() -> None:
    topo = T.one_socket_8_cpus()
    reserved = reserved_cpus(topo, 2)
    pools = NodePools.for_topology(topo, reserved=reserved, strict=True)
    assert pools.shared_pool.isdisjoint(reserved)
    assert pools.free.isdisjoint(reserved)
    assert len(pools.shared_pool) == 6


def test_infra_cpus_are_neither_free_nor_shared() -> None:
    topo = T.one_socket_8_cpus()
    pools = NodePools.for_topology(topo, infra=CPUSet.parse("3,7"))
    assert pools.shared_pool == CPUSet.parse("0-2,4-6")
    assert pools.free == CPUSet.parse("0-2,4-6")
    with pytest.raises(AllocationError) as info:
        pools.hold("exclusive", CPUSet.of(3))
    assert info.value.reason == "cpus_infra"
    with pytest.raises(RequestError, match="infra"):
        NodePools.for_topology(topo, infra=CPUSet.of(99))


def test_isolated_cpus_are_free_but_kept_off_the_shared_pool_unless_asked() -> None:
    topo = T.isolated_8_cpus()
    pools = NodePools.for_topology(topo)
    assert pools.shared_pool == CPUSet.parse("0-1,4-5")
    assert pools.free == topo.online_cpus, "isolated CPUs are free for exclusive requests"
    assert pools.shared_pool_for(allow_isolated=True) == topo.online_cpus
    pools, d = _take(pools, topo, Request(2))
    assert d.cpus <= topo.isolated_cpus, "exclusive requests prefer isolated CPUs"
    assert pools.shared_pool == CPUSet.parse("0-1,4-5"), "the shared pool never had them"


def test_overlapping_reserved_offline_or_unknown_holds_are_refused_by_reason() -> None:
    topo = T.one_socket_8_cpus()
    pools = NodePools.for_topology(topo, reserved=CPUSet.of(7))
    pools, d = _take(pools, topo, Request(2, level="core"))
    cases = [
        (d.withheld, "cpus_taken"),
        (CPUSet.of(7), "cpus_reserved"),
        (CPUSet.of(40), "cpus_offline"),
    ]
    for cpus, reason in cases:
        with pytest.raises(AllocationError) as info:
            pools.hold("exclusive", cpus)
        assert info.value.reason == reason, cpus
    with pytest.raises(RequestError, match="'bogus'"):
        pools.hold("bogus", CPUSet.of(1))
    assert pools.hold("shared", CPUSet()) is pools, "a shared hold takes nothing"


def test_shared_and_best_effort_decisions_withhold_nothing() -> None:
    topo = T.one_socket_8_cpus()
    pools = NodePools.for_topology(topo)
    pools, a = _take(pools, topo, Request(1, workload="best-effort"), "workload-aware")
    pools, b = _take(pools, topo, Request(1, exclusive=False))
    assert not a.withheld and not b.withheld
    assert len(a.cpus) == 1 and a.cpus <= pools.shared_pool
    assert b.cpus == pools.shared_pool, "a shared request runs on the whole pool"
    assert pools.exclusive_cpus == CPUSet()


def test_best_effort_decisions_spread_over_the_least_used_cpus() -> None:
    topo = T.one_socket_8_cpus()
    pools = NodePools.for_topology(topo)
    wa = get_policy("workload-aware")
    usage: dict[int, int] = {}
    chosen = []
    for _ in range(10):
        d = decide(pools, topo, Request(1, workload="best-effort"), wa, usage=usage)
        cpu = d.cpus.first()
        usage[cpu] = usage.get(cpu, 0) + 1
        chosen.append(cpu)
    assert chosen == [0, 1, 2, 3, 4, 5, 6, 7, 0, 1]


def test_filling_the_machine_then_one_more_request_is_rejected_without_overlap() -> None:
    topo = T.two_numa_per_socket_32_cpus()
    pools = NodePools.for_topology(topo)
    for _ in range(8):
        pools, _d = _take(pools, topo, Request(4))
    assert pools.free == CPUSet()
    with pytest.raises(AllocationError) as info:
        _take(pools, topo, Request(1))
    assert info.value.reason == "not_enough_cpus"
    with pytest.raises(AllocationError) as shared:
        _take(pools, topo, Request(1, exclusive=False))
    assert shared.value.reason == "shared_pool_empty"


def test_keep_shared_refuses_an_exclusive_decision_that_empties_the_shared_pool() -> None:
    topo = T.one_socket_8_cpus()
    pools = NodePools.for_topology(topo).hold("exclusive", CPUSet.parse("0-5"))
    policy = get_policy("topology-aware")
    assert len(decide(pools, topo, Request(2), policy).cpus) == 2
    with pytest.raises(AllocationError) as info:
        decide(pools, topo, Request(2), policy, keep_shared=True)
    assert info.value.reason == "shared_pool_exhausted"


def test_a_numa_hint_naming_a_node_the_machine_lacks_is_refused() -> None:
    topo = T.two_numa_per_socket_32_cpus()
    with pytest.raises(RequestError, match="NUMA node"):
        corepin.allocate(topo, 1, options=("numa=9",))
    assert len(corepin.allocate(topo, 1, options=("numa=1",))) == 1


# ---------------------------------------------------------------------- corepin.allocate


def test_the_top_level_allocate_returns_a_cpuset() -> None:
    topo = T.two_sockets_24_cpus()
    assert corepin.allocate(topo, 2) == CPUSet.parse("0,12")
    assert corepin.allocate(topo, 2, available=CPUSet.parse("1-23")) == CPUSet.parse("1,13")
    assert corepin.allocate(topo, 1, options=("level=core",), available="1-23") == CPUSet.of(1)


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_allocate_works_with_every_policy(policy: str) -> None:
    topo = T.two_sockets_24_cpus()
    got = corepin.allocate(topo, 4, policy=policy)
    assert len(got) == 4


def test_allocate_accepts_options_as_a_mapping() -> None:
    topo = T.one_socket_8_cpus()
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
    topo = T.one_socket_8_cpus()
    with pytest.raises(corepin.InputError, match=match) as info:
        corepin.allocate(topo, **kwargs)  # type: ignore[arg-type]
    assert info.value.exit_code == 2


def test_allocate_rejects_offline_available_cpus() -> None:
    topo = T.offline_24_cpus()
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
