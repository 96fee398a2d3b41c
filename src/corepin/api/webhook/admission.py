"""The admission decisions of `corepin webhook`: AdmissionReview v1 for pods.

Pure: a decoded AdmissionReview in, the AdmissionReview to answer with out; no I/O and no
clock (what the cluster's nodes can hold comes in as a `ClusterCapacity` snapshot, or None).

```python
answer = admit(review, "validate", config, capacity)   # or "mutate"
```

`admit` raises `ReviewError` (answer HTTP 400) when the body is not an AdmissionReview v1
with a request uid; anything else gets an AdmissionReview v1 response with that uid echoed
(`review`). A CREATE or UPDATE of a CPUReservation at `validate` is judged by
`reservations.validate_reservation`; any other request that is not about a pod (other
resources, subresources, DELETE, CONNECT) is allowed untouched; a pod object that cannot
be read is refused with code 400 naming the field. The rules: `validate` (what is refused,
what is warned about) and `mutate` (what is patched).
"""

from __future__ import annotations

from typing import Any, Literal

from corepin.api.webhook.capacity import ClusterCapacity
from corepin.api.webhook.config import WebhookConfig
from corepin.api.webhook.mutate import mutate_pod
from corepin.api.webhook.reservations import is_reservation_request, validate_reservation
from corepin.api.webhook.review import Outcome, is_pod_request, request_of, response
from corepin.api.webhook.validate import validate_pod
from corepin.kube.models import FieldError

Endpoint = Literal["validate", "mutate"]


def admit(
    review: object,
    endpoint: Endpoint,
    config: WebhookConfig,
    capacity: ClusterCapacity | None = None,
) -> dict[str, Any]:
    """The AdmissionReview answer to `review` at `endpoint` (see the module docstring)."""
    uid, request = request_of(review)
    try:
        if endpoint == "validate" and is_reservation_request(request):
            outcome = validate_reservation(request)
        elif not is_pod_request(request):
            outcome = Outcome(True)
        elif endpoint == "validate":
            outcome = validate_pod(request, capacity)
        elif endpoint == "mutate":
            outcome = mutate_pod(request, config)
        else:
            raise ValueError(f"unknown endpoint {endpoint!r}")
    except FieldError as exc:
        outcome = Outcome(False, f"corepin cannot read this pod: {exc.message}", 400)
    return response(uid, outcome)
