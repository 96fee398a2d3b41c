"""The shield in cpuset mode, raised and kept: its system group, the groups it narrows in
place, the tasks it moves (see `corepin.enforcement.shield.engine` for the whole mechanism).

`CpusetMode.on` makes the system group (cgroup v2: with `cpuset` enabled down to the scope, the
scope's own tasks moved out first, and all of it taken back when a step fails); `reconcile`
resizes it to the system set, narrows every other group below the scope to it (managed
processes that would lose their CPUs move to the managed group first) and moves the tasks that
appeared in the scope group; `make_room` and `launch_group` find managed processes a group
where they get their CPUs. Taking the shield down is `cpuset_restore`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping

from corepin.core.cpuset import CPUSet
from corepin.core.errors import CgroupError, CorepinError, EnvironmentProblem
from corepin.enforcement.note import Note
from corepin.enforcement.reconcile import CgroupTarget
from corepin.enforcement.shield.result import ShieldResult, must
from corepin.enforcement.shield.scope import confine
from corepin.enforcement.shield.tree import ShieldTree
from corepin.state.shield import (
    MANAGED_GROUP,
    SYSTEM_GROUP,
    MovedTask,
    RestrictedGroup,
    ShieldRecord,
    merge_moved,
)
from corepin.sysfs.procfs import ProcessGone, ProcStat, read_stat

__all__ = ["CpusetMode"]


class CpusetMode:
    """Raises and keeps a cpuset shield on the hierarchy of `tree`."""

    def __init__(self, tree: ShieldTree) -> None:
        self.tree = tree

    def on(self, result: ShieldResult, system: CPUSet, managed: Mapping[int, CPUSet]) -> None:
        """Raise the cpuset part of the shield in `result.record` (nothing recorded yet): the
        system group with the system set, the scope's own tasks moved into it (v2: first, see
        `_cpuset_at_scope`). A failure half-way takes back what was done, and raises."""
        drv = self.tree.drv
        record = must(result.record)
        scope = record.scope
        if scope and not drv.exists(scope):
            raise CgroupError(
                drv.dir(scope), "the scope group does not exist", reason="cgroup_missing"
            )
        for name in (SYSTEM_GROUP, MANAGED_GROUP):
            if drv.exists(record.group(name)):
                raise EnvironmentProblem(
                    f"{drv.dir(record.group(name))} exists already: another corepin state "
                    "directory shields this scope, or a shield was not taken down (`corepin "
                    "shield off` with that state directory, or remove the group)",
                    reason="shield_exists",
                )
        try:
            self._create_system_group(result, record, system, managed)
        except BaseException:
            # nothing is recorded in the state yet: take back the tasks moved, the groups and
            # the cpuset controller turned on for them
            self._undo_creation(must(result.record))
            raise

    def _create_system_group(
        self,
        result: ShieldResult,
        record: ShieldRecord,
        system: CPUSet,
        managed: Mapping[int, CPUSet],
    ) -> None:
        drv = self.tree.drv
        scope = record.scope
        if drv.version == 2:
            parent = drv.parent(scope) if scope else None
            enabled = list(self.tree.enable_cpuset(parent)) if parent is not None else []
            # recorded at once: a failure below must find them to switch them off again
            result.record = record = record.evolve(enabled=tuple(enabled))
            threaded = self.tree.threaded(record)
            self.tree.make_v2_group(record.system_group, threaded=threaded)
            record = self._cpuset_at_scope(result, record, managed, threaded)
            drv.write_cpus(record.system_group, system)
        else:
            drv.create(record.system_group)
            drv.write_cpus(record.system_group, system)
        result.notes.append(Note("created", record.system_group, f"system set: CPUs {system}"))
        result.record = record

    def _cpuset_at_scope(
        self,
        result: ShieldResult,
        record: ShieldRecord,
        managed: Mapping[int, CPUSet],
        threaded: bool,
    ) -> ShieldRecord:
        """cgroup v2: `cpuset` in the scope's subtree_control, the scope's own tasks moved
        into the shield's leaves FIRST. The kernel lets a group with tasks enable a threaded
        controller such as cpuset - and then makes it a thread root whose domain children
        (the system group) can take no task (EOPNOTSUPP): a domain scope must be empty
        before, and still a domain after (a task that joined meanwhile is taken out and the
        controller enabled again)."""
        drv = self.tree.drv
        scope = record.scope
        before = self.tree.cgroup_type(scope)
        for attempt in range(4):
            if scope and not threaded:
                record = record.evolve(
                    moved=merge_moved(
                        record.moved, self._empty_scope(record, managed, result.notes)
                    )
                )
                result.record = record
            try:
                now = self.tree.enable_cpuset(scope, only_last=True)
            except CgroupError as exc:
                if exc.reason != "cgroup_busy" or attempt == 3:
                    raise
                continue  # a domain controller is on and a task came back: empty it again
            record = record.evolve(enabled=(*record.enabled, *now))
            result.record = record
            if threaded or self.tree.cgroup_type(scope) == before:
                return record
            # a task joined between the moves and the write: the scope turned thread root
            drv.write_file(scope, "cgroup.subtree_control", "-cpuset")
            record = record.evolve(enabled=tuple(e for e in record.enabled if e != scope))
            result.record = record
        raise EnvironmentProblem(
            f"{drv.dir(scope)}: tasks keep joining the scope group itself; the kernel would "
            "turn it into a threaded subtree if it gave cpuset to the shield's group",
            reason="shield_scope_busy",
        )

    def _undo_creation(self, record: ShieldRecord) -> None:
        """Take back a shield that failed half-way: the scope's controller first (so its tasks
        may come home), the tasks, the groups, the controllers enabled above the scope."""
        drv = self.tree.drv
        threaded = self.tree.threaded(record)
        if drv.version == 2 and record.scope in record.enabled:
            with contextlib.suppress(CorepinError):
                drv.write_file(record.scope, "cgroup.subtree_control", "-cpuset")
        for group in (record.system_group, record.managed_group):
            try:
                if not drv.exists(group):
                    continue
                for pid in self.tree.members(group, threaded):
                    name = "cgroup.threads" if threaded else "cgroup.procs"
                    home = None
                    for task in record.moved:
                        if task.pid == pid and drv.exists(task.origin):
                            home = task.origin
                    drv.write_file(record.scope if home is None else home, name, str(pid))
                drv.remove(group)
            except CorepinError:
                pass
        if drv.version == 2:
            for path in reversed(record.enabled):
                if path == record.scope:
                    continue
                with contextlib.suppress(CorepinError):
                    drv.write_file(path, "cgroup.subtree_control", "-cpuset")

    def _empty_scope(
        self, record: ShieldRecord, managed: Mapping[int, CPUSet], notes: list[Note]
    ) -> list[MovedTask]:
        """Move every task out of the scope group itself (cgroup v2, see `_cpuset_at_scope`):
        managed processes to the managed group, the others to the system group."""
        table = self.tree.table()
        moved: list[MovedTask] = []
        for pid in self.tree.procs(record.scope):
            st = table.get(pid)
            if st is None or st.kernel_thread:
                continue
            target = (
                self.tree.ensure_managed(record, notes) if pid in managed else record.system_group
            )
            if self.tree.move(target, pid, st.start_time, notes):
                moved.append(MovedTask(pid, st.start_time, record.scope))
        return moved

    def reconcile(
        self,
        result: ShieldResult,
        system: CPUSet,
        managed: Mapping[int, CPUSet],
        table: dict[int, ProcStat],
    ) -> None:
        """Resize the system group, narrow the groups below the scope, move the tasks that
        appeared in the scope group (and unmanaged ones in the managed group) into the system
        group, forget the moved tasks that are gone."""
        drv = self.tree.drv
        record = must(result.record)
        notes = result.notes
        group = record.system_group
        # 1. the system group: its CPUs first (shrinking before anything else gets them)
        try:
            current = drv.read_cpus(group)
            if current != system:
                drv.write_cpus(group, system)
                notes.append(Note("resized", group, f"CPUs {current or '-'} -> {system}"))
        except CorepinError as exc:
            notes.append(Note("failed", group, str(exc)))
        # 2. groups below the scope: narrowed in place (managed processes leave first)
        record = self._restrict(record, system, managed, table, notes)
        # 3. tasks of the scope group itself, and of the managed group that are not managed
        moved: list[MovedTask] = []
        kernel = 0
        threaded = self.tree.threaded(record)
        for source in (record.scope, record.managed_group):
            if source and not drv.exists(source):
                continue
            for pid in self.tree.members(source, threaded):
                st = table.get(pid)
                if st is None and threaded:
                    try:
                        st = read_stat(pid, self.tree.proc_root)
                    except ProcessGone:
                        continue
                if st is None or not st.alive:
                    continue
                if st.kernel_thread:
                    kernel += 1
                    continue
                if (self.tree.tgid(pid) if threaded else pid) in managed:
                    continue
                origin = record.origin_of(pid, st.start_time) or source
                if self.tree.move(group, pid, st.start_time, notes, thread=threaded):
                    moved.append(MovedTask(pid, st.start_time, origin))
        if kernel and not record.kthreads:
            notes.append(
                Note(
                    "left",
                    "kernel threads",
                    f"{kernel} stay in {record.scope or 'the root group'} (kernel threads never "
                    "move; --kthreads confines the affinity of the unbound ones)",
                )
            )
        if moved:
            notes.append(Note("moved", group, f"{len(moved)} task(s) into the system set"))
        alive = {(pid, st.start_time) for pid, st in table.items() if st.alive}
        kept = [
            t
            for t in record.moved
            if (t.pid, t.start_time) in alive
            or (threaded and self.tree.started(t.pid, t.start_time))
        ]
        result.record = record.evolve(moved=merge_moved(kept, moved))

    def _restrict(
        self,
        record: ShieldRecord,
        system: CPUSet,
        managed: Mapping[int, CPUSet],
        table: dict[int, ProcStat],
        notes: list[Note],
    ) -> ShieldRecord:
        """Narrow every group below the scope (not excluded) to the system set, in place:
        `confine(original, parent's new CPUs)` top-down (v2: empty stays empty below the top;
        it takes its parent's). Managed processes in a group that loses CPUs they need move
        to the managed group first."""
        drv = self.tree.drv
        saved = {g.path: g.cpus for g in record.restricted}
        partitions: list[str] = []
        groups = self.tree.foreign_groups(record, partitions)
        for path in partitions:
            notes.append(
                Note(
                    "left",
                    path,
                    f"a cpuset partition ({self.tree.partition(path)}): never narrowed, nor the "
                    "groups below it (its tasks allowed on an exclusive CPU are exposed)",
                )
            )
        wanted: dict[str, CPUSet] = {}
        originals: dict[str, str] = {}
        for path in groups:
            try:
                text = saved[path] if path in saved else drv.read_cpus_text(path)
            except CgroupError:
                continue
            originals[path] = text
            parent = drv.parent(path) or ""
            bound = wanted.get(parent, system)
            if not text:  # v2: inherits its parent's CPUs
                if parent == record.scope or parent not in wanted:
                    wanted[path] = bound
                continue
            wanted[path] = confine(CPUSet.parse(text), bound)
        moved: list[MovedTask] = []
        for path in groups:
            want = wanted.get(path)
            if want is None:
                continue
            for pid in self.tree.procs(path):
                need = managed.get(pid)
                st = table.get(pid)
                if need is None or st is None or need <= want:
                    continue
                target = self.tree.ensure_managed(record, notes)
                if self.tree.move(
                    target, pid, st.start_time, notes, f"managed: needs CPUs {need}, left {path}"
                ):
                    moved.append(MovedTask(pid, st.start_time, path))
        changes: list[RestrictedGroup] = []
        targets: list[CgroupTarget] = []
        for path, want in wanted.items():
            try:
                live = drv.read_cpus_text(path)
            except CgroupError:
                continue
            if live == str(want) or (live and CPUSet.parse(live) == want):
                if path in saved:
                    changes.append(RestrictedGroup(path, saved[path]))
                continue
            changes.append(RestrictedGroup(path, originals[path]))
            if drv.version == 2:
                try:
                    drv.write_cpus(path, want)
                    notes.append(Note("restricted", path, f"CPUs {live or '-'} -> {want}"))
                except CorepinError as exc:
                    notes.append(Note("failed", path, str(exc)))
            else:
                targets.append(CgroupTarget(path, cpus=want))
        if targets:
            self.tree.write_v1(targets, "restricted", notes)
        keep = {g.path for g in changes}
        for g in record.restricted:  # groups gone since: forget them
            if g.path not in keep and drv.exists(g.path):
                changes.append(g)
        return record.evolve(
            restricted=tuple(sorted(changes, key=lambda g: g.path)),
            moved=merge_moved(record.moved, moved),
        )

    def make_room(
        self, record: ShieldRecord, pids: Iterable[int], needs: CPUSet, system: CPUSet
    ) -> ShieldResult:
        """Cpuset mode: move processes (about to be managed with `needs`) whose group will not
        allow those CPUs once the system set is `system` into the managed group; the record
        remembers where they came from."""
        result = ShieldResult(record)
        if record.mode != "cpuset":
            return result
        drv = self.tree.drv
        table = self.tree.table()
        moved: list[MovedTask] = []
        for pid in pids:
            st = table.get(pid)
            if st is None:
                continue
            where = self.tree.group_of(pid)
            if where is None or self.tree.will_allow(record, where, needs, system):
                continue
            target = self.tree.ensure_managed(record, result.notes)
            if where == target:
                continue
            origin = record.origin_of(pid, st.start_time) or where
            if self.tree.move(target, pid, st.start_time, result.notes):
                moved.append(MovedTask(pid, st.start_time, origin))
        result.record = record.evolve(moved=merge_moved(record.moved, moved))
        if drv.exists(record.managed_group) and moved:
            result.notes.append(
                Note("moved", record.managed_group, f"{len(moved)} managed process(es)")
            )
        return result

    def launch_group(
        self, record: ShieldRecord, caller: str | None, needs: CPUSet, system: CPUSet
    ) -> str | None:
        """Cpuset mode: the group a new command must join to get `needs` when it starts from
        the group `caller` while the system set becomes `system` (None: it may stay)."""
        if record.mode != "cpuset" or caller is None:
            return None
        if self.tree.will_allow(record, caller, needs, system):
            return None
        return self.tree.ensure_managed(record, [])
