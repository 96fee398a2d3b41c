"""An informer: keeps an in-memory copy of the objects a list/watch selects, and calls handlers
on add, update and delete.

One thread per informer runs the loop (as client-go's reflector does):
  1. list (paginated, consistent at one resource version) and reconcile the cache with it:
     handlers see what changed since the last known state (nothing twice: an object whose
     resourceVersion did not change is not reported again);
  2. watch from that resource version, bookmarks on;
  3. when the watch ends normally, watch again from the last version seen (events and
     bookmarks advance it); when it drops or fails, watch again after a backoff; on 410 Gone,
     or when the server turns out to be behind us, go back to 1 (relist).
Handlers run on the informer thread, in order; they must be quick (hand work to a queue) and
must not change the objects they are given. A handler that raises is logged and counted; the
informer goes on.

A silently dead connection (a proxy or NAT that dropped it without FIN/RST) is found by time:
`idle_timeout` (default: the client's, 40 s) is the longest a watch may stay silent. The
server's `timeoutSeconds` is drawn between half of it and a little less than all of it (random,
so many agents do not restart their watches together), and the API server sends a bookmark
about 2 s before it ends a watch, so a healthy watch is never silent that long; the socket read
timeout is `idle_timeout`. `in_contact()` says whether a list or a watch answered within that
bound (the agent's /healthz). An explicit `watch_timeout` keeps the old shape (between it and
twice it), the read timeout then being the server's bookmark interval (60 s) plus a margin.

Retries: an exponential backoff with jitter (`backoff_initial` doubling up to `backoff_max`),
reset by every good list and by every watch that delivered something, so one incident's
failures do not slow the next one down. An answer with `Retry-After` (429, 5xx) is honoured
instead: the informer waits what the server asked (at most `RETRY_AFTER_MAX`).

A server behind us: an API server restored from an older etcd state hands out smaller
resource versions than the ones we hold, and a watch from our version then stays silent (the
watch cache sends nothing at or below the version it was asked for, bookmarks included) or
fails with 504 "Too large resource version". The informer relists when a watch fails that way,
when an event or a bookmark carries a version older than ours, and when a watch that asked for
bookmarks ends without any (the server would have sent one before ending it). Resource versions
are opaque strings to clients; compared here only when both parse as integers (etcd revisions,
what every etcd-backed API server gives), otherwise only the silent-watch rule applies.

`stop()` cancels the request in flight (its socket is shut down) and joins the thread within
its timeout. `stats` holds counters the agent exports (watch restarts, relists, errors).
"""

from __future__ import annotations

import builtins
import logging
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from corepin.core.errors import ApiError, ApiGone, ApiUnreachable
from corepin.kube.client import (
    BOOKMARK_INTERVAL,
    WATCH_READ_MARGIN,
    KubeClient,
    Resource,
)
from corepin.kube.errors import too_large_resource_version
from corepin.kube.models import ObjectView
from corepin.kube.transport import Cancel, Cancelled
from corepin.kube.watch import Watch, WatchEvent

Obj = dict[str, Any]
Key = tuple[str, str]  # (namespace, name); namespace "" for cluster-scoped objects
AddHandler = Callable[[Obj], None]
UpdateHandler = Callable[[Obj, Obj], None]
DeleteHandler = Callable[[Obj], None]

log = logging.getLogger("corepin.kube.informer")

RETRY_AFTER_MAX = 60.0  # a longer Retry-After is cut to this (a bogus header must not stall us)
PRE_TIMEOUT_BOOKMARK = 2.0  # the API server's last bookmark comes this long before the end


class ServerBehind(Exception):
    """The API server is behind the resource version we hold: relist."""


def older_version(theirs: str, ours: str) -> bool:
    """True when resource version `theirs` is older than `ours`; only integer versions are
    compared (opaque ones never count as older)."""
    try:
        return int(theirs) < int(ours)
    except ValueError:
        return False


