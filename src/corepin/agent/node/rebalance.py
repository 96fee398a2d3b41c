"""Rebalancing in the node agent (`corepin agent --rebalance off|report|move`): running exclusive
containers that span more NUMA nodes, L3 caches or partial cores than their size needs, while
a better-aligned set is free, are reported or moved live.

On the agent's worker, after a batch of a resync, a heartbeat, or one that freed CPUs (never on
the QoS thread), `Rebalancer.after_batch`:
1. picks the movable containers (`movables`): exclusive assignments of containers that run now
   (the pod on the node, its container running under the id the state knows, with a cgroup),
   not on a reservation (`Assignment.reservation`), not given their CPUs by a PodCPUBinding or
   the kubelet (a sync would put them back), and not opted out by the annotation
   `corepin.io/rebalance: never` on the pod, or `corepin.io/rebalance.<container>: never` (the
   container's own annotation wins over the pod's, whatever it says);
2. asks the planner (`corepin.allocation.rebalance.plan_moves`) with the node's pools, the CPUs
   promised to pods by PodCPUBindings held aside (no move takes them);
3. `report`: a Normal Event `CPURebalanceAdvised` on the pod per container and advice (told
   once: again only when the advice changes), counted (`Hooks.rebalance_advised`);
   `move`: the moves in the planner's order, each live and in a state transaction of its own
   (`corepin.agent.node.move.Mover`: cgroup rewritten in place, pages migrated, records,
   annotation and assignment file updated, Event `CPUMoved`), timed and counted
   (`Hooks.rebalance_moved`), at most `--rebalance-rate` moves per minute (`RateLimit`, a token
   bucket holding up to a minute's worth; 0: no move ever).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

from corepin.agent.node.hooks import Hooks
from corepin.agent.node.move import Mover
from corepin.agent.node.settings import REBALANCE_MODES
from corepin.allocation.rebalance import Alignment, Movable, Move, plan_moves
from corepin.allocation.types import Policy
from corepin.core.cpuset import CPUSet
from corepin.core.errors import CorepinError, InputError
from corepin.kube.events import EventRecorder
from corepin.kube.models import ObjectView, PodView
from corepin.kube.models.fields import loose_list
from corepin.state.kubelet import KUBELET_POLICY
from corepin.state.model import HostState
from corepin.topology.model import Topology

log = logging.getLogger("corepin.agent.node")

DEFAULT_MODE: Final = "report"
#: `--rebalance-rate`: moves per minute at most
DEFAULT_RATE: Final = 6
#: the opt-out annotation (on the pod, or with `.<container>` for one container)
ANN_REBALANCE: Final = "corepin.io/rebalance"
NEVER: Final = "never"
ADVISED: Final = "CPURebalanceAdvised"
#: assignment policies whose CPUs were given, not chosen: never moved
_GIVEN: Final = frozenset({KUBELET_POLICY, "binding"})

#: (namespace, pod name) -> the pod on the node now, or None
PodGetter = Callable[[str, str], Mapping[str, Any] | None]


def check_mode(mode: str, rate: int) -> None:
    """InputError naming a `--rebalance` mode or `--rebalance-rate` that is not one."""
    if mode not in REBALANCE_MODES:
        raise InputError(
            f"unknown --rebalance mode {mode!r} (choose from {', '.join(REBALANCE_MODES)})",
            reason="bad_rebalance",
        )
    if isinstance(rate, bool) or not isinstance(rate, int) or rate < 0:
        raise InputError(
            f"--rebalance-rate must be 0 or a positive number of moves per minute, got {rate!r}",
            reason="bad_rebalance_rate",
        )


def opted_out(pod: Mapping[str, Any], container: str) -> bool:
    """Whether the container may never be moved: its own annotation
    `corepin.io/rebalance.<container>` says `never`, or it has none and the pod's says so."""
    annotations = ObjectView(pod).annotations
    value = annotations.get(f"{ANN_REBALANCE}.{container}", annotations.get(ANN_REBALANCE))
    return value is not None and value.strip().lower() == NEVER


def running_containers(pod: Mapping[str, Any]) -> dict[str, str]:
    """App container name -> the id of its container running now (without the runtime)."""
    out: dict[str, str] = {}
    for row in loose_list(PodView(pod).status.get("containerStatuses")):
        if not isinstance(row, Mapping):
            continue
        state = row.get("state")
        name, cid = row.get("name"), row.get("containerID")
        if (
            isinstance(state, Mapping)
            and isinstance(state.get("running"), Mapping)
            and isinstance(name, str)
            and isinstance(cid, str)
            and "://" in cid
        ):
            out[name] = cid.split("://", 1)[1]
    return out


def movables(state: HostState, pod_of: PodGetter) -> list[Movable]:
    """The exclusive containers the planner may move (see the module docstring, step 1)."""
    out: list[Movable] = []
    for a in state:
        owner = a.container
        if (
            owner is None
            or a.kind != "exclusive"
            or not a.cpus
            or a.reservation is not None
            or a.policy in _GIVEN
            or a.cgroup is None
        ):
            continue
        pod = pod_of(owner.namespace, owner.pod)
        if pod is None:
            continue
        view = ObjectView(pod)
        if view.uid != owner.pod_uid or view.deleting:
            continue
        if running_containers(pod).get(owner.container) != owner.container_id:
            continue
        if opted_out(pod, owner.container):
            continue
        out.append(Movable(a.id, a.cpus, a.withheld | a.cpus, a.level, a.kind))
    return out


