"""The reconcile engine: make the live cgroup tree and process affinities match a desired state.

Desired state is a list of targets:
- `CgroupTarget(path, cpus=, mems=, quota=, create=, migrate_memory=)`: a cgroup (relative to
  the hierarchy root) whose cpuset.cpus / cpuset.mems / CFS quota should hold the given values
  (None = leave alone; mems default to the NUMA nodes of the CPUs when a topology is given).
  With `migrate_memory`, pages its tasks already placed follow a change of its memory nodes: on
  cgroup v1 `cpuset.memory_migrate` is turned on before `cpuset.mems` changes (v1 leaves pages
  where they are otherwise); cgroup v2 always migrates them when `cpuset.mems` changes;
- `ProcessTarget(pid, cpus, start_time=, session=, members=)`: the processes of a workload
  outside any container (a process tree, its session and recorded members, see
  `corepin.sysfs.procfs.ProcessGroup`), pinned with sched_setaffinity (every thread).

Rules:
- Read before write, write only what differs. A steady state performs zero writes (the report's
  `writes` counts them). The fast path compares the file text with the canonical list form, so
  nothing is parsed when nothing changed.
- cpuset hierarchies: widen parents before children (top-down), shrink children before parents
  (bottom-up). A v1 cpuset must lie within its parent (EACCES otherwise) and a parent cannot
  drop CPUs a child still uses (EBUSY); so a target whose new CPUs are not in an ancestor widens
  that ancestor first, and a target that shrinks first shrinks any live child that uses what it
  drops. A target changing from {0} to {1} with children therefore goes {0} -> {0,1} -> {1}.
- CFS quota: raises top-down, lowers bottom-up (v1 refuses a child quota above its parent's).
- Every target path is validated (`corepin.core.ids`) before the first write; one bad id rejects
  the whole desired state, nothing is written.
- Problems with single targets (a cgroup that vanished, a refused write, a process that exited)
  land in the report (`missing`, `gone`, `errors`); the rest is still applied.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import Any

from corepin.core.cpuset import CPUSet
from corepin.core.errors import CgroupError, CorepinError, InputError
from corepin.core.ids import split_cgroup_path, validate_pid
from corepin.core.record import field, record, replace
from corepin.enforcement.cgroups import CgroupDriver, CpuQuota
from corepin.enforcement.note import Change
from corepin.sysfs.procfs import ProcessGone, ProcessGroup, process_table
from corepin.topology.model import Topology

__all__ = [
    "CgroupTarget",
    "ProcessTarget",
    "ReconcileReport",
    "Reconciler",
    "reconcile",
]


@record
class CgroupTarget:
    """Desired values of one cgroup (None = leave that file alone)."""

    path: str
    cpus: CPUSet | None = None
    mems: CPUSet | None = None
    quota: CpuQuota | None = None
    create: bool = False
    owner: str = ""
    migrate_memory: bool = False


@record
class ProcessTarget:
    """Desired affinity of a workload's processes; `start_time` guards against PID reuse.
    `allow_within`: threads that narrowed themselves to a subset of it are left alone."""

    pid: int
    cpus: CPUSet
    start_time: int | None = None
    include_descendants: bool = True
    owner: str = ""
    session: int | None = None
    members: tuple[tuple[int, int], ...] = ()
    allow_within: CPUSet | None = None

    @property
    def group(self) -> ProcessGroup:
        return ProcessGroup(self.pid, self.start_time, self.session, self.members)


@record(frozen=False, slots=False)
class ReconcileReport:
    """What one reconcile pass did: every write as a `Change`, how many writes and targets, the
    targets whose group is missing or whose processes are gone, the errors. Not a list of
    `Note`s: the changes keep their old and new values and the order's reason, which the
    callers (host pinning, the node agent, the shield on cgroup v1) put into words of their
    own; not a `ShieldResult`: there is no record to carry."""

    changes: list[Change] = field(default_factory=list)
    writes: int = 0
    checked: int = 0
    missing: list[str] = field(default_factory=list)
    gone: list[ProcessTarget] = field(default_factory=list)
    errors: list[CorepinError] = field(default_factory=list)
    dry_run: bool = False

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def changed(self) -> bool:
        return bool(self.changes)

    def to_json(self) -> dict[str, Any]:
        return {
            "changes": [c.to_json() for c in self.changes],
            "writes": self.writes,
            "checked": self.checked,
            "missing": list(self.missing),
            "gone": [
                {"pid": g.pid, "start_time": g.start_time, "owner": g.owner} for g in self.gone
            ],
            "errors": [{"reason": e.reason, "message": e.message} for e in self.errors],
            "dry_run": self.dry_run,
        }


@record(frozen=False)
class _Pending:
    rel: str
    depth: int
    want: CPUSet
    target: CgroupTarget
    #: the group holds `want` already but an ancestor does not hand it down (v2): widen those
    ancestors: bool = False


def _depth(rel: str) -> int:
    return 0 if not rel else rel.count("/") + 1


def _ancestors(rel: str) -> list[str]:
    """Ancestors of rel, top-down, root ("") excluded."""
    parts = rel.split("/") if rel else []
    return ["/".join(parts[:i]) for i in range(1, len(parts))]


class Reconciler:
    """Applies desired state through a cgroup driver and sched_setaffinity.

    `cgroups` may be None when only process targets are used; `topology` (optional) derives
    cpuset.mems from the CPUs of a target that gives no mems.
    """

    def __init__(
        self,
        cgroups: CgroupDriver | None = None,
        *,
        proc_root: str | os.PathLike[str] = "/proc",
        topology: Topology | None = None,
    ) -> None:
        self.cgroups = cgroups
        self.proc_root = proc_root
        self.topology = topology

    # ------------------------------------------------------------------ entry point
    def reconcile(
        self, targets: Iterable[CgroupTarget | ProcessTarget], *, dry_run: bool = False
    ) -> ReconcileReport:
        report = ReconcileReport(dry_run=dry_run)
        cgroup_targets: list[tuple[str, CgroupTarget]] = []
        process_targets: list[ProcessTarget] = []
        seen: dict[str, CgroupTarget] = {}
        for target in targets:
            if isinstance(target, ProcessTarget):
                validate_pid(target.pid)
                if not target.cpus:
                    raise InputError(
                        f"process {target.pid}: an empty CPU set cannot be applied",
                        reason="empty_cpuset",
                    )
                process_targets.append(target)
                continue
            rel = "/".join(split_cgroup_path(target.path))
            if not rel:
                raise InputError(
                    "the cgroup hierarchy root cannot be a reconcile target", reason="root_target"
                )
            if rel in seen:
                raise InputError(
                    f"cgroup {rel!r} appears twice in the desired state", reason="duplicate_target"
                )
            if target.cpus is not None and not target.cpus:
                raise InputError(
                    f"cgroup {rel!r}: an empty CPU set cannot be applied", reason="empty_cpuset"
                )
            seen[rel] = target
            cgroup_targets.append((rel, target))
        if cgroup_targets:
            if self.cgroups is None:
                raise InputError("cgroup targets given but no cgroup driver", reason="no_driver")
            self._check_nesting(cgroup_targets)
            start = self.cgroups.writes
            self._reconcile_cgroups(self.cgroups, cgroup_targets, report)
            report.writes += self.cgroups.writes - start
        if process_targets:
            _pin_processes(process_targets, report, self.proc_root)
        return report

    # ------------------------------------------------------------------ validation
    def _mems_for(self, target: CgroupTarget) -> CPUSet | None:
        if target.mems is not None:
            return target.mems
        if target.cpus is not None and self.topology is not None:
            return self.topology.mems_of(target.cpus)
        return None

    def _check_nesting(self, targets: Sequence[tuple[str, CgroupTarget]]) -> None:
        """A child target must not want CPUs/nodes its parent target does not want."""
        by_rel = dict(targets)
        for rel, target in targets:
            for ancestor in _ancestors(rel):
                above = by_rel.get(ancestor)
                if above is None:
                    continue
                for name, mine, theirs in (
                    ("CPUs", target.cpus, above.cpus),
                    ("memory nodes", self._mems_for(target), self._mems_for(above)),
                ):
                    if mine is not None and theirs is not None and not mine <= theirs:
                        raise InputError(
                            f"cgroup {rel!r} wants {name} {mine} but its ancestor {ancestor!r} "
                            f"wants {theirs}: a cpuset must lie within its parent's",
                            reason="inconsistent_targets",
                        )

    # ------------------------------------------------------------------ cgroups
    def _reconcile_cgroups(
        self,
        drv: CgroupDriver,
        targets: Sequence[tuple[str, CgroupTarget]],
        report: ReconcileReport,
    ) -> None:
        pending_cpus: list[_Pending] = []
        pending_mems: list[_Pending] = []
        pending_quota: list[tuple[str, CgroupTarget, CpuQuota | None, CpuQuota]] = []
        cache: dict[tuple[str, str], CPUSet] = {}
        for rel, target in targets:
            report.checked += 1
            try:
                self._inspect(
                    drv, rel, target, report, cache, pending_cpus, pending_mems, pending_quota
                )
            except CorepinError as err:
                report.errors.append(err)
        # memory nodes first when widening: a v1 task needs both cpus and mems
        self._apply_sets(drv, "mems", pending_mems, cache, report)
        self._apply_sets(drv, "cpus", pending_cpus, cache, report)
        self._apply_quota(drv, pending_quota, report)

    def _inspect(
        self,
        drv: CgroupDriver,
        rel: str,
        target: CgroupTarget,
        report: ReconcileReport,
        cache: dict[tuple[str, str], CPUSet],
        pending_cpus: list[_Pending],
        pending_mems: list[_Pending],
        pending_quota: list[tuple[str, CgroupTarget, CpuQuota | None, CpuQuota]],
    ) -> None:
        """Read one target's live values; queue what differs. Fast path: text comparison."""
        mems = self._mems_for(target)
        virtual = False  # a group that a dry run would create: nothing to read yet
        text: str | None = None
        if target.cpus is not None or mems is not None:
            probe = drv.cpus_file if target.cpus is not None else drv.mems_file
            try:
                text = drv.read_file(rel, probe)
            except CgroupError as err:
                if err.reason != "cgroup_missing" or drv.exists(rel):
                    raise
                if not target.create:
                    report.missing.append(rel)
                    return
                self._create(drv, rel, report, cache)
                virtual = report.dry_run
        elif not drv.exists(rel):
            if not target.create:
                report.missing.append(rel)
                return
            self._create(drv, rel, report, cache)
            virtual = report.dry_run
        if target.cpus is not None and text != str(target.cpus):
            cur = cache[("cpus", rel)] if virtual else drv.read_cpus(rel)
            if cur != target.cpus:
                cache[("cpus", rel)] = cur
                pending_cpus.append(_Pending(rel, _depth(rel), target.cpus, target))
        elif target.cpus and not virtual and self._not_handed_down(drv, rel, "cpus", target.cpus):
            pending_cpus.append(_Pending(rel, _depth(rel), target.cpus, target, ancestors=True))
        if mems is not None:
            mtext = str(cache[("mems", rel)]) if virtual else drv.read_mems_text(rel)
            if mtext != str(mems):
                cur = CPUSet.parse(mtext)
                if cur != mems:
                    cache[("mems", rel)] = cur
                    pending_mems.append(_Pending(rel, _depth(rel), mems, target))
                    if target.migrate_memory and drv.version == 1:
                        self._migrate_pages(drv, rel, report)
            elif mems and not virtual and self._not_handed_down(drv, rel, "mems", mems):
                pending_mems.append(_Pending(rel, _depth(rel), mems, target, ancestors=True))
        if target.quota is not None:
            got = None if virtual else drv.read_quota_fast(rel, target.quota)
            if got is None or not target.quota.satisfied_by(got):
                pending_quota.append((rel, target, got, target.quota))

    @staticmethod
    def _not_handed_down(drv: CgroupDriver, rel: str, kind: str, want: CPUSet) -> bool:
        """v2: the group's own set is `want`, but the kernel gives it something else
        (`cpuset.*.effective`): an ancestor's explicit set no longer holds `want`, so the group
        (and its processes) fell back to that ancestor's CPUs or nodes. v1 refuses such a state
        outright; an offline CPU is no reason (widening would not bring it back)."""
        if drv.version != 2 or not split_cgroup_path(rel):
            return False
        try:
            got = drv.effective_cpus(rel) if kind == "cpus" else drv.effective_mems(rel)
        except CgroupError:
            return False
        return not want <= got

    def _create(
        self,
        drv: CgroupDriver,
        rel: str,
        report: ReconcileReport,
        cache: dict[tuple[str, str], CPUSet],
    ) -> None:
        if not report.dry_run:
            for made in drv.create(rel):
                report.changes.append(Change("mkdir", made, "", made, "create"))
            return
        # A dry run records what create() would do and what the new groups would hold:
        # v1 copies the parent's cpus and mems, v2 starts empty (inherit).
        parts = rel.split("/")
        for depth in range(1, len(parts) + 1):
            here = "/".join(parts[:depth])
            if ("virtual", here) in cache or drv.exists(here):
                continue
            cache[("virtual", here)] = CPUSet()
            report.changes.append(Change("mkdir", here, "", here, "create"))
            parent = "/".join(parts[: depth - 1])
            for kind in ("cpus", "mems"):
                if drv.version == 1:
                    cache[(kind, here)] = self._value(drv, kind, parent, cache)
                else:
                    cache[(kind, here)] = CPUSet()

    def _value(
        self, drv: CgroupDriver, kind: str, rel: str, cache: dict[tuple[str, str], CPUSet]
    ) -> CPUSet:
        key = (kind, rel)
        got = cache.get(key)
        if got is None:
            got = drv.read_cpus(rel) if kind == "cpus" else drv.read_mems(rel)
            cache[key] = got
        return got

    def _write(
        self,
        drv: CgroupDriver,
        kind: str,
        rel: str,
        new: CPUSet,
        why: str,
        cache: dict[tuple[str, str], CPUSet],
        report: ReconcileReport,
    ) -> None:
        old = cache.get((kind, rel), CPUSet())
        if not report.dry_run:
            if kind == "cpus":
                drv.write_cpus(rel, new)
            else:
                drv.write_mems(rel, new)
        cache[(kind, rel)] = new
        name = drv.cpus_file if kind == "cpus" else drv.mems_file
        report.changes.append(Change(name, rel, str(old), str(new), why))

    @staticmethod
    def _migrate_pages(drv: CgroupDriver, rel: str, report: ReconcileReport) -> None:
        """Turn on v1's `cpuset.memory_migrate` of `rel` (read first: written only when off)."""
        name = "cpuset.memory_migrate"
        try:
            if drv.read_file(rel, name).strip() == "1":
                return
        except CorepinError:
            pass  # (a tree without the file: written below, or the error lands in the report)
        if not report.dry_run:
            drv.write_file(rel, name, "1")
        report.changes.append(Change(name, rel, "0", "1", "pages follow the memory nodes"))

    def _has_children(self, drv: CgroupDriver, rel: str) -> bool:
        try:
            with os.scandir(drv.dir(rel)) as entries:
                return any(e.is_dir(follow_symlinks=False) for e in entries)
        except FileNotFoundError:
            return False

    def _apply_sets(
        self,
        drv: CgroupDriver,
        kind: str,
        pending: list[_Pending],
        cache: dict[tuple[str, str], CPUSet],
        report: ReconcileReport,
    ) -> None:
        if not pending:
            return
        failed: set[str] = set()
        # widen, parents first
        for item in sorted(pending, key=lambda p: p.depth):
            try:
                if item.ancestors:
                    self._widen_ancestors(drv, kind, item.rel, item.want, cache, report)
                    continue
                cur = self._value(drv, kind, item.rel, cache)
                if item.want <= cur:
                    continue
                self._widen_ancestors(drv, kind, item.rel, item.want, cache, report)
                if self._has_children(drv, item.rel) and not cur <= item.want:
                    self._write(drv, kind, item.rel, cur | item.want, "widen-first", cache, report)
                else:
                    self._write(drv, kind, item.rel, item.want, "target", cache, report)
            except CorepinError as err:
                failed.add(item.rel)
                report.errors.append(err)
        # shrink, children first
        for item in sorted(pending, key=lambda p: -p.depth):
            if item.rel in failed or item.ancestors:
                continue
            try:
                cur = self._value(drv, kind, item.rel, cache)
                if cur == item.want:
                    continue
                if drv.version == 1:
                    self._shrink_children(drv, kind, item.rel, item.want, cache, report)
                self._write(drv, kind, item.rel, item.want, "target", cache, report)
            except CorepinError as err:
                report.errors.append(err)

    def _widen_ancestors(
        self,
        drv: CgroupDriver,
        kind: str,
        rel: str,
        want: CPUSet,
        cache: dict[tuple[str, str], CPUSet],
        report: ReconcileReport,
    ) -> None:
        for ancestor in _ancestors(rel):
            value = self._value(drv, kind, ancestor, cache)
            if drv.version == 2 and not value:
                continue  # v2: empty means "inherit the parent's"
            if not want <= value:
                self._write(drv, kind, ancestor, value | want, "widen-ancestor", cache, report)

    def _shrink_children(
        self,
        drv: CgroupDriver,
        kind: str,
        rel: str,
        want: CPUSet,
        cache: dict[tuple[str, str], CPUSet],
        report: ReconcileReport,
    ) -> None:
        for child in drv.child_groups(rel):
            value = self._value(drv, kind, child, cache)
            if value <= want:
                continue
            new = (value & want) or want
            if not new <= value:
                # nothing in common: the child moves to `want`, which its parent holds now;
                # widen it first so that its own children can follow
                self._write(drv, kind, child, value | new, "shrink-child", cache, report)
            self._shrink_children(drv, kind, child, new, cache, report)
            self._write(drv, kind, child, new, "shrink-child", cache, report)

    def _apply_quota(
        self,
        drv: CgroupDriver,
        pending: list[tuple[str, CgroupTarget, CpuQuota | None, CpuQuota]],
        report: ReconcileReport,
    ) -> None:
        def raising(p: tuple[str, CgroupTarget, CpuQuota | None, CpuQuota]) -> bool:
            return p[2] is None or p[3].at_least(p[2])

        raises = sorted((p for p in pending if raising(p)), key=lambda p: _depth(p[0]))
        lowers = sorted((p for p in pending if not raising(p)), key=lambda p: -_depth(p[0]))
        name = "cpu.max" if drv.version == 2 else "cpu.cfs_quota_us"
        for rel, _target, old, new in [*raises, *lowers]:
            try:
                if not report.dry_run:
                    drv.write_quota(rel, new)
                report.changes.append(Change(name, rel, str(old or ""), str(new), "target"))
            except CorepinError as err:
                report.errors.append(err)


