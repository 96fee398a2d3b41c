"""Tests for the rebalancing planner (`corepin.allocation.rebalance`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corepin.allocation.alignment import AlignmentMetrics
from corepin.allocation.policies import get_policy
from corepin.allocation.pools import NodePools
from corepin.allocation.rebalance import Alignment, Movable, Move, alignment_of, plan_moves
from corepin.allocation.types import Decision, Request
from corepin.core.cpuset import CPUSet
from corepin.core.errors import RequestError
from corepin.testing.machines import named
from corepin.topology.model import CPUInfo, Topology
from support.budget import examples

TOPOLOGY_AWARE = get_policy("topology-aware")


def two_numa_smt() -> Topology:
    """1 socket, 2 NUMA nodes (one L3 each), 4 cores per node, SMT 2: 16 CPUs.

    NUMA 0 = cores 0-3 (CPUs 0-3 + siblings 8-11), NUMA 1 = cores 4-7 (CPUs 4-7 + 12-15).
    """
    return Topology(
        [
            CPUInfo(core + 8 * thread, socket=0, numa=core // 4, l3=core // 4, l2=core, core=core)
            for core in range(8)
            for thread in range(2)
        ],
        name="two-numa-smt",
    )


def held(topology: Topology, *holds: CPUSet) -> NodePools:
    pools = NodePools.for_topology(topology)
    for cpus in holds:
        pools = pools.hold("exclusive", cpus)
    return pools


@dataclass
class OutOfBounds:
    """A broken policy: always answers CPUs 0-3, whether they are available or not."""

    name: str = "out-of-bounds"

    def decide(self, topology: Topology, request: Request, available: CPUSet) -> Decision:
        cpus = topology.online_cpus.lowest(request.count)
        return Decision(cpus, topology.mems_of(cpus), cpus, self.name)


# ------------------------------------------------------------------------------ alignment
class TestAlignment:
    def test_fewer_numa_nodes_win_whatever_the_l3_caches_and_partial_cores(self) -> None:
        assert Alignment(1, 3, 4).better_than(Alignment(2, 2, 0))
        assert not Alignment(2, 2, 0).better_than(Alignment(1, 3, 4))

    def test_an_equal_alignment_is_not_better(self) -> None:
        assert not Alignment(1, 1, 1).better_than(Alignment(1, 1, 1))

    def test_partial_cores_decide_only_between_equal_numa_and_l3_counts(self) -> None:
        assert Alignment(1, 1, 0).better_than(Alignment(1, 1, 2))
        assert Alignment(1, 1, 2).better_than(Alignment(1, 2, 0))

    def test_alignment_of_counts_nodes_caches_and_half_held_cores(self) -> None:
        topo = two_numa_smt()
        assert alignment_of(topo, CPUSet.of(3, 4)) == Alignment(2, 2, 2)
        assert alignment_of(topo, CPUSet.of(0, 8, 1, 9)) == Alignment(1, 1, 0)

    def test_the_minimum_of_an_odd_count_on_smt_allows_one_partial_core(self) -> None:
        metrics = AlignmentMetrics(two_numa_smt())
        assert metrics.minimum(3) == Alignment(1, 1, 1)
        assert metrics.minimum(10) == Alignment(2, 2, 0)

    def test_the_bound_within_a_set_uses_only_that_set(self) -> None:
        metrics = AlignmentMetrics(two_numa_smt())
        three_and_three = CPUSet.of(0, 1, 2, 4, 5, 6).bits
        assert metrics.best_within(three_and_three, 4) == Alignment(2, 2, 0)
        assert metrics.best_within(three_and_three, 3) == Alignment(1, 1, 1)


# ------------------------------------------------------------------------------ planning
class TestPlanMoves:
    def test_an_allocation_straddling_two_nodes_moves_into_one_with_a_one_line_reason(
        self,
    ) -> None:
        topo = two_numa_smt()
        cpus = CPUSet.of(3, 4, 11, 12)  # core 3 and core 4, whole, on two nodes
        moves = plan_moves(topo, held(topo, cpus), [Movable("a", cpus, cpus)], TOPOLOGY_AWARE)
        assert len(moves) == 1
        move = moves[0]
        assert (move.id, move.old, len(move.new)) == ("a", cpus, 4)
        assert move.before == Alignment(2, 2, 0)
        assert move.after == Alignment(1, 1, 0) == alignment_of(topo, move.new)
        assert move.new_withheld == move.new
        assert move.reason == (
            f"spans 2 NUMA nodes and 2 L3 caches where 1 and 1 would do; moved to {move.new}"
        )

    def test_the_reason_names_partial_cores_when_they_are_what_got_better(self) -> None:
        move = Move(
            "a",
            CPUSet.of(0, 1),
            CPUSet.of(0, 8),
            CPUSet.of(0, 8),
            Alignment(1, 1, 2),
            Alignment(1, 1, 0),
        )
        assert move.reason == (
            "spans 1 NUMA node and 1 L3 cache with 2 partial cores where 1, 1 and 0 would do; "
            "moved to 0,8"
        )
        assert move.to_json()["reason"] == move.reason

    def test_an_aligned_allocation_stays_even_with_the_whole_machine_free(self) -> None:
        topo = two_numa_smt()
        cpus = CPUSet.of(0, 8, 1, 9)
        assert plan_moves(topo, held(topo, cpus), [Movable("a", cpus, cpus)], TOPOLOGY_AWARE) == ()

    def test_nothing_moves_when_no_better_set_is_free(self) -> None:
        topo = two_numa_smt()
        cpus = CPUSet.of(3, 4, 11, 12)
        others = CPUSet.of(0, 1, 2, 8, 9, 10, 5, 6, 7, 13, 14, 15)  # everything else
        pools = held(topo, cpus, others)
        assert plan_moves(topo, pools, [Movable("a", cpus, cpus)], TOPOLOGY_AWARE) == ()

    def test_the_worst_allocation_moves_first_when_the_limit_allows_one(self) -> None:
        topo = named("sixteen_numa")  # 16 NUMA nodes of 4 CPUs
        metrics = AlignmentMetrics(topo)
        nodes = [topo.cpus_in_numa_nodes(n) for n in topo.numa_node_ids()]
        two_nodes = CPUSet.of(nodes[0].lowest(2).first(), nodes[1].lowest(1).first())
        four_nodes = CPUSet.of(*(nodes[i].lowest(1).first() for i in range(2, 6)))
        assert metrics.alignment(two_nodes).numa == 2
        assert metrics.alignment(four_nodes).numa == 4
        pools = held(topo, two_nodes, four_nodes)
        movable = [Movable("two", two_nodes, two_nodes), Movable("four", four_nodes, four_nodes)]
        first = plan_moves(topo, pools, movable, TOPOLOGY_AWARE, limit=1)
        assert [m.id for m in first] == ["four"]
        both = plan_moves(topo, pools, movable, TOPOLOGY_AWARE)
        assert [m.id for m in both] == ["four", "two"]

    def test_a_zero_limit_plans_nothing(self) -> None:
        topo = two_numa_smt()
        cpus = CPUSet.of(3, 4)
        movable = [Movable("a", cpus, cpus)]
        assert plan_moves(topo, held(topo, cpus), movable, TOPOLOGY_AWARE, limit=0) == ()

    def test_a_level_move_never_withholds_more_than_before(self) -> None:
        topo = two_numa_smt()
        cpus = CPUSet.of(3, 4)  # one thread each of cores 3 and 4, level core: both cores held
        withheld = CPUSet.of(3, 4, 11, 12)
        moves = plan_moves(
            topo, held(topo, withheld), [Movable("a", cpus, withheld, "core")], TOPOLOGY_AWARE
        )
        assert len(moves) == 1
        assert alignment_of(topo, moves[0].new) == Alignment(1, 1, 0)
        assert len(moves[0].new_withheld) <= len(withheld)

    def test_a_mixed_allocation_moves_and_keeps_its_kind(self) -> None:
        topo = two_numa_smt()
        cpus = CPUSet.of(3, 4)
        pools = NodePools.for_topology(topo).hold("mixed", cpus)
        moves = plan_moves(topo, pools, [Movable("m", cpus, cpus, kind="mixed")], TOPOLOGY_AWARE)
        assert len(moves) == 1 and moves[0].after.numa == 1

    def test_a_policy_answering_cpus_that_are_not_free_gets_no_move(self) -> None:
        topo = two_numa_smt()
        cpus = CPUSet.of(3, 4)
        pools = held(topo, cpus, CPUSet.of(0, 1))
        assert plan_moves(topo, pools, [Movable("a", cpus, cpus)], OutOfBounds()) == ()

    def test_the_plan_is_the_same_every_time(self) -> None:
        topo = named("multi_l3_per_numa")
        sets = [CPUSet.of(3, 4, 5, 6), CPUSet.of(11, 12, 40, 41), CPUSet.of(60, 70)]
        movable = [Movable(f"m{i}", s, s) for i, s in enumerate(sets)]
        pools = held(topo, *sets)
        first = plan_moves(topo, pools, movable, TOPOLOGY_AWARE)
        assert first and plan_moves(topo, pools, reversed(movable), TOPOLOGY_AWARE) == first


class TestBadInput:
    @pytest.mark.parametrize(
        ("make", "match"),
        [
            pytest.param(lambda: Movable("a", CPUSet(), CPUSet()), "non-empty", id="no CPUs"),
            pytest.param(
                lambda: Movable("a", CPUSet.of(1), CPUSet.of(1), "rack"),
                "level 'rack'",
                id="an unknown level",
            ),
            pytest.param(
                lambda: Movable("a", CPUSet.of(1), CPUSet.of(1), kind="shared"),
                "kind 'shared'",
                id="a shared allocation, which holds no CPU to move",
            ),
        ],
    )
    def test_a_movable_that_makes_no_sense_is_refused_by_name(
        self, make: Callable[[], object], match: str
    ) -> None:
        with pytest.raises(RequestError, match=match):
            make()

    def test_cpus_the_pools_do_not_hold_are_refused(self) -> None:
        topo = two_numa_smt()
        with pytest.raises(RequestError, match="movable 'a': CPUs 4 are not held"):
            plan_moves(
                topo,
                held(topo, CPUSet.of(3)),
                [Movable("a", CPUSet.of(3, 4), CPUSet.of(3, 4))],
                TOPOLOGY_AWARE,
            )

    def test_two_movables_holding_one_cpu_are_refused(self) -> None:
        topo = two_numa_smt()
        pools = held(topo, CPUSet.of(3, 4))
        movable = [
            Movable("a", CPUSet.of(3, 4), CPUSet.of(3, 4)),
            Movable("b", CPUSet.of(4), CPUSet.of(4)),
        ]
        with pytest.raises(RequestError, match="'b': CPUs 4 are held by another"):
            plan_moves(topo, pools, movable, TOPOLOGY_AWARE)

    def test_one_id_given_twice_is_refused(self) -> None:
        topo = two_numa_smt()
        pools = held(topo, CPUSet.of(3, 4))
        movable = [
            Movable("a", CPUSet.of(3), CPUSet.of(3)),
            Movable("a", CPUSet.of(4), CPUSet.of(4)),
        ]
        with pytest.raises(RequestError, match="given twice"):
            plan_moves(topo, pools, movable, TOPOLOGY_AWARE)

    def test_a_negative_limit_is_refused(self) -> None:
        topo = two_numa_smt()
        with pytest.raises(RequestError, match="limit"):
            plan_moves(topo, held(topo), [], TOPOLOGY_AWARE, limit=-1)


# ------------------------------------------------------------------------------ properties
MACHINES = ["dual_socket_ht", "multi_numa_per_socket", "multi_l3_per_numa", "sixteen_numa"]
POLICIES = ["topology-aware", "kubelet-static", "workload-aware"]


@st.composite
def fragmented(draw: st.DrawFn) -> tuple[Topology, NodePools, list[Movable], dict[str, CPUSet]]:
    """A machine with scattered holds: movable exclusive allocations, exclusive holds that must
    not move, share holds, and free CPUs left over."""
    topo = named(draw(st.sampled_from(MACHINES)))
    order = draw(st.permutations(sorted(topo.online_cpus)))
    pools = NodePools.for_topology(topo)
    movable: list[Movable] = []
    fixed: dict[str, CPUSet] = {}
    at = 0
    while at < len(order) and len(movable) + len(fixed) < 24:
        size = draw(st.sampled_from([1, 2, 3, 4, 6, 8]))
        role = draw(st.sampled_from(["movable", "movable", "fixed", "share", "free"]))
        cpus = CPUSet.of(*order[at : at + size])
        at += size
        if role == "free":
            continue
        name = f"{role}-{at}"
        if role == "share":
            pools = pools.hold("share", cpus)
            fixed[name] = cpus
            continue
        pools = pools.hold("exclusive", cpus)
        if role == "fixed":
            fixed[name] = cpus
        else:
            movable.append(Movable(name, cpus, cpus))
    return topo, pools, movable, fixed


@settings(max_examples=examples(60))
@given(
    case=fragmented(),
    policy_name=st.sampled_from(POLICIES),
    limit=st.none() | st.integers(0, 4),
    keep_shared=st.booleans(),
)
def test_moves_applied_in_order_improve_each_mover_and_never_share_a_cpu(
    case: tuple[Topology, NodePools, list[Movable], dict[str, CPUSet]],
    policy_name: str,
    limit: int | None,
    keep_shared: bool,
) -> None:
    topo, pools, movable, fixed = case
    moves = plan_moves(
        topo, pools, movable, get_policy(policy_name), limit=limit, keep_shared=keep_shared
    )
    assert limit is None or len(moves) <= limit
    assert len({m.id for m in moves}) == len(moves), "each allocation moves at most once"
    owners = {m.id: m.cpus for m in movable} | fixed
    by_id = {m.id: m for m in movable}
    shared_before = bool(pools.shared_pool)
    for move in moves:
        mover = by_id[move.id]
        assert move.old == mover.cpus
        assert len(move.new) == len(move.old) and move.new <= move.new_withheld
        assert move.before == alignment_of(topo, move.old)
        assert move.after == alignment_of(topo, move.new)
        assert move.after.better_than(move.before)
        assert len(move.new_withheld) <= len(mover.held)
        for other, cpus in owners.items():
            if other != move.id:
                assert move.new_withheld.isdisjoint(cpus), (move, other)
        pools = pools.release("exclusive", mover.held).hold("exclusive", move.new_withheld)
        owners[move.id] = move.new_withheld
        if keep_shared and shared_before:
            assert pools.shared_pool, "a move emptied the shared pool"
    assert (
        plan_moves(
            topo, case[1], movable, get_policy(policy_name), limit=limit, keep_shared=keep_shared
        )
        == moves
    ), "the plan is deterministic"


@settings(max_examples=examples(40))
@given(case=fragmented(), policy_name=st.sampled_from(POLICIES))
def test_allocations_already_at_their_minimum_are_never_moved(
    case: tuple[Topology, NodePools, list[Movable], dict[str, CPUSet]], policy_name: str
) -> None:
    topo, pools, movable, _ = case
    metrics = AlignmentMetrics(topo)
    aligned = [
        m
        for m in movable
        if not metrics.minimum(len(m.cpus)).better_than(metrics.alignment(m.cpus))
    ]
    assert plan_moves(topo, pools, aligned, get_policy(policy_name)) == ()


@st.composite
def aligned_allocations(draw: st.DrawFn) -> tuple[Topology, NodePools, list[Movable]]:
    """Allocations of whole cores, each inside one L3 cache (so inside one NUMA node), some of
    the machine left free."""
    topo = named(draw(st.sampled_from(MACHINES)))
    pools = NodePools.for_topology(topo)
    movable: list[Movable] = []
    for l3 in topo.l3_ids():
        cores = topo.cores_in_l3(l3)
        at = 0
        while at < len(cores):
            size = draw(st.integers(1, len(cores) - at))
            group = cores[at : at + size]
            at += size
            if draw(st.booleans()):
                cpus = topo.cpus_in_cores(*group)
                pools = pools.hold("exclusive", cpus)
                movable.append(Movable(f"l3-{l3}-core-{group[0]}", cpus, cpus))
    return topo, pools, movable


@settings(max_examples=examples(30))
@given(case=aligned_allocations(), policy_name=st.sampled_from(POLICIES))
def test_a_fully_aligned_set_of_allocations_yields_no_moves(
    case: tuple[Topology, NodePools, list[Movable]], policy_name: str
) -> None:
    topo, pools, movable = case
    assert plan_moves(topo, pools, movable, get_policy(policy_name)) == ()
