"""The store behind the fake API server: an etcd-like store with one global revision counter,
per-object version history (so lists can be served at an older revision for `continue` tokens
and `resourceVersionMatch=Exact`), a bounded change history for watches (older revisions get
410 Gone), snapshots and restores, and the reads and watches served from it.

Every public method of `Store` takes the lock but `commit` (its callers hold it); HTTP handler
threads and tests may call them concurrently.
"""

from __future__ import annotations

import base64
import builtins
import copy
import datetime as dt
import json
import queue
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from corepin.testing.fakeapi import errors as err
from corepin.testing.fakeapi.resources import (
    ResourceType,
    event_from_events_v1,
    event_to_events_v1,
)
from corepin.testing.fakeapi.selectors import FieldSelector, LabelSelector

Obj = dict[str, Any]
Storage = tuple[str, str]
Key = tuple[str, str]  # (namespace, name)


def now_text() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def meta_of(obj: Obj) -> Obj:
    """The object's metadata (an empty one put in place where there was none)."""
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        meta = {}
        obj["metadata"] = meta
    return meta


def view_of(rt: ResourceType, stored: Obj) -> Obj:
    """A stored object as served through `rt` (events.k8s.io events are converted)."""
    obj = copy.deepcopy(stored)
    if rt.group == "events.k8s.io":
        return event_to_events_v1(obj)
    obj["apiVersion"] = rt.api_version
    obj["kind"] = rt.kind
    return obj


def to_storage(rt: ResourceType, obj: Obj) -> Obj:
    """An object as written through `rt`, in the form it is stored in."""
    if rt.group == "events.k8s.io":
        return event_from_events_v1(obj)
    return obj


@dataclass
class Change:
    """One committed write, as a watch sees it."""

    rv: int
    storage: Storage
    namespace: str
    type: str  # ADDED, MODIFIED, DELETED
    obj: Obj
    old: Obj | None


@dataclass
class Watcher:
    """One open watch: changes are pushed into `queue` under the cluster lock."""

    storage: Storage
    namespace: str | None
    labels: LabelSelector
    fields: FieldSelector
    rt: ResourceType
    queue: queue.Queue[Change | None] = field(default_factory=queue.Queue)
    dropped: bool = False
    abrupt: bool = False
    closers: list[Any] = field(default_factory=list)

    def matches(self, obj: Obj | None) -> bool:
        if obj is None:
            return False
        return self.labels.matches(meta_of(obj).get("labels")) and self.fields.matches(
            self.rt.field_values(obj)
        )

    def translate(self, change: Change) -> tuple[str, Obj] | None:
        """The event this watcher sees for a change, given its selectors (None: nothing)."""
        now = self.matches(change.obj)
        before = change.old is not None and self.matches(change.old)
        if change.type == "ADDED":
            return ("ADDED", change.obj) if now else None
        if change.type == "DELETED":
            return ("DELETED", change.obj) if now else None
        if now and before:
            return ("MODIFIED", change.obj)
        if now:
            return ("ADDED", change.obj)
        if before and change.old is not None:
            # as the watch cache does: the last state the watcher could see, at the new revision
            gone = copy.deepcopy(change.old)
            meta_of(gone)["resourceVersion"] = str(change.rv)
            return ("DELETED", gone)
        return None


@dataclass(frozen=True)
class Snapshot:
    """The stored state at one revision (`Cluster.snapshot()`)."""

    rv: int
    compacted_rv: int
    objects: dict[Storage, dict[Key, Obj]]
    versions: dict[tuple[Storage, str, str], list[tuple[int, Obj | None]]]
    history: list[Change]


