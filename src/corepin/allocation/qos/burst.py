"""CPU burst of a latency-sensitive container with a CPU limit.

A limit of L CPUs is a CFS quota of `L * period` per period (the base quota). Two levers:

- the burst allowance (`cpu.cfs_burst_us` on v1, `cpu.max.burst` on v2; policies `cpuBurstOnly`
  and `auto`): unused quota may be saved up to `base * burstPercent / 100` and spent in a later
  period. The kernel refuses a burst above the quota, so the allowance is clamped to the quota
  in force (`burst_us_for`);
- the quota itself (policies `cfsQuotaBurstOnly` and `auto`): raised by 20 % per period while the
  container was throttled, up to `maxQuotaPercent` of the base, lowered by 20 % per period back
  to the base when it was not; and put back to the base at once while the shared pool is busier
  than `shareUsageLimitPercent` (`auto_step`, on a scale where 1.0 is the base quota).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from corepin.allocation.qos.policy import CpuBurst

__all__ = ["BurstDecision", "BurstState", "auto_step", "burst_us_for", "decide_burst"]

STEP: Final = 0.2


@dataclass(frozen=True, slots=True)
class BurstState:
    """What the loop remembers of one container between periods: the quota scale in force
    (1.0: the base) and the throttling counter last read (None: not read yet)."""

    scale: float = 1.0
    nr_throttled: int | None = None


@dataclass(frozen=True, slots=True)
class BurstDecision:
    """What a container's CPU files should hold: the quota and the burst allowance (µs)."""

    quota_us: int
    burst_us: int
    state: BurstState


def burst_us_for(base_quota_us: int, quota_us: int, burst_percent: int) -> int:
    """The burst allowance for `burst_percent` of the base quota, never above the quota in
    force (what the kernel accepts)."""
    return max(0, min(base_quota_us * burst_percent // 100, quota_us))


def auto_step(scale: float, throttled: bool, share_busy_percent: float, policy: CpuBurst) -> float:
    """The next quota scale (see the module docstring)."""
    if share_busy_percent > policy.share_usage_limit_percent:
        return 1.0
    top = policy.max_quota_percent / 100
    if throttled:
        return min(top, scale * (1 + STEP))
    return max(1.0, scale * (1 - STEP))


def decide_burst(
    base_quota_us: int,
    state: BurstState,
    nr_throttled: int,
    share_busy_percent: float,
    policy: CpuBurst,
) -> BurstDecision:
    """One period of `policy` for a container whose base quota is `base_quota_us`, given its
    throttling counter now and how busy the shared pool is."""
    throttled = state.nr_throttled is not None and nr_throttled > state.nr_throttled
    scale = 1.0
    if policy.quota_on:
        scale = auto_step(state.scale, throttled, share_busy_percent, policy)
    quota = max(1000, round(base_quota_us * scale))
    burst = 0
    if policy.burst_on and share_busy_percent <= policy.share_usage_limit_percent:
        burst = burst_us_for(base_quota_us, quota, policy.burst_percent)
    return BurstDecision(quota, burst, BurstState(scale, nr_throttled))
