"""What a test controls of the fake API server, apart from its HTTP side (server.py): its
configuration (authentication, bookmarks, watch timeouts), the request log, injected faults and
refusals, and the cluster's controls (cut watches, compact, snapshot and restore).
"""

from __future__ import annotations

import re
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from corepin.testing.fakeapi.cluster import Cluster
from corepin.testing.fakeapi.store import Snapshot

if TYPE_CHECKING:
    from corepin.testing.fakeapi.tls import TLSMaterial


@dataclass
class RequestRecord:
    """One request the fake answered (for assertions such as "no list per event")."""

    method: str
    path: str
    query: dict[str, str]
    verb: str
    resource: str
    namespace: str
    name: str
    subresource: str
    user: str
    user_agent: str
    content_type: str
    code: int = 0
    at: float = field(default_factory=time.monotonic)

    @property
    def watch(self) -> bool:
        return self.verb == "watch"


@dataclass
class Fault:
    """An injected failure or delay for requests whose method and path match."""

    pattern: re.Pattern[str]
    method: str | None
    status: int | None
    delay: float
    drop: bool
    times: int | None  # None: until removed
    query: dict[str, str]
    retry_after: int | None = None  # sent as the Retry-After header (and in the Status)
    hits: int = 0

    def matches(self, method: str, path: str, query: dict[str, str]) -> bool:
        if self.times is not None and self.hits >= self.times:
            return False
        if self.method is not None and self.method != method:
            return False
        if any(k not in query if v == "*" else query.get(k) != v for k, v in self.query.items()):
            return False
        return bool(self.pattern.search(path))


class FakeApiControls:
    """The state and the test controls of one fake API server (`FakeApiServer` serves them)."""

    def __init__(
        self,
        cluster: Cluster | None = None,
        *,
        tls: TLSMaterial | None = None,
        tokens: dict[str, str] | None = None,
        client_certs: bool = False,
        bookmark_interval: float = 5.0,
        watch_timeout: float = 1800.0,
        history_limit: int = 1000,
        graceful_pod_deletion: bool = False,
    ) -> None:
        self.cluster = cluster or Cluster(
            history_limit=history_limit, graceful_pod_deletion=graceful_pod_deletion
        )
        self.tls = tls
        self.tokens = dict(tokens or {})
        self.client_certs = client_certs and tls is not None
        self.bookmark_interval = bookmark_interval
        self.watch_timeout = watch_timeout
        self.requests: list[RequestRecord] = []
        self.faults: list[Fault] = []
        self.forbidden: list[tuple[str | None, str | None, str | None]] = []
        self._lock = threading.Lock()
        self._connections: set[socket.socket] = set()
        self._bookmark_now: set[int] = set()
        self.stopping = threading.Event()

    # ------------------------------------------------------------------ test controls
    def drop_watches(self, *, abrupt: bool = True) -> int:
        """Cut every open watch (abrupt: mid-stream, no final chunk). Returns how many."""
        return self.cluster.drop_watches(abrupt=abrupt)

    def compact(self) -> int:
        """Compact history at the current revision: older watches/continues get 410."""
        return self.cluster.compact()

    def snapshot(self) -> Snapshot:
        """The stored state now (objects, history, revision), for `restore()`."""
        return self.cluster.snapshot()

    def restore(self, snapshot: Snapshot) -> int:
        """Go back to an older stored state, as an API server whose etcd was restored from a
        backup (and which was restarted, as a restore requires): revisions go backwards and
        every open watch is cut. Returns the revision now current."""
        return self.cluster.restore(snapshot)

    def send_bookmarks(self) -> None:
        """Ask every open watch that allows bookmarks to send one now."""
        with self.cluster.lock:
            for watcher in self.cluster.watchers:
                self._bookmark_now.add(id(watcher))

    def inject(
        self,
        path: str,
        *,
        method: str | None = None,
        status: int | None = 500,
        delay: float = 0.0,
        drop: bool = False,
        times: int | None = 1,
        query: dict[str, str] | None = None,
        retry_after: int | None = None,
    ) -> Fault:
        """Fail (status), delay or drop (close without answer) requests whose path matches the
        regular expression `path` (and whose query has the given values; "*" = present);
        `times=None` keeps the fault until `clear_faults()`. `retry_after` adds the header
        `Retry-After: N` and `details.retryAfterSeconds`, as the API server's 429s (and its
        503s while it starts or stops) carry them."""
        fault = Fault(
            re.compile(path), method, status, delay, drop, times, dict(query or {}), retry_after
        )
        with self._lock:
            self.faults.append(fault)
        return fault

    def clear_faults(self) -> None:
        with self._lock:
            self.faults.clear()

    def forbid(
        self, *, user: str | None = None, verb: str | None = None, resource: str | None = None
    ) -> None:
        """Answer 403 to requests matching all the given attributes (None = any)."""
        with self._lock:
            self.forbidden.append((user, verb, resource))

    def recorded(
        self, *, verb: str | None = None, resource: str | None = None, method: str | None = None
    ) -> list[RequestRecord]:
        with self._lock:
            found = list(self.requests)
        return [
            r
            for r in found
            if (verb is None or r.verb == verb)
            and (resource is None or r.resource == resource)
            and (method is None or r.method == method)
        ]

    def clear_requests(self) -> None:
        with self._lock:
            self.requests.clear()

    def open_watches(self) -> int:
        with self.cluster.lock:
            return len(self.cluster.watchers)
