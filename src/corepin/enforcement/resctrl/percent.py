"""The percent interface of node QoS: per class `l3Percent: [start, end]` and `mbaPercent: N`.

A policy (`corepin.allocation.qos.ClassPolicy`) says, per QoS class, which share of the L3 ways
and of the memory bandwidth it may use; this module turns it into the values one machine takes:

- cache: the ways of `info/L3/cbm_mask` are numbered from its lowest set bit (way 0) to its
  highest (way W-1). `[start, end]` percent becomes the contiguous run of ways
  `floor(start * W / 100) .. ceil(end * W / 100) - 1`, the smallest run of whole ways covering
  the range. A run shorter than `min_cbm_bits` (or empty) grows upward to that many ways, and
  downward where it reaches the top of the mask. So `[0, 30]` of 20 ways is ways 0-5 (`3f`),
  `[90, 100]` ways 18-19, and a wider range never has fewer ways.
- bandwidth, Intel (percent): `mbaPercent` rounded UP to `info/MB/bandwidth_gran`, within
  `[info/MB/min_bandwidth, 100]`.
- bandwidth, AMD (absolute, the root group's default is unlimited, 2048 on current parts):
  `ceil(mbaPercent * default / 100)`, at least 1; 100 % is the default.

The vendor is read from `/proc/cpuinfo` (`vendor_id`; Hygon counts as AMD).
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

from corepin.allocation.qos.policy import ClassPolicy
from corepin.enforcement.resctrl.model import ResctrlInfo, ResctrlValueError

__all__ = ["cbm_for_percent", "class_schemata", "mba_for_percent", "read_cpu_vendor"]

_VENDORS: Final = {"GenuineIntel": "intel", "AuthenticAMD": "amd", "HygonGenuine": "amd"}


def cbm_for_percent(start: int, end: int, cbm_mask: int, min_cbm_bits: int = 1) -> int:
    """The contiguous cache bit mask for `[start, end]` percent of `cbm_mask`'s ways."""
    if not 0 <= start < end <= 100:
        raise ResctrlValueError(f"L3 range [{start}, {end}] is not within 0..100 with start < end")
    ways = [bit for bit in range(cbm_mask.bit_length()) if cbm_mask >> bit & 1]
    width = len(ways)
    need = max(min_cbm_bits, 1)
    if need > width:
        raise ResctrlValueError(
            f"info/L3/cbm_mask {cbm_mask:x} has {width} ways, fewer than min_cbm_bits {need}"
        )
    low = start * width // 100
    high = -(-end * width // 100)
    if high - low < need:
        high = min(width, low + need)
        low = high - need
    mask = 0
    for way in ways[low:high]:
        mask |= 1 << way
    return mask


def mba_for_percent(percent: int, info: ResctrlInfo) -> int:
    """The MB value for `percent` of the bandwidth on this machine (its unit and bounds)."""
    if not 1 <= percent <= 100:
        raise ResctrlValueError(f"memory bandwidth {percent}% is outside 1..100")
    if info.mb_unit == "absolute":
        return max(1, -(-percent * info.max_bandwidth // 100))
    gran = max(info.bandwidth_gran, 1)
    rounded = -(-percent // gran) * gran
    return min(100, max(info.min_bandwidth, rounded))


def class_schemata(policy: ClassPolicy, info: ResctrlInfo) -> tuple[int | None, int | None]:
    """(cache mask for every cache id, MB value for every domain) of `policy` on this machine;
    None where the policy leaves that resource alone or the machine has no MBA."""
    mask: int | None = None
    if policy.l3_percent is not None:
        if info.cbm_mask is None:
            raise ResctrlValueError("this machine has no L3 cache allocation (info/L3/cbm_mask)")
        mask = cbm_for_percent(*policy.l3_percent, info.cbm_mask, info.min_cbm_bits)
    bandwidth: int | None = None
    if policy.mba_percent is not None and info.mb_unit is not None:
        bandwidth = mba_for_percent(policy.mba_percent, info)
    return mask, bandwidth


def read_cpu_vendor(proc_root: Path = Path("/proc")) -> str | None:
    """ "intel" or "amd" from `<proc_root>/cpuinfo`'s vendor_id; None when unknown/unreadable."""
    try:
        text = (proc_root / "cpuinfo").read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == "vendor_id":
            return _VENDORS.get(value.strip())
    return None
