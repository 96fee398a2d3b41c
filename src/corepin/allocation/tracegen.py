"""Seeded generator of realistic allocation churn traces (pure and deterministic).

The same topology, seed and options give the same trace, byte for byte. The generator keeps a
notional load (the sum of the CPUs of live exclusive requests, as a share of the online CPUs)
and steers it into a band near full, so that policies are compared where they differ most: on a
fragmented, nearly full machine.

- Sizes 1, 2, 3, 4, 6, 8, 16, 32 CPUs, weighted toward small ones (sizes above half the
  machine are dropped on small topologies).
- About one add in seven is shared (`"shared": true`, 1-2 CPUs of the shared pool).
- Exclusiveness levels: mostly `cpu`, some `core`, a few `l3`, rare `numa` / `socket` (those
  only for requests of 8 CPUs or more, where withholding a whole unit is plausible); none with
  `ChurnOptions(levels=False)`, which otherwise gives the same trace.
- Workload families: none for about half the requests, else one of the four families.
- Arrivals and departures: every add draws a lifetime (exponential, in events); departures
  happen when due. While the load is under the band only arrivals happen; above it, the
  soonest-due workload leaves early.

`iter_trace_events` yields the events one at a time and keeps only the live workloads, so a
trace of any length is generated in the memory of one machine's worth of workloads;
`generate_trace` collects them into the JSON form.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final

from corepin.core.errors import InputError
from corepin.topology.model import Topology

SIZES: Final = (1, 2, 3, 4, 6, 8, 16, 32)
SIZE_WEIGHTS: Final = (30, 22, 8, 16, 6, 9, 6, 3)
_LEVELS: Final = (("cpu", 74), ("core", 18), ("l3", 5), ("numa", 2), ("socket", 1))
_WORKLOADS: Final = (
    (None, 50),
    ("cpu-bound", 18),
    ("memory-bound", 12),
    ("io-bound", 10),
    ("best-effort", 10),
)
_NAMESPACES: Final = ("default", "batch", "web", "db", "ml", "infra", "stream")


@dataclass(frozen=True, slots=True)
class ChurnOptions:
    """Knobs of the generator; the defaults are the `corepin simulate --generate` ones."""

    events: int = 2000
    low: float = 0.80  # notional load band, as a share of online CPUs
    high: float = 1.00
    shared_fraction: float = 0.14
    mean_lifetime: float = 0.0  # in events; 0 = derived from the machine size
    #: False: every exclusive add is level "cpu" (for policies without exclusiveness levels,
    #: such as kubelet-static); the trace is otherwise the same as with levels.
    levels: bool = True

    def check(self) -> None:
        if isinstance(self.events, bool) or not isinstance(self.events, int) or self.events < 0:
            raise InputError(f"event count must be a non-negative integer, got {self.events!r}")
        if not 0.0 < self.low <= self.high:
            raise InputError(f"load band {self.low}..{self.high} must satisfy 0 < low <= high")
        if not 0.0 <= self.shared_fraction < 1.0:
            raise InputError(f"shared fraction {self.shared_fraction} must be in [0, 1)")


class _Weighted:
    """`rng.choices(values, weights)[0]` with the cumulative weights computed once: the same
    draw from the same random number (as `random.choices` does it), without rebuilding the
    tables for every event of a long trace."""

    __slots__ = ("_cum", "_hi", "_total", "_values")

    def __init__(self, values: list[Any], weights: list[int]) -> None:
        self._values = values
        self._cum = list(itertools.accumulate(weights))
        self._total = self._cum[-1] + 0.0
        self._hi = len(self._cum) - 1

    def pick(self, rng: random.Random) -> Any:
        return self._values[bisect.bisect(self._cum, rng.random() * self._total, 0, self._hi)]


def _table(table: tuple[tuple[Any, int], ...]) -> _Weighted:
    return _Weighted([v for v, _ in table], [w for _, w in table])


def generate_trace(
    topology: Topology, *, seed: int = 0, options: ChurnOptions | None = None
) -> dict[str, Any]:
    """A churn trace (its JSON form, ready for `parse_trace` or `json.dump`)."""
    return {"events": list(iter_trace_events(topology, seed=seed, options=options))}


def iter_trace_events(
    topology: Topology, *, seed: int = 0, options: ChurnOptions | None = None
) -> Iterator[dict[str, Any]]:
    """The events of `generate_trace`, one at a time (the same events, in bounded memory).

    The options and the topology are checked now; the events come as the iterator is read."""
    opts = options or ChurnOptions()
    opts.check()
    capacity = len(topology.online_cpus)
    if capacity == 0:
        raise InputError("the topology has no online CPUs to generate a trace for")
    return _churn(capacity, seed, opts)


def _churn(capacity: int, seed: int, opts: ChurnOptions) -> Iterator[dict[str, Any]]:
    rng = random.Random(seed)
    limit = max(1, capacity // 2)
    sizes = [s for s in SIZES if s <= limit] or [1]
    weights = [w for s, w in zip(SIZES, SIZE_WEIGHTS, strict=True) if s <= limit]
    mean_size = sum(s * w for s, w in zip(sizes, weights, strict=True)) / sum(weights)
    # At steady state about (capacity * 0.9 / mean_size) workloads are live; a workload should
    # live for roughly twice that many events so that arrivals and departures balance.
    mean_lifetime = opts.mean_lifetime or max(8.0, 2.0 * 0.9 * capacity / mean_size)
    low, high = opts.low * capacity, opts.high * capacity
    size_table = _Weighted(sizes, weights)
    level_table, workload_table = _table(_LEVELS), _table(_WORKLOADS)

    due: list[tuple[int, int, str]] = []  # (due step, serial, id) of live workloads
    size_of: dict[str, int] = {}  # live id -> notional exclusive CPUs (0 for shared)
    load = 0
    serial = 0
    step = 0
    emitted = 0
    while emitted < opts.events:
        step += 1
        emitted += 1
        departing = bool(due) and ((due[0][0] <= step and load >= low) or load > high)
        if departing:
            _, _, ident = heapq.heappop(due)
            load -= size_of.pop(ident)
            yield {"op": "remove", "id": ident}
            continue
        serial += 1
        ident = f"{_NAMESPACES[serial % len(_NAMESPACES)]}/pod-{serial}/ctr-{rng.randrange(3)}"
        event: dict[str, Any] = {"op": "add", "id": ident}
        if rng.random() < opts.shared_fraction:
            event["cpus"] = rng.choice((1, 1, 2))
            event["shared"] = True
            notional = 0
        else:
            cpus = size_table.pick(rng)
            event["cpus"] = cpus
            level = level_table.pick(rng)
            if (level in ("numa", "socket") and cpus < 8) or not opts.levels:
                level = "cpu"
            if level != "cpu":
                event["level"] = level
            notional = cpus
        workload = workload_table.pick(rng)
        if workload is not None:
            event["workload"] = workload
        lifetime = 1 + int(rng.expovariate(1.0 / mean_lifetime))
        heapq.heappush(due, (step + lifetime, serial, ident))
        size_of[ident] = notional
        load += notional
        yield event
