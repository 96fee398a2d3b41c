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
"""

from __future__ import annotations

import heapq
import random
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


def _pick(rng: random.Random, table: tuple[tuple[Any, int], ...]) -> Any:
    values = [v for v, _ in table]
    weights = [w for _, w in table]
    return rng.choices(values, weights)[0]


def generate_trace(
    topology: Topology, *, seed: int = 0, options: ChurnOptions | None = None
) -> dict[str, Any]:
    """A churn trace (its JSON form, ready for `parse_trace` or `json.dump`)."""
    opts = options or ChurnOptions()
    opts.check()
    capacity = len(topology.online_cpus)
    if capacity == 0:
        raise InputError("the topology has no online CPUs to generate a trace for")
    rng = random.Random(seed)
    limit = max(1, capacity // 2)
    sizes = [s for s in SIZES if s <= limit] or [1]
    weights = [w for s, w in zip(SIZES, SIZE_WEIGHTS, strict=True) if s <= limit]
    mean_size = sum(s * w for s, w in zip(sizes, weights, strict=True)) / sum(weights)
    # At steady state about (capacity * 0.9 / mean_size) workloads are live; a workload should
    # live for roughly twice that many events so that arrivals and departures balance.
    mean_lifetime = opts.mean_lifetime or max(8.0, 2.0 * 0.9 * capacity / mean_size)
    low, high = opts.low * capacity, opts.high * capacity

    events: list[dict[str, Any]] = []
    due: list[tuple[int, int, str]] = []  # (due step, serial, id) of live workloads
    size_of: dict[str, int] = {}  # live id -> notional exclusive CPUs (0 for shared)
    load = 0
    serial = 0
    step = 0
    while len(events) < opts.events:
        step += 1
        departing = bool(due) and ((due[0][0] <= step and load >= low) or load > high)
        if departing:
            _, _, ident = heapq.heappop(due)
            load -= size_of.pop(ident)
            events.append({"op": "remove", "id": ident})
            continue
        serial += 1
        ident = f"{_NAMESPACES[serial % len(_NAMESPACES)]}/pod-{serial}/ctr-{rng.randrange(3)}"
        event: dict[str, Any] = {"op": "add", "id": ident}
        if rng.random() < opts.shared_fraction:
            event["cpus"] = rng.choice((1, 1, 2))
            event["shared"] = True
            notional = 0
        else:
            cpus = rng.choices(sizes, weights)[0]
            event["cpus"] = cpus
            level = _pick(rng, _LEVELS)
            if (level in ("numa", "socket") and cpus < 8) or not opts.levels:
                level = "cpu"
            if level != "cpu":
                event["level"] = level
            notional = cpus
        workload = _pick(rng, _WORKLOADS)
        if workload is not None:
            event["workload"] = workload
        lifetime = 1 + int(rng.expovariate(1.0 / mean_lifetime))
        heapq.heappush(due, (step + lifetime, serial, ident))
        size_of[ident] = notional
        load += notional
        events.append(event)
    return {"events": events}
