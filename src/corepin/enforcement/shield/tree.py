"""The cpuset hierarchy and the proc tree as the shield sees them.

`ShieldTree` answers what the shield's two cpuset collaborators (`cpuset_mode`: raise and keep;
`cpuset_restore`: take down) both ask - which groups lie below the scope and which of them are
partitions, who is in a group, whether a task is still the one recorded, where a process sits -
and does the small writes both make: move a task, enable `cpuset` in a v2 subtree, make the
shield's groups, remove them, write v1 groups' CPUs in the order the kernel takes them.
"""

from __future__ import annotations

import os
import time
from typing import Final

from corepin.core.cpuset import CPUSet
from corepin.core.errors import CgroupError, CorepinError, SysfsError
from corepin.core.ids import split_cgroup_path
from corepin.enforcement.cgroups import CgroupDriver
from corepin.enforcement.note import Note
from corepin.enforcement.reconcile import CgroupTarget, Reconciler
from corepin.enforcement.shield.scope import excluded
from corepin.state.shield import ShieldRecord
from corepin.sysfs.procfs import (
    ProcessGone,
    ProcStat,
    cgroup_of,
    process_table,
    read_cgroup,
    read_stat,
    read_status,
)

__all__ = ["RMDIR_ATTEMPTS", "ShieldTree"]

#: How often `off` retries removing a group the kernel still counts exiting tasks in.
RMDIR_ATTEMPTS: Final = 40


