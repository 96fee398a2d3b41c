"""The shield in affinity mode, where no cpuset controller is usable: the tasks of the scope
(by /proc/PID/cgroup) get their CPU affinity confined to the system set instead of being
moved. They could widen it again; `reconcile` puts it back. Every thread is pinned through the
one thread-affinity seam (`corepin.enforcement.affinity.pin_threads`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from corepin.core.cpuset import CPUSet
from corepin.core.errors import SysfsError
from corepin.enforcement.affinity import (
    AffinityError,
    AffinityResult,
    ThreadAffinity,
    pin_threads,
)
from corepin.enforcement.note import Note
from corepin.enforcement.shield.result import ShieldResult, must
from corepin.enforcement.shield.scope import confine, in_scope
from corepin.state.shield import SavedAffinity, ShieldRecord, merge_saved
from corepin.sysfs.procfs import ProcessGone, ProcStat, cgroup_of, read_cgroup, read_stat

__all__ = ["AffinityMode"]


class AffinityMode:
    """Confines and restores the affinity of the tasks of a scope under `proc_root`.

    `membership` says which /proc/PID/cgroup entry names a task's group: "cpuset" for a v1
    cpuset hierarchy, None for the v2 unified one."""

    def __init__(self, proc_root: str, affinity: ThreadAffinity, membership: str | None) -> None:
        self.proc_root = proc_root
        self.affinity = affinity
        self.membership = membership

    def scope_members(self, record: ShieldRecord, table: dict[int, ProcStat]) -> list[int]:
        """Affinity mode: the processes whose group (/proc/PID/cgroup) is the scope or below
        it, outside the excluded groups."""
        out = []
        for pid in table:
            try:
                path = cgroup_of(read_cgroup(pid, self.proc_root), self.membership)
            except (ProcessGone, SysfsError):
                continue
            if path is not None and in_scope(record, path):
                out.append(pid)
        return out

    def reconcile(
        self,
        result: ShieldResult,
        system: CPUSet,
        managed: Mapping[int, CPUSet],
        table: dict[int, ProcStat],
    ) -> None:
        """Confine every unmanaged task of the scope (every thread) to the system set from the
        affinity it had before the shield (recorded the first time it is seen)."""
        record = must(result.record)
        saved = {(t.pid, t.start_time): t for t in record.tasks}
        found: list[SavedAffinity] = []
        pinned = 0
        for pid in self.scope_members(record, table):
            st = table[pid]
            if not st.alive or st.kernel_thread or pid in managed:
                continue
            key = (pid, st.start_time)
            entry = saved.get(key)
            try:
                if entry is None:
                    entry = SavedAffinity(pid, st.start_time, self.affinity.get(pid, pid))
            except ProcessGone:
                continue
            found.append(entry)
            walk = AffinityResult()
            try:
                pin_threads(self.affinity, pid, st.start_time, confine(entry.cpus, system), walk)
            except AffinityError as exc:
                result.notes.append(Note("refused", f"pid {pid}", str(exc)))
                continue
            pinned += walk.writes
        if pinned:
            result.notes.append(
                Note("pinned", "tasks", f"{pinned} thread(s) confined to CPUs {system}")
            )
        result.record = record.evolve(tasks=merge_saved(found, ()))

    def restore(
        self, saved: Iterable[SavedAffinity], system: CPUSet, notes: list[Note]
    ) -> tuple[SavedAffinity, ...]:
        """Put back the saved affinity of every thread of these tasks (or kernel threads) that
        still has the one the shield gave it; a thread changed since keeps what it has (noted).
        The entries that could not be put back, for another try."""
        left = []
        restored = 0
        for entry in saved:
            try:
                if read_stat(entry.pid, self.proc_root).start_time != entry.start_time:
                    continue
                shielded = confine(entry.cpus, system)
                for tid in self.affinity.threads(entry.pid):
                    try:
                        now = self.affinity.get(entry.pid, tid)
                        if now == entry.cpus:
                            continue
                        if now != shielded:
                            notes.append(
                                Note(
                                    "left",
                                    f"pid {entry.pid} tid {tid}",
                                    f"affinity changed since (CPUs {now}): kept",
                                )
                            )
                            continue
                        self.affinity.set(entry.pid, tid, entry.cpus)
                        restored += 1
                    except ProcessGone:
                        continue
            except ProcessGone:
                continue
            except AffinityError as exc:
                notes.append(Note("failed", f"pid {entry.pid}", str(exc)))
                left.append(entry)
        if restored:
            notes.append(Note("restored", "affinity", f"{restored} thread(s)"))
        return tuple(left)
