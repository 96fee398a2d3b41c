"""API failures as the server reports them: a `Status` object with code, reason and details."""

from __future__ import annotations

from typing import Any

from corepin.testing.fakeapi.resources import ResourceType
from corepin.testing.fakeapi.schema import FieldError

Obj = dict[str, Any]


class ApiFailure(Exception):
    """Raised inside the fake; the HTTP layer answers with `status()` and `code`."""

    def __init__(self, code: int, reason: str, message: str, details: Obj | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details

    def status(self) -> Obj:
        out: Obj = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if not self.reason:
            del out["reason"]  # a Status a handler returned as its answer may carry none
        if self.details is not None:
            out["details"] = self.details
        return out


def _details(rt: ResourceType, name: str, *, kind: str | None = None) -> Obj:
    out: Obj = {"name": name, "kind": kind or rt.plural}
    if rt.group:
        out["group"] = rt.group
    return out


def not_found(rt: ResourceType, name: str) -> ApiFailure:
    return ApiFailure(404, "NotFound", f'{rt.qualified} "{name}" not found', _details(rt, name))


def already_exists(rt: ResourceType, name: str) -> ApiFailure:
    return ApiFailure(
        409, "AlreadyExists", f'{rt.qualified} "{name}" already exists', _details(rt, name)
    )


def conflict(
    rt: ResourceType, name: str, why: str | None = None, resource: str | None = None
) -> ApiFailure:
    text = why or (
        "the object has been modified; please apply your changes to the latest "
        "version and try again"
    )
    return ApiFailure(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {resource or rt.qualified} "{name}": {text}',
        _details(rt, name),
    )


def invalid(rt: ResourceType, name: str, errors: list[FieldError]) -> ApiFailure:
    kind = f"{rt.kind}.{rt.group}" if rt.group else rt.kind
    texts = [e.message for e in errors]
    joined = texts[0] if len(texts) == 1 else "[" + ", ".join(texts) + "]"
    details = _details(rt, name, kind=rt.kind)
    details["causes"] = [e.cause() for e in errors]
    return ApiFailure(422, "Invalid", f'{kind} "{name}" is invalid: {joined}', details)


def bad_request(message: str) -> ApiFailure:
    return ApiFailure(400, "BadRequest", message)


def gone(message: str) -> ApiFailure:
    return ApiFailure(410, "Expired", message)


def unsupported_media(accepted: list[str]) -> ApiFailure:
    return ApiFailure(
        415,
        "UnsupportedMediaType",
        "the body of the request was in an unknown format - accepted media types "
        "include: " + ", ".join(accepted),
    )


def method_not_allowed(
    message: str = "the server does not allow this method on the requested resource",
) -> ApiFailure:
    return ApiFailure(405, "MethodNotAllowed", message)


def internal(message: str) -> ApiFailure:
    return ApiFailure(
        500,
        "InternalError",
        f"Internal error occurred: {message}",
        {"causes": [{"message": message}]},
    )
