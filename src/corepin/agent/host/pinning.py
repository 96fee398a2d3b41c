"""Making processes and cgroups match the state: affinity of process groups, cpuset cgroups.

Host mode pins a run two ways:

- CPU affinity (`sched_setaffinity`) of every thread of every process of the run (its tree, its
  session, its recorded members; `corepin.sysfs.procfs.ProcessGroup`): works for any user on
  their own processes, on any kernel;
- optionally a cpuset cgroup `<cpuset root>/<cgroup parent>/<assignment id>` holding the run's
  processes with `cpuset.cpus` = its CPUs and `cpuset.mems` = the NUMA nodes of those CPUs, so
  memory is allocated on the same nodes and a process cannot widen its own affinity. Setting
  `cgroups`: `auto` uses it when the cpuset hierarchy is writable, `on` requires it, `off` never.
  The cgroup parent is per state directory (`HostSettings.cgroup_parent`). Both cgroup v1 (the
  cpuset controller's own mount) and v2 (the unified hierarchy offering `cpuset`: each group
  corepin creates gets `+cpuset` in its parent's `cgroup.subtree_control`) work the same way.
- a best-effort run (`corepin run --qos-class BE`) is placed in the state directory's one BE
  group, `<cgroup parent>/besteffort/<assignment id>`, whose cpuset the node QoS loop
  (`corepin reconcile`) narrows while latency-sensitive work needs the CPUs: a BE run's CPUs are
  the BE group's current cpuset within the shared pool (`be_cpus`), never the whole pool while
  the loop keeps it smaller. On cgroup v1 every run's group is made in the cpu and cpuacct
  hierarchies too and the run joins them (`accounting_joins`), so a quota on the BE group and
  the CPU accounting the loop reads work; on cgroup v2 the BE group gets `cpu` in its
  `cgroup.subtree_control` where the hierarchy offers it.
- on cgroup v2, an exclusive run may ask for a cpuset partition (`corepin run --partition
  root|isolated`): its group is then `<cgroup parent with / as .>.<assignment id>` directly
  below the hierarchy root (the kernel wants a partition's parent to be a partition, and the
  root is one), and `cpuset.cpus.partition` takes its CPUs away from every other cgroup of the
  host (`isolated` also from the scheduler's load balancing). The kernel may refuse or
  invalidate a partition (CPUs another group holds, an offline CPU): the state is read back,
  and an invalid one is undone (`member`), so the run keeps a plain cpuset (see
  `claim_partition`).

Both go through the one enforcement engine (`corepin.enforcement.reconcile.Reconciler`): read
first, write only what differs, so a steady state writes nothing. A thread that narrowed its own
affinity to a subset of its exclusive CPUs (a packet-processing process pinning its workers from
`COREPIN_CPUS_EXCLUSIVE`) is left alone; any other difference is drift and is re-applied.

Trust: the checkpoint says which cgroup and processes belong to an assignment, and a forged or
stale checkpoint must not make root touch anything else. A cgroup is written only when it is the
run's own group below this state directory's parent, or a container cgroup in the kubelet's
layout (`kubepods` / `kubepods.slice`); a process only when its start time is the recorded one.
"""

from __future__ import annotations

import contextlib
import os
from typing import TYPE_CHECKING, Final, Literal

from corepin.core.cpuset import CPUSet
from corepin.core.errors import CgroupError, CorepinError

if TYPE_CHECKING:
    from corepin.agent.host.settings import HostSettings
    from corepin.enforcement.cgroups import CgroupDriver, PartitionState
    from corepin.enforcement.note import Note
    from corepin.enforcement.reconcile import CgroupTarget, ProcessTarget
    from corepin.state.model import Assignment
    from corepin.topology.model import Topology


