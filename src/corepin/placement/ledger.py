"""In-flight accounting: placements counted until the node's agent publishes them (pure).

Between a placement and the next `NodeCPUTopology` that shows it, the node's published free
set still offers the CPUs the pod is about to take; counted on their own, a burst of pods
would all be sent to the same free CPUs. So every placement is *assumed*: its containers' CPUs
(and withheld units) are held on top of the published pools (`effective_pools`) until

- the node's `status.allocations` show the container (the agent pinned it: the published
  free set now counts it, the assumption of that container is dropped),
- the pod is deleted, finishes, or is bound to another node (`forget`),
- or it expires: `ttl` seconds after it was assumed while the API does not show the pod bound
  (a bind that never happened), or `ttl` seconds after every holding container was seen
  running while the node still does not show it (the agent could not pin it there and runs
  it on the shared pool). A pod that is bound but whose containers have not started yet is
  waited for: the agent cannot pin a container before it runs.

Pods bound by someone else (kube-scheduler with the extender without `bindVerb`, or before a
restart) are assumed when they are first seen bound and unconfirmed, with the CPUs the node's
policy would choose for them.

When the agent has meanwhile handed an assumed container's CPUs to another container (it
decided on its own and chose differently), the container is placed again on what is left; if
nothing is left the node counts as full until the agent publishes again, so a node is never
offered CPUs it may not have.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from corepin.allocation.pools import NodePools
from corepin.core.errors import CorepinError
from corepin.placement.fit import Placed, fit
from corepin.placement.node import NodeView
from corepin.placement.request import PodRequest


@dataclass
class Assumption:
    """One pod placed on `node` and not yet confirmed by it."""

    request: PodRequest
    node: str
    placed: tuple[Placed, ...]
    since: float  # when assumed, or when its containers were all seen running
    bound: bool = False  # the API shows the pod bound to `node`
    running: bool = False  # every holding container runs (the pod's status says so)

    @property
    def uid(self) -> str:
        return self.request.uid


@dataclass
class Effective:
    """A node's pools with its assumptions held."""

    pools: NodePools
    full: bool = False  # an assumption no longer fits: nothing more goes there until it settles
    memory_bound: dict[int, int] = field(default_factory=dict)  # assumed CPUs per socket


class Ledger:
    """Assumptions by pod uid and by node (not thread-safe: `Cluster` holds the lock)."""

    def __init__(self, ttl: float = 60.0, on_change: Callable[[str], None] | None = None) -> None:
        self.ttl = ttl
        self._on_change = on_change
        self._by_uid: dict[str, Assumption] = {}
        self._by_node: dict[str, dict[str, Assumption]] = {}
        #: per node, a number that changes whenever its assumptions change (cache keys)
        self.generation: dict[str, int] = {}
        self._counter = 0

    def __len__(self) -> int:
        return len(self._by_uid)

    def __contains__(self, uid: object) -> bool:
        return uid in self._by_uid

    def get(self, uid: str) -> Assumption | None:
        return self._by_uid.get(uid)

    def _touch(self, node: str) -> None:
        self._counter += 1
        self.generation[node] = self._counter
        if self._on_change is not None:
            self._on_change(node)

    def assume(self, assumption: Assumption) -> None:
        """Count `assumption` (replacing an earlier one of the same pod)."""
        self.forget(assumption.uid)
        self._by_uid[assumption.uid] = assumption
        self._by_node.setdefault(assumption.node, {})[assumption.uid] = assumption
        self._touch(assumption.node)

    def forget(self, uid: str) -> Assumption | None:
        """Stop counting the pod; what was counted (None when nothing)."""
        gone = self._by_uid.pop(uid, None)
        if gone is not None:
            on_node = self._by_node.get(gone.node, {})
            on_node.pop(uid, None)
            if not on_node:
                self._by_node.pop(gone.node, None)
            self._touch(gone.node)
        return gone

    def on_node(self, node: str) -> list[Assumption]:
        """The node's assumptions, oldest first."""
        return sorted(self._by_node.get(node, {}).values(), key=lambda a: (a.since, a.uid))

    def nodes(self) -> list[str]:
        return sorted(self._by_node)

    def observe(self, uid: str, *, bound: bool, running: bool, now: float) -> None:
        """What the API shows of an assumed pod: bound to its node, its containers running."""
        a = self._by_uid.get(uid)
        if a is None:
            return
        if running and not a.running:
            a.since = now  # the agent pins once the containers run: the clock starts again
        a.bound = a.bound or bound
        a.running = running

    def settle(self, node: str, confirmed: frozenset[tuple[str, str]]) -> list[str]:
        """Drop the node's assumptions whose every container the node now shows."""
        done = [
            a.uid
            for a in self._by_node.get(node, {}).values()
            if all((a.uid, p.container) in confirmed for p in a.placed)
        ]
        for uid in done:
            self.forget(uid)
        return done

    def expire(self, now: float) -> list[Assumption]:
        """Drop the assumptions whose time is up (see the module docstring)."""
        gone = [
            a
            for a in self._by_uid.values()
            if (not a.bound or a.running) and now - a.since > self.ttl
        ]
        for a in gone:
            self.forget(a.uid)
        return gone


def effective_pools(view: NodeView, assumptions: Iterable[Assumption]) -> Effective:
    """The node's published pools with the unconfirmed containers of `assumptions` held."""
    pools = view.pools
    full = False
    memory_bound: dict[int, int] = {}
    for a in assumptions:
        for p in a.placed:
            if (a.uid, p.container) in view.confirmed:
                continue
            placed: Placed | None = p
            try:
                pools = pools.hold(p.kind, p.withheld)
            except CorepinError:
                placed = None
                ask = next((c for c in a.request.containers if c.name == p.container), None)
                if ask is not None and ask.cpus is None:
                    again = fit(
                        view, PodRequest(a.request.namespace, a.request.name, a.uid, (ask,)), pools
                    )
                    if again.ok and again.pools is not None:
                        pools, placed = again.pools, again.placed[0]
                    else:
                        full = True
                # explicit CPUs now held by another: the agent refuses them (the container
                # runs on the shared pool), so nothing is held for it
            if placed is not None and placed.workload == "memory-bound":
                for socket in view.topology.sockets_in(placed.cpus):
                    count = len(placed.cpus & view.topology.cpus_in_sockets(socket))
                    memory_bound[socket] = memory_bound.get(socket, 0) + count
    if full:
        pools = NodePools(
            pools.online,
            pools.isolated,
            pools.reserved,
            pools.infra,
            pools.strict,
            pools.exclusive,
            pools.share | pools.free_bits,
        )
    return Effective(pools, full, memory_bound)


__all__ = ["Assumption", "Effective", "Ledger", "effective_pools"]
