"""Node QoS on cgroups: measure CPU use, squeeze best-effort work, let throttled services burst.

- `cpu`: `CpuControl`, the accounting and QoS files of the cpu controller on cgroup v1 and v2
  (usage, throttling, burst, `cpu.idle`), and `node_busy_ns` from /proc/stat;
- `besteffort`: one CPU set written to the best-effort group and every group below it, in the
  order each cgroup version takes;
- `burst`: CPU burst of LS members (quota and burst allowance in the order the kernel takes);
- `model`: what the loop takes and gives (`QosMember`, `QosNode`, `QosReport`, `ResctrlPort`);
- `engine`: `QosEngine`, one period of the loop (measure, suppress, burst, resctrl tasks).

The rules (budgets, sets, burst steps) are `corepin.allocation.qos`; the rooms (host mode,
the node agent) decide when a period runs and with which members.
"""

from __future__ import annotations

from corepin.enforcement.qos.cpu import CpuControl, Throttling, find_cpuacct_root, node_busy_ns
from corepin.enforcement.qos.engine import (
    QosEngine,
    QosMember,
    QosNode,
    QosReport,
    ResctrlPort,
)

__all__ = [
    "CpuControl",
    "QosEngine",
    "QosMember",
    "QosNode",
    "QosReport",
    "ResctrlPort",
    "Throttling",
    "find_cpuacct_root",
    "node_busy_ns",
]