def _pin_processes(
    targets: Sequence[ProcessTarget], report: ReconcileReport, proc_root: str | os.PathLike[str]
) -> None:
    """Pin the process targets through the thread-affinity seam; their changes and errors go
    into `report`, the targets whose processes are all gone into `report.gone`."""
    # loaded here: `corepin run` reconciles only its new cgroup on its way to CMD
    from corepin.enforcement.affinity import AffinityError, pin_process_group, pin_process_tree

    table = process_table(proc_root)
    for target in targets:
        report.checked += 1
        try:
            if target.include_descendants:
                result = pin_process_group(
                    target.group,
                    target.cpus,
                    proc_root=proc_root,
                    allow_within=target.allow_within,
                    table=table,
                    dry_run=report.dry_run,
                )
            else:
                result = pin_process_tree(
                    target.pid,
                    target.cpus,
                    start_time=target.start_time,
                    proc_root=proc_root,
                    include_descendants=False,
                    dry_run=report.dry_run,
                )
        except ProcessGone:
            report.gone.append(target)
            continue
        except AffinityError as err:
            report.errors.append(err)
            continue
        report.writes += result.writes
        report.changes.extend(replace(c, owner=target.owner) for c in result.changes)
        report.errors.extend(result.restricted)


def reconcile(
    targets: Iterable[CgroupTarget | ProcessTarget],
    *,
    cgroups: CgroupDriver | None = None,
    proc_root: str | os.PathLike[str] = "/proc",
    topology: Topology | None = None,
    dry_run: bool = False,
) -> ReconcileReport:
    """One reconcile pass (see the module docstring)."""
    return Reconciler(cgroups, proc_root=proc_root, topology=topology).reconcile(
        targets, dry_run=dry_run
    )
