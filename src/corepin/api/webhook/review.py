"""The AdmissionReview v1 wire format, both ways (pure).

`request_of(review)` raises `ReviewError` (answer HTTP 400) when the body is not an
AdmissionReview v1 with a request uid; `response(uid, outcome)` is the AdmissionReview v1 to
answer with, that uid echoed: `{"apiVersion": "admission.k8s.io/v1", "kind":
"AdmissionReview", "response": {"uid", "allowed", ["status"], ["patchType", "patch"],
["warnings"]}}` (a refusal's `status.code` is 403 unless the `Outcome` says otherwise; 400 is
`BadRequest`). `is_pod_request` tells the requests the webhook judges: CREATE or UPDATE of a
pod itself (not a subresource).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from typing import Any, Final

from corepin.core.errors import InputError
from corepin.core.record import record
from corepin.kube.models.fields import clip

REVIEW_API_VERSION: Final = "admission.k8s.io/v1"
REVIEW_KIND: Final = "AdmissionReview"
#: Kubernetes may truncate longer warnings.
WARNING_LIMIT: Final = 256


class ReviewError(InputError, ValueError):
    """The body is not an AdmissionReview v1 this webhook can answer (HTTP 400)."""

    default_reason = "bad_review"


def decode_body(data: bytes) -> object:
    """The JSON document of a request body; ReviewError when it is not UTF-8 JSON."""
    try:
        return json.loads(data)
    except RecursionError:
        raise ReviewError("the body is JSON nested too deeply") from None
    except UnicodeDecodeError:
        raise ReviewError("the body is not UTF-8 text") from None
    except ValueError as exc:
        raise ReviewError(f"the body is not JSON: {exc}") from None


def encode(answer: Mapping[str, Any]) -> bytes:
    return json.dumps(answer, separators=(",", ":")).encode()


@record
class Outcome:
    """What to answer one request with."""

    allowed: bool
    message: str = ""
    code: int = 0
    patch: tuple[Mapping[str, Any], ...] = ()
    warnings: tuple[str, ...] = ()


def response(uid: str, outcome: Outcome) -> dict[str, Any]:
    """The AdmissionReview v1 answer for `uid`."""
    body: dict[str, Any] = {"uid": uid, "allowed": outcome.allowed}
    if not outcome.allowed:
        code = outcome.code or 403
        body["status"] = {
            "status": "Failure",
            "message": outcome.message,
            "reason": "BadRequest" if code == 400 else "Forbidden",
            "code": code,
        }
    if outcome.patch:
        ops = json.dumps(list(outcome.patch), separators=(",", ":")).encode()
        body["patchType"] = "JSONPatch"
        body["patch"] = base64.b64encode(ops).decode("ascii")
    if outcome.warnings:
        body["warnings"] = [clip(w, WARNING_LIMIT) for w in outcome.warnings]
    return {"apiVersion": REVIEW_API_VERSION, "kind": REVIEW_KIND, "response": body}


def request_of(review: object) -> tuple[str, Mapping[str, Any]]:
    """The uid and the request of an AdmissionReview v1 (ReviewError otherwise)."""
    if not isinstance(review, Mapping):
        raise ReviewError("the body must be a JSON object (an AdmissionReview)")
    api_version, kind = review.get("apiVersion"), review.get("kind")
    if api_version != REVIEW_API_VERSION or kind != REVIEW_KIND:
        raise ReviewError(
            f"expected apiVersion {REVIEW_API_VERSION} kind {REVIEW_KIND}, got "
            f"{clip(repr(api_version), 60)} {clip(repr(kind), 60)} "
            "(admissionReviewVersions must be [v1])"
        )
    request = review.get("request")
    if not isinstance(request, Mapping):
        raise ReviewError("the AdmissionReview has no request object")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise ReviewError("the AdmissionReview request has no uid")
    return uid, request


def is_pod_request(request: Mapping[str, Any]) -> bool:
    """Whether the request creates or updates a pod (not one of its subresources)."""
    if request.get("subResource") or request.get("operation") not in ("CREATE", "UPDATE"):
        return False
    resource, kind = request.get("resource"), request.get("kind")
    if isinstance(resource, Mapping) and resource.get("resource") == "pods":
        return not resource.get("group")
    return isinstance(kind, Mapping) and kind.get("kind") == "Pod" and not kind.get("group")
