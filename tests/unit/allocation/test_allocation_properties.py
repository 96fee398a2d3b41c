"""Hypothesis properties of every allocation policy."""

from __future__ import annotations

from functools import cache

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import support.alloc_topologies as T
from corepin.allocation.decide import decide
from corepin.allocation.levels import index_of
from corepin.allocation.policies import POLICY_NAMES, get_policy
from corepin.allocation.reserved import reserved_cpus
from corepin.allocation.types import LEVELS, WORKLOADS, Decision, Request
from corepin.core.cpuset import CPUSet
from corepin.core.errors import AllocationError, RequestError
from corepin.state.model import STRICT_RESERVATION, Assignment, HostState
from corepin.topology.model import Topology
from support import strategies
from support.budget import examples

SETTINGS = settings(max_examples=examples(150))


@cache
def _topology(shape: tuple[int, int, int, int, int], isolated: bool) -> Topology:
    sockets, numa, l3, cores, threads = shape
    total_cores = sockets * numa * l3 * cores
    iso = range(total_cores - 1, total_cores * threads, total_cores) if isolated else ()
    return T.build(sockets, numa, l3, cores, threads, isolated=iso)


shapes = strategies.build_shapes()


@st.composite
def scenarios(draw: st.DrawFn, *, isolated: bool | None = None) -> tuple[Topology, CPUSet, int]:
    iso = draw(st.booleans()) if isolated is None else isolated
    topo = _topology(draw(shapes), iso)
    online = topo.online_cpus.sorted()
    avail = draw(strategies.cpu_subsets(online))
    n = draw(st.integers(1, len(online) + 1))
    return topo, avail, n


def _requests(draw: st.DrawFn, policy: str, n: int) -> Request:
    if policy == "kubelet-static":
        return Request(n)
    level = draw(st.sampled_from(LEVELS))
    workload = draw(st.sampled_from((None, *WORKLOADS))) if policy == "workload-aware" else None
    smt = draw(st.sampled_from(("auto", "auto", "whole-cores", "spread")))
    return Request(n, level=level, workload=workload, smt=smt)


def _decide(topo: Topology, request: Request, avail: CPUSet, policy: str) -> Decision | None:
    try:
        return get_policy(policy).decide(topo, request, avail)
    except AllocationError as exc:
        assert isinstance(exc.reason, str) and exc.reason
        assert exc.exit_code == 3
        return None


@SETTINGS
@given(data=st.data(), scenario=scenarios(), policy=st.sampled_from(POLICY_NAMES))
def test_every_policy_returns_exactly_n_available_cpus_or_a_typed_error_and_is_deterministic(
    data: st.DataObject, scenario: tuple[Topology, CPUSet, int], policy: str
) -> None:
    topo, avail, n = scenario
    request = _requests(data.draw, policy, n)
    try:
        first = _decide(topo, request, avail, policy)
    except RequestError as exc:  # kubelet-static option checks on odd machines
        assert exc.exit_code == 2
        return
    second = _decide(topo, request, avail, policy)
    assert first == second, "same input, same decision"
    if first is None:
        return
    assert first.cpus <= avail
    if request.workload == "best-effort":
        assert len(first.cpus) == n
        assert not first.withheld
    else:
        assert len(first.cpus) == n
        assert first.withheld >= first.cpus
        if request.level != "cpu":
            # every withheld unit was entirely available
            assert first.withheld <= avail
    assert first.mems == topo.mems_of(first.cpus)


@SETTINGS
@given(scenario=scenarios(isolated=False))
def test_topology_aware_uses_one_numa_node_and_one_l3_whenever_one_can_hold_n(
    scenario: tuple[Topology, CPUSet, int],
) -> None:
    topo, avail, n = scenario
    d = _decide(topo, Request(n), avail, "topology-aware")
    if len(avail) < n:
        assert d is None
        return
    assert d is not None
    if any(len(topo.cpus_in_numa_nodes(i) & avail) >= n for i in topo.numa_node_ids()):
        assert len(d.mems) == 1
    if any(len(topo.cpus_in_l3s(i) & avail) >= n for i in topo.l3_ids()):
        assert len(topo.l3s_in(d.cpus)) == 1


