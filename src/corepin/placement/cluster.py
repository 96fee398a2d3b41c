"""The cluster as placement sees it: node views, in-flight placements, cached answers.

`Cluster` is what the scheduler and the extender ask; informers feed it (`set_node`,
`remove_node`, `observe_pod`, `forget_pod`). Thread-safe: one lock around everything, held
for microseconds per node.

`evaluate(request, names, now)` answers for every named node, in the order given:

- a pod that asks for no CPUs of its own passes every node (nothing for an agent to pin or to
  refuse; corepin has no say in where it runs), scored by its workload family;
- a node without a `NodeCPUTopology` fails as *unresolvable* (no agent: preempting pods would
  not help);
- an unusable, not `Ready` or stale view fails (it may come back);
- otherwise `fit` on the node's effective pools (published pools with the in-flight
  placements held, `ledger.effective_pools`), and `score` of the nodes that pass.

CPUReservations (`set_reservation`, `reservations`): a node's effective pools also hold its
Pending reservations (`reservations.hold_reservations`); a pod that matches a reservation is
answered apart (not cached): on the reservation's node its CPUs count as free for it and it
scores the highest (100, extender 10), elsewhere it is answered as any pod.

Answers are cached per node and pod signature until the node publishes again or its
in-flight placements (or reservations) change, so a burst of alike pods against a thousand
nodes costs one decision per node that changed, not one per node per pod.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final, NamedTuple

from corepin.allocation.levels import withheld_for
from corepin.allocation.pools import NodePools
from corepin.core.cpuset import EMPTY, CPUSet
from corepin.kube.models import PodView
from corepin.kube.models.fields import loose_object
from corepin.placement.fit import (
    NO_TOPOLOGY,
    UNUSABLE,
    Fit,
    Placed,
    fit,
    no_topology,
    node_problem,
)
from corepin.placement.ledger import Assumption, Effective, Ledger, effective_pools
from corepin.placement.node import NodeView
from corepin.placement.request import DeviceKey, PodRequest, Signature
from corepin.placement.reservations import (
    ReservationView,
    hold_reservations,
    matched_by_node,
    not_on,
    pinned_to,
    release,
)
from corepin.placement.score import MAXIMUM_UTILIZATION, check_profile, extender_score, score

#: how often, at most, `evaluate` looks for expired assumptions (seconds)
EXPIRE_EVERY: Final = 0.5
#: pod signatures whose answers are kept (least recently asked dropped first); with 1,000 nodes
#: that is at most 32,000 answers of a kilobyte or so
INDEXED: Final = 32
#: decisions kept per node (of different pod signatures) before they are dropped
FITS_PER_NODE: Final = 64
#: the score of a pod on the node of a reservation it matches
RESERVED_SCORE: Final = 100


class Answer(NamedTuple):
    """One node's answer: passes (`ok`, `score` 0-100) or not (`code`, `reason`)."""

    node: str
    ok: bool
    score: int
    reason: str
    code: str
    fit: Fit | None
    extender: int = 0  # the score on the extender API's 0-10 scale

    @property
    def unresolvable(self) -> bool:
        return self.code == NO_TOPOLOGY


class _Entry:
    """Per node: its view and the answers worked out from it."""

    __slots__ = (
        "answers",
        "beat",
        "effective",
        "fits",
        "generation",
        "reserved",
        "static",
        "view",
    )

    def __init__(self, view: NodeView) -> None:
        self.view = view
        self.generation: tuple[int, int] = (-1, -1)
        self.reserved: dict[str, CPUSet] = {}  # reservation -> the CPUs it holds here
        self.beat = view.heartbeat if view.heartbeat is not None else float("-inf")
        self.effective: Effective = Effective(view.pools)
        self.fits: dict[Signature, Fit] = {}
        self.answers: dict[ScoreKey, Answer] = {}
        self.static: Answer | None = None  # unusable or not ready: the same answer every time
        if view.problem or not view.ready:
            problem = node_problem(view, 0.0, float("inf"))
            assert problem is not None
            self.static = Answer(view.name, False, 0, problem.reason, problem.code, problem)


#: What a cached answer is for: the pod's signature, its workload family, the score profile,
#: its devices.
ScoreKey = tuple[Signature, str | None, str, DeviceKey]


def _running(pod: PodView, names: Iterable[str]) -> bool:
    up = {
        name
        for name, row in pod.container_statuses.items()
        if isinstance(loose_object(row.get("state")).get("running"), Mapping)
    }
    return all(n in up for n in names)


