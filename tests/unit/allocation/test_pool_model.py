"""One pool model: the simulator, host mode and the state agree on every named machine.

The same random trace of exclusive, shared, share and best-effort requests is run three ways:
- the simulator (`corepin.allocation.simulate.replay`, its own loop over `NodePools`);
- host mode's decision step (`HostAgent.decide`, the path `corepin run` takes);
- the state (`HostState.add` / `remove`, whose pools the checkpoint, the report and the node
  agent read).
At every step the three must see the same free set and shared pool and make the same decision.
Isolated CPUs are marked on the machines so that their handling is compared too.
"""

from __future__ import annotations

from functools import cache

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corepin.agent.host.agent import HostAgent
from corepin.agent.host.run import RunSpec
from corepin.agent.host.settings import HostSettings
from corepin.allocation.policies import get_policy
from corepin.allocation.simulate import DecisionRecord, TraceEvent, replay
from corepin.core.cpuset import CPUSet
from corepin.core.errors import AllocationError, RequestError
from corepin.state import Assignment, HostState
from corepin.testing import machines as synthetic
from corepin.topology.model import CPUInfo, Topology
from support.budget import examples

MACHINES = [name for name in synthetic.NAMED if not name.startswith("large_1024")]


@cache
def machine(name: str) -> Topology:
    """The named machine with its last online CPU isolated (as `isolcpus=` would)."""
    topo = synthetic.named(name)
    last = topo.online_cpus.sorted()[-1]
    cpus = [
        CPUInfo(**{**c.to_json(), "isolated": c.isolated or c.cpu == last})  # type: ignore[arg-type]
        if c.online
        else c
        for c in topo.cpus
    ]
    return Topology(cpus, topo.numa_nodes, name=name)


events = st.lists(
    st.one_of(
        st.tuples(
            st.just("add"),
            st.integers(1, 6),
            st.sampled_from(["cpu", "core", "l3"]),
            st.booleans(),
        ),
        st.tuples(st.just("remove"), st.integers(0, 40), st.just("cpu"), st.just(False)),
    ),
    min_size=1,
    max_size=30,
)


@pytest.mark.parametrize("name", MACHINES)
@settings(max_examples=examples(25))
@given(trace=events)
def test_simulator_host_mode_and_state_agree(name: str, trace: list[tuple[str, int, str, bool]]):
    topo = machine(name)
    assert topo.isolated_cpus, "the comparison covers an isolated CPU"
    policy = get_policy("topology-aware")
    agent = HostAgent(HostSettings(state_dir="/nonexistent", policy="topology-aware"), topo)
    state = HostState.new(topo)
    trace_events: list[TraceEvent] = []
    live: list[str] = []
    for i, (op, count, level, shared) in enumerate(trace):
        if op == "remove":
            if live:
                trace_events.append(TraceEvent("remove", live.pop(count % len(live))))
            continue
        ident = f"a{i}"
        trace_events.append(TraceEvent("add", ident, count, level, None, shared))
        live.append(ident)

    records: list[DecisionRecord] = []
    replay(topo, trace_events, policy, on_decision=records.append)
    by_event = {r.event: r for r in records}

    for index, event in enumerate(trace_events):
        if event.op == "remove":
            state = state.remove(event.id, missing_ok=True)
            continue
        record = by_event[index]
        spec = RunSpec(
            exclusive=None if event.shared else event.cpus,
            options=None if event.shared else {"level": event.level},
        )
        request = spec.request()
        kind = spec.kind(request)
        try:
            decision = agent.decide(state, request, kind)
        except (AllocationError, RequestError) as exc:
            assert record.cpus is None, f"host mode refused ({exc}) what the simulator admitted"
            assert record.reason == exc.reason
            continue
        if event.shared:
            assert record.cpus == decision.cpus == state.shared_pool
            state = state.add(Assignment(event.id, "shared"))
            continue
        assert record.cpus == decision.cpus, "host mode and the simulator chose differently"
        state = state.add(
            Assignment(event.id, kind, decision.cpus, decision.withheld | decision.cpus)
        )
        assert state.shared_pool.isdisjoint(topo.isolated_cpus)
        assert state.free | state.held == topo.online_cpus
    assert state.overlaps() == []


def test_a_machine_with_an_isolated_cpu_keeps_it_out_of_every_shared_pool() -> None:
    topo = machine("dual_socket_ht")
    isolated = topo.isolated_cpus
    state = HostState.new(topo)
    records: list[DecisionRecord] = []
    replay(
        topo,
        [TraceEvent("add", "s", 1, "cpu", None, True)],
        get_policy("topology-aware"),
        on_decision=records.append,
    )
    agent = HostAgent(HostSettings(state_dir="/nonexistent"), topo)
    request = RunSpec().request()
    decided = agent.decide(state, request, "shared").cpus
    assert records[0].cpus == decided == state.shared_pool == topo.online_cpus - isolated
    assert isolated <= state.free, "isolated CPUs stay free for exclusive requests"
    assert CPUSet() == state.shared_pool & isolated