@SETTINGS
@given(scenario=scenarios(isolated=False))
def test_topology_aware_takes_whole_cores_when_n_is_a_multiple_of_smt_and_an_l3_has_them(
    scenario: tuple[Topology, CPUSet, int],
) -> None:
    topo, avail, n = scenario
    t = topo.threads_per_core
    whole_in_l3 = []
    for l3 in topo.l3_ids():
        cpus = topo.cpus_in_l3s(l3)
        whole = [c for c in topo.cores_in(cpus) if topo.cpus_in_cores(c) <= avail]
        whole_in_l3.append(len(whole) * t)
    d = _decide(topo, Request(n), avail, "topology-aware")
    if n % t or max(whole_in_l3) < n:
        return
    assert d is not None
    for core in topo.cores_in(d.cpus):
        assert topo.cpus_in_cores(core) <= d.cpus, f"core {core} is split"
    assert len(topo.l3s_in(d.cpus)) == 1


@SETTINGS
@given(scenario=scenarios(isolated=False))
def test_topology_aware_takes_at_most_one_partial_core_when_whole_cores_suffice(
    scenario: tuple[Topology, CPUSet, int],
) -> None:
    topo, avail, n = scenario
    whole = sum(
        len(topo.cpus_in_cores(c)) for c in topo.cores_in(avail) if topo.cpus_in_cores(c) <= avail
    )
    idx = index_of(topo)
    d = _decide(topo, Request(n), avail, "topology-aware")
    if d is None or idx.threads_per_core == 1 or len(topo.numa_node_ids()) > 1:
        return
    if len(topo.l3_ids()) > 1 or whole < n:
        return
    partial = [c for c in topo.cores_in(d.cpus) if not topo.cpus_in_cores(c) <= d.cpus]
    assert len(partial) <= 1


@SETTINGS
@given(scenario=scenarios(isolated=True))
def test_topology_aware_prefers_isolated_cpus_for_exclusive_requests(
    scenario: tuple[Topology, CPUSet, int],
) -> None:
    topo, avail, n = scenario
    iso = topo.isolated_cpus & avail
    d = _decide(topo, Request(n), avail, "topology-aware")
    if d is not None and len(iso) >= n:
        assert d.cpus <= iso
    shared = _decide(topo, Request(1, exclusive=False), avail, "topology-aware")
    if shared is not None:
        assert shared.cpus.isdisjoint(topo.isolated_cpus)


@st.composite
def sequences(draw: st.DrawFn) -> tuple[Topology, int, list[tuple[str, object]]]:
    topo = _topology(draw(shapes), draw(st.booleans()))
    reserved = draw(st.integers(0, 2))
    ops: list[tuple[str, object]] = []
    for _ in range(draw(st.integers(1, 25))):
        if draw(st.integers(0, 3)) == 0:
            ops.append(("remove", draw(st.integers(0, 30))))
        else:
            policy = draw(st.sampled_from(POLICY_NAMES))
            n = draw(st.integers(1, 6))
            ops.append(("add", (policy, _requests(draw, policy, n))))
    return topo, reserved, ops


@settings(max_examples=examples(80))
@given(seq=sequences())
def test_exclusive_decisions_never_overlap_and_reserved_cpus_are_never_handed_out(
    seq: tuple[Topology, int, list[tuple[str, object]]],
) -> None:
    _check_no_overlap(seq)


def _check_no_overlap(seq: tuple[Topology, int, list[tuple[str, object]]]) -> None:
    """Replay the adds and removes through one PoolState: exclusive decisions never overlap,
    reserved CPUs are never handed out, the shared pool holds neither."""
    topo, reserved_count, ops = seq
    if reserved_count >= len(topo.online_cpus):
        reserved_count = 0
    reserved = reserved_cpus(topo, reserved_count)
    state = HostState.new(topo, reserved=reserved, options={STRICT_RESERVATION: "true"})
    assert len(state.reserved) == reserved_count
    added: list[str] = []
    for i, (op, arg) in enumerate(ops):
        if op == "remove":
            assert isinstance(arg, int)
            if added:
                state = state.remove(added.pop(arg % len(added)))
            continue
        assert isinstance(arg, tuple)
        policy, request = arg
        kind = "exclusive" if request.workload != "best-effort" else "shared"
        try:
            decision = decide(state.pools, topo, request, get_policy(policy), kind=kind)
        except (AllocationError, RequestError):
            continue
        cpus = (
            decision.cpus if kind == "exclusive" or decision.cpus != state.shared_pool else CPUSet()
        )
        state = state.add(Assignment(f"id{i}", kind, cpus, decision.withheld))
        added.append(f"id{i}")
        assert decision.cpus.isdisjoint(state.reserved)
        withheld = [a.withheld for a in state if a.withheld]
        seen = CPUSet()
        for claim in withheld:
            assert seen.isdisjoint(claim), "two exclusive decisions overlap"
            seen = seen | claim
        assert seen.isdisjoint(state.reserved)
        assert state.shared_pool.isdisjoint(seen | state.reserved)
        assert state.exclusive_cpus == seen
        assert state.overlaps() == []


