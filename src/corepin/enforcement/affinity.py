"""Per-process CPU affinity for processes outside any container.

`pin_process_group` sets the affinity of every thread (/proc/PID/task/*) of every process of a
`ProcessGroup` (a root process with its descendants, its session, and recorded members; see
`corepin.sysfs.procfs`) with `sched_setaffinity`; `pin_process_tree` is the same for one process
tree. Threads and processes exit while we walk: an ESRCH is counted as `vanished`, never an
error. New threads and processes inherit the affinity of the one that creates them, so the walk
rescans /proc and repeats until a pass finds nothing to change (bounded by `max_passes`), which
catches children forked by not-yet-pinned processes between the scan and the pin.

PID reuse: every process is pinned only after its start time is read again and found equal to
the one of the scan (and the root's to the recorded one), so a pid recycled in between is never
touched. Idempotent: a thread is only written when its current affinity differs; a thread that
narrowed its own affinity to a subset of `allow_within` (a workload pinning its workers inside
its exclusive CPUs) is left alone.
"""

from __future__ import annotations

import errno
import os

from corepin.core.cpuset import CPUSet
from corepin.core.errors import EnvironmentProblem, InputError
from corepin.core.ids import validate_pid
from corepin.core.record import field, record
from corepin.sysfs.procfs import (
    ProcessGone,
    ProcessGroup,
    ProcStat,
    list_threads,
    process_table,
    read_stat,
)

__all__ = [
    "AffinityError",
    "AffinityResult",
    "ThreadChange",
    "get_affinity",
    "pin_process_group",
    "pin_process_tree",
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


@record
class ThreadChange:
    pid: int
    tid: int
    old: CPUSet
    new: CPUSet


@record(frozen=False, slots=False)
class AffinityResult:
    """What a pin pass did."""

    changed: list[ThreadChange] = field(default_factory=list)
    checked: int = 0  # thread affinities read
    vanished: int = 0  # threads that exited during the walk
    #: threads whose affinity the kernel narrowed (their cpuset cgroup allows only part of it)
    restricted: list[ThreadChange] = field(default_factory=list)
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
        _pin_threads(pid, None, cpus, None, proc_root, result, dry_run)
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
            changed_this_pass += _pin_threads(
                member, table[member].start_time, cpus, allow_within, proc_root, result, dry_run
            )
        if changed_this_pass == 0 or dry_run:
            break
    return result


def _pin_threads(
    pid: int,
    start_time: int | None,
    cpus: CPUSet,
    allow_within: CPUSet | None,
    proc_root: str | os.PathLike[str],
    result: AffinityResult,
    dry_run: bool,
) -> int:
    """Pin every thread of `pid` after checking that it is still the process that started at
    `start_time` (None: no check). How many threads changed."""
    try:
        if start_time is not None and read_stat(pid, proc_root).start_time != start_time:
            return 0  # the pid was recycled since the scan: not ours
        tids = list_threads(pid, proc_root)
    except ProcessGone:
        return 0
    changed = 0
    for tid in tids:
        changed += _pin_thread(pid, tid, cpus, allow_within, result, dry_run)
    return changed


def _pin_thread(
    pid: int,
    tid: int,
    cpus: CPUSet,
    allow_within: CPUSet | None,
    result: AffinityResult,
    dry_run: bool,
) -> int:
    try:
        current = get_affinity(tid)
    except ProcessLookupError:
        result.vanished += 1
        return 0
    result.checked += 1
    if current == cpus:
        return 0
    if allow_within is not None and current and current.issubset(allow_within):
        return 0  # narrowed itself inside the CPUs it may keep to itself: allowed
    if any(c.tid == tid for c in result.restricted):
        return 0
    if dry_run:
        result.changed.append(ThreadChange(pid, tid, current, cpus))
        return 1
    try:
        set_affinity(tid, cpus, pid=pid)
    except ProcessGone:
        result.vanished += 1
        return 0
    result.writes += 1
    try:
        after = get_affinity(tid)
    except ProcessLookupError:
        result.vanished += 1
        return 1
    result.changed.append(ThreadChange(pid, tid, current, after))
    if after != cpus:
        result.restricted.append(ThreadChange(pid, tid, cpus, after))
        return 0
    return 1
