"""The webhook's endpoints: request bodies to AdmissionReview answers (decode, decide, encode,
count), for `server.HttpsServer`.

```python
app = AdmissionApp(config, capacity=catalog.snapshot, metrics=WebhookMetrics())
status, body, content_type = app.validate(raw_body)      # or app.mutate(raw_body)
```

A body that is not an AdmissionReview v1 with a request uid gets HTTP 400 with a one-line
`text/plain` reason; anything else gets HTTP 200 and an AdmissionReview (refusals included).
A bug in a decision is logged and answered with HTTP 500 (the API server then applies the
webhook's failurePolicy); the process goes on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Final

from corepin.api.webhook.admission import Endpoint, admit
from corepin.api.webhook.capacity import ClusterCapacity
from corepin.api.webhook.config import WebhookConfig
from corepin.api.webhook.metrics import WebhookMetrics
from corepin.api.webhook.review import ReviewError, decode_body, encode

log = logging.getLogger("corepin.api.webhook")

JSON: Final = "application/json"
TEXT: Final = "text/plain; charset=utf-8"

Reply = tuple[int, bytes, str]
Route = Callable[[bytes], Reply]


class AdmissionApp:
    """`validate` and `mutate` as routes (see the module docstring)."""

    def __init__(
        self,
        config: WebhookConfig,
        *,
        capacity: Callable[[], ClusterCapacity | None] | None = None,
        metrics: WebhookMetrics | None = None,
    ) -> None:
        self.config = config
        self.capacity = capacity
        self.metrics = metrics

    def routes(self) -> Mapping[str, Route]:
        return {"/validate": self.validate, "/mutate": self.mutate}

    def validate(self, body: bytes) -> Reply:
        return self._review("validate", body)

    def mutate(self, body: bytes) -> Reply:
        return self._review("mutate", body)

    def _review(self, endpoint: Endpoint, body: bytes) -> Reply:
        start = time.perf_counter()
        try:
            capacity = (
                self.capacity() if self.capacity is not None and endpoint == "validate" else None
            )
            answer = admit(decode_body(body), endpoint, self.config, capacity)
        except ReviewError as exc:
            self._count(endpoint, "bad_request", start)
            return 400, f"{exc}\n".encode(), TEXT
        except Exception:
            log.exception("event=review_failed endpoint=%s", endpoint)
            self._count(endpoint, "error", start)
            return 500, b"internal error\n", TEXT
        payload = encode(answer)
        response = answer["response"]
        if not response["allowed"]:
            outcome = "denied"
        else:
            outcome = "patched" if "patch" in response else "allowed"
        self._count(endpoint, outcome, start)
        return 200, payload, JSON

    def _count(self, endpoint: str, outcome: str, start: float) -> None:
        if self.metrics is not None:
            self.metrics.request(endpoint, outcome, time.perf_counter() - start)