def usable_hierarchy(driver: CgroupDriver) -> CgroupDriver:
    """`driver` when its hierarchy is there and carries the cpuset controller; CgroupError
    (no_cpuset_hierarchy) otherwise. A cgroup v2 driver is set to enable only `cpuset` in the
    groups it creates (host mode needs nothing else, and a v2 host may not offer `cpu`), and
    never in a group that holds processes (`CgroupV2.guard_processes`)."""
    from corepin.enforcement.cgroups import CgroupV2

    if not os.path.isdir(driver.root):
        raise CgroupError(
            os.fspath(driver.root),
            "no cpuset hierarchy here (cgroup v1 cpuset, or cgroup v2 with the cpuset "
            "controller): use --cgroups off",
            reason="no_cpuset_hierarchy",
        )
    if isinstance(driver, CgroupV2):
        try:
            offered = driver.read_file("", "cgroup.controllers").split()
        except CgroupError:
            offered = []
        if "cpuset" not in offered:
            raise CgroupError(
                os.path.join(driver.root, "cgroup.controllers"),
                "this cgroup v2 hierarchy offers no cpuset controller (is it bound to a v1 "
                "hierarchy? boot with cgroup_no_v1=cpuset or all): use --cgroups off",
                reason="no_cpuset_hierarchy",
            )
        driver.controllers = ("cpuset",)
        driver.guard_processes = True  # never turn someone's group with processes threaded
    return driver


#: The group below a state directory's cgroup parent that holds its best-effort runs.
BE_GROUP: Final = "besteffort"


