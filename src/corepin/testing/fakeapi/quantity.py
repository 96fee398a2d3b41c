"""Kubernetes quantities, request defaulting and the pod QoS class, for the fake API server (the
QoS class it sets on a pod it creates, the checks of the pods/resize subresource) and the test
kubelet built on it.

Written from the Kubernetes sources and kept independent of corepin's own parsers on purpose:
the fake is what corepin is tested against, and a fake that shared corepin's quantity parser or
QoS rules would agree with corepin's bugs instead of catching them.

- Quantities: `resource.Quantity` (decimal and binary suffixes, exponents); `MilliValue()` and
  `Value()` round up, as the Go type does.
- Defaulting: a container's request of a resource defaults to its limit (the API server's
  `SetDefaults_Pod`, repeated by the kubelet for old objects).
- QoS: `ComputePodQOS` (pkg/apis/core/v1/helper/qos): only cpu and memory count; a quantity of
  zero counts as unset; requests and limits are summed over containers and init containers;
  Guaranteed when every container has cpu and memory limits and the summed requests equal the
  summed limits; BestEffort when nothing is set at all; Burstable otherwise. Pod-level
  resources (`spec.resources`, a newer feature) are not modelled.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from fractions import Fraction
from typing import Any, Final

Obj = dict[str, Any]

QOS_GUARANTEED: Final = "Guaranteed"
QOS_BURSTABLE: Final = "Burstable"
QOS_BEST_EFFORT: Final = "BestEffort"
#: the resources the QoS class is computed from
QOS_RESOURCES: Final = ("cpu", "memory")

_QUANTITY = re.compile(
    r"\A([+-]?)(\d+(?:\.\d*)?|\.\d+)"
    r"(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|[eE][+-]?\d+)?\Z"
)
_BINARY: Final = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DECIMAL: Final = {
    "n": -9,
    "u": -6,
    "m": -3,
    "": 0,
    "k": 3,
    "M": 6,
    "G": 9,
    "T": 12,
    "P": 15,
    "E": 18,
}


class QuantityError(ValueError):
    """A text that is not a Kubernetes quantity."""


def parse_quantity(value: object) -> Fraction:
    """A Kubernetes quantity as an exact number: "1500m" -> 3/2, "1Ki" -> 1024, "1e3" -> 1000."""
    if isinstance(value, bool):
        raise QuantityError(f"{value!r} is not a quantity")
    if isinstance(value, int):
        return Fraction(value)
    if isinstance(value, float):
        return Fraction(repr(value))
    if not isinstance(value, str):
        raise QuantityError(f"{value!r} is not a quantity")
    match = _QUANTITY.match(value.strip())
    if match is None:
        raise QuantityError(f"{value!r} is not a quantity")
    sign, digits, suffix = match.group(1), match.group(2), match.group(3) or ""
    amount = Fraction(digits)
    if suffix in _BINARY:
        amount *= 2 ** _BINARY[suffix]
    elif suffix in _DECIMAL:
        amount *= Fraction(10) ** _DECIMAL[suffix]
    else:
        amount *= Fraction(10) ** int(suffix[1:])
    return -amount if sign == "-" else amount


def milli_value(value: object) -> int:
    """`Quantity.MilliValue()`: thousandths, rounded up."""
    return math.ceil(parse_quantity(value) * 1000)


def whole_value(value: object) -> int:
    """`Quantity.Value()`: the whole number, rounded up."""
    return math.ceil(parse_quantity(value))


# ---------------------------------------------------------------------- containers
def _section(container: Mapping[str, Any], key: str) -> dict[str, Any]:
    resources = container.get("resources") or {}
    return dict(resources.get(key) or {})


def container_limits(container: Mapping[str, Any]) -> dict[str, Any]:
    """The container's limits as written."""
    return _section(container, "limits")


def container_requests(container: Mapping[str, Any]) -> dict[str, Any]:
    """The container's requests after defaulting: a request missing for a limited resource
    is the limit."""
    requests = _section(container, "requests")
    for name, value in container_limits(container).items():
        requests.setdefault(name, value)
    return requests


def defaulted_resources(container: Mapping[str, Any]) -> Obj:
    """`{"requests": ..., "limits": ...}` after defaulting (empty sections left out)."""
    out: Obj = {}
    requests, limits = container_requests(container), container_limits(container)
    if requests:
        out["requests"] = requests
    if limits:
        out["limits"] = limits
    return out


def _all_containers(pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    spec = pod.get("spec") or {}
    return [
        c
        for kind in ("containers", "initContainers")
        for c in spec.get(kind) or []
        if isinstance(c, Mapping)
    ]


# ---------------------------------------------------------------------- QoS
def qos_class(pod: Mapping[str, Any]) -> str:
    """The pod's QoS class, as `ComputePodQOS` computes it (see the module docstring)."""
    requests: dict[str, Fraction] = {}
    limits: dict[str, Fraction] = {}
    guaranteed = True
    for container in _all_containers(pod):
        for name, raw in container_requests(container).items():
            if name not in QOS_RESOURCES:
                continue
            amount = parse_quantity(raw)
            if amount > 0:
                requests[name] = requests.get(name, Fraction(0)) + amount
        found: set[str] = set()
        for name, raw in container_limits(container).items():
            if name not in QOS_RESOURCES:
                continue
            amount = parse_quantity(raw)
            if amount > 0:
                found.add(name)
                limits[name] = limits.get(name, Fraction(0)) + amount
        if not found.issuperset(QOS_RESOURCES):
            guaranteed = False
    if not requests and not limits:
        return QOS_BEST_EFFORT
    if guaranteed:
        for name, amount in requests.items():
            if limits.get(name) != amount:
                guaranteed = False
                break
    if guaranteed and len(requests) == len(limits):
        return QOS_GUARANTEED
    return QOS_BURSTABLE
