"""Thread CPU affinity: the one seam through which corepin reads and sets it.

`ThreadAffinity` reads and sets the affinity of threads: `KernelAffinity` with
`sched_getaffinity` / `sched_setaffinity`, `StandInAffinity` in a stand-in /proc tree whose
status files hold the affinity (tests), so a fake /proc never makes corepin touch a real thread
(`affinity_for` picks one for a proc root). `pin_threads` gives every thread of one process an
affinity through either; every walk goes through it: the process groups of host mode and the
node agent (below) and the shield's affinity mode (`corepin.enforcement.shield`).

`pin_process_group` sets the affinity of every thread (/proc/PID/task/*) of every process of a
`ProcessGroup` (a root process with its descendants, its session, and recorded members; see
`corepin.sysfs.procfs`); `pin_process_tree` is the same for one process tree. Threads and
processes exit while we walk: an ESRCH is skipped, never an error. New threads and processes
inherit the affinity of the one that creates them, so the walk rescans /proc and repeats until
a pass finds nothing to change (bounded by `max_passes`), which catches children forked by
not-yet-pinned processes between the scan and the pin.

PID reuse: every process is pinned only after its start time is read again and found equal to
the one of the scan (and the root's to the recorded one), so a pid recycled in between is never
touched. Idempotent: a thread is only written when its current affinity differs; a thread that
narrowed its own affinity to a subset of `allow_within` (a workload pinning its workers inside
its exclusive CPUs) is left alone.
"""

from __future__ import annotations

import errno
import os
from typing import Protocol

from corepin.core.cpuset import CPUSet
from corepin.core.errors import EnvironmentProblem, InputError
from corepin.core.ids import validate_pid
from corepin.core.record import field, record
from corepin.enforcement.note import Change
from corepin.sysfs.procfs import (
    PF_NO_SETAFFINITY,
    ProcessGone,
    ProcessGroup,
    ProcStat,
    cpus_allowed_list,
    list_threads,
    process_table,
    read_stat,
)

__all__ = [
    "AffinityError",
    "AffinityResult",
    "KernelAffinity",
    "StandInAffinity",
    "ThreadAffinity",
    "affinity_for",
    "get_affinity",
    "kernel_proc",
    "pin_process_group",
    "pin_process_tree",
    "pin_threads",
    "set_affinity",
]


class AffinityError(EnvironmentProblem):
    """sched_setaffinity refused for a reason other than the thread exiting."""

    default_reason = "affinity"

    def __init__(self, pid: int, tid: int, cpus: CPUSet, problem: str, *, reason: str) -> None:
        self.pid = pid
        self.tid = tid
        self.cpus = cpus
        super().__init__(
            f"cannot pin thread {tid} of process {pid} to CPUs {cpus or '(none)'}: {problem}",
            reason=reason,
        )


@record(frozen=False, slots=False)
class AffinityResult:
    """What a pin pass did. Not a `ReconcileReport`: this is the walk's own account, below the
    reconcile engine, which adds what only it knows (targets missing or gone, one `checked` per
    target where this counts the thread affinities read) and takes these changes and errors
    into its report."""

    #: every thread written (or, in a dry run, that would be): `Change("affinity", ...)`
    changes: list[Change] = field(default_factory=list)
    checked: int = 0  # thread affinities read
    #: threads whose affinity the kernel narrowed (their cpuset cgroup allows only part of it)
    restricted: list[AffinityError] = field(default_factory=list)
    writes: int = 0


def get_affinity(tid: int) -> CPUSet:
    """The CPU affinity of a thread (or process: its main thread)."""
    return CPUSet(os.sched_getaffinity(tid))


