"""Node QoS, the pure part: classes, the policy, the best-effort budget and CPU burst rules.

- the QoS classes (LSE, LSR, LS, BE, SYSTEM) and how a workload gets one (`corepin.core.qos`,
  re-exported here);
- `policy`: the node QoS policy (per class resctrl shares, best-effort suppression, CPU burst,
  `beCPUIdle`) parsed from a file's or a ConfigMap's data, refusing bad values by field name;
- `suppress`: how many CPUs best-effort work may use, and which;
- `burst`: the burst allowance and the `auto` quota steps of one container.

No I/O and no clock here: `corepin.enforcement.qos` measures and writes, the rooms decide when.
"""

from __future__ import annotations

from corepin.allocation.qos.burst import (
    BurstDecision,
    BurstState,
    auto_step,
    burst_us_for,
    decide_burst,
)
from corepin.allocation.qos.policy import (
    BE_SUPPRESS_POLICIES,
    BURST_POLICIES,
    BeSuppress,
    ClassPolicy,
    CpuBurst,
    QosPolicy,
    default_class_policies,
    parse_class_policies,
    parse_policy,
    parse_policy_text,
)
from corepin.allocation.qos.suppress import be_budget, be_quota_us, grow_step, next_be_cpus
from corepin.core.qos import (
    CLASSES,
    KOORDINATOR_CLASSES,
    check_class,
    class_of,
)

__all__ = [
    "BE_SUPPRESS_POLICIES",
    "BURST_POLICIES",
    "CLASSES",
    "KOORDINATOR_CLASSES",
    "BeSuppress",
    "BurstDecision",
    "BurstState",
    "ClassPolicy",
    "CpuBurst",
    "QosPolicy",
    "auto_step",
    "be_budget",
    "be_quota_us",
    "burst_us_for",
    "check_class",
    "class_of",
    "decide_burst",
    "default_class_policies",
    "grow_step",
    "next_be_cpus",
    "parse_class_policies",
    "parse_policy",
    "parse_policy_text",
]