class ShieldTree:
    """One cpuset hierarchy (`driver`, None in affinity mode) and one proc tree."""

    def __init__(self, driver: CgroupDriver | None, proc_root: str) -> None:
        self.driver = driver
        self.proc_root = proc_root

    @property
    def drv(self) -> CgroupDriver:
        if self.driver is None:
            raise CgroupError("-", "the shield has no cpuset hierarchy (affinity mode)")
        return self.driver

    def table(self) -> dict[int, ProcStat]:
        return process_table(self.proc_root)

    def procs(self, path: str) -> list[int]:
        """The processes of `path`; none for a threaded group (cgroup v2 refuses to list
        them: its processes are its thread root's) or one that is gone."""
        try:
            return self.drv.procs(path)
        except CgroupError:
            if not self.drv.exists(path):
                return []
            if self.drv.version == 2 and self.cgroup_type(path) == "threaded":
                return []
            raise

    def cgroup_type(self, path: str) -> str:
        """cgroup v2: the group's `cgroup.type` ("domain", "domain threaded", "threaded",
        "domain invalid"); "domain" for the root and for trees that show none."""
        if not path:
            return "domain"
        try:
            return self.drv.read_file(path, "cgroup.type")
        except CgroupError:
            return "domain"

    def threaded(self, record: ShieldRecord) -> bool:
        """Whether the shield lives in a threaded subtree: its scope is a thread root (or
        threaded), so its groups are threaded and it moves the scope's threads one by one
        (`cgroup.threads`), never whole processes (whose other threads sit in threaded
        groups of their own)."""
        drv = self.drv
        return (
            drv.version == 2
            and bool(record.scope)
            and self.cgroup_type(record.scope) in ("domain threaded", "threaded")
        )

    def members(self, path: str, threaded: bool) -> list[int]:
        """The processes of `path` (`cgroup.procs`), or its threads (`cgroup.threads`)."""
        if not threaded:
            return self.procs(path)
        try:
            text = self.drv.read_file(path, "cgroup.threads")
        except CgroupError:
            if not self.drv.exists(path):
                return []
            raise
        return [int(t) for t in text.split() if t.isdigit()]

    def started(self, pid: int, start: int) -> bool:
        """Whether the task (process or thread) `pid` is there and started at `start`."""
        try:
            return read_stat(pid, self.proc_root).start_time == start
        except (ProcessGone, SysfsError):
            return False

    def tgid(self, tid: int) -> int:
        """The process a thread belongs to (itself when unknown)."""
        try:
            return int(read_status(tid, self.proc_root).get("Tgid", tid))
        except (ProcessGone, SysfsError, ValueError):
            return tid

    def move(
        self,
        group: str,
        pid: int,
        start: int,
        notes: list[Note],
        why: str = "",
        *,
        thread: bool = False,
    ) -> bool:
        """Move `pid` (if it still started at `start`) into `group` (with `thread`: only that
        thread, through `cgroup.threads`); a refusal is a note."""
        try:
            if read_stat(pid, self.proc_root).start_time != start:
                return False
        except ProcessGone:
            return False
        try:
            self.drv.write_file(group, "cgroup.threads" if thread else "cgroup.procs", str(pid))
        except CgroupError as exc:
            if exc.reason == "process_gone":
                return False
            what = "tid" if thread else "pid"
            notes.append(Note("refused", f"{what} {pid}", f"cannot move it to {group}: {exc}"))
            return False
        if why:
            notes.append(Note("moved", f"pid {pid}", why))
        return True

    def partition(self, path: str) -> str:
        """cgroup v2: the group's `cpuset.cpus.partition` when it is not a plain member ("root",
        "isolated", or an invalid one: "root invalid (...)"), else "". The shield never
        rewrites a partition or the groups below it: narrowing a partition root's CPUs can
        invalidate it (its CPUs go back to its parent), and writing an invalid one's can make
        it valid again - either way `off` could not put the partition back as it was. Its
        tasks stay where they are, and `shield status` lists those allowed on a CPU outside
        the system set as exposed."""
        if self.drv.version != 2 or not path:
            return ""
        try:
            text = self.drv.read_file(path, "cpuset.cpus.partition").strip()
        except CgroupError:
            return ""
        return "" if not text or text == "member" else text

    def foreign_groups(
        self, record: ShieldRecord, partitions: list[str] | None = None
    ) -> list[str]:
        """Every group below the scope that is not excluded nor a partition (or below one),
        parents before children; the partitions found are added to `partitions`."""
        drv = self.drv
        out: list[str] = []
        stack = list(reversed(drv.child_groups(record.scope)))
        while stack:
            path = stack.pop()
            if excluded(record, path):
                continue
            if self.partition(path):
                if partitions is not None:
                    partitions.append(path)
                continue
            out.append(path)
            stack.extend(reversed(drv.child_groups(path)))
        return out

    def in_partition(self, record: ShieldRecord, path: str) -> bool:
        """Whether `path` (below the scope) is a partition or below one: the shield leaves its
        CPUs as they are."""
        parts = split_cgroup_path(path) if path else []
        depth = len(split_cgroup_path(record.scope)) if record.scope else 0
        return any(self.partition("/".join(parts[:n])) for n in range(depth + 1, len(parts) + 1))

    def enable_cpuset(self, scope: str, *, only_last: bool = False) -> tuple[str, ...]:
        """cgroup v2: `cpuset` in the subtree_control of the root and every group down to
        `scope` (with `only_last`: of `scope` alone); the groups where it was not on yet."""
        drv = self.drv
        parts = split_cgroup_path(scope) if scope else []
        enabled: list[str] = []
        for depth in range(len(parts) + 1):
            if only_last and depth < len(parts):
                continue
            path = "/".join(parts[:depth])
            try:
                current = [
                    c.lstrip("+") for c in drv.read_file(path, "cgroup.subtree_control").split()
                ]
            except CgroupError:
                current = []
            if "cpuset" in current:
                continue
            drv.write_file(path, "cgroup.subtree_control", "+cpuset")
            enabled.append(path)
        return tuple(enabled)

    def make_v2_group(self, path: str, *, threaded: bool = False) -> None:
        drv = self.drv
        target = drv.dir(path)
        try:
            os.mkdir(target)
        except FileExistsError:
            return
        except OSError as exc:
            raise CgroupError(target, f"cannot create the group: {exc.strerror or exc}") from exc
        if drv.fake_tree:
            drv._fake_seed(path)  # a stand-in tree shows the files the kernel would
        if threaded:
            # the scope is a thread root already: a domain child of it could hold nothing
            drv.write_file(path, "cgroup.type", "threaded")

    def ensure_managed(self, record: ShieldRecord, notes: list[Note]) -> str:
        """The managed group (created with the scope's CPUs and memory nodes when missing)."""
        drv = self.drv
        path = record.managed_group
        if drv.exists(path):
            return path
        if drv.version == 2:
            self.make_v2_group(path, threaded=self.threaded(record))
        else:
            drv.create(path)  # v1: the scope's own cpus and mems
        notes.append(Note("created", path, "for managed processes that had to move"))
        return path

    def remove(self, group: str, notes: list[Note]) -> None:
        drv = self.drv
        for attempt in range(RMDIR_ATTEMPTS):
            try:
                drv.remove(group)
                notes.append(Note("removed", group, "the shield's group"))
                return
            except CgroupError as exc:
                if attempt == RMDIR_ATTEMPTS - 1:
                    notes.append(Note("failed", group, str(exc)))
                    return
                time.sleep(0.025)  # tasks that just left are still being counted out

    def group_of(self, pid: int) -> str | None:
        """The group of `pid` in this hierarchy (relative path), None when unknown."""
        try:
            entries = read_cgroup(pid, self.proc_root)
        except (ProcessGone, SysfsError):
            return None
        path = cgroup_of(entries, "cpuset" if self.drv.version == 1 else None)
        return None if path is None else path.strip("/")

    def allows(self, path: str, needs: CPUSet) -> bool:
        drv = self.drv
        try:
            if drv.version == 1:
                return needs <= drv.read_cpus(path)
            return needs <= drv.effective_cpus(path)
        except CorepinError:
            return True

    def will_allow(self, record: ShieldRecord, path: str, needs: CPUSet, system: CPUSet) -> bool:
        """Whether the group `path` allows `needs` once the system set is `system`: the system
        group and the groups the shield narrows hold no CPU outside it; the managed group, the
        scope group itself and groups outside the scope or excluded keep what they have."""
        if path == record.managed_group:
            return True
        inside = not record.scope or path.startswith(record.scope + "/")
        if path == record.system_group or (
            inside and not excluded(record, path) and not self.in_partition(record, path)
        ):
            return needs <= system
        return self.allows(path, needs)

    def write_v1(self, targets: list[CgroupTarget], action: str, notes: list[Note]) -> bool:
        """cgroup v1: write the groups' CPUs through the `Reconciler` (which orders parents
        and children); each change is an `action` note, each error a failed one. Whether
        there was no error."""
        report = Reconciler(self.drv, proc_root=self.proc_root).reconcile(targets)
        for c in report.changes:
            notes.append(Note(action, c.path, f"CPUs {c.old} -> {c.new}"))
        for err in report.errors:
            notes.append(Note("failed", "-", str(err)))
        return not report.errors
