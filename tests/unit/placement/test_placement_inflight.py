"""In-flight accounting (`corepin.placement.ledger`, `Cluster`): placements count until the
node publishes them, a burst never over-books a node between two topology updates, and an
assumption expires when the node never confirms it."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from corepin.placement.cluster import Cluster
from corepin.placement.fit import NO_TOPOLOGY
from corepin.placement.node import node_view
from corepin.placement.request import pod_request
from corepin.state.model import HostState
from corepin.testing import machines as synthetic
from support.budget import examples
from support.placement_helpers import EPOCH, published, run_pods
from support.pods import EXCLUSIVE, container, corepin_annotations, pod

SMALL = synthetic.named("single_socket_ht")  # 16 CPUs
DUAL = synthetic.named("dual_socket_ht")  # 32 CPUs


def cluster_of(*states: tuple[str, HostState, Any], **kw: Any) -> Cluster:
    cluster = Cluster(**kw)
    for name, state, topology in states:
        cluster.set_node(node_view(published(state, topology, name=name)))
    return cluster


def place(cluster: Cluster, p: dict[str, Any], names: list[str], now: float) -> str | None:
    """What a scheduler does for one pod: evaluate, pick, assume."""
    request = pod_request(p)
    best = cluster.best(cluster.evaluate(request, names, now))
    if best is None or best.fit is None:
        return None
    cluster.assume(request, best.node, best.fit, now)
    return best.node


def test_a_burst_between_two_updates_never_over_books_a_node() -> None:
    cluster = cluster_of(("a", HostState.new(SMALL), SMALL))
    placed = [
        place(
            cluster, pod(f"p{i}", container("app", "2", "2"), annotations=EXCLUSIVE), ["a"], EPOCH
        )
        for i in range(10)
    ]
    # 16 CPUs, one must stay in the shared pool: 7 pods of 2
    assert placed.count("a") == 7 and placed[7:] == [None, None, None]
    answer = cluster.evaluate(
        pod_request(pod("late", container("app", "1", "1"), annotations=EXCLUSIVE)), ["a"], EPOCH
    )[0]
    assert answer.ok  # one CPU is left for a pod of one... and the shared pool keeps the 16th
    assert len(cluster.ledger) == 7


def test_the_node_publishing_the_pods_settles_their_assumptions() -> None:
    pods = [pod(f"p{i}", container("app", "2", "2"), annotations=EXCLUSIVE) for i in range(3)]
    cluster = cluster_of(("a", HostState.new(SMALL), SMALL))
    for p in pods:
        assert place(cluster, p, ["a"], EPOCH) == "a"
    # the agent pins them (maybe on other CPUs than assumed) and publishes
    state = run_pods(
        SMALL,
        [
            {
                **p,
                **pod(
                    p["metadata"]["name"],
                    container("app", "2", "2"),
                    annotations=EXCLUSIVE,
                    running=True,
                ),
            }
            for p in pods
        ],
    )
    cluster.set_node(node_view(published(state, SMALL, name="a")))
    assert len(cluster.ledger) == 0
    free = cluster.view("a").pools.free  # type: ignore[union-attr]
    assert len(free) == 10


def test_an_assumption_the_agent_contradicted_is_placed_again_or_fills_the_node() -> None:
    """The agent gave another pod the CPUs we assumed for ours: ours is placed on what is left,
    and when nothing is left the node takes nothing more until it publishes again."""
    cluster = cluster_of(("a", HostState.new(SMALL), SMALL))
    assert (
        place(cluster, pod("ours", container("app", "4", "4"), annotations=EXCLUSIVE), ["a"], EPOCH)
        == "a"
    )
    assumed = cluster.ledger.get(
        pod_request(pod("ours", container("app", "4", "4"), annotations=EXCLUSIVE)).uid
    )
    assert assumed is not None
    taken = assumed.placed[0].cpus
    # someone else's container now holds exactly those CPUs (pinned by another path)
    from corepin.core.cpuset import CPUSet
    from corepin.state.model import Assignment

    other = HostState.new(SMALL).add(Assignment("x", "exclusive", taken, taken, CPUSet.of(0)))
    cluster.set_node(node_view(published(other, SMALL, name="a")))
    left = cluster.evaluate(
        pod_request(pod("next", container("app", "7", "7"), annotations=EXCLUSIVE)), ["a"], EPOCH
    )[0]
    assert left.ok  # 16 - 4 (other) - 4 (ours, placed again) = 8 free, one for the pool
    assert not cluster.evaluate(
        pod_request(pod("next", container("app", "8", "8"), annotations=EXCLUSIVE)), ["a"], EPOCH
    )[0].ok
    full = HostState.new(SMALL).add(
        Assignment("x", "exclusive", CPUSet.parse("0-12"), CPUSet.parse("0-12"), CPUSet.of(0))
    )
    cluster.set_node(node_view(published(full, SMALL, name="a")))
    nothing = cluster.evaluate(
        pod_request(pod("one", container("app", "1", "1"), annotations=EXCLUSIVE)), ["a"], EPOCH
    )[0]
    assert not nothing.ok and "only 0 free" in nothing.reason


def test_an_assumption_expires_when_the_node_never_confirms() -> None:
    cluster = cluster_of(("a", HostState.new(SMALL), SMALL), assume_ttl=30.0)
    p = pod("p", container("app", "8", "8"), annotations=EXCLUSIVE)
    assert place(cluster, p, ["a"], EPOCH) == "a"
    big = pod_request(pod("big", container("app", "8", "8"), annotations=EXCLUSIVE))
    assert not cluster.evaluate(big, ["a"], EPOCH + 29)[0].ok  # 8 + 8 leaves no shared CPU
    # never bound: gone after the TTL
    assert cluster.evaluate(big, ["a"], EPOCH + 31)[0].ok
    assert len(cluster.ledger) == 0


def test_a_bound_pod_is_waited_for_until_its_containers_run() -> None:
    cluster = cluster_of(("a", HostState.new(SMALL), SMALL), assume_ttl=30.0)
    p = pod("p", container("app", "8", "8"), annotations=EXCLUSIVE)
    place(cluster, p, ["a"], EPOCH)
    bound = {**p, "spec": {**p["spec"], "nodeName": "a"}}
    cluster.observe_pod(bound, pod_request, EPOCH + 1)
    cluster.expire(EPOCH + 500)
    assert len(cluster.ledger) == 1  # bound, not running: the agent cannot pin it yet
    running = pod("p", container("app", "8", "8"), annotations=EXCLUSIVE, running=True, node="a")
    cluster.observe_pod(running, pod_request, EPOCH + 600)
    cluster.expire(EPOCH + 620)
    assert len(cluster.ledger) == 1
    cluster.expire(EPOCH + 631)  # running for more than the TTL and still not published
    assert len(cluster.ledger) == 0


def test_pods_bound_by_someone_else_are_counted_until_published() -> None:
    cluster = cluster_of(("a", HostState.new(SMALL), SMALL))
    cluster.observe_pod(
        pod("theirs", container("app", "10", "10"), annotations=EXCLUSIVE, node="a"),
        pod_request,
        EPOCH,
    )
    assert len(cluster.ledger) == 1
    assert not cluster.evaluate(
        pod_request(pod("p", container("app", "6", "6"), annotations=EXCLUSIVE)), ["a"], EPOCH
    )[0].ok
    deleted = pod("theirs", container("app", "10", "10"), annotations=EXCLUSIVE, node="a")
    deleted["metadata"]["deletionTimestamp"] = "2027-01-01T00:00:00Z"
    cluster.observe_pod(deleted, pod_request, EPOCH)
    assert cluster.evaluate(
        pod_request(pod("p", container("app", "6", "6"), annotations=EXCLUSIVE)), ["a"], EPOCH
    )[0].ok


def test_pods_that_ask_for_nothing_pass_every_node_even_without_an_agent() -> None:
    cluster = cluster_of(("a", HostState.new(SMALL), SMALL))
    plain = pod_request(pod("plain", container("app", "1", "1")))
    assert [a.ok for a in cluster.evaluate(plain, ["a", "no-agent"], EPOCH + 9999)] == [True] * 2
    pinned = pod_request(pod("pinned", container("app", "1", "1"), annotations=EXCLUSIVE))
    answers = cluster.evaluate(pinned, ["a", "no-agent"], EPOCH)
    assert answers[0].ok and not answers[1].ok and answers[1].code == NO_TOPOLOGY
    assert answers[1].unresolvable and "no NodeCPUTopology" in answers[1].reason


@settings(max_examples=examples(40))
@given(
    sizes=st.lists(st.integers(1, 6), min_size=1, max_size=40),
    levels=st.lists(st.sampled_from(["cpu", "core", "l3", "numa", "socket"]), min_size=1),
)
def test_after_any_burst_the_agents_pin_every_pod_placed(
    sizes: list[int], levels: list[str]
) -> None:
    """Every pod the cluster placed in a burst (no topology update in between) is then pinned
    by the agents of the nodes it was placed on (in the order it was placed)."""
    nodes = {"a": HostState.new(DUAL), "b": HostState.new(DUAL)}
    cluster = cluster_of(*((n, s, DUAL) for n, s in nodes.items()))
    chosen: dict[str, list[dict[str, Any]]] = {"a": [], "b": []}
    for i, n in enumerate(sizes):
        level = levels[i % len(levels)]
        p = pod(
            f"p{i}", container("app", str(n), str(n)), annotations=corepin_annotations(level=level)
        )
        where = place(cluster, p, ["a", "b"], EPOCH)
        if where is not None:
            chosen[where].append(
                pod(
                    f"p{i}",
                    container("app", str(n), str(n)),
                    annotations=corepin_annotations(level=level),
                    running=True,
                )
            )
    from corepin.agent.node.sync import SyncContext, sync_pod
    from corepin.allocation.policies import get_policy
    from corepin.kube.podplan import plan_pod

    ctx = SyncContext(DUAL, get_policy("topology-aware"), EPOCH)
    for name, pods in chosen.items():
        state = nodes[name]
        for p in pods:
            state, notes = sync_pod(state, plan_pod(p), ctx)
            assert not [n for n in notes if n.reason == "CPUPinFailed"], (name, notes)
