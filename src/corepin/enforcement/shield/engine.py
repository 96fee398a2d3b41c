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

Thread affinity goes through `ThreadAffinity`: the kernel (`sched_setaffinity`) when the proc
root is this process's own /proc, otherwise a stand-in tree whose status files hold the
affinity (tests), so a fake /proc never makes the engine touch a real thread.
"""

from __future__ import annotations

import contextlib
import errno
import os
import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Final, Protocol

from corepin.core.cpuset import CPUSet
from corepin.core.errors import CgroupError, CorepinError, EnvironmentProblem, SysfsError
from corepin.core.ids import split_cgroup_path
from corepin.core.record import field, record
from corepin.enforcement.affinity import AffinityError, set_affinity
from corepin.enforcement.cgroups import CgroupDriver
from corepin.enforcement.note import Note
from corepin.state.shield import (
    MANAGED_GROUP,
    SYSTEM_GROUP,
    MovedTask,
    RestrictedGroup,
    SavedAffinity,
    SavedIrq,
    ShieldRecord,
    merge_moved,
    merge_saved,
)
from corepin.sysfs.procfs import (
    PF_NO_SETAFFINITY,
    ProcessGone,
    ProcStat,
    cgroup_of,
    cpus_allowed_list,
    list_threads,
    process_table,
    read_cgroup,
    read_stat,
    read_status,
)

if TYPE_CHECKING:
    from corepin.enforcement.reconcile import CgroupTarget

__all__ = [
    "KernelAffinity",
    "Note",
    "ShieldEngine",
    "ShieldResult",
    "StandInAffinity",
    "ThreadAffinity",
    "confine",
    "in_scope",
    "kernel_proc",
    "plan_irqs",
    "plan_kernel_threads",
    "read_irqs",
]

#: Groups below a scope that belong to the kubelet: never touched.
KUBELET_GROUPS: Final = ("kubepods", "kubepods.slice")
#: How often `off` retries removing a group the kernel still counts exiting tasks in.
RMDIR_ATTEMPTS: Final = 40


def confine(cpus: CPUSet, system: CPUSet) -> CPUSet:
    """`cpus` within the system set, or the whole system set when none of them is in it."""
    return (cpus & system) or system


def in_scope(record: ShieldRecord, path: str) -> bool:
    """Whether the group `path` (as /proc/PID/cgroup names it: `/a/b`) is the record's scope
    or below it, outside its excluded groups."""
    scope = "/" + record.scope if record.scope else "/"
    if scope != "/" and path != scope and not path.startswith(scope + "/"):
        return False
    rel = path.strip("/")
    return not any(rel == e or rel.startswith(e + "/") for e in record.excluded)


@record(frozen=False, slots=False)
class ShieldResult:
    """What one engine call did: the updated record and the notes."""

    record: ShieldRecord | None
    notes: list[Note] = field(default_factory=list)

    def count(self, action: str) -> int:
        return sum(1 for n in self.notes if n.action == action)

    @property
    def failed(self) -> list[Note]:
        return [n for n in self.notes if n.action == "failed"]


# ---------------------------------------------------------------------- thread affinity
class ThreadAffinity(Protocol):
    """Reads and sets the CPU affinity of threads."""

    def threads(self, pid: int) -> list[int]: ...

    def get(self, pid: int, tid: int) -> CPUSet: ...

    def set(self, pid: int, tid: int, cpus: CPUSet) -> None: ...


def kernel_proc(proc_root: str) -> bool:
    """Whether `proc_root` is this process's own /proc (its `self` names our pid): only then do
    its pids name threads the kernel would let us pin."""
    try:
        return os.readlink(os.path.join(proc_root, "self")) == str(os.getpid())
    except OSError:
        return False


class KernelAffinity:
    """sched_getaffinity / sched_setaffinity on live threads."""

    def __init__(self, proc_root: str = "/proc") -> None:
        self.proc_root = proc_root

    def threads(self, pid: int) -> list[int]:
        return list_threads(pid, self.proc_root)

    def get(self, pid: int, tid: int) -> CPUSet:
        try:
            return CPUSet(os.sched_getaffinity(tid))
        except ProcessLookupError:
            raise ProcessGone(tid, f"{self.proc_root}/{pid}/task/{tid}") from None

    def set(self, pid: int, tid: int, cpus: CPUSet) -> None:
        set_affinity(tid, cpus, pid=pid)


class StandInAffinity:
    """A stand-in /proc tree: a thread's affinity is the `Cpus_allowed_list` line of its
    status file, and setting it rewrites that line (the process's own status too for its main
    thread). A thread whose stat flags carry PF_NO_SETAFFINITY refuses, as the kernel does."""

    def __init__(self, proc_root: str) -> None:
        self.proc_root = proc_root

    def threads(self, pid: int) -> list[int]:
        return list_threads(pid, self.proc_root)

    def get(self, pid: int, tid: int) -> CPUSet:
        return cpus_allowed_list(pid, self.proc_root, tid=tid)

    def set(self, pid: int, tid: int, cpus: CPUSet) -> None:
        if read_stat(pid, self.proc_root).flags & PF_NO_SETAFFINITY:
            raise AffinityError(
                pid, tid, cpus, "EINVAL: the kernel pins this thread", reason="affinity_invalid"
            )
        base = os.path.join(self.proc_root, str(pid))
        files = [os.path.join(base, "task", str(tid), "status")]
        if tid == pid:
            files.append(os.path.join(base, "status"))
        for path in files:
            try:
                with open(path, encoding="utf-8") as handle:
                    lines = handle.read().splitlines()
            except FileNotFoundError:
                continue
            out = [
                f"Cpus_allowed_list:\t{cpus}" if line.startswith("Cpus_allowed_list:") else line
                for line in lines
            ]
            try:
                with open(path, "w", encoding="utf-8") as handle:
                    handle.write("\n".join(out) + "\n")
            except OSError as exc:  # a real procfs of another pid namespace, say
                raise AffinityError(
                    pid,
                    tid,
                    cpus,
                    f"{path} is not a stand-in tree ({exc.strerror or exc}): the proc root must "
                    "be this process's own /proc to pin real threads",
                    reason="affinity_failed",
                ) from exc


def affinity_for(proc_root: str) -> ThreadAffinity:
    """The kernel for this process's own /proc, a stand-in for any other tree."""
    return KernelAffinity(proc_root) if kernel_proc(proc_root) else StandInAffinity(proc_root)


