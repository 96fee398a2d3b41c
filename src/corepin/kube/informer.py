"""An informer: keeps an in-memory copy of the objects a list/watch selects, and calls handlers
on add, update and delete.

One thread per informer runs the loop (as client-go's reflector does):
  1. list (paginated, consistent at one resource version) and reconcile the cache with it:
     handlers see what changed since the last known state (nothing twice: an object whose
     resourceVersion did not change is not reported again);
  2. watch from that resource version (bookmarks on, a random server timeout between
     `watch_timeout` and twice that, so many agents do not restart their watches together);
  3. when the watch ends normally, watch again from the last version seen (events and
     bookmarks advance it); when it drops or fails, watch again after a bounded exponential
     backoff with jitter; on 410 Gone, go back to 1 (relist).
Handlers run on the informer thread, in order; they must be quick (hand work to a queue) and
must not change the objects they are given. A handler that raises is logged and counted; the
informer goes on.

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
from corepin.kube.client import KubeClient, Resource
from corepin.kube.transport import Cancel, Cancelled

Obj = dict[str, Any]
Key = tuple[str, str]  # (namespace, name); namespace "" for cluster-scoped objects
AddHandler = Callable[[Obj], None]
UpdateHandler = Callable[[Obj, Obj], None]
DeleteHandler = Callable[[Obj], None]

log = logging.getLogger("corepin.kube.informer")


def object_key(obj: Obj) -> Key:
    meta = obj.get("metadata") or {}
    return (str(meta.get("namespace") or ""), str(meta.get("name") or ""))


def resource_version(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


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
    relists: int = 0  # lists after 410 Gone
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

    def next_delay(self) -> float:
        ceiling = min(self.maximum, self.initial * (2**self._failures))
        self._failures += 1
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
        watch_timeout: int = 300,
        backoff_initial: float = 0.5,
        backoff_max: float = 30.0,
        healthy_after: float = 30.0,
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
        self.healthy_after = healthy_after
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
            except (ApiError, ApiUnreachable) as exc:
                if needs_list:
                    self.stats.list_errors += 1
                else:
                    self.stats.watch_errors += 1
                delay = self._backoff.next_delay()
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
        )
        self.stats.lists += 1
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

    def _watch(self) -> None:
        timeout = self._rng.randint(self.watch_timeout, 2 * self.watch_timeout)
        watch = self.client.watch(
            self.resource,
            self.namespace,
            resource_version=self._last_rv,
            label_selector=self.label_selector,
            field_selector=self.field_selector,
            timeout_seconds=timeout,
            allow_bookmarks=True,
            cancel=self._stop,
        )
        self.stats.watches += 1
        opened = time.monotonic()
        seen = 0
        for event in self._events(watch):
            if self._stop.cancelled:
                watch.close()
                raise Cancelled("informer stopped")
            seen += 1
            self._apply(event.type, event.object)
            version = event.resource_version
            if version:
                self._last_rv = version
        lived = time.monotonic() - opened
        if seen == 0 and lived < 1.0:
            # a watch the server ends at once, again and again, must not spin: back off
            raise ApiUnreachable(
                self.client.transport.config.server, f"watch of {self.resource} ended immediately"
            )
        if lived >= self.healthy_after:
            self._backoff.reset()

    def _events(self, watch: Any) -> Iterator[Any]:
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
