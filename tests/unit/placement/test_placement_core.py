"""The placement core (`corepin.placement`): a node passes exactly when its agent could pin the
pod there, with reasons a user can act on; scores by profile and workload family.

Nodes are published by the agent's own code (`node_status` of a state the agent's own sync
built), so these tests compare the core against the agent, not against a copy of its rules.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corepin.agent.node.sync import PodEvent, SyncContext, pod_assignments, sync_pod
from corepin.allocation.policies import get_policy
from corepin.core.cpuset import CPUSet
from corepin.core.errors import CorepinError, InputError
from corepin.kube.podplan import plan_pod
from corepin.placement.fit import NO_FIT, NOT_READY, STALE, UNUSABLE, fit, node_problem
from corepin.placement.node import node_view
from corepin.placement.request import pod_request
from corepin.placement.score import (
    BALANCED,
    MAXIMUM_UTILIZATION,
    check_profile,
    extender_score,
    score,
)
from corepin.state.model import HostState
from corepin.testing import machines as synthetic
from support.budget import examples
from support.placement_helpers import EPOCH, published, run_pods
from support.pods import EXCLUSIVE, container, corepin_annotations, pod

C = CPUSet.parse
SMALL = synthetic.named("single_socket_ht")  # 16 CPUs, 8 cores
DUAL = synthetic.named("dual_socket_ht")  # 32 CPUs, 2 sockets
MULTI = synthetic.named("multi_numa_per_socket")  # 48 CPUs, 4 NUMA nodes


def view_of(state: HostState, topology: Any, **kw: Any) -> Any:
    return node_view(published(state, topology, **kw))


# ---------------------------------------------------------------------- fit: table
FIT_CASES = [
    (
        "an empty node gives a pod of 4 exclusive CPUs 4 CPUs",
        SMALL,
        [],
        pod("p", container("app", "4", "4"), annotations=EXCLUSIVE),
        True,
        "",
    ),
    (
        "a node with 3 free CPUs refuses 4 exclusive CPUs and says how many are free",
        SMALL,
        [pod("big", container("app", "13", "13"), annotations=EXCLUSIVE, running=True)],
        pod("p", container("app", "4", "4"), annotations=EXCLUSIVE),
        False,
        "only 3 free",
    ),
    (
        "the last free CPUs are never taken from the shared pool",
        SMALL,
        [pod("big", container("app", "14", "14"), annotations=EXCLUSIVE, running=True)],
        pod("p", container("app", "2", "2"), annotations=EXCLUSIVE),
        False,
        "leave no CPU in the shared pool",
    ),
    (
        "a share container takes free CPUs that stay in the shared pool",
        SMALL,
        [pod("big", container("app", "14", "14"), annotations=EXCLUSIVE, running=True)],
        pod("p", container("app", "2", "2"), annotations=corepin_annotations("share")),
        True,
        "",
    ),
    (
        "containers are decided in order: the second one no longer fits and is named",
        SMALL,
        [pod("big", container("app", "10", "10"), annotations=EXCLUSIVE, running=True)],
        pod(
            "p", container("first", "3", "3"), container("second", "3", "3"), annotations=EXCLUSIVE
        ),
        False,
        "container 'second'",
    ),
    (
        "a request the agent would ignore (1500m) asks for nothing and fits a full node",
        SMALL,
        [pod("big", container("app", "15", "15"), annotations=EXCLUSIVE, running=True)],
        pod("p", container("app", "1500m", "1500m"), annotations=EXCLUSIVE),
        True,
        "",
    ),
    (
        "a pod without a corepin annotation fits anywhere",
        SMALL,
        [pod("big", container("app", "15", "15"), annotations=EXCLUSIVE, running=True)],
        pod("p", container("app", "2", "2")),
        True,
        "",
    ),
    (
        "level numa needs a whole free NUMA node",
        MULTI,
        [
            pod(
                f"n{i}",
                container("app", "1", "1"),
                annotations=corepin_annotations(level="numa"),
                running=True,
            )
            for i in range(3)
        ]
        + [pod("one", container("app", "1", "1"), annotations=EXCLUSIVE, running=True)],
        pod("p", container("app", "2", "2"), annotations=corepin_annotations(level="numa")),
        False,
        "container 'app' asks for 2 exclusive CPU(s) at exclusiveness level numa",
    ),
    (
        "level socket takes a whole free socket when one is free",
        DUAL,
        [pod("one", container("app", "1", "1"), annotations=EXCLUSIVE, running=True)],
        pod("p", container("app", "4", "4"), annotations=corepin_annotations(level="socket")),
        True,
        "",
    ),
]


@pytest.mark.parametrize(
    ("topology", "before", "new", "ok", "words"),
    [c[1:] for c in FIT_CASES],
    ids=[c[0] for c in FIT_CASES],
)
def test_fit(topology: Any, before: list[Any], new: dict[str, Any], ok: bool, words: str) -> None:
    view = view_of(run_pods(topology, before), topology)
    result = fit(view, pod_request(new))
    assert result.ok is ok, result.reason
    if ok:
        request = pod_request(new)
        assert sum(len(p.cpus) for p in result.placed) == request.cpus
        for p in result.placed:
            assert p.cpus <= view.pools.free and p.cpus <= p.withheld
    else:
        assert result.code == NO_FIT
        assert words in result.reason
        assert result.reason.startswith("node node-a: ")


def test_a_pod_fits_with_the_cpus_the_agent_then_gives_it() -> None:
    state = run_pods(
        DUAL, [pod("a", container("app", "3", "3"), annotations=EXCLUSIVE, running=True)]
    )
    new = pod(
        "b",
        container("x", "2", "2"),
        container("y", "4", "4"),
        annotations=corepin_annotations(level="core"),
        running=True,
    )
    result = fit(view_of(state, DUAL), pod_request(new))
    after, _ = sync_pod(state, plan_pod(new), SyncContext(DUAL, get_policy("topology-aware")))
    got = {a.container.container: a.cpus for a in pod_assignments(after, new["metadata"]["uid"])}
    assert {p.container: p.cpus for p in result.placed} == got


def test_explicit_cpus_of_a_binding_must_be_free() -> None:
    state = run_pods(
        SMALL, [pod("a", container("app", "2", "2"), annotations=EXCLUSIVE, running=True)]
    )
    view = view_of(state, SMALL)
    taken = next(iter(state)).cpus
    binding = {
        "spec": {
            "podName": "p",
            "exclusivenessLevel": "CPU",
            "containers": [{"name": "app", "cpuSet": [{"cpuID": c} for c in taken]}],
        }
    }
    refused = fit(
        view, pod_request(pod("p", container("app", "2", "2"), annotations=EXCLUSIVE), binding)
    )
    assert not refused.ok and "already held" in refused.reason
    free = list(view.pools.free)[:2]
    binding["spec"]["containers"][0]["cpuSet"] = [{"cpuID": c} for c in free]
    placed = fit(
        view, pod_request(pod("p", container("app", "2", "2"), annotations=EXCLUSIVE), binding)
    )
    assert placed.ok and placed.placed[0].cpus == CPUSet(free)


def test_reserved_cpus_are_never_offered() -> None:
    state = HostState.new(SMALL, reserved=C("0-3"))
    result = fit(
        view_of(state, SMALL),
        pod_request(pod("p", container("app", "11", "11"), annotations=EXCLUSIVE)),
    )
    assert result.ok and not result.placed[0].cpus & C("0-3")
    # 12 fit: reserved CPUs still run shared work unless the reservation is strict
    assert fit(
        view_of(state, SMALL),
        pod_request(pod("p", container("app", "12", "12"), annotations=EXCLUSIVE)),
    ).ok
    assert not fit(
        view_of(state, SMALL),
        pod_request(pod("p", container("app", "13", "13"), annotations=EXCLUSIVE)),
    ).ok
    strict = HostState.new(SMALL, reserved=C("0-3"), options={"strict-cpu-reservation": "true"})
    view = view_of(strict, SMALL, options={"strict-cpu-reservation": "true"})
    assert view.pools.shared_pool == C("4-15")
    assert not fit(
        view, pod_request(pod("p", container("app", "12", "12"), annotations=EXCLUSIVE))
    ).ok


def test_node_problems_come_first_each_with_what_to_do() -> None:
    state = HostState.new(SMALL)
    fresh = view_of(state, SMALL)
    assert node_problem(fresh, EPOCH + 10, 60) is None
    stale = node_problem(fresh, EPOCH + 600, 60)
    assert stale is not None and stale.code == STALE
    assert "last reported 600 s ago" in stale.reason and "check the corepin agent" in stale.reason
    down = node_problem(view_of(state, SMALL, ready=False), EPOCH, 60)
    assert down is not None and down.code == NOT_READY and "HeartbeatStale" in down.reason
    unknown = node_problem(view_of(state, SMALL, policy="clairvoyant"), EPOCH, 60)
    assert unknown is not None and unknown.code == UNUSABLE and "clairvoyant" in unknown.reason
    silent = node_problem(view_of(state, SMALL, status=False), EPOCH, 60)
    assert silent is not None and silent.code == UNUSABLE and "not published" in silent.reason


def test_published_pools_count_what_the_rows_cannot_name() -> None:
    """The view trusts the published free set: a hold with no row (a kubelet import) still
    counts, so the node offers exactly what the agent has."""
    state = run_pods(
        SMALL, [pod("a", container("app", "4", "4"), annotations=EXCLUSIVE, running=True)]
    )
    ncpt = published(state, SMALL)
    body = ncpt.to_dict()
    body["status"]["allocations"] = []
    from corepin.kube.models import NodeCPUTopology

    view = node_view(NodeCPUTopology.from_dict(body))
    assert view.pools.free == state.free and view.pools.shared_pool == state.shared_pool


# ---------------------------------------------------------------------- fit = the agent, always
POLICIES = ["topology-aware", "workload-aware", "kubelet-static"]
pod_shapes = st.tuples(
    st.lists(st.integers(1, 6), min_size=1, max_size=3),
    st.sampled_from(["exclusive", "share", "none"]),
    st.sampled_from(["cpu", "core", "l3", "numa", "socket"]),
    st.sampled_from([None, "memory-bound", "cpu-bound", "io-bound", "best-effort"]),
)


def _make(i: int, shape: Any, running: bool) -> dict[str, Any]:
    counts, policy, level, workload = shape
    containers = [container(f"c{j}", str(n), str(n)) for j, n in enumerate(counts)]
    annotations = corepin_annotations(policy, level=level, workload=workload)
    return pod(f"p{i}", *containers, annotations=annotations, running=running)


@settings(max_examples=examples(150))
@given(
    topology=st.sampled_from([SMALL, DUAL, MULTI]),
    policy=st.sampled_from(POLICIES),
    before=st.lists(pod_shapes, max_size=8),
    new=pod_shapes,
    reserved=st.sampled_from(["", "0", "0-1"]),
)
def test_a_node_passes_exactly_when_the_agent_pins_the_pod(
    topology: Any, policy: str, before: list[Any], new: Any, reserved: str
) -> None:
    state = run_pods(
        topology,
        [_make(i, s, True) for i, s in enumerate(before)],
        policy=policy,
        state=HostState.new(topology, reserved=C(reserved)),
    )
    candidate = _make(99, new, True)
    result = fit(view_of(state, topology, policy=policy), pod_request(candidate))
    ctx = SyncContext(topology, get_policy(policy), EPOCH)
    try:
        after, notes = sync_pod(state, plan_pod(candidate), ctx)
    except CorepinError:
        # the agent's sync raises (and skips the batch) for an exclusive best-effort container
        # whose shared-pool CPUs include a reserved one; the core refuses the node
        after, notes = state, [PodEvent("Warning", "CPUPinFailed", "sync raised")]
    pinned = not [n for n in notes if n.reason == "CPUPinFailed"]
    assert result.ok is pinned, (result.reason, notes)
    if pinned:
        got = {
            a.container.container: a.cpus
            for a in pod_assignments(after, candidate["metadata"]["uid"])
            if a.holds and a.container is not None
        }
        assert {p.container: p.cpus for p in result.placed} == got


# ---------------------------------------------------------------------- scores
def _scores(profile: str, new: dict[str, Any], *states: HostState, topo: Any = DUAL) -> list[int]:
    request = pod_request(new)
    out = []
    for i, state in enumerate(states):
        view = view_of(state, topo, name=f"n{i}")
        result = fit(view, request)
        assert result.ok, result.reason
        out.append(score(view, request, result, profile))
    return out


def test_maximum_utilization_packs_and_balanced_spreads() -> None:
    empty = HostState.new(DUAL)
    busy = run_pods(
        DUAL, [pod("a", container("app", "16", "16"), annotations=EXCLUSIVE, running=True)]
    )
    new = pod("p", container("app", "2", "2"), annotations=EXCLUSIVE)
    packed = _scores(MAXIMUM_UTILIZATION, new, empty, busy)
    spread = _scores(BALANCED, new, empty, busy)
    assert packed[1] > packed[0] and spread[0] > spread[1]
    assert all(0 <= s <= 100 for s in packed + spread)


def test_memory_bound_pods_keep_off_sockets_busy_with_memory_bound_work() -> None:
    busy = run_pods(
        DUAL,
        [
            pod(
                "mb",
                container("app", "6", "6"),
                annotations=corepin_annotations(workload="memory-bound"),
                running=True,
            )
        ],
    )
    calm = run_pods(
        DUAL,
        [
            pod(
                "cb",
                container("app", "6", "6"),
                annotations=corepin_annotations(workload="io-bound"),
                running=True,
            )
        ],
    )
    new = pod(
        "p", container("app", "2", "2"), annotations=corepin_annotations(workload="memory-bound")
    )
    for profile in (MAXIMUM_UTILIZATION, BALANCED):
        hot, cool = _scores(profile, new, busy, calm)
        assert cool > hot, profile


def test_cpu_bound_pods_prefer_idle_whole_cores() -> None:
    from corepin.state.model import Assignment

    halves = HostState.new(SMALL)  # one thread of every core busy with a share container
    for cpu in range(8):
        one = CPUSet.of(cpu)
        halves = halves.add(Assignment(f"x{cpu}", "share", one, one, CPUSet.of(0)))
    whole = run_pods(
        SMALL,
        [
            pod(
                "w",
                container("app", "8", "8"),
                annotations=corepin_annotations(level="core"),
                running=True,
            )
        ],
    )
    new = pod(
        "p",
        container("app", "2", "2"),
        annotations=corepin_annotations("share", workload="cpu-bound"),
    )
    on_halves, on_whole = _scores(BALANCED, new, halves, whole, topo=SMALL)
    assert on_whole > on_halves


def test_best_effort_pods_go_to_the_shared_pool_of_busy_nodes() -> None:
    empty = HostState.new(DUAL)
    busy = run_pods(
        DUAL, [pod("a", container("app", "20", "20"), annotations=EXCLUSIVE, running=True)]
    )
    new = pod(
        "p",
        container("app", "1", "1"),
        annotations=corepin_annotations(None, workload="best-effort"),
    )
    idle, loaded = _scores(BALANCED, new, empty, busy)
    assert loaded > idle


@pytest.mark.parametrize(
    ("value", "expected"), [(0, 0), (4, 0), (5, 1), (50, 5), (94, 9), (95, 10), (100, 10)]
)
def test_extender_scores_are_0_to_10(value: int, expected: int) -> None:
    assert extender_score(value) == expected


def test_an_unknown_profile_is_refused_with_the_choices() -> None:
    with pytest.raises(InputError, match="MaximumUtilization, Balanced"):
        check_profile("Fastest")
