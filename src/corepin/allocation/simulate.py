"""Trace replay: run the same add/remove events through allocation policies and score them.

Pure: no files, no clock. The CLI and the benchmarks read the trace, time `replay` themselves
and put the seconds into the result (`PolicyResult.with_seconds`).

Trace format::

    {"events": [{"op": "add", "id": "ns/pod/ctr", "cpus": 4, "level": "core",
                 "workload": "cpu-bound", "shared": false, "near": "16-31",
                 "nearStrict": false},
                {"op": "remove", "id": "ns/pod/ctr"}]}

Replay keeps the live exclusive assignments of each policy in the node's one pool model
(`corepin.allocation.pools.NodePools`, the same the host state and the node agent use). An
exclusive add asks the policy for `cpus` CPUs out of the free set (online CPUs minus everything
the live decisions withhold, `Decision.withheld`, which includes the units withheld by an
exclusiveness level) through the same `decide.decide` host mode and the node agent use; a
policy error (AllocationError, or a RequestError for a request the policy does not take)
rejects the add and its `.reason` is counted. As in host mode, an exclusive add that would
leave no CPU in the shared pool while shared workloads are live is rejected
(`shared_pool_exhausted`). A shared add is admitted when the shared pool is not empty; it takes
no CPUs. A best-effort add (`"workload": "best-effort"`) is a shared one too: it withholds
nothing and is placed in the shared pool (by a workload-aware policy on its least used CPUs).
A remove frees what its add withheld; a remove of an id that was never admitted is ignored.
An exclusive add may name CPUs it should be near (`near`: a device's local CPUs, as
`corepin run --near` resolves them) and whether only those will do (`nearStrict`).

Quality of an admitted exclusive allocation of n CPUs:
- NUMA-aligned: it spans the fewest NUMA nodes that n CPUs could span on an empty machine;
- LLC-aligned: likewise for L3 cache instances;
- full-core: it holds no partial physical core, except at most one when n is not a multiple
  of the SMT width (for SMT-2 machines: when n is odd). Always true without SMT.
The three ratios are over admitted exclusive allocations (None when there were none).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final

from corepin.allocation.alignment import AlignmentMetrics as AlignmentMetrics
from corepin.allocation.decide import decide
from corepin.allocation.pools import NodePools
from corepin.allocation.types import LEVELS, WORKLOADS, Policy, Request
from corepin.core.cpuset import CPUSet
from corepin.core.errors import AllocationError, CorepinError, InputError, RequestError
from corepin.topology.model import Topology

#: The event operations a trace may hold.
OPS: Final = ("add", "remove")
_ADD_FIELDS: Final = frozenset(
    {"op", "id", "cpus", "level", "workload", "shared", "near", "nearStrict"}
)
_REMOVE_FIELDS: Final = frozenset({"op", "id"})


class TraceError(InputError):
    """A trace that is not well formed; names the event index and the bad field (exit 2)."""

    default_reason = "bad_trace"

    def __init__(self, index: int | None, field_name: str | None, problem: str) -> None:
        self.index = index
        self.field = field_name
        self.problem = problem
        where = "trace" if index is None else f"trace event {index}"
        if field_name is not None:
            where += f" field {field_name!r}"
        super().__init__(f"{where}: {problem}")


class SimulationError(CorepinError):
    """A policy broke its contract during replay (a bug in the policy: exit 1)."""

    default_reason = "policy_contract_violation"


# ---------------------------------------------------------------------------------- the trace
@dataclass(frozen=True, slots=True)
class TraceEvent:
    """One trace event. `cpus`, `level`, `workload` and `shared` only mean something for adds."""

    op: str
    id: str
    cpus: int = 0
    level: str = "cpu"
    workload: str | None = None
    shared: bool = False
    #: CPUs the add should be near (a device's local CPUs), and whether only those will do
    near: CPUSet | None = None
    near_strict: bool = False

    def to_json(self) -> dict[str, Any]:
        if self.op == "remove":
            return {"op": "remove", "id": self.id}
        out: dict[str, Any] = {"op": "add", "id": self.id, "cpus": self.cpus}
        if self.level != "cpu":
            out["level"] = self.level
        if self.workload is not None:
            out["workload"] = self.workload
        if self.shared:
            out["shared"] = True
        if self.near is not None:
            out["near"] = str(self.near)
        if self.near_strict:
            out["nearStrict"] = True
        return out


@dataclass(frozen=True, slots=True)
class Trace:
    events: tuple[TraceEvent, ...]

    @property
    def adds(self) -> int:
        return sum(1 for e in self.events if e.op == "add")

    def to_json(self) -> dict[str, Any]:
        return {"events": [e.to_json() for e in self.events]}


def _parse_event(index: int, raw: object) -> TraceEvent:
    if not isinstance(raw, Mapping):
        raise TraceError(index, None, f"an event must be an object, got {raw!r}")
    op = raw.get("op")
    if op not in OPS:
        raise TraceError(index, "op", f"unknown op {op!r} (expected 'add' or 'remove')")
    ident = raw.get("id")
    if not isinstance(ident, str) or not ident:
        raise TraceError(index, "id", f"id must be a non-empty string, got {ident!r}")
    allowed = _ADD_FIELDS if op == "add" else _REMOVE_FIELDS
    for key in raw:
        if key not in allowed:
            raise TraceError(index, str(key), f"unknown field for a {op!r} event")
    if op == "remove":
        return TraceEvent("remove", ident)
    cpus = raw.get("cpus")
    if isinstance(cpus, bool) or not isinstance(cpus, int):
        raise TraceError(index, "cpus", f"cpus must be a positive integer, got {cpus!r}")
    if cpus <= 0:
        raise TraceError(index, "cpus", f"cpus must be a positive integer, got {cpus}")
    level = raw.get("level", "cpu")
    if level not in LEVELS:
        raise TraceError(
            index, "level", f"unknown exclusiveness level {level!r} (one of {', '.join(LEVELS)})"
        )
    workload = raw.get("workload")
    if workload is not None and workload not in WORKLOADS:
        raise TraceError(
            index,
            "workload",
            f"unknown workload family {workload!r} (one of {', '.join(WORKLOADS)})",
        )
    shared = raw.get("shared", False)
    if not isinstance(shared, bool):
        raise TraceError(index, "shared", f"shared must be true or false, got {shared!r}")
    near = None
    if "near" in raw:
        text = raw["near"]
        try:
            near = CPUSet.parse(text) if isinstance(text, str) else None
        except ValueError:
            near = None
        if not near:
            raise TraceError(index, "near", f"near must be a non-empty CPU list, got {text!r}")
        if shared or workload == "best-effort":
            raise TraceError(index, "near", "near is for exclusive adds (this one is shared)")
    near_strict = raw.get("nearStrict", False)
    if not isinstance(near_strict, bool) or (near_strict and near is None):
        raise TraceError(
            index, "nearStrict", f"nearStrict must be true or false, with near: {near_strict!r}"
        )
    return TraceEvent("add", ident, cpus, level, workload, shared, near, near_strict)


def parse_trace(data: object) -> Trace:
    """Validate the JSON form strictly; TraceError (exit 2) names the event index and field.

    Besides per-event checks, an add of an id that is still live (added and not yet removed)
    is an error. A remove of an id that is not live is allowed (and ignored on replay).
    """
    if not isinstance(data, Mapping):
        raise TraceError(None, None, 'a trace must be an object with an "events" list')
    for key in data:
        if key != "events":
            raise TraceError(None, str(key), 'unknown top-level field (only "events")')
    raw_events = data.get("events")
    if not isinstance(raw_events, list):
        raise TraceError(None, "events", f"events must be a list, got {type(raw_events).__name__}")
    return Trace(tuple(iter_events(raw_events)))


def iter_events(raw_events: Iterable[object]) -> Iterator[TraceEvent]:
    """The events of a trace's "events" list, checked one at a time as `parse_trace` checks
    them (a live-id set is all it keeps: memory follows the live ids, not the trace length)."""
    live: set[str] = set()
    for index, raw in enumerate(raw_events):
        event = _parse_event(index, raw)
        if event.op == "add":
            if event.id in live:
                raise TraceError(index, "id", f"duplicate add of live id {event.id!r}")
            live.add(event.id)
        else:
            live.discard(event.id)
        yield event


# ---------------------------------------------------------------------------------- results
@dataclass(frozen=True, slots=True)
class DecisionRecord:
    """One add event's outcome for one policy (a line of `--decisions`)."""

    policy: str
    event: int
    id: str
    cpus: CPUSet | None
    reason: str | None

    def to_json(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "event": self.event,
            "id": self.id,
            "cpus": None if self.cpus is None else str(self.cpus),
            "reason": self.reason,
        }


