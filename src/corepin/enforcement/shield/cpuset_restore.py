"""Taking a cpuset shield down: every group it narrowed gets its CPUs back, every task it moved
goes home, its groups go, and the `cpuset` controller it enabled goes off again - in the order
the kernel takes it, keeping (and reporting) what someone else changed since.

cgroup v2 makes two steps delicate, both handled here: a group whose parent's `cpuset` the
shield turned on gets its CPUs back only when that controller goes off (`_dropped_check`), and
an empty `cpuset.cpus` (inherit the parent's) is refused for a group with tasks
(`_write_original`: a reset of the parent's controller, or the tasks parked meanwhile).
"""

from __future__ import annotations

from corepin.core.cpuset import CPUSet
from corepin.core.errors import CgroupError, CorepinError
from corepin.enforcement.note import Note
from corepin.enforcement.reconcile import CgroupTarget
from corepin.enforcement.shield.scope import confine
from corepin.enforcement.shield.tree import ShieldTree
from corepin.state.shield import RestrictedGroup, ShieldRecord
from corepin.sysfs.procfs import ProcessGone, ProcStat, read_stat

__all__ = ["CpusetRestore"]


class CpusetRestore:
    """Takes a cpuset shield down on the hierarchy of `tree`."""

    def __init__(self, tree: ShieldTree) -> None:
        self.tree = tree

    def off(self, record: ShieldRecord, system: CPUSet, notes: list[Note]) -> ShieldRecord:
        """In the order the kernel needs: narrowed groups get their CPUs back (before tasks
        come home to them); on v2, the scope's controller goes off (when the shield turned it
        on) before tasks come home to the scope itself, which may then hold tasks again; the
        shield's groups go; the controllers it turned on above the scope go off, deepest
        first; groups whose cpuset went with their parent's controller are checked last."""
        drv = self.tree.drv
        table = self.tree.table()
        threaded = self.tree.threaded(record)
        # 1. groups narrowed in place get their CPUs back first (tasks going home find them)
        record = self._unrestrict(record, system, notes)
        # 2. tasks whose home is not the scope go home; v2: the scope's controller off; the rest
        back = self._send_home(record, table, notes, threaded, scope_too=drv.version == 1)
        if drv.version == 2 and record.scope in record.enabled and record.scope:
            try:
                drv.write_file(record.scope, "cgroup.subtree_control", "-cpuset")
                notes.append(Note("restored", record.scope, "cpuset controller off again"))
                record = record.evolve(
                    enabled=tuple(e for e in record.enabled if e != record.scope)
                )
            except CgroupError as exc:
                notes.append(Note("failed", record.scope, str(exc)))
        back += self._send_home(record, self.tree.table(), notes, threaded, scope_too=True)
        if back:
            notes.append(Note("restored", "tasks", f"{back} task(s) back to their groups"))
        # 3. the shield's groups go
        for group in (record.managed_group, record.system_group):
            if drv.exists(group):
                self.tree.remove(group, notes)
        # 4. cgroup v2: cpuset off again where the shield turned it on
        for path in reversed(record.enabled):
            try:
                drv.write_file(path, "cgroup.subtree_control", "-cpuset")
                notes.append(Note("restored", path or "/", "cpuset controller off again"))
            except CgroupError as exc:
                # a group below uses cpuset now: it stays on (not an error)
                notes.append(Note("left", path or "/", f"cpuset controller stays on: {exc}"))
        # 5. groups whose cpuset was to go with their parent's controller
        if drv.version == 2:
            record = self._dropped_check(record, notes)
        return record.evolve(moved=(), enabled=())

    def _dropped_check(self, record: ShieldRecord, notes: list[Note]) -> ShieldRecord:
        """v2: a narrowed group whose parent's cpuset the shield turned on got its CPUs back
        when that controller went off (its cpuset files went with it). Where the controller
        stayed on, its original value is written now; what still fails stays recorded."""
        drv = self.tree.drv
        left: list[RestrictedGroup] = []
        for g in record.restricted:
            if not drv.exists(g.path):
                continue
            try:
                live = drv.read_cpus_text(g.path)
            except CgroupError as exc:
                if exc.reason == "cgroup_missing":
                    notes.append(Note("restored", g.path, "CPUs (parent's: no cpuset)"))
                    continue
                notes.append(Note("failed", g.path, str(exc)))
                left.append(g)
                continue
            if live == g.cpus:
                notes.append(Note("restored", g.path, f"CPUs {g.cpus or '(parent)'}"))
                continue
            if not self._write_original(g, notes):
                left.append(g)
        return record.evolve(restricted=tuple(left))

    def _write_original(
        self, g: RestrictedGroup, notes: list[Note], park: str | None = None
    ) -> bool:
        """Write a narrowed group's original cpuset.cpus back (v2). An empty one (inherit the
        parent's) is refused with ENOSPC while the group holds tasks: then, where it is safe,
        the parent's controller is switched off and on again, which resets its children to
        inherit (`_reset_children`); where it is not (a sibling is a partition, or gives
        cpuset to its own children), the group's tasks wait in the `park` group (the
        shield's system group) while the empty value is written, and come back at once."""
        drv = self.tree.drv
        try:
            drv.write_cpus(g.path, CPUSet.parse(g.cpus))
            notes.append(Note("restored", g.path, f"CPUs {g.cpus or '(parent)'}"))
            return True
        except CorepinError as exc:
            if g.cpus or getattr(exc, "reason", "") != "cgroup_empty_cpuset":
                notes.append(Note("failed", g.path, str(exc)))
                return False
            why = self._reset_children(drv.parent(g.path) or "", g)
            if why is None:
                notes.append(Note("restored", g.path, "CPUs (parent)"))
                return True
            if park is not None:
                parked = self._empty_parked(g.path, park)
                if parked is None:
                    notes.append(
                        Note(
                            "restored",
                            g.path,
                            f"CPUs (parent; its tasks waited in the {park} group meanwhile)",
                        )
                    )
                    return True
                why += f"; with its tasks moved out: {parked}"
            notes.append(
                Note(
                    "failed",
                    g.path,
                    "the kernel refuses an empty cpuset.cpus (inherit the parent's) for a group "
                    f"with tasks (ENOSPC), and its parent's controller cannot be reset: {why}",
                )
            )
            return False

    def _empty_parked(self, path: str, park: str) -> str | None:
        """Write an empty cpuset.cpus to `path` with its processes moved to `park` for the
        time of the write (the kernel takes it only in a group without tasks), then move them
        back. None when done, else why not (the processes are back either way)."""
        drv = self.tree.drv
        table = self.tree.table()
        taken: list[tuple[int, int]] = []
        why: str | None = None
        try:
            for _ in range(3):  # a task forked meanwhile starts in the group too
                pids = drv.procs(path)
                if not pids:
                    break
                for pid in pids:
                    st = table.get(pid)
                    if st is None:
                        try:
                            st = read_stat(pid, self.tree.proc_root)
                        except ProcessGone:
                            continue
                    if self.tree.move(park, pid, st.start_time, []):
                        taken.append((pid, st.start_time))
            drv.write_cpus(path, CPUSet())
            if drv.read_cpus_text(path):
                why = f"cpuset.cpus reads {drv.read_cpus_text(path)} after writing it empty"
        except CgroupError as exc:
            why = str(exc)
        for pid, start in taken:
            if not self.tree.move(path, pid, start, []) and self.tree.started(pid, start):
                why = (why + "; " if why else "") + f"pid {pid} stays in {park}"
        return why

    def _reset_children(self, parent: str, g: RestrictedGroup) -> str | None:
        """Switch cpuset off and on again in `parent`'s subtree_control, which makes every
        child inherit again - only when that loses nothing: no other child is a partition or
        gives cpuset to a group below (the others get their CPUs and memory nodes written
        back at once). None when done, else why not."""
        drv = self.tree.drv
        if not parent:
            return "it is the root group"
        for child in drv.child_groups(parent):
            if child == g.path:
                continue
            try:
                if "cpuset" in drv.read_file(child, "cgroup.subtree_control").split():
                    return f"{child} gives cpuset to its own children"
                part = drv.read_file(child, "cpuset.cpus.partition").split()
                if part and part[0] != "member":
                    return f"{child} is a {part[0]} partition"
            except CgroupError as exc:
                if exc.reason != "cgroup_missing":
                    return str(exc)
        if "cpuset" in drv.read_file(g.path, "cgroup.subtree_control").split():
            return f"{g.path} gives cpuset to its own children"
        mems = drv.read_mems_text(g.path)
        if mems:
            return f"{g.path} has memory nodes of its own ({mems})"
        keep: list[tuple[str, str, str]] = []
        for child in drv.child_groups(parent):
            if child != g.path:
                try:
                    keep.append((child, drv.read_cpus_text(child), drv.read_mems_text(child)))
                except CgroupError:
                    continue
        try:
            drv.write_file(parent, "cgroup.subtree_control", "-cpuset")
        except CgroupError as exc:
            return str(exc)
        try:
            drv.write_file(parent, "cgroup.subtree_control", "+cpuset")
            for child, cpus, mems in keep:  # the other children keep what they had
                if mems:
                    drv.write_file(child, "cpuset.mems", mems)
                if cpus:
                    drv.write_file(child, "cpuset.cpus", cpus)
        except CgroupError as exc:
            return f"cpuset in {parent} after a reset: {exc}"
        return None

    def _send_home(
        self,
        record: ShieldRecord,
        table: dict[int, ProcStat],
        notes: list[Note],
        threaded: bool = False,
        *,
        scope_too: bool = True,
    ) -> int:
        """Move every task of the shield's groups where it came from (else to the scope;
        without `scope_too`, only those with another home)."""
        drv = self.tree.drv
        back = 0
        for group in (record.system_group, record.managed_group):
            if not drv.exists(group):
                continue
            for attempt in range(3):
                pids = self.tree.members(group, threaded)
                if not pids:
                    break
                for pid in pids:
                    st = table.get(pid) if attempt == 0 else None
                    if st is None:
                        try:
                            st = read_stat(pid, self.tree.proc_root)
                        except ProcessGone:
                            continue
                    origin = record.origin_of(pid, st.start_time)
                    home = origin if origin is not None and drv.exists(origin) else None
                    if home is None:
                        home = record.scope
                    if home == record.scope and not scope_too:
                        continue
                    if self.tree.move(home, pid, st.start_time, notes, thread=threaded):
                        back += 1
                if not scope_too:
                    break
        return back

    def _unrestrict(self, record: ShieldRecord, system: CPUSet, notes: list[Note]) -> ShieldRecord:
        """Put back the original CPUs of the groups narrowed in place, parents first; a group
        someone changed since keeps what it has (noted). v2: a group whose parent's cpuset the
        shield turned on is not written - it gets its CPUs back when that controller goes off
        (`_dropped_check`, after the shield's groups are gone) - and an empty original is
        written last, while its parent still offers CPUs."""
        drv = self.tree.drv
        wanted: dict[str, CPUSet] = {}
        restore: list[RestrictedGroup] = []
        left: list[RestrictedGroup] = []
        dropped: list[RestrictedGroup] = []
        for g in sorted(record.restricted, key=lambda g: g.path.count("/")):
            if not drv.exists(g.path):
                continue
            parent = drv.parent(g.path) or ""
            if drv.version == 2 and parent in record.enabled:
                dropped.append(g)
                continue
            try:
                live = drv.read_cpus_text(g.path)
            except CgroupError as exc:
                notes.append(Note("failed", g.path, str(exc)))
                left.append(g)
                continue
            bound = wanted.get(parent, system)
            shielded = bound if not g.cpus else confine(CPUSet.parse(g.cpus), bound)
            wanted[g.path] = shielded
            if live == g.cpus:
                continue
            if CPUSet.parse(live or "") != shielded:
                notes.append(Note("left", g.path, f"changed since (CPUs {live}): kept"))
                continue
            restore.append(g)
        if drv.version == 2:
            for g in sorted(restore, key=lambda g: not g.cpus):  # empty ones last
                if not self._write_original(g, notes, park=record.system_group):
                    left.append(g)
        elif restore:
            targets = [CgroupTarget(g.path, cpus=CPUSet.parse(g.cpus)) for g in restore]
            if not self.tree.write_v1(targets, "restored", notes):
                left.extend(restore)
        return record.evolve(restricted=(*left, *dropped))