def set_affinity(tid: int, cpus: CPUSet, *, pid: int | None = None) -> None:
    """sched_setaffinity with errors mapped; ProcessGone when the thread has exited."""
    owner = tid if pid is None else pid
    try:
        os.sched_setaffinity(tid, cpus.sorted())
    except ProcessLookupError:
        raise ProcessGone(tid, f"/proc/{owner}/task/{tid}") from None
    except PermissionError as err:
        raise AffinityError(
            owner,
            tid,
            cpus,
            f"not permitted ({err.strerror}): needs root, CAP_SYS_NICE or the same user",
            reason="affinity_permission",
        ) from err
    except OSError as err:
        if err.errno == errno.EINVAL:
            raise AffinityError(
                owner,
                tid,
                cpus,
                "EINVAL: the CPUs are offline, do not exist, or lie outside the cpuset of the "
                "thread's cgroup",
                reason="affinity_invalid",
            ) from err
        raise AffinityError(
            owner, tid, cpus, f"{err.strerror or err}", reason="affinity_failed"
        ) from err


# ---------------------------------------------------------------------- the seam
class ThreadAffinity(Protocol):
    """Reads and sets the CPU affinity of threads (`get`/`set` raise ProcessGone for a thread
    that has exited, `set` AffinityError when refused)."""

    @property
    def proc_root(self) -> str | os.PathLike[str]: ...

    def threads(self, pid: int) -> list[int]: ...

    def get(self, pid: int, tid: int) -> CPUSet: ...

    def set(self, pid: int, tid: int, cpus: CPUSet) -> None: ...


def kernel_proc(proc_root: str | os.PathLike[str]) -> bool:
    """Whether `proc_root` is this process's own /proc (its `self` names our pid): only then do
    its pids name threads the kernel would let us pin."""
    try:
        return os.readlink(os.path.join(proc_root, "self")) == str(os.getpid())
    except OSError:
        return False


class KernelAffinity:
    """sched_getaffinity / sched_setaffinity on live threads."""

    def __init__(self, proc_root: str | os.PathLike[str] = "/proc") -> None:
        self.proc_root = proc_root

    def threads(self, pid: int) -> list[int]:
        return list_threads(pid, self.proc_root)

    def get(self, pid: int, tid: int) -> CPUSet:
        try:
            return get_affinity(tid)
        except ProcessLookupError:
            raise ProcessGone(tid, f"{os.fspath(self.proc_root)}/{pid}/task/{tid}") from None

    def set(self, pid: int, tid: int, cpus: CPUSet) -> None:
        set_affinity(tid, cpus, pid=pid)


class StandInAffinity:
    """A stand-in /proc tree: a thread's affinity is the `Cpus_allowed_list` line of its
    status file, and setting it rewrites that line (the process's own status too for its main
    thread). A thread whose stat flags carry PF_NO_SETAFFINITY refuses, as the kernel does."""

    def __init__(self, proc_root: str | os.PathLike[str]) -> None:
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


def affinity_for(proc_root: str | os.PathLike[str]) -> ThreadAffinity:
    """The kernel for this process's own /proc, a stand-in for any other tree."""
    return KernelAffinity(proc_root) if kernel_proc(proc_root) else StandInAffinity(proc_root)


def pin_threads(
    threads: ThreadAffinity,
    pid: int,
    start_time: int | None,
    cpus: CPUSet,
    result: AffinityResult,
    *,
    allow_within: CPUSet | None = None,
    dry_run: bool = False,
) -> int:
    """Give every thread of `pid` the affinity `cpus`, after checking that it is still the
    process that started at `start_time` (None: no check); what was written goes to `result`.
    How many threads hold `cpus` now that did not (a thread the kernel narrowed is in
    `result.restricted` instead). A process or thread that exits meanwhile is skipped;
    AffinityError (the kernel refused for another reason) ends the walk."""
    try:
        if start_time is not None and read_stat(pid, threads.proc_root).start_time != start_time:
            return 0  # the pid was recycled since the scan: not ours
        tids = threads.threads(pid)
    except ProcessGone:
        return 0
    changed = 0
    for tid in tids:
        changed += _pin_thread(threads, pid, tid, cpus, allow_within, result, dry_run)
    return changed


