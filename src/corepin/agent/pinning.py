"""Making processes and cgroups match the state: affinity of process trees, cpuset cgroups.

Host mode pins a run two ways:

- CPU affinity (`sched_setaffinity`) of every thread of CMD and of all its descendants: works
  for any user on their own processes, on any kernel;
- optionally a cpuset cgroup `<cpuset root>/corepin/<assignment id>` holding CMD's process tree
  with `cpuset.cpus` = its CPUs and `cpuset.mems` = the NUMA nodes of those CPUs, so memory is
  allocated on the same nodes and a process cannot widen its own affinity. Setting `cgroups`:
  `auto` uses it when the cpuset hierarchy is writable, `on` requires it, `off` never.

Every check reads first and writes only what differs: in a steady state nothing is written.
A thread that narrowed its own affinity to a subset of its exclusive CPUs (a packet-processing
process pinning its workers from `COREPIN_CPUS_EXCLUSIVE`) is left alone; any other difference
is drift and is re-applied.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from corepin.core.cpuset import CPUSet
from corepin.core.errors import CgroupError, CorepinError, SysfsError

if TYPE_CHECKING:
    from corepin.agent.host import Change
    from corepin.agent.settings import HostSettings
    from corepin.enforcement.cgroups import CgroupDriver
    from corepin.state.model import Assignment
    from corepin.topology.model import Topology


class Pinner:
    """Applies assignments to the host. Counts its writes in `writes`."""

    def __init__(self, settings: HostSettings, topology: Topology) -> None:
        self.settings = settings
        self.topology = topology
        self.writes = 0
        self._driver: CgroupDriver | None = None
        self._cgroups: bool | None = None
        self._parents: dict[int, int] | None = None

    # ------------------------------------------------------------------ cgroups
    @property
    def cgroups_enabled(self) -> bool:
        if self._cgroups is None:
            self._cgroups = self._open_cgroups()
        return self._cgroups

    @property
    def driver(self) -> CgroupDriver | None:
        return self._driver if self.cgroups_enabled else None

    def _open_cgroups(self) -> bool:
        mode = self.settings.cgroups
        if mode == "off":
            return False
        from corepin.enforcement.cgroups import CgroupV1, open_cgroups

        try:
            if self.settings.cgroup_root.rstrip("/") == "/sys/fs/cgroup":
                driver = open_cgroups()
            else:
                driver = CgroupV1(Path(self.settings.cgroup_root) / "cpuset")
            if driver.version != 1:
                # cgroup v2 needs cpuset delegated through cgroup.subtree_control; host mode
                # keeps to affinity there unless asked (the kube agent drives v2 directly).
                if mode == "on":
                    raise CgroupError(
                        os.fspath(driver.root),
                        "host mode places runs in cpuset cgroups on cgroup v1 only; use "
                        "--cgroups off (affinity only)",
                        reason="cgroup_unsupported",
                    )
                return False
            if not os.path.isdir(driver.root):
                raise CgroupError(
                    os.fspath(driver.root),
                    "no cpuset hierarchy here (is cgroup v1 cpuset mounted?): use --cgroups off",
                    reason="no_cpuset_hierarchy",
                )
            if not os.access(driver.root, os.W_OK):
                raise CgroupError(
                    os.fspath(driver.root),
                    "not writable: run as root or use --cgroups off",
                    reason="cgroup_permission",
                )
            parent = self.settings.cgroup_parent
            if not driver.exists(parent):
                driver.create(parent)
                self.writes += 1
            self._driver = driver
            return True
        except CorepinError:
            if mode == "on":
                raise
            return False

    def cgroup_path_for(self, assignment_id: str) -> str:
        from corepin.core.ids import validate_component

        return f"{self.settings.cgroup_parent}/{validate_component(assignment_id, 'run id')}"

    def cgroup_exists(self, path: str) -> bool:
        driver = self.driver
        return driver is not None and driver.exists(path)

    def _sync_cgroup(self, path: str, cpus: CPUSet, mems: CPUSet) -> list[str]:
        """Make the group's cpus/mems equal to the wanted ones; what changed (empty: nothing)."""
        driver = self.driver
        if driver is None or not driver.exists(path):
            return []
        done: list[str] = []
        current_mems = driver.read_mems_text(path)
        current_cpus = driver.read_cpus_text(path)
        want_mems = str(mems)
        if mems and current_mems and current_mems != want_mems:
            # widen mems first so the cpus write never leaves the group without a node
            union = CPUSet.parse(current_mems) | mems
            if str(union) != current_mems:
                driver.write_mems(path, union)
                self.writes += 1
        if current_cpus != str(cpus):
            driver.write_cpus(path, cpus)
            self.writes += 1
            done.append(f"cpuset.cpus {current_cpus or '(empty)'} -> {cpus}")
        if mems and driver.read_mems_text(path) != want_mems:
            driver.write_mems(path, mems)
            self.writes += 1
            done.append(f"cpuset.mems {current_mems or '(empty)'} -> {mems}")
        return done

    # ------------------------------------------------------------------ processes
    def _tree(self, pid: int) -> list[int]:
        from corepin.sysfs.procfs import descendants, parent_map

        if self._parents is None:
            self._parents = parent_map(self.settings.proc_root)
        return [pid, *descendants(pid, self.settings.proc_root, parents=self._parents)]

    def forget_processes(self) -> None:
        """Drop the cached process table (call at the start of every pass)."""
        self._parents = None

    def _pin_tree(self, a: Assignment, want: CPUSet) -> tuple[int, int]:
        """(threads re-pinned, threads seen) for the process tree of `a`."""
        from corepin.enforcement.affinity import get_affinity, set_affinity
        from corepin.sysfs.procfs import ProcessGone, list_threads

        if a.pid is None:
            return 0, 0
        proc = self.settings.proc_root
        changed = seen = 0
        for pid in self._tree(a.pid):
            try:
                tids = list_threads(pid, proc)
            except (ProcessGone, SysfsError):
                continue
            for tid in tids:
                try:
                    current = get_affinity(tid)
                except ProcessLookupError:
                    continue
                seen += 1
                if current == want:
                    continue
                if a.kind != "shared" and current and current.issubset(a.cpus):
                    continue  # pinned itself inside its own exclusive CPUs: allowed
                try:
                    set_affinity(tid, want, pid=pid)
                except ProcessGone:
                    continue
                self.writes += 1
                changed += 1
        return changed, seen

    # ------------------------------------------------------------------ assignments
    def wanted(self, a: Assignment, pool: CPUSet) -> tuple[CPUSet, CPUSet]:
        """(affinity, mems) an assignment should have with shared pool `pool`."""
        cpus = a.affinity(pool)
        mems = self.topology.mems_of(cpus) if a.kind != "exclusive" or not a.mems else a.mems
        return cpus, mems

    def prepare(self, path: str, cpus: CPUSet, mems: CPUSet) -> str:
        """Create a run's cgroup with its CPUs and nodes; the `cgroup.procs` file to join it."""
        driver = self.driver
        if driver is None:
            raise CgroupError(self.settings.cgroup_root, "cgroups are not enabled")
        driver.create(path)
        self.writes += 1
        self._sync_cgroup(path, cpus, mems)
        return os.path.join(driver.dir(path), "cgroup.procs")

    def apply(self, a: Assignment, pool: CPUSet) -> list[Change]:
        """Re-apply one assignment (cgroup first, then every thread's affinity)."""
        return self.apply_all([a], pool)

    def apply_all(self, assignments: list[Assignment], pool: CPUSet) -> list[Change]:
        """Re-apply `assignments`: their cgroups in one pass of the enforcement reconcile engine
        (which orders widening and shrinking across the hierarchy and writes only what
        differs), then the affinity of every thread of their process trees. What changed."""
        from corepin.agent.host import Change

        changes: list[Change] = []
        driver = self.driver
        wanted = {a.id: self.wanted(a, pool) for a in assignments}
        if driver is not None:
            from corepin.enforcement.reconcile import CgroupTarget, Reconciler

            targets = [
                CgroupTarget(a.cgroup, cpus=wanted[a.id][0], mems=wanted[a.id][1], owner=a.id)
                for a in assignments
                if a.cgroup is not None and wanted[a.id][0]
            ]
            if targets:
                owners = {driver.rel(t.path): t.owner for t in targets}
                report = Reconciler(
                    driver, proc_root=self.settings.proc_root, topology=self.topology
                ).reconcile(targets)
                self.writes += report.writes
                for c in report.changes:
                    owner = owners.get(c.path, c.path)
                    why = "" if c.why == "target" else f" ({c.why})"
                    changes.append(
                        Change(
                            "repinned",
                            owner,
                            f"cgroup {c.path}: {c.what} {c.old or '(empty)'} -> {c.new}{why}",
                        )
                    )
                for err in report.errors:
                    changes.append(Change("failed", "-", err.message))
        for a in assignments:
            cpus = wanted[a.id][0]
            if not cpus:
                continue
            changed, seen = self._pin_tree(a, cpus)
            if changed:
                changes.append(
                    Change(
                        "repinned",
                        a.id,
                        f"set affinity {cpus} on {changed} of {seen} thread(s) of pid {a.pid}",
                    )
                )
        return changes

    def remove(self, a: Assignment) -> None:
        """Remove the run's cgroup if it is empty (left for `remove_orphans` otherwise)."""
        driver = self.driver
        if driver is None or a.cgroup is None or not driver.exists(a.cgroup):
            return
        if not a.cgroup.startswith(self.settings.cgroup_parent + "/"):
            return  # not ours (a container's cgroup): never removed by host mode
        try:
            driver.remove(a.cgroup)
            self.writes += 1
        except CgroupError:
            pass

    def remove_orphans(self, live_ids: set[str]) -> list[Change]:
        """Remove empty `corepin/<id>` groups whose assignment is gone."""
        from corepin.agent.host import Change

        driver = self.driver
        if driver is None:
            return []
        out: list[Change] = []
        for group in driver.child_groups(self.settings.cgroup_parent):
            name = group.rsplit("/", 1)[-1]
            if name in live_ids:
                continue
            try:
                if driver.procs(group):
                    continue
                driver.remove(group)
                self.writes += 1
            except CgroupError:
                continue
            out.append(Change("removed", name, f"empty cgroup {group} of a finished run"))
        return out
