"""Tests for the seeded churn trace generator."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corepin.allocation.simulate import parse_trace
from corepin.allocation.tracegen import SIZES, ChurnOptions, generate_trace
from corepin.core.errors import InputError
from corepin.topology.model import CPUInfo, Topology
from support.budget import examples


def two_sockets_of(cores_per_socket: int = 16) -> Topology:
    """2 sockets of `cores_per_socket` cores, one NUMA node and one L3 each, SMT 2 (siblings
    numbered cpu + total cores): 64 CPUs by default."""
    total = 2 * cores_per_socket
    cpus = []
    for core in range(total):
        socket = core // cores_per_socket
        for thread in range(2):
            cpus.append(
                CPUInfo(core + thread * total, socket=socket, numa=socket, l3=socket, core=core)
            )
    return Topology(cpus, name=f"two-sockets-of-{cores_per_socket}-cores")


def notional_loads(trace: dict[str, object], capacity: int) -> list[float]:
    live: dict[str, int] = {}
    loads = []
    for event in parse_trace(trace).events:
        if event.op == "add" and not event.shared:
            live[event.id] = event.cpus
        elif event.op == "remove":
            live.pop(event.id, None)
        loads.append(sum(live.values()) / capacity)
    return loads


def test_the_same_seed_gives_the_same_trace_byte_for_byte() -> None:
    topo = two_sockets_of()
    first = json.dumps(generate_trace(topo, seed=42))
    second = json.dumps(generate_trace(topo, seed=42))
    assert first == second


def test_different_seeds_give_different_traces() -> None:
    topo = two_sockets_of()
    assert generate_trace(topo, seed=1) != generate_trace(topo, seed=2)


def test_the_trace_has_exactly_the_requested_number_of_valid_events() -> None:
    trace = generate_trace(two_sockets_of(), seed=3, options=ChurnOptions(events=777))
    assert len(parse_trace(trace).events) == 777


def test_churn_mixes_sizes_sharing_levels_workloads_and_departures() -> None:
    trace = parse_trace(generate_trace(two_sockets_of(), seed=5, options=ChurnOptions(events=3000)))
    adds = [e for e in trace.events if e.op == "add"]
    removes = [e for e in trace.events if e.op == "remove"]
    assert len(removes) > len(trace.events) // 4
    sizes = Counter(e.cpus for e in adds if not e.shared)
    assert set(sizes) == set(SIZES)
    assert sizes[1] > sizes[8] > sizes[32]  # weighted toward small requests
    assert any(e.shared for e in adds)
    assert {e.level for e in adds} >= {"cpu", "core", "l3"}
    assert {e.workload for e in adds} >= {None, "cpu-bound", "memory-bound", "io-bound"}


def test_the_machine_runs_near_full_after_the_ramp_up() -> None:
    topo = two_sockets_of()
    loads = notional_loads(generate_trace(topo, seed=11, options=ChurnOptions(events=4000)), 64)
    steady = loads[len(loads) // 4 :]
    mean = sum(steady) / len(steady)
    assert 0.8 <= mean <= 1.05
    assert max(steady) > 1.0  # arrivals overshoot: some requests will not fit


def test_sizes_larger_than_half_a_small_machine_are_not_generated() -> None:
    small = Topology([CPUInfo(c, core=c) for c in range(8)])
    trace = parse_trace(generate_trace(small, seed=0, options=ChurnOptions(events=500)))
    assert max(e.cpus for e in trace.events if e.op == "add") <= 4


def test_bad_options_are_input_errors() -> None:
    with pytest.raises(InputError, match="-1"):
        generate_trace(two_sockets_of(), options=ChurnOptions(events=-1))
    with pytest.raises(InputError):
        generate_trace(two_sockets_of(), options=ChurnOptions(low=0.9, high=0.5))


@settings(max_examples=examples(40))
@given(seed=st.integers(0, 2**32), events=st.integers(0, 400))
def test_every_generated_trace_passes_strict_validation(seed: int, events: int) -> None:
    trace = generate_trace(two_sockets_of(4), seed=seed, options=ChurnOptions(events=events))
    assert len(parse_trace(trace).events) == events


def test_without_levels_the_trace_is_the_same_except_every_level_is_cpu() -> None:
    topo = two_sockets_of()
    with_levels = parse_trace(generate_trace(topo, seed=9, options=ChurnOptions(events=800)))
    plain = parse_trace(
        generate_trace(topo, seed=9, options=ChurnOptions(events=800, levels=False))
    )
    assert {e.level for e in plain.events} == {"cpu"}
    assert any(e.level != "cpu" for e in with_levels.events)
    strip = [(e.op, e.id, e.cpus, e.shared, e.workload) for e in with_levels.events]
    assert strip == [(e.op, e.id, e.cpus, e.shared, e.workload) for e in plain.events]
