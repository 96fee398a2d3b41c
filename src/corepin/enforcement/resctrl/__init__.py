"""resctrl: L3 cache allocation (CAT), memory bandwidth allocation (MBA) and monitoring.

A class is a directory in the resctrl filesystem (root parameter, normally /sys/fs/resctrl) with
a `schemata` file and a `tasks` file. Lines of `schemata` look like

    L3:0=fffff;1=fffff        cache bit masks per L3 cache id (hex)
    L3CODE:0=fffff            with code/data prioritisation (CDP): a code and a data line
    L3DATA:0=fffff
    MB:0=100;1=100            memory bandwidth per domain

Memory bandwidth comes in two units:
- percent (Intel MBA): `info/MB/min_bandwidth` .. 100 in steps of `info/MB/bandwidth_gran`; the
  kernel rounds a value up to the granularity, so corepin writes the rounded value;
- absolute (AMD, and Intel mounted with `mba_MBps`): AMD counts in 1/8 GB/s units up to the
  root group's default (2048 on current parts); `mba_MBps` in MB/s.
The unit comes from `vendor` ("intel"/"amd", or read from /proc/cpuinfo) when known, else from
the root group's default MB values (anything above 100 is absolute).

Domain ids are whatever the machine exposes (0,2,4 on some parts); they are read from the root
group's schemata and never assumed contiguous. A bit mask must be non-zero, within
`info/L3/cbm_mask`, have at least `info/L3/min_cbm_bits` bits, and be contiguous unless
`info/L3/sparse_masks` is 1.

Idempotent like the cgroup drivers: read the class's schemata, write only the domains that
differ; tasks already in the class are not written again. Every write is reported as a
`corepin.enforcement.note.Change` (`mkdir`, `schemata`, `tasks`).

Modules: `model` (errors, machine facts, schemata text), `percent` (the QoS policy's percent
interface -> masks and bandwidth values), `writer` (`ResctrlWriter` and its filesystem seam),
`monitor` (LLC occupancy and bandwidth counters), `classes` (`ResctrlClasses`: one group per
QoS class, its tasks, what it holds; `open_resctrl`).
"""

from __future__ import annotations

from corepin.enforcement.resctrl.classes import (
    ClassView,
    ResctrlClasses,
    ResctrlSamples,
    cgroup_threads,
    group_name,
    is_default,
    open_resctrl,
    threads_of,
)
from corepin.enforcement.resctrl.model import (
    ResctrlError,
    ResctrlInfo,
    ResctrlValueError,
    check_cbm,
    format_line,
    parse_schemata,
)
from corepin.enforcement.resctrl.monitor import MonSample, read_monitoring
from corepin.enforcement.resctrl.percent import (
    cbm_for_percent,
    class_schemata,
    mba_for_percent,
    read_cpu_vendor,
)
from corepin.enforcement.resctrl.writer import KernelFs, ResctrlFs, ResctrlWriter

__all__ = [
    "ClassView",
    "KernelFs",
    "MonSample",
    "ResctrlClasses",
    "ResctrlError",
    "ResctrlFs",
    "ResctrlInfo",
    "ResctrlSamples",
    "ResctrlValueError",
    "ResctrlWriter",
    "cbm_for_percent",
    "cgroup_threads",
    "check_cbm",
    "class_schemata",
    "format_line",
    "group_name",
    "is_default",
    "mba_for_percent",
    "open_resctrl",
    "parse_schemata",
    "read_cpu_vendor",
    "read_monitoring",
    "threads_of",
]
