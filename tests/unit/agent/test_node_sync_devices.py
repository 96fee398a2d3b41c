"""The node agent's sync with the NUMA nodes of a container's devices (`SyncContext.device_numa`):
preferred, required, none; a required alignment that cannot be had is a request that cannot be
met (the shared pool and `CPUPinFailed`)."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from corepin.agent.node.sync import SyncContext, sync_pod
from corepin.allocation.policies import get_policy
from corepin.core.cpuset import CPUSet
from corepin.kube.podplan import plan_pod
from corepin.state.model import HostState
from corepin.testing import machines as synthetic
from support.budget import examples
from support.pods import EXCLUSIVE, container, pod

TOPO = synthetic.named("dual_socket_ht")  # NUMA node 0: 0-7,16-23; node 1: 8-15,24-31
POLICY = get_policy("topology-aware")


def running(name: str, cpus: int, alignment: str | None = None) -> Any:
    notes = dict(EXCLUSIVE)
    if alignment is not None:
        notes["corepin.io/device-alignment"] = alignment
    return pod(name, container("main", str(cpus), str(cpus)), annotations=notes, running=True)


def synced(
    p: Any, numa: CPUSet | None, state: HostState | None = None
) -> tuple[HostState, list[str]]:
    ctx = SyncContext(TOPO, POLICY, device_numa={} if numa is None else {"main": numa})
    state, events = sync_pod(state or HostState.new(TOPO), plan_pod(p), ctx)
    return state, [e.reason for e in events]


def held(state: HostState, p: Any) -> CPUSet:
    [a] = [a for a in state if a.container is not None and a.container.pod == p["metadata"]["name"]]
    return a.cpus


def test_without_devices_the_policy_picks_node_0() -> None:
    state, _ = synced(running("p", 4), None)
    assert held(state, running("p", 4)) <= TOPO.cpus_in_numa_nodes(0)


def test_preferred_takes_the_devices_node() -> None:
    state, reasons = synced(running("p", 4), CPUSet.of(1))
    assert held(state, running("p", 4)) <= TOPO.cpus_in_numa_nodes(1)
    assert reasons == ["CPUPinned"]


def test_none_ignores_the_devices() -> None:
    p = running("p", 4, "none")
    state, _ = synced(p, CPUSet.of(1))
    assert held(state, p) <= TOPO.cpus_in_numa_nodes(0)


def test_preferred_falls_back_when_the_node_is_too_small() -> None:
    p = running("p", 20)
    state, reasons = synced(p, CPUSet.of(1))
    assert len(held(state, p)) == 20 and "CPUPinFailed" not in reasons


def test_required_that_cannot_be_had_runs_on_the_shared_pool() -> None:
    p = running("p", 20, "required")
    state, reasons = synced(p, CPUSet.of(1))
    assert held(state, p) == CPUSet(), "on the shared pool"
    assert "CPUPinFailed" in reasons


def test_required_on_a_numa_node_the_machine_lacks_is_refused() -> None:
    p = running("p", 2, "required")
    state, reasons = synced(p, CPUSet.of(7))
    assert held(state, p) == CPUSet() and "CPUPinFailed" in reasons
    loose = running("q", 2)
    state, reasons = synced(loose, CPUSet.of(7))
    assert len(held(state, loose)) == 2 and reasons == ["CPUPinned"]


@given(
    count=st.integers(1, 14),
    node=st.sampled_from([0, 1]),
    taken=st.integers(0, 14),
    alignment=st.sampled_from(["preferred", "required"]),
)
@settings(max_examples=examples(60), deadline=None)
def test_cpus_land_on_the_devices_node_whenever_it_has_room(
    count: int, node: int, taken: int, alignment: str
) -> None:
    # another exclusive pod holds `taken` CPUs of the devices' node first
    state = HostState.new(TOPO)
    if taken:
        state, _ = synced(running("other", taken, "required"), CPUSet.of(node), state)
    room = len(TOPO.cpus_in_numa_nodes(node) - state.pools.exclusive_cpus)
    p = running("p", count, alignment)
    state, reasons = synced(p, CPUSet.of(node), state)
    cpus = held(state, p)
    if count <= room:
        assert cpus <= TOPO.cpus_in_numa_nodes(node) and len(cpus) == count
    elif alignment == "required":
        assert cpus == CPUSet() and "CPUPinFailed" in reasons
    else:
        assert len(cpus) == count
