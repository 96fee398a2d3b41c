"""Pod resource arithmetic as Kubernetes does it, for the test doubles: the fake API server
(the QoS class it sets on create, the checks of the pods/resize subresource) and the test
kubelet (QoS class, the cgroup values it writes, the resources it reports).

Written from the Kubernetes sources, independently of corepin's own parsers (the doubles must
not share the code they test). Quantities, request defaulting and the QoS class live with the
fake API server (`corepin.testing.fakeapi.quantity`, re-exported here); this module adds:

- Cgroup values (pkg/kubelet/cm/helpers_linux.go and the CRI container config): CFS period
  100000 us; quota = milliCPU * period / 1000, at least 1000 us, none for no limit; shares =
  milliCPU * 1024 / 1000 clamped to [2, 262144], 2 for no request; a pod's requests and limits
  are the sum over its containers or the largest init container, whichever is larger
  (restartable init containers, sidecars, add to both); the pod cgroup gets a quota when the
  pod is Guaranteed, or Burstable with a CPU limit on every container.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

from corepin.testing.fakeapi.quantity import (
    QOS_BEST_EFFORT,
    QOS_BURSTABLE,
    QOS_GUARANTEED,
    QOS_RESOURCES,
    Obj,
    QuantityError,
    container_limits,
    container_requests,
    defaulted_resources,
    milli_value,
    parse_quantity,
    qos_class,
    whole_value,
)

__all__ = [
    "CFS_PERIOD_US",
    "MAX_SHARES",
    "MIN_QUOTA_US",
    "MIN_SHARES",
    "QOS_BEST_EFFORT",
    "QOS_BURSTABLE",
    "QOS_GUARANTEED",
    "QOS_RESOURCES",
    "SHARES_PER_CPU",
    "Obj",
    "QuantityError",
    "cfs_quota",
    "container_cgroup_cpu",
    "container_cpu",
    "container_limits",
    "container_requests",
    "cpu_shares",
    "defaulted_resources",
    "milli_value",
    "parse_quantity",
    "pod_cgroup_cpu",
    "pod_cpu_limit",
    "pod_cpu_request",
    "qos_class",
    "whole_value",
]

CFS_PERIOD_US: Final = 100_000
MIN_QUOTA_US: Final = 1_000
MIN_SHARES: Final = 2
MAX_SHARES: Final = 262_144
SHARES_PER_CPU: Final = 1024


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
