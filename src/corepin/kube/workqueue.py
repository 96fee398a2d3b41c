"""A work queue for controllers, as client-go's `workqueue` behaves:

- **deduplicated**: a key waiting in the queue is queued once however often it is added;
- **one worker per key**: a key being processed is not handed out again; added meanwhile, it
  goes back into the queue when the worker calls `done(key)`, so the latest state is always
  looked at once more after a change, never twice at the same time;
- **delayed adds**: `add_after(key, seconds)` (timers such as "check this heartbeat again in
  20 s"; the earliest of several pending delays wins);
- **rate-limited requeue**: `add_rate_limited(key)` after a failure waits `base * 2**failures`
  seconds (capped at `maximum`) - the failures of that key, until `forget(key)` after a success.

Handlers add keys from informer threads; workers `get()` them. `shutdown()` wakes every waiting
`get()` (it returns None) and drops what was queued. Keys are any hashable values.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class WorkQueue(Generic[K]):
    """Deduplicated FIFO of keys with delayed and rate-limited adds."""

    def __init__(
        self,
        *,
        base_delay: float = 0.05,
        max_delay: float = 60.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.base_delay = base_delay
        self.max_delay = max_delay
        self._monotonic = monotonic
        self._cond = threading.Condition()
        self._queue: deque[K] = deque()
        self._dirty: set[K] = set()
        self._processing: set[K] = set()
        self._waiting: list[tuple[float, int, K]] = []  # heap of (due, tie-breaker, key)
        self._due: dict[K, float] = {}  # earliest pending delay per key
        self._failures: dict[K, int] = {}
        self._seq = itertools.count()
        self._shut = False

    # ------------------------------------------------------------------ adding
    def add(self, key: K) -> None:
        """Queue `key` now (no-op when it is already waiting to be processed)."""
        with self._cond:
            self._add_locked(key)

    def _add_locked(self, key: K) -> None:
        if self._shut or key in self._dirty:
            return
        self._dirty.add(key)
        if key not in self._processing:
            self._queue.append(key)
            self._cond.notify()

    def add_after(self, key: K, seconds: float) -> None:
        """Queue `key` after `seconds` (at once when <= 0); an earlier pending delay wins."""
        if seconds <= 0:
            self.add(key)
            return
        with self._cond:
            if self._shut:
                return
            due = self._monotonic() + seconds
            current = self._due.get(key)
            if current is not None and current <= due:
                return
            self._due[key] = due
            heapq.heappush(self._waiting, (due, next(self._seq), key))
            self._cond.notify()

    def add_rate_limited(self, key: K) -> float:
        """Queue `key` again after its backoff (which grows with each call until `forget`).
        Returns the delay chosen."""
        with self._cond:
            failures = self._failures.get(key, 0)
            self._failures[key] = failures + 1
        delay = float(min(self.max_delay, self.base_delay * 2.0 ** min(failures, 62)))
        self.add_after(key, delay)
        return delay

    def forget(self, key: K) -> None:
        """Reset the backoff of `key` (after it was processed successfully)."""
        with self._cond:
            self._failures.pop(key, None)

    def failures(self, key: K) -> int:
        with self._cond:
            return self._failures.get(key, 0)

    # ------------------------------------------------------------------ taking
    def _promote_due_locked(self) -> float | None:
        """Move delayed keys that are due into the queue; the seconds until the next one."""
        now = self._monotonic()
        while self._waiting:
            due, _, key = self._waiting[0]
            if self._due.get(key) != due:  # superseded by an earlier delay, or already added
                heapq.heappop(self._waiting)
                continue
            if due > now:
                return due - now
            heapq.heappop(self._waiting)
            del self._due[key]
            self._add_locked(key)
        return None

    def get(self, timeout: float | None = None) -> K | None:
        """The next key to process (mark it `done` afterwards); None on shutdown or when
        `timeout` passes with nothing to do."""
        deadline = None if timeout is None else self._monotonic() + timeout
        with self._cond:
            while True:
                if self._shut:
                    return None
                wait = self._promote_due_locked()
                if self._queue:
                    key = self._queue.popleft()
                    self._dirty.discard(key)
                    self._processing.add(key)
                    return key
                if deadline is not None:
                    left = deadline - self._monotonic()
                    if left <= 0:
                        return None
                    wait = left if wait is None else min(wait, left)
                self._cond.wait(wait)

    def done(self, key: K) -> None:
        """The worker has finished with `key`; when it was added meanwhile it is queued again."""
        with self._cond:
            self._processing.discard(key)
            if key in self._dirty and not self._shut:
                self._queue.append(key)
                self._cond.notify()

    # ------------------------------------------------------------------ state
    def shutdown(self) -> None:
        with self._cond:
            self._shut = True
            self._queue.clear()
            self._dirty.clear()
            self._waiting.clear()
            self._due.clear()
            self._cond.notify_all()

    @property
    def shutting_down(self) -> bool:
        with self._cond:
            return self._shut

    def __len__(self) -> int:
        """Keys ready to be processed now (delayed ones not counted)."""
        with self._cond:
            return len(self._queue)

    def delayed(self) -> int:
        """Keys waiting for a delay to pass."""
        with self._cond:
            return len(self._due)

    def idle(self) -> bool:
        """Nothing queued and nothing being processed (delayed keys aside)."""
        with self._cond:
            return not self._queue and not self._processing
