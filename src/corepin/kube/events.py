"""Kubernetes Events about objects (pods, nodes), written as core/v1 Events the way the
kubelet's recorder writes them, so `kubectl describe` and `kubectl get events` show them with a
count:

- a repeat of the same event (same object, type, reason, message, source) within the cache is
  not a new object: the existing Event is patched with `count + 1` and a new `lastTimestamp`
  (and created again, count kept, if it has been deleted meanwhile);
- when one object gets `similar_threshold` events of the same type and reason with different
  messages within `similar_window` seconds, later ones are folded into one Event whose message
  starts with "(combined from similar events): ";
- a token bucket per object and source (burst 25, one token per 5 minutes) drops floods.

Why core/v1 rather than events.k8s.io/v1: the count aggregation the node agent needs is the
core/v1 model (events.k8s.io/v1 replaces it with `series`), both APIs read the same storage,
and every kubectl and client shows core/v1 Events.

Failures to write an event are logged and counted, never raised: an event is never worth
failing the work it reports on. `start()` moves the writes to a background thread (then
`event()` only queues); without it they happen in the caller's thread.
"""

from __future__ import annotations

import datetime as dt
import logging
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from corepin.core.errors import ApiError, ApiNotFound, ApiUnreachable
from corepin.kube.client import KubeClient
from corepin.kube.models import ObjectView
from corepin.kube.resources import EVENTS

Obj = dict[str, Any]
log = logging.getLogger("corepin.kube.events")

