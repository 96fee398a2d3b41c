# ruff: noqa: E501  (the case tables keep one kubelet case per line)
"""The `kubelet-static` policy against the kubelet CPU manager's own expectations.

Every table row states, as a fact, what the kubelet answers for one input (topology shape from
kubelet_topologies.py, available CPUs, request, options); ids are sentences saying what the row
checks. Then Hypothesis properties (within available, exactly n or a typed error, deterministic).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import support.kubelet_topologies as K
from corepin.allocation import kubelet_static as ks
from corepin.allocation.kubelet_static import (
    KUBELET_OPTIONS,
    KubeletOptions,
    KubeletStaticPolicy,
    parse_options,
    select_reserved,
    static_allocate,
    take_by_topology,
    take_by_topology_numa_distributed,
    take_by_topology_numa_packed,
)
from corepin.allocation.types import Request
from corepin.core.cpuset import EMPTY, CPUSet
from corepin.core.errors import AllocationError, RequestError, SMTAlignmentError
from corepin.topology.model import CPUInfo, Topology
from support import strategies
from support.budget import examples

P = CPUSet.parse


def ids(cases: Sequence[tuple[object, ...]]) -> list[str]:
    return [str(c[0]) for c in cases]


# ====================================================================== accumulator orders
def _acc(topo: str, avail: str) -> ks._Accumulator:
    t = ks._tables(K.get(topo))
    return ks._Accumulator(t, P(avail).bits, 0, False, None)


FREE_SOCKETS = [
    ("single socket HT with every CPU free has its one socket free", "topoSingleSocketHT", "0-7", [0]),
    ("single socket HT missing CPU 0 has no free socket", "topoSingleSocketHT", "1-7", []),
    ("dual socket HT with every CPU free has both sockets free", "topoDualSocketHT", "0-11", [0, 1]),
    ("dual socket HT missing CPU 10 has only socket 1 free", "topoDualSocketHT", "0-9,11", [1]),
    ("dual socket HT missing CPUs 1 and 10 has no free socket", "topoDualSocketHT", "0,2-9,11", []),
    ("multi NUMA per socket with all CPUs free has both sockets free", "topoDualSocketMultiNumaPerSocketHT", "0-79", [0, 1]),
    ("multi NUMA per socket missing CPU 0 has only socket 1 free", "topoDualSocketMultiNumaPerSocketHT", "1-79", [1]),
    ("multi NUMA per socket missing CPUs 0 and 79 has no free socket", "topoDualSocketMultiNumaPerSocketHT", "1-78", []),
    ("two sockets per NUMA node with all CPUs free has four free sockets", "fakeTopoMultiSocketDualSocketPerNumaHT", "0-79", [0, 1, 2, 3]),
    ("two sockets per NUMA node missing CPU 20 has sockets 0, 1 and 3 free", "fakeTopoMultiSocketDualSocketPerNumaHT", "0-19,21-79", [0, 1, 3]),
    ("two sockets per NUMA node missing CPUs 60 and 79 has sockets 0 and 1 free", "fakeTopoMultiSocketDualSocketPerNumaHT", "0-59,61-78", [0, 1]),
    ("two sockets per NUMA node with three sockets dented has socket 1 free", "fakeTopoMultiSocketDualSocketPerNumaHT", "1-19,21-38,41-60,61-78", [1]),
    ("two sockets per NUMA node with every socket dented has none free", "fakeTopoMultiSocketDualSocketPerNumaHT", "0-40,42-49,51-68,71-79", []),
]  # fmt: skip


@pytest.mark.parametrize(("case", "topo", "avail", "expect"), FREE_SOCKETS, ids=ids(FREE_SOCKETS))
def test_free_sockets_are_the_fully_available_sockets(
    case: str, topo: str, avail: str, expect: list[int]
) -> None:
    acc = _acc(topo, avail)
    assert sorted(acc.free_sockets()) == expect
    # on these uniform machines "all CPUs available" is the kubelet's size comparison
    by_size = [
        s
        for s in acc.sort_sockets()
        if (acc.t.socket[s] & acc.avail).bit_count() == acc.t.cpus_per_socket
    ]
    assert acc.free_sockets() == by_size


FREE_NUMAS = [
    ("single socket HT with every CPU free has NUMA node 0 free", "topoSingleSocketHT", "0-7", [0]),
    ("single socket HT missing CPU 0 has no free NUMA node", "topoSingleSocketHT", "1-7", []),
    ("dual socket HT with every CPU free has both NUMA nodes free", "topoDualSocketHT", "0-11", [0, 1]),
    ("dual socket HT missing CPU 10 has NUMA node 1 free", "topoDualSocketHT", "0-9,11", [1]),
    ("multi NUMA per socket with all CPUs free lists the four nodes in id order", "topoDualSocketMultiNumaPerSocketHT", "0-79", [0, 1, 2, 3]),
    ("multi NUMA per socket missing CPU 0 has nodes 1, 2 and 3 free", "topoDualSocketMultiNumaPerSocketHT", "1-79", [1, 2, 3]),
    ("multi NUMA per socket missing CPUs 0 and 10 lists nodes 2 and 3", "topoDualSocketMultiNumaPerSocketHT", "1-9,11-79", [2, 3]),
    ("multi NUMA per socket missing CPUs 0, 10 and 60 has node 3 free", "topoDualSocketMultiNumaPerSocketHT", "1-9,11-59,61-79", [3]),
    ("multi NUMA per socket with every node dented has none free", "topoDualSocketMultiNumaPerSocketHT", "1-9,11-59,61-78", []),
    ("two sockets per NUMA node missing CPU 10 has NUMA node 1 free", "fakeTopoMultiSocketDualSocketPerNumaHT", "0-9,11-79", [1]),
    ("sockets-first order lists the free nodes of the fuller socket last", "topoDualSocketMultiNumaPerSocketHT", "1-59,61-79", [1, 3]),
]  # fmt: skip


@pytest.mark.parametrize(("case", "topo", "avail", "expect"), FREE_NUMAS, ids=ids(FREE_NUMAS))
def test_free_numa_nodes_come_in_the_kubelet_sorted_order(
    case: str, topo: str, avail: str, expect: list[int]
) -> None:
    acc = _acc(topo, avail)
    assert acc.free_numas() == expect


FREE_CORES = [
    ("single socket HT with all CPUs free lists cores 0 to 3", "topoSingleSocketHT", "0-7", [0, 1, 2, 3]),
    ("single socket HT without core 3 lists cores 0 to 2", "topoSingleSocketHT", "0-2,4-6", [0, 1, 2]),
    ("a partly consumed core is not free", "topoSingleSocketHT", "0-6", [0, 1, 2]),
    ("no available CPU means no free core", "topoSingleSocketHT", "", []),
    ("four half cores are not free cores", "topoSingleSocketHT", "0-3", []),
    ("dual socket HT lists socket 0 cores before socket 1 cores", "topoDualSocketHT", "0-11", [0, 2, 4, 1, 3, 5]),
    ("the emptier socket's cores come first", "topoDualSocketHT", "1-5,7-11", [2, 4, 1, 3, 5]),
    ("one core consumed on each socket leaves two per socket", "topoDualSocketHT", "2-5,8-11", [2, 4, 3, 5]),
]  # fmt: skip


@pytest.mark.parametrize(("case", "topo", "avail", "expect"), FREE_CORES, ids=ids(FREE_CORES))
def test_free_cores_come_in_the_kubelet_sorted_order(
    case: str, topo: str, avail: str, expect: list[int]
) -> None:
    acc = _acc(topo, avail)
    assert acc.free_cores() == expect
    by_size = [
        c
        for c in acc.sort_cores()
        if (acc.t.core[c] & acc.avail).bit_count() == acc.t.cpus_per_core
    ]
    assert acc.free_cores() == by_size


CPU_ORDER = [
    ("all eight CPUs are listed core by core", "topoSingleSocketHT", "0-7", [0, 4, 1, 5, 2, 6, 3, 7]),
    ("half-free cores come before the whole free core", "topoSingleSocketHT", "3-7", [4, 5, 6, 3, 7]),
    ("dual socket HT lists socket 0 core by core first", "topoDualSocketHT", "0-11", [0, 6, 2, 8, 4, 10, 1, 7, 3, 9, 5, 11]),
    ("the dented socket goes first and its half core leads", "topoDualSocketHT", "1-11", [6, 2, 8, 4, 10, 1, 7, 3, 9, 5, 11]),
    ("the emptier socket goes first", "topoDualSocketHT", "1-5,7-11", [2, 8, 4, 10, 1, 7, 3, 9, 5, 11]),
    ("triple socket orders NUMA nodes by available CPUs", "topoTripleSocketHT", "0-3,6-13", [12, 13, 0, 1, 2, 3, 6, 7, 8, 9, 10, 11]),
]  # fmt: skip


@pytest.mark.parametrize(("case", "topo", "avail", "expect"), CPU_ORDER, ids=ids(CPU_ORDER))
def test_packed_cpu_order_matches_the_kubelet(
    case: str, topo: str, avail: str, expect: list[int]
) -> None:
    assert _acc(topo, avail).cpu_order() == expect


# ====================================================================== NUMA packed
COMMON = [
    ("taking more CPUs than available fails with the kubelet message", "topoSingleSocketHT", "0,2,4,6", 5, "not enough cpus available to satisfy request: requested=5, available=4"),
    ("taking zero CPUs gives the empty set", "topoSingleSocketHT", "0-7", 0, ""),
    ("one CPU from an idle single socket is CPU 0", "topoSingleSocketHT", "0-7", 1, "0"),
    ("one CPU prefers the half-used core", "topoSingleSocketHT", "1,3,5-7", 1, "6"),
    ("two CPUs are a whole core", "topoSingleSocketHT", "0-7", 2, "0,4"),
    ("all CPUs of a single socket", "topoSingleSocketHT", "0-7", 8, "0-7"),
    ("two CPUs take the only whole free core", "topoSingleSocketHT", "0-3,6", 2, "2,6"),
    ("a socket's worth takes socket 0 whole", "topoDualSocketHT", "0-11", 6, "0,2,4,6,8,10"),
    ("forty CPUs take a whole socket of the 6230", "topoDualSocketMultiNumaPerSocketHT", "0-79", 40, "0-19,40-59"),
    ("twenty CPUs take a whole NUMA node", "topoDualSocketMultiNumaPerSocketHT", "0-79", 20, "0-9,40-49"),
    ("twenty CPUs take the first free NUMA node when node 0 is used", "topoDualSocketMultiNumaPerSocketHT", "10-39,50-79", 20, "10-19,50-59"),
    ("sixty CPUs take a socket and a NUMA node", "topoDualSocketMultiNumaPerSocketHT", "0-79", 60, "0-29,40-69"),
    ("sixty CPUs with core 0 taken take socket 1 and NUMA node 1", "topoDualSocketMultiNumaPerSocketHT", "1-39,41-79", 60, "10-39,50-79"),
]  # fmt: skip

PACKED_ONLY = [
    ("one CPU comes from the emptier socket 0", "topoDualSocketHT", "1-5,7-11", 1, "2"),
    ("eight CPUs fill NUMA node 0 then one core of node 1", "topoDualSocketHT", "0-11", 8, "0,6,2,8,4,10,1,7"),
    ("sixty-four CPUs fill three NUMA nodes and take two cores of the fourth", "topoDualSocketMultiNumaPerSocketHT", "0-79", 64, "0-29,40-69,30,31,70,71"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("case", "topo", "avail", "n", "expect"), COMMON + PACKED_ONLY, ids=ids(COMMON + PACKED_ONLY)
)
def test_numa_packed_matches_the_kubelet(
    case: str, topo: str, avail: str, n: int, expect: str
) -> None:
    if expect.startswith("not enough"):
        with pytest.raises(AllocationError) as err:
            take_by_topology_numa_packed(K.get(topo), P(avail), n)
        assert str(err.value) == expect
        assert err.value.reason == "not_enough_cpus"
    else:
        assert take_by_topology_numa_packed(K.get(topo), P(avail), n) == P(expect)


UNCORE = [
    ("two whole uncore caches then a partial one", "topoUncoreSingleSocketNoSMT", "1-15", 10, "1,2,4-11"),
    ("without uncore caches the odd single CPU still goes through the partial-uncore rule", "topoDualSocketHT", "1-5,7-11", 1, "1"),
    ("four CPUs take the first uncore cache of socket 0", "topoUncoreDualSocketNoSMT", "0-15", 4, "0-3"),
    ("six CPUs take uncore 1 whole and the rest of uncore 0", "topoUncoreDualSocketNoSMT", "2-15", 6, "2-7"),
    ("four CPUs take the first uncore cache of socket 1", "topoUncoreDualSocketNoSMT", "8-15", 4, "8-11"),
    ("two CPUs fit the first uncore cache that has two", "topoUncoreSingleSocketMultiNuma", "3,4-8,12", 2, "4,5"),
    ("six SMT CPUs skip the uncore cache with only four", "topoUncoreSingleSocketSMT", "2-3,10-11,4-7,12-15", 6, "4-6,12-14"),
    ("ten SMT CPUs take a whole uncore and one core of the other", "topoUncoreSingleSocketSMT", "1-7,9-15", 10, "4-7,12-15,1,9"),
    ("odd three CPUs drop the highest CPU of two candidate cores", "topoSingleSocketSingleNumaPerSocketSMTSmallUncore", "2-63,66-127", 3, "2,3,66"),
    ("odd three CPUs fit an uncore cache with five free CPUs", "topoSingleSocketSingleNumaPerSocketSMTSmallUncore", "2-63,65-127", 3, "2,65,66"),
    ("even integer required on odd integer partial uncore", "topoSingleSocketSingleNumaPerSocketSMTSmallUncore", "2-63,65-127", 4, "4,5,68,69"),
    ("large odd request takes a whole uncore and a partial one", "topoSingleSocketSingleNumaPerSocketSMTSmallUncore", "2-63,65-127", 11, "2,65,66,4-7,68-71"),
    ("odd request on a monolithic uncore takes the first cores with free CPUs", "topoDualSocketSubNumaPerSocketHTMonolithicUncore", "2-119,121-127", 5, "2,3,121-123"),
    ("even request on a monolithic uncore falls through to whole cores", "topoDualSocketSubNumaPerSocketHTMonolithicUncore", "2-119,121-127", 4, "2,3,122,123"),
    ("odd five CPUs without SMT skip the half-used uncore", "topoSmallSingleSocketSingleNumaPerSocketNoSMTUncore", "4-31", 5, "8-12"),
    ("no uncore fits so whole cores spread over two uncore caches", "topoSmallSingleSocketSingleNumaPerSocketNoSMTUncore", "4-7,12-15,20-23,28-31", 8, "4-7,12-15"),
    ("even strict-reserved request takes one core of uncore 0", "topoSingleSocketSingleNumaPerSocketSMTSmallUncore", "2-63,66-127", 2, "2,66"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "topo", "avail", "n", "expect"), UNCORE, ids=ids(UNCORE))
def test_uncore_alignment_matches_the_kubelet(
    case: str, topo: str, avail: str, n: int, expect: str
) -> None:
    got = take_by_topology_numa_packed(K.get(topo), P(avail), n, prefer_uncore=True)
    assert got == P(expect)


SPREAD = [
    ("three CPUs of a single socket are one per core", "topoSingleSocketHT", "0-7", 3, "0-2"),
    ("two CPUs are on different cores of socket 0", "topoDualSocketHT", "0-11", 2, "0,2"),
    ("three CPUs are on three cores of socket 0", "topoDualSocketHT", "0-11", 3, "0,2,4"),
    ("six CPUs are the whole socket 0", "topoDualSocketHT", "0-11", 6, "0,2,4,6,8,10"),
    ("eight CPUs spill two CPUs onto socket 1", "topoDualSocketHT", "0-11", 8, "0,2,4,6,8,10,1,3"),
    ("two CPUs without SMT are the first two", "topoDualSocketNoHT", "0-7", 2, "0,1"),
    ("eight CPUs of the 6230 are the first eight thread-0 CPUs", "topoDualSocketMultiNumaPerSocketHT", "0-79", 8, "0-7"),
    ("twelve CPUs of the quad socket are twelve cores of socket 0", "topoQuadSocketFourWayHT", "0-287", 12, "0-2,9-10,13-14,21-22,25-26,33"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "topo", "avail", "n", "expect"), SPREAD, ids=ids(SPREAD))
def test_distribute_cpus_across_cores_matches_the_kubelet(
    case: str, topo: str, avail: str, n: int, expect: str
) -> None:
    assert take_by_topology_numa_packed(K.get(topo), P(avail), n, spread=True) == P(expect)


# ====================================================================== NUMA distributed
DISTRIBUTED = [(c, t, a, n, 1, e) for c, t, a, n, e in COMMON] + [
    ("eight CPUs are two cores on each NUMA node", "topoDualSocketHT", "0-11", 8, 1, "0,6,2,8,1,7,3,9"),
    ("sixty-four CPUs are eight cores on each of four NUMA nodes", "topoDualSocketMultiNumaPerSocketHT", "0-79", 64, 1, "0-7,10-17,20-27,30-37,40-47,50-57,60-67,70-77"),
    ("forty-eight CPUs are eight cores on each of the first three NUMA nodes", "topoDualSocketMultiNumaPerSocketHT", "0-79", 48, 1, "0-7,10-17,20-27,40-47,50-57,60-67"),
    ("forty-eight CPUs take all but two CPUs of the dented first node", "topoDualSocketMultiNumaPerSocketHT", "1-29,32-39,41-69,72-79", 48, 1, "1-8,10-17,20-27,41-48,50-57,60-67"),
    ("forty-eight CPUs go to the last three nodes to keep balance", "topoDualSocketMultiNumaPerSocketHT", "2-29,31-39,42-69,71-79", 48, 1, "10-17,20-27,31-38,50-57,60-67,71-78"),
    ("sixteen CPUs are two per NUMA node when only three are left per node", "topoDualSocketMultiNumaPerSocketHT", "0-2,10-12,20-22,30-32,40-41,50-51,60-61,70-71", 16, 1, "0-1,10-11,20-21,30-31,40-41,50-51,60-61,70-71"),
    ("one CPU with group size one comes from the fuller NUMA node 1", "topoDualSocketHT", "1-5,7-11", 1, 1, "1"),
    ("one CPU with group size two falls back to packing", "topoDualSocketHT", "1-5,7-11", 1, 2, "2"),
    ("twenty-six CPUs are thirteen per node on two nodes", "topoDualSocketMultiNumaPerSocketHT", "0-79", 26, 1, "0-6,10-16,40-45,50-55"),
    ("twenty-six CPUs in groups of two are fourteen and twelve", "topoDualSocketMultiNumaPerSocketHT", "0-79", 26, 2, "0-6,10-15,40-46,50-55"),
    ("sixty-two CPUs spill one CPU each onto NUMA nodes 0 and 1", "topoDualSocketMultiNumaPerSocketHT", "0-79", 62, 1, "0-7,10-17,20-27,30-37,40-47,50-57,60-66,70-76"),
    ("sixty-two CPUs in groups of two spill onto NUMA nodes 0, 1 and 2", "topoDualSocketMultiNumaPerSocketHT", "0-79", 62, 2, "0-7,10-17,20-27,30-36,40-47,50-57,60-67,70-76"),
    ("sixty-two CPUs spill onto NUMA nodes 2 and 3 to keep balance", "topoDualSocketMultiNumaPerSocketHT", "0-8,10-18,20-39,40-48,50-58,60-79", 62, 1, "0-7,10-17,20-27,30-37,40-46,50-56,60-67,70-77"),
    ("sixty-two CPUs in groups of two spill onto nodes 0, 2 and 3 to keep balance", "topoDualSocketMultiNumaPerSocketHT", "0-8,10-18,20-39,40-48,50-58,60-79", 62, 2, "0-7,10-16,20-27,30-37,40-47,50-56,60-67,70-77"),
    ("the remainder goes only to NUMA nodes that can take it", "topoDualSocketMultiNumaPerSocketHT", "0-3,10-13,20-23,30-36,40-43,50-53,60-63,70-76", 34, 1, "0-3,10-13,20-23,30-34,40-43,50-53,60-63,70-74"),
    ("the live-machine failure on eight NUMA nodes is reproduced as fixed", "topoDualSocketMultiNumaPerSocketHTLarge", "0,128,30,31,158,159,43-47,171-175,62,63,190,191,75-79,203-207,94,96,222,223,101-111,229-239,126,127,254,255", 28, 1, "43-47,75-79,96,101-105,171-174,203-206,229-232"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("case", "topo", "avail", "n", "group", "expect"), DISTRIBUTED, ids=ids(DISTRIBUTED)
)
def test_numa_distributed_matches_the_kubelet(
    case: str, topo: str, avail: str, n: int, group: int, expect: str
) -> None:
    if expect.startswith("not enough"):
        with pytest.raises(AllocationError, match=r"^not enough cpus available"):
            take_by_topology_numa_distributed(K.get(topo), P(avail), n, group)
    else:
        assert take_by_topology_numa_distributed(K.get(topo), P(avail), n, group) == P(expect)


def test_balance_rounds_mean_and_std_dev_to_three_decimals_half_away_from_zero() -> None:
    assert ks._go_round(2.5) == 3.0 and ks._go_round(-2.5) == -3.0 and ks._go_round(0.4999) == 0.0
    # mean of (1, 2) = 1.5; deviations 0.5 -> std dev 0.5 exactly
    assert ks._std_dev([1, 2]) == 0.5
    # mean 1/3 rounds to 0.333 before the deviations are taken
    assert ks._std_dev([0, 0, 1]) == round((((0.333**2) * 2 + 0.667**2) / 3) ** 0.5, 3)


def test_combinations_keep_go_slice_aliasing_for_four_or_more_elements() -> None:
    seen: list[ks._GoSlice] = []

    def keep(into: list[ks._GoSlice]) -> Callable[[ks._GoSlice], bool]:
        def visit(view: ks._GoSlice) -> bool:
            into.append(view)
            return False

        return visit

    ks._iterate_combinations([0, 1, 2, 3, 4], 4, keep(seen))
    assert [v.items() for v in seen][-1] == [1, 2, 3, 4]
    # [0,1,2,3] and [0,1,2,4] share a backing array: the kept view now reads the later combo
    assert seen[0].items() == [0, 1, 2, 4]
    small: list[ks._GoSlice] = []
    ks._iterate_combinations([0, 1, 2], 2, keep(small))
    assert [v.items() for v in small] == [[0, 1], [0, 2], [1, 2]]


def test_combinations_stop_when_the_visitor_says_break() -> None:
    seen: list[list[int]] = []

    def visit(view: ks._GoSlice) -> bool:
        seen.append(view.items())
        return len(seen) == 2

    ks._iterate_combinations([5, 6, 7], 2, visit)
    assert seen == [[5, 6], [5, 7]]


# ====================================================================== static policy
@dataclass(frozen=True)
class StaticCase:
    id: str
    topo: str
    n: int
    default: str  # the kubelet's default (shared) cpuset
    num_reserved: int = 0
    reserved: str | None = None  # explicit --reserved-cpus
    options: dict[str, str] = field(default_factory=dict)
    hint: str | None = None  # NUMA affinity node ids
    expect: str = ""
    error: str | None = None


STATIC = [
    StaticCase("two CPUs go to the sibling pair 1,5 of the remaining cores", "topoSingleSocketHT", 2, "0,1,4,5", num_reserved=1, expect="1,5"),
    StaticCase("six CPUs take socket 1 whole", "topoDualSocketHT", 6, "0-1,3-11", num_reserved=1, expect="1,3,5,7,9,11"),
    StaticCase("six CPUs take three whole cores across sockets", "topoDualSocketHT", 6, "0,2-4,6-11", num_reserved=1, expect="2-4,8-10"),
    StaticCase("four CPUs without SMT take socket 1", "topoDualSocketNoHT", 4, "0-1,3-7", num_reserved=1, expect="4-7"),
    StaticCase("four CPUs without SMT take what is left", "topoDualSocketNoHT", 4, "0-1,3,6-7", num_reserved=1, expect="1,3,6,7"),
    StaticCase("eight CPUs take socket 1 and one core of socket 0", "topoDualSocketHT", 8, "0-1,3-11", num_reserved=1, expect="1,3-5,7,9-11"),
    StaticCase("twelve CPUs take the three whole four-thread cores", "topoQuadSocketFourWayHT", 12, "1-2,9,11-13,23,25,35,38,48,51,53-54,61,113,173,233", expect="1,11,13,23,25,35,38,48,53,113,173,233"),
    StaticCase("one CPU is the sibling of the reserved CPU", "topoSingleSocketHT", 1, "0-7", num_reserved=1, expect="4"),
    StaticCase("only partial cores left means their CPUs are taken", "topoQuadSocketFourWayHT", 5, "10-11,52-53,67", expect="10,11,52,53,67"),
    StaticCase("eight CPUs with one reserved is not enough", "topoSingleSocketHT", 8, "0-7", num_reserved=1, error="not enough cpus available to satisfy request: requested=8, available=7"),
    StaticCase("ten CPUs with eight available is not enough", "topoDualSocketHT", 10, "0,4-11", num_reserved=1, error="not enough cpus available to satisfy request: requested=10, available=8"),
    StaticCase("two CPUs with one available is not enough", "topoSingleSocketHT", 2, "0,7", num_reserved=1, error="not enough cpus available to satisfy request: requested=2, available=1"),
    StaticCase("seventy-six CPUs out of seven is not enough", "topoQuadSocketFourWayHT", 76, "10-11,37,52-53,55,67", error="not enough cpus available to satisfy request: requested=76, available=7"),
    StaticCase("full-pcpus-only refuses one CPU on SMT-2", "topoSingleSocketHT", 1, "0-7", num_reserved=1, options={"full-pcpus-only": "true"}, error="SMT Alignment Error: requested 1 cpus not multiple cpus per core = 2"),
    StaticCase("full-pcpus-only refuses fifteen CPUs on SMT-4", "topoQuadSocketFourWayHT", 15, "0-287", num_reserved=8, options={"full-pcpus-only": "true"}, error="SMT Alignment Error: requested 15 cpus not multiple cpus per core = 4"),
    StaticCase("full-pcpus-only counts the siblings of non-sibling reserved CPUs as taken", "topoDualSocketHT", 10, "0,2-5,7-11", reserved="1,6", num_reserved=2, options={"full-pcpus-only": "true"}, error="SMT Alignment Error: not enough free physical CPUs: available physical CPUs = 8, requested CPUs = 10, CPUs per core = 2"),
    StaticCase("full-pcpus-only with an automatic reservation gives every free CPU", "topoDualSocketHT", 10, "1-5,7-11", num_reserved=2, options={"full-pcpus-only": "true"}, expect="1-5,7-11"),
    StaticCase("full-pcpus-only with a sibling-pair reservation gives every free CPU", "topoDualSocketHT", 10, "1-5,7-11", reserved="0,6", num_reserved=2, options={"full-pcpus-only": "true"}, expect="1-5,7-11"),
    StaticCase("align-by-socket widens the NUMA hint to its sockets", "topoDualSocketMultiNumaPerSocketHT", 2, "0,2,11,21,22", num_reserved=1, options={"align-by-socket": "true"}, hint="0,2", expect="2,11"),
    StaticCase("without align-by-socket CPUs come strictly from the hinted NUMA nodes", "topoDualSocketMultiNumaPerSocketHT", 2, "0,2,11,21,22", num_reserved=1, options={"align-by-socket": "false"}, hint="0,2", expect="2,21"),
    StaticCase("two CPUs with no hint are core 0", "topoDualSocketHT", 2, "0-11", expect="0,6"),
    StaticCase("two CPUs hinted to NUMA node 0 are core 0", "topoDualSocketHT", 2, "0-11", hint="0", expect="0,6"),
    StaticCase("two CPUs hinted to NUMA node 1 are core 1", "topoDualSocketHT", 2, "0-11", hint="1", expect="1,7"),
    StaticCase("eight CPUs hinted to node 0 fill node 0 then take core 1", "topoDualSocketHT", 8, "0-11", hint="0", expect="0,6,2,8,4,10,1,7"),
    StaticCase("eight CPUs hinted to node 1 fill node 1 then take core 0", "topoDualSocketHT", 8, "0-11", hint="1", expect="1,7,3,9,5,11,0,6"),
    StaticCase("odd integer required on smt-enabled uses the partial uncore", "topoSingleSocketSingleNumaPerSocketSMTSmallUncore", 3, "0-127", reserved="0,1,64,65", num_reserved=4, options={"prefer-align-cpus-by-uncorecache": "true"}, expect="2,3,66"),
    StaticCase("odd integer required on odd integer partial uncore", "topoSingleSocketSingleNumaPerSocketSMTSmallUncore", 3, "0-127", reserved="0,1,64", num_reserved=3, options={"prefer-align-cpus-by-uncorecache": "true"}, expect="2,65,66"),
    StaticCase("even integer required on odd integer partial uncore", "topoSingleSocketSingleNumaPerSocketSMTSmallUncore", 4, "0-127", reserved="0,1,64", num_reserved=3, options={"prefer-align-cpus-by-uncorecache": "true"}, expect="4,5,68,69"),
    StaticCase("large odd integer required on smt-enabled", "topoSingleSocketSingleNumaPerSocketSMTSmallUncore", 11, "0-127", reserved="0,1,64", num_reserved=3, options={"prefer-align-cpus-by-uncorecache": "true"}, expect="2,65,66,4-7,68-71"),
    StaticCase("odd integer required on HT monolithic uncore", "topoDualSocketSubNumaPerSocketHTMonolithicUncore", 5, "0-127", reserved="0,1,120", num_reserved=3, options={"prefer-align-cpus-by-uncorecache": "true"}, expect="2,3,121-123"),
    StaticCase("even integer required on HT monolithic uncore", "topoDualSocketSubNumaPerSocketHTMonolithicUncore", 4, "0-127", reserved="0,1,120", num_reserved=3, options={"prefer-align-cpus-by-uncorecache": "true"}, expect="2,3,122,123"),
    StaticCase("strict reservation with uncore alignment avoids the reserved CPUs", "topoSingleSocketSingleNumaPerSocketSMTSmallUncore", 2, "2-63,66-127", reserved="0,1,64,65", num_reserved=4, options={"strict-cpu-reservation": "true", "prefer-align-cpus-by-uncorecache": "true"}, expect="2,66"),
    StaticCase("odd integer cpu required on smt-disabled", "topoSmallSingleSocketSingleNumaPerSocketNoSMTUncore", 5, "0-31", reserved="0-3", num_reserved=4, options={"full-pcpus-only": "true", "prefer-align-cpus-by-uncorecache": "true"}, expect="8-12"),
    StaticCase("monolithic uncore with full-pcpus-only takes three whole cores", "topoDualSocketSubNumaPerSocketHTMonolithicUncore", 6, "0-239", reserved="0,1,120,121", num_reserved=4, options={"full-pcpus-only": "true", "prefer-align-cpus-by-uncorecache": "true"}, expect="2-4,122-124"),
    StaticCase("distribute-cpus-across-numa with full-pcpus-only spreads whole cores", "topoDualSocketMultiNumaPerSocketHT", 26, "0-79", options={"distribute-cpus-across-numa": "true", "full-pcpus-only": "true"}, expect="0-6,10-15,40-46,50-55"),
    StaticCase("distribute-cpus-across-numa alone spreads single CPUs", "topoDualSocketMultiNumaPerSocketHT", 26, "0-79", options={"distribute-cpus-across-numa": "true"}, expect="0-6,10-16,40-45,50-55"),
    StaticCase("distribute-cpus-across-cores spreads threads over cores", "topoDualSocketHT", 3, "0-11", options={"distribute-cpus-across-cores": "true"}, expect="0,2,4"),
]  # fmt: skip


def _run_static(case: StaticCase) -> CPUSet:
    topo = K.get(case.topo)
    explicit = P(case.reserved) if case.reserved is not None else None
    reserved = select_reserved(topo, case.num_reserved, explicit, options=case.options)
    available = P(case.default) - reserved
    hint = P(case.hint) if case.hint is not None else None
    return static_allocate(topo, available, case.n, case.options, hint, reserved=reserved)


@pytest.mark.parametrize("case", STATIC, ids=[c.id for c in STATIC])
def test_static_policy_allocate_matches_the_kubelet(case: StaticCase) -> None:
    if case.error is not None:
        with pytest.raises(AllocationError) as err:
            _run_static(case)
        assert str(err.value) == case.error
        if case.error.startswith("SMT"):
            assert isinstance(err.value, SMTAlignmentError)
            assert err.value.reason == "smt_alignment"
        else:
            assert err.value.reason == "not_enough_cpus"
    else:
        assert _run_static(case) == P(case.expect)


def test_a_whole_quad_socket_is_taken_when_72_cpus_are_asked_and_socket_0_is_idle() -> None:
    topo = K.get("topoQuadSocketFourWayHT")
    default = topo.online_cpus - P("3-7,11")
    for options in ({}, {"full-pcpus-only": "true"}):
        assert static_allocate(topo, default, 72, options) == topo.cpus_in_sockets(0)


def test_76_cpus_take_quad_socket_1_and_the_one_whole_core_left() -> None:
    topo = K.get("topoQuadSocketFourWayHT")
    default = topo.cpus_in_sockets(1) | P("10,22,34,47,53,61,108,115,173,181,228,235")
    for options in ({}, {"full-pcpus-only": "true"}):
        got = static_allocate(topo, default, 76, options)
        assert got == topo.cpus_in_sockets(1) | P("10,22,34,47")


def test_options_insensitive_cases_give_the_same_cpus_with_full_pcpus_only() -> None:
    for case in STATIC[:7]:
        with_option = StaticCase(**{**case.__dict__, "options": {"full-pcpus-only": "true"}})
        assert _run_static(with_option) == _run_static(case), case.id


def test_reusable_cpus_of_finished_init_containers_join_the_allocatable_set() -> None:
    topo = K.get("topoSingleSocketHT")
    got = static_allocate(topo, P("2,3,6,7"), 2, {}, None, P("0,1,4,5"))
    assert got == P("0,4")


def test_zero_cpus_is_a_shared_pool_container_and_takes_nothing() -> None:
    assert static_allocate(K.get("topoSingleSocketHT"), P("0-7"), 0) == EMPTY


# ====================================================================== reserved CPUs
RESERVED = [
    ("two reserved CPUs on dual socket HT are core 0", "topoDualSocketHT", 2, None, "0,6"),
    ("one reserved CPU on single socket HT is CPU 0", "topoSingleSocketHT", 1, None, "0"),
    ("two reserved CPUs on single socket HT are CPU 0 and its sibling", "topoSingleSocketHT", 2, None, "0,4"),
    ("an explicit list of the right size is used as given", "topoDualSocketHT", 2, "0,1", "0,1"),
    ("zero reserved CPUs is the empty set", "topoDualSocketHT", 0, None, ""),
]  # fmt: skip


@pytest.mark.parametrize(
    ("case", "topo", "count", "explicit", "expect"), RESERVED, ids=ids(RESERVED)
)
def test_reserved_cpus_are_chosen_like_the_kubelet(
    case: str, topo: str, count: int, explicit: str | None, expect: str
) -> None:
    given_cpus = P(explicit) if explicit is not None else None
    assert select_reserved(K.get(topo), count, given_cpus) == P(expect)


def test_an_explicit_reserved_list_of_the_wrong_size_is_refused_with_the_kubelet_message() -> None:
    with pytest.raises(RequestError) as err:
        select_reserved(K.get("topoDualSocketHT"), 1, P("0,1"))
    assert str(err.value) == (
        "[cpumanager] unable to reserve the required amount of CPUs (size of 0-1 did not equal 1)"
    )


def test_reserving_more_cpus_than_the_machine_has_is_refused() -> None:
    with pytest.raises(RequestError, match=r"size of  did not equal 9"):
        select_reserved(K.get("topoSingleSocketHT"), 9)


# ====================================================================== options
def test_option_names_are_the_kubelet_ones() -> None:
    assert KUBELET_OPTIONS == (
        "full-pcpus-only",
        "distribute-cpus-across-numa",
        "align-by-socket",
        "distribute-cpus-across-cores",
        "strict-cpu-reservation",
        "prefer-align-cpus-by-uncorecache",
    )


@pytest.mark.parametrize(
    ("spelling", "value"),
    [("true", True), ("True", True), ("1", True), ("t", True), ("", True), ("false", False),
     ("FALSE", False), ("0", False), ("f", False)],
)  # fmt: skip
def test_option_values_follow_go_parse_bool_and_a_bare_name_means_true(
    spelling: str, value: bool
) -> None:
    assert parse_options({"full-pcpus-only": spelling}).full_pcpus_only is value


def test_options_may_be_given_as_name_or_name_equals_value_strings() -> None:
    opts = parse_options(["full-pcpus-only", "distribute-cpus-across-numa=false"])
    assert opts == KubeletOptions(full_pcpus_only=True)


def test_an_unknown_option_is_a_request_error_naming_it() -> None:
    with pytest.raises(RequestError) as err:
        parse_options({"turbo-mode": "true"})
    assert str(err.value) == 'unknown CPU Manager Policy option: "turbo-mode"'
    assert err.value.reason == "unknown_option"


def test_a_bad_boolean_value_is_refused_with_go_s_message() -> None:
    with pytest.raises(RequestError) as err:
        parse_options({"align-by-socket": "maybe"})
    assert str(err.value) == (
        'bad value for option "align-by-socket": strconv.ParseBool: parsing "maybe": invalid syntax'
    )


@pytest.mark.parametrize(
    ("first", "second"),
    [("full-pcpus-only", "distribute-cpus-across-cores"),
     ("distribute-cpus-across-numa", "distribute-cpus-across-cores"),
     ("prefer-align-cpus-by-uncorecache", "distribute-cpus-across-cores"),
     ("prefer-align-cpus-by-uncorecache", "distribute-cpus-across-numa")],
)  # fmt: skip
def test_option_pairs_the_kubelet_refuses_to_combine_are_refused(first: str, second: str) -> None:
    with pytest.raises(RequestError) as err:
        parse_options({first: "true", second: "true"})
    assert (
        str(err.value)
        == f"static policy options {first} and {second} can not be used at the same time"
    )


def test_align_by_socket_is_refused_where_sockets_outnumber_numa_nodes() -> None:
    with pytest.raises(RequestError, match=r"^Align by socket is not compatible"):
        static_allocate(
            K.get("fakeTopoMultiSocketDualSocketPerNumaHT"),
            P("0-79"),
            2,
            {"align-by-socket": "true"},
        )


def test_take_by_topology_picks_the_algorithm_from_the_options() -> None:
    topo = K.get("topoDualSocketMultiNumaPerSocketHT")
    assert take_by_topology(topo, P("0-79"), 26) == P("0-12,40-52")
    assert take_by_topology(topo, P("0-79"), 26, {"distribute-cpus-across-numa": "true"}) == P(
        "0-6,10-16,40-45,50-55"
    )


# ====================================================================== Policy object
POLICY = KubeletStaticPolicy()


def test_the_policy_decides_like_static_allocate_and_explains_its_stages() -> None:
    topo = K.get("topoDualSocketMultiNumaPerSocketHT")
    decision = POLICY.decide(topo, Request(count=22), P("0-79"))
    assert decision.cpus == P("0-10,40-50")
    assert decision.mems == P("0-1")
    assert decision.withheld == decision.cpus
    assert decision.policy == "kubelet-static"
    levels = [s.level for s in decision.explanation]
    assert levels == ["numa", "core"]
    assert decision.explanation[0].choice == "0-9,40-49"


def test_the_policy_withholds_reserved_cpus_given_as_options() -> None:
    topo = K.get("topoDualSocketHT")
    request = Request(count=2, options={"num-reserved-cpus": "2"})
    decision = POLICY.decide(topo, request, P("0-11"))
    assert decision.cpus == P("2,8")
    assert decision.explanation[0].choice == "0,6"


def test_the_policy_maps_whole_core_smt_preference_to_full_pcpus_only() -> None:
    with pytest.raises(SMTAlignmentError):
        POLICY.decide(K.get("topoSingleSocketHT"), Request(count=3, smt="whole-cores"), P("0-7"))


def test_the_policy_uses_the_numa_hint_as_the_topology_manager_affinity() -> None:
    decision = POLICY.decide(
        K.get("topoDualSocketHT"), Request(count=2, numa_hint=P("1")), P("0-11")
    )
    assert decision.cpus == P("1,7")


def test_a_shared_request_gets_the_shared_pool_minus_strictly_reserved_cpus() -> None:
    topo = K.get("topoDualSocketHT")
    plain = POLICY.decide(
        topo, Request(count=1, exclusive=False, options={"num-reserved-cpus": "2"}), P("0-11")
    )
    assert plain.cpus == P("0-11")
    strict = POLICY.decide(
        topo,
        Request(
            count=1,
            exclusive=False,
            options={"num-reserved-cpus": "2", "strict-cpu-reservation": ""},
        ),
        P("0-11"),
    )
    assert strict.cpus == P("1-5,7-11")


def test_the_policy_refuses_exclusiveness_levels_it_does_not_have() -> None:
    with pytest.raises(RequestError, match="level 'core'"):
        POLICY.decide(K.get("topoDualSocketHT"), Request(count=2, level="core"), P("0-11"))


def test_the_policy_refuses_unknown_options_by_name() -> None:
    with pytest.raises(RequestError, match="turbo"):
        POLICY.decide(
            K.get("topoDualSocketHT"), Request(count=2, options={"turbo": "1"}), P("0-11")
        )


def test_the_policy_is_registered_under_its_name() -> None:
    from corepin.allocation.policies import get_policy

    assert get_policy("kubelet-static").name == "kubelet-static"


# ====================================================================== properties
@st.composite
def machines(draw: st.DrawFn) -> Topology:
    sockets = draw(st.integers(1, 3))
    numa_per_socket = draw(st.integers(1, 3))
    cores_per_numa = draw(st.integers(1, 4))
    threads = draw(st.integers(1, 2))
    l3_per_numa = draw(st.sampled_from([1, cores_per_numa]))
    cores = sockets * numa_per_socket * cores_per_numa
    rows = []
    for core in range(cores):
        numa = core // cores_per_numa
        socket = numa // numa_per_socket
        l3 = numa * l3_per_numa + (core % cores_per_numa) * l3_per_numa // cores_per_numa
        for t in range(threads):
            rows.append(CPUInfo(cpu=core + t * cores, core=core, socket=socket, numa=numa, l3=l3))
    return Topology(rows)


OPTION_SETS = [
    {},
    {"full-pcpus-only": "true"},
    {"distribute-cpus-across-numa": "true"},
    {"distribute-cpus-across-numa": "true", "full-pcpus-only": "true"},
    {"distribute-cpus-across-cores": "true"},
    {"prefer-align-cpus-by-uncorecache": "true"},
    {"prefer-align-cpus-by-uncorecache": "true", "full-pcpus-only": "true"},
]


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[Topology, CPUSet, int, dict[str, str], CPUSet | None]:
    topo = draw(machines())
    cpus = topo.online_cpus.sorted()
    avail = CPUSet(draw(st.lists(st.sampled_from(cpus), unique=True, max_size=len(cpus))))
    n = draw(st.integers(1, len(cpus)))
    options = draw(st.sampled_from(OPTION_SETS))
    nodes = topo.numa_node_ids()
    hint = draw(st.one_of(st.none(), st.sets(st.sampled_from(nodes), min_size=1).map(CPUSet)))
    return topo, avail, n, options, hint


@settings(max_examples=examples(150))
@given(scenarios())
def test_static_allocate_gives_exactly_n_available_cpus_or_a_typed_error(
    scenario: tuple[Topology, CPUSet, int, dict[str, str], CPUSet | None],
) -> None:
    topo, avail, n, options, hint = scenario
    try:
        got = static_allocate(topo, avail, n, options, hint)
    except AllocationError as err:
        assert err.reason in {"not_enough_cpus", "smt_alignment", "allocation_failed"}
        if err.reason == "not_enough_cpus":
            assert n > len(avail)
        return
    assert len(got) == n
    assert got.issubset(avail)
    assert static_allocate(topo, avail, n, options, hint) == got  # deterministic
    if options.get("full-pcpus-only") and len(topo.cpus) % len(topo.core_ids()) == 0:
        whole = [c for c in topo.core_ids() if topo.cpus_in_cores(c).issubset(avail)]
        if len(whole) * topo.threads_per_core == len(avail):
            for cpu in got:
                assert topo.siblings_of(cpu).issubset(got)


@settings(max_examples=examples(100))
@given(scenarios())
def test_packed_and_distributed_never_leave_the_available_set(
    scenario: tuple[Topology, CPUSet, int, dict[str, str], CPUSet | None],
) -> None:
    topo, avail, n, _options, _hint = scenario
    if n > len(avail):
        with pytest.raises(AllocationError, match=r"^not enough cpus"):
            take_by_topology_numa_packed(topo, avail, n)
        return
    for spread in (False, True):
        got = take_by_topology_numa_packed(topo, avail, n, spread=spread, prefer_uncore=not spread)
        assert len(got) == n and got.issubset(avail)
    for group in (1, 2):
        got = take_by_topology_numa_distributed(topo, avail, n, group)
        assert len(got) == n and got.issubset(avail)


# ====================================================================== non-uniform machines
# The kubelet's "free unit" test compares sizes with the machine-wide average; on hybrid or
# partly offline machines that would hand out unavailable CPUs. These pin the fix.
def _synthetic(name: str) -> Topology:
    from corepin.testing import machines as synthetic

    return synthetic.named(name)


def test_hybrid_two_cpus_never_include_the_unavailable_sibling_of_a_performance_core() -> None:
    topo = _synthetic("hybrid")
    avail = P("1-8,10-15")
    got = static_allocate(topo, avail, 2)
    assert got <= avail and len(got) == 2
    assert 0 not in got


def test_offline_cpus_machine_never_returns_the_excluded_cpu_1_for_any_count() -> None:
    topo = _synthetic("offline_cpus")
    avail = topo.online_cpus - P("1")
    for n in range(1, len(avail) + 1):
        got = static_allocate(topo, avail, n)
        assert 1 not in got and got <= avail and len(got) == n, (n, got)


def test_policy_decide_on_hybrid_and_offline_machines_stays_inside_available() -> None:
    for name, avail in (("hybrid", P("1-8,10-15")), ("offline_cpus", P("2,4-10,12,14-15"))):
        topo = _synthetic(name)
        for n in range(1, len(avail) + 1):
            d = POLICY.decide(topo, Request(count=n), avail)
            assert d.cpus <= avail and len(d.cpus) == n, (name, n, d.cpus)


def test_header_counts_and_units_only_count_online_cpus() -> None:
    topo = _synthetic("offline_cpus")  # CPUs 0, 3, 11 and 13 are offline
    t = ks._tables(topo)
    assert CPUSet.from_bits(t.all_mask) == topo.online_cpus
    assert t.num_cpus == 12
    assert t.num_cores == 7  # core 3 (CPUs 3, 11) is entirely offline
    assert t.num_sockets == 2
    for masks in (t.socket, t.numa, t.core, t.l3):
        for mask in masks.values():
            assert CPUSet.from_bits(mask) <= topo.online_cpus


def test_a_core_with_an_offline_sibling_is_free_when_its_one_online_cpu_is_available() -> None:
    topo = _synthetic("offline_cpus")  # CPU 8's sibling 0 is offline
    acc = ks._Accumulator(ks._tables(topo), P("8").bits, 0, False, None)
    assert acc.free_cores() == [topo.core_of(8)]
    assert acc.is_free(P("8").bits)


def test_a_performance_core_with_one_available_thread_is_not_free_on_hybrid() -> None:
    topo = _synthetic("hybrid")
    acc = ks._Accumulator(ks._tables(topo), P("1,8").bits, 0, False, None)
    assert acc.t.cpus_per_core == 1  # 16 CPUs / 12 cores: the kubelet would call core 0 free
    assert acc.free_cores() == [8]


def test_offline_cpus_in_available_are_never_chosen() -> None:
    topo = _synthetic("offline_cpus")
    got = static_allocate(topo, P("0-15"), 12)
    assert got == topo.online_cpus
    with pytest.raises(AllocationError, match="requested=13, available=12"):
        static_allocate(topo, P("0-15"), 13)


def test_the_subset_guard_raises_internal_inconsistency_instead_of_returning() -> None:
    assert ks._guard(0b0110, 0b1110) == 0b0110
    with pytest.raises(AllocationError) as err:
        ks._guard(0b0011, 0b0010)
    assert err.value.reason == "internal_inconsistency"
    assert "0" in str(err.value)


def _all_named() -> dict[str, Topology]:
    from corepin.testing import machines as synthetic

    return {name: synthetic.named(name) for name in sorted(synthetic.NAMED)}


_NAMED_CACHE: dict[str, Topology] = {}


def _named_topology(name: str) -> Topology:
    if not _NAMED_CACHE:
        _NAMED_CACHE.update(_all_named())
    return _NAMED_CACHE[name]


def _named_names() -> list[str]:
    from corepin.testing import machines as synthetic

    return sorted(synthetic.NAMED)


_BOOL_OPTIONS = (
    "full-pcpus-only",
    "distribute-cpus-across-numa",
    "align-by-socket",
    "distribute-cpus-across-cores",
    "strict-cpu-reservation",
    "prefer-align-cpus-by-uncorecache",
)


@settings(max_examples=examples(150))
@given(data=st.data(), name=st.sampled_from(_named_names()))
def test_on_every_named_synthetic_machine_any_option_combo_stays_inside_available(
    data: st.DataObject, name: str
) -> None:
    topo = _named_topology(name)
    online = topo.online_cpus.sorted()
    if len(online) > 64:  # large machines: a random window keeps the example cheap
        start = data.draw(st.integers(0, len(online) - 64))
        online = online[start : start + 64]
    avail = data.draw(strategies.cpu_subsets(online))
    n = data.draw(st.integers(1, max(1, len(avail) + 1)))
    chosen = data.draw(st.sets(st.sampled_from(_BOOL_OPTIONS)))
    options = {o: "true" for o in chosen}
    nodes = topo.numa_node_ids()
    hint = data.draw(st.one_of(st.none(), st.sets(st.sampled_from(nodes), min_size=1)))
    try:
        got = static_allocate(topo, avail, n, options, CPUSet(hint) if hint else None)
    except RequestError as err:  # option combinations the kubelet refuses
        assert err.reason in {"incompatible_options"}, err
        return
    except AllocationError as err:
        assert err.reason in {
            "not_enough_cpus",
            "smt_alignment",
            "allocation_failed",
            "accounting_error",
        }, err
        if err.reason == "not_enough_cpus":
            assert n > len(avail)
        return
    assert got <= avail, f"{name}: {got - avail} outside available {avail}"
    assert len(got) == n
    request = Request(count=n, options=options, numa_hint=CPUSet(hint) if hint else None)
    decided = POLICY.decide(topo, request, avail)
    assert decided.cpus == got
    assert decided.cpus <= avail and len(decided.cpus) == n
