"""The node's reserved CPUs as the node agent keeps them: its reservation annotation
(`corepin.io/reservation`, else Koordinator's `node.koordinator.sh/reservation`), else
`--reserved-cpus`, with the strict-reservation option.

A reservation that cannot be read, or that would take CPUs someone holds, is ignored - the
reserved CPUs stay as they were until those are released - and a Warning Event on the node says
why.
"""

from __future__ import annotations

import logging

from corepin.agent.node.settings import NodeSettings
from corepin.agent.node.watches import Watches
from corepin.allocation.reserved import reserved_cpus
from corepin.core.cpuset import CPUSet
from corepin.core.errors import CorepinError
from corepin.kube.events import EventRecorder
from corepin.kube.models import ObjectView, parse_node_reservation
from corepin.state.model import STRICT_RESERVATION, HostState
from corepin.topology.model import Topology

log = logging.getLogger("corepin.agent.node")


class NodeReservation:
    """The reserved CPUs of the agent's node."""

    def __init__(
        self,
        settings: NodeSettings,
        watches: Watches,
        topology: Topology,
        events: EventRecorder,
    ) -> None:
        self.settings = settings
        self.watches = watches
        self.machine = topology
        self.events = events

    def apply(self, state: HostState) -> HostState:
        """The state with the node's reserved CPUs (its reservation annotation, else
        --reserved-cpus) and strict-reservation option; unchanged when the new reservation
        would take CPUs someone holds (a Warning Event on the node says so)."""
        node = self.watches.node()
        # the raw annotations (parse_node_reservation says which is not a string)
        annotations = ObjectView(node).metadata.get("annotations") or {}
        reserved = self.settings.reserved_cpus or CPUSet()
        try:
            reservation = parse_node_reservation(annotations)
            if reservation is not None:
                reserved = reserved_cpus(self.machine, reservation.count, reservation.cpus)
        except CorepinError as exc:
            self._warn(exc.message)
        options = {k: v for k, v in self.settings.options.items() if k == STRICT_RESERVATION}
        wanted = state.evolve(reserved=reserved, options={**state.options, **options})
        clash = [a.id for a in wanted if a.holds and a.withheld & reserved]
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
        node = self.watches.node()
        if node is not None:
            self.events.event(node, "Warning", "ReservationIgnored", message)


__all__ = ["NodeReservation"]
