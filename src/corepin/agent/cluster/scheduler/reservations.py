"""`corepin scheduler` places CPUReservations that name no node.

A `Pending` reservation without `spec.nodeName` or `status.nodeName` is queued like a pod
(its key's namespace is `RESERVATIONS`, which no namespace can be: namespaces have no dots)
and placed by the same core: `Cluster.evaluate` of what it asks (`spec.cpus` exclusive CPUs
at its level, or its `spec.cpuSet`), as a pod of one exclusive container would be placed,
over every node with a NodeCPUTopology. The best node goes to `status.nodeName` (a merge
patch of the status subresource; the phase stays `Pending` until the node's agent holds the
CPUs) and the reservation is counted on that node at once. One that fits nowhere is parked
like an unschedulable pod (its `status.message` says why) and tried again when the cluster
changes.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Final

from corepin.core.errors import ApiNotFound, CorepinError
from corepin.core.record import replace
from corepin.kube.client import KubeClient
from corepin.kube.informer import Cache
from corepin.kube.models import CPUReservation, ObjectView
from corepin.kube.resources import CPUR
from corepin.placement.cluster import Cluster
from corepin.placement.reservations import reservation_request, reservation_view
from corepin.placement.taints import failure_message

log = logging.getLogger("corepin.agent.cluster.scheduler")

#: the namespace of reservation keys on the scheduler's queue
RESERVATIONS: Final = "cpureservations.corepin.io"


def unplaced(obj: Mapping[str, Any]) -> bool:
    """Whether the reservation waits for the scheduler: readable, Pending, no node."""
    try:
        r = CPUReservation.from_dict(obj)
    except CorepinError:
        return False
    return r.status.phase == "Pending" and not r.node_name


class ReservationPlacer:
    """Places node-less reservations (see the module docstring)."""

    def __init__(self, client: KubeClient, cache: Cache, cluster: Cluster, name: str) -> None:
        self.client = client
        self.cache = cache
        self.cluster = cluster
        self.name = name
        self.placed = 0

    def place(self, name: str, now: float) -> bool:
        """Place the reservation `name`; False when no node can hold it now."""
        obj = self.cache.get(name)
        if obj is None or not unplaced(obj):
            return True
        view = reservation_view(CPUReservation.from_dict(obj))
        if view is None:
            return True
        answers = self.cluster.evaluate(reservation_request(view), self.cluster.names(), now)
        best = self.cluster.best(answers)
        if best is None:
            failures = {a.node: (a.code, a.reason) for a in answers}
            message = failure_message(len(answers), failures)
            if ObjectView(obj).status.get("message") != message:
                self._patch(name, {"phase": "Pending", "message": message})
            log.info("event=reservation_unplaceable reservation=%s why=%s", name, message)
            return False
        message = f"node {best.node} chosen by {self.name}; waiting for its agent to hold the CPUs"
        self._patch(name, {"phase": "Pending", "nodeName": best.node, "message": message})
        self.cluster.set_reservation(replace(view, node=best.node))
        self.placed += 1
        log.info("event=reservation_placed reservation=%s node=%s", name, best.node)
        return True

    def _patch(self, name: str, status: Mapping[str, Any]) -> None:
        try:
            self.client.patch_status(CPUR, name, {"status": dict(status)})
        except ApiNotFound:
            return


__all__ = ["RESERVATIONS", "ReservationPlacer", "unplaced"]
