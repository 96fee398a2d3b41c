"""Best-effort suppression: how much CPU best-effort (BE) work may have, and which CPUs.

The budget of one period, in CPUs:

    budget = total * sloPercent / 100 - LS used - max(system used, reserved)

where `LS used` is what the latency-sensitive classes (LS, LSR, LSE) used in the last period,
`system used` what the node used outside every managed workload, and `reserved` the number of
the node's reserved CPUs. It never goes below zero.

Policy `cpuset` gives BE `next_be_cpus`: whole CPUs of the candidates (the shared pool without
exclusive, reserved and LSR CPUs); it grows by at most a tenth of the node (at least one CPU) per
period, shrinks at once, and keeps at least `minCPUs` while there are that many candidates.
Policy `cfsQuota` gives the same budget as a CFS quota (`be_quota_us`).
"""

from __future__ import annotations

import math
from typing import Final

from corepin.core.cpuset import CPUSet

__all__ = ["be_budget", "be_quota_us", "grow_step", "next_be_cpus"]

#: the smallest quota the BE group gets (the kernel takes 1 ms; BE keeps a little more)
MIN_BE_QUOTA_US: Final = 2000


def be_budget(
    total: int, slo_percent: int, ls_used: float, system_used: float, reserved: int
) -> float:
    """CPUs BE may use this period (see the module docstring); 0 or more."""
    return max(0.0, total * slo_percent / 100 - ls_used - max(system_used, float(reserved)))


def grow_step(total: int) -> int:
    """The most CPUs the BE set grows by in one period: a tenth of the node, at least one."""
    return max(1, math.ceil(total / 10))


def next_be_cpus(
    current: CPUSet, budget: float, candidates: CPUSet, total: int, min_cpus: int
) -> CPUSet:
    """The BE CPUs for the next period.

    How many: `floor(budget)`, at least `min_cpus`, at most every candidate, and at most
    `grow_step(total)` more than BE has now (of the candidates). Which: the CPUs BE has now
    first (no churn), then the highest-numbered candidates (away from CPU 0, where a node's own
    work tends to run); a shrink keeps the highest of the current ones.
    """
    if not candidates:
        return CPUSet()
    kept = current & candidates
    want = max(math.floor(budget + 1e-9), min_cpus)
    want = min(want, len(candidates), len(kept) + grow_step(total) if kept else want)
    want = max(want, min(min_cpus, len(candidates)))
    ordered = sorted(kept, reverse=True) + sorted(candidates - kept, reverse=True)
    return CPUSet(ordered[:want])


def be_quota_us(budget: float, period_us: int) -> int:
    """The CFS quota (µs per `period_us`) worth `budget` CPUs, at least 2 ms."""
    return max(MIN_BE_QUOTA_US, round(budget * period_us))
