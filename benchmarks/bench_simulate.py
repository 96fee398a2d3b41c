"""Simulator throughput: events per second replaying a generated churn trace on 256 CPUs.

The trace is the churn generator's (seeded), the replay is `corepin.allocation.simulate.replay`
with its alignment scoring on, exactly what `corepin simulate` runs. Target (issue 3):
>= 5,000 events/s on a 256-CPU topology.

    python benchmarks/bench_simulate.py [--quick] [--record] [--events N]
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from _common import (
    SIZED,
    baseline_figures,
    change,
    describe,
    record_if_asked,
    table,
    topology,
)
from corepin.allocation.policies import POLICY_NAMES, get_policy
from corepin.allocation.simulate import AlignmentMetrics, parse_trace, replay
from corepin.allocation.tracegen import ChurnOptions, generate_trace
from corepin.core.errors import RequestError

TARGET_EVENTS_PER_SECOND = 5000.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short trace (CI smoke run)")
    parser.add_argument("--record", action="store_true", help="write the figures as baseline")
    parser.add_argument("--events", type=int, default=0, help="trace length")
    parser.add_argument("--size", type=int, default=256, choices=sorted(SIZED))
    args = parser.parse_args()
    events = args.events or (1000 if args.quick else 20000)
    topo = topology(SIZED[args.size])
    print(f"# {SIZED[args.size]}: {describe(topo)}")
    start = time.perf_counter()
    trace = parse_trace(generate_trace(topo, seed=1, options=ChurnOptions(events=events)))
    print(
        f"# trace: {len(trace.events)} events, {trace.adds} adds "
        f"(generated and validated in {time.perf_counter() - start:.2f} s)"
    )
    base = baseline_figures("simulate")
    figures: dict[str, Any] = {}
    rows = [("policy", "events", "seconds", "events/s", "admitted", "rejected", "vs baseline")]
    metrics = AlignmentMetrics(topo)
    missed = []
    for name in POLICY_NAMES:
        try:
            policy = get_policy(name)
        except RequestError as exc:
            print(f"skipping {name}: {exc}")
            continue
        start = time.perf_counter()
        result = replay(topo, trace, policy, metrics=metrics)
        seconds = time.perf_counter() - start
        rate = len(trace.events) / seconds
        key = f"{name}/{args.size}"
        figures[key] = {
            "events": len(trace.events),
            "seconds": round(seconds, 3),
            "events_per_second": round(rate),
            "admitted": result.admitted,
            "rejected": result.rejected,
        }
        then = base.get(key, {}).get("events_per_second")
        rows.append(
            (
                name,
                str(len(trace.events)),
                f"{seconds:.2f}",
                f"{rate:,.0f}",
                str(result.admitted),
                str(result.rejected),
                change(rate, then, higher_is_better=True),
            )
        )
        if rate < TARGET_EVENTS_PER_SECOND:
            missed.append(f"{key}: {rate:,.0f} events/s < {TARGET_EVENTS_PER_SECOND:,.0f}")
    print()
    print(table(rows))
    print()
    if missed:
        print("targets missed:")
        for line in missed:
            print(f"  {line}")
    else:
        print(f"target met (>= {TARGET_EVENTS_PER_SECOND:,.0f} events/s)")
    record_if_asked(args.record, args.quick, "simulate", figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
