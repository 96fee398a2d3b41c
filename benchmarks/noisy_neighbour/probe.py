"""Latency probe: a fixed small compute step timed in a loop.

Each iteration runs the same tiny piece of pure-Python work and records its wall time. On an idle
CPU every iteration takes about the same time; when the probe shares its CPU with busy neighbours
the scheduler preempts it for whole time slices and the tail (p99) grows by orders of magnitude.

Prints one JSON object: {"iterations", "p50_us", "p90_us", "p99_us", "p999_us", "max_us",
"affinity"}.
"""

from __future__ import annotations

import argparse
import json
import os
import time


def step(work: int) -> int:
    acc = 0
    for i in range(work):
        acc = (acc * 31 + i) & 0xFFFF
    return acc


def percentile(sorted_values: list[int], q: float) -> float:
    if not sorted_values:
        return 0.0
    index = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return float(sorted_values[index])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--iterations", type=int, default=20000)
    parser.add_argument("--work", type=int, default=3000, help="loop length of one step")
    args = parser.parse_args()
    for _ in range(200):  # warm up
        step(args.work)
    clock = time.perf_counter_ns
    samples = [0] * args.iterations
    for n in range(args.iterations):
        start = clock()
        step(args.work)
        samples[n] = clock() - start
    samples.sort()
    result = {
        "iterations": args.iterations,
        "p50_us": percentile(samples, 0.50) / 1000,
        "p90_us": percentile(samples, 0.90) / 1000,
        "p99_us": percentile(samples, 0.99) / 1000,
        "p999_us": percentile(samples, 0.999) / 1000,
        "max_us": samples[-1] / 1000,
        "affinity": ",".join(str(c) for c in sorted(os.sched_getaffinity(0))),
        "corepin_cpus": os.environ.get("COREPIN_CPUS"),
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
