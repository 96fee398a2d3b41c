"""`corepin release ID [--kill]`: end an assignment on purpose.

With `kill`, its processes get SIGTERM, and SIGKILL after KILL_GRACE seconds, then its CPUs are
freed. Without, its CPUs are freed and processes of it that still run move to the shared pool
(the assignment stays, as a shared one, until they exit). A process is signalled only while it
is the one that started at the recorded time (a pidfd pins it), so a recycled pid never is.
"""

from __future__ import annotations

import os
import signal
import time
from typing import TYPE_CHECKING, Final

from corepin.agent.host.agent import HostAgent
from corepin.agent.host.liveness import LINGERING, RUNNING
from corepin.core.cpuset import CPUSet
from corepin.core.errors import InputError
from corepin.enforcement.note import Note
from corepin.sysfs.procfs import ProcessGone, ProcessGroup, process_start_time

if TYPE_CHECKING:
    from corepin.state.model import Assignment

#: How long `release --kill` waits after SIGTERM before it sends SIGKILL.
KILL_GRACE: Final = 5.0


def release(host: HostAgent, assignment_id: str, *, kill: bool = False) -> list[Note]:
    """End an assignment on purpose (see the module docstring): what changed."""
    with host.transaction() as txn:
        state = txn.state
        a = state.get(assignment_id)
        if a is None:
            known = ", ".join(a.id for a in state) or "none"
            raise InputError(
                f"no allocation {assignment_id!r} (allocations: {known})",
                reason="unknown_id",
            )
        changes: list[Note] = []
        if kill:
            if a.process is None:
                raise InputError(
                    f"{assignment_id!r} belongs to container {a.label}: --kill ends "
                    "corepin runs only; stop containers through their runtime",
                    reason="bad_usage",
                )
            killed = _kill(host, a)
            changes.append(Note("killed", a.id, f"{killed} process(es)"))
        table = host.liveness.table(fresh=kill)
        if host.liveness.status(a, table, ignore_runner=True) in (RUNNING, LINGERING):
            # off its reservation too: a one-time one ends, a reusable one is free again
            moved = a.evolve(
                kind="shared",
                cpus=CPUSet(),
                withheld=CPUSet(),
                mems=CPUSet(),
                level="cpu",
                reservation=None,
            )
            state = txn.commit(host.sync_shield(state.replace_assignment(moved)))
            changes.append(
                Note(
                    "released",
                    a.id,
                    f"CPUs {a.withheld or '-'}; its processes now run in the shared pool",
                )
            )
            changes.extend(host.enforce(state))
            return changes
        state = txn.commit(host.sync_shield(state.remove(assignment_id)))
        host.remove_cgroups(state)
        changes.append(Note("released", a.id, f"CPUs {a.withheld or '-'}"))
        if a.exclusive:
            changes.extend(host.repin_shared(state))
        return changes


def _kill(host: HostAgent, a: Assignment) -> int:
    """SIGTERM every process of `a` (checked by start time through a pidfd, so a recycled
    pid is never signalled), wait up to KILL_GRACE seconds, SIGKILL what is left."""
    process = a.process
    assert process is not None
    group = ProcessGroup(process.pid, process.start_time, process.session, process.members)
    proc_root = host.settings.proc_root

    def members() -> dict[int, int]:
        table = host.liveness.table(fresh=True)
        found = {pid: table[pid].start_time for pid in group.pids(table)}
        for pid in host.pinner.cgroup_pids(a) or ():
            st = table.get(pid)
            if st is not None and st.alive:
                found[pid] = st.start_time
        found.pop(os.getpid(), None)
        return found

    first = members()
    for pid, start in first.items():
        _signal_exactly(pid, start, signal.SIGTERM, proc_root)
    deadline = time.monotonic() + KILL_GRACE
    left = members()
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = members()
    for pid, start in left.items():
        _signal_exactly(pid, start, signal.SIGKILL, proc_root)
    return len(first | left)


def _signal_exactly(pid: int, start_time: int, sig: int, proc_root: str) -> None:
    """Send `sig` to `pid` only if it is still the process that started at `start_time`: the
    pidfd pins the process, so the check cannot be raced by pid reuse."""
    try:
        fd = os.pidfd_open(pid)
    except (ProcessLookupError, OSError):
        return
    try:
        if process_start_time(pid, proc_root) != start_time:
            return
        signal.pidfd_send_signal(fd, sig)
    except (ProcessGone, ProcessLookupError, PermissionError):
        pass
    finally:
        os.close(fd)
