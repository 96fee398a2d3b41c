"""Table-driven cases for the `topology-aware` policy and the exclusiveness levels."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import support.alloc_topologies as T
from corepin.allocation.levels import free_units, index_of, units_of, withheld_for
from corepin.allocation.topology_aware import TopologyAwarePolicy
from corepin.allocation.types import Request
from corepin.core.cpuset import CPUSet
from corepin.core.errors import AllocationError, RequestError, SMTAlignmentError
from corepin.topology.model import Topology
from support import strategies
from support.budget import examples
from support.paths import SYSFS_FIXTURES

POLICY = TopologyAwarePolicy()


@dataclass(frozen=True)
class Case:
    id: str
    topology: str
    count: int
    expect: str
    available: str | None = None  # default: all online
    kwargs: dict[str, object] = field(default_factory=dict)
    reserved: str | None = None


def _topo(name: str) -> Topology:
    return T.NAMED[name]()


CASES = [
    Case(
        "two CPUs on an empty hyperthreaded socket take one whole core",
        "one-socket-8-cpus",
        2,
        "0,4",
    ),
    Case(
        "six CPUs on an empty dual socket machine take three whole cores of socket 0",
        "two-sockets-24-cpus",
        6,
        "0-2,12-14",
    ),
    Case(
        "a partly used socket is filled first so the empty socket stays whole (best fit)",
        "two-sockets-24-cpus",
        4,
        "1-2,13-14",
        available="1-11,13-23",
    ),
    Case(
        "twelve CPUs span the two NUMA nodes of one socket: all of node 0 then two cores of node 1",
        "two-numa-per-socket-32-cpus",
        12,
        "0-5,16-21",
    ),
    Case(
        "fewest NUMA nodes beats best fit: one whole node of socket 1 rather than two half nodes",
        "two-numa-per-socket-32-cpus",
        6,
        "8-10,24-26",
        available="2-3,6-15,17-19,21-31",
    ),
    Case(
        "eight CPUs fill exactly one L3 instance",
        "four-l3-per-numa-64-cpus",
        8,
        "0-3,32-35",
    ),
    Case(
        "eight CPUs skip an L3 with only seven free and take a whole one instead of two",
        "four-l3-per-numa-64-cpus",
        8,
        "4-7,36-39",
        available="1-63",
    ),
    Case(
        "four CPUs go to the partly used L3 (six free) rather than an empty one",
        "four-l3-per-numa-64-cpus",
        4,
        "1-2,33-34",
        available="1-31,33-63",
    ),
    Case(
        "an odd count takes whole cores plus the free sibling of a partly used core",
        "one-socket-8-cpus",
        3,
        "1,4-5",
        available="1-7",
    ),
    Case(
        "five CPUs without SMT fill one L3 and take one CPU of the next in the same node",
        "no-smt-16-cpus",
        5,
        "0-4",
    ),
    Case(
        "isolated CPUs are taken first for an exclusive request",
        "isolated-8-cpus",
        2,
        "2,6",
    ),
    Case(
        "with prefer_isolated false isolated CPUs are avoided",
        "isolated-8-cpus",
        2,
        "0,4",
        kwargs={"prefer_isolated": False},
    ),
    Case(
        "a NUMA hint places the CPUs in the hinted node",
        "two-numa-per-socket-32-cpus",
        2,
        "12,28",
        kwargs={"numa_hint": CPUSet.of(3)},
    ),
    Case(
        "a NUMA hint that cannot hold the request falls back to the best node",
        "two-numa-per-socket-32-cpus",
        4,
        "0-1,16-17",
        available="0-12,16-28",
        kwargs={"numa_hint": CPUSet.of(3)},
    ),
    Case(
        "smt spread takes one thread of distinct cores",
        "one-socket-8-cpus",
        2,
        "0-1",
        kwargs={"smt": "spread"},
    ),
    Case(
        "offline CPUs are never chosen: the larger socket whole, then one CPU of the other",
        "offline-24-cpus",
        12,
        "0,6-11,18-19,21-23",
        available=None,
    ),
    Case(
        "level core withholds the sibling of a single chosen CPU",
        "one-socket-8-cpus",
        1,
        "1",
        available="1-7",
        kwargs={"level": "core"},
        reserved="1,5",
    ),
    Case(
        "level core skips a core whose sibling is taken",
        "one-socket-8-cpus",
        2,
        "1,5",
        available="1-7",
        kwargs={"level": "core"},
        reserved="1,5",
    ),
    Case(
        "level l3 uses a fully free L3 in the partly used node and reserves all of it",
        "four-l3-per-numa-64-cpus",
        3,
        "4-5,36",
        available="1-63",
        kwargs={"level": "l3"},
        reserved="4-7,36-39",
    ),
    Case(
        "level numa reserves the whole first entirely free NUMA node",
        "two-numa-per-socket-32-cpus",
        2,
        "4,20",
        available="1-31",
        kwargs={"level": "numa"},
        reserved="4-7,20-23",
    ),
    Case(
        "level socket reserves the whole socket that is entirely free",
        "two-sockets-24-cpus",
        2,
        "6,18",
        available="1-23",
        kwargs={"level": "socket"},
        reserved="6-11,18-23",
    ),
    Case(
        "full-pcpus-only takes only whole free cores",
        "one-socket-8-cpus",
        2,
        "1,5",
        available="1-7",
        kwargs={"options": {"full-pcpus-only": "true"}},
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_topology_aware_table(case: Case) -> None:
    topo = _topo(case.topology)
    avail = CPUSet.parse(case.available) if case.available is not None else topo.online_cpus
    decision = POLICY.decide(topo, Request(case.count, **case.kwargs), avail)  # type: ignore[arg-type]
    assert str(decision.cpus) == case.expect
    assert len(decision.cpus) == case.count
    assert decision.cpus <= avail
    assert decision.policy == "topology-aware"
    assert decision.mems == topo.mems_of(decision.cpus)
    if case.reserved is not None:
        assert str(decision.withheld) == case.reserved
    assert decision.withheld >= decision.cpus


def test_the_explanation_lists_the_levels_tried_and_why() -> None:
    topo = T.four_l3_per_numa_64_cpus()
    d = POLICY.decide(topo, Request(4), CPUSet.parse("1-31,33-63"))
    levels = [s.level for s in d.explanation]
    assert levels[0] == "pool"
    assert "numa" in levels and "l3" in levels and "core" in levels
    assert all(s.reason for s in d.explanation)
    data = d.to_json()
    assert data["cpus"] == "1-2,33-34"
    assert data["explanation"][0] == {
        "level": "pool",
        "choice": "available CPUs",
        "reason": d.explanation[0].reason,
    }


def test_a_skipped_pool_is_explained() -> None:
    topo = T.isolated_8_cpus()
    d = POLICY.decide(topo, Request(6), topo.online_cpus)
    assert d.explanation[0].level == "pool"
    assert d.explanation[0].reason.startswith("skipped")


@pytest.mark.parametrize(
    ("topology", "count", "available", "kwargs", "reason"),
    [
        ("one-socket-8-cpus", 9, None, {}, "not_enough_cpus"),
        ("one-socket-8-cpus", 3, None, {"smt": "whole-cores"}, "smt_alignment"),
        ("one-socket-8-cpus", 4, "0-2,4", {"smt": "whole-cores"}, "smt_alignment"),
        (
            "two-numa-per-socket-32-cpus",
            1,
            "1-3,5-7,9-11,13-31",
            {"level": "numa"},
            "level_unsatisfiable",
        ),
        ("two-sockets-24-cpus", 13, None, {"level": "socket"}, "level_unsatisfiable"),
    ],
    ids=[
        "more CPUs than available is not_enough_cpus",
        "an odd count with whole cores required is an SMT alignment error",
        "too few whole free cores with whole cores required is an SMT alignment error",
        "no entirely free NUMA node makes level numa unsatisfiable",
        "thirteen CPUs do not fit the one entirely free socket of twelve at level socket",
    ],
)
def test_unsatisfiable_requests_raise_typed_errors(
    topology: str, count: int, available: str | None, kwargs: dict[str, object], reason: str
) -> None:
    topo = _topo(topology)
    avail = CPUSet.parse(available) if available is not None else topo.online_cpus
    if topology == "two-sockets-24-cpus":
        avail = topo.online_cpus - CPUSet.of(0)  # socket 0 no longer entirely free
    with pytest.raises(AllocationError) as info:
        POLICY.decide(topo, Request(count, **kwargs), avail)  # type: ignore[arg-type]
    assert info.value.reason == reason
    assert info.value.exit_code == 3
    if reason == "smt_alignment":
        assert isinstance(info.value, SMTAlignmentError)


def test_unknown_policy_option_is_a_request_error_naming_it() -> None:
    topo = T.one_socket_8_cpus()
    with pytest.raises(RequestError, match="distribute-cpus-across-numa"):
        POLICY.decide(
            topo, Request(1, options={"distribute-cpus-across-numa": "true"}), topo.online_cpus
        )


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"count": 0}, "positive integer, got 0"),
        ({"count": -1}, "got -1"),
        ({"count": 1.5}, "1.5"),
        ({"count": True}, "True"),
        ({"count": 1, "level": "rack"}, "'rack'"),
        ({"count": 1, "workload": "gpu-bound"}, "'gpu-bound'"),
        ({"count": 1, "smt": "sometimes"}, "'sometimes'"),
    ],
    ids=[
        "count zero is rejected",
        "a negative count is rejected",
        "a fractional count is rejected",
        "a boolean count is rejected",
        "an unknown level is rejected by name",
        "an unknown workload family is rejected by name",
        "an unknown smt preference is rejected by name",
    ],
)
def test_requests_validate_themselves(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(RequestError, match=match) as info:
        Request(**kwargs)  # type: ignore[arg-type]
    assert info.value.exit_code == 2


def test_shared_requests_get_the_shared_pool_without_isolated_cpus() -> None:
    topo = T.isolated_8_cpus()
    d = POLICY.decide(topo, Request(1, exclusive=False), topo.online_cpus)
    assert str(d.cpus) == "0-1,4-5"
    assert not d.withheld


def test_level_helpers_agree_with_the_topology() -> None:
    topo = T.two_numa_per_socket_32_cpus()
    assert len(units_of(topo, "core")) == 16
    assert len(units_of(topo, "numa")) == 4
    assert units_of(topo, "socket")[1] == CPUSet.parse("8-15,24-31")
    # only core 0 (CPUs 0 and 16) has both threads inside 0-16
    assert free_units(topo, "core", CPUSet.parse("0-16")) == CPUSet.parse("0,16")
    assert withheld_for(topo, "numa", CPUSet.of(9)) == CPUSet.parse("8-11,24-27")
    assert withheld_for(topo, "cpu", CPUSet.of(9)) == CPUSet.of(9)
    assert index_of(topo) is index_of(topo)


def test_a_large_machine_is_decided_without_enumerating_combinations() -> None:
    topo = T.big(1024)
    d = POLICY.decide(topo, Request(100), topo.online_cpus)
    assert len(d.cpus) == 100
    assert len(d.mems) == 2  # 64 CPUs per NUMA node: two nodes are the fewest
    assert len(topo.sockets_in(d.cpus)) == 1


def test_a_request_spanning_numa_nodes_keeps_to_nodes_that_share_an_l3() -> None:
    """On the fake 2-package, 4-die, 16-node machine every L3 (die) holds two NUMA nodes of 4
    CPUs; 6 CPUs need two nodes, and the second must be the L3 sibling of the first."""

    from corepin.topology.discover import discover

    root = SYSFS_FIXTURES / "intel-fake-2p4die-16numa-ht"
    if not root.is_dir():
        pytest.skip("fixture intel-fake-2p4die-16numa-ht is absent")
    topo = discover(str(root))
    avail = topo.online_cpus - CPUSet.of(0)
    d = POLICY.decide(topo, Request(6), avail)
    assert len(d.mems) == 2
    assert len(topo.l3s_in(d.cpus)) == 1
    # node 1 (4 free) first, then its L3 sibling node 0 for the remaining 2
    assert d.cpus == CPUSet.parse("2-7")


# ------------------------------------------------------------------ whole cores and stray threads
# Stray thread: the one free thread of a partly used core. A decision is full-core when it holds
# no partial core, except one when n is odd.


def _partial_cores(topo: Topology, cpus: CPUSet) -> int:
    return sum(1 for core in topo.cores_in(cpus) if not topo.cpus_in_cores(core) <= cpus)


@dataclass(frozen=True)
class WholeCoreCase:
    id: str
    shape: tuple[int, int, int, int]  # sockets, NUMA per socket, L3 per NUMA, cores per L3
    count: int
    available: str
    expect: str
    partial: int  # partial cores in the expected decision


# alloc_topologies.build numbers the first threads of all cores first: with C cores, core c
# is CPUs c and c + C.
WHOLE_CORE_CASES = [
    WholeCoreCase(
        "three CPUs over two nodes take the whole core of one and a stray thread of the other "
        "(not three partial cores: the four-numa-per-socket miss, seed 1, event 3272)",
        (1, 2, 1, 2),
        3,
        "0-2,6",  # node 0: strays 0 and 1; node 1: whole core 2,6
        "0,2,6",
        1,
    ),
    WholeCoreCase(
        "eight CPUs over two nodes take whole cores in both and leave the stray threads out",
        (1, 2, 1, 4),
        8,
        "0-5,10-13",  # node 0: strays 0, 1 and whole cores 2, 3; node 1: whole cores 4, 5
        "2-5,10-13",
        0,
    ),
    WholeCoreCase(
        "one CPU heals a stray thread rather than splitting a whole core of a fuller L3",
        (1, 1, 2, 2),
        1,
        "0,2-4,6",  # L3 0: whole core 0,4; L3 1: whole core 2,6 and stray 3
        "3",
        1,
    ),
    WholeCoreCase(
        "one CPU fills a stray thread of the node with the most of them, not the fullest node",
        (1, 2, 1, 2),
        1,
        "0-1,3",  # node 0: strays 0 and 1; node 1: stray 3
        "0",
        1,
    ),
    WholeCoreCase(
        "the node whose whole cores fit in the fewest L3s wins over a fuller node whose whole "
        "cores need one more L3",
        (1, 2, 3, 2),
        6,
        # node 0: L3 0 = core 0 + stray 1, L3 1 = core 2 + stray 3, L3 2 = core 4;
        # node 1: L3 3 = cores 6, 7, L3 4 = core 8, L3 5 = core 10 + stray 11
        "0-4,6-8,10-12,14,16,18-20,22",
        "6-8,18-20",
        0,
    ),
    WholeCoreCase(
        "a request that must span L3s anyway takes whole cores over three L3s rather than two "
        "L3s with two partial cores",
        (1, 1, 3, 2),
        6,
        "0-4,6,8,10",  # L3 0: core 0 + stray 1; L3 1: core 2 + stray 3; L3 2: core 4
        "0,2,4,6,8,10",
        0,
    ),
    WholeCoreCase(
        "one NUMA node that holds the request is kept even when whole cores would need two",
        (1, 2, 1, 4),
        6,
        "0-4,10-12",  # node 0: strays 0, 1 and whole cores 2, 3; node 1: whole core 4,12
        "0-3,10-11",
        2,
    ),
]


@pytest.mark.parametrize("case", WHOLE_CORE_CASES, ids=[c.id for c in WHOLE_CORE_CASES])
def test_whole_cores_first_and_stray_threads_only_where_they_belong(case: WholeCoreCase) -> None:
    topo = T.build(*case.shape, 2)
    avail = CPUSet.parse(case.available)
    d = POLICY.decide(topo, Request(case.count), avail)
    assert str(d.cpus) == case.expect
    assert d.cpus <= avail
    assert _partial_cores(topo, d.cpus) == case.partial
    assert all(s.reason for s in d.explanation)


def test_the_explanation_says_when_stray_threads_were_left_out() -> None:
    topo = T.build(1, 2, 1, 2, 2)
    d = POLICY.decide(topo, Request(3), CPUSet.parse("0-2,6"))
    core_steps = [s for s in d.explanation if s.level == "core"]
    assert any("stray" in s.reason and "CPU 0" in s.reason for s in core_steps)


def test_the_four_numa_per_socket_miss_is_full_core_on_the_benchmark_machine() -> None:
    """The decision the quality benchmark flagged: free CPUs 2 and 6 (stray threads of node 0)
    and 56,120 (a whole core of node 7); three CPUs."""
    from corepin.testing.machines import SyntheticSpec, synthetic

    topo = synthetic(
        SyntheticSpec(name="four-numa-per-socket", sockets=2, numa_per_socket=4, cores_per_l3=8)
    )
    avail = CPUSet.parse("2,6,56,120")
    assert _partial_cores(topo, avail) == 2
    d = POLICY.decide(topo, Request(3), avail)
    assert len(d.mems) == 2
    assert CPUSet.parse("56,120") <= d.cpus
    assert _partial_cores(topo, d.cpus) == 1


@st.composite
def _whole_core_scenarios(draw: st.DrawFn, states: str = "wsu") -> tuple[Topology, CPUSet, int]:
    """A hyperthreaded machine whose cores are entirely free (w), have one free thread (s) or
    none (u), drawn from `states`."""
    topo = T.build(*draw(strategies.build_shapes(threads=st.just(2))))
    cores = topo.core_ids()
    drawn = draw(st.lists(st.sampled_from(states), min_size=len(cores), max_size=len(cores)))
    avail = CPUSet()
    for core, state in zip(cores, drawn, strict=True):
        cpus = topo.cpus_in_cores(core)
        if state == "w":
            avail |= cpus
        elif state == "s":
            avail |= CPUSet.of(cpus.sorted()[draw(st.integers(0, 1))])
    n = draw(st.integers(1, max(1, len(avail))))
    return topo, avail, n


@settings(max_examples=examples(150))
@given(scenario=_whole_core_scenarios("wu"))
def test_without_stray_threads_every_decision_is_full_core(
    scenario: tuple[Topology, CPUSet, int],
) -> None:
    topo, avail, n = scenario
    if not avail:
        return
    d = POLICY.decide(topo, Request(n), avail)
    assert len(d.cpus) == n and d.cpus <= avail
    assert _partial_cores(topo, d.cpus) <= n % 2


@settings(max_examples=examples(150))
@given(scenario=_whole_core_scenarios())
def test_one_cpu_takes_a_stray_thread_whenever_there_is_one(
    scenario: tuple[Topology, CPUSet, int],
) -> None:
    topo, avail, _ = scenario
    if not avail:
        return
    strays = CPUSet(
        c
        for core in topo.core_ids()
        if not topo.cpus_in_cores(core) <= avail
        for c in topo.cpus_in_cores(core) & avail
    )
    d = POLICY.decide(topo, Request(1), avail)
    if strays:
        assert d.cpus <= strays
