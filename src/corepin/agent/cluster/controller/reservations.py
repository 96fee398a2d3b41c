"""The controller's work on one CPUReservation: decide (`reservation_rules`), then write.

`ReservationSync.sync(name)` reads the reservation from the informer's cache, looks the node
of a Pending one up (one GET of `spec.nodeName`: the controller does not watch Nodes), writes
the status the decision calls for through the status subresource with the resourceVersion
read (a 409 re-reads and decides again, at most `conflict_retries` times), deletes a consumed
one (preconditions: its uid and resourceVersion), reports an Event on Expired, Failed and
deleted reservations, and queues the key again for when its TTL runs out.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Mapping
from typing import Any

from corepin.agent.cluster.controller import reservation_rules as rr
from corepin.agent.cluster.controller.metrics import ControllerMetrics
from corepin.agent.cluster.controller.writer import (
    ConflictsExhausted,
    Key,
    reread_after_conflict,
)
from corepin.core.errors import ApiConflict, ApiNotFound
from corepin.kube.client import KubeClient
from corepin.kube.events import EventRecorder
from corepin.kube.informer import Cache, Obj
from corepin.kube.models import ObjectView
from corepin.kube.resources import CPUR, NODES
from corepin.kube.workqueue import WorkQueue

log = logging.getLogger("corepin.controller")

_EVENTS = {
    rr.EXPIRED: ("Normal", "ReservationExpired"),
    rr.FAILED: ("Warning", "ReservationFailed"),
    rr.DELETED: ("Normal", "ReservationConsumed"),
}


class ReservationSync:
    """Decide and write one reservation at a time (the worker's alone)."""

    def __init__(
        self,
        client: KubeClient,
        cache: Cache,
        metrics: ControllerMetrics,
        events: EventRecorder,
        queue: WorkQueue[Key],
        *,
        conflict_retries: int,
        clock: Callable[[], dt.datetime],
    ) -> None:
        self.client = client
        self.cache = cache
        self.metrics = metrics
        self.events = events
        self.queue = queue
        self.conflict_retries = conflict_retries
        self._clock = clock

    def _node_exists(self, obj: Mapping[str, Any]) -> bool | None:
        node = rr.node_to_check(obj)
        if node is None:
            return None
        try:
            self.client.get(NODES, node)
        except ApiNotFound:
            return False
        return True

    def sync(self, name: str) -> None:
        obj: Obj | None = self.cache.get(name)
        for _ in range(self.conflict_retries):
            if obj is None:
                return
            decision = rr.decide_reservation(obj, self._clock(), self._node_exists(obj))
            try:
                self._apply(obj, decision)
            except ApiNotFound:
                return
            except ApiConflict:
                obj = reread_after_conflict(self.client, self.metrics, CPUR, name)
                continue
            if decision.recheck_after is not None:
                # a little after the TTL runs out: the clock of the API server set creation
                self.queue.add_after(("reservation", name), decision.recheck_after + 0.05)
            return
        raise ConflictsExhausted(f"writing CPUReservation {name}")

    def _apply(self, obj: Obj, decision: rr.ReservationAction) -> None:
        meta = ObjectView(obj).metadata
        name = str(meta.get("name") or "")
        if decision.delete:
            self.client.delete(
                CPUR,
                name,
                uid=str(meta.get("uid") or "") or None,
                resource_version=str(meta.get("resourceVersion") or "") or None,
            )
        elif decision.status is not None:
            self.client.replace_status(CPUR, {**obj, "status": dict(decision.status)})
        else:
            return
        if decision.action:
            self.metrics.reservations.labels(decision.action).inc()
        log.info(
            "event=reservation_%s reservation=%s message=%r",
            decision.action or "written",
            name,
            decision.message,
        )
        event = _EVENTS.get(decision.action)
        if event is not None:
            self.events.event(obj, event[0], event[1], f"CPUReservation {name}: {decision.message}")


__all__ = ["ReservationSync"]
