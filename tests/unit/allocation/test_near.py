"""CPUs near a device: device names to CPUs, and every policy's decision for `Request.near`."""

from __future__ import annotations

from functools import cache

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import support.alloc_topologies as T
from corepin.allocation.api import build_request, check_request, decide
from corepin.allocation.near import device_cpus, near_cpus
from corepin.allocation.policies import POLICY_NAMES, get_policy
from corepin.allocation.types import LEVELS, WORKLOADS, Decision, Request
from corepin.core.cpuset import CPUSet
from corepin.core.errors import AllocationError, InputError, RequestError
from corepin.topology.devices import Device
from corepin.topology.model import Topology
from support import strategies
from support.budget import examples

SETTINGS = settings(max_examples=examples(150))

GPU0 = Device("0000:17:00.0", 0x030200, 0x10DE, 0x2330, 0, CPUSet.parse("0-3,8-11"), ("nvidia0",))
GPU1 = Device("0000:b1:00.0", 0x030200, 0x10DE, 0x2330, 1, CPUSet(), ("nvidia1",))
NIC = Device("0000:ca:00.0", 0x020000, 0x15B3, 0x101D, None, CPUSet(), ("eth1",))


def _machine() -> Topology:
    """2 sockets, one NUMA node each, 4 cores x 2 threads: node 0 = 0-3,8-11, node 1 =
    4-7,12-15; a GPU on each node (the second with no local_cpulist) and a NIC without
    locality."""
    base = T.build(2, 1, 1, 4, 2)
    return Topology(base.cpus, base.numa_nodes, devices=(GPU0, GPU1, NIC))


MACHINE = _machine()


# ---------------------------------------------------------------- names to CPUs
@pytest.mark.parametrize(
    ("names", "cpus"),
    [
        (["nvidia0"], "0-3,8-11"),  # its local_cpulist
        (["/dev/nvidia1"], "4-7,12-15"),  # no local_cpulist: its NUMA node's CPUs
        (["b1:00.0"], "4-7,12-15"),  # a PCI address without the domain
        (["eth1"], "0-15"),  # no locality known: every CPU is as near
        (["nvidia0", "nvidia1"], "0-15"),  # several: their union
    ],
)
def test_near_cpus_resolves_each_name_form(names: list[str], cpus: str) -> None:
    assert near_cpus(MACHINE, names) == CPUSet.parse(cpus)


def test_device_cpus_keeps_only_cpus_of_the_machine() -> None:
    odd = Device("0000:01:00.0", 0x030000, numa=0, local_cpus=CPUSet.parse("0-63"))
    assert device_cpus(MACHINE, odd) == CPUSet.parse("0-15")


def test_an_unknown_device_is_exit_2_naming_it_and_listing_the_machines() -> None:
    with pytest.raises(InputError) as info:
        near_cpus(MACHINE, ["nvidia0", "mlx5_9"])
    message = str(info.value)
    assert info.value.exit_code == 2
    assert "'mlx5_9'" in message
    assert "0000:17:00.0 (gpu nvidia0)" in message and "0000:ca:00.0 (nic eth1)" in message


def test_a_machine_without_devices_says_so() -> None:
    with pytest.raises(InputError, match="no PCI devices are known"):
        near_cpus(T.build(1, 1, 1, 2, 1), ["eth0"])


# ---------------------------------------------------------------- requests
def test_options_near_and_near_strict_become_request_fields() -> None:
    r = build_request(2, ["near=4-7", "near-strict"])
    assert r.near == CPUSet.parse("4-7") and r.near_strict
    assert "near" not in r.options and "near-strict" not in r.options
    assert build_request(2, ["near=4-7"]).near_strict is False


@pytest.mark.parametrize(
    ("options", "needle"),
    [
        (["near=x"], "not a CPU list"),
        (["near-strict"], "needs the CPUs to be near"),
        (["near=1", "shared"], "exclusive requests only"),
        (["near=1", "workload=best-effort"], "exclusive requests only"),
    ],
)
def test_bad_near_options_are_exit_2_naming_the_problem(options: list[str], needle: str) -> None:
    with pytest.raises(RequestError, match=needle) as info:
        build_request(2, options)
    assert info.value.exit_code == 2


def test_near_cpus_the_machine_lacks_are_refused() -> None:
    with pytest.raises(RequestError, match="CPU\\(s\\) 16-17"):
        check_request(MACHINE, build_request(1, ["near=14-17"]))


# ---------------------------------------------------------------- decisions
@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_every_policy_takes_cpus_near_the_device_when_there_are_enough(policy: str) -> None:
    d = decide(MACHINE, 4, policy=policy, options=["near=4-7,12-15"])
    assert d.cpus <= CPUSet.parse("4-7,12-15")
    assert d.mems == CPUSet([1])  # memory follows the CPUs
    assert d.explanation[0].level == "near"


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_preferred_falls_back_outside_and_says_so(policy: str) -> None:
    d = decide(MACHINE, 4, policy=policy, available="0-6,8-14", options=["near=7,15"])
    assert len(d.cpus) == 4
    assert d.explanation[0].level == "near"
    assert "taken outside" in d.explanation[0].reason


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_strict_is_exit_3_when_the_near_cpus_cannot_be_had(policy: str) -> None:
    with pytest.raises(AllocationError) as info:
        decide(
            MACHINE, 4, policy=policy, available="0-6,8-14", options=["near=7,15", "near-strict"]
        )
    assert info.value.exit_code == 3
    assert info.value.reason == "near_unsatisfiable"
    assert "7,15" in str(info.value)