class Store:
    """Objects, revisions, history and watches of one fake API server."""

    def __init__(self, *, history_limit: int = 1000) -> None:
        self.lock = threading.RLock()
        self.rv = 100
        self.compacted_rv = self.rv
        self.history_limit = history_limit
        self.objects: dict[Storage, dict[Key, Obj]] = {}
        self.versions: dict[tuple[Storage, str, str], list[tuple[int, Obj | None]]] = {}
        self.history: deque[Change] = deque()
        self.watchers: list[Watcher] = []
        #: called after each commit (storage, namespace), once the watchers have the change
        self.on_commit: Callable[[Storage, str], None] | None = None

    def objects_of(self, rt: ResourceType) -> dict[Key, Obj]:
        """The stored objects of `rt`'s storage (the live dictionary)."""
        return self.objects.setdefault(rt.storage, {})

    # ------------------------------------------------------------------ commit and history
    def commit(
        self, rt: ResourceType, namespace: str, name: str, kind: str, obj: Obj, old: Obj | None
    ) -> Obj:
        self.rv += 1
        stored = copy.deepcopy(obj)
        meta_of(stored)["resourceVersion"] = str(self.rv)
        store = self.objects_of(rt)
        if kind == "DELETED":
            store.pop((namespace, name), None)
            self.versions.setdefault((rt.storage, namespace, name), []).append((self.rv, None))
        else:
            store[(namespace, name)] = stored
            self.versions.setdefault((rt.storage, namespace, name), []).append((self.rv, stored))
        change = Change(self.rv, rt.storage, namespace, kind, stored, old)
        self.history.append(change)
        while len(self.history) > self.history_limit:
            dropped = self.history.popleft()
            self.compacted_rv = dropped.rv
        for watcher in self.watchers:
            if watcher.storage == rt.storage and watcher.namespace in (None, namespace):
                watcher.queue.put(change)
        if self.on_commit is not None:
            self.on_commit(rt.storage, namespace)
        return stored

    def snapshot(self) -> Snapshot:
        with self.lock:
            return Snapshot(
                self.rv,
                self.compacted_rv,
                copy.deepcopy(self.objects),
                copy.deepcopy(self.versions),
                copy.deepcopy(list(self.history)),
            )

    def restore(self, snapshot: Snapshot) -> int:
        """Back to `snapshot` (an etcd restore): objects, history and revision; open watches
        are cut (the API server restarts). Resource types served now stay served."""
        with self.lock:
            self.rv = snapshot.rv
            self.compacted_rv = snapshot.compacted_rv
            self.objects = copy.deepcopy(snapshot.objects)
            self.versions = copy.deepcopy(snapshot.versions)
            self.history = deque(copy.deepcopy(snapshot.history))
            self.drop_watches(abrupt=True)
            return self.rv

    def compact(self, rv: int | None = None) -> int:
        """Forget history up to `rv` (default: now): watches and continue tokens from older
        revisions get 410 Gone. Returns the compacted revision."""
        with self.lock:
            target = self.rv if rv is None else min(rv, self.rv)
            self.compacted_rv = max(self.compacted_rv, target)
            while self.history and self.history[0].rv <= self.compacted_rv:
                self.history.popleft()
            for key, versions in list(self.versions.items()):
                keep = [v for v in versions if v[0] > self.compacted_rv]
                older = [v for v in versions if v[0] <= self.compacted_rv]
                if older and older[-1][1] is not None:
                    keep.insert(0, older[-1])
                if keep:
                    self.versions[key] = keep
                else:
                    del self.versions[key]
            return self.compacted_rv

    # ------------------------------------------------------------------ reads
    def get(self, rt: ResourceType, namespace: str, name: str) -> Obj:
        with self.lock:
            found = self.objects_of(rt).get((namespace if rt.namespaced else "", name))
            if found is None:
                raise err.not_found(rt, name)
            return view_of(rt, found)

    def state_at(self, rt: ResourceType, rv: int) -> dict[Key, Obj]:
        if rv < self.compacted_rv:
            raise err.gone(f"too old resource version: {rv} ({self.compacted_rv})")
        out: dict[Key, Obj] = {}
        for (storage, ns, name), versions in self.versions.items():
            if storage != rt.storage:
                continue
            latest: Obj | None = None
            for vrv, obj in versions:
                if vrv > rv:
                    break
                latest = obj
            if latest is not None:
                out[(ns, name)] = latest
        return out

    def list(
        self,
        rt: ResourceType,
        namespace: str | None,
        labels: LabelSelector,
        fields: FieldSelector,
        *,
        limit: int = 0,
        continue_token: str = "",
        resource_version: str = "",
        rv_match: str = "",
        typed_items: bool = True,
    ) -> Obj:
        """A list answer; `typed_items` drops kind/apiVersion from built-in items as the
        server's typed lists do (custom resource items keep them)."""
        with self.lock:
            start = ""
            if continue_token:
                if resource_version:
                    raise err.bad_request(
                        "specifying resource version is not allowed when using continue"
                    )
                try:
                    token = json.loads(base64.urlsafe_b64decode(continue_token.encode()))
                    at_rv = int(token["rv"])
                    start = str(token["start"])
                except (ValueError, KeyError, TypeError):
                    raise err.bad_request("continue key is not valid: invalid token") from None
                if at_rv < self.compacted_rv:
                    raise err.gone(
                        "The provided continue parameter is too old to display a "
                        "consistent list result. You can start a new list without "
                        "the continue parameter, or use the continue token in this "
                        "response to retrieve the remainder of the results. "
                        "Continuing with the provided token results in an "
                        "inconsistent list - objects that were created, modified, "
                        "or deleted between the time the first chunk was returned "
                        "and now may show up in the list."
                    )
                state = self.state_at(rt, at_rv)
            else:
                at_rv = self.rv
                exact = rv_match == "Exact" or (
                    resource_version not in ("", "0") and limit > 0 and rv_match == ""
                )
                if resource_version not in ("", "0"):
                    try:
                        wanted = int(resource_version)
                    except ValueError:
                        raise err.bad_request(
                            f"invalid resource version: {resource_version}"
                        ) from None
                    if wanted > self.rv:
                        raise err.ApiFailure(
                            504,
                            "Timeout",
                            f"Too large resource version: {wanted}, current: {self.rv}",
                            {
                                "causes": [
                                    {
                                        "reason": "ResourceVersionTooLarge",
                                        "message": "Too large resource version",
                                    }
                                ],
                                "retryAfterSeconds": 1,
                            },
                        )
                    if exact:
                        at_rv = wanted
                state = self.state_at(rt, at_rv) if at_rv != self.rv else dict(self.objects_of(rt))
            keys = sorted(k for k in state if namespace in (None, k[0]))
            keys = [k for k in keys if "/".join(k) > start] if start else keys
            items: list[Obj] = []
            next_start = ""
            for i, key in enumerate(keys):
                obj = state[key]
                if not (
                    labels.matches(meta_of(obj).get("labels"))
                    and fields.matches(rt.field_values(obj))
                ):
                    continue
                items.append(obj)
                if limit and len(items) >= limit:
                    if i + 1 < len(keys):
                        next_start = "/".join(key)
                    remaining = len(keys) - i - 1
                    break
            else:
                remaining = 0
            meta: Obj = {"resourceVersion": str(at_rv)}
            if next_start:
                meta["continue"] = base64.urlsafe_b64encode(
                    json.dumps({"v": "meta.k8s.io/v1", "rv": at_rv, "start": next_start}).encode()
                ).decode()
                if not labels.requirements and not fields.requirements:
                    meta["remainingItemCount"] = remaining
            views = [view_of(rt, o) for o in items]
            if rt.builtin and typed_items:
                for view in views:
                    view.pop("apiVersion", None)
                    view.pop("kind", None)
            return {
                "kind": rt.kind + "List",
                "apiVersion": rt.api_version,
                "metadata": meta,
                "items": views,
            }

    # ------------------------------------------------------------------ watch
    def open_watch(
        self,
        rt: ResourceType,
        namespace: str | None,
        labels: LabelSelector,
        fields: FieldSelector,
        resource_version: str,
        *,
        send_initial: bool = False,
    ) -> tuple[Watcher, builtins.list[tuple[str, Obj]], int]:
        """Register a watcher. Returns it, the events to send first, and the revision the
        initial state was taken at. A too-old revision raises 410 (sent as an ERROR event)."""
        with self.lock:
            watcher = Watcher(rt.storage, namespace, labels, fields, rt)
            initial: list[tuple[str, Obj]] = []
            if resource_version in ("", "0") or send_initial:
                for key in sorted(self.objects_of(rt)):
                    obj = self.objects_of(rt)[key]
                    if namespace in (None, key[0]) and watcher.matches(obj):
                        initial.append(("ADDED", obj))
                start = self.rv
                if send_initial and resource_version not in ("", "0"):
                    start = max(start, int(resource_version))
            else:
                try:
                    start = int(resource_version)
                except ValueError:
                    raise err.bad_request(f"invalid resource version: {resource_version}") from None
                if start < self.compacted_rv:
                    raise err.gone(f"too old resource version: {start} ({self.compacted_rv})")
                for change in self.history:
                    if (
                        change.rv > start
                        and change.storage == rt.storage
                        and namespace in (None, change.namespace)
                    ):
                        watcher.queue.put(change)
            self.watchers.append(watcher)
            return watcher, initial, start

    def close_watch(self, watcher: Watcher) -> None:
        with self.lock:
            if watcher in self.watchers:
                self.watchers.remove(watcher)

    def drop_watches(self, *, abrupt: bool = True, storage: Storage | None = None) -> int:
        """End every open watch (abrupt: the connection is cut without the final chunk)."""
        with self.lock:
            targets = [w for w in self.watchers if storage in (None, w.storage)]
            for watcher in targets:
                watcher.dropped = True
                watcher.abrupt = abrupt
                watcher.queue.put(None)
                for closer in watcher.closers:
                    closer()
            return len(targets)

    def bookmark_rv(self, watcher: Watcher) -> int | None:
        """The revision a bookmark may report now: the current one, once the watcher has been
        handed every change up to it (None while changes are still queued)."""
        with self.lock:
            return self.rv if watcher.queue.empty() else None
