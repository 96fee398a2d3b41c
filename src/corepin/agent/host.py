"""Standalone host mode: `corepin run`, `report` and `reconcile` (CONTRACTS.md section 5).

Composition only: the state layer keeps the checkpoint and the lock, the allocation layer
decides, the enforcement layer pins (affinity of process trees, cpuset cgroups), and this module
wires them into the three commands.

`corepin run` in one transaction (under the state lock):
  1. load the state (validated against the live topology) and reap assignments whose processes
     are gone (pid + start time, so a recycled pid never keeps a dead allocation alive);
  2. decide: exclusive runs ask the policy for N CPUs out of `free`; shared runs take the pool;
  3. fork CMD held before exec (see `launch.py`), record the assignment with the child's pid and
     start time (and corepin's own pid as `owner_pid`), commit;
  4. re-pin every shared process to the new (smaller) shared pool, place the child in its
     cgroup, then let it exec.
CMD runs; when it exits (or corepin is told to stop, which it forwards), a second transaction
releases the assignment and re-pins the shared processes to the grown pool. A `kill -9` of
corepin leaves the assignment behind while CMD lives; once neither is alive the next run or
`reconcile` frees it.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from corepin.agent.settings import HostSettings
from corepin.core.cpuset import CPUSet
from corepin.core.errors import AllocationError, InputError

if TYPE_CHECKING:
    from corepin.agent.pinning import Pinner
    from corepin.state.model import Assignment, HostState
    from corepin.topology.model import Topology

#: `meta` keys of host-mode assignments.
META_SOURCE = "source"
META_OWNER_PID = "owner_pid"
META_OWNER_START = "owner_start"
META_COMMAND = "command"
META_NAME = "name"
SOURCE_RUN = "corepin-run"


@dataclass(frozen=True, slots=True)
class Change:
    """One thing reconcile (or a pool change) did: `action` on `target`, with `detail`."""

    action: str
    target: str
    detail: str

    def to_json(self) -> dict[str, str]:
        return {"action": self.action, "target": self.target, "detail": self.detail}

    def __str__(self) -> str:
        return f"{self.action} {self.target}: {self.detail}"


class HostAgent:
    """One host's view: settings, live topology, state transactions, pinning."""

    def __init__(self, settings: HostSettings, topology: Topology | None = None) -> None:
        self.settings = settings
        self._topology = topology
        self._pinner: Pinner | None = None

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
            from corepin.agent.pinning import Pinner

            self._pinner = Pinner(self.settings, self.topology)
        return self._pinner

    @contextmanager
    def transaction(self) -> Iterator[Any]:
        """The state transaction (exclusive lock held) with the state validated at boot."""
        from corepin.agent.store import open_transaction

        with open_transaction(self.settings, self.topology, self._alive) as txn:
            yield txn

    def read_state(self) -> HostState:
        """The current state without taking part in a write (shared lock when available)."""
        from corepin.agent.store import read_state

        return read_state(self.settings, self.topology, self._alive)

    # ------------------------------------------------------------------ liveness
    def _alive(self, a: Assignment) -> bool:
        from corepin.sysfs.procfs import process_alive

        proc = self.settings.proc_root
        if a.pid is not None and process_alive(a.pid, a.start_time, proc):
            return True
        owner = _int_or_none(a.meta.get(META_OWNER_PID))
        if owner is not None:
            start = _int_or_none(a.meta.get(META_OWNER_START))
            if process_alive(owner, start, proc):
                return True
        if a.pid is None and a.cgroup is not None:
            return self.pinner.cgroup_exists(a.cgroup)
        return False

    def reap(self, state: HostState) -> tuple[HostState, list[Change]]:
        """`state` without the assignments whose processes are all gone."""
        dead = [a for a in state if not self._alive(a)]
        changes = [
            Change("freed", a.id, f"process {a.pid} is gone; released CPUs {a.reserved or '-'}")
            for a in dead
        ]
        return state.remove_many(a.id for a in dead), changes

    def _binds_memory(self) -> bool:
        """Whether runs outside a cpuset cgroup bind their memory with set_mempolicy: when
        the machine has two or more NUMA nodes with CPUs (or when forced, for testing)."""
        return self.settings.force_membind or len(self.topology.numa_node_ids()) > 1

    # ------------------------------------------------------------------ decide
    def decide(
        self,
        state: HostState,
        *,
        exclusive: int | None,
        with_shared: bool,
        level: str,
        policy: str,
        options: Mapping[str, str],
    ) -> tuple[str, CPUSet, CPUSet, CPUSet, str]:
        """(kind, cpus, reserved, mems, policy name) for a new run; AllocationError if none."""
        topo = self.topology
        if exclusive is None:
            pool = state.shared_pool
            if not pool:
                raise AllocationError(
                    "the shared pool is empty: every online CPU is held exclusively "
                    f"({state.exclusive_cpus}); wait for an exclusive run to end",
                    reason="shared_pool_empty",
                )
            return "shared", CPUSet(), CPUSet(), topo.mems_of(pool), ""
        from corepin.allocation.policies import get_policy
        from corepin.allocation.types import Request

        request = Request(count=exclusive, level=level, options=dict(options))
        free = state.free
        if len(free) < exclusive:
            raise AllocationError(
                f"cannot allocate {exclusive} exclusive CPU(s): only {len(free)} free "
                f"({free or 'none'}) of online {state.online}",
                reason="not_enough_cpus",
            )
        decision = get_policy(policy).decide(topo, request, free)
        if state.shared_assignments() and not (state.shared_pool - decision.reserved):
            raise AllocationError(
                f"cannot allocate {exclusive} exclusive CPU(s): CPUs {decision.reserved} would "
                "leave no CPU for the running shared processes",
                reason="shared_pool_exhausted",
            )
        kind = "mixed" if with_shared else "exclusive"
        return kind, decision.cpus, decision.reserved, decision.mems, decision.policy

    def _reap_and_decide(
        self,
        state: HostState,
        *,
        exclusive: int | None,
        with_shared: bool,
        level: str,
        options: Mapping[str, str],
    ) -> tuple[HostState, tuple[str, CPUSet, CPUSet, CPUSet, str]]:
        """`state` without its dead assignments, and the decision (with the configured policy)
        for a new one on what is left."""
        state, _ = self.reap(state)
        decided = self.decide(
            state,
            exclusive=exclusive,
            with_shared=with_shared,
            level=level,
            policy=self.settings.policy,
            options=options,
        )
        return state, decided

    # ------------------------------------------------------------------ enforce
    def enforce(self, state: HostState, ids: set[str] | None = None) -> list[Change]:
        """Make the pins of the live assignments (or just `ids`) match the state."""
        self.pinner.forget_processes()
        chosen = [a for a in state if ids is None or a.id in ids]
        if not chosen:
            return []
        return self.pinner.apply_all(chosen, state.shared_pool)

    def repin_shared(self, state: HostState) -> list[Change]:
        """Re-pin every shared and mixed assignment to the current shared pool."""
        return self.enforce(state, {a.id for a in state.shared_assignments()})

    # ------------------------------------------------------------------ run
    def run(
        self,
        argv: list[str],
        *,
        exclusive: int | None,
        with_shared: bool,
        level: str,
        options: Mapping[str, str],
        name: str | None,
    ) -> int:
        from corepin.agent.launch import Launch
        from corepin.state.model import Assignment
        from corepin.sysfs.procfs import process_start_time

        if not argv:
            raise InputError(
                "no command given: use `corepin run [options] -- CMD ARGS...`",
                reason="missing_command",
            )
        label = name or os.path.basename(argv[0]) or "cmd"
        me = os.getpid()
        my_start = process_start_time(me, self.settings.proc_root)
        launch: Launch | None = None
        assignment_id = ""
        try:
            with self.transaction() as txn:
                state, (kind, cpus, reserved, mems, policy) = self._reap_and_decide(
                    txn.state,
                    exclusive=exclusive,
                    with_shared=with_shared,
                    level=level,
                    options=options,
                )
                assignment_id = _new_id(state)
                after_pool = state.shared_pool - reserved
                affinity = cpus | after_pool if kind != "exclusive" else cpus
                cgroup: str | None = None
                procs: str | None = None
                run_mems = mems if kind == "exclusive" else self.topology.mems_of(affinity)
                if self.pinner.cgroups_enabled:
                    cgroup = self.pinner.cgroup_path_for(assignment_id)
                    procs = self.pinner.prepare(cgroup, affinity, run_mems)
                launch = Launch(
                    argv,
                    affinity,
                    _environment(kind, cpus, after_pool, mems),
                    cgroup_procs=procs,
                    bind_mems=run_mems
                    if procs is None and run_mems and self._binds_memory()
                    else None,
                )
                child = launch.start()
                assignment = Assignment(
                    id=assignment_id,
                    kind=kind,
                    cpus=cpus,
                    reserved=reserved,
                    mems=mems,
                    level=level,
                    pid=child,
                    start_time=process_start_time(child, self.settings.proc_root),
                    cgroup=cgroup,
                    created=time.time(),
                    policy=policy,
                    meta={
                        META_SOURCE: SOURCE_RUN,
                        META_OWNER_PID: str(me),
                        META_OWNER_START: str(my_start),
                        META_NAME: label,
                        META_COMMAND: " ".join(argv)[:200],
                    },
                )
                state = txn.commit(state.add(assignment))
                # the pool changed: shrink the shared processes before CMD starts on its CPUs
                if exclusive is not None:
                    self.repin_shared(state)
                launch.go()
        except BaseException:
            if launch is not None and launch.pid:
                launch.abort()
            if assignment_id:
                self.release(assignment_id)
            raise
        try:
            code = launch.wait()
        finally:
            self.release(assignment_id)
        return code

    def release(self, assignment_id: str) -> None:
        """Free the run's assignment, remove its cgroup, grow the shared pool."""
        old_handlers = {}
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            old_handlers[sig] = signal.signal(sig, signal.SIG_IGN)
        try:
            with self.transaction() as txn:
                state = txn.state
                gone = state.get(assignment_id)
                state, reaped = self.reap(state.remove(assignment_id, missing_ok=True))
                if gone is not None or reaped:
                    state = txn.commit(state)
                if gone is not None:
                    self.pinner.remove(gone)
                    if gone.exclusive:
                        self.repin_shared(state)
                elif self.pinner.cgroups_enabled:  # prepared but never committed
                    self.pinner.remove_orphans({a.id for a in state})
        finally:
            for sig, handler in old_handlers.items():
                signal.signal(sig, handler)

    # ------------------------------------------------------------------ containers
    def pin_container(
        self,
        container_id: str,
        *,
        exclusive: int | None,
        runtime: str | None = None,
        level: str = "cpu",
        options: Mapping[str, str] | None = None,
        kubepods: str = "kubepods",
    ) -> Assignment:
        """Find a running container's cgroup in the kubelet layouts (below `kubepods`), allocate
        for it and write its cpuset: exclusive CPUs, or the shared pool when `exclusive` is None.

        The id is validated before any path is built (IdError, exit 2); a container without a
        cgroup raises InputError; a host without a writable cpuset hierarchy EnvironmentProblem.
        """
        from corepin.core.errors import EnvironmentProblem
        from corepin.core.ids import validate_container_id
        from corepin.enforcement.layout import find_container_cgroup
        from corepin.state.model import Assignment

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
        with self.transaction() as txn:
            state, (kind, cpus, reserved, mems, policy) = self._reap_and_decide(
                txn.state,
                exclusive=exclusive,
                with_shared=False,
                level=level,
                options=options or {},
            )
            assignment = Assignment(
                id=f"ctr-{ident[:12]}",
                kind=kind,
                cpus=cpus,
                reserved=reserved,
                mems=mems,
                level=level,
                cgroup=path,
                created=time.time(),
                policy=policy,
                meta={META_SOURCE: "container", META_NAME: ident[:12], "container_id": ident},
            )
            state = txn.commit(state.replace_assignment(assignment))
            if exclusive is not None:
                self.repin_shared(state)
            self.pinner.apply(assignment, state.shared_pool)
        return assignment

    # ------------------------------------------------------------------ reconcile
    def reconcile_once(self) -> list[Change]:
        """Free what died, re-apply drifted pins; steady state: no writes at all."""
        with self.transaction() as txn:
            before = txn.state
            state, changes = self.reap(before)
            if changes:
                txn.commit(state)
                state = txn.state
                for a in before:
                    if a.id not in state:
                        self.pinner.remove(a)
            changes.extend(self.enforce(state))
            changes.extend(self.pinner.remove_orphans({a.id for a in state}))
        return changes

    # ------------------------------------------------------------------ report
    def report(self, state: HostState) -> dict[str, Any]:
        pool = state.shared_pool
        allocations = []
        for a in state:
            allocations.append(
                {
                    "id": a.id,
                    "pid": a.pid,
                    "cpus": str(a.affinity(pool)),
                    "exclusive": a.exclusive,
                    "kind": a.kind,
                    "exclusive_cpus": str(a.cpus),
                    "reserved": str(a.reserved),
                    "mems": str(a.mems),
                    "level": a.level,
                    "name": a.meta.get(META_NAME, ""),
                    "command": a.meta.get(META_COMMAND, ""),
                    "owner_pid": _int_or_none(a.meta.get(META_OWNER_PID)),
                    "cgroup": a.cgroup,
                    "created": a.created,
                    "policy": a.policy,
                    "alive": self._alive(a),
                }
            )
        return {
            "allocations": allocations,
            "shared_pool": str(pool),
            "free": str(state.free),
            "online": str(state.online),
            "reserved": str(state.reserved),
            "exclusive": str(state.exclusive_cpus),
            "revision": state.revision,
        }


def _int_or_none(text: str | None) -> int | None:
    """A non-negative integer kept as text in `meta`, or None when absent or not a number."""
    return int(text) if text and text.isascii() and text.isdigit() else None


def _new_id(state: HostState) -> str:
    while True:
        candidate = f"run-{os.getpid()}-{os.urandom(2).hex()}"
        if candidate not in state:
            return candidate


def _environment(kind: str, cpus: CPUSet, pool: CPUSet, mems: CPUSet) -> dict[str, str]:
    exclusive = cpus if kind != "shared" else CPUSet()
    shared = pool if kind != "exclusive" else CPUSet()
    return {
        "COREPIN_CPUS": str(exclusive | shared),
        "COREPIN_CPUS_EXCLUSIVE": str(exclusive),
        "COREPIN_CPUS_SHARED": str(shared),
        "COREPIN_MEMS": str(mems),
    }


def parse_options(items: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not key:
            raise InputError(f"bad policy option {item!r}: expected NAME or NAME=VALUE")
        out[key] = value if sep else "true"
    return out
