"""CPUReservations as placement counts them (pure).

A reservation on a node (spec.nodeName, else the scheduler's status.nodeName) holds its CPUs
from every pod that does not match it:

- `Available`: its node's agent holds them, so the published free set already leaves them
  out (`status.cpus`);
- `Pending`: not yet held by the agent, so they are held here on top of the published pools,
  as the scheduler holds its own placements in flight: its `spec.cpuSet` when it names CPUs
  (unless they are no longer free: then the agent holds them already, or cannot), else the
  CPUs the node's policy would choose for `spec.cpus` at its level (`fit`, as for a pod).

A pod that matches a reservation (`CPUReservation.matches`) sees that reservation's CPUs as
free on its node (`release`), and nothing of the reservations it does not match; a pod of
one holding container of the reservation's size is fitted on exactly those CPUs first
(`pinned_to`), as the node's agent hands them to it. Done
reservations (Succeeded, Expired, Failed) count for nothing (`reservation_view` is None).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from corepin.allocation.levels import withheld_for
from corepin.allocation.pools import NodePools
from corepin.core.cpuset import EMPTY, CPUSet
from corepin.core.errors import CorepinError
from corepin.core.record import record, replace
from corepin.kube.models import CPUReservation
from corepin.placement.fit import Placed, fit
from corepin.placement.node import NodeView
from corepin.placement.request import ContainerAsk, PodRequest

#: the container name of the request a reservation stands for (`reservation_request`)
RESERVATION_CONTAINER = "reservation"


@record
class ReservationView:
    """One active reservation as placement needs it."""

    name: str
    uid: str
    node: str | None
    size: int
    level: str
    cpus: CPUSet  # spec.cpuSet, else status.cpus once held; EMPTY when still to be chosen
    held: bool  # Available: the node's agent holds it (its CPUs are out of the free set)
    reservation: CPUReservation

    def matches(self, namespace: str, name: str, labels: Mapping[str, str]) -> bool:
        return self.reservation.matches(namespace, name, labels)


def reservation_view(r: CPUReservation) -> ReservationView | None:
    """The view of `r`, None when it holds nothing any more."""
    if r.done:
        return None
    return ReservationView(
        name=r.name,
        uid=r.uid,
        node=r.node_name,
        size=r.spec.size,
        level=r.spec.level,
        cpus=r.spec.cpus or r.status.cpus,
        held=r.status.phase == "Available",
        reservation=r,
    )


def reservation_request(r: ReservationView) -> PodRequest:
    """What a reservation asks of a node, as a pod of one exclusive container would."""
    ask = ContainerAsk(
        RESERVATION_CONTAINER, "exclusive", r.size, r.level, cpus=r.cpus if r.cpus else None
    )
    return PodRequest("", f"cpureservation/{r.name}", r.uid or f"cpureservation/{r.name}", (ask,))


def hold_reservations(
    view: NodeView, pools: NodePools, reservations: Iterable[ReservationView]
) -> tuple[NodePools, dict[str, CPUSet]]:
    """`pools` with the node's Pending reservations held (module docstring), and per
    reservation the CPUs it holds there (what a matching pod may use; EMPTY when the node
    cannot hold it)."""
    held: dict[str, CPUSet] = {}
    for r in sorted(reservations, key=lambda r: r.name):
        if r.held:
            held[r.name] = withheld_for(view.topology, r.level, r.cpus) if r.cpus else EMPTY
            continue
        if r.cpus:
            withheld = withheld_for(view.topology, r.level, r.cpus)
            try:
                pools = pools.hold("exclusive", withheld)
            except CorepinError:
                # not free: the agent holds them already, or someone else does; a matching
                # pod is offered them only once the agent says they are the reservation's
                held[r.name] = EMPTY
                continue
            held[r.name] = withheld
            continue
        result = fit(view, reservation_request(r), pools)
        if result.ok and result.pools is not None:
            pools = result.pools
            held[r.name] = result.placed[0].withheld
        else:
            held[r.name] = EMPTY
    return pools, held


def pinned_to(request: PodRequest, cpus: CPUSet) -> PodRequest | None:
    """`request` with its one holding container given exactly `cpus` (what the agent gives a
    pod that uses a reservation), None when that is not the question: no CPUs, several
    holding containers, or a count other than the reservation's size."""
    holding = [c for c in request.containers if c.holds]
    if not cpus or len(holding) != 1 or holding[0].cpus is not None:
        return None
    if holding[0].count != len(cpus):
        return None
    pinned = replace(holding[0], kind="exclusive", cpus=cpus)
    return replace(
        request, containers=tuple(pinned if c is holding[0] else c for c in request.containers)
    )


def matched_by_node(
    reservations: Iterable[ReservationView], request: PodRequest
) -> dict[str, list[str]]:
    """Node -> the reservations there that the pod of `request` matches (none for a pod that
    asks for no CPUs of its own)."""
    out: dict[str, list[str]] = {}
    if not request.holds:
        return out
    for r in reservations:
        if r.node and r.matches(request.namespace, request.name, request.labels):
            out.setdefault(r.node, []).append(r.name)
    return out


def not_on(placed: tuple[Placed, ...], cpus: CPUSet) -> tuple[Placed, ...]:
    """The containers of a placement that do not run on `cpus` (a reservation's, counted by
    the reservation already)."""
    return tuple(p for p in placed if not (p.withheld & cpus)) if cpus else placed


def release(pools: NodePools, cpus: Iterable[CPUSet]) -> NodePools:
    """`pools` with the CPUs of the reservations a pod matches free for it."""
    for c in cpus:
        if c:
            pools = pools.release("exclusive", c)
    return pools


__all__ = [
    "RESERVATION_CONTAINER",
    "ReservationView",
    "hold_reservations",
    "matched_by_node",
    "not_on",
    "pinned_to",
    "release",
    "reservation_request",
    "reservation_view",
]
