"""Pods and other API objects as the API server sends them (decoded JSON), read through typed
views, and the rule that makes a container eligible for CPUs of its own.

- `ObjectView(obj)`: any object's `metadata` (name, namespace, uid, labels, ...), `spec` and
  `status`; `PodView(pod)` adds the containers and their statuses. A view reads leniently: a
  missing field, or one of the wrong type, reads as empty, and a view never raises (the
  API server sends well-formed objects; what corepin cannot read it treats as not there).
  `PodView.checked(pod, path)` is the strict view of a pod someone else sent (an admission
  review): a malformed field raises `FieldError` naming it.
- `container_eligibility(container)`: a whole CPU limit >= 1 equal to the CPU request.
- `read_quantity(value, path)`: a quantity field, its error naming the field.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from corepin.core.quantity import QuantityError, parse_quantity
from corepin.kube.models.fields import (
    FieldError,
    loose_list,
    loose_object,
    loose_strings,
    object_at,
    object_field,
    object_or_empty,
    strings,
)


def _text(value: object) -> str:
    return str(value or "")


class ObjectView:
    """A read-only view of one API object of any kind (see the module docstring)."""

    __slots__ = ("metadata", "raw")

    def __init__(self, raw: object) -> None:
        #: the object as it was sent (`{}` when it is not an object)
        self.raw: Mapping[str, Any] = loose_object(raw)
        self.metadata: Mapping[str, Any] = loose_object(self.raw.get("metadata"))

    @property
    def spec(self) -> Mapping[str, Any]:
        return loose_object(self.raw.get("spec"))

    @property
    def status(self) -> Mapping[str, Any]:
        return loose_object(self.raw.get("status"))

    @property
    def name(self) -> str:
        return _text(self.metadata.get("name"))

    @property
    def namespace(self) -> str:
        """The namespace; "" for a cluster-scoped object (or one that names none)."""
        return _text(self.metadata.get("namespace"))

    @property
    def uid(self) -> str:
        return _text(self.metadata.get("uid"))

    @property
    def resource_version(self) -> str:
        return _text(self.metadata.get("resourceVersion"))

    @property
    def labels(self) -> dict[str, str]:
        """The labels whose values are strings."""
        return loose_strings(self.metadata.get("labels"))

    @property
    def annotations(self) -> dict[str, str]:
        """The annotations whose values are strings."""
        return loose_strings(self.metadata.get("annotations"))

    @property
    def deleting(self) -> bool:
        """Whether the object is being deleted (it has a deletionTimestamp)."""
        return bool(self.metadata.get("deletionTimestamp"))


class PodView(ObjectView):
    """A read-only view of a Pod (see the module docstring)."""

    __slots__ = ()

    @classmethod
    def checked(cls, raw: object, path: str = "pod") -> PodView:
        """The view of a pod whose metadata, spec, labels, annotations and app containers are
        well-formed; FieldError naming the first field that is not (`path` for the pod)."""
        if not isinstance(raw, Mapping):
            raise FieldError(path, raw, "must be a Pod object")
        meta = object_or_empty(raw.get("metadata"), "metadata")
        object_or_empty(raw.get("spec"), "spec")
        strings(meta.get("annotations"), "metadata.annotations")
        strings(meta.get("labels"), "metadata.labels")
        view = cls(raw)
        view.checked_containers("containers")
        return view

    @property
    def containers(self) -> tuple[Mapping[str, Any], ...]:
        """The app containers (`spec.containers`) that are objects with a name, in order."""
        return _named(self.spec.get("containers"))

    @property
    def init_containers(self) -> tuple[Mapping[str, Any], ...]:
        """The init containers (`spec.initContainers`) that are objects with a name."""
        return _named(self.spec.get("initContainers"))

    def checked_containers(self, key: str = "containers") -> list[Mapping[str, Any]]:
        """`spec.<key>` (`containers` or `initContainers`), every entry an object with a name;
        FieldError naming the first that is not."""
        value = self.spec.get(key)
        if value is None:
            return []
        if not isinstance(value, list):
            raise FieldError(f"spec.{key}", value, "must be a list")
        for i, c in enumerate(value):
            if not isinstance(c, Mapping):
                raise FieldError(f"spec.{key}[{i}]", c, "must be an object")
            if not isinstance(c.get("name"), str):
                raise FieldError(f"spec.{key}[{i}].name", c.get("name"), "must be a string")
        return value

    @property
    def container_statuses(self) -> dict[str, Mapping[str, Any]]:
        """`status.containerStatuses` by container name."""
        return _by_name(self.status.get("containerStatuses"))

    @property
    def init_container_statuses(self) -> dict[str, Mapping[str, Any]]:
        """`status.initContainerStatuses` by container name."""
        return _by_name(self.status.get("initContainerStatuses"))

    @property
    def phase(self) -> str:
        return _text(self.status.get("phase"))

    @property
    def node_name(self) -> str:
        """The node the pod is bound to ("" while it is pending)."""
        return _text(self.spec.get("nodeName"))


def _named(value: object) -> tuple[Mapping[str, Any], ...]:
    return tuple(
        c for c in loose_list(value) if isinstance(c, Mapping) and isinstance(c.get("name"), str)
    )


def _by_name(value: object) -> dict[str, Mapping[str, Any]]:
    out: dict[str, Mapping[str, Any]] = {}
    for row in loose_list(value):
        if isinstance(row, Mapping) and isinstance(row.get("name"), str):
            out[row["name"]] = row
    return out


# ---------------------------------------------------------------------- eligibility
def read_quantity(value: object, path: str = "quantity") -> Fraction:
    """The quantity field `path` (`parse_quantity`); FieldError naming the field otherwise."""
    try:
        return parse_quantity(value)
    except QuantityError as exc:
        raise FieldError(path, value, exc.problem) from None


@dataclass(frozen=True, slots=True)
class Eligibility:
    """Whether a container may get `exclusive` or `share` CPUs, and how many."""

    eligible: bool
    cpus: int = 0
    reason: str = ""


def container_eligibility(container: object, path: str = "container") -> Eligibility:
    """Eligible when the CPU limit is a whole number >= 1 equal to the CPU
    request (a missing request counts as the limit, as the API server defaults it).

    A malformed container (not an object, a quantity that does not parse) raises FieldError;
    a well-formed but ineligible one returns `eligible=False` with the reason."""
    c = object_at(container, path)
    resources = object_field(c, "resources", path)
    limits = object_field(resources, "limits", f"{path}.resources")
    requests = object_field(resources, "requests", f"{path}.resources")
    raw_limit = limits.get("cpu")
    if raw_limit is None:
        return Eligibility(False, 0, "it has no CPU limit")
    limit = read_quantity(raw_limit, f"{path}.resources.limits.cpu")
    raw_request = requests.get("cpu")
    request = (
        limit
        if raw_request is None
        else read_quantity(raw_request, f"{path}.resources.requests.cpu")
    )
    if limit.denominator != 1 or limit < 1:
        return Eligibility(False, 0, f"its CPU limit {raw_limit!r} is not a whole number >= 1")
    if request != limit:
        return Eligibility(
            False, 0, f"its CPU request {raw_request!r} differs from its CPU limit {raw_limit!r}"
        )
    return Eligibility(True, int(limit))
