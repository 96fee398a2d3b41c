"""Watches in the fake API server: one chunked HTTP answer per watch, fed from the cluster's
change queue (initial events with `sendInitialEvents`, bookmarks, a timeout, a cut connection
when a test drops the watch abruptly), as the API server's watch cache serves them.
"""

from __future__ import annotations

import contextlib
import queue
import select
import socket
import ssl
import time
from collections.abc import Callable
from typing import Any

from corepin.testing.fakeapi import errors as err
from corepin.testing.fakeapi.resources import ResourceType
from corepin.testing.fakeapi.store import Obj, Watcher
from corepin.testing.fakeapi.tables import table
from corepin.testing.fakeapi.transport import HandlerBase, Target


class WatchHandler(HandlerBase):
    """GET with `watch=true`."""

    def _watch(self, target: Target, query: dict[str, str], labels: Any, fields: Any) -> None:
        cluster = self.fake.cluster
        rt = target.rt
        send_initial = query.get("sendInitialEvents") in ("true", "1")
        bookmarks = query.get("allowWatchBookmarks") in ("true", "1")
        if send_initial and (query.get("resourceVersionMatch") != "NotOlderThan" or not bookmarks):
            raise err.ApiFailure(
                422,
                "Invalid",
                'ListOptions.meta.k8s.io "" is invalid: '
                "resourceVersionMatch: Forbidden: sendInitialEvents requires "
                "setting resourceVersionMatch to NotOlderThan and "
                "allowWatchBookmarks to true",
            )
        timeout = self.fake.watch_timeout
        if query.get("timeoutSeconds"):
            timeout = float(query["timeoutSeconds"])
        as_table = self._wants_table()
        failure: err.ApiFailure | None = None
        try:
            watcher, initial, start = cluster.open_watch(
                rt,
                target.namespace,
                labels,
                fields,
                query.get("resourceVersion") or "",
                send_initial=send_initial,
            )
        except err.ApiFailure as exc:
            failure = exc
        # the watcher is registered before the answer starts: a client that has the headers
        # is watching
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Cache-Control", "no-cache, private")
        self.end_headers()
        self._record.code = 200
        self.close_connection = True
        if failure is not None:
            self._chunk({"type": "ERROR", "object": failure.status()})
            self._end_chunks()
            return
        connection = self.connection

        def cut() -> None:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)

        watcher.closers.append(cut)
        first = [True]

        def send(kind: str, obj: Obj) -> None:
            view = cluster.view(rt, obj)
            if as_table:
                view = table(
                    rt,
                    [view],
                    {"resourceVersion": view["metadata"]["resourceVersion"]},
                    query.get("includeObject") or "Metadata",
                    with_columns=first[0],
                )
                first[0] = False
            self._chunk({"type": kind, "object": view})

        try:
            for kind, obj in initial:
                send(kind, obj)
            if send_initial:
                self._bookmark(rt, start, initial_end=True)
            self._stream(watcher, send, bookmarks, time.monotonic() + timeout, timeout, rt, start)
        except (OSError, ValueError):
            cluster.close_watch(watcher)
            return
        finally:
            cluster.close_watch(watcher)

    def _stream(
        self,
        watcher: Watcher,
        send: Callable[[str, Obj], None],
        bookmarks: bool,
        deadline: float,
        timeout: float,
        rt: ResourceType,
        start: int,
    ) -> None:
        """Send the watcher's changes until `deadline`. As the API server's watch cache does:
        nothing at or below the version the watch started from (a server restored to an older
        state stays silent to a watch from a newer version, bookmarks included), a bookmark every
        `bookmark_interval` and one 2 s before the deadline (watches longer than 2 s)."""
        cluster = self.fake.cluster
        last_bookmark = time.monotonic()
        pre_deadline = deadline - 2.0 if timeout > 2.0 else None
        while not self.fake.stopping.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                change = watcher.queue.get(timeout=min(remaining, 0.1))
            except queue.Empty:
                change = False  # type: ignore[assignment]
            if change is None or watcher.dropped:
                if watcher.abrupt:
                    with contextlib.suppress(OSError):
                        self.connection.shutdown(socket.SHUT_RDWR)
                    return
                break
            if change and change.rv > start:
                event = watcher.translate(change)
                if event is not None:
                    send(*event)
            wanted = id(watcher) in self.fake._bookmark_now
            now = time.monotonic()
            due = now - last_bookmark >= self.fake.bookmark_interval
            if pre_deadline is not None and now >= pre_deadline:
                due, pre_deadline = True, None
            if bookmarks and (wanted or due):
                rv = cluster.bookmark_rv(watcher)
                if rv is not None and rv >= start:
                    self._bookmark(rt, rv)
                    self.fake._bookmark_now.discard(id(watcher))
                last_bookmark = now
            if self._client_gone():
                return
        self._end_chunks()

    def _client_gone(self) -> bool:
        sock = self.connection
        if isinstance(sock, ssl.SSLSocket):
            return False
        try:
            readable, _, _ = select.select([sock], [], [], 0)
            return bool(readable) and sock.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    def _bookmark(self, rt: ResourceType, rv: int, *, initial_end: bool = False) -> None:
        meta: Obj = {"resourceVersion": str(rv), "creationTimestamp": None}
        if initial_end:
            meta["annotations"] = {"k8s.io/initial-events-end": "true"}
        self._chunk(
            {
                "type": "BOOKMARK",
                "object": {"kind": rt.kind, "apiVersion": rt.api_version, "metadata": meta},
            }
        )
