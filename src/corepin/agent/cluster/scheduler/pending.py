"""The scheduler's pending pods: which pod the scheduling thread takes next.

- a pod of ours that appears or changes is queued once (the queue is deduplicated);
- a pod that fits nowhere is parked: it goes back on the queue when the cluster changes (a
  topology, a node, a pod; at most once a second) and at least every `retry_every` seconds;
- a pod whose scheduling or bind failed is delayed: queued again after a backoff that doubles
  from `backoff_initial` up to `backoff_max`, and is reset by a successful bind.
"""

from __future__ import annotations

import threading
import time

Key = tuple[str, str]


class PendingPods:
    """The queue, the parked pods and the delayed ones (thread-safe; see the module
    docstring)."""

    def __init__(self, *, retry_every: float, backoff_initial: float, backoff_max: float) -> None:
        self.retry_every = retry_every
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._queue: list[Key] = []
        self._queued: set[Key] = set()
        self._parked: dict[Key, float] = {}  # unschedulable pods -> when they were last tried
        self._delayed: dict[Key, float] = {}  # pods retried after a failed bind -> when
        self._backoff: dict[Key, float] = {}
        self._changed_at = 0.0
        self._flushed_at = 0.0

    def add(self, key: Key) -> None:
        """Queue `key` (once)."""
        with self._wake:
            if key not in self._queued:
                self._queued.add(key)
                self._queue.append(key)
                self._wake.notify()

    def offer(self, key: Key) -> None:
        """A pod of ours appeared or changed: queue it, unless it is parked or delayed (it is
        tried again on a change of the cluster, or after its backoff)."""
        with self._lock:
            if key in self._parked or key in self._delayed:
                return
        self.add(key)

    def forget(self, key: Key) -> None:
        """The pod is gone."""
        with self._lock:
            self._parked.pop(key, None)
            self._backoff.pop(key, None)

    def unpark(self, key: Key) -> None:
        """The pod is no longer waiting for room (not ours any more, or placed)."""
        with self._lock:
            self._parked.pop(key, None)

    def park(self, key: Key) -> None:
        """The pod fits nowhere now: tried again when the cluster changes."""
        with self._lock:
            self._parked[key] = time.monotonic()

    def bound(self, key: Key) -> None:
        """The pod was bound: its backoff starts afresh."""
        with self._lock:
            self._backoff.pop(key, None)

    def retry_later(self, key: Key) -> None:
        """Scheduling or binding the pod failed: queue it again after its backoff."""
        with self._lock:
            delay = min(self.backoff_max, self._backoff.get(key, self.backoff_initial / 2) * 2)
            self._backoff[key] = delay
            self._delayed[key] = time.monotonic() + delay

    def changed(self) -> None:
        """The cluster changed (a topology, a node, a pod, the leadership): the parked pods
        are due again."""
        with self._wake:
            self._changed_at = time.monotonic()
            self._wake.notify()

    def wake(self) -> None:
        """Wake a thread waiting in `next()` (to stop)."""
        with self._wake:
            self._wake.notify_all()

    def empty(self) -> bool:
        with self._lock:
            return not self._queue

    def next(self) -> Key | None:
        """The next pod to schedule (None to look at the lease and the clock again)."""
        with self._wake:
            now = time.monotonic()
            flush = (self._changed_at > self._flushed_at and now - self._flushed_at >= 1.0) or (
                self._parked and now - self._flushed_at >= self.retry_every
            )
            if flush and self._parked:
                self._flushed_at = now
                for key in sorted(self._parked):
                    if key not in self._queued:
                        self._queued.add(key)
                        self._queue.append(key)
                self._parked.clear()
            elif flush:
                self._flushed_at = now
            for key, when in list(self._delayed.items()):
                if when <= now:
                    del self._delayed[key]
                    if key not in self._queued:
                        self._queued.add(key)
                        self._queue.append(key)
            if not self._queue:
                self._wake.wait(0.2)
                return None
            key = self._queue.pop(0)
            self._queued.discard(key)
            return key


__all__ = ["Key", "PendingPods"]