# ---------------------------------------------------------------------- pure plans
@record
class KthreadPlan:
    """What to do with one kernel thread: `new` affinity, or None with `why` it is left."""

    pid: int
    start_time: int
    comm: str
    old: CPUSet
    new: CPUSet | None
    why: str = ""


def plan_kernel_threads(
    threads: Iterable[tuple[ProcStat, CPUSet]],
    system: CPUSet,
    saved: Mapping[tuple[int, int], CPUSet] | None = None,
) -> list[KthreadPlan]:
    """Plans for kernel threads given as (stat, current affinity). Left alone: threads the
    kernel pins (PF_NO_SETAFFINITY), threads bound to a single CPU (per-CPU threads), IRQ
    threads (`irq/...`: they follow their IRQ). The others get `confine(original, system)`,
    the original being the `saved` one when there is one. Threads already there need nothing
    (`new` equals `old`)."""
    saved = saved or {}
    out: list[KthreadPlan] = []
    for st, current in threads:
        if not st.kernel_thread or not st.alive:
            continue
        original = saved.get((st.pid, st.start_time), current)
        why = ""
        if st.fixed_affinity:
            why = "per-CPU kernel thread: the kernel pins it (PF_NO_SETAFFINITY)"
        elif st.comm.startswith("irq/"):
            why = "IRQ thread: it follows its IRQ's affinity (--irqs)"
        elif len(original) == 1 and (st.pid, st.start_time) not in saved:
            why = f"bound to CPU {original}: a per-CPU kernel thread"
        if why:
            out.append(KthreadPlan(st.pid, st.start_time, st.comm, current, None, why))
            continue
        out.append(KthreadPlan(st.pid, st.start_time, st.comm, current, confine(original, system)))
    return out


@record
class IrqPlan:
    irq: str
    old: CPUSet
    new: CPUSet


def plan_irqs(
    current: Mapping[str, CPUSet], system: CPUSet, saved: Mapping[str, CPUSet] | None = None
) -> list[IrqPlan]:
    """Every IRQ (and `default`) confined to the system set from its original affinity (the
    `saved` one, else the current one); IRQs already there are omitted."""
    saved = saved or {}
    out = []
    for irq in sorted(current, key=_irq_order):
        new = confine(saved.get(irq, current[irq]), system)
        if new != current[irq]:
            out.append(IrqPlan(irq, current[irq], new))
    return out