class Cluster:
    """Views, ledger and caches (see the module docstring)."""

    def __init__(
        self,
        *,
        profile: str = MAXIMUM_UTILIZATION,
        stale_after: float = 60.0,
        assume_ttl: float = 60.0,
    ) -> None:
        self.profile = check_profile(profile)
        self.stale_after = stale_after
        self._lock = threading.RLock()
        self.ledger = Ledger(assume_ttl, on_change=self._invalidate)
        self._entries: dict[str, _Entry] = {}
        #: (pod signature, workload, profile) -> node -> answer, for the nodes whose answer is
        #: known and still true (dropped per node when it publishes or its placements change)
        self._index: OrderedDict[ScoreKey, dict[str, Answer]] = OrderedDict()
        self._oldest = float("inf")  # no later than the oldest heartbeat of any usable node
        self._unreadable: dict[str, Fit] = {}  # nodes whose NodeCPUTopology cannot be read
        self._next_expiry = 0.0
        self._reservations: dict[str, ReservationView] = {}
        self._reservation_generation: dict[str, int] = {}  # per node
        self._reservation_counter = 0

    # ------------------------------------------------------------------ reservations
    def _reservations_changed(self, node: str | None) -> None:
        if node:
            self._reservation_counter += 1
            self._reservation_generation[node] = self._reservation_counter
            self._invalidate(node)

    def set_reservation(self, reservation: ReservationView) -> None:
        """An active CPUReservation (new or changed)."""
        with self._lock:
            old = self._reservations.get(reservation.name)
            self._reservations[reservation.name] = reservation
            if old is not None and old.node != reservation.node:
                self._reservations_changed(old.node)
            self._reservations_changed(reservation.node)

    def remove_reservation(self, name: str) -> None:
        """A CPUReservation that is gone or done."""
        with self._lock:
            old = self._reservations.pop(name, None)
            if old is not None:
                self._reservations_changed(old.node)

    def reservations(self) -> list[ReservationView]:
        with self._lock:
            return sorted(self._reservations.values(), key=lambda r: r.name)

    def reserved_on(self, node: str) -> dict[str, CPUSet]:
        """The CPUs each reservation on `node` holds there (as placement counts them)."""
        with self._lock:
            entry = self._entries.get(node)
            if entry is None:
                return {}
            self._refresh(node, entry)
            return dict(entry.reserved)

    def _matched(self, request: PodRequest) -> dict[str, list[str]]:
        return matched_by_node(self._reservations.values(), request)

    def _pools_for(self, name: str, entry: _Entry, matched: list[str]) -> NodePools:
        """The node's effective pools with the reservations the pod matches free for it."""
        self._refresh(name, entry)
        return release(entry.effective.pools, (entry.reserved.get(r, EMPTY) for r in matched))

    def _fit_matched(self, name: str, entry: _Entry, request: PodRequest, mine: list[str]) -> Fit:
        """The pod's fit where it matches reservations: on exactly their CPUs when it asks
        for that many, else anywhere free for it."""
        pools = self._pools_for(name, entry, mine)
        pinned = pinned_to(request, EMPTY.union(*(entry.reserved.get(r, EMPTY) for r in mine)))
        result = fit(entry.view, pinned, pools) if pinned is not None else None
        return result if result is not None and result.ok else fit(entry.view, request, pools)

    def _own_placed(self, node: str, matched: list[str], result: Fit) -> tuple[Placed, ...]:
        """`result` less what runs on the matched reservations' CPUs (counted already)."""
        entry = self._entries.get(node)
        if entry is None:
            return result.placed
        return not_on(result.placed, EMPTY.union(*(entry.reserved.get(r, EMPTY) for r in matched)))

    # ------------------------------------------------------------------ feeding
    def _invalidate(self, name: str) -> None:
        for answers in self._index.values():
            answers.pop(name, None)

    def set_node(self, view: NodeView) -> None:
        """A node published (again): new view, its confirmed assumptions dropped."""
        with self._lock:
            self._unreadable.pop(view.name, None)
            entry = self._entries[view.name] = _Entry(view)
            if entry.static is None:
                self._oldest = min(self._oldest, entry.beat)  # (never later than the truth)
            self._invalidate(view.name)
            self.ledger.settle(view.name, view.confirmed)

    def set_unreadable(self, name: str, problem: str) -> None:
        """The node's NodeCPUTopology cannot be read (`problem` says why): it takes no pod
        that asks for CPUs until it publishes a readable one."""
        with self._lock:
            self._entries.pop(name, None)
            self._invalidate(name)
            self._unreadable[name] = Fit(
                name,
                False,
                f"node {name}: its NodeCPUTopology cannot be read ({problem}); check the "
                "corepin agent on that node",
                UNUSABLE,
            )

    def remove_node(self, name: str) -> None:
        with self._lock:
            self._entries.pop(name, None)
            self._unreadable.pop(name, None)
            self._invalidate(name)

    def view(self, name: str) -> NodeView | None:
        with self._lock:
            entry = self._entries.get(name)
            return entry.view if entry is not None else None

    def names(self) -> list[str]:
        """Every node with a NodeCPUTopology."""
        with self._lock:
            return sorted(self._entries)

    def observe_pod(
        self,
        pod: Mapping[str, Any],
        request_of: Callable[[Mapping[str, Any]], PodRequest],
        now: float,
    ) -> None:
        """What the API shows of a pod: bound pods the nodes do not show yet are counted (once),
        deleted, finished or moved ones are not."""
        view = PodView(pod)
        uid = view.uid
        if not uid:
            return
        if view.deleting or view.phase in ("Succeeded", "Failed"):
            self.forget_pod(uid)
            return
        node = view.node_name
        if not node:
            return
        with self._lock:
            known = self.ledger.get(uid)
            if known is not None and known.node != node:
                self.ledger.forget(uid)
                known = None
            if known is not None:
                names = [p.container for p in known.placed]
                self.ledger.observe(uid, bound=True, running=_running(view, names), now=now)
                return
            entry = self._entries.get(node)
            if entry is None or entry.view.policy is None:
                return
            request = request_of(pod)
            holding = [c.name for c in request.containers if c.holds]
            if not holding or all((uid, c) in entry.view.confirmed for c in holding):
                return
            matched = self._matched(request).get(node, [])
            result = self._fit_matched(node, entry, request, matched)
            if not result.ok:
                return  # the agent cannot pin it either: it runs on the shared pool
            unconfirmed = tuple(
                p
                for p in self._own_placed(node, matched, result)
                if (uid, p.container) not in entry.view.confirmed
            )
            self.ledger.assume(
                Assumption(
                    request,
                    node,
                    unconfirmed,
                    now,
                    bound=True,
                    running=_running(view, holding),
                )
            )

    def forget_pod(self, uid: str) -> None:
        with self._lock:
            self.ledger.forget(uid)

    # ------------------------------------------------------------------ placing
    def assume(self, request: PodRequest, node: str, result: Fit, now: float) -> None:
        """Count a placement of ours (before its bind) until the node shows it."""
        with self._lock:
            placed = self._own_placed(node, self._matched(request).get(node, []), result)
            if placed:
                self.ledger.assume(Assumption(request, node, placed, now))

    def expire(self, now: float) -> list[Assumption]:
        with self._lock:
            self._next_expiry = now + EXPIRE_EVERY
            return self.ledger.expire(now)

    # ------------------------------------------------------------------ asking
    def _generation(self, name: str) -> tuple[int, int]:
        return (self.ledger.generation.get(name, 0), self._reservation_generation.get(name, 0))

    def _refresh(self, name: str, entry: _Entry) -> None:
        generation = self._generation(name)
        if entry.generation != generation:
            entry.generation = generation
            effective = effective_pools(entry.view, self.ledger.on_node(name))
            here = [r for r in self._reservations.values() if r.node == name]
            if here and entry.view.policy is not None:
                pools, entry.reserved = hold_reservations(entry.view, effective.pools, here)
                effective = Effective(pools, effective.full, effective.memory_bound)
            else:
                entry.reserved = {}
            entry.effective = effective
            entry.fits.clear()
            entry.answers.clear()

    def evaluate(
        self,
        request: PodRequest,
        names: Iterable[str],
        now: float,
        *,
        profile: str | None = None,
    ) -> list[Answer]:
        """One answer per node of `names`, in their order (see the module docstring)."""
        chosen = self.profile if profile is None else profile
        signature = request.signature
        score_key = (signature, request.workload, chosen, request.device_key)
        holds = request.holds
        stale_before = now - self.stale_after
        out: list[Answer] = []
        append = out.append
        with self._lock:
            if now >= self._next_expiry:
                self.expire(now)
            matched = self._matched(request) if self._reservations else {}
            if matched:
                return self._evaluate_matched(request, names, now, chosen, matched)
            if holds and self._oldest < stale_before:  # maybe a node is stale: look again
                self._oldest = min(
                    (e.beat for e in self._entries.values() if e.static is None),
                    default=float("inf"),
                )
            index = self._index.get(score_key)
            if index is None:
                index = self._index[score_key] = {}
                if len(self._index) > INDEXED:
                    self._index.popitem(last=False)
            else:
                self._index.move_to_end(score_key)
            if not holds or self._oldest >= stale_before:
                # no node is stale: known answers hold as they are
                get = index.get
                for name in names:
                    answer = get(name)
                    if answer is None:
                        answer = self._lookup(name, request, signature, chosen, holds)
                        index[name] = answer
                    append(answer)
            else:
                for name in names:
                    entry = self._entries.get(name)
                    if entry is not None and entry.static is None and entry.beat < stale_before:
                        problem = node_problem(
                            entry.view, now, self.stale_after, heartbeat=entry.beat
                        )
                        assert problem is not None
                        append(Answer(name, False, 0, problem.reason, problem.code, problem))
                        continue
                    answer = index.get(name)
                    if answer is None:
                        answer = self._lookup(name, request, signature, chosen, holds)
                        index[name] = answer
                    append(answer)
        return out

    def _lookup(
        self, name: str, request: PodRequest, signature: Signature, profile: str, holds: bool
    ) -> Answer:
        """The answer of one node, worked out (the caller keeps it in the index)."""
        entry = self._entries.get(name)
        if entry is None:
            if holds:
                gone = self._unreadable.get(name) or no_topology(name)
                return Answer(name, False, 0, gone.reason, gone.code, gone)
            return Answer(name, True, 0, "", "", None)
        if holds and entry.static is not None:
            return entry.static
        if entry.generation != self._generation(name):
            self._refresh(name, entry)
        return self._answer(entry, request, signature, profile)

    def _answer(
        self, entry: _Entry, request: PodRequest, signature: Signature, profile: str
    ) -> Answer:
        name = entry.view.name
        result = entry.fits.get(signature)
        if result is None:
            result = fit(entry.view, request, entry.effective.pools)
            if len(entry.fits) >= FITS_PER_NODE:
                entry.fits.clear()
            entry.fits[signature] = result
        if not result.ok:
            return Answer(name, False, 0, result.reason, result.code, result)
        value = score(
            entry.view,
            request,
            result,
            profile,
            before=entry.effective.pools,
            assumed_memory_bound=entry.effective.memory_bound,
        )
        return Answer(name, True, value, "", "", result, extender_score(value))

    def _evaluate_matched(
        self,
        request: PodRequest,
        names: Iterable[str],
        now: float,
        profile: str,
        matched: dict[str, list[str]],
    ) -> list[Answer]:
        """The answers for a pod that matches reservations: on their nodes it fits on the
        reservations' CPUs (freed for it) and scores the highest; elsewhere as any pod."""
        out: list[Answer] = []
        for name in names:
            mine = matched.get(name)
            entry = self._entries.get(name)
            if mine is None or entry is None:
                out.append(self._lookup(name, request, request.signature, profile, True))
                continue
            if entry.static is not None:
                out.append(entry.static)
                continue
            problem = node_problem(entry.view, now, self.stale_after, heartbeat=entry.beat)
            if problem is not None:
                out.append(Answer(name, False, 0, problem.reason, problem.code, problem))
                continue
            result = self._fit_matched(name, entry, request, mine)
            if not result.ok:
                out.append(Answer(name, False, 0, result.reason, result.code, result))
                continue
            extender = extender_score(RESERVED_SCORE)
            out.append(Answer(name, True, RESERVED_SCORE, "", "", result, extender))
        return out

    def beat(self, name: str, heartbeat: float) -> bool:
        """The node's agent reported again with nothing else changed: its heartbeat moves on,
        its cached answers stay (False when the node is unknown)."""
        with self._lock:
            entry = self._entries.get(name)
            if entry is None:
                return False
            entry.beat = heartbeat
            return True

    def fits_without(
        self, request: PodRequest, name: str, victims: Iterable[str], now: float
    ) -> Answer:
        """Whether the pod would fit the node once the pods with uids `victims` are gone
        (their published and in-flight CPUs released): the extender's preemption check."""
        gone = set(victims)
        with self._lock:
            entry = self._entries.get(name)
            if entry is None or not request.holds:
                return self.evaluate(request, [name], now)[0]
            if entry.static is not None:
                return entry.static
            problem = node_problem(entry.view, now, self.stale_after, heartbeat=entry.beat)
            if problem is not None:
                return Answer(name, False, 0, problem.reason, problem.code, problem)
            self._refresh(name, entry)
            pools = entry.effective.pools
            view = entry.view
            for row in view.allocations:
                if row.pod_uid in gone:
                    pools = pools.release(
                        row.policy, withheld_for(view.topology, row.level, row.cpus)
                    )
            for a in self.ledger.on_node(name):
                if a.uid in gone:
                    for p in a.placed:
                        pools = pools.release(p.kind, p.withheld)
            result = fit(view, request, pools)
            if not result.ok:
                return Answer(name, False, 0, result.reason, result.code, result)
            value = score(view, request, result, self.profile, before=pools)
            return Answer(name, True, value, "", "", result, extender_score(value))

    def best(self, answers: Iterable[Answer]) -> Answer | None:
        """The passing answer with the highest score (ties: the lowest node name)."""
        top: Answer | None = None
        for a in answers:
            if a.ok and (top is None or (a.score, top.node) > (top.score, a.node)):
                top = a
        return top


__all__ = ["Answer", "Cluster"]
