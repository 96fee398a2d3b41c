"""resctrl monitoring: LLC occupancy and memory bandwidth counters of a group, per cache id.

A control group (or the root) has `mon_data/mon_L3_<id>/` with `llc_occupancy` (bytes of L3 the
group's tasks hold now), `mbm_total_bytes` and `mbm_local_bytes` (bytes moved since the RMID was
allocated; counters that only grow). A monitoring group under `<group>/mon_groups/<name>` has
the same layout. The kernel prints `Unavailable` (no RMID data yet, or the domain is offline)
or `Error` instead of a number; those, and a file a CPU does not offer, read as None.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from corepin.core.ids import validate_component
from corepin.enforcement.resctrl.model import ResctrlError

__all__ = ["MonSample", "read_monitoring"]

_PREFIX = "mon_L3_"


@dataclass(frozen=True, slots=True)
class MonSample:
    """One cache id's counters of a group (None: not offered, unavailable or an error)."""

    cache_id: int
    llc_occupancy: int | None
    mbm_total_bytes: int | None
    mbm_local_bytes: int | None


def _value(path: Path) -> int | None:
    try:
        text = path.read_text(encoding="ascii", errors="replace").strip()
    except OSError:
        return None
    try:
        return int(text)
    except ValueError:
        return None  # "Unavailable", "Error"


def read_monitoring(
    root: Path, group: str | None = None, mon_group: str | None = None
) -> dict[int, MonSample]:
    """Counters per L3 cache id of `group` (None: the root group), or of its monitoring group
    `mon_group`. ResctrlError when the group has no `mon_data` (no monitoring, or no group)."""
    base = Path(root)
    if group is not None:
        validate_component(group, "resctrl class name")
        base = base / group
    if mon_group is not None:
        validate_component(mon_group, "resctrl monitoring group name")
        base = base / "mon_groups" / mon_group
    data = base / "mon_data"
    try:
        with os.scandir(data) as entries:
            names = [e.name for e in entries if e.name.startswith(_PREFIX)]
    except FileNotFoundError:
        raise ResctrlError(
            os.fspath(data),
            "no monitoring data (no such group, or resctrl monitoring is not available)",
            reason="resctrl_no_monitoring",
        ) from None
    except OSError as err:
        raise ResctrlError(os.fspath(data), f"unreadable: {err.strerror or err}") from err
    out: dict[int, MonSample] = {}
    for name in names:
        suffix = name.removeprefix(_PREFIX)
        if not suffix.isdigit():
            continue
        cache_id = int(suffix)
        folder = data / name
        out[cache_id] = MonSample(
            cache_id=cache_id,
            llc_occupancy=_value(folder / "llc_occupancy"),
            mbm_total_bytes=_value(folder / "mbm_total_bytes"),
            mbm_local_bytes=_value(folder / "mbm_local_bytes"),
        )
    return dict(sorted(out.items()))
