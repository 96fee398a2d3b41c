"""`corepin run`: run a command pinned to exclusive CPUs or the shared pool, and free them when
it is done.

`Runner.run` in one transaction (under the state lock, termination signals held back):
  1. load the state (validated against the live topology) and reap assignments whose processes
     are all gone;
  2. decide: exclusive runs ask the policy for N CPUs out of the free set; shared runs take the
     shared pool (a best-effort workload is placed on its least used CPUs);
  3. fork CMD held before exec (see `launch.py`), record the assignment with a process owner
     (the child's pid and start time, its session, corepin's own pid as runner), commit;
  4. re-pin every shared process to the new (smaller) shared pool, place the child in its
     cgroup, then let it exec.
CMD runs; when it exits, a second transaction (`Runner.finish`) frees the assignment and re-pins
the shared processes to the grown pool - unless processes of the run live on (a daemon CMD left
behind): the assignment is then *lingering* and holds its CPUs until they are gone (`reconcile`
and every later `run` check) or `corepin release ID [--kill]` ends it. A `kill -9` of corepin
leaves the assignment behind while CMD lives; once nothing of the run is alive the next run or
`reconcile` frees it. Which processes belong to a run: see `corepin.agent.host.liveness`.

On the start-up path of `corepin run`: the imports inside functions stay there on purpose (each
module loaded costs every run its time).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Final

from corepin.agent.host.agent import HostAgent
from corepin.agent.host.liveness import LINGERING, UNKNOWN
from corepin.core.cpuset import CPUSet
from corepin.core.errors import AllocationError, CorepinError, EnvironmentProblem, InputError
from corepin.core.record import record, replace
from corepin.core.text import printable

if TYPE_CHECKING:
    from corepin.agent.host.launch import Launch
    from corepin.allocation.types import Request
    from corepin.enforcement.mempolicy import MemoryPolicy
    from corepin.state.model import Assignment, HostState
    from corepin.state.waitline import WaitLine
    from corepin.sysfs.procfs import ProcStat
    from corepin.topology.model import Topology

#: Signals held back while `corepin run` commits (delivered, or forwarded to CMD, afterwards).
HELD_SIGNALS: Final = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT}

_MEMORY_FLAGS: Final = {"bind": "membind", "interleave": "interleave", "preferred": "preferred"}


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
    #: the QoS class given (`--qos-class`; None: derived, LSE for exclusive runs, LS for
    #: shared ones); BE only for a shared run, which then runs in the BE group
    qos: str | None = None
    #: the devices an exclusive run's CPUs should be near (`--near`), as named; `near_strict`:
    #: only CPUs near them (`--near-strict`)
    near: tuple[str, ...] = ()
    near_strict: bool = False
    #: run on exactly the CPUs of this reservation (`--reservation NAME`): an exclusive run
    #: (mixed with `with_shared`) at the reservation's level
    reservation: str | None = None
    #: whether `corepin reconcile --rebalance` may move the run (False: `--no-rebalance`)
    rebalance: bool = True

    def request(self, topology: Topology | None = None) -> Request:
        """The request; with `near`, `topology` resolves the devices (InputError naming one
        it does not have)."""
        from corepin.allocation.api import build_request

        options = dict(self.options or {})
        if self.near_strict and not self.near:
            raise InputError("--near-strict needs --near DEVICE", reason="bad_usage")
        if self.near:
            options = self._near_options(options, topology)
        if self.reservation is not None:
            if self.exclusive is not None or self.cpus is not None:
                raise InputError(
                    "--reservation gives the run the reservation's CPUs: leave out --exclusive "
                    "and --cpus",
                    reason="bad_usage",
                )
            for name in ("level", "smt", "numa", "prefer-isolated", "workload", "near"):
                if name in options:
                    raise InputError(
                        f"option {name!r} chooses CPUs: it does not apply with --reservation",
                        reason="bad_usage",
                    )
            return build_request(1, options)
        if self.cpus is not None:
            if self.exclusive is not None:
                raise InputError("--cpus and --exclusive exclude each other", reason="bad_usage")
            for name in ("level", "smt", "numa", "prefer-isolated", "workload", "near"):
                if name in options:
                    raise InputError(
                        f"option {name!r} chooses CPUs: it does not apply with --cpus",
                        reason="bad_usage",
                    )
            return build_request(max(1, len(self.cpus)), options)
        if self.exclusive is None:
            for name in ("level", "smt", "numa", "prefer-isolated", "near"):
                if name in options:
                    raise InputError(
                        f"option {name!r} applies to --exclusive runs only", reason="bad_usage"
                    )
            options["shared"] = "true"
        return build_request(self.exclusive or 1, options)

    def _near_options(self, options: dict[str, str], topology: Topology | None) -> dict[str, str]:
        """`options` with `near=` the CPUs near the `near` devices (and `near-strict`)."""
        from corepin.allocation.near import near_cpus

        if self.cpus is not None or self.exclusive is None:
            raise InputError(
                "--near applies to --exclusive runs only (a shared run runs on the whole "
                "shared pool; --cpus names the CPUs itself)",
                reason="bad_usage",
            )
        if topology is None:
            raise InputError("--near needs the machine's topology", reason="bad_usage")
        for name in ("near", "near-strict"):
            if name in options:
                raise InputError(
                    f"--option {name} and --near both choose the CPUs to be near: give one",
                    reason="bad_option",
                )
        out = dict(options)
        out["near"] = str(near_cpus(topology, self.near))
        if self.near_strict:
            out["near-strict"] = "true"
        return out

    def kind(self, request: Request) -> str:
        if self.cpus is not None or self.reservation is not None:
            return "mixed" if self.with_shared else "exclusive"
        if self.exclusive is None or request.workload == "best-effort":
            return "shared"
        return "mixed" if self.with_shared else "exclusive"


class Runner:
    """`corepin run` on one host (see the module docstring)."""

    def __init__(self, host: HostAgent) -> None:
        self.host = host

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
        # bad options (and devices the machine lacks) are refused before the state is touched
        request = spec.request(self.host.topology if spec.near else None)
        kind = spec.kind(request)
        if spec.qos == "BE" and kind != "shared":
            raise InputError(
                f"--qos-class BE is for shared runs only (this run is {kind}): leave out "
                "--exclusive/--cpus, or give another class",
                reason="bad_usage",
            )
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
        from corepin.state.store import StateStore
        from corepin.state.waitline import WaitLine

        settings = self.host.settings
        began = time.monotonic()
        deadline = began + wait
        StateStore(settings.state_dir, proc_root=settings.proc_root).ensure_directory()
        said = False
        with WaitLine(settings.state_dir, proc_root=settings.proc_root) as line:
            while True:
                problem: AllocationError | None = None
                if line.first():
                    try:
                        return self._start(argv, spec, request, kind, label, line=line)
                    except AllocationError as exc:
                        if exc.reason in (
                            "cpus_reserved",
                            "cpus_offline",
                            "reserved_held",
                            "unknown_reservation",
                        ):
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
        line: WaitLine | None = None,
    ) -> tuple[Launch, str]:
        """Decide, fork CMD held, commit, pin, let it exec: (the Launch, the assignment id).
        AllocationError (nothing started) when there are no CPUs for it."""
        from corepin.agent.host.launch import Launch
        from corepin.state.model import Assignment
        from corepin.state.owners import ProcessOwner
        from corepin.sysfs.procfs import process_start_time

        host = self.host
        me = os.getpid()
        my_start = process_start_time(me, host.settings.proc_root)
        foreground = _foreground_job()
        launch: Launch | None = None
        assignment_id = ""
        mask: set[int | signal.Signals] | None = None
        try:
            with host.transaction() as txn:
                mask = signal.pthread_sigmask(signal.SIG_BLOCK, HELD_SIGNALS)
                state, _ = host.liveness.reap(txn.state)
                state = host.with_reserved(state)
                level = request.level
                if spec.reservation is not None:
                    from corepin.agent.host.reserve import reserved_decision

                    decision = reserved_decision(state, spec.reservation, host.topology)
                    level = state.reservations[spec.reservation].level
                elif spec.cpus is not None:
                    decision = host.decide_cpus(state, spec.cpus, kind)
                else:
                    decision = host.decide(state, request, kind)
                assignment_id = _new_id(state)
                cpus = decision.cpus if kind != "shared" or spec.exclusive else CPUSet()
                withheld = decision.withheld if kind != "shared" else CPUSet()
                if spec.reservation is not None:
                    pool = state.shared_pool  # the reservation's CPUs are out of it already
                else:
                    pool = state.pools.hold(kind, withheld).shared_pool
                probe = Assignment(assignment_id, kind, cpus, withheld, qos=spec.qos)
                best_effort = probe.best_effort
                # a BE run gets the BE set the QoS loop left (within the pool), never more
                affinity = probe.affinity(host.pinner.be_cpus(pool) if best_effort else pool)
                run_mems = decision.mems if kind == "exclusive" else host.topology.mems_of(affinity)
                env_mems = decision.mems if kind != "shared" else run_mems
                memory = spec.memory
                if memory is not None:
                    run_mems = self._mems_for(memory)
                cgroup: str | None = None
                procs: str | None = None
                also_join: tuple[str, ...] = ()
                caller_group: str | None = None
                if spec.partition is not None:
                    self._check_partition(spec, kind)
                if host.pinner.cgroups_enabled:
                    if spec.partition is not None:
                        cgroup = host.pinner.partition_path_for(assignment_id)
                    else:
                        cgroup = host.pinner.cgroup_path_for(assignment_id, best_effort=best_effort)
                    procs = host.pinner.prepare(cgroup, affinity, run_mems)
                    also_join = host.pinner.accounting_joins(cgroup)
                    if spec.partition is not None:
                        got = host.pinner.claim_partition(cgroup, spec.partition)
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
                        found = host.shield.launch_group(state, affinity, system)
                        if found is not None:
                            procs, caller_group = found
                launch = Launch(
                    argv,
                    affinity,
                    _environment(kind, cpus, pool, run_mems if memory else env_mems),
                    cgroup_procs=procs,
                    also_join=also_join,
                    resctrl_tasks=self._resctrl_tasks(probe),
                    bind_mems=run_mems
                    if cgroup is None and run_mems and self._binds_memory()
                    else None,
                    memory=memory,
                    new_session=not foreground,
                    sigmask=mask,
                )
                child = launch.start()
                child_start = process_start_time(child, host.settings.proc_root)
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
                    level=level,
                    owner=owner,
                    created=time.time(),
                    policy=decision.policy,
                    workload=request.workload,
                    qos=spec.qos,
                    near=spec.near,
                    reservation=spec.reservation,
                    rebalance=spec.rebalance,
                )
                state = state.add(assignment)
                if host.qos_policy is not None:
                    from corepin.agent.host.qos_policy import store_policy

                    store_policy(host.settings.state_dir, host.qos_policy)
                if caller_group is not None and state.shield is not None:
                    from corepin.state.shield import MovedTask, merge_moved

                    moved = MovedTask(child, child_start, caller_group)
                    state = state.evolve(
                        shield=state.shield.evolve(moved=merge_moved(state.shield.moved, [moved]))
                    )
                # a shield shrinks its system set before CMD starts on the CPUs it takes
                state = txn.commit(host.sync_shield(state, strict=assignment.exclusive))
                if line is not None:
                    line.leave()  # the next run in line may try now
                # the pool changed: shrink the shared processes before CMD starts on its CPUs
                if assignment.exclusive:
                    host.repin_shared(state)
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

    def _resctrl_tasks(self, probe: Assignment) -> str | None:
        """The `tasks` file of the run's class's resctrl group, when resctrl is mounted and
        the class has a group (`--resctrl-root`; given and not there: a note, no error)."""
        from corepin.agent.host.besteffort import DEFAULT_RESCTRL_ROOT, resctrl_tasks_file

        root = self.host.resctrl_root
        if not os.path.isdir(root or DEFAULT_RESCTRL_ROOT):
            if root is not None:
                print(
                    printable(
                        f"corepin run: note: no resctrl at {root}: the run gets no cache or "
                        "memory bandwidth class"
                    ),
                    file=sys.stderr,
                )
            return None
        return resctrl_tasks_file(root or DEFAULT_RESCTRL_ROOT, probe.qos_class)

    def _check_partition(self, spec: RunSpec, kind: str) -> None:
        """A partition needs an exclusive run and cpuset cgroups on cgroup v2."""
        if kind != "exclusive":
            raise InputError(
                f"--partition {spec.partition} needs an exclusive run (this one is {kind})",
                reason="bad_usage",
            )
        driver = self.host.pinner.driver
        if driver is None or driver.version != 2:
            raise EnvironmentProblem(
                f"--partition {spec.partition} needs cpuset cgroups on cgroup v2 "
                + ("(cgroups are off or unusable here)" if driver is None else "(this is v1)"),
                reason="cgroup_unsupported",
            )

    # ------------------------------------------------------------------ memory
    def _check_nodes(self, nodes: CPUSet, mode: str) -> None:
        known = CPUSet(self.host.topology.numa_node_ids())
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
            return CPUSet(self.host.topology.numa_node_ids()) or memory.nodes
        return memory.nodes

    def _binds_memory(self) -> bool:
        """Whether runs outside a cpuset cgroup bind their memory with set_mempolicy: when
        the machine has two or more NUMA nodes with CPUs (or when forced, for testing)."""
        host = self.host
        return host.settings.force_membind or len(host.topology.numa_node_ids()) > 1

    # ------------------------------------------------------------------ the end of a run
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
        host = self.host
        old_handlers = {}
        for sig in HELD_SIGNALS:
            old_handlers[sig] = signal.signal(sig, signal.SIG_IGN)
        try:
            with host.transaction() as txn:
                state = txn.state
                a = state.get(assignment_id)
                if a is None:  # released on purpose, or never committed
                    host.remove_cgroups(state)
                    return
                table = host.liveness.table()
                a = _adopt_orphans(a, table)
                if host.liveness.status(a, table, ignore_runner=True) in (LINGERING, UNKNOWN):
                    if a is not state.get(assignment_id):
                        txn.commit(state.replace_assignment(a))
                    _say_lingering(a, host.pinner.cgroup_pids(a), table)
                    return
                state, _ = host.liveness.reap(state.remove(assignment_id), table)
                state = txn.commit(host.sync_shield(state))
                host.remove_cgroups(state)
                if a.exclusive:
                    host.repin_shared(state)
        finally:
            for sig, handler in old_handlers.items():
                signal.signal(sig, handler)


def _adopt_orphans(a: Assignment, table: dict[int, ProcStat]) -> Assignment:
    """`a` with the processes that outlived CMD and were re-parented to this corepin (its
    child subreaper) recorded as members."""
    process = a.process
    if process is None or process.session is not None or process.cgroup is not None:
        return a
    me = os.getpid()
    orphans = tuple((pid, st.start_time) for pid, st in table.items() if st.ppid == me and st.alive)
    if not orphans:
        return a
    return a.evolve(owner=replace(process, members=process.members + orphans))


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


def _say_lingering(a: Assignment, in_cgroup: list[int] | None, table: dict[int, ProcStat]) -> None:
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
