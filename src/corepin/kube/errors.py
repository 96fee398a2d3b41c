"""Failed answers of the API server as corepin's typed errors: the one place where an HTTP
status and its `Status` body (or a watch ERROR event) become an `ApiError` subclass of
`corepin.core.errors` (`api_error`), with the server's wish to be retried later read
(`retry_after_of`). A 429 becomes `ApiTooManyRequests`, defined here (the core errors have
no class of their own for it).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from corepin.core.errors import (
    ApiAlreadyExists,
    ApiConflict,
    ApiError,
    ApiForbidden,
    ApiGone,
    ApiInvalid,
    ApiNotFound,
    ApiUnauthorized,
)


class ApiTooManyRequests(ApiError):
    """429: not now - the server throttles, or an eviction would break a PodDisruptionBudget
    (its `causes` say which); try again later (`retry_after` when the server said when)."""


_BY_CODE: dict[int, type[ApiError]] = {
    401: ApiUnauthorized,
    403: ApiForbidden,
    404: ApiNotFound,
    410: ApiGone,
    422: ApiInvalid,
    429: ApiTooManyRequests,
}


def api_error(
    code: int,
    body: bytes | Mapping[str, Any],
    *,
    http_reason: str = "",
    verb: str = "",
    target: str = "",
    headers: Mapping[str, str] | None = None,
) -> ApiError:
    """The typed error for a failed answer (HTTP status + body, or a watch ERROR Status).
    A `Retry-After` header (or the Status's `details.retryAfterSeconds`, which the API server
    sets on 429s) lands in the error's `retry_after`."""
    status: Mapping[str, Any] = {}
    if isinstance(body, Mapping):
        status = body
    else:
        try:
            decoded = json.loads(body or b"{}")
            if isinstance(decoded, dict):
                status = decoded
        except ValueError:
            status = {}
    if status.get("kind") == "Status":
        code = int(status.get("code") or code)
        reason = str(status.get("reason") or http_reason or "Unknown")
        message = str(status.get("message") or reason)
        details = status.get("details")
    else:
        reason = http_reason or "Unknown"
        text = body.decode("utf-8", "replace").strip() if isinstance(body, bytes) else ""
        message = text[:200] or reason
        details = None
    if code == 409:
        cls: type[ApiError] = ApiAlreadyExists if reason == "AlreadyExists" else ApiConflict
    else:
        cls = _BY_CODE.get(code, ApiError)
    error = cls(
        code,
        reason,
        message,
        details=dict(details) if isinstance(details, dict) else None,
        verb=verb,
        target=target,
    )
    error.retry_after = retry_after_of(headers or {}, error.details)
    return error


def retry_after_of(headers: Mapping[str, str], details: Mapping[str, object]) -> float | None:
    """Seconds from `Retry-After` (delta-seconds, the form the API server and proxies in front
    of it send; an HTTP date is ignored) or `details.retryAfterSeconds`; None when neither."""
    for name, value in headers.items():
        if name.lower() == "retry-after":
            try:
                seconds = float(str(value).strip())
            except ValueError:
                break
            if seconds >= 0 and seconds == seconds and seconds != float("inf"):
                return seconds
            break
    found = details.get("retryAfterSeconds")
    if isinstance(found, int | float) and not isinstance(found, bool) and found >= 0:
        return float(found)
    return None


def too_large_resource_version(exc: ApiError) -> bool:
    """The server does not have the resource version asked for yet (504, cause
    ResourceVersionTooLarge): it is behind us, e.g. restored from an older etcd state."""
    if exc.code != 504:
        return False
    if any(c.get("reason") == "ResourceVersionTooLarge" for c in exc.causes):
        return True
    return "too large resource version" in exc.api_message.lower()