def _ratio(part: int, whole: int) -> float | None:
    return round(part / whole, 4) if whole else None


@dataclass(frozen=True, slots=True)
class PolicyResult:
    """What one policy did with one trace."""

    policy: str
    events: int
    admitted: int
    rejected: int
    admitted_exclusive: int
    admitted_shared: int
    numa_aligned: int
    llc_aligned: int
    full_core: int
    reasons: Mapping[str, int] = field(default_factory=dict)
    peak_withheld: int = 0
    seconds: float = 0.0

    @property
    def numa_aligned_ratio(self) -> float | None:
        return _ratio(self.numa_aligned, self.admitted_exclusive)

    @property
    def llc_aligned_ratio(self) -> float | None:
        return _ratio(self.llc_aligned, self.admitted_exclusive)

    @property
    def full_core_ratio(self) -> float | None:
        return _ratio(self.full_core, self.admitted_exclusive)

    @property
    def events_per_second(self) -> float | None:
        return round(self.events / self.seconds, 1) if self.seconds > 0 else None

    def with_seconds(self, seconds: float) -> PolicyResult:
        return replace(self, seconds=seconds)

    def to_json(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "events": self.events,
            "admitted": self.admitted,
            "rejected": self.rejected,
            "admitted_exclusive": self.admitted_exclusive,
            "admitted_shared": self.admitted_shared,
            "numa_aligned_ratio": self.numa_aligned_ratio,
            "llc_aligned_ratio": self.llc_aligned_ratio,
            "full_core_ratio": self.full_core_ratio,
            "rejection_reasons": dict(sorted(self.reasons.items())),
            "peak_withheld_cpus": self.peak_withheld,
            "seconds": round(self.seconds, 6),
            "events_per_second": self.events_per_second,
        }