def _irq_order(irq: str) -> tuple[int, int]:
    return (0, int(irq)) if irq.isdigit() else (1, 0)


def read_irqs(proc_root: str) -> dict[str, CPUSet]:
    """IRQ number -> affinity (`<proc>/irq/N/smp_affinity_list`), and `default` ->
    `<proc>/irq/default_smp_affinity` (a mask). Unreadable entries are skipped."""
    base = os.path.join(proc_root, "irq")
    out: dict[str, CPUSet] = {}
    try:
        names = os.listdir(base)
    except OSError as exc:
        raise SysfsError(base, f"cannot list: {exc.strerror or exc}") from exc
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(os.path.join(base, name, "smp_affinity_list"), encoding="ascii") as f:
                out[name] = CPUSet.parse(f.read().strip())
        except (OSError, ValueError, UnicodeDecodeError):
            continue
    try:
        with open(os.path.join(base, "default_smp_affinity"), encoding="ascii") as f:
            out["default"] = CPUSet.from_mask(f.read().strip())
    except (OSError, ValueError, UnicodeDecodeError):
        pass
    return out


IrqWriter = Callable[[str, CPUSet], None]


def irq_writer(proc_root: str) -> IrqWriter:
    """Writes an IRQ's affinity under `proc_root`; OSError when the kernel refuses."""

    def write(irq: str, cpus: CPUSet) -> None:
        base = os.path.join(proc_root, "irq")
        if irq == "default":
            path, text = os.path.join(base, "default_smp_affinity"), cpus.to_mask()
        else:
            path, text = os.path.join(base, irq, "smp_affinity_list"), str(cpus)
        fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
        try:
            os.write(fd, text.encode("ascii"))
        finally:
            os.close(fd)

    return write