def _pin_thread(
    threads: ThreadAffinity,
    pid: int,
    tid: int,
    cpus: CPUSet,
    allow_within: CPUSet | None,
    result: AffinityResult,
    dry_run: bool,
) -> int:
    try:
        current = threads.get(pid, tid)
    except ProcessGone:
        return 0
    result.checked += 1
    if current == cpus:
        return 0
    if allow_within is not None and current and current.issubset(allow_within):
        return 0  # narrowed itself inside the CPUs it may keep to itself: allowed
    if any(r.tid == tid for r in result.restricted):
        return 0
    where = f"pid {pid} tid {tid}"
    if dry_run:
        result.changes.append(Change("affinity", where, str(current), str(cpus)))
        return 1
    try:
        threads.set(pid, tid, cpus)
    except ProcessGone:
        return 0
    result.writes += 1
    try:
        after = threads.get(pid, tid)
    except ProcessGone:
        return 1
    result.changes.append(Change("affinity", where, str(current), str(after)))
    if after != cpus:
        result.restricted.append(
            AffinityError(
                pid,
                tid,
                cpus,
                f"the kernel narrowed it to {after}: the thread's cpuset cgroup does not allow "
                "all of these CPUs",
                reason="affinity_restricted",
            )
        )
        return 0
    return 1


# ---------------------------------------------------------------------- process groups
def pin_process_tree(
    pid: int,
    cpus: CPUSet,
    *,
    start_time: int | None = None,
    proc_root: str | os.PathLike[str] = "/proc",
    include_descendants: bool = True,
    max_passes: int = 32,
    dry_run: bool = False,
) -> AffinityResult:
    """Give every thread of `pid` (and of its descendants) the affinity `cpus`.

    `start_time` (field 22 of /proc/PID/stat) guards against PID reuse: when the live process
    started at another time, ProcessGone is raised and nothing is written. `dry_run` reports
    the threads that would change (one pass) without writing.
    """
    validate_pid(pid)
    if not include_descendants:
        if not cpus:
            raise InputError(f"cannot pin process {pid} to an empty CPU set", reason="empty_cpuset")
        _check_root(pid, start_time, proc_root)
        result = AffinityResult()
        pin_threads(KernelAffinity(proc_root), pid, None, cpus, result, dry_run=dry_run)
        return result
    return pin_process_group(
        ProcessGroup(pid, start_time),
        cpus,
        proc_root=proc_root,
        max_passes=max_passes,
        dry_run=dry_run,
    )


def _check_root(pid: int, start_time: int | None, proc_root: str | os.PathLike[str]) -> int:
    stat = read_stat(pid, proc_root)
    if start_time is not None and stat.start_time != start_time:
        raise ProcessGone(pid, f"{os.fspath(proc_root)}/{pid} (started at {start_time})")
    return stat.start_time


def pin_process_group(
    group: ProcessGroup,
    cpus: CPUSet,
    *,
    proc_root: str | os.PathLike[str] = "/proc",
    allow_within: CPUSet | None = None,
    table: dict[int, ProcStat] | None = None,
    max_passes: int = 32,
    dry_run: bool = False,
) -> AffinityResult:
    """Give every thread of every process of `group` the affinity `cpus`, rescanning /proc
    until a pass changes nothing. `table` (from `process_table`) serves the first pass, so
    many groups can share one scan when nothing changes. ProcessGone when no process of the
    group is left (the root gone or recycled, no session process, no member)."""
    validate_pid(group.pid)
    if not cpus:
        raise InputError(
            f"cannot pin process {group.pid} to an empty CPU set", reason="empty_cpuset"
        )
    result = AffinityResult()
    kernel = KernelAffinity(proc_root)
    for number in range(max_passes):
        if table is None or number:
            table = process_table(proc_root)
        pids = group.pids(table)
        if not pids:
            if number == 0:
                raise ProcessGone(group.pid, f"{os.fspath(proc_root)}/{group.pid}")
            break
        changed_this_pass = 0
        for member in pids:
            changed_this_pass += pin_threads(
                kernel,
                member,
                table[member].start_time,
                cpus,
                result,
                allow_within=allow_within,
                dry_run=dry_run,
            )
        if changed_this_pass == 0 or dry_run:
            break
    return result
