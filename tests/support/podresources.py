"""Pod resource arithmetic as Kubernetes does it, for the test doubles: the fake API server
(the QoS class it sets on create, the checks of the pods/resize subresource) and the test
kubelet (QoS class, the cgroup values it writes, the resources it reports).

Written from the Kubernetes sources, independently of corepin's own parsers (the doubles must
not share the code they test):

- Quantities: `resource.Quantity` (decimal and binary suffixes, exponents); `MilliValue()` and
  `Value()` round up, as the Go type does.
- Defaulting: a container's request of a resource defaults to its limit (the API server's
  `SetDefaults_Pod`, repeated by the kubelet for old objects).
- QoS: `ComputePodQOS` (pkg/apis/core/v1/helper/qos): only cpu and memory count; a quantity of
  zero counts as unset; requests and limits are summed over containers and init containers;
  Guaranteed when every container has cpu and memory limits and the summed requests equal the
  summed limits; BestEffort when nothing is set at all; Burstable otherwise. Pod-level
  resources (`spec.resources`, a newer feature) are not modelled.
- Cgroup values (pkg/kubelet/cm/helpers_linux.go and the CRI container config): CFS period
  100000 us; quota = milliCPU * period / 1000, at least 1000 us, none for no limit; shares =
  milliCPU * 1024 / 1000 clamped to [2, 262144], 2 for no request; a pod's requests and limits
  are the sum over its containers or the largest init container, whichever is larger
  (restartable init containers, sidecars, add to both); the pod cgroup gets a quota when the
  pod is Guaranteed, or Burstable with a CPU limit on every container.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from fractions import Fraction
from typing import Any, Final

Obj = dict[str, Any]

QOS_GUARANTEED: Final = "Guaranteed"
QOS_BURSTABLE: Final = "Burstable"
QOS_BEST_EFFORT: Final = "BestEffort"
#: the resources the QoS class is computed from
QOS_RESOURCES: Final = ("cpu", "memory")

CFS_PERIOD_US: Final = 100_000
MIN_QUOTA_US: Final = 1_000
MIN_SHARES: Final = 2
MAX_SHARES: Final = 262_144
SHARES_PER_CPU: Final = 1024

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


# ---------------------------------------------------------------------- cgroup values
def cpu_shares(milli_cpu: int) -> int:
    """`MilliCPUToShares`: cpu.shares for a CPU request in thousandths."""
    if milli_cpu <= 0:
        return MIN_SHARES
    return max(MIN_SHARES, min(MAX_SHARES, milli_cpu * SHARES_PER_CPU // 1000))


def cfs_quota(milli_cpu: int, period_us: int = CFS_PERIOD_US) -> int:
    """`MilliCPUToQuota`: cpu.cfs_quota_us for a CPU limit in thousandths; -1 (no quota) for
    no limit."""
    if milli_cpu <= 0:
        return -1
    return max(MIN_QUOTA_US, milli_cpu * period_us // 1000)


def container_cpu(container: Mapping[str, Any]) -> tuple[int, int]:
    """(request, limit) of CPU in thousandths after defaulting; 0 where unset."""
    request = container_requests(container).get("cpu")
    limit = container_limits(container).get("cpu")
    return (
        milli_value(request) if request is not None else 0,
        milli_value(limit) if limit is not None else 0,
    )


def _pod_total(containers: Iterable[tuple[Mapping[str, Any], bool]], which: str) -> int:
    """A pod's CPU request or limit in thousandths: `resource.PodRequests`/`PodLimits`
    restricted to CPU. `containers` are (container, is_init) in spec order."""
    index = 0 if which == "requests" else 1
    total = 0
    sidecars = 0
    init_peak = 0
    for container, is_init in containers:
        amount = container_cpu(container)[index]
        if not is_init:
            total += amount
        elif container.get("restartPolicy") == "Always":
            total += amount
            sidecars += amount
            init_peak = max(init_peak, sidecars)
        else:
            init_peak = max(init_peak, amount + sidecars)
    return max(total, init_peak)


def _ordered(pod: Mapping[str, Any]) -> list[tuple[Mapping[str, Any], bool]]:
    spec = pod.get("spec") or {}
    return [(c, True) for c in spec.get("initContainers") or []] + [
        (c, False) for c in spec.get("containers") or []
    ]


def pod_cpu_request(pod: Mapping[str, Any]) -> int:
    """The pod's CPU request in thousandths (what its cpu.shares come from)."""
    return _pod_total(_ordered(pod), "requests")


def pod_cpu_limit(pod: Mapping[str, Any]) -> int:
    """The pod's CPU limit in thousandths (what its CFS quota comes from)."""
    return _pod_total(_ordered(pod), "limits")


def pod_cgroup_cpu(pod: Mapping[str, Any]) -> tuple[int, int]:
    """(cpu.shares, cpu.cfs_quota_us) of the pod cgroup (`ResourceConfigForPod`); quota -1 for
    none."""
    qos = qos_class(pod)
    if qos == QOS_BEST_EFFORT:
        return MIN_SHARES, -1
    shares = cpu_shares(pod_cpu_request(pod))
    every_limited = all(container_cpu(c)[1] > 0 for c, _init in _ordered(pod))
    if qos == QOS_GUARANTEED or every_limited:
        return shares, cfs_quota(pod_cpu_limit(pod))
    return shares, -1


def container_cgroup_cpu(container: Mapping[str, Any]) -> tuple[int, int]:
    """(cpu.shares, cpu.cfs_quota_us) of a container cgroup, as the kubelet asks the runtime for
    them (quota -1 for no limit)."""
    request, limit = container_cpu(container)
    return cpu_shares(request), cfs_quota(limit)
