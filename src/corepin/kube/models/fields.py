"""Reading fields of decoded JSON (Kubernetes objects, admission reviews, extender messages).

The one set of field readers of corepin; every reader of the wire format uses them:

- strict readers raise `FieldError`, which names the field path and the bad value
  (`metadata.labels['app']: must be a string (got 3)`): the models' `from_dict`, the webhook;
- loose readers (`loose_object`, `loose_list`, `loose_strings`) read what is wrong as empty and
  never raise: the views of objects the API server sent (`corepin.kube.models.pod`).

A missing field (`None`) reads as empty (`{}`, `[]`, `""`) unless a reader says it is required.
The two helpers at the end keep model values read-only (`readonly`, `set_frozen`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any, Final, TypeVar

from corepin.core.cpuset import EMPTY, CPUSet
from corepin.core.errors import CPUSetParseError, InputError

_K = TypeVar("_K")
_V = TypeVar("_V")


class FieldError(InputError, ValueError):
    """A field (or annotation) of a Kubernetes object with a bad value; names both."""

    default_reason = "bad_field"

    def __init__(self, path: str, value: object, problem: str, *, reason: str | None = None):
        self.path = path
        self.value = None if value is MISSING else value
        self.problem = problem
        shown = "" if value is MISSING else f" (got {_show(value)})"
        super().__init__(f"{path}: {clip(problem, 160)}{shown}", reason=reason)


#: The value of a FieldError for a field that is not there at all.
MISSING: Final = object()


def clip(text: str, limit: int) -> str:
    """`text`, cut to `limit` characters with `...` when longer."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _show(value: object) -> str:
    return clip(repr(value), 120)


# ---------------------------------------------------------------------- strict readers
def object_at(value: object, path: str) -> Mapping[str, Any]:
    """`value` as a JSON object (string keys)."""
    if not isinstance(value, Mapping):
        raise FieldError(path, value, "must be an object")
    for key in value:
        if not isinstance(key, str):
            raise FieldError(path, key, "has a key that is not a string")
    return value


def object_or_empty(value: object, path: str) -> Mapping[str, Any]:
    """`value` as a JSON object; `{}` when it is None."""
    return {} if value is None else object_at(value, path)


def object_field(data: Mapping[str, Any], key: str, path: str) -> Mapping[str, Any]:
    """The object `data[key]` (field `path.key`); `{}` when missing."""
    return object_or_empty(data.get(key), f"{path}.{key}")


def list_or_empty(value: object, path: str) -> list[Any]:
    """`value` as a JSON array; `[]` when it is None."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise FieldError(path, value, "must be a list")
    return value


def list_field(data: Mapping[str, Any], key: str, path: str) -> list[Any]:
    """The array `data[key]` (field `path.key`); `[]` when missing."""
    return list_or_empty(data.get(key), f"{path}.{key}")


def string(value: object, path: str, *, required: bool = False, default: str = "") -> str:
    """`value` as a string; `default` when it is None, unless `required` (then non-empty)."""
    if value is None:
        if required:
            raise FieldError(path, MISSING, "is required")
        return default
    if not isinstance(value, str):
        raise FieldError(path, value, "must be a string")
    if required and not value:
        raise FieldError(path, value, "must not be empty")
    return value


def string_field(
    data: Mapping[str, Any], key: str, path: str, *, required: bool = False, default: str = ""
) -> str:
    """The string `data[key]` (field `path.key`), as `string` reads it."""
    return string(data.get(key), f"{path}.{key}", required=required, default=default)


def optional_string_field(data: Mapping[str, Any], key: str, path: str) -> str | None:
    """The string `data[key]`; None when missing."""
    value = data.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise FieldError(f"{path}.{key}", value, "must be a string")
    return value


def integer(value: object, path: str, *, minimum: int = 0, maximum: int | None = None) -> int:
    """`value` as an integer (not a bool) within `minimum..maximum`."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise FieldError(path, value, "must be an integer")
    if value < minimum or (maximum is not None and value > maximum):
        bound = f"{minimum}..{maximum}" if maximum is not None else f">= {minimum}"
        raise FieldError(path, value, f"must be {bound}")
    return value