class RateLimit:
    """A token bucket of `per_minute` moves a minute: full at first, refilled continuously
    (`per_minute` / 60 a second) up to `per_minute`. 0 allows nothing."""

    def __init__(self, per_minute: int, clock: Callable[[], float]) -> None:
        self.per_minute = per_minute
        self.clock = clock
        self._tokens = float(per_minute)
        self._at = clock()

    def _refill(self) -> None:
        now = self.clock()
        if now > self._at:
            self._tokens = min(
                float(self.per_minute), self._tokens + (now - self._at) * self.per_minute / 60.0
            )
        self._at = now  # (a clock that went back starts over from here)

    def available(self) -> int:
        """Moves allowed now."""
        self._refill()
        return int(self._tokens + 1e-9)

    def take(self) -> None:
        """One move made."""
        self._refill()
        self._tokens = max(0.0, self._tokens - 1.0)


def _spans(a: Alignment) -> str:
    def plural(n: int, word: str) -> str:
        return f"{n} {word}" if n == 1 else f"{n} {word}s"

    text = f"{plural(a.numa, 'NUMA node')} and {plural(a.l3, 'L3 cache')}"
    if a.partial_cores:
        text += f" with {plural(a.partial_cores, 'partial core')}"
    return text


def advice(move: Move, container: str) -> str:
    """The message of a `CPURebalanceAdvised` Event."""
    return (
        f"container {container!r}: CPUs {move.old} span {_spans(move.before)}; CPUs "
        f"{move.new} (free, or its own) would span {_spans(move.after)}. Not moved: the node "
        "agent runs "
        "with --rebalance report (move would re-pin it live; the annotation "
        f"{ANN_REBALANCE}: {NEVER} keeps it where it is)"
    )


class Rebalancer:
    """The agent's rebalancing (see the module docstring)."""

    def __init__(
        self,
        mode: str,
        rate: int,
        topology: Topology,
        policy: Policy,
        clock: Callable[[], float],
        *,
        state: Callable[[], HostState | None],
        pod_of: PodGetter,
        promised: Callable[[HostState], CPUSet],
        events: EventRecorder,
        hooks: Hooks,
        mover: Mover,
    ) -> None:
        check_mode(mode, rate)
        self.mode = mode
        self.machine = topology
        self.policy = policy
        self.limit = RateLimit(rate, clock)
        self.state = state
        self.pod_of = pod_of
        self.promised = promised
        self.events = events
        self.hooks = hooks
        self.mover = mover
        self._told: dict[str, tuple[CPUSet, CPUSet]] = {}  # assignment id -> advised (old, new)

    def after_batch(self, kinds: Iterable[str], before: HostState, after: HostState) -> None:
        """A batch done: look for moves after a resync, a heartbeat, or CPUs freed."""
        if self.mode == "off":
            return
        if not (set(kinds) & {"resync", "heartbeat"} or len(after.free) > len(before.free)):
            return
        try:
            self.run()
        except CorepinError as exc:
            log.warning("event=rebalance_failed error=%s", exc)
        except Exception:  # a bug: the agent goes on, the log says what happened
            log.exception("event=rebalance_crashed")

    def plan(self) -> tuple[Move, ...]:
        """The moves the planner proposes now (at most what the rate allows in `move` mode)."""
        state = self.state()
        if state is None or self.mode == "off":
            return ()
        limit: int | None = None
        if self.mode == "move":
            limit = self.limit.available()
            if limit == 0:
                return ()
        items = movables(state, self.pod_of)
        self._forget(state)
        if not items:
            return ()
        pools = state.pools
        promised = self.promised(state) & pools.free
        if promised:
            pools = pools.hold("share", promised)  # (held aside: no move takes them)
        return plan_moves(self.machine, pools, items, self.policy, limit=limit)

    def run(self) -> None:
        """Plan, then advise (`report`) or move (`move`)."""
        moves = self.plan()
        for move in moves:
            if self.mode == "report":
                self._advise(move)
                continue
            state = self.state()
            current = state.get(move.id) if state is not None else None
            if current is None or current.cpus != move.old:
                return  # the state moved on since the plan: the next pass plans again
            started = time.perf_counter()
            try:
                self.mover.move_container(move.id, move.new, move.new_withheld, _why(move))
            except CorepinError as exc:  # the state refused it: the next pass plans again
                log.warning("event=rebalance_move_refused id=%s error=%s", move.id, exc)
                return
            seconds = time.perf_counter() - started
            self.limit.take()
            self.hooks.rebalance_moved(seconds)
            log.info(
                "event=rebalanced id=%s old=%s new=%s seconds=%.4f",
                move.id,
                move.old,
                move.new,
                seconds,
            )

    def _advise(self, move: Move) -> None:
        if self._told.get(move.id) == (move.old, move.new):
            return
        state = self.state()
        a = state.get(move.id) if state is not None else None
        owner = a.container if a is not None else None
        pod = self.pod_of(owner.namespace, owner.pod) if owner is not None else None
        if owner is None or pod is None:
            return
        self._told[move.id] = (move.old, move.new)
        log.info("event=rebalance_advised id=%s old=%s new=%s", move.id, move.old, move.new)
        self.events.event(pod, "Normal", ADVISED, advice(move, owner.container))
        self.hooks.rebalance_advised()

    def _forget(self, state: HostState) -> None:
        """Advice about containers that are gone or changed CPUs is forgotten."""
        for ident, (old, _) in list(self._told.items()):
            a = state.get(ident)
            if a is None or a.cpus != old:
                self._told.pop(ident, None)


def _why(move: Move) -> str:
    return f"rebalanced: it spanned {_spans(move.before)}, now {_spans(move.after)}"


__all__ = [
    "ADVISED",
    "ANN_REBALANCE",
    "DEFAULT_MODE",
    "DEFAULT_RATE",
    "NEVER",
    "REBALANCE_MODES",
    "RateLimit",
    "Rebalancer",
    "advice",
    "check_mode",
    "movables",
    "opted_out",
    "running_containers",
]