def object_key(obj: Obj) -> Key:
    view = ObjectView(obj)
    return (view.namespace, view.name)


def resource_version(obj: Obj) -> str:
    return ObjectView(obj).resource_version


class Cache:
    """The informer's store: thread-safe reads of the last known objects."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: dict[Key, Obj] = {}

    def get(self, name: str, namespace: str = "") -> Obj | None:
        with self._lock:
            return self._items.get((namespace, name))

    def list(self) -> list[Obj]:
        with self._lock:
            return list(self._items.values())

    def keys(self) -> builtins.list[Key]:
        with self._lock:
            return sorted(self._items)

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._items

    def _put(self, obj: Obj) -> Obj | None:
        with self._lock:
            key = object_key(obj)
            old = self._items.get(key)
            self._items[key] = obj
            return old

    def _pop(self, key: Key) -> Obj | None:
        with self._lock:
            return self._items.pop(key, None)

    def _snapshot(self) -> dict[Key, Obj]:
        with self._lock:
            return dict(self._items)


@dataclass
class InformerStats:
    """Counters (monotonic) for metrics and tests."""

    lists: int = 0  # full lists, the first one included
    relists: int = 0  # lists after 410 Gone or a server found behind us
    behind: int = 0  # times the server was found behind our resource version
    watches: int = 0  # watches opened
    watch_restarts: int = 0  # watches opened after the first one of a list
    watch_errors: int = 0  # watches that dropped or failed (each followed by a backoff)
    list_errors: int = 0
    events: int = 0  # watch events applied (bookmarks not counted)
    bookmarks: int = 0
    handler_errors: int = 0


class Backoff:
    """Exponential backoff with full jitter, capped; `reset()` after a healthy period."""

    def __init__(self, initial: float, maximum: float, rng: random.Random) -> None:
        self.initial = initial
        self.maximum = maximum
        self._rng = rng
        self._failures = 0

    def next_delay(self, retry_after: float | None = None) -> float:
        """The wait before the next try; a server's Retry-After wins (capped, with up to 10 %
        jitter on top so many clients do not come back at once)."""
        ceiling = min(self.maximum, self.initial * (2 ** min(self._failures, 32)))
        self._failures += 1
        if retry_after is not None:
            asked = min(max(retry_after, 0.0), RETRY_AFTER_MAX)
            return float(asked + self._rng.uniform(0, asked / 10))
        return float(ceiling / 2 + self._rng.uniform(0, ceiling / 2))

    def reset(self) -> None:
        self._failures = 0


class Informer:
    """List + watch of one resource (optionally one namespace and selectors) into a Cache."""

    def __init__(
        self,
        client: KubeClient,
        resource: Resource,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        page_size: int = 500,
        watch_timeout: int | None = None,
        idle_timeout: float | None = None,
        backoff_initial: float = 0.5,
        backoff_max: float = 5.0,
        name: str = "",
        rng: random.Random | None = None,
    ) -> None:
        self.client = client
        self.resource = resource
        self.namespace = namespace
        self.label_selector = label_selector
        self.field_selector = field_selector
        self.page_size = page_size
        self.watch_timeout = watch_timeout
        self.idle_timeout = float(idle_timeout or client.idle_timeout)
        self.name = name or f"informer-{resource.plural}"
        self.cache = Cache()
        self.stats = InformerStats()
        self._rng = rng or random.Random()
        self._backoff = Backoff(backoff_initial, backoff_max, self._rng)
        self._adds: list[AddHandler] = []
        self._updates: list[UpdateHandler] = []
        self._deletes: list[DeleteHandler] = []
        self._synced = threading.Event()
        self._stop = Cancel()
        self._thread: threading.Thread | None = None
        self._last_rv = ""
        self._contact: float | None = None  # monotonic time of the last answer from the API

    # ------------------------------------------------------------------ public
    def add_handlers(
        self,
        *,
        on_add: AddHandler | None = None,
        on_update: UpdateHandler | None = None,
        on_delete: DeleteHandler | None = None,
    ) -> None:
        """Register handlers (before `start()`)."""
        if on_add:
            self._adds.append(on_add)
        if on_update:
            self._updates.append(on_update)
        if on_delete:
            self._deletes.append(on_delete)

    @property
    def synced(self) -> bool:
        """True once the first list has been loaded into the cache."""
        return self._synced.is_set()

    @property
    def last_resource_version(self) -> str:
        return self._last_rv

    def in_contact(self, within: float | None = None) -> bool:
        """Synced, and a list or watch answered within `within` seconds (default
        `idle_timeout`): False while the API cannot be seen."""
        contact = self._contact
        bound = self.idle_timeout if within is None else within
        return self.synced and contact is not None and time.monotonic() - contact <= bound

    def _touch(self) -> None:
        self._contact = time.monotonic()

    def wait_for_sync(self, timeout: float | None = None) -> bool:
        return self._synced.wait(timeout)

    def start(self) -> Informer:
        if self._thread is not None:
            raise RuntimeError(f"{self.name} already started")
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> bool:
        """Stop and join; True when the thread ended within `timeout`."""
        self._stop.cancel()
        if self._thread is None:
            return True
        self._thread.join(timeout)
        return not self._thread.is_alive()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # ------------------------------------------------------------------ loop
    def _run(self) -> None:
        needs_list = True
        first_watch = True
        while not self._stop.cancelled:
            try:
                if needs_list:
                    self._list()
                    needs_list = False
                    first_watch = True
                    self._backoff.reset()
                if not first_watch:
                    self.stats.watch_restarts += 1
                first_watch = False
                self._watch()
            except Cancelled:
                return
            except ApiGone:
                log.info("informer=%s event=relist reason=gone rv=%s", self.name, self._last_rv)
                self.stats.relists += 1
                needs_list = True
            except ServerBehind as exc:
                log.warning(
                    "informer=%s event=relist reason=server_behind rv=%s detail=%r",
                    self.name,
                    self._last_rv,
                    str(exc),
                )
                self.stats.behind += 1
                self.stats.relists += 1
                needs_list = True
            except (ApiError, ApiUnreachable) as exc:
                if isinstance(exc, ApiError) and not needs_list and too_large_resource_version(exc):
                    self.stats.behind += 1
                    self.stats.relists += 1
                    log.warning(
                        "informer=%s event=relist reason=too_large_rv rv=%s",
                        self.name,
                        self._last_rv,
                    )
                    needs_list = True
                    continue
                if needs_list:
                    self.stats.list_errors += 1
                else:
                    self.stats.watch_errors += 1
                asked = exc.retry_after if isinstance(exc, ApiError) else None
                delay = self._backoff.next_delay(asked)
                log.warning(
                    "informer=%s event=retry error=%r delay=%.2f", self.name, str(exc), delay
                )
                if self._stop.wait(delay):
                    return

    def _list(self) -> None:
        items, version = self.client.list_all(
            self.resource,
            self.namespace,
            label_selector=self.label_selector,
            field_selector=self.field_selector,
            page_size=self.page_size,
            cancel=self._stop,
            timeout=self.idle_timeout,
        )
        self._touch()
        self.stats.lists += 1
        if older_version(version, self._last_rv):
            log.warning(
                "informer=%s event=server_went_back rv=%s list_rv=%s",
                self.name,
                self._last_rv,
                version,
            )
        fresh = {object_key(o): o for o in items}
        known = self.cache._snapshot()
        for key, obj in fresh.items():
            old = known.get(key)
            if old is None:
                self.cache._put(obj)
                self._dispatch_add(obj)
            elif resource_version(old) != resource_version(obj):
                self.cache._put(obj)
                self._dispatch_update(old, obj)
        for key, old in known.items():
            if key not in fresh:
                self.cache._pop(key)
                self._dispatch_delete(old)
        self._last_rv = version
        self._synced.set()

    def _watch_timing(self) -> tuple[int, float]:
        """(server timeoutSeconds, socket read timeout) of the next watch."""
        if self.watch_timeout is not None:
            timeout = self._rng.randint(self.watch_timeout, 2 * self.watch_timeout)
            read = max(self.idle_timeout, min(timeout, BOOKMARK_INTERVAL) + WATCH_READ_MARGIN)
            return timeout, read
        idle = self.idle_timeout
        low = max(1, int(idle / 2))
        high = max(low, int(idle - max(1.0, idle / 8)))
        return self._rng.randint(low, high), idle

    def _watch(self) -> None:
        timeout, read_timeout = self._watch_timing()
        watch = self.client.watch(
            self.resource,
            self.namespace,
            resource_version=self._last_rv,
            label_selector=self.label_selector,
            field_selector=self.field_selector,
            timeout_seconds=timeout,
            allow_bookmarks=True,
            read_timeout=read_timeout,
            cancel=self._stop,
        )
        self._touch()
        self.stats.watches += 1
        opened = time.monotonic()
        seen = 0
        for event in self._events(watch):
            self._touch()
            if self._stop.cancelled:
                watch.close()
                raise Cancelled("informer stopped")
            seen += 1
            version = event.resource_version
            if version and older_version(version, self._last_rv):
                watch.close()
                raise ServerBehind(f"{event.type} at {version}, older than ours {self._last_rv}")
            self._apply(event.type, event.object)
            if version:
                self._last_rv = version
            self._backoff.reset()
        self._touch()
        lived = time.monotonic() - opened
        if seen == 0 and lived < 1.0:
            # a watch the server ends at once, again and again, must not spin: back off
            raise ApiUnreachable(
                self.client.transport.config.server, f"watch of {self.resource} ended immediately"
            )
        if seen == 0 and timeout > PRE_TIMEOUT_BOOKMARK and lived >= timeout - 1.0:
            # it ran its course without the bookmark the server sends before ending a watch:
            # the server has nothing at or after our version (it is behind us)
            raise ServerBehind(f"a {timeout} s watch from {self._last_rv} brought no bookmark")

    def _events(self, watch: Watch) -> Iterator[WatchEvent]:
        try:
            yield from watch
        except (ApiError, ApiUnreachable):
            if self._stop.cancelled:
                raise Cancelled("informer stopped") from None
            raise

    def _apply(self, kind: str, obj: Obj) -> None:
        if kind == "BOOKMARK":
            self.stats.bookmarks += 1
            return
        self.stats.events += 1
        obj.setdefault("apiVersion", self.resource.api_version)
        if self.resource.kind:
            obj.setdefault("kind", self.resource.kind)
        key = object_key(obj)
        if kind == "DELETED":
            old = self.cache._pop(key)
            if old is not None:
                self._dispatch_delete(obj)
            return
        old = self.cache.get(key[1], key[0])
        if old is not None and resource_version(old) == resource_version(obj):
            return
        self.cache._put(obj)
        if old is None:
            self._dispatch_add(obj)
        else:
            self._dispatch_update(old, obj)

    # ------------------------------------------------------------------ handlers
    def _safely(self, what: str, handler: Callable[..., None], *args: Obj) -> None:
        if self._stop.cancelled:
            return
        try:
            handler(*args)
        except Exception:
            self.stats.handler_errors += 1
            log.exception("informer=%s event=handler_error handler=%s", self.name, what)

    def _dispatch_add(self, obj: Obj) -> None:
        for handler in self._adds:
            self._safely("add", handler, obj)

    def _dispatch_update(self, old: Obj, new: Obj) -> None:
        for handler in self._updates:
            self._safely("update", handler, old, new)

    def _dispatch_delete(self, obj: Obj) -> None:
        for handler in self._deletes:
            self._safely("delete", handler, obj)
