"""The node's reserved CPUs as the node agent and the NRI plugin keep them: the node's
reservation annotation (`corepin.io/reservation`, else Koordinator's
`node.koordinator.sh/reservation`), else `--reserved-cpus`, with the strict-reservation option.
The node object comes from a getter (the agent's watch; None for an NRI plugin without the API).

A reservation that cannot be read is ignored, and a Warning Event on the node says why. One
that would take CPUs someone holds is ignored - the reserved CPUs stay as they were until those
are released - unless the agent can clear them (`clear`: the node agent moves the containers
on them elsewhere, or tells them, or evicts them, see `corepin.agent.node.reservations`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Protocol

from corepin.allocation.reserved import reserved_cpus
from corepin.core.cpuset import CPUSet
from corepin.core.errors import CorepinError
from corepin.kube.client import Obj
from corepin.kube.events import EventRecorder
from corepin.kube.models import ANN_RESERVATION, ObjectView, parse_node_reservation
from corepin.state.model import STRICT_RESERVATION, HostState
from corepin.topology.model import Topology

log = logging.getLogger("corepin.agent.node")


class Clearer(Protocol):
    """Clears CPUs held by containers: the state with them moved elsewhere, None when it cannot
    (yet)."""

    def __call__(
        self, state: HostState, cpus: CPUSet, what: str, *, reason: str
    ) -> HostState | None: ...


class NodeReservation:
    """The reserved CPUs of the agent's node."""

    def __init__(
        self,
        reserved: CPUSet | None,
        options: Mapping[str, str],
        node: Callable[[], Obj | None],
        topology: Topology,
        events: EventRecorder | None,
        clear: Clearer | None = None,
    ) -> None:
        self.clear = clear
        self.reserved = reserved
        self.options = options
        self.node = node
        self.machine = topology
        self.events = events

    def apply(self, state: HostState) -> HostState:
        """The state with the node's reserved CPUs (its reservation annotation, else
        --reserved-cpus) and strict-reservation option; unchanged when the new reservation
        would take CPUs someone holds (a Warning Event on the node says so)."""
        node = self.node()
        # the raw annotations (parse_node_reservation says which is not a string)
        annotations = ObjectView(node).metadata.get("annotations") or {}
        reserved = self.reserved or CPUSet()
        try:
            reservation = parse_node_reservation(annotations)
            if reservation is not None:
                reserved = reserved_cpus(self.machine, reservation.count, reservation.cpus)
        except CorepinError as exc:
            self._warn(exc.message)
        options = {k: v for k, v in self.options.items() if k == STRICT_RESERVATION}
        wanted = state.evolve(reserved=reserved, options={**state.options, **options})
        clash = [a.id for a in wanted if a.holds and a.withheld & reserved]
        if clash and self.clear is not None and reserved != state.reserved:
            cleared = self.clear(
                state,
                reserved,
                f"the node reservation ({ANN_RESERVATION})",
                reason="reserved for the node's system",
            )
            if cleared is not None:
                wanted = cleared.evolve(reserved=reserved, options={**state.options, **options})
                clash = []
            else:
                log.info("event=reservation_waits reserved=%s", reserved)
                return state
        if clash:
            self._warn(
                f"reserved CPUs {reserved} overlap CPUs held by {', '.join(clash)}; keeping "
                f"reserved CPUs {state.reserved or 'none'} until they are released",
            )
            return state
        if wanted.reserved != state.reserved:
            log.info("event=reserved_changed old=%s new=%s", state.reserved, wanted.reserved)
        return wanted

    def _warn(self, message: str) -> None:
        node = self.node()
        if node is not None and self.events is not None:
            self.events.event(node, "Warning", "ReservationIgnored", message)
        else:  # (no API to tell it on)
            log.warning("event=reservation_ignored reason=%s", message)


__all__ = ["NodeReservation"]
