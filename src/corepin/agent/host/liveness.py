"""Which assignments of a host still have processes: RUNNING, LINGERING, DEAD or UNKNOWN, and
the reaping of the dead ones.

Which processes belong to a run: its cpuset cgroup when it has one; else its session (a run
that is not the foreground job of a terminal leads a session of its own) and its process tree;
for a foreground job of a terminal, corepin becomes the run's child subreaper and records the
processes that outlive CMD. Every check compares start times, so a recycled pid never counts.

One scan of /proc serves a whole transaction (`Liveness.table`); a run whose main process (or
the corepin run waiting for it) is alive is told so from those processes' own stat files,
without the scan (`plainly_alive`).

On the start-up path of `corepin run`: the imports inside functions stay there on purpose (each
module loaded costs every run its time).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Final

from corepin.core.errors import SysfsError
from corepin.enforcement.note import Note

if TYPE_CHECKING:
    from corepin.agent.host.pinning import Pinner
    from corepin.state.model import Assignment, HostState
    from corepin.sysfs.procfs import ProcStat

#: What the processes of an assignment are doing (`Liveness.status`).
RUNNING: Final = "running"  # its main process (or the corepin run waiting for it) lives
LINGERING: Final = "lingering"  # the main process is gone, others of the run live on
DEAD: Final = "dead"  # nothing of it is left: its CPUs can be freed
UNKNOWN: Final = "unknown"  # tied to a cgroup this mode cannot see: never freed from here


class Liveness:
    """The liveness of a host's assignments, from /proc and their cgroups (`pinner`)."""

    def __init__(self, proc_root: str, pinner: Callable[[], Pinner]) -> None:
        self._proc_root = proc_root
        self._pinner = pinner
        self._snapshot: dict[int, ProcStat] | None = None

    def forget(self) -> None:
        """Drop the process table: the next question scans /proc again (a new transaction)."""
        self._snapshot = None

    def table(self, *, fresh: bool = False) -> dict[int, ProcStat]:
        """The process table: the transaction's snapshot (taken on first use), or a new scan
        with `fresh` (after this transaction changed processes, e.g. killed some)."""
        from corepin.sysfs.procfs import process_table

        if self._snapshot is None or fresh:
            self._snapshot = process_table(self._proc_root)
        return self._snapshot

    def status(
        self, a: Assignment, table: dict[int, ProcStat], *, ignore_runner: bool = False
    ) -> str:
        """RUNNING, LINGERING, DEAD or UNKNOWN (see the constants) for `a` given a process
        table. `ignore_runner`: the corepin run waiting for it does not count (it is asking)."""
        from corepin.sysfs.procfs import ProcessGroup

        process = a.process
        if process is not None:
            if _same_process(table, process.pid, process.start_time):
                return RUNNING
            if not ignore_runner and _same_process(
                table, process.runner_pid, process.runner_start_time
            ):
                return RUNNING
            in_cgroup = self._pinner().cgroup_pids(a)
            if in_cgroup:
                return LINGERING
            group = ProcessGroup(process.pid, process.start_time, process.session, process.members)
            if group.pids(table):
                return LINGERING
            if in_cgroup is None and process.cgroup is not None:
                return UNKNOWN
            return DEAD
        if a.container is not None:
            exists = self._pinner().cgroup_exists(a)
            if exists is None:
                return UNKNOWN if a.cgroup is not None else DEAD
            return RUNNING if exists else DEAD
        return DEAD

    def statuses(self, state: HostState) -> dict[str, str]:
        """Assignment id -> RUNNING, LINGERING, DEAD or UNKNOWN (one scan of /proc)."""
        table = self.table()
        return {a.id: self.status(a, table) for a in state}

    def plainly_alive(self, a: Assignment) -> bool:
        """Whether `a` is RUNNING by its main process or by the corepin run waiting for it,
        read from those processes' own stat files: a host's other runs are usually alive, and
        proving it this way spares the scan of every process (`table`) that telling a
        lingering run from a dead one needs. Within a transaction that took its snapshot
        already, the snapshot answers (one view of the processes per transaction)."""
        process = a.process
        if process is None:
            return False
        table = self._snapshot
        if table is not None:
            return _same_process(table, process.pid, process.start_time) or _same_process(
                table, process.runner_pid, process.runner_start_time
            )
        from corepin.sysfs.procfs import ProcessGone, read_stat

        for pid, start in (
            (process.pid, process.start_time),
            (process.runner_pid, process.runner_start_time),
        ):
            if pid is None:
                continue
            try:
                st = read_stat(pid, self._proc_root)
            except (ProcessGone, SysfsError):
                continue
            if st.alive and (start is None or st.start_time == start):
                return True
        return False

    def dead_ids(self, state: HostState) -> set[str]:
        """The ids of the assignments of `state` of which nothing is left alive."""
        return {a.id for a in state if not self.plainly_alive(a) and self.dead(a)}

    def dead(self, a: Assignment, table: dict[int, ProcStat] | None = None) -> bool:
        if table is None:  # a container's or an ownerless record needs no process table
            table = self.table() if a.process is not None else {}
        return self.status(a, table) == DEAD

    def reap(
        self, state: HostState, table: dict[int, ProcStat] | None = None
    ) -> tuple[HostState, list[Note]]:
        """`state` without the assignments of which nothing is left alive."""
        if not state.assignments:
            return state, []
        dead = [
            a
            for a in state
            if (table is not None or not self.plainly_alive(a)) and self.dead(a, table)
        ]
        changes = [
            Note("freed", a.id, f"{a.label} is gone; released CPUs {a.withheld or '-'}")
            for a in dead
        ]
        return state.remove_many(a.id for a in dead), changes


def _same_process(table: dict[int, ProcStat], pid: int | None, start_time: int | None) -> bool:
    """Whether `pid` is in `table`, alive, and started at `start_time` (when known)."""
    if pid is None:
        return False
    st = table.get(pid)
    return st is not None and st.alive and (start_time is None or st.start_time == start_time)