# ---------------------------------------------------------------------------------- replay
def replay(
    topology: Topology,
    trace: Trace | Iterable[TraceEvent],
    policy: Policy,
    *,
    on_decision: Callable[[DecisionRecord], None] | None = None,
    progress: Callable[[int, int], None] | None = None,
    progress_every: int = 256,
    metrics: AlignmentMetrics | None = None,
    options: Mapping[str, str] | None = None,
    total: int | None = None,
) -> PolicyResult:
    """Replay `trace` through `policy` on `topology`; the result has seconds = 0 (time it).

    `on_decision` receives one DecisionRecord per add event; `progress(done, total)` is called
    every `progress_every` events and once at the end. `options` (policy options such as
    {"full-pcpus-only": "true"}) go into every exclusive request. Raises SimulationError when
    the policy hands out a CPU that is not available or the wrong number of CPUs.

    `trace` may also be any iterable of events, consumed once (a stream read from a file:
    replay keeps only the live assignments); `total` is then its length for `progress`.
    """
    events = trace.events if isinstance(trace, Trace) else trace
    if isinstance(events, Sequence):
        total = len(events)
    count = 0
    scorer = metrics if metrics is not None else AlignmentMetrics(topology)
    name = policy.name
    pools = NodePools.for_topology(topology)
    live_exclusive: dict[str, CPUSet] = {}
    live_shared: dict[str, CPUSet] = {}  # id -> CPUs a best-effort add was placed on
    usage: dict[int, int] = {}  # CPU -> live best-effort placements on it
    admitted = rejected = admitted_exclusive = admitted_shared = 0
    numa_ok = llc_ok = core_ok = 0
    peak = 0
    reasons: dict[str, int] = {}
    request_cache: dict[tuple[int, str, str | None, bool, CPUSet | None, bool], Request] = {}
    for index, event in enumerate(events):
        count = index + 1
        if progress is not None and index % progress_every == 0 and index:
            progress(index, total or 0)
        if event.op == "remove":
            freed = live_exclusive.pop(event.id, None)
            if freed is not None:
                pools = pools.release("exclusive", freed)
            else:
                for cpu in live_shared.pop(event.id, CPUSet()):
                    usage[cpu] -= 1
            continue
        shared = event.shared or event.workload == "best-effort"
        key = (event.cpus, event.level, event.workload, shared, event.near, event.near_strict)
        request = request_cache.get(key)
        if request is None:
            request = Request(
                event.cpus,
                exclusive=not event.shared,
                level="cpu" if shared else event.level,
                workload=event.workload,
                options=options or {},
                near=event.near,
                near_strict=event.near_strict,
            )
            request_cache[key] = request
        if shared:  # runs in the shared pool, withholds nothing (best effort: placed in it)
            try:
                placed = decide(pools, topology, request, policy, kind="shared", usage=usage)
            except (AllocationError, RequestError) as exc:
                rejected += 1
                reasons[exc.reason] = reasons.get(exc.reason, 0) + 1
                if on_decision is not None:
                    on_decision(DecisionRecord(name, index, event.id, None, exc.reason))
                continue
            admitted += 1
            admitted_shared += 1
            mine = placed.cpus if placed.cpus != pools.shared_pool else CPUSet()
            live_shared[event.id] = mine
            for cpu in mine:
                usage[cpu] = usage.get(cpu, 0) + 1
            if on_decision is not None:
                on_decision(DecisionRecord(name, index, event.id, placed.cpus, None))
            continue
        available = pools.free
        try:
            decision = decide(
                pools, topology, request, policy, kind="exclusive", keep_shared=bool(live_shared)
            )
        except (AllocationError, RequestError) as exc:
            rejected += 1
            reasons[exc.reason] = reasons.get(exc.reason, 0) + 1
            if on_decision is not None:
                on_decision(DecisionRecord(name, index, event.id, None, exc.reason))
            continue
        cpus = decision.cpus
        if cpus.bits & ~available.bits or len(cpus) != event.cpus:
            raise SimulationError(
                f"policy {name!r} at trace event {index} ({event.id!r}, {event.cpus} CPUs) "
                f"returned CPUs {cpus} ({len(cpus)} CPUs) from available {available}"
            )
        held = decision.withheld | cpus
        try:
            pools = pools.hold("exclusive", held)
        except AllocationError as exc:
            raise SimulationError(
                f"policy {name!r} at trace event {index} ({event.id!r}) withholds CPUs "
                f"{held} that are not free: {exc}"
            ) from None
        live_exclusive[event.id] = held
        withheld_now = pools.exclusive.bit_count()
        if withheld_now > peak:
            peak = withheld_now
        admitted += 1
        admitted_exclusive += 1
        numa, llc, whole = scorer.classify(cpus)
        numa_ok += numa
        llc_ok += llc
        core_ok += whole
        if on_decision is not None:
            on_decision(DecisionRecord(name, index, event.id, cpus, None))
    if progress is not None:
        progress(count, total or count)
    return PolicyResult(
        policy=name,
        events=count,
        admitted=admitted,
        rejected=rejected,
        admitted_exclusive=admitted_exclusive,
        admitted_shared=admitted_shared,
        numa_aligned=numa_ok,
        llc_aligned=llc_ok,
        full_core=core_ok,
        reasons=dict(sorted(reasons.items())),
        peak_withheld=peak,
    )
