"""The shield in host mode and on a node: `corepin shield on|off|status`, and the re-sizing that
every allocation change does while a shield is up.

Composition only: the mechanism is `corepin.enforcement.shield.engine.ShieldEngine`, the record is
`corepin.state.shield.ShieldRecord` (kept in the state, so every change to it is part of the
transaction that changes the pools), and this module decides the inputs:

- the *system set* = the reserved CPUs plus the shared pool (`system_cpus`): what every task
  corepin does not manage may use. It never holds a CPU an exclusive or mixed assignment holds,
  nor an isolated one. An exclusive request that would leave it empty is refused
  (`keep_system`);
- the processes corepin manages (`managed`): every live process of every assignment, with the
  CPUs it needs, which the shield leaves where they are (or moves where they get those CPUs);
- the mode: `cpuset` on a usable cpuset hierarchy (cgroup v1, or v2 offering the cpuset
  controller), else - or with `--cgroups off` - `affinity`, said clearly (`mode_for`);
- what is left alone: corepin's own groups (`corepin/...`), the kubelet's (`kubepods`,
  `kubepods.slice`, or the node agent's kubepods path).

Ordering: when an allocation takes CPUs, the shield shrinks before the new holder starts on
them (`sync` is called after the commit and before `corepin run` lets CMD exec); when it frees
CPUs, the shield grows after the commit. Either way the system set never holds a CPU that is
held exclusively.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from corepin.core.cpuset import CPUSet
from corepin.core.errors import CgroupError, CorepinError, EnvironmentProblem, InputError
from corepin.core.ids import IdError, split_cgroup_path
from corepin.core.text import printable
from corepin.enforcement.cgroups import (
    CgroupDriver,
    CgroupV1,
    CgroupV2,
    detect_mounts,
    open_cpuset_hierarchy,
)
from corepin.enforcement.layout import KUBELET_PARENTS
from corepin.enforcement.note import Note
from corepin.enforcement.shield.engine import ShieldEngine
from corepin.enforcement.shield.irqs import read_irqs
from corepin.enforcement.shield.result import ShieldResult
from corepin.enforcement.shield.scope import in_scope
from corepin.state.model import Assignment, HostState
from corepin.state.shield import ShieldRecord
from corepin.sysfs.procfs import (
    ProcessGone,
    ProcessGroup,
    ProcStat,
    cgroup_of,
    cpus_allowed_list,
    list_threads,
    read_cgroup,
)

#: Groups below the hierarchy root a host-mode shield never touches: corepin's own runs (every
#: state directory's) and the kubelet's pods.
HOST_EXCLUDED = ("corepin", *KUBELET_PARENTS)

#: The processes in an assignment's own cgroup (None: it has none), as host mode finds them.
CgroupPids = Callable[[Assignment], Iterable[int] | None]


def system_cpus(state: HostState) -> CPUSet:
    """The CPUs of the system set: the reserved CPUs plus the shared pool."""
    return (state.shared_pool | state.reserved) & state.online


def keep_system(state: HostState) -> bool:
    """Whether an exclusive decision must leave a CPU in the shared pool: when a shield is up
    and no reserved CPU holds the system set."""
    return state.shield is not None and not state.reserved


def normalize_scope(text: str) -> str:
    """A scope given on the command line as a cgroup path relative to the cpuset hierarchy
    (`/` or empty: the whole hierarchy); InputError for a path that is not one."""
    try:
        return "/".join(split_cgroup_path(text.strip("/")))
    except IdError as exc:
        raise InputError(f"--scope {text!r}: {exc}", reason="bad_scope") from None


def process_owners(
    state: HostState, table: Mapping[int, ProcStat], *, cgroup_pids: CgroupPids | None = None
) -> dict[int, str]:
    """pid -> assignment id, for every live process of every assignment of `state` (its
    process group; with `cgroup_pids(a)`, the processes in the assignment's own cgroup too)."""
    out: dict[int, str] = {}
    procs = dict(table)
    for a in state:
        pids: set[int] = set()
        process = a.process
        if process is not None:
            group = ProcessGroup(process.pid, process.start_time, process.session, process.members)
            pids.update(group.pids(procs))
        if cgroup_pids is not None:
            pids.update(cgroup_pids(a) or ())
        for pid in pids:
            out.setdefault(pid, a.id)
    return out


def managed(
    state: HostState, table: Mapping[int, ProcStat], *, cgroup_pids: CgroupPids | None = None
) -> dict[int, CPUSet]:
    """pid -> CPUs it needs, for every live process of every assignment of `state`."""
    pool = state.shared_pool
    out: dict[int, CPUSet] = {}
    for pid, ident in process_owners(state, table, cgroup_pids=cgroup_pids).items():
        out[pid] = state.assignments[ident].affinity(pool)
    return out


class Shield:
    """The shield of one state directory (host mode) or node (the agent)."""

    def __init__(
        self,
        *,
        cgroup_root: str,
        proc_root: str,
        cgroups: str = "auto",
        excluded: Iterable[str] = HOST_EXCLUDED,
        driver: CgroupDriver | None = None,
    ) -> None:
        self.cgroup_root = cgroup_root
        self.proc_root = proc_root
        self.cgroups = cgroups
        self.excluded = tuple(excluded)
        self._driver = driver
        self._why_affinity = ""

    # ------------------------------------------------------------------ mode
    def mode_for(self) -> tuple[str, CgroupDriver | None, str]:
        """(mode, cpuset-only driver or None, why affinity mode when it is)."""
        if self.cgroups == "off":
            return "affinity", None, "--cgroups off"
        try:
            driver = self._driver or self._open_driver()
        except CorepinError as exc:
            if self.cgroups == "on":
                raise
            return "affinity", None, f"no usable cpuset controller ({exc})"
        return "cpuset", driver, ""

    def _open_driver(self) -> CgroupDriver:
        found = open_cpuset_hierarchy(self.cgroup_root)
        if not os.path.isdir(found.root):
            raise CgroupError(found.root, "no cpuset hierarchy here", reason="no_cpuset_hierarchy")
        if isinstance(found, CgroupV2):
            try:
                offered = found.read_file("", "cgroup.controllers").split()
            except CgroupError:
                offered = []
            if "cpuset" not in offered:
                raise CgroupError(
                    os.path.join(found.root, "cgroup.controllers"),
                    "the cgroup v2 hierarchy offers no cpuset controller",
                    reason="no_cpuset_hierarchy",
                )
            if not os.access(found.root, os.W_OK):
                raise CgroupError(found.root, "not writable", reason="cgroup_permission")
            return found
        if not os.access(found.root, os.W_OK):
            raise CgroupError(found.root, "not writable", reason="cgroup_permission")
        # the cpuset hierarchy alone: the shield never moves tasks in the cpu controller's
        return CgroupV1(found.root, None, fake_tree=found.fake_tree)

    def engine(self, record: ShieldRecord) -> ShieldEngine:
        driver = None
        if record.mode == "cpuset":
            # the shield's own hierarchy, whatever this command's --cgroups says for its runs
            try:
                driver = self._driver or self._open_driver()
            except CorepinError as exc:
                raise EnvironmentProblem(
                    f"the shield was raised on cgroup v{record.cgroup_version} cpusets, which "
                    f"are not usable now ({exc})",
                    reason="shield_hierarchy_gone",
                ) from None
            if driver.version != record.cgroup_version:
                raise EnvironmentProblem(
                    f"the shield was raised on cgroup v{record.cgroup_version} cpusets; the "
                    f"cpuset hierarchy is cgroup v{driver.version} now",
                    reason="shield_hierarchy_gone",
                )
        return ShieldEngine(driver, self.proc_root, unified=self._membership())

    def _membership(self) -> str | None:
        """Which /proc/PID/cgroup entry names a task's group in affinity mode."""
        try:
            mounts = detect_mounts()
        except CorepinError:
            return None
        return "cpuset" if "cpuset" in mounts.v1 else None

    # ------------------------------------------------------------------ commands
    def on(
        self,
        state: HostState,
        table: Mapping[int, ProcStat],
        *,
        scope: str,
        kthreads: bool,
        irqs: bool,
        cgroup_pids: CgroupPids | None = None,
    ) -> ShieldResult:
        """Raise a shield (none must be up in `state`)."""
        if state.shield is not None:
            raise InputError(
                f"a shield is already up on scope {state.shield.scope or '/'} (since "
                f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(state.shield.since))}): "
                "`corepin shield off` first, or `corepin reconcile` to repair it",
                reason="shield_on",
            )
        if irqs and scope:
            raise InputError(
                f"--irqs moves IRQs of the whole machine: it needs the whole hierarchy as the "
                f"scope (not --scope {scope})",
                reason="bad_usage",
            )
        mode, driver, why = self.mode_for()
        self._why_affinity = why
        record = ShieldRecord(
            scope=scope,
            mode=mode,
            cgroup_version=driver.version if driver is not None else 0,
            kthreads=kthreads,
            irqs=irqs,
            since=time.time(),
            excluded=tuple(e for e in self.excluded if e),
        )
        engine = self.engine(record)
        return engine.on(record, system_cpus(state), managed(state, table, cgroup_pids=cgroup_pids))

    @property
    def why_affinity(self) -> str:
        return self._why_affinity

    def sync(
        self,
        state: HostState,
        table: Mapping[int, ProcStat],
        *,
        cgroup_pids: CgroupPids | None = None,
    ) -> ShieldResult | None:
        """Make the shield of `state` match its pools (resize, repair, adopt new tasks); None
        when no shield is up."""
        if state.shield is None:
            return None
        engine = self.engine(state.shield)
        return engine.reconcile(
            state.shield, system_cpus(state), managed(state, table, cgroup_pids=cgroup_pids)
        )

    def off(
        self,
        state: HostState,
        table: Mapping[int, ProcStat],
        *,
        cgroup_pids: CgroupPids | None = None,
    ) -> ShieldResult:
        if state.shield is None:
            raise InputError("no shield is up (see `corepin shield status`)", reason="shield_off")
        engine = self.engine(state.shield)
        return engine.off(
            state.shield, system_cpus(state), managed(state, table, cgroup_pids=cgroup_pids)
        )

    def make_room(
        self, state: HostState, pids: Iterable[int], needs: CPUSet
    ) -> ShieldRecord | None:
        """The record after moving `pids` (about to be managed with `needs`) out of a group
        that does not allow those CPUs; None when no cpuset shield is up."""
        if state.shield is None or state.shield.mode != "cpuset":
            return None
        engine = self.engine(state.shield)
        result = engine.make_room(state.shield, pids, needs, system_cpus(state))
        return result.record

    def launch_group(
        self, state: HostState, needs: CPUSet, system: CPUSet
    ) -> tuple[str, str] | None:
        """(the `cgroup.procs` file, the caller's group) when a new command that needs `needs`
        would start in a group of the shield that will not allow them once the system set is
        `system`; None when it may start where its caller is."""
        record = state.shield
        if record is None or record.mode != "cpuset":
            return None
        engine = self.engine(record)
        caller = engine.group_of(os.getpid())
        group = engine.launch_group(record, caller, needs, system)
        if group is None or caller is None or engine.driver is None:
            return None
        return os.path.join(engine.driver.dir(group), "cgroup.procs"), caller

    # ------------------------------------------------------------------ status
    def status(self, state: HostState, table: Mapping[int, ProcStat]) -> dict[str, Any]:
        """What `corepin shield status` shows: the record, the live system group, and every
        task of the scope that corepin does not manage and that may still run on a CPU the
        system set does not hold (`exposed`: should be empty)."""
        record = state.shield
        system = system_cpus(state)
        data: dict[str, Any] = {
            "on": record is not None,
            "system_cpus": str(system),
            "exclusive_cpus": str(state.exclusive_cpus),
            "reserved": str(state.reserved),
            "shared_pool": str(state.shared_pool),
        }
        if record is None:
            return data
        engine = self.engine(record)
        data.update(
            {
                "scope": "/" + record.scope,
                "mode": record.mode,
                "cgroup_version": record.cgroup_version or None,
                "since": record.since,
                "kthreads": record.kthreads,
                "irqs": record.irqs,
                "moved_tasks": len(record.moved),
                "restricted_groups": [g.path for g in record.restricted],
                "pinned_tasks": len(record.tasks),
                "pinned_kernel_threads": len(record.kernel_threads),
                "moved_irqs": len(record.irq_affinity),
            }
        )
        live: dict[str, Any] = {}
        if record.mode == "cpuset" and engine.driver is not None:
            drv = engine.driver
            try:
                live["system_group"] = "/" + record.system_group
                live["system_group_cpus"] = str(drv.read_cpus(record.system_group))
                live["system_group_tasks"] = len(drv.procs(record.system_group))
            except CorepinError as exc:
                live["system_group_error"] = str(exc)
        data["live"] = live
        data["exposed"] = self._exposed(state, table, system)
        if record.irqs:
            data["irqs_kept"] = self._irqs_kept(system)
        return data

    def _irqs_kept(self, system: CPUSet) -> list[dict[str, str]]:
        """IRQs that may still fire on a CPU outside the system set: the kernel refused to
        move them, or took the new affinity and kept the old one (the legacy timer, say)."""
        try:
            current = read_irqs(self.proc_root)
        except CorepinError:
            return []
        return [
            {"irq": irq, "cpus": str(cpus)}
            for irq, cpus in current.items()
            if irq != "default" and cpus - system
        ]

    def _exposed(
        self, state: HostState, table: Mapping[int, ProcStat], system: CPUSet
    ) -> list[dict[str, Any]]:
        """Unmanaged tasks of the scope (user tasks; kernel threads only with --kthreads) with
        a thread allowed on a CPU outside the system set."""
        record = state.shield
        assert record is not None
        mine = managed(state, table)
        membership = {1: "cpuset", 2: None}.get(record.cgroup_version, self._membership())
        out: list[dict[str, Any]] = []
        for pid, st in sorted(table.items()):
            if pid in mine or not st.alive:
                continue
            if st.kernel_thread and (not record.kthreads or st.fixed_affinity):
                continue
            try:
                path = cgroup_of(read_cgroup(pid, self.proc_root), membership) or ""
            except (ProcessGone, CorepinError):
                continue
            if not in_scope(record, path):
                continue
            stranded = self._stranded(record, path, st)
            if stranded:
                out.append({"pid": pid, "tid": pid, "comm": st.comm, "cpus": "", "why": stranded})
                continue
            try:
                for tid in list_threads(pid, self.proc_root):
                    allowed = cpus_allowed_list(pid, self.proc_root, tid=tid)
                    if not allowed <= system:
                        if st.kernel_thread and len(allowed) == 1:
                            break  # a per-CPU kernel thread: it cannot move
                        out.append(
                            {
                                "pid": pid,
                                "tid": tid,
                                "comm": st.comm,
                                "cpus": str(allowed),
                                "why": "allowed outside the system set",
                            }
                        )
                        break
            except (ProcessGone, CorepinError):
                continue
        return out

    @staticmethod
    def _stranded(record: ShieldRecord, path: str, st: ProcStat) -> str:
        """Why a user task of a cpuset shield's scope escapes it whatever the system set is
        ("" when it does not): it sits in the scope group itself (whose CPUs the shield never
        narrows: it failed to move it) or, unmanaged, in the shield's managed group."""
        if record.mode != "cpuset" or st.kernel_thread:
            return ""
        rel = path.strip("/")
        if rel == record.scope:
            return f"in the scope group {'/' + record.scope}, which keeps every CPU"
        if rel == record.managed_group:
            return f"unmanaged, in {'/' + record.managed_group}, which keeps every CPU"
        return ""


def notes_text(notes: Iterable[Note], *, limit: int = 20) -> list[str]:
    """Lines for people: counts per action, then the notes worth reading one by one (refused,
    failed, left), at most `limit` of them."""
    notes = list(notes)
    counts: dict[str, int] = {}
    for n in notes:
        counts[n.action] = counts.get(n.action, 0) + 1
    lines = []
    shown = [n for n in notes if n.action not in ("refused", "failed", "left")]
    for n in shown[:limit]:
        lines.append(printable(f"{n.action} {n.target}: {n.detail}"))
    details = [n for n in notes if n.action in ("refused", "failed", "left")]
    for n in details[:limit]:
        lines.append(printable(f"{n.action} {n.target}: {n.detail}"))
    if len(details) > limit:
        lines.append(f"... and {len(details) - limit} more (-o json lists them all)")
    return lines