class Pinner:
    """Applies assignments to the host. Counts its writes in `writes`."""

    def __init__(self, settings: HostSettings, topology: Topology) -> None:
        self.settings = settings
        self.topology = topology
        self.writes = 0
        self._driver: CgroupDriver | None = None
        self._cgroups: bool | None = None
        self._inspector: CgroupDriver | Literal[False] | None = None
        self._cpuacct: str | Literal[False] | None = False  # False: not looked up yet

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
        from corepin.enforcement.cgroups import open_cpuset_hierarchy

        try:
            driver = open_cpuset_hierarchy(self.settings.cgroup_root)
            usable_hierarchy(driver)
            if not os.access(driver.root, os.W_OK):
                raise CgroupError(
                    os.fspath(driver.root),
                    "not writable: run as root or use --cgroups off",
                    reason="cgroup_permission",
                )
            parent = self.settings.cgroup_parent
            if not driver.exists(parent):
                try:
                    self.writes += len(driver.create(parent))
                except CgroupError as err:
                    # v2: a group on the way holds processes, so no run group can be made
                    # below it (`prepare` says why); a partition's group below the root can
                    if err.reason != "cgroup_has_processes" or mode != "on":
                        raise
            self._driver = driver
            return True
        except CorepinError:
            if mode == "on":
                self._cgroups = False  # nothing was made: releasing the run has none to remove
                raise
            return False

    def cgroup_path_for(self, assignment_id: str, *, best_effort: bool = False) -> str:
        """A run's own group: `<parent>/<id>`, or `<parent>/besteffort/<id>` for a BE run."""
        from corepin.core.ids import validate_component

        below = self.be_group if best_effort else self.settings.cgroup_parent
        return f"{below}/{validate_component(assignment_id, 'run id')}"

    @property
    def be_group(self) -> str:
        """The group of this state directory's best-effort runs (the QoS loop's BE group)."""
        return f"{self.settings.cgroup_parent}/{BE_GROUP}"

    def be_cpus(self, pool: CPUSet) -> CPUSet:
        """The CPUs best-effort runs get with shared pool `pool` (`besteffort.be_cpus`)."""
        from corepin.agent.host.besteffort import be_cpus

        return be_cpus(self.inspector, self.be_group, pool)

    def partition_path_for(self, assignment_id: str) -> str:
        """The group of a partitioned run: `<parent, / as .>.<id>` below the hierarchy root."""
        from corepin.core.ids import validate_component

        return f"{self.partition_prefix}{validate_component(assignment_id, 'run id')}"

    @property
    def partition_prefix(self) -> str:
        return self.settings.cgroup_parent.strip("/").replace("/", ".") + "."

    def is_partition_path(self, path: str | None) -> bool:
        return (
            path is not None
            and "/" not in path.strip("/")
            and path.strip("/").startswith(self.partition_prefix)
        )

    def trusted_cgroup(self, a: Assignment) -> str | None:
        """The assignment's cgroup when corepin may touch it: a run's own group below this
        state directory's parent (`<parent>/<id>`) or its partition group (`<parent with / as
        .>.<id>`), or a container's group in the kubelet's layout. None for anything else (a
        forged or foreign path is never written)."""
        from corepin.core.ids import IdError, split_cgroup_path

        path = a.cgroup
        if path is None:
            return None
        try:
            parts = split_cgroup_path(path)
        except IdError:
            return None
        rel = "/".join(parts)
        if a.process is not None:
            try:
                own = (
                    self.cgroup_path_for(a.id),
                    self.cgroup_path_for(a.id, best_effort=True),
                    self.partition_path_for(a.id),
                )
            except IdError:
                return None
            return rel if rel in own else None
        if a.container is not None and parts and len(parts) > 1:
            from corepin.enforcement.layout import KUBELET_PARENTS  # (not on a run's way)

            return rel if parts[0] in KUBELET_PARENTS else None
        return None

    @property
    def inspector(self) -> CgroupDriver | None:
        """A driver to look at the cpuset hierarchy with: the writing one when cgroups are
        enabled, else a read-only view when the hierarchy is there (so `--cgroups off` still
        sees whether a run's cgroup holds processes), else None. Looking never creates or
        writes anything (a report stays read-only)."""
        if self._driver is not None:
            return self._driver
        if self._inspector is None:
            from corepin.enforcement.cgroups import open_cpuset_hierarchy

            try:
                view: CgroupDriver | None = open_cpuset_hierarchy(self.settings.cgroup_root)
            except CorepinError:
                view = None
            try:
                if view is not None:
                    usable_hierarchy(view)
                self._inspector = view or False
            except CorepinError:
                self._inspector = False
        return self._inspector or None

    def cgroup_exists(self, a: Assignment) -> bool | None:
        """Whether the assignment's (trusted) cgroup exists; None when that cannot be seen
        here (no cpuset hierarchy, or no trusted cgroup)."""
        view = self.inspector
        path = self.trusted_cgroup(a)
        if view is None or path is None:
            return None
        return view.exists(path)

    def cgroup_pids(self, a: Assignment) -> list[int] | None:
        """The processes in the assignment's (trusted) cgroup: None when that cannot be seen
        here; [] when the group is empty or gone."""
        view = self.inspector
        path = self.trusted_cgroup(a)
        if view is None or path is None:
            return None
        if not view.exists(path):
            return []
        try:
            return view.procs(path)
        except CgroupError:
            return [] if not view.exists(path) else None

    # ------------------------------------------------------------------ assignments
    def prepare(self, path: str, cpus: CPUSet, mems: CPUSet) -> str:
        """Create a run's cgroup with its CPUs and nodes; the file a new, single-threaded
        process writes to join it (see `corepin.agent.host.launch`): on a cgroup v1 hierarchy its
        `tasks` file, which takes `0` for the calling thread and then moves it without the
        kernel's write lock on every thread group of the system (taking that lock waits for an
        RCU grace period: milliseconds, the bulk of a run's start-up); elsewhere `cgroup.procs`
        (cgroup v2 has no such path; a fake tree stands in for the kernel with plain files)."""
        from corepin.enforcement.reconcile import CgroupTarget, Reconciler

        driver = self.driver
        if driver is None:
            raise CgroupError(self.settings.cgroup_root, "cgroups are not enabled")
        if path.startswith(self.be_group + "/"):
            from corepin.agent.host.besteffort import make_be_group

            self.writes += make_be_group(driver, self.be_group)
        self.writes += len(driver.create(path))
        report = Reconciler(driver, proc_root=self.settings.proc_root).reconcile(
            [CgroupTarget(path, cpus=cpus, mems=mems)]
        )
        self.writes += report.writes
        if report.errors:
            raise report.errors[0]
        join = "tasks" if driver.version == 1 and not driver.fake_tree else "cgroup.procs"
        return os.path.join(driver.dir(path), join)

    @property
    def cpuacct_root(self) -> str | None:
        """cgroup v1: the cpuacct hierarchy when it is a mount of its own; else None."""
        if self._cpuacct is False:
            from corepin.agent.host.besteffort import find_cpuacct_root

            driver = self.driver
            self._cpuacct = find_cpuacct_root(driver, self.settings.cgroup_root) if driver else None
        return self._cpuacct

    def accounting_joins(self, path: str) -> tuple[str, ...]:
        """The files a new run's process also writes itself into (`besteffort.accounting_joins`:
        the cpu and cpuacct hierarchies of cgroup v1)."""
        from corepin.agent.host.besteffort import accounting_joins

        driver = self.driver
        return accounting_joins(driver, path, self.cpuacct_root) if driver else ()

    def remove_group(self, driver: CgroupDriver, group: str) -> None:
        """Remove the (empty) group in every hierarchy corepin made it in."""
        driver.remove(group)
        acct = self.cpuacct_root
        if acct is not None:
            with contextlib.suppress(OSError):  # not made there, or already gone
                os.rmdir(driver.dir(group, acct))

    def claim_partition(self, path: str, mode: str) -> PartitionState:
        """Make the run group `path` (prepared, no tasks yet) a cpuset partition of `mode`
        (root or isolated) and read back what the kernel made of it. An invalid partition is
        undone (`member`): the run keeps a plain cpuset with the same CPUs. The returned
        state is the kernel's answer to the request (invalid ones carry the reason)."""
        from corepin.enforcement.cgroups import CgroupV2

        driver = self.driver
        if not isinstance(driver, CgroupV2):
            raise CgroupError(
                self.settings.cgroup_root,
                "cpuset partitions need a cgroup v2 cpuset hierarchy",
                reason="cgroup_unsupported",
            )
        got = driver.set_partition(path, mode)
        self.writes += 1
        if not got.valid:
            self._fall_back(driver, path)
        return got

    def _fall_back(self, driver: CgroupDriver, path: str) -> None:
        """Undo a partition of `path` the kernel does not honour (back to `member`)."""
        from corepin.enforcement.cgroups import CgroupV2

        if isinstance(driver, CgroupV2) and driver.read_partition(path).mode != "member":
            driver.set_partition(path, "member")
            self.writes += 1

    def check_partitions(self, assignments: list[Assignment]) -> list[Note]:
        """Partitions of exclusive runs that the kernel invalidated since (an offline CPU, a
        group elsewhere claiming the CPUs), and partitions of runs that are not exclusive any
        more (released to the shared pool): each falls back to `member`, reported."""
        from corepin.enforcement.cgroups import CgroupV2
        from corepin.enforcement.note import Note

        driver = self.driver
        if not isinstance(driver, CgroupV2):
            return []
        out: list[Note] = []
        for a in assignments:
            path = self.trusted_cgroup(a)
            if path is None or not self.is_partition_path(path) or not driver.exists(path):
                continue
            try:
                state = driver.read_partition(path)
                if state.mode == "member":
                    continue
                if state.valid and a.kind == "exclusive":
                    continue
                self._fall_back(driver, path)
            except CgroupError as err:
                out.append(Note("failed", a.id, err.message))
                continue
            why = "the run is not exclusive any more" if state.valid else "the kernel says so"
            out.append(
                Note(
                    "repinned",
                    a.id,
                    f"cgroup {path}: partition {state} -> member ({why}; a plain cpuset now)",
                )
            )
        return out

    def targets(
        self, a: Assignment, pool: CPUSet, be_cpus: CPUSet | None = None
    ) -> tuple[CgroupTarget | None, ProcessTarget | None]:
        """The enforcement targets of one assignment: its trusted cgroup and its processes.
        A best-effort assignment's pool is `be_cpus` (the BE set in force) when given."""
        from corepin.enforcement.reconcile import CgroupTarget, ProcessTarget
        from corepin.enforcement.wanted import cpus_and_mems

        if be_cpus is not None and a.best_effort:
            pool = be_cpus
        cpus, mems = cpus_and_mems(a, pool, self.topology)
        if not cpus:
            return None, None
        cgroup = None
        path = self.trusted_cgroup(a)
        if path is not None and self.driver is not None:
            # pages follow when its memory nodes change (a live move; v1 needs the flag)
            cgroup = CgroupTarget(path, cpus=cpus, mems=mems, owner=a.id, migrate_memory=True)
        process = None
        owner = a.process
        if owner is not None:
            process = ProcessTarget(
                owner.pid,
                cpus,
                start_time=owner.start_time,
                owner=a.id,
                session=owner.session,
                members=owner.members,
                allow_within=a.cpus if a.kind != "shared" else None,
            )
        return cgroup, process

    def apply(self, a: Assignment, pool: CPUSet) -> list[Note]:
        """Re-apply one assignment (cgroup first, then every thread's affinity)."""
        return self.apply_all([a], pool)

    def apply_all(
        self, assignments: list[Assignment], pool: CPUSet, be_cpus: CPUSet | None = None
    ) -> list[Note]:
        """Re-apply `assignments` in one pass of the enforcement reconcile engine (which orders
        widening and shrinking across the hierarchy, verifies every process's start time and
        writes only what differs). Best-effort ones get `be_cpus` (default: the BE group's
        cpuset within the pool, `be_cpus()`) instead of the whole pool. What changed."""
        if be_cpus is None and any(a.best_effort for a in assignments):
            be_cpus = self.be_cpus(pool)
        from corepin.core.text import printable
        from corepin.enforcement.note import Note
        from corepin.enforcement.reconcile import Reconciler

        cgroups: list[CgroupTarget] = []
        processes: list[ProcessTarget] = []
        refused: list[Note] = []
        for a in assignments:
            if a.cgroup is not None and self.trusted_cgroup(a) is None:
                refused.append(
                    Note(
                        "refused",
                        a.id,
                        f"cgroup {printable(a.cgroup)!r} is neither this state directory's own "
                        f"({self.settings.cgroup_parent}/<id>) nor a kubelet pod cgroup: never "
                        "written",
                    )
                )
            cgroup, process = self.targets(a, pool, be_cpus)
            if cgroup is not None:
                cgroups.append(cgroup)
            if process is not None:
                processes.append(process)
        if not cgroups and not processes:
            return refused
        # a partition that is no longer exclusive must become a member before its CPUs widen
        refused.extend(self.check_partitions(assignments))
        driver = self.driver
        owners = {driver.rel(t.path): t.owner for t in cgroups} if driver is not None else {}
        report = Reconciler(
            driver, proc_root=self.settings.proc_root, topology=self.topology
        ).reconcile([*cgroups, *processes])
        self.writes += report.writes
        changes: list[Note] = refused
        threads: dict[str, int] = {}
        for c in report.changes:
            if c.what == "affinity":
                threads[c.owner] = threads.get(c.owner, 0) + 1
                continue
            owner = owners.get(c.path, c.path)
            why = "" if c.why == "target" else f" ({c.why})"
            changes.append(
                Note(
                    "repinned",
                    owner,
                    f"cgroup {c.path}: {c.what} {c.old or '(empty)'} -> {c.new}{why}",
                )
            )
        for target in processes:
            count = threads.get(target.owner, 0)
            if count:
                changes.append(
                    Note(
                        "repinned",
                        target.owner,
                        f"set affinity {target.cpus} on {count} thread(s) of its processes",
                    )
                )
        for err in report.errors:
            changes.append(Note("failed", "-", err.message))
        return changes

    def remove_orphans(self, live_ids: set[str]) -> list[Note]:
        """Remove the empty groups of finished runs (`remove_orphans`)."""
        return remove_orphans(self, live_ids)


