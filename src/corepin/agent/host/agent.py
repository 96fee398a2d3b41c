"""Standalone host mode: `corepin run`, `report`, `reconcile` and `release`.

Composition only: the state layer keeps the checkpoint and the lock, the allocation layer
decides out of the node's one pool model, the enforcement layer pins (affinity of process
groups, cpuset cgroups), and this module wires them into the commands.

`corepin run` in one transaction (under the state lock, termination signals held back):
  1. load the state (validated against the live topology) and reap assignments whose processes
     are all gone;
  2. decide: exclusive runs ask the policy for N CPUs out of the free set; shared runs take the
     shared pool (a best-effort workload is placed on its least used CPUs);
  3. fork CMD held before exec (see `launch.py`), record the assignment with a process owner
     (the child's pid and start time, its session, corepin's own pid as runner), commit;
  4. re-pin every shared process to the new (smaller) shared pool, place the child in its
     cgroup, then let it exec.
CMD runs; when it exits, a second transaction frees the assignment and re-pins the shared
processes to the grown pool - unless processes of the run live on (a daemon CMD left behind):
the assignment is then *lingering* and holds its CPUs until they are gone (`reconcile` and
every later `run` check) or `corepin release ID [--kill]` ends it. A `kill -9` of corepin leaves
the assignment behind while CMD lives; once nothing of the run is alive the next run or
`reconcile` frees it.

Which processes belong to a run: its cpuset cgroup when it has one; else its session (a run
that is not the foreground job of a terminal leads a session of its own) and its process tree;
for a foreground job of a terminal, corepin becomes the run's child subreaper and records the
processes that outlive CMD. Every check compares start times, so a recycled pid never counts.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Final

from corepin.agent.settings import HostSettings
from corepin.core.cpuset import CPUSet
from corepin.core.errors import CorepinError, EnvironmentProblem, InputError
from corepin.core.record import record
from corepin.core.text import printable
from corepin.enforcement.note import Note

if TYPE_CHECKING:
    from corepin.agent.host.launch import Launch
    from corepin.agent.host.pinning import Pinner
    from corepin.allocation.types import Decision, Request
    from corepin.enforcement.mempolicy import MemoryPolicy
    from corepin.enforcement.shield.control import Shield
    from corepin.state.model import Assignment, HostState
    from corepin.sysfs.procfs import ProcStat
    from corepin.topology.model import Topology

#: What the processes of an assignment are doing (`HostAgent.status`).
RUNNING: Final = "running"  # its main process (or the corepin run waiting for it) lives
LINGERING: Final = "lingering"  # the main process is gone, others of the run live on
DEAD: Final = "dead"  # nothing of it is left: its CPUs can be freed
UNKNOWN: Final = "unknown"  # tied to a cgroup this mode cannot see: never freed from here

#: Signals held back while `corepin run` commits (delivered, or forwarded to CMD, afterwards).
HELD_SIGNALS: Final = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT}
#: How long `release --kill` waits after SIGTERM before it sends SIGKILL.
KILL_GRACE: Final = 5.0


@record
class RunSpec:
    """What `corepin run` asks for: `exclusive` CPUs (None: the shared pool), `with_shared`
    (exclusive CPUs plus the shared pool), and request options as `corepin allocate` takes
    them (`level`, `smt`, `numa`, `workload`, `prefer-isolated`, policy options)."""

    exclusive: int | None = None
    with_shared: bool = False
    options: Mapping[str, str] | None = None
    #: cgroup v2 cpuset partition of an exclusive run: None, "root" or "isolated"
    partition: str | None = None
    #: exactly these CPUs (`corepin run --cpus LIST`, `pin --cpus`): an exclusive request
    cpus: CPUSet | None = None
    #: the memory policy CMD gets (`--membind`, `--interleave`, `--preferred`); None: bind to
    #: the NUMA nodes of its CPUs, as without a policy
    memory: MemoryPolicy | None = None

    def request(self) -> Request:
        from corepin.allocation.api import build_request

        options = dict(self.options or {})
        if self.cpus is not None:
            if self.exclusive is not None:
                raise InputError("--cpus and --exclusive exclude each other", reason="bad_usage")
            for name in ("level", "smt", "numa", "prefer-isolated", "workload"):
                if name in options:
                    raise InputError(
                        f"option {name!r} chooses CPUs: it does not apply with --cpus",
                        reason="bad_usage",
                    )
            return build_request(max(1, len(self.cpus)), options)
        if self.exclusive is None:
            for name in ("level", "smt", "numa", "prefer-isolated"):
                if name in options:
                    raise InputError(
                        f"option {name!r} applies to --exclusive runs only", reason="bad_usage"
                    )
            options["shared"] = "true"
        return build_request(self.exclusive or 1, options)

    def kind(self, request: Request) -> str:
        if self.cpus is not None:
            return "mixed" if self.with_shared else "exclusive"
        if self.exclusive is None or request.workload == "best-effort":
            return "shared"
        return "mixed" if self.with_shared else "exclusive"


class HostAgent:
    """One host's view: settings, live topology, state transactions, pinning."""

    def __init__(
        self,
        settings: HostSettings,
        topology: Topology | None = None,
        *,
        reserve: tuple[int, CPUSet | None] | None = None,
    ) -> None:
        self.settings = settings
        self._topology = topology
        self._pinner: Pinner | None = None
        self._shield: Shield | None = None
        self._snapshot: dict[int, ProcStat] | None = None
        #: reserved CPUs asked for on the command line: (count, explicit CPUs or None); each
        #: transaction of a command records them in the state (`_reserve`)
        self.reserve = reserve
        #: what the shield did in the last transaction that synced it (reports, warnings)
        self.shield_notes: list[Any] = []

    # ------------------------------------------------------------------ parts
    @property
    def topology(self) -> Topology:
        if self._topology is None:
            from corepin.topology.discover import discover

            self._topology = discover(self.settings.sysfs_root)
        return self._topology

    @property
    def pinner(self) -> Pinner:
        if self._pinner is None:
            from corepin.agent.host.pinning import Pinner

            self._pinner = Pinner(self.settings, self.topology)
        return self._pinner

    @property
    def shield(self) -> Shield:
        if self._shield is None:
            from corepin.enforcement.shield.control import Shield

            self._shield = Shield(
                cgroup_root=self.settings.cgroup_root,
                proc_root=self.settings.proc_root,
                cgroups=self.settings.cgroups,
            )
        return self._shield

    @contextmanager
    def transaction(self) -> Iterator[Any]:
        """The state transaction (exclusive lock held) with the state validated at boot.

        One scan of /proc serves the whole transaction (`_table`): the liveness checks of the
        boot validation, of reaping and of the command itself see the same snapshot."""
        from corepin.agent.host.store import open_transaction

        self._snapshot = None
        try:
            with open_transaction(self.settings, self.topology, self._dead_ids) as txn:
                yield txn
        finally:
            self._snapshot = None

    def read_state(self) -> HostState:
        """The current state without taking part in a write (no lock)."""
        from corepin.agent.host.store import read_state

        self._snapshot = None
        return read_state(self.settings, self.topology, self._dead_ids)

    # ------------------------------------------------------------------ liveness
    def _table(self, *, fresh: bool = False) -> dict[int, ProcStat]:
        """The process table: the transaction's snapshot (taken on first use), or a new scan
        with `fresh` (after this transaction changed processes, e.g. killed some)."""
        from corepin.sysfs.procfs import process_table

        if self._snapshot is None or fresh:
            self._snapshot = process_table(self.settings.proc_root)
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
            in_cgroup = self.pinner.cgroup_pids(a)
            if in_cgroup:
                return LINGERING
            group = ProcessGroup(process.pid, process.start_time, process.session, process.members)
            if group.pids(table):
                return LINGERING
            if in_cgroup is None and process.cgroup is not None:
                return UNKNOWN
            return DEAD
        if a.container is not None:
            exists = self.pinner.cgroup_exists(a)
            if exists is None:
                return UNKNOWN if a.cgroup is not None else DEAD
            return RUNNING if exists else DEAD
        return DEAD

    def _plainly_alive(self, a: Assignment) -> bool:
        """Whether `a` is RUNNING by its main process or by the corepin run waiting for it,
        read from those processes' own stat files: a host's other runs are usually alive, and
        proving it this way spares the scan of every process (`_table`) that telling a
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
        from corepin.core.errors import SysfsError
        from corepin.sysfs.procfs import ProcessGone, read_stat

        for pid, start in (
            (process.pid, process.start_time),
            (process.runner_pid, process.runner_start_time),
        ):
            if pid is None:
                continue
            try:
                st = read_stat(pid, self.settings.proc_root)
            except (ProcessGone, SysfsError):
                continue
            if st.alive and (start is None or st.start_time == start):
                return True
        return False

    def _dead_ids(self, state: HostState) -> set[str]:
        return {a.id for a in state if not self._plainly_alive(a) and self._dead(a)}

    def _dead(self, a: Assignment, table: dict[int, ProcStat] | None = None) -> bool:
        if table is None:  # a container's or an ownerless record needs no process table
            table = self._table() if a.process is not None else {}
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
            if (table is not None or not self._plainly_alive(a)) and self._dead(a, table)
        ]
        changes = [
            Note("freed", a.id, f"{a.label} is gone; released CPUs {a.withheld or '-'}")
            for a in dead
        ]
        return state.remove_many(a.id for a in dead), changes

    def _binds_memory(self) -> bool:
        """Whether runs outside a cpuset cgroup bind their memory with set_mempolicy: when
        the machine has two or more NUMA nodes with CPUs (or when forced, for testing)."""
        return self.settings.force_membind or len(self.topology.numa_node_ids()) > 1

    # ------------------------------------------------------------------ decide
    def decide(self, state: HostState, request: Request, kind: str) -> Decision:
        """The decision for a new assignment of `kind` out of `state`'s pools (AllocationError
        when there is none)."""
        from corepin.allocation.api import check_request
        from corepin.allocation.policies import get_policy
        from corepin.allocation.pools import decide

        check_request(self.topology, request)
        keep = bool(state.shared_assignments())
        if not keep and state.shield is not None:
            from corepin.enforcement.shield.control import keep_system

            keep = keep_system(state)
        return decide(
            state.pools,
            self.topology,
            request,
            get_policy(self.settings.policy),
            kind=kind,
            usage=state.usage_counts(),
            keep_shared=keep,
        )

    def decide_cpus(self, state: HostState, cpus: CPUSet, kind: str) -> Decision:
        """The decision for exactly `cpus` (`--cpus LIST`): InputError for CPUs this machine
        does not have online; AllocationError naming the holder when any is taken, and for
        reserved CPUs, or when the shared pool (or a shield's system set) would be left empty."""
        from corepin.allocation.types import Decision
        from corepin.core.errors import AllocationError

        if not cpus:
            raise InputError("--cpus names no CPU", reason="bad_usage")
        online = self.topology.online_cpus
        if not cpus <= online:
            raise InputError(
                f"CPUs {cpus - online} are not online CPUs of this machine (online: {online})",
                reason="bad_cpus",
            )
        clash = cpus & state.held
        if clash:
            holders = sorted({o for c in clash if (o := state.owner_of(c)) is not None})
            names = ", ".join(f"{h} ({printable(state.assignments[h].label)})" for h in holders)
            raise AllocationError(f"CPUs {clash} are held by {names}", reason="cpus_taken")
        state.pools.check_hold(kind, cpus)
        keep = bool(state.shared_assignments())
        if not keep and state.shield is not None:
            from corepin.enforcement.shield.control import keep_system

            keep = keep_system(state)
        if keep and not state.pools.keeps_shared_pool(cpus):
            raise AllocationError(
                f"CPUs {cpus} would leave no CPU in the shared pool for the running shared "
                "workloads (or the shield's system set)",
                reason="shared_pool_exhausted",
            )
        return Decision(cpus, self.topology.mems_of(cpus), cpus, "explicit")

    # ------------------------------------------------------------------ reserved CPUs
    def _reserve(self, state: HostState) -> HostState:
        """`state` with the reserved CPUs this command was given (`--reserved-cpus`,
        `--reserved-count`); unchanged without. AllocationError (reason `reserved_held`) when
        an assignment holds one of them: reserved CPUs are never handed out."""
        if self.reserve is None:
            return state
        from corepin.allocation.pools import select_reserved
        from corepin.core.errors import AllocationError

        count, explicit = self.reserve
        if explicit is not None and not explicit <= self.topology.online_cpus:
            raise InputError(
                f"--reserved-cpus {explicit}: CPUs {explicit - self.topology.online_cpus} are "
                "not online CPUs of this machine",
                reason="bad_reservation",
            )
        wanted = select_reserved(self.topology, count, explicit)
        if wanted == state.reserved:
            return state
        clash = [a for a in state if a.holds and a.withheld & wanted]
        if clash:
            held = ", ".join(f"{a.id} holds {a.withheld & wanted}" for a in clash)
            raise AllocationError(
                f"cannot reserve CPUs {wanted}: {held}; release those first (reserved CPUs are "
                f"never handed out), or reserve others (reserved now: {state.reserved or 'none'})",
                reason="reserved_held",
            )
        return state.evolve(reserved=wanted)

    # ------------------------------------------------------------------ memory
    def _check_nodes(self, nodes: CPUSet, mode: str) -> None:
        known = CPUSet(self.topology.numa_node_ids())
        unknown = nodes - known
        if unknown:
            raise InputError(
                f"--{_MEMORY_FLAGS[mode]} {nodes}: NUMA node(s) {unknown} do not exist here "
                f"(NUMA nodes: {known or 'none'})",
                reason="bad_nodes",
            )

    def _mems_for(self, memory: MemoryPolicy) -> CPUSet:
        """The memory nodes a run's cpuset allows with `memory`: its nodes (bind, interleave),
        every node (preferred: other nodes when the preferred one is full)."""
        if memory.mode == "preferred":
            return CPUSet(self.topology.numa_node_ids()) or memory.nodes
        return memory.nodes

    # ------------------------------------------------------------------ shield
    def _sync_shield(self, state: HostState, *, strict: bool = False) -> HostState:
        """`state` with its shield made to match its pools (see
        `corepin.enforcement.shield.control`): the system set resized before what it loses is
        handed out. With `strict` (CPUs are being handed out) a system set that cannot shrink is
        an EnvironmentProblem."""
        if state.shield is None:
            return state
        result = self.shield.sync(state, self._table(), cgroup_pids=self.pinner.cgroup_pids)
        if result is None:
            return state
        self.shield_notes = list(result.notes)
        system = state.shield.system_group
        failed = [n for n in result.notes if n.action == "failed"]
        if strict and any(n.target == system for n in failed):
            raise EnvironmentProblem(
                f"the shield cannot take CPUs away from its system set: "
                f"{next(n.detail for n in failed if n.target == system)}",
                reason="shield_resize_failed",
            )
        for n in failed:
            print(
                printable(f"corepin: warning: shield: {n.target}: {n.detail}"),
                file=sys.stderr,
            )
        return state.evolve(shield=result.record)

    # ------------------------------------------------------------------ enforce
    def enforce(self, state: HostState, ids: set[str] | None = None) -> list[Note]:
        """Make the pins of the assignments (or just `ids`) match the state."""
        chosen = [a for a in state if ids is None or a.id in ids]
        if not chosen:
            return []
        return self.pinner.apply_all(chosen, state.shared_pool)

    def repin_shared(self, state: HostState) -> list[Note]:
        """Re-pin every shared and mixed assignment to the current shared pool."""
        return self.enforce(state, {a.id for a in state.shared_assignments()})

    def _remove_cgroups(self, state: HostState) -> list[Note]:
        """Remove the empty cgroups of this state directory that no assignment owns (and its
        parent group once nothing is left). Under the state lock only."""
        if not self.pinner.cgroups_enabled:
            return []
        return self.pinner.remove_orphans({a.id for a in state})

    # ------------------------------------------------------------------ run
    def run(
        self,
        argv: list[str],
        spec: RunSpec,
        *,
        name: str | None = None,
        wait: float | None = None,
    ) -> int:
        """Run `argv` pinned as `spec` asks; CMD's exit code (see the module docstring).

        With `wait` (seconds; `math.inf` for no limit) a run that cannot get its CPUs queues
        for them in arrival order (`corepin.state.waitline`) instead of failing at once."""
        if not argv:
            raise InputError(
                "no command given: use `corepin run [options] -- CMD ARGS...`",
                reason="missing_command",
            )
        # a caller that ignores SIGCHLD would make the kernel reap CMD, and its exit code be lost
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        request = spec.request()  # bad options are refused before the state is touched
        kind = spec.kind(request)
        label = name or os.path.basename(argv[0]) or "cmd"
        if spec.memory is not None:
            self._check_nodes(spec.memory.nodes, spec.memory.mode)
        if wait is None:
            launch, assignment_id = self._start(argv, spec, request, kind, label)
        else:
            launch, assignment_id = self._start_in_line(argv, spec, request, kind, label, wait)
        code = launch.wait()
        self._finish_quietly(assignment_id)
        return code

    def _start_in_line(
        self, argv: list[str], spec: RunSpec, request: Request, kind: str, label: str, wait: float
    ) -> tuple[Launch, str]:
        """`_start`, retried in the run's place in line until it gets CPUs or `wait` seconds
        have passed (then AllocationError saying so)."""
        from corepin.core.errors import AllocationError
        from corepin.state.store import StateStore
        from corepin.state.waitline import WaitLine

        began = time.monotonic()
        deadline = began + wait
        StateStore(self.settings.state_dir, proc_root=self.settings.proc_root).ensure_directory()
        said = False
        with WaitLine(self.settings.state_dir, proc_root=self.settings.proc_root) as line:
            while True:
                problem: AllocationError | None = None
                if line.first():
                    try:
                        return self._start(argv, spec, request, kind, label, line=line)
                    except AllocationError as exc:
                        if exc.reason in ("cpus_reserved", "cpus_offline", "reserved_held"):
                            raise  # waiting would not help
                        problem = exc
                now = time.monotonic()
                if now >= deadline:
                    why = problem.message if problem is not None else "runs ahead still wait"
                    raise AllocationError(
                        f"waited {now - began:.1f} s for CPUs (--wait {wait:g}): {why}",
                        reason=problem.reason if problem is not None else "wait_timeout",
                    )
                if not said:
                    ahead = line.ahead()
                    why = problem.message if problem is not None else "runs ahead of it wait"
                    print(
                        printable(
                            f"corepin run: waiting for CPUs ({ahead} run(s) ahead in line): {why}"
                        ),
                        file=sys.stderr,
                        flush=True,
                    )
                    said = True
                line.nap(deadline)

    def _start(
        self,
        argv: list[str],
        spec: RunSpec,
        request: Request,
        kind: str,
        label: str,
        *,
        line: Any = None,
    ) -> tuple[Launch, str]:
        """Decide, fork CMD held, commit, pin, let it exec: (the Launch, the assignment id).
        AllocationError (nothing started) when there are no CPUs for it."""
        from corepin.agent.host.launch import Launch
        from corepin.state.model import Assignment
        from corepin.state.owners import ProcessOwner
        from corepin.sysfs.procfs import process_start_time

        me = os.getpid()
        my_start = process_start_time(me, self.settings.proc_root)
        foreground = _foreground_job()
        launch: Launch | None = None
        assignment_id = ""
        mask: set[int | signal.Signals] | None = None
        try:
            with self.transaction() as txn:
                mask = signal.pthread_sigmask(signal.SIG_BLOCK, HELD_SIGNALS)
                state, _ = self.reap(txn.state)
                state = self._reserve(state)
                if spec.cpus is not None:
                    decision = self.decide_cpus(state, spec.cpus, kind)
                else:
                    decision = self.decide(state, request, kind)
                assignment_id = _new_id(state)
                cpus = decision.cpus if kind != "shared" or spec.exclusive else CPUSet()
                withheld = decision.withheld if kind != "shared" else CPUSet()
                held = state.pools.hold(kind, withheld)
                pool = held.shared_pool
                probe = Assignment(assignment_id, kind, cpus, withheld)
                affinity = probe.affinity(pool)
                run_mems = decision.mems if kind == "exclusive" else self.topology.mems_of(affinity)
                env_mems = decision.mems if kind != "shared" else run_mems
                memory = spec.memory
                if memory is not None:
                    run_mems = self._mems_for(memory)
                cgroup: str | None = None
                procs: str | None = None
                caller_group: str | None = None
                if spec.partition is not None:
                    self._check_partition(spec, kind)
                if self.pinner.cgroups_enabled:
                    if spec.partition is not None:
                        cgroup = self.pinner.partition_path_for(assignment_id)
                    else:
                        cgroup = self.pinner.cgroup_path_for(assignment_id)
                    procs = self.pinner.prepare(cgroup, affinity, run_mems)
                    if spec.partition is not None:
                        got = self.pinner.claim_partition(cgroup, spec.partition)
                        if not got.valid:
                            print(
                                f"corepin run: warning: cgroup {cgroup}: partition {got}; "
                                f"the run keeps a plain cpuset on CPUs {affinity}",
                                file=sys.stderr,
                            )
                else:
                    if foreground:
                        _become_subreaper()
                    if state.shield is not None:
                        system = (pool | state.reserved) & state.online  # after this run
                        found = self.shield.launch_group(state, affinity, system)
                        if found is not None:
                            procs, caller_group = found
                launch = Launch(
                    argv,
                    affinity,
                    _environment(kind, cpus, pool, run_mems if memory else env_mems),
                    cgroup_procs=procs,
                    bind_mems=run_mems
                    if cgroup is None and run_mems and self._binds_memory()
                    else None,
                    memory=memory,
                    new_session=not foreground,
                    sigmask=mask,
                )
                child = launch.start()
                child_start = process_start_time(child, self.settings.proc_root)
                owner = ProcessOwner(
                    pid=child,
                    start_time=child_start,
                    runner_pid=me,
                    runner_start_time=my_start,
                    cgroup=cgroup,
                    session=None if foreground else child,
                    name=label,
                    command=" ".join(argv)[:1024],
                )
                assignment = Assignment(
                    id=assignment_id,
                    kind=kind,
                    cpus=cpus,
                    withheld=withheld,
                    # the nodes its cpuset keeps allowing: a memory policy's, else its CPUs'
                    mems=run_mems if memory else decision.mems if kind != "shared" else CPUSet(),
                    level=request.level,
                    owner=owner,
                    created=time.time(),
                    policy=decision.policy,
                    workload=request.workload,
                )
                state = state.add(assignment)
                if caller_group is not None and state.shield is not None:
                    from corepin.state.shield import MovedTask, merge_moved

                    moved = MovedTask(child, child_start, caller_group)
                    state = state.evolve(
                        shield=state.shield.evolve(moved=merge_moved(state.shield.moved, [moved]))
                    )
                # a shield shrinks its system set before CMD starts on the CPUs it takes
                state = txn.commit(self._sync_shield(state, strict=assignment.exclusive))
                if line is not None:
                    line.leave()  # the next run in line may try now
                # the pool changed: shrink the shared processes before CMD starts on its CPUs
                if assignment.exclusive:
                    self.repin_shared(state)
                launch.go()
        except BaseException:
            if launch is not None and launch.pid:
                launch.abort()
            if assignment_id:
                self._finish_quietly(assignment_id)
            raise
        finally:
            if mask is not None:
                signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        return launch, assignment_id

    def _check_partition(self, spec: RunSpec, kind: str) -> None:
        """A partition needs an exclusive run and cpuset cgroups on cgroup v2."""
        if kind != "exclusive":
            raise InputError(
                f"--partition {spec.partition} needs an exclusive run (this one is {kind})",
                reason="bad_usage",
            )
        driver = self.pinner.driver
        if driver is None or driver.version != 2:
            raise EnvironmentProblem(
                f"--partition {spec.partition} needs cpuset cgroups on cgroup v2 "
                + ("(cgroups are off or unusable here)" if driver is None else "(this is v1)"),
                reason="cgroup_unsupported",
            )

    def _finish_quietly(self, assignment_id: str) -> None:
        """`finish`, but a release that cannot be written (lock busy, disk full, corrupt
        state) is a warning: CMD's exit code is still returned, `reconcile` frees it later."""
        try:
            self.finish(assignment_id)
        except CorepinError as exc:
            print(
                f"corepin run: warning: could not release {assignment_id} ({exc}); "
                "`corepin reconcile --once` frees it once its processes are gone",
                file=sys.stderr,
            )

    def finish(self, assignment_id: str) -> None:
        """CMD of a run exited: free its assignment, remove its cgroup, grow the shared pool -
        unless processes of the run live on, which keep it (lingering)."""
        old_handlers = {}
        for sig in HELD_SIGNALS:
            old_handlers[sig] = signal.signal(sig, signal.SIG_IGN)
        try:
            with self.transaction() as txn:
                state = txn.state
                a = state.get(assignment_id)
                if a is None:  # released on purpose, or never committed
                    self._remove_cgroups(state)
                    return
                table = self._table()
                a = self._adopt_orphans(a, table)
                if self.status(a, table, ignore_runner=True) in (LINGERING, UNKNOWN):
                    if a is not state.get(assignment_id):
                        txn.commit(state.replace_assignment(a))
                    _say_lingering(a, self.pinner.cgroup_pids(a), table)
                    return
                state, _ = self.reap(state.remove(assignment_id), table)
                state = txn.commit(self._sync_shield(state))
                self._remove_cgroups(state)
                if a.exclusive:
                    self.repin_shared(state)
        finally:
            for sig, handler in old_handlers.items():
                signal.signal(sig, handler)

    def _adopt_orphans(self, a: Assignment, table: dict[int, ProcStat]) -> Assignment:
        """`a` with the processes that outlived CMD and were re-parented to this corepin (its
        child subreaper) recorded as members."""
        process = a.process
        if process is None or process.session is not None or process.cgroup is not None:
            return a
        me = os.getpid()
        orphans = tuple(
            (pid, st.start_time) for pid, st in table.items() if st.ppid == me and st.alive
        )
        if not orphans:
            return a
        from corepin.core.record import replace

        return a.evolve(owner=replace(process, members=process.members + orphans))

    # ------------------------------------------------------------------ release
    def release(self, assignment_id: str, *, kill: bool = False) -> list[Note]:
        """End an assignment on purpose (`corepin release ID [--kill]`).

        With `kill`, its processes get SIGTERM, and SIGKILL after KILL_GRACE seconds, then its
        CPUs are freed. Without, its CPUs are freed and processes of it that still run move
        to the shared pool (the assignment stays, as a shared one, until they exit)."""
        with self.transaction() as txn:
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
                killed = self._kill(a)
                changes.append(Note("killed", a.id, f"{killed} process(es)"))
            table = self._table(fresh=kill)
            if self.status(a, table, ignore_runner=True) in (RUNNING, LINGERING):
                moved = a.evolve(
                    kind="shared", cpus=CPUSet(), withheld=CPUSet(), mems=CPUSet(), level="cpu"
                )
                state = txn.commit(self._sync_shield(state.replace_assignment(moved)))
                changes.append(
                    Note(
                        "released",
                        a.id,
                        f"CPUs {a.withheld or '-'}; its processes now run in the shared pool",
                    )
                )
                changes.extend(self.enforce(state))
                return changes
            state = txn.commit(self._sync_shield(state.remove(assignment_id)))
            self._remove_cgroups(state)
            changes.append(Note("released", a.id, f"CPUs {a.withheld or '-'}"))
            if a.exclusive:
                changes.extend(self.repin_shared(state))
            return changes

    def _kill(self, a: Assignment) -> int:
        """SIGTERM every process of `a` (checked by start time through a pidfd, so a recycled
        pid is never signalled), wait up to KILL_GRACE seconds, SIGKILL what is left."""
        from corepin.sysfs.procfs import ProcessGroup

        process = a.process
        assert process is not None
        group = ProcessGroup(process.pid, process.start_time, process.session, process.members)

        def members() -> dict[int, int]:
            table = self._table(fresh=True)
            found = {pid: table[pid].start_time for pid in group.pids(table)}
            for pid in self.pinner.cgroup_pids(a) or ():
                st = table.get(pid)
                if st is not None and st.alive:
                    found[pid] = st.start_time
            found.pop(os.getpid(), None)
            return found

        first = members()
        for pid, start in first.items():
            _signal_exactly(pid, start, signal.SIGTERM, self.settings.proc_root)
        deadline = time.monotonic() + KILL_GRACE
        left = members()
        while left and time.monotonic() < deadline:
            time.sleep(0.05)
            left = members()
        for pid, start in left.items():
            _signal_exactly(pid, start, signal.SIGKILL, self.settings.proc_root)
        return len(first | left)

    # ------------------------------------------------------------------ containers
    def pin_container(
        self,
        container_id: str,
        *,
        exclusive: int | None,
        runtime: str | None = None,
        options: Mapping[str, str] | None = None,
        kubepods: str | None = None,
    ) -> Assignment:
        """Find a running container's cgroup in the kubelet layouts (below `kubepods`), allocate
        for it and write its cpuset: exclusive CPUs, or the shared pool when `exclusive` is None.

        The id is validated before any path is built (IdError, exit 2); a container without a
        cgroup raises InputError; a host without a writable cpuset hierarchy EnvironmentProblem.
        """
        from corepin.core.errors import EnvironmentProblem
        from corepin.core.ids import validate_container_id
        from corepin.enforcement.layout import KUBEPODS, find_container_cgroup
        from corepin.state.model import Assignment
        from corepin.state.owners import ContainerOwner

        kubepods = KUBEPODS if kubepods is None else kubepods
        ident = validate_container_id(container_id, runtime or "generic")
        driver = self.pinner.driver
        if driver is None:
            raise EnvironmentProblem(
                "pinning a container needs a writable cpuset cgroup hierarchy (run as root with "
                f"cgroup v1 cpuset mounted under {self.settings.cgroup_root}; cgroups mode is "
                f"{self.settings.cgroups!r})",
                reason="no_cpuset_hierarchy",
            )
        path = find_container_cgroup(driver.root, ident, runtime=runtime, under=(kubepods,))
        if path is None:
            raise InputError(
                f"no cgroup for container {ident!r} below {driver.root}/{kubepods}: is it running?",
                reason="container_not_found",
            )
        spec = RunSpec(exclusive=exclusive, options=options)
        request = spec.request()
        kind = spec.kind(request)
        with self.transaction() as txn:
            state, _ = self.reap(txn.state)
            decision = self.decide(state, request, kind)
            assignment = Assignment(
                id=f"ctr-{ident[:12]}",
                kind=kind,
                cpus=decision.cpus if kind != "shared" else CPUSet(),
                withheld=decision.withheld if kind != "shared" else CPUSet(),
                mems=decision.mems if kind != "shared" else CPUSet(),
                level=request.level,
                owner=ContainerOwner(container_id=ident, runtime=runtime or "", cgroup=path),
                created=time.time(),
                policy=decision.policy,
                workload=request.workload,
            )
            state = txn.commit(state.replace_assignment(assignment))
            if assignment.exclusive:
                self.repin_shared(state)
            self.pinner.apply(assignment, state.shared_pool)
        return assignment

    # ------------------------------------------------------------------ processes
    def pin_process(
        self,
        pid: int,
        spec: RunSpec,
        *,
        kind: str | None = None,
        name: str | None = None,
    ) -> Assignment:
        """Allocate for a process that already runs (the node API's Allocate in host mode) and
        pin its whole tree by affinity, as `corepin run` pins CMD (no cgroup: a running
        process is not moved; its memory policy stays its own).

        `kind` defaults to what `spec` asks (`RunSpec.kind`); `share` is accepted too; with
        `spec.cpus`, exactly those CPUs. The process must exist (InputError `no_such_process`),
        be a user process (InputError `kernel_thread`) and not belong to an allocation yet
        (InputError `already_pinned`: its own, or as a process of another run). Its processes
        are freed when they are gone (pid and start time). With a cpuset shield up, processes
        of it that sit in a group not allowing their new CPUs move to the shield's managed
        group first."""
        from corepin.enforcement.shield.control import process_owners
        from corepin.state.model import Assignment
        from corepin.state.owners import ProcessOwner
        from corepin.sysfs.procfs import ProcessGone, ProcessGroup, read_stat

        request = spec.request()
        kind = kind or spec.kind(request)
        if kind != "shared" and request.workload == "best-effort":
            kind = "shared"
        try:
            st = read_stat(pid, self.settings.proc_root)
        except ProcessGone:
            raise InputError(f"no process {pid}", reason="no_such_process") from None
        if st.kernel_thread or pid == 2:
            raise InputError(
                f"process {pid} ({printable(st.comm)}) is a kernel thread: corepin pins user "
                "processes (`corepin shield on --kthreads` confines kernel threads)",
                reason="kernel_thread",
            )
        if not st.alive:
            raise InputError(f"process {pid} has exited (a zombie)", reason="no_such_process")
        start = st.start_time
        comm, command = _process_labels(pid, self.settings.proc_root)
        with self.transaction() as txn:
            state, _ = self.reap(txn.state)
            state = self._reserve(state)
            table = self._table()
            for held in state:
                if held.pid == pid:
                    raise InputError(
                        f"process {pid} already holds allocation {held.id}",
                        reason="already_pinned",
                    )
            owner = process_owners(state, table, cgroup_pids=self.pinner.cgroup_pids).get(pid)
            if owner is not None:
                raise InputError(
                    f"process {pid} already belongs to allocation {owner} (a process of that "
                    "run): release it first",
                    reason="already_pinned",
                )
            if spec.cpus is not None:
                decision = self.decide_cpus(state, spec.cpus, kind)
            else:
                decision = self.decide(state, request, kind)
            while True:
                assignment_id = f"pid-{pid}-{os.urandom(2).hex()}"
                if assignment_id not in state:
                    break
            owned = kind != "shared"
            assignment = Assignment(
                id=assignment_id,
                kind=kind,
                cpus=decision.cpus if owned or spec.exclusive else CPUSet(),
                withheld=decision.withheld if owned else CPUSet(),
                mems=decision.mems if owned else CPUSet(),
                level=request.level,
                owner=ProcessOwner(
                    pid=pid, start_time=start, name=name or comm, command=command[:1024]
                ),
                created=time.time(),
                policy=decision.policy,
                workload=request.workload,
            )
            state = state.add(assignment)
            if state.shield is not None:
                tree = ProcessGroup(pid, start).pids(table)
                record = self.shield.make_room(state, tree, assignment.affinity(state.shared_pool))
                if record is not None:
                    state = state.evolve(shield=record)
            state = txn.commit(self._sync_shield(state, strict=assignment.exclusive))
            failed = [c for c in self.enforce(state, {assignment.id}) if c.action == "failed"]
            if failed:  # not ours to pin (permission), or gone meanwhile: undo the record
                txn.commit(self._sync_shield(state.remove(assignment.id)))
                raise EnvironmentProblem(
                    f"cannot pin process {pid}: {failed[0].detail}", reason="pin_failed"
                )
            if assignment.exclusive:
                self.repin_shared(state)
        return assignment

    # ------------------------------------------------------------------ shield
    def shield_on(self, *, scope: str, kthreads: bool, irqs: bool) -> Any:
        """`corepin shield on`: raise the shield and record it (a ShieldResult)."""
        with self.transaction() as txn:
            state, _ = self.reap(txn.state)
            state = self._reserve(state)
            result = self.shield.on(
                state,
                self._table(),
                scope=scope,
                kthreads=kthreads,
                irqs=irqs,
                cgroup_pids=self.pinner.cgroup_pids,
            )
            txn.commit(state.evolve(shield=result.record))
        return result

    def shield_off(self) -> Any:
        """`corepin shield off`: undo the shield; what could not be undone stays recorded
        (EnvironmentProblem after the commit, so another `off` can finish it)."""
        with self.transaction() as txn:
            state, _ = self.reap(txn.state)
            result = self.shield.off(state, self._table(), cgroup_pids=self.pinner.cgroup_pids)
            txn.commit(state.evolve(shield=result.record))
        return result

    def shield_status(self) -> dict[str, Any]:
        state = self.read_state()
        return self.shield.status(state, self._table())

    # ------------------------------------------------------------------ reconcile
    def reconcile_once(self) -> list[Note]:
        """Free what died, re-apply drifted pins, repair the shield (resize it, adopt new
        tasks); steady state: no writes at all."""
        with self.transaction() as txn:
            before = txn.state
            state, changes = self.reap(before)
            reserved = self._reserve(state)
            if reserved.reserved != state.reserved:
                changes.append(
                    Note(
                        "reserved",
                        "host",
                        f"reserved CPUs {state.reserved or '-'} -> {reserved.reserved or '-'}",
                    )
                )
                state = reserved
            if state is not before:
                state = txn.commit(state)
            changes.extend(self.enforce(state))
            if state.shield is not None:
                synced = self._sync_shield(state)
                changes.extend(
                    Note(n.action, n.target, n.detail)
                    for n in self.shield_notes
                    if n.action not in ("left",)
                )
                if synced.shield != state.shield:
                    state = txn.commit(synced)
            changes.extend(self._remove_cgroups(state))
        return changes

    # ------------------------------------------------------------------ report
    def statuses(self, state: HostState) -> dict[str, str]:
        """Assignment id -> RUNNING, LINGERING, DEAD or UNKNOWN (one scan of /proc)."""
        table = self._table()
        return {a.id: self.status(a, table) for a in state}

    def report(self, state: HostState, *, sample: float = 0.0) -> dict[str, Any]:
        """What `corepin report -o json` prints (`corepin.state.report.report_data`), with
        each allocation's live processes (see `live`)."""
        from corepin.state.report import report_data

        data = report_data(state, self.statuses(state))
        live = self.live(state, sample=sample)
        for row in data["allocations"]:
            row.update(live.get(row["id"], {}))
        return data

    def live(self, state: HostState, *, sample: float = 0.0) -> dict[str, dict[str, Any]]:
        """Assignment id -> what /proc says of its processes now: `processes` (how many),
        `live_cpus` (the union of their allowed CPUs), `cpu_seconds` (utime + stime) and
        `cpu_percent` of one CPU, over `sample` seconds when given, else since the run's
        oldest process started (`cpu_percent_over` says which)."""
        from corepin.sysfs.procfs import ProcessGone, ProcessGroup, cpus_allowed_list
        from corepin.sysfs.procfs import process_table as scan

        table = self._table()
        tick = float(os.sysconf("SC_CLK_TCK"))
        groups: dict[str, list[int]] = {}
        for a in state:
            pids: set[int] = set()
            process = a.process
            if process is not None:
                group = ProcessGroup(
                    process.pid, process.start_time, process.session, process.members
                )
                pids.update(group.pids(table))
            pids.update(p for p in self.pinner.cgroup_pids(a) or () if p in table)
            groups[a.id] = sorted(p for p in pids if table[p].alive)
        later = None
        if sample > 0 and any(groups.values()):
            time.sleep(sample)
            later = scan(self.settings.proc_root)
        uptime = _uptime(self.settings.proc_root)
        out: dict[str, dict[str, Any]] = {}
        for ident, members in groups.items():
            row: dict[str, Any] = {
                "processes": len(members),
                "live_cpus": None,
                "cpu_seconds": None,
                "cpu_percent": None,
                "cpu_percent_over": None,
            }
            out[ident] = row
            if not members:
                continue
            allowed = CPUSet()
            for pid in members:
                try:
                    allowed |= cpus_allowed_list(pid, self.settings.proc_root)
                except (ProcessGone, CorepinError):
                    continue
            ticks = sum(table[p].utime + table[p].stime for p in members)
            row["live_cpus"] = str(allowed)
            row["cpu_seconds"] = round(ticks / tick, 2)
            if later is not None:
                after = sum(
                    later[p].utime + later[p].stime
                    for p in members
                    if p in later and later[p].start_time == table[p].start_time
                )
                before = sum(
                    table[p].utime + table[p].stime
                    for p in members
                    if p in later and later[p].start_time == table[p].start_time
                )
                row["cpu_percent"] = round(100.0 * (after - before) / tick / sample, 1)
                row["cpu_percent_over"] = f"{sample:g} s"
            elif uptime is not None:
                started = min(table[p].start_time for p in members) / tick
                elapsed = uptime - started
                if elapsed > 0:
                    row["cpu_percent"] = round(100.0 * ticks / tick / elapsed, 1)
                    row["cpu_percent_over"] = "since start"
        return out


_MEMORY_FLAGS: Final = {"bind": "membind", "interleave": "interleave", "preferred": "preferred"}


def _same_process(table: dict[int, ProcStat], pid: int | None, start_time: int | None) -> bool:
    if pid is None:
        return False
    st = table.get(pid)
    return st is not None and st.alive and (start_time is None or st.start_time == start_time)


def _uptime(proc_root: str) -> float | None:
    """Seconds since boot (<proc>/uptime), None when unreadable."""
    try:
        with open(os.path.join(proc_root, "uptime"), encoding="ascii") as handle:
            return float(handle.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _signal_exactly(pid: int, start_time: int, sig: int, proc_root: str) -> None:
    """Send `sig` to `pid` only if it is still the process that started at `start_time`: the
    pidfd pins the process, so the check cannot be raced by pid reuse."""
    from corepin.sysfs.procfs import ProcessGone, process_start_time

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


def _process_labels(pid: int, proc_root: str) -> tuple[str, str]:
    """(command name, command line) of a process for reports ("" when unreadable)."""
    comm = command = ""
    try:
        with open(
            os.path.join(proc_root, str(pid), "comm"), encoding="utf-8", errors="replace"
        ) as f:
            comm = f.read().strip()
        with open(os.path.join(proc_root, str(pid), "cmdline"), "rb") as handle:
            command = handle.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
    except OSError:
        pass
    return comm, command


def _foreground_job() -> bool:
    """Whether corepin runs as the foreground job of a terminal (CMD may be interactive: it
    stays in corepin's session and process group)."""
    try:
        return os.isatty(0) and os.tcgetpgrp(0) == os.getpgrp()
    except OSError:
        return False


def _become_subreaper() -> None:
    """Let processes CMD leaves behind be re-parented to this corepin (so it can record them)."""
    import ctypes

    pr_set_child_subreaper = 36
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(pr_set_child_subreaper, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _say_lingering(a: Assignment, in_cgroup: list[int] | None, table: dict[int, Any]) -> None:
    from corepin.sysfs.procfs import ProcessGroup

    process = a.process
    pids = set(in_cgroup or ())
    if process is not None:
        group = ProcessGroup(process.pid, process.start_time, process.session, process.members)
        pids.update(group.pids(table))
    shown = ", ".join(str(p) for p in sorted(pids)[:5]) + (" ..." if len(pids) > 5 else "")
    print(
        printable(
            f"corepin run: {a.id} keeps CPUs {a.withheld or a.affinity(CPUSet())}: "
            f"{len(pids)} process(es) of it still run (pid {shown or '?'}); they are freed "
            f"when these exit, or by `corepin release {a.id} [--kill]`"
        ),
        file=sys.stderr,
    )


def _new_id(state: HostState) -> str:
    while True:
        candidate = f"run-{os.getpid()}-{os.urandom(2).hex()}"
        if candidate not in state:
            return candidate


def _environment(kind: str, cpus: CPUSet, pool: CPUSet, mems: CPUSet) -> dict[str, str]:
    exclusive = cpus if kind in ("exclusive", "mixed") else CPUSet()
    shared = pool if kind in ("shared", "mixed") else CPUSet()
    if kind == "shared" and cpus:
        shared = cpus & pool or pool
    return {
        "COREPIN_CPUS": str(exclusive | shared),
        "COREPIN_CPUS_EXCLUSIVE": str(exclusive),
        "COREPIN_CPUS_SHARED": str(shared),
        "COREPIN_MEMS": str(mems),
    }
