"""The controller's heartbeat check of NodeCPUTopologies: a topology whose agent has not
advanced `status.heartbeatTime` for `heartbeat_timeout` seconds, as this controller's own
monotonic clock measures it, is marked `Ready=False` (reason `HeartbeatStale`) with a Warning
Event. A topology seen for the first time gets the full timeout; a `Ready=False` already
there (the agent's own) is left alone, and `Ready=True` is never set (the agent does that
when it reports again).
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from collections.abc import Callable, Mapping

from corepin.agent.cluster.controller import rules
from corepin.agent.cluster.controller.metrics import ControllerMetrics
from corepin.agent.cluster.controller.writer import ConflictsExhausted, Key, reread_after_conflict
from corepin.core.errors import ApiConflict, ApiNotFound
from corepin.kube.client import KubeClient
from corepin.kube.events import EventRecorder
from corepin.kube.informer import Cache, Obj
from corepin.kube.models import (
    HEARTBEAT_STALE,
    READY,
    Condition,
    ObjectView,
    find_condition,
    set_condition,
)
from corepin.kube.resources import NCPT
from corepin.kube.workqueue import WorkQueue

log = logging.getLogger("corepin.controller")


class Heartbeats:
    """When each node's heartbeat last changed, and the check of one node (see the module
    docstring). `observe` is called from the informer's handlers, `check` by the worker."""

    def __init__(
        self,
        client: KubeClient,
        topologies: Cache,
        metrics: ControllerMetrics,
        events: EventRecorder,
        queue: WorkQueue[Key],
        *,
        timeout: float,
        conflict_retries: int,
        clock: Callable[[], dt.datetime],
        monotonic: Callable[[], float],
    ) -> None:
        self.client = client
        self.topologies = topologies
        self.metrics = metrics
        self.events = events
        self.queue = queue
        self.timeout = timeout
        self.conflict_retries = conflict_retries
        self._clock = clock
        self._monotonic = monotonic
        self._lock = threading.Lock()
        # node name -> (heartbeatTime text or None, monotonic time it was first seen)
        self._beats: dict[str, tuple[str | None, float]] = {}

    def observe(self, obj: Obj) -> None:
        """Note the heartbeat of a NodeCPUTopology (the time it changed, when it did)."""
        name = ObjectView(obj).name
        status = obj.get("status")
        beat = status.get("heartbeatTime") if isinstance(status, Mapping) else None
        text = str(beat) if beat else None
        with self._lock:
            seen = self._beats.get(name)
            if seen is None or seen[0] != text:
                self._beats[name] = (text, self._monotonic())

    def forget(self, name: str) -> None:
        """The NodeCPUTopology is gone."""
        with self._lock:
            self._beats.pop(name, None)

    def check(self, name: str) -> None:
        """Mark the node's topology stale when its heartbeat is, else check again when it
        would be."""
        obj = self.topologies.get(name)
        if obj is None:
            return
        with self._lock:
            seen = self._beats.get(name)
        if seen is None:
            self.observe(obj)
            with self._lock:
                seen = self._beats[name]
        beat, since = seen
        timeout = self.timeout
        quiet = self._monotonic() - since
        if quiet < timeout:
            self.queue.add_after(("topology", name), timeout - quiet + 0.01)
            return
        ready = find_condition(rules.read_conditions(ObjectView(obj).status), READY)
        if ready is not None and ready.status == "False":
            return  # not trusted already; the agent sets Ready=True when it is back
        self._mark_stale(obj, beat, quiet)

    def _mark_stale(self, obj: Obj, beat: str | None, quiet: float) -> None:
        name = ObjectView(obj).name
        timeout = self.timeout
        if beat is None:
            message = (
                f"the corepin agent of node {name} has not reported a heartbeat "
                f"(status.heartbeatTime) in the {quiet:.0f} s this controller has watched "
                f"(timeout {timeout:g} s): do not trust this topology"
            )
        else:
            message = (
                f"status.heartbeatTime {beat} has not changed for {quiet:.0f} s (timeout "
                f"{timeout:g} s): the corepin agent of node {name} stopped reporting; do not "
                "trust this topology until it reports again"
            )
        for _ in range(self.conflict_retries):
            status = dict(ObjectView(obj).status)
            conditions = rules.read_conditions(status)
            condition = Condition(READY, "False", self._clock(), HEARTBEAT_STALE, message)
            status["conditions"] = [c.to_dict() for c in set_condition(conditions, condition)]
            body = {**obj, "status": status}
            try:
                self.client.replace_status(NCPT, body)
            except ApiNotFound:
                return
            except ApiConflict:
                reread = reread_after_conflict(self.client, self.metrics, NCPT, name)
                if reread is None:
                    return
                obj = reread
                fresh = ObjectView(obj).status.get("heartbeatTime")
                if (str(fresh) if fresh else None) != beat:
                    self.observe(obj)
                    return  # the agent is alive: nothing to mark
                continue
            self.metrics.stale_heartbeats.inc()
            log.warning(
                "event=heartbeat_stale node=%s heartbeat=%s quiet_seconds=%.0f timeout=%g",
                name,
                beat or "none",
                quiet,
                timeout,
            )
            self.events.event(obj, "Warning", HEARTBEAT_STALE, message)
            return
        raise ConflictsExhausted(f"marking NodeCPUTopology {name} not Ready")


__all__ = ["Heartbeats"]
