"""CPU burst of latency-sensitive members, one period at a time (`cpuBurst` of the policy).

For every LS member with a base quota (its CPU limit): `decide_burst` from its throttling
counter and how busy the shared pool is, then the quota and the burst allowance written in the
order the kernel takes them - the burst never above the quota in force, so a burst that fits
the current quota goes first and one that does not waits for the raised quota. A burst the
kernel refuses is reported once (a `refused` Note and a problem line) and not asked for again
until the wanted value changes. When the policy is turned off, or a member stops being LS, what
corepin had changed is put back: the base quota and no burst.
"""

from __future__ import annotations

from collections.abc import Sequence

from corepin.allocation.qos import BurstState, CpuBurst, decide_burst
from corepin.core.errors import CgroupError
from corepin.enforcement.cgroups import CpuQuota
from corepin.enforcement.note import Note
from corepin.enforcement.qos.cpu import CpuControl
from corepin.enforcement.qos.model import QosMember, QosReport, set_quota

__all__ = ["BurstKeeper"]


class BurstKeeper:
    """The burst state of every member between periods."""

    def __init__(self, cpu: CpuControl) -> None:
        self.cpu = cpu
        self._states: dict[str, BurstState] = {}
        self._refused: dict[str, int] = {}
        self._no_burst: set[str] = set()

    def period(
        self, members: Sequence[QosMember], rules: CpuBurst, share: float, report: QosReport
    ) -> None:
        """One period for `members`; `share` is the shared pool's busy percent."""
        present = {m.id for m in members}
        for gone in [k for k in self._states if k not in present]:
            del self._states[gone]
            self._refused.pop(gone, None)
        for member in members:
            base = member.base_quota
            if member.cgroup is None or base is None or base.quota_us is None:
                continue
            if rules.policy == "none" or member.qos_class != "LS":
                if self._states.pop(member.id, None) is not None:
                    self._refused.pop(member.id, None)
                    self._apply(member.cgroup, base, 0, report, member.id, "restored")
                continue
            try:
                counters = self.cpu.throttling(member.cgroup)
            except CgroupError as err:
                report.problems.append(f"{member.id}: {err.message}")
                continue
            if counters is None:
                report.problems.append(
                    f"{member.id}: no CPU throttling counters in {member.cgroup} (gone?); "
                    "burst skipped"
                )
                continue
            state = self._states.get(member.id, BurstState())
            decision = decide_burst(base.quota_us, state, counters.nr_throttled, share, rules)
            self._states[member.id] = decision.state
            quota = CpuQuota(decision.quota_us, base.period_us)
            self._apply(member.cgroup, quota, decision.burst_us, report, member.id, "resized")

    def _apply(
        self, group: str, quota: CpuQuota, burst: int, report: QosReport, key: str, action: str
    ) -> None:
        try:
            current = self.cpu.read_quota(group)
            held = self.cpu.read_burst_us(group)
        except CgroupError as err:
            report.problems.append(f"{key}: {err.message}")
            return
        if current is None:
            report.problems.append(f"{key}: {group} is gone; burst skipped")
            return
        if held is None and burst and group not in self._no_burst:
            self._no_burst.add(group)
            report.problems.append(
                f"{key}: the kernel has no CPU burst for {group} (Linux 5.14 or later): "
                "only the quota is managed"
            )
        burst_first = held is not None and (current.quota_us is None or burst <= current.quota_us)
        for step in ("burst", "quota") if burst_first else ("quota", "burst"):
            if step == "quota":
                if not quota.satisfied_by(current) and set_quota(
                    self.cpu, group, quota, action, f"CPU burst of {key}", report
                ):
                    report.burst_changes += 1
            elif held is not None and held != burst and self._refused.get(key) != burst:
                self._write_burst(group, held, burst, report, key, action)

    def _write_burst(
        self, group: str, old: int, burst: int, report: QosReport, key: str, action: str
    ) -> None:
        name = self.cpu.burst_file
        try:
            got = self.cpu.write_burst_us(group, burst)
        except CgroupError as err:
            report.problems.append(f"{key}: {name} {burst} not written: {err.message}")
            return
        if got != old:
            report.changes.append(
                Note(action, group, f"{name} {old} -> {got} (CPU burst of {key})")
            )
            report.burst_changes += 1
        if got == burst:
            self._refused.pop(key, None)
            return
        self._refused[key] = burst
        report.changes.append(
            Note("refused", group, f"{name} {burst}: the kernel holds {got} (CPU burst of {key})")
        )
        report.problems.append(f"{key}: the kernel holds {name} {got}, not {burst}")