LIBRARY = ("hybrid", "offline_cpus", "sixteen_numa", "multi_l3_per_numa", "dual_socket_ht")


@cache
def _library(name: str) -> Topology:
    from corepin.testing import machines as synthetic

    return synthetic.named(name)


@pytest.mark.parametrize(
    "policy",
    ["topology-aware", "workload-aware", "kubelet-static"],
)
@settings(max_examples=examples(120))
@given(data=st.data())
def test_on_hybrid_offline_and_sixteen_numa_machines_results_stay_within_available(
    policy: str, data: st.DataObject
) -> None:
    topo = _library(data.draw(st.sampled_from(LIBRARY)))
    online = topo.online_cpus.sorted()
    avail = data.draw(strategies.cpu_subsets(online))
    n = data.draw(st.integers(1, len(online)))
    request = _requests(data.draw, policy, n)
    try:
        d = _decide(topo, request, avail, policy)
    except RequestError:
        return
    if d is not None:
        assert d.cpus <= avail
        assert len(d.cpus) == n


# ----------------------------------------------------------------------------- odd machines
# AMD compute units (single-thread cores sharing an L2) and arm64 SoCs whose L3 and NUMA node
# span several packages (tests/support/strategies.py): the same invariants hold.


@cache
def _odd(spec: object) -> Topology:
    from corepin.testing import machines as synthetic

    if isinstance(spec, str):
        return synthetic.named(spec)
    if isinstance(spec, synthetic.ClusterSpec):
        return synthetic.clustered(spec)
    assert isinstance(spec, synthetic.SyntheticSpec)
    return synthetic.synthetic(spec)


odd_machines = st.one_of(
    st.sampled_from(["amd_compute_units", "arm_dynamiq"]),
    strategies.cluster_specs(),
    strategies.compute_unit_specs(),
).map(_odd)


@SETTINGS
@given(data=st.data(), topo=odd_machines, policy=st.sampled_from(POLICY_NAMES))
def test_on_compute_unit_and_dynamiq_machines_every_policy_gives_n_available_cpus_or_an_error(
    data: st.DataObject, topo: Topology, policy: str
) -> None:
    online = topo.online_cpus.sorted()
    avail = data.draw(strategies.cpu_subsets(online))
    n = data.draw(st.integers(1, len(online) + 1))
    request = _requests(data.draw, policy, n)
    try:
        first = _decide(topo, request, avail, policy)
    except RequestError as exc:
        assert exc.exit_code == 2
        return
    assert _decide(topo, request, avail, policy) == first, "same input, same decision"
    if first is None:
        return
    assert first.cpus <= avail
    assert len(first.cpus) == n
    if request.workload != "best-effort":
        assert first.withheld >= first.cpus
        if request.level != "cpu":
            assert first.withheld <= avail
    assert first.mems == topo.mems_of(first.cpus)


@st.composite
def odd_sequences(draw: st.DrawFn) -> tuple[Topology, int, list[tuple[str, object]]]:
    topo = draw(odd_machines)
    reserved = draw(st.integers(0, 2))
    ops: list[tuple[str, object]] = []
    for _ in range(draw(st.integers(1, 25))):
        if draw(st.integers(0, 3)) == 0:
            ops.append(("remove", draw(st.integers(0, 30))))
        else:
            policy = draw(st.sampled_from(POLICY_NAMES))
            ops.append(("add", (policy, _requests(draw, policy, draw(st.integers(1, 6))))))
    return topo, reserved, ops


@settings(max_examples=examples(80))
@given(seq=odd_sequences())
def test_on_compute_unit_and_dynamiq_machines_exclusive_decisions_never_overlap(
    seq: tuple[Topology, int, list[tuple[str, object]]],
) -> None:
    _check_no_overlap(seq)
