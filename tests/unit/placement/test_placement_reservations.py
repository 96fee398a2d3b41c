"""CPUReservations in the placement core (`corepin.placement.reservations`, `Cluster`): a
reservation's CPUs go to no pod that does not match it, a matching pod fits on them and scores
the highest on the reservation's node, Pending reservations are held on top of the published
pools like placements in flight, and a matching pod's placement is not counted twice."""

from __future__ import annotations

from typing import Any

from corepin.core.cpuset import CPUSet
from corepin.kube.models import CPUReservation
from corepin.placement.cluster import RESERVED_SCORE, Cluster
from corepin.placement.node import node_view
from corepin.placement.request import pod_request
from corepin.placement.reservations import reservation_request, reservation_view
from corepin.state.model import HostState
from corepin.state.reservations import Reservation
from corepin.testing import machines as synthetic
from support.placement_helpers import EPOCH, published
from support.pods import EXCLUSIVE, container, pod

SMALL = synthetic.named("single_socket_ht")  # 16 CPUs


def cpur(
    name: str,
    node: str | None,
    *,
    size: int = 0,
    cpu_set: str = "",
    phase: str = "Pending",
    held: str = "",
) -> Any:
    """A reservation for the traders of namespace shop: `size` CPUs or the CPUs `cpu_set`;
    `held`: its status.cpus."""
    owner = {"namespace": "shop", "labelSelector": {"matchLabels": {"app": "trader"}}}
    body: dict[str, Any] = {"owners": [owner]}
    if size:
        body["cpus"] = size
    if cpu_set:
        body["cpuSet"] = cpu_set
    if node:
        body["nodeName"] = node
    status: dict[str, Any] = {"phase": phase}
    if held:
        status["cpus"] = held
    view = reservation_view(
        CPUReservation.from_dict(
            {"metadata": {"name": name, "uid": f"uid-{name}"}, "spec": body, "status": status}
        )
    )
    assert view is not None
    return view


def trader(name: str = "t-0", cpus: int = 8) -> Any:
    return pod_request(
        pod(
            name,
            container("app", cpus, cpus),
            namespace="shop",
            labels={"app": "trader"},
            annotations=EXCLUSIVE,
        )
    )


def other(name: str = "o-0", cpus: int = 8, namespace: str = "shop") -> Any:
    return pod_request(
        pod(
            name,
            container("app", cpus, cpus),
            namespace=namespace,
            labels={"app": "web"},
            annotations=EXCLUSIVE,
        )
    )


def cluster_of(*names: str, state: HostState | None = None) -> Cluster:
    cluster = Cluster()
    for name in names:
        cluster.set_node(node_view(published(state or HostState.new(SMALL), SMALL, name=name)))
    return cluster


def test_a_pending_reservation_keeps_its_cpus_from_pods_that_do_not_match_it() -> None:
    cluster = cluster_of("a")
    assert cluster.evaluate(other(), ["a"], EPOCH)[0].ok  # 16 CPUs: 8 fit
    cluster.set_reservation(cpur("r", "a", size=8))
    held = cluster.reserved_on("a")["r"]
    assert len(held) == 8
    answer = cluster.evaluate(other(), ["a"], EPOCH)[0]
    assert not answer.ok and "asks for 8 exclusive CPU(s)" in answer.reason
    small = cluster.evaluate(other(cpus=7), ["a"], EPOCH)[0]
    assert small.ok and small.fit is not None
    assert not (small.fit.placed[0].withheld & held)  # never on reserved CPUs
    cluster.remove_reservation("r")
    assert cluster.evaluate(other(), ["a"], EPOCH)[0].ok


def test_a_matching_pod_fits_on_its_reservation_and_scores_highest_on_its_node() -> None:
    cluster = cluster_of("a", "b")
    cluster.set_reservation(cpur("r", "a", size=8))
    answers = {a.node: a for a in cluster.evaluate(trader(), ["a", "b"], EPOCH)}
    assert answers["a"].ok and answers["a"].score == RESERVED_SCORE
    assert answers["a"].extender == 10
    assert answers["b"].ok and answers["b"].score < RESERVED_SCORE  # elsewhere as any pod
    best = cluster.best(answers.values())
    assert best is not None and best.node == "a"
    # a trader in another namespace is no owner: nothing reserved for it
    stranger = pod_request(
        pod(
            "t-9",
            container("app", 8, 8),
            namespace="batch",
            labels={"app": "trader"},
            annotations=EXCLUSIVE,
        )
    )
    assert not cluster.evaluate(stranger, ["a"], EPOCH)[0].ok


def test_an_available_reservation_is_out_of_the_published_free_set_and_freed_for_its_pod() -> None:
    reserved = CPUSet.parse("8-15")
    state = HostState.new(SMALL).add_reservation(Reservation("r", reserved))
    cluster = cluster_of("a", state=state)
    cluster.set_reservation(cpur("r", "a", size=8, phase="Available", held="8-15"))
    assert cluster.reserved_on("a") == {"r": reserved}
    assert not cluster.evaluate(other(), ["a"], EPOCH)[0].ok
    mine = cluster.evaluate(trader(), ["a"], EPOCH)[0]
    assert mine.ok and mine.fit is not None
    assert mine.fit.placed[0].cpus == reserved  # the only 8 CPUs free for it


def test_a_matching_pod_placed_on_its_reservation_is_not_counted_twice() -> None:
    cluster = cluster_of("a")
    cluster.set_reservation(cpur("r", "a", size=8))
    request = trader()
    best = cluster.evaluate(request, ["a"], EPOCH)[0]
    assert best.ok and best.fit is not None
    cluster.assume(request, "a", best.fit, EPOCH)
    assert best.fit.placed[0].cpus == cluster.reserved_on("a")["r"]  # exactly its CPUs
    assert len(cluster.ledger) == 0  # counted by the reservation already
    # what is left for the others: 16 - 8 reserved, one CPU stays shared
    assert cluster.evaluate(other(cpus=7), ["a"], EPOCH)[0].ok
    assert not cluster.evaluate(other(cpus=8), ["a"], EPOCH)[0].ok


def test_a_reservation_with_explicit_cpus_holds_exactly_them() -> None:
    cluster = cluster_of("a")
    cluster.set_reservation(cpur("r", "a", cpu_set="0-3"))
    assert cluster.reserved_on("a") == {"r": CPUSet.parse("0-3")}
    answer = cluster.evaluate(other(cpus=12), ["a"], EPOCH)[0]
    assert not answer.ok  # 16 - 4 reserved - 1 shared = 11


def test_a_reservation_asks_as_a_pod_of_one_exclusive_container() -> None:
    cluster = cluster_of("a", "b")
    cluster.set_reservation(cpur("first", "a", size=12))
    request = reservation_request(cpur("next", None, size=8))
    answers = {a.node: a for a in cluster.evaluate(request, ["a", "b"], EPOCH)}
    assert not answers["a"].ok and answers["b"].ok
