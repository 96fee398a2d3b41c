"""Rebalancing: aligned share of exclusive CPU-time without vs with live moves, same churn.

On the churn traces of `bench_quality.py` (its four machine shapes, the same generator, seeds
and lengths, without exclusiveness levels unless --levels), each policy replays every trace
twice with `corepin.allocation.simulate.replay`: as admitted, and with the rebalancing planner
(`corepin.allocation.rebalance.plan_moves`, what `corepin agent --rebalance move` and
`corepin reconcile --rebalance` use) moving live exclusive allocations after each event, at most
--limit moves per event. Per shape and policy it prints: admitted (the same with and without:
the targets below), the NUMA-aligned and LLC-aligned shares of exclusive CPU-time (CPUs x
events lived, an allocation counted by what it is in each interval), moves per 1,000 events,
and the planner's time per call (median and p99, `time.perf_counter_ns` around each call; the
planner is called only after events that leave a live allocation off its size's minimum).

Targets (issue 19): the same admitted with and without moves; higher LLC-aligned and
NUMA-aligned shares of exclusive CPU-time with moves. Every trace where one is missed is listed.

    python benchmarks/bench_rebalance.py [--quick] [--record] [--seeds N] [--events N]
                                          [--limit N] [--levels] [--topology NAME]...
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from _common import QUALITY, baseline_figures, describe, median, pct, percentile, record_if_asked
from _common import table as render
from _common import topology as machine
from corepin.allocation.policies import get_policy
from corepin.allocation.rebalance import Move, plan_moves
from corepin.allocation.simulate import AlignmentMetrics, PolicyResult, parse_trace, replay
from corepin.allocation.tracegen import ChurnOptions, generate_trace

POLICIES = ("topology-aware", "kubelet-static")


class TimedPlanner:
    """`plan_moves`, with the time of each call kept (nanoseconds)."""

    def __init__(self) -> None:
        self.ns: list[int] = []

    def __call__(self, *args: Any, **kwargs: Any) -> tuple[Move, ...]:
        start = time.perf_counter_ns()
        moves = plan_moves(*args, **kwargs)
        self.ns.append(time.perf_counter_ns() - start)
        return moves


def change(got: dict[str, Any], key: str) -> str:
    """`without -> with` of one share."""
    return f"{pct(got[key])} -> {pct(got[key + '_with_moves'])}"


def share(results: list[PolicyResult], attr: str) -> float | None:
    """Aligned share of the exclusive CPU-time of several replays together."""
    whole = sum(r.exclusive_cpu_time for r in results)
    return round(sum(getattr(r, attr) for r in results) / whole, 4) if whole else None


def misses(where: str, plain: list[PolicyResult], moved: list[PolicyResult]) -> list[str]:
    """Where moving misses a target against not moving (exact figures)."""
    out = []
    a, b = sum(r.admitted for r in plain), sum(r.admitted for r in moved)
    if a != b:
        out.append(f"{where}: admitted {b} with moves, {a} without")
    for attr, label in (
        ("numa_aligned_cpu_time", "NUMA-aligned"),
        ("llc_aligned_cpu_time", "LLC-aligned"),
    ):
        before, after = share(plain, attr), share(moved, attr)
        if before is not None and after is not None and after < before:
            out.append(f"{where}: {label} CPU-time {pct(after)} with moves < {pct(before)}")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one short trace per topology")
    parser.add_argument("--record", action="store_true", help="write the figures as baseline")
    parser.add_argument("--seeds", type=int, default=0, help="traces per topology")
    parser.add_argument("--events", type=int, default=0, help="events per trace")
    parser.add_argument("--limit", type=int, default=2, help="moves per event (default 2)")
    parser.add_argument(
        "--levels", action="store_true", help="keep exclusiveness levels in the traces"
    )
    parser.add_argument(
        "--topology", action="append", help=f"topology names (default: {', '.join(QUALITY)})"
    )
    args = parser.parse_args()
    seeds = args.seeds or (1 if args.quick else 3)
    events = args.events or (600 if args.quick else 4000)
    names = args.topology or list(QUALITY)
    policies = [get_policy(n) for n in POLICIES]
    base = baseline_figures("rebalance")
    figures: dict[str, Any] = {}
    missed: list[str] = []
    rows = [
        (
            "topology",
            "policy",
            "admitted",
            "NUMA-aligned time",
            "LLC-aligned time",
            "moves/1k ev",
            "planner calls",
            "median us",
            "p99 us",
            "replay s",
        )
    ]
    print(
        f"# {seeds} seed(s) x {events} events per topology, at most {args.limit} move(s) per "
        f"event, levels {'on' if args.levels else 'off'}"
    )
    for tname in names:
        topo = machine(tname)
        print(f"# {tname}: {describe(topo)}", flush=True)
        metrics = AlignmentMetrics(topo)
        traces = [
            parse_trace(
                generate_trace(topo, seed=seed, options=ChurnOptions(events, levels=args.levels))
            )
            for seed in range(seeds)
        ]
        for policy in policies:
            plain: list[PolicyResult] = []
            moved: list[PolicyResult] = []
            timer = TimedPlanner()
            seconds = [0.0, 0.0]
            for seed, trace in enumerate(traces):
                start = time.perf_counter()
                one = replay(topo, trace, policy, metrics=metrics)
                seconds[0] += time.perf_counter() - start
                start = time.perf_counter()
                other = replay(
                    topo,
                    trace,
                    policy,
                    metrics=metrics,
                    rebalance=True,
                    rebalance_limit=args.limit,
                    planner=timer,
                )
                seconds[1] += time.perf_counter() - start
                plain.append(one)
                moved.append(other)
                missed += misses(f"{tname} {policy.name} seed {seed}", [one], [other])
            missed += misses(f"{tname} {policy.name} all seeds", plain, moved)
            calls = sorted(timer.ns)
            moves = sum(r.moves for r in moved)
            total_events = sum(r.events for r in moved)
            got = {
                "admitted": sum(r.admitted for r in plain),
                "admitted_with_moves": sum(r.admitted for r in moved),
                "numa_aligned_time": share(plain, "numa_aligned_cpu_time"),
                "numa_aligned_time_with_moves": share(moved, "numa_aligned_cpu_time"),
                "llc_aligned_time": share(plain, "llc_aligned_cpu_time"),
                "llc_aligned_time_with_moves": share(moved, "llc_aligned_cpu_time"),
                "moves": moves,
                "moves_per_1000_events": round(1000 * moves / total_events, 2),
                "planner_calls": len(calls),
                "planner_median_us": round(median(calls) / 1000, 1) if calls else None,
                "planner_p99_us": round(percentile(calls, 99) / 1000, 1) if calls else None,
            }
            figures[f"{tname}/{policy.name}"] = got
            admitted = str(got["admitted"])
            if got["admitted_with_moves"] != got["admitted"]:
                admitted += f" -> {got['admitted_with_moves']}"
            rows.append(
                (
                    tname,
                    policy.name,
                    admitted,
                    change(got, "numa_aligned_time"),
                    change(got, "llc_aligned_time"),
                    f"{got['moves_per_1000_events']:.1f}",
                    str(len(calls)),
                    "-" if not calls else f"{got['planner_median_us']:.0f}",
                    "-" if not calls else f"{got['planner_p99_us']:.0f}",
                    f"{seconds[0]:.2f} -> {seconds[1]:.2f}",
                )
            )
            then = base.get(f"{tname}/{policy.name}", {})
            if then:
                print(
                    f"  {policy.name}: planner median {got['planner_median_us']} us "
                    f"(baseline {then.get('planner_median_us')} us)",
                    flush=True,
                )
    print()
    print(render(rows, right_from=2))
    print()
    if missed:
        print("targets missed:")
        for line in missed:
            print(f"  {line}")
    else:
        print("targets met: same admitted, higher or equal aligned CPU-time shares everywhere")
    record_if_asked(args.record, args.quick, "rebalance", figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
