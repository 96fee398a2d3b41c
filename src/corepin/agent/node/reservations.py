"""CPUReservations in the node agent: CPUs held on this node for pods that have not come yet.

The agent watches the CPUReservations whose node (`spec.nodeName`, else the scheduler's
`status.nodeName`) is its own. On the worker thread, in the batch's state transaction (`apply`):
- a reservation not done and not expired is held in the state
  (`HostState.add_reservation`): its `spec.cpuSet` exactly, or `spec.cpus` CPUs chosen by the
  agent's policy at `spec.level` (the decision pods get); one that cannot be held is `Failed`
  with the reason;
- one deleted, expired (phase `Expired`, or its TTL run out) or made again under its name is
  dropped; a pod running on its CPUs keeps them as its own;
- a pod it matches (`CPUReservation.matches`) gets its CPUs (`reservation_for`, used by the
  decisions of `corepin.agent.node.sync`); a one-time reservation (allocateOnce) its pod
  consumed is `Succeeded` with the pod in `status.owners`, a reusable one stays `Available`
  and gains the pod in `status.owners`.
CPUs newly reserved (an exact `cpuSet`, or the node's reservation annotation through
`corepin.agent.node.reservation`) that containers hold are cleared first (`clear_cpus`): shared
containers simply follow the smaller shared pool; a container with CPUs of its own is moved live
(`corepin.agent.node.move`) when CPUs of the same size and level are free elsewhere; otherwise
the reservation waits (`Pending`, the message says for whom) and the pod is told
(`CPUReservationBlocked`), or, with `--evict-on-reservation`, evicted through the Eviction API
(a refusal, such as a PodDisruptionBudget's, is told as `CPUEvictionRefused` and tried again
`retry` seconds later).

After the commit (`after_commit`) the moves are enforced and every API write (statuses,
evictions) is handed to the agent's publisher thread; Events go through the agent's recorder.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any, Final

from corepin.agent.node.move import Moved, Mover, relocate
from corepin.agent.node.publish import Key, Publisher
from corepin.agent.node.watches import Watches
from corepin.allocation.decide import decide
from corepin.allocation.levels import withheld_for
from corepin.allocation.types import Policy, Request
from corepin.core.cpuset import CPUSet
from corepin.core.errors import CorepinError
from corepin.core.record import field, record
from corepin.kube.client import Obj
from corepin.kube.events import EventRecorder
from corepin.kube.eviction import evict
from corepin.kube.models import ObjectView
from corepin.kube.models.cpur import CPUReservation, CPUReservationStatus, ReservationUser
from corepin.kube.resources import CPUR
from corepin.state.kubelet import KUBELET_POLICY
from corepin.state.model import Assignment, HostState
from corepin.state.reservations import Reservation
from corepin.topology.model import Topology

log = logging.getLogger("corepin.agent.node")

#: seconds before a blocked reservation (a refused eviction) is tried again
RETRY: Final = 10.0


@record
class Clearing:
    """CPUs cleared for a reservation: the state with the containers that held them moved
    elsewhere, the moves, and the containers that could not be moved (then nothing moved)."""

    state: HostState
    moves: tuple[Moved, ...] = ()
    blocked: tuple[Assignment, ...] = ()


def clear_cpus(
    state: HostState, cpus: CPUSet, topology: Topology, policy: Policy, reason: str
) -> Clearing:
    """Move every assignment holding some of `cpus` to CPUs of the same size and level outside
    them (chosen by `policy`, as a new decision would be). All or nothing: when one of them
    cannot move (nothing fits, it runs on a reservation, the kubelet owns it), the state is
    left as it was and the ones that cannot move are named."""
    holders = [a for a in state if a.holds and a.withheld & cpus]
    moves: list[Moved] = []
    blocked: list[Assignment] = []
    work = state
    for a in holders:
        if a.reservation is not None or a.container is None or a.policy == KUBELET_POLICY:
            blocked.append(a)
            continue
        try:
            pools = work.remove(a.id).pools
            hidden = cpus & pools.free
            if hidden:
                pools = pools.hold("exclusive", hidden)
            request = Request(len(a.cpus), level=a.level, workload=a.workload)
            decision = decide(pools, topology, request, policy, kind=a.kind, keep_shared=True)
            work, moved = relocate(
                work, a.id, decision.cpus, decision.withheld | decision.cpus, topology, reason
            )
        except CorepinError as exc:
            log.info("event=move_impossible id=%s cpus=%s error=%s", a.id, a.cpus, exc)
            blocked.append(a)
            continue
        moves.append(moved)
    if blocked:
        return Clearing(state, (), tuple(blocked))
    return Clearing(work, tuple(moves), ())


@record(frozen=False)
class _Block:
    """What waits for CPUs to be cleared: the reservation (its name, or the node
    reservation's), the CPUs and the containers on them."""

    what: str
    cpus: CPUSet
    holders: tuple[Assignment, ...] = field(default_factory=tuple)


class NodeReservations:
    """The node's CPUReservations as the agent holds them (see the module docstring)."""

    def __init__(
        self,
        watches: Watches,
        topology: Topology,
        policy: Policy,
        events: EventRecorder,
        mover: Mover,
        publisher: Publisher,
        clock: Callable[[], float],
        *,
        evict_on_reservation: bool = False,
    ) -> None:
        self.watches = watches
        self.machine = topology
        self.policy = policy
        self.events = events
        self.mover = mover
        self.publisher = publisher
        self.clock = clock
        self.evict_on_reservation = evict_on_reservation
        #: seconds before a blocked reservation is tried again (`RETRY`)
        self.retry = RETRY
        self._lock = threading.Lock()
        self._moves: list[Moved] = []
        self._blocks: list[_Block] = []
        self._statuses: dict[str, CPUReservationStatus] = {}  # name -> status to write
        self._written: dict[str, tuple[str, dict[str, Any]]] = {}  # name -> (uid, status)
        self._consumed: set[str] = set()  # uids of one-time reservations consumed here
        self._told: dict[tuple[str, str], str] = {}  # (pod uid, reason) -> message
        self._next: float | None = None  # when to look again (expiry, retry)
        self._enqueue: Callable[[Key], None] | None = None

    # ------------------------------------------------------------------ the informer
    def start(
        self,
        spawn: Callable[[Callable[[], None], str], None],
        stop: threading.Event,
        enqueue: Callable[[Key], None],
        deadline: float,
    ) -> None:
        """Start the CPUReservations' informer (a change puts the key ("reservations",) on the
        agent's queue with `enqueue`) and wait for its list (at most 10 s, and not past the
        `deadline` of `time.monotonic()`) when the API
        serves CPUReservations (the agent works without them otherwise, and says so); and a
        thread (until `stop`) that puts the key when an expiry or a retry is due."""
        self._enqueue = enqueue
        informer = self.watches.open_reservations()
        informer.add_handlers(
            on_add=lambda o: self._changed(),
            on_update=lambda old, new: self._changed(),
            on_delete=lambda o: self._changed(),
        )

        def timer() -> None:
            while not stop.wait(0.2):
                if self.due(self.clock()):
                    self._changed()
            informer.stop(1.0)

        spawn(timer, "agent-reservations")
        try:
            self.watches.client.list(CPUR, limit=1)
        except CorepinError as exc:
            log.warning(
                "event=cpureservations_unserved error=%s: no CPUReservation is held until the "
                "API lists them (is the CRD installed, may the agent list and watch them?)",
                exc,
            )
            informer.start()
            return
        informer.start()
        if not informer.wait_for_sync(min(10.0, max(0.1, deadline - time.monotonic()))):
            log.warning("event=cpureservations_not_synced")

    def _changed(self) -> None:
        if self._enqueue is not None:
            self._enqueue(("reservations",))

    # ------------------------------------------------------------------ reads
    def mine(self) -> dict[str, CPUReservation]:
        """The CPUReservations of this node (name -> reservation), unreadable ones left out."""
        out: dict[str, CPUReservation] = {}
        for obj in self.watches.reservation_list():
            try:
                cr = CPUReservation.from_dict(obj)
            except CorepinError as exc:
                log.warning(
                    "event=reservation_unreadable name=%s error=%s", ObjectView(obj).name, exc
                )
                continue
            if cr.node_name == self.watches.node_name:
                out[cr.name] = cr
        return out

    def reservation_for(self, state: HostState, pod: Obj) -> str:
        """The reservation held in `state` whose CPUs the pod gets ("" for none): one its
        CPUReservation's owners match, free, or in use by this very pod."""
        view = ObjectView(pod)
        namespace, name, uid = view.namespace or "default", view.name, view.uid
        if not state.reservations:
            return ""
        crs = self.mine()
        for held in state.reservations.values():
            cr = crs.get(held.name)
            if cr is None or not held.uid or cr.uid != held.uid:
                continue
            mine = any(i.startswith(f"pod/{uid}/") for i in held.consumed_by)
            if (held.available or mine) and cr.matches(namespace, name, view.labels):
                return held.name
        return ""

    def due(self, now: float) -> bool:
        """Whether a pass is due (an expiry, a retry)."""
        with self._lock:
            return self._next is not None and now >= self._next

    # ------------------------------------------------------------------ the worker's pass
    def apply(self, state: HostState) -> HostState:
        """The state with this node's CPUReservations held and the gone ones dropped."""
        now = self.clock()
        stamp = datetime.fromtimestamp(now, UTC)
        crs = self.mine()
        with self._lock:
            self._next = None
        for held in list(state.reservations.values()):
            if not held.uid:
                continue  # (host mode's, `corepin reserve`)
            cr = crs.get(held.name)
            keep = (
                cr is not None
                and cr.uid == held.uid
                and not held.expired(now)
                and not cr.expired(stamp)
                and (not cr.done or (cr.status.phase == "Succeeded" and held.in_use))
            )
            if not keep:
                log.info("event=reservation_dropped name=%s cpus=%s", held.name, held.cpus)
                state = state.remove_reservation(held.name)
                self._written.pop(held.name, None)
        for cr in crs.values():
            if (
                cr.name in state.reservations
                or cr.done
                or cr.expired(stamp)
                or cr.uid in self._consumed
            ):
                continue
            state = self._hold(state, cr, now)
        for gone in set(self._written) - set(crs):
            self._written.pop(gone, None)
        for held in state.reservations.values():
            if held.expires is not None:
                self._wake_at(held.expires)
        return state

    def _hold(self, state: HostState, cr: CPUReservation, now: float) -> HostState:
        spec = cr.spec
        try:
            if spec.cpus:
                cpus = spec.cpus
                offline = cpus - self.machine.online_cpus
                if offline:
                    return self._failed(state, cr, f"CPUs {offline} are not online on this node")
                withheld = withheld_for(self.machine, spec.level, cpus)
                if withheld & state.reserved:
                    return self._failed(
                        state, cr, f"CPUs {withheld & state.reserved} are the node's reserved CPUs"
                    )
                if withheld & state.held:
                    cleared = self.clear(
                        state, withheld, f"CPUReservation {cr.name}", reason="reserved"
                    )
                    if cleared is None:
                        self._statuses[cr.name] = CPUReservationStatus(
                            "Pending",
                            node_name=self.watches.node_name,
                            message=f"CPUs {withheld & state.held} are held by running "
                            "containers that cannot be moved elsewhere; waiting for them",
                        )
                        return state
                    state = cleared
            else:
                request = Request(spec.count, level=spec.level)
                decision = decide(
                    state.pools, self.machine, request, self.policy, kind="exclusive",
                    keep_shared=True,
                )  # fmt: skip
                cpus, withheld = decision.cpus, decision.withheld | decision.cpus
            at = cr.expires_at()
            held = Reservation(
                cr.name,
                cpus,
                withheld,
                level=spec.level,
                reusable=not spec.allocate_once,
                expires=None if at is None else at.timestamp(),
                created=now,
                uid=cr.uid,
            )
            state = state.add_reservation(held)
        except CorepinError as exc:
            return self._failed(state, cr, f"cannot hold {spec.size} CPU(s): {exc.message}")
        log.info("event=reservation_held name=%s cpus=%s", cr.name, cpus)
        return state

    def _failed(self, state: HostState, cr: CPUReservation, message: str) -> HostState:
        log.warning("event=reservation_failed name=%s reason=%s", cr.name, message)
        self._statuses[cr.name] = CPUReservationStatus(
            "Failed", node_name=self.watches.node_name, message=message
        )
        return state

    def _status_of(
        self, state: HostState, held: Reservation, cr: CPUReservation
    ) -> CPUReservationStatus:
        owners = list(cr.status.owners)
        phase = "Available"
        for ident in held.consumed_by:
            a = state.get(ident)
            owner = None if a is None else a.container
            if owner is None:
                continue
            user = ReservationUser(owner.namespace, owner.pod, owner.pod_uid)
            if user not in owners:
                owners.append(user)
            if not held.reusable:
                phase = "Succeeded"
                self._consumed.add(held.uid)
        return CPUReservationStatus(
            phase,
            node_name=self.watches.node_name,
            cpus=held.cpus,
            owners=tuple(owners),
            expire_time=cr.expires_at(),
        )

    def clear(self, state: HostState, cpus: CPUSet, what: str, *, reason: str) -> HostState | None:
        """`clear_cpus` for `what` (a reservation, or the node's): the cleared state (its
        moves enforced after the commit), None when containers block it (told, or evicted,
        after the commit)."""
        clearing = clear_cpus(state, cpus, self.machine, self.policy, f"CPUs {cpus} {reason}")
        if clearing.blocked:
            self._blocks.append(_Block(what, cpus & state.held, clearing.blocked))
            self._wake_at(self.clock() + self.retry)
            return None
        self._moves.extend(clearing.moves)
        return clearing.state

    def _wake_at(self, when: float) -> None:
        with self._lock:
            self._next = when if self._next is None else min(self._next, when)

    # ------------------------------------------------------------------ after the commit
    def after_commit(self, state: HostState, before: HostState, forgotten: Iterable[str]) -> None:
        """After the batch's commit (`before`: the state it started from; `forgotten`: the
        uids of pods gone): enforce the moves of the pass, tell or evict the blockers, write
        the statuses, and look again when CPUs were freed (a reservation may wait for them)."""
        self.forget(forgotten)
        if state.reservations != before.reservations:
            self.publisher.later(("topology",), None)
        if len(state.free) > len(before.free):
            self._changed()
        moves, self._moves = self._moves, []
        blocks, self._blocks = self._blocks, []
        statuses, self._statuses = self._statuses, {}
        if moves:
            self.mover.enforce(state, moves, pool_changed=False)
        for block in blocks:
            for a in block.holders:
                self._blocked(block, a)
        crs = self.mine()
        for held in state.reservations.values():
            cr = crs.get(held.name)
            if cr is not None and held.uid and cr.uid == held.uid:
                statuses[held.name] = self._status_of(state, held, cr)
        for name, status in statuses.items():
            cr = crs.get(name)
            if cr is None:
                continue
            body = status.to_dict()
            if self._written.get(name) == (cr.uid, body):
                continue
            self._written[name] = (cr.uid, body)
            self.publisher.later(("cpur", name), _writer(self.watches, name, body))

    def _blocked(self, block: _Block, a: Assignment) -> None:
        owner = a.container
        if owner is None:
            return
        pod = self.watches.pod(owner.pod, owner.namespace)
        if pod is None:
            return
        if self.evict_on_reservation:
            log.info("event=evicting pod=%s/%s for=%s", owner.namespace, owner.pod, block.what)
            self.publisher.later(
                ("evict", owner.pod_uid),
                lambda: self._evict(pod, owner.namespace, owner.pod, owner.pod_uid),
            )
            return
        message = (
            f"{block.what} reserves CPUs {block.cpus}; container {owner.container!r} holds "
            f"CPUs {a.cpus} and no other CPUs fit it: the reservation waits until it ends "
            "(corepin agent --evict-on-reservation evicts it instead)"
        )
        self._tell(pod, owner.pod_uid, "CPUReservationBlocked", message)

    def _evict(self, pod: Mapping[str, Any], namespace: str, name: str, uid: str) -> None:
        """On the publisher thread: evict the pod through the Eviction API."""
        try:
            result = evict(self.watches.client, namespace, name, uid=uid)
        except CorepinError as exc:
            self._tell(pod, uid, "CPUEvictionRefused", f"eviction failed: {exc.message}")
            return
        if result.evicted:
            log.info("event=pod_evicted pod=%s/%s", namespace, name)
            return
        log.info("event=eviction_refused pod=%s/%s message=%s", namespace, name, result.message)
        self._tell(pod, uid, "CPUEvictionRefused", result.message)

    def _tell(self, pod: Mapping[str, Any], uid: str, reason: str, message: str) -> None:
        with self._lock:
            if self._told.get((uid, reason)) == message:
                return
            self._told[(uid, reason)] = message
        self.events.event(pod, "Warning", reason, message)

    def forget(self, uids: Iterable[str]) -> None:
        """Pods that are gone."""
        gone = set(uids)
        with self._lock:
            for key in [k for k in self._told if k[0] in gone]:
                self._told.pop(key, None)


def _writer(watches: Watches, name: str, status: dict[str, Any]) -> Callable[[], None]:
    def write() -> None:
        watches.client.patch_status(CPUR, name, {"status": status})

    return write


__all__ = ["RETRY", "Clearing", "NodeReservations", "clear_cpus"]
