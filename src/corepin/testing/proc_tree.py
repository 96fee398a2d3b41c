"""Write a stand-in /proc tree: processes (stat, status, task/, cgroup) and IRQs.

`ProcTree(root)` lays out what corepin's /proc readers look at, in the kernel's formats
(proc(5)): `<pid>/stat` (comm in parentheses, state, ppid, pgrp, session, flags, utime, stime,
starttime at their field numbers), `<pid>/status` and `<pid>/task/<tid>/{stat,status}` with
`Cpus_allowed_list`, `<pid>/cgroup` (v1 lines and the v2 `0::` line), `irq/<n>/
smp_affinity_list`, `irq/default_smp_affinity` (a mask) and `uptime`. There is no `self` link,
so corepin treats the tree as a stand-in and never touches a real thread through it
(`corepin.enforcement.shield.engine.kernel_proc`).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path

from corepin.core.cpuset import CPUSet
from corepin.sysfs.procfs import PF_KTHREAD, PF_NO_SETAFFINITY

__all__ = ["PF_KTHREAD", "PF_NO_SETAFFINITY", "ProcTree", "stat_line"]


def stat_line(
    pid: int,
    comm: str,
    *,
    ppid: int = 1,
    start: int = 100,
    state: str = "S",
    flags: int = 0,
    utime: int = 0,
    stime: int = 0,
    session: int = 0,
) -> str:
    """A /proc/PID/stat line (fields 3..52 after `(comm)`)."""
    fields = ["0"] * 50
    fields[0] = state  # 3
    fields[1] = str(ppid)  # 4
    fields[2] = str(pid)  # 5 pgrp
    fields[3] = str(session)  # 6
    fields[6] = str(flags)  # 9
    fields[11] = str(utime)  # 14
    fields[12] = str(stime)  # 15
    fields[19] = str(start)  # 22
    return f"{pid} ({comm}) " + " ".join(fields) + "\n"


class ProcTree:
    """A stand-in /proc below `root` (created as needed)."""

    def __init__(self, root: str | os.PathLike[str], *, uptime: float = 1000.0) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "uptime").write_text(f"{uptime:.2f} 0.00\n")
        (self.root / "irq").mkdir(exist_ok=True)

    def add(
        self,
        pid: int,
        comm: str,
        *,
        ppid: int = 1,
        start: int = 100,
        cpus: CPUSet,
        flags: int = 0,
        threads: Iterable[int] = (),
        cgroup: str = "/",
        cgroups: Mapping[str, str] | None = None,
        state: str = "S",
        utime: int = 0,
        stime: int = 0,
    ) -> None:
        """A process with its main thread (and `threads`), allowed on `cpus`, in the group
        `cgroup` of every hierarchy (v1 cpuset and v2), or per hierarchy with `cgroups`
        (controller -> path; "" names the v2 line)."""
        base = self.root / str(pid)
        line = stat_line(
            pid, comm, ppid=ppid, start=start, state=state, flags=flags, utime=utime, stime=stime
        )
        for tid in (pid, *threads):
            task = base / "task" / str(tid)
            task.mkdir(parents=True, exist_ok=True)
            (task / "stat").write_text(line.replace(f"{pid} (", f"{tid} (", 1))
            (task / "status").write_text(self._status(pid, comm, ppid, cpus))
        (base / "stat").write_text(line)
        (base / "status").write_text(self._status(pid, comm, ppid, cpus))
        groups = dict(cgroups) if cgroups is not None else {"cpuset": cgroup, "": cgroup}
        lines = []
        for number, (controller, path) in enumerate(sorted(groups.items(), reverse=True)):
            lines.append(f"0::{path}" if not controller else f"{number + 2}:{controller}:{path}")
        (base / "cgroup").write_text("\n".join(lines) + "\n")

    def remove(self, pid: int) -> None:
        """The process exits (its directory goes)."""
        shutil.rmtree(self.root / str(pid), ignore_errors=True)

    @staticmethod
    def _status(pid: int, comm: str, ppid: int, cpus: CPUSet) -> str:
        return (
            f"Name:\t{comm}\nPid:\t{pid}\nPPid:\t{ppid}\n"
            f"Cpus_allowed:\t{cpus.to_mask()}\nCpus_allowed_list:\t{cpus}\n"
            "Mems_allowed_list:\t0\n"
        )

    def affinity(self, pid: int, tid: int | None = None) -> CPUSet:
        """The `Cpus_allowed_list` the tree holds for a thread (the main one by default)."""
        path = self.root / str(pid) / "task" / str(tid or pid) / "status"
        for line in path.read_text().splitlines():
            if line.startswith("Cpus_allowed_list:"):
                return CPUSet.parse(line.split(":", 1)[1].strip())
        raise AssertionError(f"no Cpus_allowed_list in {path}")

    def irq(self, number: int, cpus: CPUSet) -> None:
        d = self.root / "irq" / str(number)
        d.mkdir(parents=True, exist_ok=True)
        (d / "smp_affinity_list").write_text(f"{cpus}\n")

    def irq_affinity(self, number: int | str) -> CPUSet:
        if number == "default":
            text = (self.root / "irq" / "default_smp_affinity").read_text().strip()
            return CPUSet.from_mask(text)
        return CPUSet.parse((self.root / "irq" / str(number) / "smp_affinity_list").read_text())

    def default_irq(self, cpus: CPUSet) -> None:
        (self.root / "irq" / "default_smp_affinity").write_text(cpus.to_mask() + "\n")