COMBINED_PREFIX = "(combined from similar events): "


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _stamp(when: dt.datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class ObjectReference:
    """The object an event is about."""

    kind: str
    name: str
    namespace: str = ""
    uid: str = ""
    api_version: str = "v1"
    resource_version: str = ""
    field_path: str = ""

    @classmethod
    def of(
        cls, obj: Mapping[str, Any], *, kind: str = "", api_version: str = ""
    ) -> ObjectReference:
        view = ObjectView(obj)
        return cls(
            kind=str(obj.get("kind") or kind),
            name=view.name,
            namespace=view.namespace,
            uid=view.uid,
            api_version=str(obj.get("apiVersion") or api_version or "v1"),
            resource_version=view.resource_version,
        )

    def to_json(self) -> Obj:
        out: Obj = {"kind": self.kind, "name": self.name, "apiVersion": self.api_version}
        for key, value in (
            ("namespace", self.namespace),
            ("uid", self.uid),
            ("resourceVersion", self.resource_version),
            ("fieldPath", self.field_path),
        ):
            if value:
                out[key] = value
        return out


@dataclass
class _Logged:
    name: str
    namespace: str
    event_type: str
    reason: str
    count: int
    first: str


@dataclass
class _Similar:
    messages: set[str] = field(default_factory=set)
    since: float = 0.0


@dataclass
class EventStats:
    created: int = 0
    aggregated: int = 0  # repeats written as count + 1
    dropped: int = 0  # spam filter
    errors: int = 0


class EventRecorder:
    """Writes Events for one component (and host)."""

    def __init__(
        self,
        client: KubeClient,
        component: str,
        *,
        host: str = "",
        clock: Callable[[], dt.datetime] = _now,
        monotonic: Callable[[], float] = time.monotonic,
        cache_size: int = 4096,
        similar_threshold: int = 10,
        similar_window: float = 600.0,
        burst: int = 25,
        refill_seconds: float = 300.0,
    ) -> None:
        self.client = client
        self.component = component
        self.host = host
        self.stats = EventStats()
        self._clock = clock
        self._monotonic = monotonic
        self._cache_size = cache_size
        self._similar_threshold = similar_threshold
        self._similar_window = similar_window
        self._burst = burst
        self._refill = refill_seconds
        self._lock = threading.Lock()
        self._logged: OrderedDict[tuple[str, ...], _Logged] = OrderedDict()
        self._similar: OrderedDict[tuple[str, ...], _Similar] = OrderedDict()
        self._buckets: OrderedDict[tuple[str, ...], tuple[float, float]] = OrderedDict()
        self._queue: queue.Queue[tuple[ObjectReference, str, str, str] | None] | None = None
        self._worker: threading.Thread | None = None

    # ------------------------------------------------------------------ public
    def event(
        self,
        involved: ObjectReference | Mapping[str, Any],
        event_type: str,
        reason: str,
        message: str,
    ) -> Obj | None:
        """Record an event (`event_type` "Normal" or "Warning"). Returns the Event as written
        (None when queued, dropped by the spam filter, or when writing failed)."""
        ref = involved if isinstance(involved, ObjectReference) else ObjectReference.of(involved)
        if self._queue is not None:
            self._queue.put((ref, event_type, reason, message))
            return None
        return self._record(ref, event_type, reason, message)

    def start(self) -> EventRecorder:
        """Write events from a background thread from now on."""
        self._queue = queue.Queue()
        self._worker = threading.Thread(target=self._drain, name="event-recorder", daemon=True)
        self._worker.start()
        return self

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until every queued event has been written (True) or `timeout` passed."""
        if self._queue is None:
            return True
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._queue.unfinished_tasks == 0:
                return True
            time.sleep(0.01)
        return False

    def stop(self, timeout: float = 5.0) -> None:
        if self._queue is None or self._worker is None:
            return
        self._queue.put(None)
        self._worker.join(timeout)
        self._queue = None

    # ------------------------------------------------------------------ internals
    def _drain(self) -> None:
        assert self._queue is not None
        work = self._queue
        while True:
            item = work.get()
            try:
                if item is None:
                    return
                self._record(*item)
            finally:
                work.task_done()

    def _base_key(self, ref: ObjectReference, event_type: str, reason: str) -> tuple[str, ...]:
        return (
            self.component,
            self.host,
            ref.kind,
            ref.namespace,
            ref.name,
            ref.uid,
            ref.api_version,
            event_type,
            reason,
        )

    def _allowed(self, key: tuple[str, ...]) -> bool:
        now = self._monotonic()
        tokens, at = self._buckets.get(key, (float(self._burst), now))
        tokens = min(float(self._burst), tokens + (now - at) / self._refill)
        if tokens < 1.0:
            self._buckets[key] = (tokens, now)
            return False
        self._buckets[key] = (tokens - 1.0, now)
        self._buckets.move_to_end(key)
        while len(self._buckets) > self._cache_size:
            self._buckets.popitem(last=False)
        return True

    def _aggregate(self, base: tuple[str, ...], message: str) -> str:
        now = self._monotonic()
        record = self._similar.get(base)
        if record is None or now - record.since > self._similar_window:
            record = _Similar(since=now)
        record.messages.add(message)
        self._similar[base] = record
        self._similar.move_to_end(base)
        while len(self._similar) > self._cache_size:
            self._similar.popitem(last=False)
        if len(record.messages) >= self._similar_threshold:
            return COMBINED_PREFIX + message
        return message

    def _record(
        self, ref: ObjectReference, event_type: str, reason: str, message: str
    ) -> Obj | None:
        with self._lock:
            base = self._base_key(ref, event_type, reason)
            if not self._allowed((*base, message)):
                self.stats.dropped += 1
                return None
            shown = self._aggregate(base, message)
            key = (*base, shown if shown.startswith(COMBINED_PREFIX) else message)
            if shown.startswith(COMBINED_PREFIX):
                key = (*base, COMBINED_PREFIX)
            logged = self._logged.get(key)
            stamp = _stamp(self._clock())
            try:
                if logged is not None:
                    logged.count += 1
                    written = self._repeat(ref, logged, shown, stamp)
                    self.stats.aggregated += 1
                else:
                    written = self._create(ref, event_type, reason, shown, stamp, 1, stamp)
                    meta = ObjectView(written).metadata
                    logged = _Logged(
                        str(meta.get("name")),
                        str(meta.get("namespace")),
                        event_type,
                        reason,
                        1,
                        stamp,
                    )
                    self.stats.created += 1
            except (ApiError, ApiUnreachable) as exc:
                self.stats.errors += 1
                log.warning(
                    "event=write_failed reason=%s object=%s/%s error=%r",
                    reason,
                    ref.namespace,
                    ref.name,
                    str(exc),
                )
                return None
            self._logged[key] = logged
            self._logged.move_to_end(key)
            while len(self._logged) > self._cache_size:
                self._logged.popitem(last=False)
            return written

    def _repeat(self, ref: ObjectReference, logged: _Logged, message: str, stamp: str) -> Obj:
        patch = {"count": logged.count, "lastTimestamp": stamp, "message": message}
        try:
            return self.client.patch(
                EVENTS, logged.name, patch, logged.namespace, patch_type="strategic"
            )
        except ApiNotFound:
            # the Event expired or was deleted: write it again with the count it has reached
            source = self._event_body(
                ref, logged.event_type, logged.reason, message, stamp, logged.count, logged.first
            )
            source["metadata"]["name"] = logged.name
            return self._post(source)

    def _event_body(
        self,
        ref: ObjectReference,
        event_type: str,
        reason: str,
        message: str,
        stamp: str,
        count: int,
        first: str,
    ) -> Obj:
        namespace = ref.namespace or "default"
        nanos = time.time_ns()
        body: Obj = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{ref.name}.{nanos:x}", "namespace": namespace},
            "involvedObject": ref.to_json(),
            "reason": reason,
            "message": message,
            "type": event_type,
            "source": {"component": self.component, **({"host": self.host} if self.host else {})},
            "firstTimestamp": first,
            "lastTimestamp": stamp,
            "count": count,
            "reportingComponent": self.component,
            "reportingInstance": self.host,
        }
        return body

    def _create(
        self,
        ref: ObjectReference,
        event_type: str,
        reason: str,
        message: str,
        stamp: str,
        count: int,
        first: str,
    ) -> Obj:
        return self._post(self._event_body(ref, event_type, reason, message, stamp, count, first))

    def _post(self, body: Obj) -> Obj:
        return self.client.create(EVENTS, body, body["metadata"]["namespace"])