# ---------------------------------------------------------------------- the engine
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
        self.affinity = affinity or affinity_for(proc_root)
        self.write_irq = irqs or irq_writer(proc_root)
        #: affinity mode: which /proc/PID/cgroup entry names a task's group ("cpuset" for a
        #: v1 cpuset hierarchy, None for the v2 unified one)
        self.membership: str | None = unified

    # ------------------------------------------------------------------ helpers
    @property
    def _drv(self) -> CgroupDriver:
        if self.driver is None:
            raise CgroupError("-", "the shield has no cpuset hierarchy (affinity mode)")
        return self.driver

    def _excluded(self, path: str, record: ShieldRecord) -> bool:
        own = (record.system_group, record.managed_group)
        return any(path == i or path.startswith(i + "/") for i in (*own, *record.excluded))

    def _foreign_groups(
        self, record: ShieldRecord, partitions: list[str] | None = None
    ) -> list[str]:
        """Every group below the scope that is not excluded nor a partition (or below one),
        parents before children; the partitions found are added to `partitions`."""
        drv = self._drv
        out: list[str] = []
        stack = list(reversed(drv.child_groups(record.scope)))
        while stack:
            path = stack.pop()
            if self._excluded(path, record):
                continue
            if self._partition(path):
                if partitions is not None:
                    partitions.append(path)
                continue
            out.append(path)
            stack.extend(reversed(drv.child_groups(path)))
        return out

    def _partition(self, path: str) -> str:
        """cgroup v2: the group's `cpuset.cpus.partition` when it is not a plain member ("root",
        "isolated", or an invalid one: "root invalid (...)"), else "". The shield never
        rewrites a partition or the groups below it: narrowing a partition root's CPUs can
        invalidate it (its CPUs go back to its parent), and writing an invalid one's can make
        it valid again - either way `off` could not put the partition back as it was. Its
        tasks stay where they are, and `shield status` lists those allowed on a CPU outside
        the system set as exposed."""
        if self._drv.version != 2 or not path:
            return ""
        try:
            text = self._drv.read_file(path, "cpuset.cpus.partition").strip()
        except CgroupError:
            return ""
        return "" if not text or text == "member" else text

    def _table(self) -> dict[int, ProcStat]:
        return process_table(self.proc_root)

    def _procs(self, path: str) -> list[int]:
        """The processes of `path`; none for a threaded group (cgroup v2 refuses to list
        them: its processes are its thread root's) or one that is gone."""
        try:
            return self._drv.procs(path)
        except CgroupError:
            if not self._drv.exists(path):
                return []
            if self._drv.version == 2 and self._cgroup_type(path) == "threaded":
                return []
            raise

    def _cgroup_type(self, path: str) -> str:
        """cgroup v2: the group's `cgroup.type` ("domain", "domain threaded", "threaded",
        "domain invalid"); "domain" for the root and for trees that show none."""
        if not path:
            return "domain"
        try:
            return self._drv.read_file(path, "cgroup.type")
        except CgroupError:
            return "domain"

    def _threaded(self, record: ShieldRecord) -> bool:
        """Whether the shield lives in a threaded subtree: its scope is a thread root (or
        threaded), so its groups are threaded and it moves the scope's threads one by one
        (`cgroup.threads`), never whole processes (whose other threads sit in threaded
        groups of their own)."""
        drv = self._drv
        return (
            drv.version == 2
            and bool(record.scope)
            and self._cgroup_type(record.scope) in ("domain threaded", "threaded")
        )

    def _members(self, path: str, threaded: bool) -> list[int]:
        """The processes of `path` (`cgroup.procs`), or its threads (`cgroup.threads`)."""
        if not threaded:
            return self._procs(path)
        try:
            text = self._drv.read_file(path, "cgroup.threads")
        except CgroupError:
            if not self._drv.exists(path):
                return []
            raise
        return [int(t) for t in text.split() if t.isdigit()]

    def _started(self, pid: int, start: int) -> bool:
        """Whether the task (process or thread) `pid` is there and started at `start`."""
        try:
            return read_stat(pid, self.proc_root).start_time == start
        except (ProcessGone, SysfsError):
            return False

    def _tgid(self, tid: int) -> int:
        """The process a thread belongs to (itself when unknown)."""
        try:
            return int(read_status(tid, self.proc_root).get("Tgid", tid))
        except (ProcessGone, SysfsError, ValueError):
            return tid

    def _move(
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
            self._drv.write_file(group, "cgroup.threads" if thread else "cgroup.procs", str(pid))
        except CgroupError as exc:
            if exc.reason == "process_gone":
                return False
            what = "tid" if thread else "pid"
            notes.append(Note("refused", f"{what} {pid}", f"cannot move it to {group}: {exc}"))
            return False
        if why:
            notes.append(Note("moved", f"pid {pid}", why))
        return True

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
            self._on_cpuset(result, system, managed)
        result = self.reconcile(_must(result.record), system, managed, notes=result.notes)
        return result

    def _on_cpuset(
        self, result: ShieldResult, system: CPUSet, managed: Mapping[int, CPUSet]
    ) -> None:
        drv = self._drv
        record = _must(result.record)
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
            self._undo_creation(_must(result.record))
            raise

    def _create_system_group(
        self,
        result: ShieldResult,
        record: ShieldRecord,
        system: CPUSet,
        managed: Mapping[int, CPUSet],
    ) -> None:
        drv = self._drv
        scope = record.scope
        if drv.version == 2:
            parent = drv.parent(scope) if scope else None
            enabled = list(self._enable_cpuset(parent)) if parent is not None else []
            # recorded at once: a failure below must find them to switch them off again
            result.record = record = record.evolve(enabled=tuple(enabled))
            threaded = self._threaded(record)
            self._make_v2_group(record.system_group, threaded=threaded)
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
        drv = self._drv
        scope = record.scope
        before = self._cgroup_type(scope)
        for attempt in range(4):
            if scope and not threaded:
                record = record.evolve(
                    moved=merge_moved(
                        record.moved, self._empty_scope(record, managed, result.notes)
                    )
                )
                result.record = record
            try:
                now = self._enable_cpuset(scope, only_last=True)
            except CgroupError as exc:
                if exc.reason != "cgroup_busy" or attempt == 3:
                    raise
                continue  # a domain controller is on and a task came back: empty it again
            record = record.evolve(enabled=(*record.enabled, *now))
            result.record = record
            if threaded or self._cgroup_type(scope) == before:
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
        drv = self._drv
        threaded = self._threaded(record)
        if drv.version == 2 and record.scope in record.enabled:
            with contextlib.suppress(CorepinError):
                drv.write_file(record.scope, "cgroup.subtree_control", "-cpuset")
        for group in (record.system_group, record.managed_group):
            try:
                if not drv.exists(group):
                    continue
                for pid in self._members(group, threaded):
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

    def _enable_cpuset(self, scope: str, *, only_last: bool = False) -> tuple[str, ...]:
        """cgroup v2: `cpuset` in the subtree_control of the root and every group down to
        `scope` (with `only_last`: of `scope` alone); the groups where it was not on yet."""
        drv = self._drv
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

    def _make_v2_group(self, path: str, *, threaded: bool = False) -> None:
        drv = self._drv
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

    def _empty_scope(
        self, record: ShieldRecord, managed: Mapping[int, CPUSet], notes: list[Note]
    ) -> list[MovedTask]:
        """Move every task out of the scope group itself (cgroup v2, see `_cpuset_at_scope`):
        managed processes to the managed group, the others to the system group."""
        table = self._table()
        moved: list[MovedTask] = []
        for pid in self._procs(record.scope):
            st = table.get(pid)
            if st is None or st.kernel_thread:
                continue
            target = self._ensure_managed(record, notes) if pid in managed else record.system_group
            if self._move(target, pid, st.start_time, notes):
                moved.append(MovedTask(pid, st.start_time, record.scope))
        return moved

    def _ensure_managed(self, record: ShieldRecord, notes: list[Note]) -> str:
        """The managed group (created with the scope's CPUs and memory nodes when missing)."""
        drv = self._drv
        path = record.managed_group
        if drv.exists(path):
            return path
        if drv.version == 2:
            self._make_v2_group(path, threaded=self._threaded(record))
        else:
            drv.create(path)  # v1: the scope's own cpus and mems
        notes.append(Note("created", path, "for managed processes that had to move"))
        return path

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
        table = self._table()
        if record.mode == "cpuset":
            self._reconcile_cpuset(result, system, managed, table)
        else:
            self._reconcile_affinity(result, system, managed, table)
        if record.kthreads:
            self._kernel_threads(result, system, table)
        if record.irqs:
            self._irqs(result, system)
        return result

    def _reconcile_cpuset(
        self,
        result: ShieldResult,
        system: CPUSet,
        managed: Mapping[int, CPUSet],
        table: dict[int, ProcStat],
    ) -> None:
        drv = self._drv
        record = _must(result.record)
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
        threaded = self._threaded(record)
        for source in (record.scope, record.managed_group):
            if source and not drv.exists(source):
                continue
            for pid in self._members(source, threaded):
                st = table.get(pid)
                if st is None and threaded:
                    try:
                        st = read_stat(pid, self.proc_root)
                    except ProcessGone:
                        continue
                if st is None or not st.alive:
                    continue
                if st.kernel_thread:
                    kernel += 1
                    continue
                if (self._tgid(pid) if threaded else pid) in managed:
                    continue
                origin = record.origin_of(pid, st.start_time) or source
                if self._move(group, pid, st.start_time, notes, thread=threaded):
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
            if (t.pid, t.start_time) in alive or (threaded and self._started(t.pid, t.start_time))
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
        from corepin.enforcement.reconcile import CgroupTarget

        drv = self._drv
        saved = {g.path: g.cpus for g in record.restricted}
        partitions: list[str] = []
        groups = self._foreign_groups(record, partitions)
        for path in partitions:
            notes.append(
                Note(
                    "left",
                    path,
                    f"a cpuset partition ({self._partition(path)}): never narrowed, nor the "
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
            for pid in self._procs(path):
                need = managed.get(pid)
                st = table.get(pid)
                if need is None or st is None or need <= want:
                    continue
                target = self._ensure_managed(record, notes)
                if self._move(
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
            self._reconcile_v1(targets, "restricted", notes)
        keep = {g.path for g in changes}
        for g in record.restricted:  # groups gone since: forget them
            if g.path not in keep and drv.exists(g.path):
                changes.append(g)
        return record.evolve(
            restricted=tuple(sorted(changes, key=lambda g: g.path)),
            moved=merge_moved(record.moved, moved),
        )

    def _scope_members(self, record: ShieldRecord, table: dict[int, ProcStat]) -> list[int]:
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

    def _reconcile_affinity(
        self,
        result: ShieldResult,
        system: CPUSet,
        managed: Mapping[int, CPUSet],
        table: dict[int, ProcStat],
    ) -> None:
        record = _must(result.record)
        saved = {(t.pid, t.start_time): t for t in record.tasks}
        found: list[SavedAffinity] = []
        pinned = 0
        for pid in self._scope_members(record, table):
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
            try:
                pinned += self._pin_threads(pid, st.start_time, confine(entry.cpus, system))
            except ProcessGone:
                continue
            except AffinityError as exc:
                result.notes.append(Note("refused", f"pid {pid}", str(exc)))
        if pinned:
            result.notes.append(
                Note("pinned", "tasks", f"{pinned} thread(s) confined to CPUs {system}")
            )
        result.record = record.evolve(tasks=merge_saved(found, ()))

    def _pin_threads(self, pid: int, start: int, cpus: CPUSet) -> int:
        """Every thread of `pid` (still started at `start`) on `cpus`; how many changed."""
        if read_stat(pid, self.proc_root).start_time != start:
            return 0
        changed = 0
        for tid in self.affinity.threads(pid):
            try:
                if self.affinity.get(pid, tid) != cpus:
                    self.affinity.set(pid, tid, cpus)
                    changed += 1
            except ProcessGone:
                continue
        return changed

    def _kernel_threads(
        self, result: ShieldResult, system: CPUSet, table: dict[int, ProcStat]
    ) -> None:
        record = _must(result.record)
        if record.mode == "cpuset":
            members = set(self._procs(record.scope))
        else:
            members = set(self._scope_members(record, table))
        saved = {(t.pid, t.start_time): t.cpus for t in record.kernel_threads}
        inputs = []
        for pid in sorted(members):
            st = table.get(pid)
            if st is None or not st.kernel_thread:
                continue
            try:
                inputs.append((st, self.affinity.get(pid, pid)))
            except ProcessGone:
                continue
        keep: list[SavedAffinity] = []
        pinned = 0
        for plan in plan_kernel_threads(inputs, system, saved):
            if plan.new is None:
                result.notes.append(Note("left", f"pid {plan.pid}", f"{plan.comm}: {plan.why}"))
                continue
            original = saved.get((plan.pid, plan.start_time), plan.old)
            if plan.new != plan.old:
                try:
                    self.affinity.set(plan.pid, plan.pid, plan.new)
                    pinned += 1
                except ProcessGone:
                    continue
                except AffinityError as exc:
                    result.notes.append(Note("refused", f"pid {plan.pid}", str(exc)))
                    continue
            keep.append(SavedAffinity(plan.pid, plan.start_time, original))
        if pinned:
            result.notes.append(
                Note("pinned", "kernel threads", f"{pinned} confined to CPUs {system}")
            )
        result.record = record.evolve(kernel_threads=merge_saved(keep, ()))

    def _irqs(self, result: ShieldResult, system: CPUSet) -> None:
        record = _must(result.record)
        saved = {i.irq: i.cpus for i in record.irq_affinity}
        current = read_irqs(self.proc_root)
        keep = {irq: cpus for irq, cpus in saved.items() if irq in current}
        written: list[IrqPlan] = []
        for plan in plan_irqs(current, system, saved):
            try:
                self.write_irq(plan.irq, plan.new)
            except OSError as exc:
                what = errno.errorcode.get(exc.errno or 0, str(exc.errno))
                result.notes.append(
                    Note(
                        "refused",
                        f"irq {plan.irq}",
                        f"the kernel keeps it on CPUs {plan.old} ({what}: {exc.strerror})",
                    )
                )
                continue
            keep.setdefault(plan.irq, plan.old)
            written.append(plan)
        # some IRQs take the write and stay where they were (the timer and the cascade of a
        # legacy PIC, say): read back, and say so
        after = read_irqs(self.proc_root) if written else {}
        moved = 0
        for plan in written:
            now = after.get(plan.irq, plan.new)
            if now - system and now == plan.old:
                result.notes.append(
                    Note(
                        "refused",
                        f"irq {plan.irq}",
                        f"the kernel accepted CPUs {plan.new} but keeps it on CPUs {now}",
                    )
                )
            else:
                moved += 1
        if moved:
            result.notes.append(Note("moved", "irqs", f"{moved} IRQ(s) to CPUs {system}"))
        result.record = record.evolve(
            irq_affinity=tuple(SavedIrq(k, v) for k, v in sorted(keep.items()))
        )

    # ------------------------------------------------------------------ managed processes
    def make_room(
        self, record: ShieldRecord, pids: Iterable[int], needs: CPUSet, system: CPUSet
    ) -> ShieldResult:
        """Cpuset mode: move processes (about to be managed with `needs`) whose group will not
        allow those CPUs once the system set is `system` into the managed group; the record
        remembers where they came from."""
        result = ShieldResult(record)
        if record.mode != "cpuset":
            return result
        drv = self._drv
        table = self._table()
        moved: list[MovedTask] = []
        for pid in pids:
            st = table.get(pid)
            if st is None:
                continue
            where = self.group_of(pid)
            if where is None or self._will_allow(record, where, needs, system):
                continue
            target = self._ensure_managed(record, result.notes)
            if where == target:
                continue
            origin = record.origin_of(pid, st.start_time) or where
            if self._move(target, pid, st.start_time, result.notes):
                moved.append(MovedTask(pid, st.start_time, origin))
        result.record = record.evolve(moved=merge_moved(record.moved, moved))
        if drv.exists(record.managed_group) and moved:
            result.notes.append(
                Note("moved", record.managed_group, f"{len(moved)} managed process(es)")
            )
        return result

    def group_of(self, pid: int) -> str | None:
        """The group of `pid` in this hierarchy (relative path), None when unknown."""
        try:
            entries = read_cgroup(pid, self.proc_root)
        except (ProcessGone, SysfsError):
            return None
        path = cgroup_of(entries, "cpuset" if self._drv.version == 1 else None)
        return None if path is None else path.strip("/")

    def _allows(self, path: str, needs: CPUSet) -> bool:
        drv = self._drv
        try:
            if drv.version == 1:
                return needs <= drv.read_cpus(path)
            return needs <= drv.effective_cpus(path)
        except CorepinError:
            return True

    def _will_allow(self, record: ShieldRecord, path: str, needs: CPUSet, system: CPUSet) -> bool:
        """Whether the group `path` allows `needs` once the system set is `system`: the system
        group and the groups the shield narrows hold no CPU outside it; the managed group, the
        scope group itself and groups outside the scope or excluded keep what they have."""
        if path == record.managed_group:
            return True
        inside = not record.scope or path.startswith(record.scope + "/")
        if path == record.system_group or (
            inside and not self._excluded(path, record) and not self._in_partition(record, path)
        ):
            return needs <= system
        return self._allows(path, needs)

    def _in_partition(self, record: ShieldRecord, path: str) -> bool:
        """Whether `path` (below the scope) is a partition or below one: the shield leaves its
        CPUs as they are."""
        parts = split_cgroup_path(path) if path else []
        depth = len(split_cgroup_path(record.scope)) if record.scope else 0
        return any(self._partition("/".join(parts[:n])) for n in range(depth + 1, len(parts) + 1))

    def launch_group(
        self, record: ShieldRecord, caller: str | None, needs: CPUSet, system: CPUSet
    ) -> str | None:
        """Cpuset mode: the group a new command must join to get `needs` when it starts from
        the group `caller` while the system set becomes `system` (None: it may stay)."""
        if record.mode != "cpuset" or caller is None:
            return None
        if self._will_allow(record, caller, needs, system):
            return None
        return self._ensure_managed(record, [])

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
            left = self._restore_irqs(left, system, notes)
        if record.kthreads:
            left = left.evolve(
                kernel_threads=self._restore_affinities(left.kernel_threads, system, notes)
            )
        if record.mode == "affinity":
            left = left.evolve(tasks=self._restore_affinities(left.tasks, system, notes))
        else:
            left = self._off_cpuset(left, system, notes)
        done = not (
            left.irq_affinity
            or left.kernel_threads
            or left.tasks
            or left.restricted
            or left.enabled
            or (record.mode == "cpuset" and self._drv.exists(record.system_group))
        )
        result.record = None if done else left
        return result

    def _restore_irqs(
        self, record: ShieldRecord, system: CPUSet, notes: list[Note]
    ) -> ShieldRecord:
        current = read_irqs(self.proc_root)
        left = []
        for saved in record.irq_affinity:
            now = current.get(saved.irq)
            if now is None or now == saved.cpus:
                continue
            if now != confine(saved.cpus, system):
                notes.append(Note("left", f"irq {saved.irq}", f"changed since (CPUs {now}): kept"))
                continue
            try:
                self.write_irq(saved.irq, saved.cpus)
                notes.append(Note("restored", f"irq {saved.irq}", f"CPUs {saved.cpus}"))
            except OSError as exc:
                notes.append(Note("failed", f"irq {saved.irq}", str(exc)))
                left.append(saved)
        return record.evolve(irq_affinity=tuple(left))

    def _restore_affinities(
        self, saved: Iterable[SavedAffinity], system: CPUSet, notes: list[Note]
    ) -> tuple[SavedAffinity, ...]:
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

    def _off_cpuset(self, record: ShieldRecord, system: CPUSet, notes: list[Note]) -> ShieldRecord:
        """In the order the kernel needs: narrowed groups get their CPUs back (before tasks
        come home to them); on v2, the scope's controller goes off (when the shield turned it
        on) before tasks come home to the scope itself, which may then hold tasks again; the
        shield's groups go; the controllers it turned on above the scope go off, deepest
        first; groups whose cpuset went with their parent's controller are checked last."""
        drv = self._drv
        table = self._table()
        threaded = self._threaded(record)
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
        back += self._send_home(record, self._table(), notes, threaded, scope_too=True)
        if back:
            notes.append(Note("restored", "tasks", f"{back} task(s) back to their groups"))
        # 3. the shield's groups go
        for group in (record.managed_group, record.system_group):
            if drv.exists(group):
                self._remove(group, notes)
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
        drv = self._drv
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
        drv = self._drv
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
        drv = self._drv
        table = self._table()
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
                            st = read_stat(pid, self.proc_root)
                        except ProcessGone:
                            continue
                    if self._move(park, pid, st.start_time, []):
                        taken.append((pid, st.start_time))
            drv.write_cpus(path, CPUSet())
            if drv.read_cpus_text(path):
                why = f"cpuset.cpus reads {drv.read_cpus_text(path)} after writing it empty"
        except CgroupError as exc:
            why = str(exc)
        for pid, start in taken:
            if not self._move(path, pid, start, []) and self._started(pid, start):
                why = (why + "; " if why else "") + f"pid {pid} stays in {park}"
        return why

    def _reset_children(self, parent: str, g: RestrictedGroup) -> str | None:
        """Switch cpuset off and on again in `parent`'s subtree_control, which makes every
        child inherit again - only when that loses nothing: no other child is a partition or
        gives cpuset to a group below (the others get their CPUs and memory nodes written
        back at once). None when done, else why not."""
        drv = self._drv
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
        drv = self._drv
        back = 0
        for group in (record.system_group, record.managed_group):
            if not drv.exists(group):
                continue
            for attempt in range(3):
                pids = self._members(group, threaded)
                if not pids:
                    break
                for pid in pids:
                    st = table.get(pid) if attempt == 0 else None
                    if st is None:
                        try:
                            st = read_stat(pid, self.proc_root)
                        except ProcessGone:
                            continue
                    origin = record.origin_of(pid, st.start_time)
                    home = origin if origin is not None and self._home_ok(origin) else None
                    if home is None:
                        home = record.scope
                    if home == record.scope and not scope_too:
                        continue
                    if self._move(home, pid, st.start_time, notes, thread=threaded):
                        back += 1
                if not scope_too:
                    break
        return back

    def _home_ok(self, path: str) -> bool:
        drv = self._drv
        return drv.exists(path)

    def _remove(self, group: str, notes: list[Note]) -> None:
        drv = self._drv
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

    def _unrestrict(self, record: ShieldRecord, system: CPUSet, notes: list[Note]) -> ShieldRecord:
        """Put back the original CPUs of the groups narrowed in place, parents first; a group
        someone changed since keeps what it has (noted). v2: a group whose parent's cpuset the
        shield turned on is not written - it gets its CPUs back when that controller goes off
        (`_dropped_check`, after the shield's groups are gone) - and an empty original is
        written last, while its parent still offers CPUs."""
        from corepin.enforcement.reconcile import CgroupTarget

        drv = self._drv
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
            if not self._reconcile_v1(targets, "restored", notes):
                left.extend(restore)
        return record.evolve(restricted=(*left, *dropped))

    def _reconcile_v1(self, targets: list[CgroupTarget], action: str, notes: list[Note]) -> bool:
        """cgroup v1: write the groups' CPUs through the `Reconciler` (which orders parents
        and children); each change is an `action` note, each error a failed one. Whether
        there was no error."""
        from corepin.enforcement.reconcile import Reconciler

        report = Reconciler(self._drv, proc_root=self.proc_root).reconcile(targets)
        for c in report.changes:
            notes.append(Note(action, c.path, f"CPUs {c.old} -> {c.new}"))
        for err in report.errors:
            notes.append(Note("failed", "-", str(err)))
        return not report.errors


def _must(record: ShieldRecord | None) -> ShieldRecord:
    assert record is not None
    return record
