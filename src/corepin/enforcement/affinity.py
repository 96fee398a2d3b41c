"""Per-process CPU affinity for processes outside any container.

`pin_process_tree` sets the affinity of every thread (/proc/PID/task/*) of a process and of its
descendants with `sched_setaffinity`. Threads and processes exit while we walk the tree: an
ESRCH is counted as `vanished`, never an error. New threads inherit the affinity of the thread that
creates them, so the walk repeats (a few passes at most) until a pass finds nothing to change,
which catches threads created by not-yet-pinned threads during an earlier pass.

Idempotent: a thread is only written when its current affinity differs.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass, field

from corepin.core.cpuset import CPUSet
from corepin.core.errors import EnvironmentProblem, InputError
from corepin.core.ids import validate_pid
from corepin.sysfs.procfs import (
    ProcessGone,
    descendants,
    list_threads,
    read_stat,
)

__all__ = [
    "AffinityError",
    "AffinityResult",
    "ThreadChange",
    "get_affinity",
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


@dataclass(frozen=True, slots=True)
class ThreadChange:
    pid: int
    tid: int
    old: CPUSet
    new: CPUSet


@dataclass
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
    parents: dict[int, int] | None = None,
    max_passes: int = 4,
    dry_run: bool = False,
) -> AffinityResult:
    """Give every thread of `pid` (and of its descendants) the affinity `cpus`.

    `start_time` (field 22 of /proc/PID/stat) guards against PID reuse: when the live process
    started at another time, ProcessGone is raised and nothing is written. `parents` (from
    `corepin.sysfs.procfs.parent_map`) reuses one scan of /proc for many calls. `dry_run` reports
    the threads that would change (one pass) without writing.
    """
    validate_pid(pid)
    if not cpus:
        raise InputError(f"cannot pin process {pid} to an empty CPU set", reason="empty_cpuset")
    stat = read_stat(pid, proc_root)
    if start_time is not None and stat.start_time != start_time:
        raise ProcessGone(pid, f"{os.fspath(proc_root)}/{pid} (started at {start_time})")
    result = AffinityResult()
    for number in range(max_passes):
        tree = [pid]
        if include_descendants:
            tree += descendants(pid, proc_root, parents=parents if number == 0 else None)
        changed_this_pass = 0
        for member in tree:
            try:
                tids = list_threads(member, proc_root)
            except ProcessGone:
                continue
            for tid in tids:
                changed_this_pass += _pin_thread(member, tid, cpus, result, dry_run)
        if changed_this_pass == 0 or dry_run:
            break
    return result


def _pin_thread(pid: int, tid: int, cpus: CPUSet, result: AffinityResult, dry_run: bool) -> int:
    try:
        current = get_affinity(tid)
    except ProcessLookupError:
        result.vanished += 1
        return 0
    result.checked += 1
    if current == cpus:
        return 0
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
