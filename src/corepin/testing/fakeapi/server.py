"""The fake API server's HTTP side: a stdlib `ThreadingHTTPServer` speaking HTTP/1.1 (keep-alive,
chunked watch streams), optionally over TLS with bearer tokens and client certificates.

Why the stdlib rather than aiohttp: the tests and corepin's client are synchronous and threaded;
a thread per connection lets a test block a handler (latency, a stuck watch) without an event
loop to drive from sync code, and it adds no dependency.

`FakeApiServer` is the whole of it: the controls a test uses (controls.py), started and stopped
here, with in-process access for set-up; the handler (handler.py, watching.py, transport.py)
answers requests and discovery.py describes what is served.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from corepin.testing.fakeapi.controls import FakeApiControls, Fault, RequestRecord
from corepin.testing.fakeapi.handler import Handler
from corepin.testing.fakeapi.kubeconfig import write_kubeconfig
from corepin.testing.fakeapi.resources import ResourceType
from corepin.testing.fakeapi.selectors import parse_field_selector, parse_label_selector
from corepin.testing.fakeapi.store import Obj
from corepin.testing.fakeapi.transport import ApiHttpServer
from corepin.testing.fakeapi.writes import WriteOptions

__all__ = ["FakeApiServer", "Fault", "RequestRecord", "running"]


class FakeApiServer(FakeApiControls):
    """A Kubernetes API server double. Start with `start()` (or use as a context manager).

    Made with the keyword arguments of `FakeApiControls`: `cluster` (a new one by default, of
    `history_limit` changes and with `graceful_pod_deletion` or not), `tls`, `tokens`,
    `client_certs`, `bookmark_interval`, `watch_timeout`."""

    _httpd: ApiHttpServer | None = None
    _thread: threading.Thread | None = None

    # ------------------------------------------------------------------ lifecycle
    @property
    def port(self) -> int:
        assert self._httpd is not None, "server not started"
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        scheme = "https" if self.tls else "http"
        return f"{scheme}://127.0.0.1:{self.port}"

    def start(self) -> FakeApiServer:
        self._httpd = ApiHttpServer(("127.0.0.1", 0), Handler, self)
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            daemon=True,
            name="fakeapi",
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        if self._httpd is not None:
            self._httpd.shutdown()
            self.cluster.drop_watches(abrupt=True)
            with self._lock:
                conns = list(self._connections)
            for conn in conns:
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
            self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> FakeApiServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ in-process access
    def rt(self, api_version: str, plural: str) -> ResourceType:
        group, _, version = api_version.rpartition("/")
        return self.cluster.resource(group, version, plural)

    def create(self, api_version: str, plural: str, body: Obj, namespace: str = "") -> Obj:
        """Create an object directly (same semantics as a POST), for test set-up."""
        rt = self.rt(api_version, plural)
        ns = namespace or (body.get("metadata") or {}).get("namespace") or "default"
        return self.cluster.create(
            rt, ns if rt.namespaced else "", body, WriteOptions(field_manager="fakeapi-test")
        ).obj

    def get(self, api_version: str, plural: str, name: str, namespace: str = "") -> Obj:
        return self.cluster.get(self.rt(api_version, plural), namespace, name)

    def objects(self, api_version: str, plural: str, namespace: str | None = None) -> list[Obj]:
        rt = self.rt(api_version, plural)
        listing = self.cluster.list(
            rt,
            namespace,
            parse_label_selector(None),
            parse_field_selector(None, rt.supports_field),
            typed_items=False,
        )
        items: list[Obj] = listing["items"]
        return items

    def write_kubeconfig(
        self,
        path: Path,
        *,
        token: str | None = None,
        client: tuple[Path, Path] | None = None,
        ca: bool = True,
        insecure: bool = False,
        embed: bool = False,
        context: str = "fake",
    ) -> Path:
        """A kubeconfig for this server (token, client cert/key, CA as files or -data)."""
        return write_kubeconfig(
            path,
            self.url,
            token=token,
            client=client,
            ca=self.tls.ca.cert if (self.tls and ca) else None,
            insecure=insecure,
            embed=embed,
            context=context,
        )


@contextlib.contextmanager
def running(**kwargs: Any) -> Iterator[FakeApiServer]:
    """`with running() as api:` a started fake API server, stopped afterwards."""
    server = FakeApiServer(**kwargs).start()
    try:
        yield server
    finally:
        server.stop()
