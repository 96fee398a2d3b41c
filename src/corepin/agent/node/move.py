"""A live move of one running exclusive container to other CPUs: the one way the node agent
changes the CPUs of a container it did not decide anew (rebalancing to better-aligned CPUs,
CPUs newly reserved under a container).

A move is done in two halves, so that a caller already inside the worker's state transaction
can move several containers in it:
- `relocate(state, assignment_id, new_cpus, new_withheld, topology, reason)` (pure): the state
  where the container holds `new_cpus` (withholding `new_withheld`) instead of its old CPUs,
  same kind and level, and the `Moved` record of it;
- `Mover.enforce(state, moves)`, after the commit: the container cgroups (in place, pages
  following a change of memory nodes: `CgroupTarget(migrate_memory=True)`), the shared
  containers when the shared pool changed, an Event `CPUMoved` on the pod, and the pod's
  records handed to the publisher (its `corepin.io/cpus` annotation, its PodCPUBinding, its
  assignment files) as for any other change.
`Mover.move_container(...)` does both in a transaction of its own (call it on the agent's
worker thread, outside a batch); a move that changes the shared pool re-sizes the system shield
in that transaction, before any container gets the CPUs, as a batch does.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from corepin.agent.node.decide import Decider, PodWork
from corepin.agent.node.enforce import ContainerCgroups
from corepin.agent.node.hooks import Hooks
from corepin.agent.node.publish import Publisher
from corepin.agent.node.qos import NodeQos
from corepin.agent.node.shield import SystemShield
from corepin.agent.node.store import NodeStore
from corepin.agent.node.sync import PodEvent, shared_pool_users
from corepin.agent.node.tell import Teller
from corepin.allocation.levels import withheld_for
from corepin.core.cpuset import CPUSet
from corepin.core.errors import CorepinError
from corepin.core.record import record, replace
from corepin.state.model import Assignment, HostState
from corepin.state.move import move_assignment
from corepin.topology.model import Topology

log = logging.getLogger("corepin.agent.node")


@record
class Moved:
    """One container moved: its assignment before and after, and why (one sentence)."""

    old: Assignment
    new: Assignment
    reason: str

    @property
    def message(self) -> str:
        """The `CPUMoved` Event's message."""
        owner = self.new.container
        name = owner.container if owner is not None else self.new.id
        return f"container {name!r}: CPUs {self.old.cpus} -> {self.new.cpus} ({self.reason})"


def relocate(
    state: HostState,
    assignment_id: str,
    new_cpus: CPUSet,
    new_withheld: CPUSet,
    topology: Topology,
    reason: str,
) -> tuple[HostState, Moved]:
    """The state with the assignment `assignment_id` on `new_cpus` (withholding `new_withheld`;
    empty: what its level withholds), same kind and level, its memory nodes those of the new
    CPUs (`corepin.state.move.move_assignment`, whose errors it raises)."""
    old = state.get(assignment_id)
    level = old.level if old is not None else "cpu"
    withheld = new_withheld or withheld_for(topology, level, new_cpus)
    moved, before, after = move_assignment(
        state, assignment_id, new_cpus, withheld, topology.mems_of(new_cpus)
    )
    return moved, Moved(before, after, reason)


class Mover:
    """The effects of live moves in the node agent (see the module docstring)."""

    def __init__(
        self,
        store: NodeStore,
        topology: Topology,
        cgroups: ContainerCgroups,
        hooks: Hooks,
        qos: NodeQos,
        decider: Decider,
        teller: Teller,
        publisher: Publisher,
        shield: SystemShield | None = None,
    ) -> None:
        self.store = store
        self.shield = shield
        self.machine = topology
        self.cgroups = cgroups
        self.hooks = hooks
        self.qos = qos
        self.decider = decider
        self.teller = teller
        self.publisher = publisher

    def move_container(
        self, assignment_id: str, new_cpus: CPUSet, new_withheld: CPUSet, reason: str
    ) -> Moved:
        """Move one container live (its own transaction, then `enforce`); the errors of
        `relocate` when it cannot be moved (nothing changed then)."""
        with self.store.transaction() as txn:
            before = txn.state
            state, moved = relocate(
                before, assignment_id, new_cpus, new_withheld, self.machine, reason
            )
            if self.shield is not None:
                state = self.shield.apply(state, before, resync=False)
            state = txn.commit_if_changed(state)
        self.enforce(state, [moved], pool_changed=state.shared_pool != before.shared_pool)
        return moved

    def enforce(
        self, state: HostState, moves: Sequence[Moved], *, pool_changed: bool = True
    ) -> None:
        """After the commit of `moves`: cgroups, Events, records (see the module docstring)."""
        if not moves:
            return
        targets = self.cgroups.targets(
            state,
            [state.get(m.new.id) or m.new for m in moves],
            be_cpus=self.qos.be_cpus,
            is_be=self.qos.is_be,
        )
        targets = [replace(t, migrate_memory=True) for t in targets]
        if pool_changed:
            targets.extend(
                self.cgroups.targets(
                    state,
                    shared_pool_users(state),
                    be_cpus=self.qos.be_cpus,
                    is_be=self.qos.is_be,
                )
            )
            self.publisher.later(("pool",), None)
        if targets:
            report = self.cgroups.apply(targets)
            self.hooks.cgroup_writes(report.writes)
            for err in report.errors:
                self.hooks.pinning(False, err.reason)
                log.warning("event=move_cgroup_failed error=%s", err)
        for m in moves:
            log.info("event=container_moved id=%s old=%s new=%s", m.new.id, m.old.cpus, m.new.cpus)
            self._tell(state, m)
        self.publisher.later(("topology",), None)

    def _tell(self, state: HostState, m: Moved) -> None:
        owner = m.new.container
        if owner is None:
            return
        pod = self.decider.watches.pod(owner.pod, owner.namespace)
        if pod is None:
            return
        try:
            plan = self.decider.plan_of(pod)
        except CorepinError as exc:
            log.warning("event=move_plan_failed id=%s error=%s", m.new.id, exc)
            return
        event = PodEvent("Normal", "CPUMoved", m.message, owner.container)
        try:
            self.teller.tell(pod, plan, [event])
        except Exception:
            log.exception("event=event_failed id=%s", m.new.id)
        self.publisher.later(("pod", plan.uid), PodWork(pod, plan, []))


__all__ = ["Moved", "Mover", "relocate"]