def test_strict_passes_on_the_inner_reason_when_the_count_fits_but_the_level_does_not() -> None:
    # 4 CPUs near, but a whole free NUMA node is not among them
    with pytest.raises(AllocationError, match="near the device") as info:
        decide(MACHINE, 4, options=["near=4-7", "near-strict", "level=numa"])
    assert info.value.reason == "near_unsatisfiable"
    assert "numa" in str(info.value)


# ---------------------------------------------------------------- properties
@cache
def _topology(shape: tuple[int, int, int, int, int]) -> Topology:
    return T.build(*shape)


@st.composite
def near_scenarios(draw: st.DrawFn) -> tuple[Topology, CPUSet, CPUSet, int]:
    topo = _topology(draw(strategies.build_shapes()))
    online = topo.online_cpus.sorted()
    avail = draw(strategies.cpu_subsets(online))
    near = draw(strategies.cpu_subsets(online).filter(bool))
    n = draw(st.integers(1, len(online)))
    return topo, avail, near, n


def _decide(topo: Topology, request: Request, avail: CPUSet, policy: str) -> Decision | None:
    try:
        return get_policy(policy).decide(topo, request, avail)
    except AllocationError as exc:
        assert exc.exit_code == 3
        return None


def _shaped(draw: st.DrawFn, policy: str, n: int, near: CPUSet, strict: bool) -> Request:
    if policy == "kubelet-static":
        return Request(n, near=near, near_strict=strict)
    level = draw(st.sampled_from(LEVELS))
    workload = draw(st.sampled_from((None, *WORKLOADS[:3]))) if policy == "workload-aware" else None
    smt = draw(st.sampled_from(("auto", "whole-cores", "spread")))
    return Request(n, level=level, workload=workload, smt=smt, near=near, near_strict=strict)


@SETTINGS
@given(data=st.data(), scenario=near_scenarios(), policy=st.sampled_from(POLICY_NAMES))
def test_strict_never_returns_a_cpu_outside_near(
    data: st.DataObject, scenario: tuple[Topology, CPUSet, CPUSet, int], policy: str
) -> None:
    topo, avail, near, n = scenario
    request = _shaped(data.draw, policy, n, near, strict=True)
    try:
        d = _decide(topo, request, avail, policy)
    except RequestError:  # kubelet-static option checks on odd machines
        return
    if d is None:
        return
    assert len(d.cpus) == n
    assert d.cpus <= near & avail
    if request.level != "cpu":
        assert d.withheld <= near & avail


@SETTINGS
@given(scenario=near_scenarios(), policy=st.sampled_from(POLICY_NAMES))
def test_preferred_stays_inside_near_whenever_enough_free_cpus_are_there(
    scenario: tuple[Topology, CPUSet, CPUSet, int], policy: str
) -> None:
    topo, avail, near, n = scenario
    d = _decide(topo, Request(n, near=near), avail, policy)
    if len(avail) < n:
        assert d is None
        return
    assert d is not None, "a preferred request fails only when the available CPUs are too few"
    assert len(d.cpus) == n and d.cpus <= avail
    if len(avail & near) >= n:
        assert d.cpus <= near
    else:
        assert d.explanation[0].level == "near"


@SETTINGS
@given(scenario=near_scenarios(), policy=st.sampled_from(POLICY_NAMES))
def test_near_everything_is_the_plain_decision(
    scenario: tuple[Topology, CPUSet, CPUSet, int], policy: str
) -> None:
    topo, avail, _near, n = scenario
    plain = _decide(topo, Request(n), avail, policy)
    near = _decide(topo, Request(n, near=topo.online_cpus), avail, policy)
    assert (plain is None) == (near is None)
    if plain is not None and near is not None:
        assert plain.cpus == near.cpus and plain.withheld == near.withheld


# ---------------------------------------------------------------------- simulate traces
def test_a_trace_add_may_be_near_cpus_and_replays_there() -> None:
    from corepin.allocation.simulate import parse_trace, replay

    topology = T.build(2, 1, 1, 4, 2)
    node1 = topology.cpus_in_numa_nodes(1)
    data = {
        "events": [
            {"op": "add", "id": "a", "cpus": 4, "near": str(node1)},
            {"op": "add", "id": "b", "cpus": 4, "near": str(node1), "nearStrict": True},
        ]
    }
    trace = parse_trace(data)
    assert trace.to_json() == {
        "events": [
            {"op": "add", "id": "a", "cpus": 4, "near": str(node1)},
            {"op": "add", "id": "b", "cpus": 4, "near": str(node1), "nearStrict": True},
        ]
    }
    placed: list[CPUSet] = []
    replay(
        topology,
        trace,
        get_policy("topology-aware"),
        on_decision=lambda r: placed.append(r.cpus) if r.cpus is not None else None,
    )
    assert len(placed) == 2 and all(cpus <= node1 for cpus in placed), placed


@pytest.mark.parametrize(
    ("event", "field"),
    [
        ({"near": ""}, "near"),
        ({"near": 5}, "near"),
        ({"near": "0-1", "shared": True}, "near"),
        ({"nearStrict": True}, "nearStrict"),
        ({"near": "0-1", "nearStrict": "yes"}, "nearStrict"),
    ],
)
def test_a_bad_near_in_a_trace_is_named(event: dict[str, object], field: str) -> None:
    from corepin.allocation.simulate import TraceError, parse_trace

    with pytest.raises(TraceError, match=rf"event 0 field '{field}'"):
        parse_trace({"events": [{"op": "add", "id": "a", "cpus": 2, **event}]})
