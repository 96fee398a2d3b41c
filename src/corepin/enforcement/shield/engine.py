"""The shield's mechanism: keep the tasks corepin does not manage off the CPUs it hands out.

Given a *scope* (a cgroup path of the cpuset hierarchy, "" for its root), the *system set* (the
CPUs those tasks may use: reserved CPUs plus the shared pool) and the processes corepin manages
(pid -> the CPUs each needs), `ShieldEngine` does, in `cpuset` mode:

- tasks directly in the scope group move into `<scope>/corepin.system`, whose `cpuset.cpus` is
  the system set (pid and start time checked before each move; a task forked later by one of
  them starts there too);
- other groups below the scope (a container runtime's, a service manager's) keep their tasks
  and are narrowed in place: each group's `cpuset.cpus` becomes its original CPUs within the
  system set (its parent's new CPUs, if none are left), widest first on the way back;
- groups corepin owns (`corepin/...`, the shield's own) and the kubelet's (`kubepods`,
  `kubepods.slice`) - the `excluded` paths - are left alone;
- a managed process that sits where the shield narrows (so its CPUs would be taken away)
  moves to `<scope>/corepin.managed`, which keeps the scope's CPUs;
- kernel threads never move between groups: with `kthreads`, the affinity of the unbound ones
  is confined to the system set (per-CPU kernel threads - PF_NO_SETAFFINITY, or bound to one
  CPU - and IRQ threads are reported and left);
- with `irqs` (whole hierarchy only: IRQs are not scoped), each IRQ's affinity
  (/proc/irq/N/smp_affinity_list) and /proc/irq/default_smp_affinity are confined to the system
  set; IRQs the kernel refuses to move (per-CPU, managed) are reported and left.

In `affinity` mode (no cpuset controller usable), the tasks of the scope (by /proc/PID/cgroup)
get their affinity confined instead; they could widen it again, `reconcile` puts it back.

"Confined" means `(original & system) or system`: a task that ran on a subset keeps that subset
where it can. Everything changed is recorded (`corepin.state.shield.ShieldRecord`) with its
original value; `off` puts back what still is as the shield left it, and reports (leaves) what
someone else changed since. cgroup v1 and v2 differ in three places: v2 groups need `cpuset`
in their parent's `cgroup.subtree_control` (the engine enables it down to the scope and records
where), an empty v2 `cpuset.cpus` means "the parent's" (restored as empty), and moving a task
on v2 moves it in every controller at once (why the engine narrows other groups in place rather
than emptying them).

`ShieldEngine` composes the pieces of this package: `tree` (the hierarchy and the proc tree as
the shield sees them), `cpuset_mode` (raise and keep a cpuset shield), `cpuset_restore` (take it
down), `affinity_mode`, `kthreads`, `irqs`; the pure rules are in `scope` (what is in scope,
what "confined" means). Thread affinity goes through the one seam,
`corepin.enforcement.affinity`: the kernel (`sched_setaffinity`) when the proc root is this
process's own /proc, otherwise a stand-in tree whose status files hold the affinity (tests), so
a fake /proc never makes the engine touch a real thread.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from corepin.core.cpuset import CPUSet
from corepin.core.errors import EnvironmentProblem
from corepin.enforcement.affinity import ThreadAffinity, affinity_for
from corepin.enforcement.cgroups import CgroupDriver
from corepin.enforcement.note import Note
from corepin.enforcement.shield.affinity_mode import AffinityMode
from corepin.enforcement.shield.cpuset_mode import CpusetMode
from corepin.enforcement.shield.cpuset_restore import CpusetRestore
from corepin.enforcement.shield.irqs import IrqWriter, confine_irqs, irq_writer, restore_irqs
from corepin.enforcement.shield.kthreads import confine_kernel_threads
from corepin.enforcement.shield.result import ShieldResult, must
from corepin.enforcement.shield.tree import ShieldTree
from corepin.state.shield import ShieldRecord

__all__ = ["ShieldEngine"]


class ShieldEngine:
    """Applies and undoes a shield on one cpuset hierarchy (`driver`, None in affinity mode)
    and one proc tree.

    `managed` arguments map the pid of every process corepin manages to the CPUs it needs; the
    system set is passed on every call (it follows the pools)."""

    def __init__(
        self,
        driver: CgroupDriver | None,
        proc_root: str = "/proc",
        *,
        affinity: ThreadAffinity | None = None,
        irqs: IrqWriter | None = None,
        unified: str | None = None,
    ) -> None:
        self.driver = driver
        self.proc_root = proc_root
        #: writes an IRQ's affinity (a test may put a refusing one in its place)
        self.write_irq = irqs or irq_writer(proc_root)
        self.tree = ShieldTree(driver, proc_root)
        self.cpusets = CpusetMode(self.tree)
        self.restorer = CpusetRestore(self.tree)
        #: affinity mode; `unified` says which /proc/PID/cgroup entry names a task's group
        #: ("cpuset" for a v1 cpuset hierarchy, None for the v2 unified one)
        self.tasks = AffinityMode(proc_root, affinity or affinity_for(proc_root), unified)

    @property
    def affinity(self) -> ThreadAffinity:
        """How thread affinities are read and set (the kernel, or a stand-in tree)."""
        return self.tasks.affinity

    # ------------------------------------------------------------------ on
    def on(
        self,
        record: ShieldRecord,
        system: CPUSet,
        managed: Mapping[int, CPUSet],
    ) -> ShieldResult:
        """Raise the shield described by `record` (scope, mode, options; nothing recorded yet).
        The returned record holds everything changed (also when parts failed: `off` can then
        undo them)."""
        if not system:
            raise EnvironmentProblem(
                "the shield's system set would be empty: reserve CPUs (--reserved-cpus) or free "
                "CPUs held exclusively",
                reason="system_set_empty",
            )
        result = ShieldResult(record)
        if record.mode == "cpuset":
            self.cpusets.on(result, system, managed)
        result = self.reconcile(must(result.record), system, managed, notes=result.notes)
        return result

    # ------------------------------------------------------------------ reconcile
    def reconcile(
        self,
        record: ShieldRecord,
        system: CPUSet,
        managed: Mapping[int, CPUSet],
        *,
        notes: list[Note] | None = None,
    ) -> ShieldResult:
        """Make the live system match the record with the system set `system`: resize the
        system group, narrow the groups below the scope to it, adopt tasks that appeared in
        the scope (moved, or pinned in affinity mode), confine kernel threads and IRQs
        (when asked for), drop records of tasks that are gone. Writes only what differs."""
        result = ShieldResult(record, notes if notes is not None else [])
        if not system:
            result.notes.append(
                Note("failed", "system set", "empty: nothing may run anywhere; left as is")
            )
            return result
        table = self.tree.table()
        if record.mode == "cpuset":
            self.cpusets.reconcile(result, system, managed, table)
        else:
            self.tasks.reconcile(result, system, managed, table)
        if record.kthreads:
            now = must(result.record)
            if now.mode == "cpuset":
                members = self.tree.procs(now.scope)
            else:
                members = self.tasks.scope_members(now, table)
            confine_kernel_threads(result, system, table, members, self.tasks.affinity)
        if record.irqs:
            confine_irqs(result, system, self.proc_root, self.write_irq)
        return result

    # ------------------------------------------------------------------ managed processes
    def make_room(
        self, record: ShieldRecord, pids: Iterable[int], needs: CPUSet, system: CPUSet
    ) -> ShieldResult:
        """Cpuset mode: move processes (about to be managed with `needs`) whose group will not
        allow those CPUs once the system set is `system` into the managed group; the record
        remembers where they came from."""
        return self.cpusets.make_room(record, pids, needs, system)

    def group_of(self, pid: int) -> str | None:
        """The group of `pid` in this hierarchy (relative path), None when unknown."""
        return self.tree.group_of(pid)

    def launch_group(
        self, record: ShieldRecord, caller: str | None, needs: CPUSet, system: CPUSet
    ) -> str | None:
        """Cpuset mode: the group a new command must join to get `needs` when it starts from
        the group `caller` while the system set becomes `system` (None: it may stay)."""
        return self.cpusets.launch_group(record, caller, needs, system)

    # ------------------------------------------------------------------ off
    def off(
        self, record: ShieldRecord, system: CPUSet, managed: Mapping[int, CPUSet]
    ) -> ShieldResult:
        """Take the shield down: put back what it changed and is still as it left it, remove
        its groups. The returned record is None when everything is undone, else what is left
        (the notes say why) for another try."""
        result = ShieldResult(record)
        notes = result.notes
        left = record
        if record.irqs:
            left = restore_irqs(left, system, notes, self.proc_root, self.write_irq)
        if record.kthreads:
            left = left.evolve(
                kernel_threads=self.tasks.restore(left.kernel_threads, system, notes)
            )
        if record.mode == "affinity":
            left = left.evolve(tasks=self.tasks.restore(left.tasks, system, notes))
        else:
            left = self.restorer.off(left, system, notes)
        done = not (
            left.irq_affinity
            or left.kernel_threads
            or left.tasks
            or left.restricted
            or left.enabled
            or (record.mode == "cpuset" and self.tree.drv.exists(record.system_group))
        )
        result.record = None if done else left
        return result
