"""What the node QoS loop takes and gives: members, the node, the report of a period, and the
shape of the resctrl classes it drives (`corepin.enforcement.resctrl.classes` has them)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Protocol

from corepin.allocation.qos import ClassPolicy
from corepin.core.cpuset import CPUSet
from corepin.core.errors import CgroupError
from corepin.core.record import field, record
from corepin.enforcement.cgroups import CpuQuota
from corepin.enforcement.note import Note
from corepin.enforcement.qos.cpu import CpuControl

__all__ = ["QosMember", "QosNode", "QosReport", "ResctrlPort", "set_quota"]


class ResctrlPort(Protocol):
    """What the engine needs of resctrl classes (`corepin.enforcement.resctrl.classes`)."""

    def apply(self, policies: Mapping[str, ClassPolicy]) -> list[Note]: ...

    def assign(self, qos_class: str, tids: Iterable[int]) -> list[Note]: ...


@record
class QosMember:
    """One managed workload: its class, its cgroup (relative path; None when it has none),
    its processes (used when it has no cgroup) and its CFS limit (`base_quota`, for burst)."""

    id: str
    qos_class: str
    cgroup: str | None
    pids: tuple[int, ...] = ()
    base_quota: CpuQuota | None = None


@record
class QosNode:
    """The node as the loop sees it: online CPUs, the reserved, exclusive and LSR ones, the
    shared pool, and the cgroup holding best-effort work (None: no BE group)."""

    online: CPUSet
    reserved: CPUSet
    exclusive: CPUSet
    lsr: CPUSet
    shared_pool: CPUSet
    be_group: str | None


@record(frozen=False)
class QosReport:
    """What one period did and saw."""

    changes: list[Note] = field(default_factory=list)
    be_budget: float | None = None
    be_cpus: CPUSet | None = None
    be_quota_us: int | None = None
    writes: int = 0
    burst_changes: int = 0
    #: CPUs used per class (LSE, LSR, LS, BE, SYSTEM) and by the whole `node`; empty while
    #: the loop primes
    usage: dict[str, float] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


def set_quota(
    cpu: CpuControl, group: str, quota: CpuQuota, action: str, why: str, report: QosReport
) -> bool:
    """Give `group` the CFS `quota` unless it has it; one Note for a write, a problem line
    when it cannot be written. True when the group holds it afterwards."""
    try:
        current = cpu.read_quota(group)
        if current is not None and quota.satisfied_by(current):
            return True
        cpu.write_quota(group, quota)
    except CgroupError as err:
        report.problems.append(f"{group}: CPU quota {quota} not written: {err.message}")
        return False
    old = "?" if current is None else str(current)
    report.changes.append(Note(action, group, f"CPU quota {old} -> {quota} ({why})"))
    return True
