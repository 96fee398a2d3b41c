"""The node agent's publisher: a thread of its own for every API write and assignment file, so
the worker pins the next container while the API is still being told about the last.

The worker hands over keys with a payload (`later`); the latest payload per key wins, and a key
waiting once is queued once:
- ("pod", uid) with the pod's `PodWork`: its annotation and PodCPUBindings (`records`) and its
  assignment files (`files`) - nothing for a pod gone meanwhile (its "forget" follows);
- ("forget", uid): the bindings, the annotation record and the files of a pod that is gone;
- ("topology",): the NodeCPUTopology and NodeResourceTopology (`nodetopology`);
- ("pool",): the files of every container on the shared pool (it changed);
- ("sweep",): files and agent bindings of pods that are gone (start-up, every resync);
- ("cpur", name) and ("evict", pod uid) with a function to call: a CPUReservation's status,
  an eviction (`corepin.agent.node.reservations`).
Each step on its own: one failing (logged) never skips the next.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

from corepin.agent.node.decide import PodWork
from corepin.agent.node.files import AssignmentFiles
from corepin.agent.node.nodetopology import TopologyPublisher
from corepin.agent.node.records import PodRecords
from corepin.agent.node.store import NodeStore
from corepin.agent.node.watches import Watches
from corepin.core.errors import CorepinError

log = logging.getLogger("corepin.agent.node")

#: a key of the work queue or of the publisher: its kind first
Key = tuple[str, ...]
#: what the publisher is handed with a key (see the module docstring)
Payload = PodWork | str | Callable[[], None] | None


class Publisher:
    """The publisher thread's queue and its steps."""

    def __init__(
        self,
        store: NodeStore,
        watches: Watches,
        records: PodRecords,
        files: AssignmentFiles,
        topology: TopologyPublisher,
    ) -> None:
        self.store = store
        self.watches = watches
        self.records = records
        self.files = files
        self.topology = topology
        self._lock = threading.Lock()
        self._queue: queue.Queue[Key | None] = queue.Queue()
        self._waiting: dict[Key, Payload] = {}
        #: set while nothing waits to be published
        self.published = threading.Event()
        self.published.set()

    @property
    def pending(self) -> bool:
        """Whether anything waits to be published."""
        with self._lock:
            return bool(self._waiting)

    def later(self, key: Key, payload: Payload) -> None:
        """Hand an API write to the publisher thread (the latest payload per key wins)."""
        with self._lock:
            fresh = key not in self._waiting
            self._waiting[key] = payload
            self.published.clear()
        if fresh:
            self._queue.put(key)

    def stop(self) -> None:
        self._queue.put(None)

    def run(self) -> None:
        """The publisher thread (until `stop`)."""
        while True:
            with self._lock:
                if not self._waiting:
                    self.published.set()
            key = self._queue.get()
            if key is None:
                return
            with self._lock:
                payload = self._waiting.pop(key, None)
            for step in self._steps(key, payload):
                try:
                    step()
                except CorepinError as exc:
                    log.warning("event=publish_failed key=%s error=%s", "/".join(key), exc)
                except Exception:
                    log.exception("event=publish_crashed key=%s", "/".join(key))

    def _steps(self, key: Key, payload: Payload) -> list[Callable[[], None]]:
        state = self.store.state
        if key[0] == "pod" and state is not None and isinstance(payload, PodWork):
            work = payload
            if not self.watches.is_live(work.plan):
                return []  # gone meanwhile: nothing is written for it (its forget follows)
            return [
                lambda: self.records.publish(work.pod, work.plan, state),
                lambda: self.files.write(work.plan, state),
            ]
        if key[0] == "forget" and isinstance(payload, str):
            uid = payload
            return [
                lambda: self.records.delete_bindings(uid, ()),
                lambda: self.records.drop_annotation(uid),
                lambda: self.files.remove(uid),
            ]
        if key[0] == "topology":
            return [lambda: self.topology.publish(self.store.state)]
        if key[0] == "pool" and state is not None:
            return [lambda: self.files.refresh_shared(state)]
        if key[0] in ("cpur", "evict") and callable(payload):
            return [payload]
        if key[0] == "sweep" and state is not None:
            return [lambda: self.files.sweep(state), lambda: self.records.sweep(state)]
        return []


__all__ = ["Key", "Payload", "Publisher"]
