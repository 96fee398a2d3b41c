"""Standalone host mode (`corepin run`, `pin`, `report`, `reconcile`, `release`, `shield`): the
parts every command shares.

Composition only: the state layer keeps the checkpoint and the lock, the allocation layer
decides out of the node's one pool model, the enforcement layer pins (affinity of process
groups, cpuset cgroups), and `HostAgent` wires them for the commands, each in a module of its
own: `run` (`corepin run`), `adopt` (`corepin pin`, containers), `release`, `reconcile`,
`report`, `shield`. `HostAgent` holds one host's view (settings, live topology, pinner,
shield, `liveness`) and the steps the commands share: the state transaction, the decision for
a new assignment, the reserved CPUs, the shield's re-sizing and the pins.

On the start-up path of `corepin run`: the imports inside functions stay there on purpose (each
module loaded costs every run its time).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from corepin.agent.host.liveness import Liveness
from corepin.agent.host.settings import HostSettings
from corepin.core.cpuset import CPUSet
from corepin.core.errors import AllocationError, EnvironmentProblem, InputError
from corepin.core.text import printable
from corepin.enforcement.note import Note

if TYPE_CHECKING:
    from corepin.agent.host.pinning import Pinner
    from corepin.allocation.qos import QosPolicy
    from corepin.allocation.types import Decision, Request
    from corepin.enforcement.shield.control import Shield
    from corepin.state.model import HostState
    from corepin.state.reservations import Reservation
    from corepin.state.transaction import CheckedTransaction
    from corepin.topology.model import Topology


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
        #: which assignments live (one view of /proc per transaction)
        self.liveness = Liveness(settings.proc_root, lambda: self.pinner)
        #: reserved CPUs asked for on the command line: (count, explicit CPUs or None); each
        #: transaction of a command records them in the state (`with_reserved`)
        self.reserve = reserve
        #: what the shield did in the last transaction that synced it (reports, warnings)
        self.shield_notes: list[Note] = []
        #: node QoS: the policy given on the command line (`--qos-config`; None: the one kept
        #: in the state directory), where resctrl is mounted (`--resctrl-root`; None: the
        #: default, and quiet when it is not there), and the BE set the QoS loop of
        #: `corepin reconcile` keeps in force (None: the BE group's cpuset is read)
        self.qos_policy: QosPolicy | None = None
        self.resctrl_root: str | None = None
        self.be_cpus: CPUSet | None = None
        #: the reservations the last transaction ended because their TTL ran out
        self.expired: tuple[Reservation, ...] = ()

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
    def transaction(self) -> Iterator[CheckedTransaction]:
        """The state transaction (exclusive lock held) with the state validated at boot.

        One scan of /proc serves the whole transaction (`Liveness.table`): the liveness checks
        of the boot validation, of reaping and of the command itself see the same snapshot.

        Reservations whose TTL has run out end first (committed at once, listed in `expired`;
        a run on one keeps its CPUs: `HostState.expire_reservations`)."""
        from corepin.state.store import StateStore
        from corepin.state.transaction import open_transaction

        self.liveness.forget()
        self.expired = ()
        store = StateStore(self.settings.state_dir, proc_root=self.settings.proc_root)
        try:
            with open_transaction(
                store,
                self.topology,
                timeout=self.settings.lock_timeout,
                dead_ids=self.liveness.dead_ids,
            ) as txn:
                if txn.state.reservations:
                    fresh, self.expired = _without_expired(txn.state)
                    if self.expired:
                        txn.commit(fresh)
                yield txn
        finally:
            self.liveness.forget()

    def read_state(self) -> HostState:
        """The current state without taking part in a write (no lock)."""
        from corepin.state.adopt import read_state
        from corepin.state.store import StateStore

        self.liveness.forget()
        store = StateStore(self.settings.state_dir, proc_root=self.settings.proc_root)
        state = read_state(store, self.topology, self.liveness.dead_ids)
        # what the next transaction will find: an expired reservation is never shown as held
        return _without_expired(state)[0] if state.reservations else state

    # ------------------------------------------------------------------ decide
    def decide(self, state: HostState, request: Request, kind: str) -> Decision:
        """The decision for a new assignment of `kind` out of `state`'s pools (AllocationError
        when there is none)."""
        from corepin.allocation.api import check_request
        from corepin.allocation.decide import decide
        from corepin.allocation.policies import get_policy

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
            names = ", ".join(
                f"{h} ({printable(state.assignments[h].label)})" if h in state.assignments else h
                for h in holders
            )
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
    def with_reserved(self, state: HostState) -> HostState:
        """`state` with the reserved CPUs this command was given (`--reserved-cpus`,
        `--reserved-count`); unchanged without. AllocationError (reason `reserved_held`) when
        an assignment holds one of them: reserved CPUs are never handed out."""
        if self.reserve is None:
            return state
        from corepin.allocation.reserved import reserved_cpus

        count, explicit = self.reserve
        if explicit is not None and not explicit <= self.topology.online_cpus:
            raise InputError(
                f"--reserved-cpus {explicit}: CPUs {explicit - self.topology.online_cpus} are "
                "not online CPUs of this machine",
                reason="bad_reservation",
            )
        wanted = reserved_cpus(self.topology, count, explicit)
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

    # ------------------------------------------------------------------ shield
    def sync_shield(self, state: HostState, *, strict: bool = False) -> HostState:
        """`state` with its shield made to match its pools (see
        `corepin.enforcement.shield.control`): the system set resized before what it loses is
        handed out. With `strict` (CPUs are being handed out) a system set that cannot shrink is
        an EnvironmentProblem."""
        if state.shield is None:
            return state
        result = self.shield.sync(state, self.liveness.table(), cgroup_pids=self.pinner.cgroup_pids)
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
        pool = state.shared_pool
        be_cpus = self.be_cpus & pool if self.be_cpus is not None else None
        return self.pinner.apply_all(chosen, pool, be_cpus or None)

    def repin_shared(self, state: HostState) -> list[Note]:
        """Re-pin every shared and mixed assignment to the current shared pool (best-effort
        ones to the BE set within it: `Pinner.be_cpus`)."""
        return self.enforce(state, {a.id for a in state.shared_assignments()})

    def remove_cgroups(self, state: HostState) -> list[Note]:
        """Remove the empty cgroups of this state directory that no assignment owns (and its
        parent group once nothing is left). Under the state lock only."""
        if not self.pinner.cgroups_enabled:
            return []
        return self.pinner.remove_orphans({a.id for a in state})


def _without_expired(state: HostState) -> tuple[HostState, tuple[Reservation, ...]]:
    """`state` without its expired reservations (a run on one keeps its CPUs), and those."""
    import time

    return state.expire_reservations(time.time())