def optional_bool_field(data: Mapping[str, Any], key: str, path: str) -> bool | None:
    """The boolean `data[key]`; None when missing."""
    value = data.get(key)
    if value is None or isinstance(value, bool):
        return value
    raise FieldError(f"{path}.{key}", value, "must be true or false")


def cpuset_text(value: object, path: str) -> CPUSet:
    """A CPU list string (`"0-3,8"`) as a CPUSet."""
    if not isinstance(value, str):
        raise FieldError(path, value, "must be a CPU list string such as '0-3,8'")
    try:
        return CPUSet.parse(value)
    except CPUSetParseError as exc:
        raise FieldError(path, value, exc.problem) from None


def cpuset_field(data: Mapping[str, Any], key: str, path: str) -> CPUSet:
    """The CPU list `data[key]`; the empty set when missing."""
    value = data.get(key)
    return EMPTY if value is None else cpuset_text(value, f"{path}.{key}")


def one_of(value: str, path: str, choices: Sequence[str]) -> str:
    """`value`, which must be one of `choices`."""
    if value not in choices:
        raise FieldError(path, value, f"must be one of {', '.join(choices)}")
    return value


def strings(value: object, path: str, *, problem: str = "must be an object") -> Mapping[str, str]:
    """`value` as an object of strings (labels, annotations, a node selector); `{}` when it
    is None; `problem` is what a value that is not an object is told."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise FieldError(path, value, problem)
    for key, item in value.items():
        if not isinstance(key, str):
            raise FieldError(path, key, "has a key that is not a string")
        if not isinstance(item, str):
            raise FieldError(f"{path}[{key!r}]", item, "must be a string")
    return value


def strings_field(data: Mapping[str, Any], key: str, path: str) -> dict[str, str]:
    """The object of strings `data[key]` (a copy); `{}` when missing."""
    return dict(strings(data.get(key), f"{path}.{key}"))


def unique(keys: Sequence[object], path: str, what: str) -> None:
    """Refuse a key listed twice (`path[i]: <what> is listed twice`)."""
    seen: set[object] = set()
    for i, key in enumerate(keys):
        if key in seen:
            raise FieldError(f"{path}[{i}]", key, f"{what} is listed twice")
        seen.add(key)


def check_header(data: Mapping[str, Any], kind: str, api_version: str) -> None:
    """Refuse an object of another kind or version (either may be left out)."""
    got_kind = data.get("kind")
    if got_kind is not None and got_kind != kind:
        raise FieldError("kind", got_kind, f"must be {kind!r}")
    got_version = data.get("apiVersion")
    if got_version is not None and got_version != api_version:
        raise FieldError("apiVersion", got_version, f"must be {api_version!r}")


# ---------------------------------------------------------------------- loose readers
def loose_object(value: object) -> Mapping[str, Any]:
    """`value` when it is an object, else `{}`."""
    return value if isinstance(value, Mapping) else {}


def loose_list(value: object) -> list[Any]:
    """`value` when it is an array, else `[]`."""
    return value if isinstance(value, list) else []


def loose_strings(value: object) -> dict[str, str]:
    """The string members of `value` when it is an object (keys as text), else `{}`."""
    if not isinstance(value, Mapping):
        return {}
    return {str(k): v for k, v in value.items() if isinstance(v, str)}


# ---------------------------------------------------------------------- read-only values
def readonly(mapping: Mapping[_K, _V]) -> Mapping[_K, _V]:
    """A read-only copy of `mapping` (itself when it is one already)."""
    if isinstance(mapping, MappingProxyType):
        return mapping
    return MappingProxyType(dict(mapping))


def set_frozen(obj: object, name: str, value: object) -> None:
    """Set a field of a frozen dataclass value while it is being built (`__post_init__`)."""
    object.__setattr__(obj, name, value)
