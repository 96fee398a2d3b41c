"""corepin's HTTP servers: one server base, one handler shape, the health and metrics pages.

- `server`  `ThreadedServer`: the HTTP/1.1 server every corepin server is built on (an event
            loop reads whole requests, a few worker threads answer them; `Limits` bound what
            one client may cost), `RequestHandler`, `parse_address`;
- `ops`     `/healthz` and `/metrics` (`HealthAndMetrics`, answered by `PageHandler`; `render`,
            the Prometheus exposition of a registry) and `OpsServer`, the small server of every
            long-running command on `--metrics-address HOST:PORT`.
"""

from corepin.api.http.ops import HealthAndMetrics, OpsServer, PageHandler, render
from corepin.api.http.server import Limits, RequestHandler, ThreadedServer, parse_address

__all__ = [
    "HealthAndMetrics",
    "Limits",
    "OpsServer",
    "PageHandler",
    "RequestHandler",
    "ThreadedServer",
    "parse_address",
    "render",
]
