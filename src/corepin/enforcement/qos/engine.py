"""The node QoS loop: one `QosEngine.period` measures, decides (`corepin.allocation.qos`) and
writes.

Each period:

1. measure: every member's CPU time (its cgroup's accounting, or its processes' times in
   /proc when it has no cgroup), the BE group's, and the node's busy time (/proc/stat); the
   usage of a class is the growth since the last period over the clock's elapsed time, in CPUs;
   system use is the node's less every member's (SYSTEM members count as system). The first
   period only primes: it suppresses nothing beyond what the policy forces (the BE set keeps
   no exclusive, reserved or LSR CPU);
2. best-effort suppression (`beSuppress`): the budget `be_budget`; policy `cpuset` writes
   `next_be_cpus` of the candidates (the shared pool without exclusive, reserved and LSR CPUs,
   and without CPUs the BE group's parent does not have: a cpuset partition elsewhere may have
   taken them, and a v2 group left with none of its own falls back to every CPU of its parent)
   to the BE group and every group below it (`besteffort`), policy `cfsQuota` writes
   `be_quota_us` as the BE group's quota (at the group's period); what a policy no longer in
   force had changed is put back: each group's cpuset.cpus as it was less the exclusive CPUs
   (v2: an empty, inheriting one empty again, or - when the kernel refuses because the group
   holds tasks - the CPUs it then had), the quota there was before;
3. `beCPUIdle`: the BE group's `cpu.idle` (where the kernel has it) 1, and back to 0 when off;
4. CPU burst (`cpuBurst`) of LS members with a base quota (`decide_burst`, the shared pool's
   busy share being its use over its size); put back (base quota, no burst) when off;
5. resctrl: the classes applied when the policy's changed, every thread of every member
   assigned to its class's group.

Every write is one `Note` in the report; values are read first and written only when they
differ, so a period in which nothing changed writes nothing. A group that vanished mid-period
is a problem line of the report, never an exception.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Final

from corepin.allocation.qos import (
    ClassPolicy,
    QosPolicy,
    be_budget,
    be_quota_us,
    next_be_cpus,
)
from corepin.core.cpuset import CPUSet
from corepin.core.errors import CgroupError, CorepinError
from corepin.enforcement.cgroups import DEFAULT_PERIOD_US, CgroupDriver, CpuQuota
from corepin.enforcement.note import Note
from corepin.enforcement.qos.besteffort import read_tree, write_tree
from corepin.enforcement.qos.burst import BurstKeeper
from corepin.enforcement.qos.cpu import CpuControl, node_busy_ns
from corepin.enforcement.qos.model import QosMember, QosNode, QosReport, ResctrlPort, set_quota

__all__ = ["QosEngine", "QosMember", "QosNode", "QosReport", "ResctrlPort"]

#: Note actions that are not writes
NOT_WRITES: Final = frozenset({"refused", "failed", "left"})
LS_CLASSES: Final = ("LSE", "LSR", "LS")


def _proc_times_ns(pids: Iterable[int], proc_root: str, hz: int) -> int | None:
    """utime + stime of the processes (all their threads), ns; None when none is there."""
    total, seen = 0, False
    for pid in pids:
        try:
            with open(os.path.join(proc_root, str(pid), "stat"), encoding="ascii") as handle:
                text = handle.read()
        except (OSError, UnicodeDecodeError):
            continue
        fields = text[text.rfind(")") + 2 :].split()
        try:
            total += int(fields[11]) + int(fields[12])
        except (IndexError, ValueError):
            continue
        seen = True
    return total * 1_000_000_000 // hz if seen else None


def _threads(pids: Iterable[int], proc_root: str) -> list[int]:
    out: list[int] = []
    for pid in pids:
        try:
            names = os.listdir(os.path.join(proc_root, str(pid), "task"))
        except OSError:
            continue
        out.extend(int(n) for n in names if n.isdigit())
    return out


class QosEngine:
    """The node QoS loop's state and its `period` (see the module docstring). `cpu` reads and
    writes the cpu controller's files, `cpuset` the cpuset hierarchy (None: not managed)."""

    def __init__(
        self,
        cpu: CpuControl,
        cpuset: CgroupDriver | None,
        *,
        resctrl: ResctrlPort | None = None,
        proc_root: str = "/proc",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cpu = cpu
        self.cpuset = cpuset
        self.resctrl = resctrl
        self.proc_root = proc_root
        self.clock = clock
        self._hz = os.sysconf("SC_CLK_TCK")
        self._last_time: float | None = None
        self._last_busy: int | None = None
        self._last_usage: dict[str, int] = {}
        self._be_cpus: CPUSet | None = None
        #: the BE groups whose cpuset corepin changed: their cpuset.cpus and effective CPUs
        #: before (v2: an empty cpuset.cpus inherits)
        self._cpuset_changed: dict[str, tuple[CPUSet, CPUSet]] = {}
        self._be_group_seen: str | None = None
        self._saved_quota: CpuQuota | None = None
        self._be_quota: int | None = None
        self._idle_set = False
        self._bursts = BurstKeeper(cpu)
        self._classes: dict[str, ClassPolicy] | None = None
        self._said: set[str] = set()

    @property
    def be_cpus(self) -> CPUSet | None:
        """The BE CPU set in force (policy cpuset), None when BE is not held to one."""
        return self._be_cpus

    def adopt_be_group(self, group: str, fallback: CPUSet) -> None:
        """Say that `group`, the BE group, is one corepin made and only this loop writes (host
        mode): its cpuset.cpus was empty (v2; v1: `fallback`), its quota unlimited and its
        cpu.idle 0, so a policy no longer in force puts those back even when an earlier engine
        (an earlier `corepin reconcile --once`) changed them. `fallback`: the CPUs its cpuset
        gets where the kernel refuses the empty value (tasks below it). Nothing is written
        when the group holds those values already."""
        if group != self._be_group_seen:
            self._forget_be_group()
            self._be_group_seen = group
        driver = self.cpuset
        if driver is not None:
            original = CPUSet() if driver.version == 2 else fallback
            self._cpuset_changed.setdefault(group, (original, fallback))
        if self._saved_quota is None:
            self._saved_quota = CpuQuota(None, None)
        self._idle_set = True

    # ------------------------------------------------------------------ the period
    def period(self, members: Sequence[QosMember], node: QosNode, policy: QosPolicy) -> QosReport:
        """One period (see the module docstring)."""
        self.cpu.begin_period()
        try:
            return self._period(members, node, policy)
        finally:
            self.cpu.end_period()

    def _period(self, members: Sequence[QosMember], node: QosNode, policy: QosPolicy) -> QosReport:
        report = QosReport()
        usage = self._measure(members, node, report)
        budget: float | None = None
        if usage:
            report.usage = usage
            budget = be_budget(
                len(node.online),
                policy.be_suppress.slo_percent,
                sum(usage[c] for c in LS_CLASSES),
                usage["SYSTEM"],
                len(node.reserved),
            )
        candidates = node.shared_pool - node.exclusive - node.reserved - node.lsr
        if node.be_group is not None and self.cpuset is not None:
            # CPUs the BE group's parent lacks (a partition took them) cannot be BE's: a v2
            # group given only such CPUs would run on every CPU of its parent instead
            room = self._effective(self.cpuset, node.be_group.rpartition("/")[0])
            candidates = candidates & room if room else candidates
        if node.be_group is not None and node.be_group != self._be_group_seen:
            self._forget_be_group()
            self._be_group_seen = node.be_group
        self._suppress_cpuset(node, policy, budget, candidates, report)
        self._suppress_quota(node, policy, budget, report)
        if policy.be_suppress.policy != "off" and node.be_group is not None:
            report.be_budget = budget
        report.be_cpus = self._be_cpus
        report.be_quota_us = self._be_quota
        self._idle(node, policy, report)
        share = 0.0
        if usage and node.shared_pool:
            share = 100 * max(0.0, usage["node"] - usage["LSE"]) / len(node.shared_pool)
        self._bursts.period(members, policy.cpu_burst, share, report)
        self._resctrl(members, policy, report)
        report.writes = sum(1 for n in report.changes if n.action not in NOT_WRITES)
        return report

    def _say_once(self, key: str, text: str, report: QosReport) -> None:
        if key not in self._said:
            self._said.add(key)
            report.problems.append(text)

    # ------------------------------------------------------------------ measuring
    def _member_ns(self, member: QosMember) -> int | None:
        if member.cgroup is not None:
            ns = self.cpu.usage_ns(member.cgroup)
            if ns is not None or not self._exists(member.cgroup):
                return ns
            # a group without accounting (v1 with cpuacct mounted apart and no group there):
            # the times of its processes
            try:
                pids: Iterable[int] = self._driver.procs(member.cgroup)
            except CgroupError:
                return None
            return _proc_times_ns(pids, self.proc_root, self._hz) or 0
        if member.pids:
            return _proc_times_ns(member.pids, self.proc_root, self._hz)
        return None

    @property
    def _driver(self) -> CgroupDriver:
        return self.cpuset if self.cpuset is not None else self.cpu.driver

    def _exists(self, path: str) -> bool:
        return self._driver.exists(path)

    def _measure(
        self, members: Sequence[QosMember], node: QosNode, report: QosReport
    ) -> dict[str, float]:
        now = self.clock()
        try:
            busy: int | None = node_busy_ns(self.proc_root)
        except CorepinError as err:
            report.problems.append(f"node CPU time: {err}")
            busy = None
        samples: dict[str, int] = {}
        for member in members:
            ns = self._member_ns(member)
            if ns is None:
                if member.cgroup is not None or member.pids:
                    where = member.cgroup or f"processes {' '.join(map(str, member.pids))}"
                    report.problems.append(f"{member.id}: {where} is gone; skipped")
                continue
            samples[member.id] = ns
        be_ns = self.cpu.usage_ns(node.be_group) if node.be_group is not None else None
        if be_ns is not None:
            samples["\0be"] = be_ns
        last_time, last_busy, last = self._last_time, self._last_busy, self._last_usage
        self._last_time, self._last_busy, self._last_usage = now, busy, samples
        if last_time is None or busy is None or last_busy is None or now <= last_time:
            return {}
        elapsed_ns = (now - last_time) * 1e9

        def rate(key: str) -> float:
            if key not in samples or key not in last:
                return 0.0
            return max(0, samples[key] - last[key]) / elapsed_ns

        usage = {name: 0.0 for name in ("LSE", "LSR", "LS", "BE", "SYSTEM")}
        for member in members:
            if member.id in samples:
                usage[member.qos_class] = usage.get(member.qos_class, 0.0) + rate(member.id)
        usage["BE"] = max(usage["BE"], rate("\0be"))
        node_used = max(0, busy - last_busy) / elapsed_ns
        managed = sum(usage.values())
        usage["SYSTEM"] += max(0.0, node_used - managed)
        usage["node"] = node_used
        return usage

    # ------------------------------------------------------------------ BE cpuset
    def _forget_be_group(self) -> None:
        self._be_cpus = None
        self._cpuset_changed.clear()
        self._saved_quota = None
        self._be_quota = None
        self._idle_set = False

    def _suppress_cpuset(
        self,
        node: QosNode,
        policy: QosPolicy,
        budget: float | None,
        candidates: CPUSet,
        report: QosReport,
    ) -> None:
        group = node.be_group
        active = policy.be_suppress.policy == "cpuset" and group is not None
        driver = self.cpuset
        if driver is None:
            if active:
                self._say_once(
                    "no-cpuset", "BE cpuset suppression: no cpuset hierarchy is managed", report
                )
            return
        if not active or group is None:
            if self._cpuset_changed and self._be_group_seen is not None:
                self._restore_cpuset(driver, self._be_group_seen, node, candidates, report)
            self._be_cpus = None
            return
        if not candidates:
            report.problems.append(f"{group}: no CPU is left for best-effort work")
            return
        tree = read_tree(driver, group)
        if tree is None:
            report.problems.append(f"{group}: the BE group is not there; nothing suppressed")
            return
        current = self._be_cpus
        if current is None:
            current = tree[group] or self._effective(driver, group) or candidates
        total, least = len(node.online), policy.be_suppress.min_cpus
        if budget is None:  # priming: only what the policy forces
            kept = current & candidates
            wanted = next_be_cpus(kept, len(kept), candidates, total, least)
        else:
            wanted = next_be_cpus(current, budget, candidates, total, least)
        why = "BE budget" if budget is None else f"BE budget {budget:.2f} CPUs"
        action = "restricted" if not wanted >= current else "resized"
        for path, cpus in tree.items():
            if cpus != wanted and path not in self._cpuset_changed:
                self._cpuset_changed[path] = (cpus, self._effective(driver, path))
        done = write_tree(driver, tree, dict.fromkeys(tree, wanted), action=action, why=why)
        report.changes.extend(done.notes)
        report.problems.extend(done.problems)
        self._be_cpus = wanted

    def _effective(self, driver: CgroupDriver, group: str) -> CPUSet:
        try:
            return driver.effective_cpus(group)
        except (CgroupError, NotImplementedError):
            return CPUSet()

    def _restore_cpuset(
        self,
        driver: CgroupDriver,
        group: str,
        node: QosNode,
        candidates: CPUSet,
        report: QosReport,
    ) -> None:
        """Put back in the groups corepin narrowed the cpuset.cpus they had, less the CPUs
        now exclusive (the candidates when nothing is left). v2 groups that were empty,
        inheriting, get their empty value back where the kernel takes it: not while they hold
        tasks, where they get the CPUs they had then (less the exclusive ones)."""
        tree = read_tree(driver, group)
        if tree is not None and candidates:
            allowed = node.online - node.exclusive
            wanted: dict[str, CPUSet] = {}
            fallback: dict[str, CPUSet] = {}
            for path in tree:
                if path not in self._cpuset_changed:
                    continue
                before, effective = self._cpuset_changed[path]
                if driver.version == 2 and not before:
                    wanted[path] = CPUSet()
                    fallback[path] = (effective & allowed) or candidates
                else:
                    wanted[path] = (before & allowed) or candidates
            done = write_tree(
                driver,
                tree,
                wanted,
                action="restored",
                why="BE suppression off",
                fallback=fallback,
            )
            report.changes.extend(done.notes)
            report.problems.extend(done.problems)
        self._cpuset_changed.clear()

    # ------------------------------------------------------------------ BE quota
    def _suppress_quota(
        self, node: QosNode, policy: QosPolicy, budget: float | None, report: QosReport
    ) -> None:
        group = node.be_group
        active = policy.be_suppress.policy == "cfsQuota" and group is not None
        if not active or group is None:
            saved, self._saved_quota, self._be_quota = self._saved_quota, None, None
            if saved is not None and self._be_group_seen is not None:
                set_quota(self.cpu, self._be_group_seen, saved, "restored", "BE quota off", report)
            return
        if budget is None:
            return
        current = self._read_quota(group, report)
        if current is None:
            return
        want = be_quota_us(budget, current.period_us or DEFAULT_PERIOD_US)
        if self._saved_quota is None:
            self._saved_quota = CpuQuota(current.quota_us, None)
        if current.quota_us != want:
            why = f"BE budget {budget:.2f} CPUs"
            if not set_quota(self.cpu, group, CpuQuota(want, None), "restricted", why, report):
                return
        self._be_quota = want

    def _read_quota(self, group: str, report: QosReport) -> CpuQuota | None:
        try:
            quota = self.cpu.read_quota(group)
        except CgroupError as err:
            report.problems.append(f"{group}: cannot read the CPU quota: {err.message}")
            return None
        if quota is None:
            report.problems.append(
                f"{group}: no CPU quota to manage (group gone, or no cpu controller)"
            )
        return quota

    # ------------------------------------------------------------------ cpu.idle
    def _idle(self, node: QosNode, policy: QosPolicy, report: QosReport) -> None:
        group = node.be_group or self._be_group_seen
        want = policy.be_cpu_idle and node.be_group is not None
        if group is None or (not want and not self._idle_set):
            return
        try:
            now = self.cpu.read_idle(group)
            if now is None:
                if want:
                    self._say_once(
                        f"idle:{group}",
                        f"{group}: no cpu.idle (it needs Linux 5.15 or later and, on cgroup "
                        "v2, the cpu controller enabled for the group): beCPUIdle is not "
                        "applied",
                        report,
                    )
                return
            if now == want:
                self._idle_set = want
                return
            if self.cpu.set_idle(group, want):
                report.changes.append(
                    Note("restricted" if want else "restored", group, f"cpu.idle {int(want)}")
                )
                self._idle_set = want
            else:
                report.problems.append(f"{group}: the kernel refused cpu.idle {int(want)}")
        except CgroupError as err:
            report.problems.append(f"{group}: cpu.idle not written: {err.message}")

    # ------------------------------------------------------------------ resctrl
    def _resctrl(self, members: Sequence[QosMember], policy: QosPolicy, report: QosReport) -> None:
        if self.resctrl is None:
            return
        classes = dict(policy.classes)
        try:
            if classes != self._classes:
                report.changes.extend(self.resctrl.apply(classes))
                self._classes = classes
        except CorepinError as err:
            report.problems.append(f"resctrl classes not applied: {err}")
            return
        by_class: dict[str, list[int]] = {}
        for member in members:
            by_class.setdefault(member.qos_class, []).extend(self._member_threads(member))
        for qos_class, tids in by_class.items():
            try:
                report.changes.extend(self.resctrl.assign(qos_class, tids))
            except CorepinError as err:
                report.problems.append(f"resctrl {qos_class}: threads not assigned: {err}")

    def _member_threads(self, member: QosMember) -> list[int]:
        """Every thread of `member`: its cgroup's thread list (one read: v1 `tasks`, v2
        `cgroup.threads`), else the threads of its cgroup's or its own processes."""
        pids: Iterable[int] = member.pids
        if member.cgroup is not None and self._driver is not None:
            name = "tasks" if self._driver.version == 1 else "cgroup.threads"
            try:
                return [int(tid) for tid in self._driver.read_file(member.cgroup, name).split()]
            except (CgroupError, ValueError):
                pass
            try:
                pids = self._driver.procs(member.cgroup)
            except CgroupError:
                pids = member.pids
        return _threads(pids, self.proc_root)