def remove_orphans(pinner: Pinner, live_ids: set[str]) -> list[Note]:
    """Remove the empty groups below `pinner`'s cgroup parent (and its BE group)
    whose assignment is gone, and the BE group and the parent itself once nothing is left
    in them."""
    from corepin.enforcement.note import Note

    driver = pinner.driver
    if driver is None:
        return []
    out: list[Note] = []
    parent = pinner.settings.cgroup_parent
    be_group = pinner.be_group
    groups = [g for g in driver.child_groups(parent) if g != be_group]
    groups += driver.child_groups(be_group)
    prefix = pinner.partition_prefix
    partitions = [g for g in driver.child_groups("") if g.startswith(prefix)]
    for group in [*groups, *partitions]:
        name = group.rsplit("/", 1)[-1]
        if group in partitions:
            name = name[len(prefix) :]
        if name in live_ids:
            continue
        try:
            if driver.procs(group):
                continue
            pinner.remove_group(driver, group)
            pinner.writes += 1
        except CgroupError:
            continue
        out.append(Note("removed", name, f"empty cgroup {group} of a finished run"))
    if not live_ids:
        for group in (be_group, parent):
            if not driver.exists(group) or driver.child_groups(group):
                continue
            try:
                if not driver.procs(group):
                    pinner.remove_group(driver, group)
                    pinner.writes += 1
            except CgroupError:
                pass
    return out
