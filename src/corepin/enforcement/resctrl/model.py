"""resctrl machine facts and schemata text: errors, `ResctrlInfo`, mask checks, line parsing.

What the `info` directory and the root group's `schemata` say about a machine (cache ids, the
cache bit mask, `min_cbm_bits`, sparse masks, CDP, the MBA unit and bounds), read once by
`read_info`; `check_cbm` validates a mask the way the kernel does; `parse_schemata` and
`format_line` turn schemata text into values and back.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from corepin.core.errors import EnvironmentProblem, InputError

__all__ = [
    "ResctrlError",
    "ResctrlInfo",
    "ResctrlValueError",
    "check_cbm",
    "format_line",
    "parse_schemata",
    "read_info",
    "read_text",
]


class ResctrlError(EnvironmentProblem):
    """A resctrl operation failed (names the path; the kernel's last_cmd_status when known)."""

    default_reason = "resctrl"

    def __init__(self, path: str, problem: str, *, reason: str | None = None) -> None:
        self.path = path
        self.problem = problem
        super().__init__(f"{path}: {problem}", reason=reason)


class ResctrlValueError(InputError, ValueError):
    """A schemata value this machine cannot take (bad mask, bandwidth out of range, no domain)."""

    default_reason = "bad_resctrl_value"


@dataclass(frozen=True, slots=True)
class ResctrlInfo:
    """What the resctrl `info` directory and the root group say about this machine."""

    l3_domains: tuple[int, ...] = ()
    cbm_mask: int | None = None
    min_cbm_bits: int = 1
    sparse_masks: bool = False
    num_closids: int | None = None
    mb_domains: tuple[int, ...] = ()
    mb_unit: str | None = None  # "percent" | "absolute" | None (no MBA)
    bandwidth_gran: int = 1
    min_bandwidth: int = 0
    max_bandwidth: int = 100
    l3_resource: str = "L3"  # "L3", or "L3CODE" (first of the pair) with CDP
    cdp: bool = False  # code/data prioritisation: L3CODE and L3DATA lines instead of L3

    @property
    def l3_resources(self) -> tuple[str, ...]:
        """The schemata lines a cache mask goes to: ("L3",) or, with CDP, both halves."""
        return ("L3CODE", "L3DATA") if self.cdp else ("L3",)


def check_cbm(mask: int, info: ResctrlInfo, *, domain: int | None = None) -> int:
    """Validate a cache bit mask for this machine; return it."""
    where = f" for cache id {domain}" if domain is not None else ""
    if mask <= 0:
        raise ResctrlValueError(f"cache mask {mask:#x}{where} must have at least one bit")
    if info.cbm_mask is not None and mask & ~info.cbm_mask:
        raise ResctrlValueError(
            f"cache mask {mask:x}{where} has bits outside info/L3/cbm_mask {info.cbm_mask:x}"
        )
    if mask.bit_count() < info.min_cbm_bits:
        raise ResctrlValueError(
            f"cache mask {mask:x}{where} has {mask.bit_count()} bits; this machine needs at "
            f"least {info.min_cbm_bits} (info/L3/min_cbm_bits)"
        )
    if not is_contiguous(mask) and not info.sparse_masks:
        raise ResctrlValueError(
            f"cache mask {mask:x}{where} is not contiguous; this machine needs one run of set "
            "bits (no info/L3/sparse_masks)"
        )
    return mask


def is_contiguous(mask: int) -> bool:
    """One run of set bits (an empty mask is not)."""
    low = mask & -mask
    return mask > 0 and (mask + low) & mask == 0


def read_text(path: Path) -> str:
    return path.read_text(encoding="ascii", errors="replace").strip()


def _read_int(path: Path, default: int | None, base: int = 10) -> int | None:
    try:
        return int(read_text(path), base)
    except (OSError, ValueError):
        return default


def parse_schemata(text: str) -> dict[str, dict[int, str]]:
    """`L3:0=ff;1=ff` lines -> {"L3": {0: "ff", 1: "ff"}} (values kept as text)."""
    out: dict[str, dict[int, str]] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or ":" not in line:
            continue
        resource, _, body = line.partition(":")
        domains: dict[int, str] = {}
        for item in body.split(";"):
            item = item.strip()
            if not item:
                continue
            ident, sep, value = item.partition("=")
            if not sep:
                raise ResctrlError("schemata", f"malformed entry {item!r} in line {line!r}")
            domains[int(ident)] = value.strip()
        out[resource.strip()] = domains
    return out


def format_line(resource: str, values: Mapping[int, str]) -> str:
    return f"{resource}:" + ";".join(f"{d}={v}" for d, v in sorted(values.items()))


def read_info(root: Path, vendor: str | None) -> ResctrlInfo:
    """The machine facts under resctrl mount `root` (ResctrlError when nothing is mounted)."""
    schemata_file = root / "schemata"
    try:
        groups = parse_schemata(read_text(schemata_file))
    except FileNotFoundError:
        raise ResctrlError(
            os.fspath(root),
            "no resctrl filesystem here (mount -t resctrl resctrl /sys/fs/resctrl; needs "
            "RDT/PQoS support in CPU and kernel)",
            reason="resctrl_unavailable",
        ) from None
    except (OSError, ValueError) as err:
        raise ResctrlError(os.fspath(schemata_file), f"unreadable: {err}") from err
    cdp = "L3CODE" in groups and "L3" not in groups
    l3_resource = "L3CODE" if cdp else "L3"
    info_l3 = root / "info" / l3_resource
    info_mb = root / "info" / "MB"
    mb = groups.get("MB", {})
    unit: str | None = None
    max_bw = 100
    if mb:
        defaults = [int(v) for v in mb.values() if v.isdigit()]
        if vendor == "amd" or (vendor is None and any(v > 100 for v in defaults)):
            unit = "absolute"
            max_bw = max(defaults, default=2048)
        else:
            unit = "percent"
    return ResctrlInfo(
        l3_domains=tuple(sorted(groups.get(l3_resource, {}))),
        cbm_mask=_read_int(info_l3 / "cbm_mask", None, 16),
        min_cbm_bits=_read_int(info_l3 / "min_cbm_bits", 1) or 1,
        sparse_masks=bool(_read_int(info_l3 / "sparse_masks", 0)),
        num_closids=_read_int(info_l3 / "num_closids", None),
        mb_domains=tuple(sorted(mb)),
        mb_unit=unit,
        bandwidth_gran=_read_int(info_mb / "bandwidth_gran", 1) or 1,
        min_bandwidth=_read_int(info_mb / "min_bandwidth", 0) or 0,
        max_bandwidth=max_bw,
        l3_resource=l3_resource,
        cdp=cdp,
    )
