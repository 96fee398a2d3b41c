"""The health and metrics pages of every long-running corepin process, and the small server
that serves them alone (`OpsServer`, on `--metrics-address HOST:PORT`).

```python
server = OpsServer(":9464", metrics=registry)     # `:PORT` = every interface
server.start()                                    # binds now: errors surface here
server.set_ready(True)                            # /healthz: 503 until ready, then 200
...
server.stop()                                     # returns within about STOP_TIMEOUT seconds
```

- `/healthz`: 200 `ok` when ready, 503 `not ready` before (or after `set_ready(False)`);
  `ready` may also be a callable asked on every request.
- `/metrics`: the registry in Prometheus text format (OpenMetrics when the scraper's Accept
  header prefers it); HEAD works for both; anything else is 404, other methods 405.

The pages themselves are `HealthAndMetrics` and the handler that answers GET and HEAD from
them is `PageHandler`: a server with routes of its own (the extender) serves its /healthz and
/metrics through the same two.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import ClassVar, Final, Protocol

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from corepin.api.http.server import Limits, RequestHandler, ThreadedServer

log = logging.getLogger("corepin.api.http")

TEXT: Final = "text/plain; charset=utf-8"
#: (status, body, content type) of one page
Reply = tuple[int, bytes, str]
Readiness = bool | Callable[[], bool]


class Pages(Protocol):
    """What a `PageHandler` answers GET and HEAD from."""

    def page(self, path: str, accept: str | None) -> Reply:
        """(status, body, content type) for `path` (with its query) and the Accept header."""
        ...


def render(registry: CollectorRegistry, accept: str | None = None) -> tuple[bytes, str]:
    """Any registry's metrics page for an `Accept` header: (body, content type)."""
    encoder, content_type = choose_encoder(accept or "")
    return encoder(registry), content_type


class HealthAndMetrics:
    """`/healthz` (readiness: a value, or a callable asked on every request) and `/metrics`
    (`registry`, None: no metrics here) of one process."""

    def __init__(self, registry: CollectorRegistry | None = None, ready: Readiness = False):
        self.registry = registry
        self._ready = ready

    def set_ready(self, ready: Readiness) -> None:
        self._ready = ready

    @property
    def ready(self) -> bool:
        value = self._ready
        if callable(value):
            try:
                return bool(value())
            except Exception:  # a failing readiness check means: not ready
                log.exception("readiness_check_failed")
                return False
        return bool(value)

    def page(self, path: str, accept: str | None) -> Reply:
        """(status, body, content type) for GET `path`."""
        path = path.split("?", 1)[0]
        if path == "/healthz":
            if self.ready:
                return 200, b"ok\n", TEXT
            return 503, b"not ready\n", TEXT
        if path == "/metrics":
            if self.registry is None:
                return 404, b"no metrics here\n", TEXT
            body, content_type = render(self.registry, accept)
            return 200, body, content_type
        return 404, b"not found: try /healthz or /metrics\n", TEXT


class PageHandler(RequestHandler):
    """A handler that answers GET and HEAD from `pages` (a subclass names them)."""

    pages: ClassVar[Pages]

    def send_page(self, with_body: bool) -> None:
        try:
            status, body, content_type = self.pages.page(self.path, self.headers.get("Accept"))
        except Exception:
            log.exception("http_page_failed path=%s", self.path)
            status, body, content_type = 500, b"internal error\n", "text/plain"
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if with_body:
            self.wfile.write(body)

    def do_GET(self) -> None:
        self.send_page(True)

    def do_HEAD(self) -> None:
        self.send_page(False)


class OpsServer(ThreadedServer):
    """`/healthz` and `/metrics` of one process (see the module docstring)."""

    thread_name = "corepin-http"
    serves = "/healthz and /metrics"
    bind_reason = "metrics_bind"
    logger = log
    serving_event = "http_serving"

    def __init__(
        self,
        address: str,
        *,
        metrics: CollectorRegistry | None = None,
        ready: Readiness = False,
        limits: Limits | None = None,
    ) -> None:
        super().__init__(address, limits=limits or Limits(max_connections=64, workers=2))
        self.pages = HealthAndMetrics(metrics, ready)

    def set_ready(self, ready: Readiness) -> None:
        self.pages.set_ready(ready)

    @property
    def ready(self) -> bool:
        return self.pages.ready

    def page(self, path: str, accept: str | None) -> Reply:
        """(status, body, content type) for GET `path`."""
        return self.pages.page(path, accept)

    def _handler(self) -> type[RequestHandler]:
        class Handler(PageHandler):
            pages = self.pages

            def _not_allowed(self) -> None:
                body = b"method not allowed\n"
                self.send_response(405)
                self.send_header("Allow", "GET, HEAD")
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_POST = do_PUT = do_DELETE = do_PATCH = _not_allowed

        return Handler


__all__ = ["HealthAndMetrics", "OpsServer", "PageHandler", "Pages", "render"]
