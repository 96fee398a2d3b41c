"""CPU burst: does a bursty service under a CFS quota stop being throttled, and finish its bursts
sooner, with burst off / static (`cpuBurstOnly`) / `auto`?

The probe runs in a scratch cgroup `corepin-bench-<random>/burst-...` of the host's cgroup v1
cpu hierarchy (removed afterwards, also after Ctrl-C) with a CFS quota of `--quota` CPUs per
100 ms: every `--every-ms` ms it releases `--workers` worker processes (processes: threads
would share the GIL), each of which spins `--spin-ms` ms of its own CPU time; the burst is done
when the last worker is. Each burst starts at a random point (seeded) of the first `--jitter-ms`
of its slot, so the bursts meet the CFS period at every phase (with a fixed phase a run would
be throttled on every burst or on none, by chance). The average stays below the quota
(`workers * spin / every` CPUs), but a burst asks for more than one period's quota at once, so
without burst it is throttled.

The QoS engine (`corepin.enforcement.qos.QosEngine`) runs its period every `--interval`
seconds in a thread of this script with the probe's group as an LS member whose base quota is
the limit; per scenario the policy's `cpuBurst.policy` is `none`, `cpuBurstOnly` or `auto`
(`--burst-percent`, `--max-quota-percent`, `--share-limit`). Each scenario gets a fresh group;
rounds interleave the policies, all in the same run. Figures per policy, over every round:
throttled periods (cpu.stat nr_throttled / nr_periods over the probe's run), burst completion
time (p50, p99), and what the engine left in force.

Targets (issue 17, there: 16 CPUs, 4 threads x 20 ms every 100 ms under 1 CPU): throttling
down by >= 80 % and p99 down by >= 30 % against burst off. The defaults fit 2 CPUs.

Usage: .venv/bin/python benchmarks/bench_qos_burst.py [--duration 30] [--rounds 2] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _common import median, percentile
from _qos_real import (
    CPU,
    Periodic,
    Scratch,
    host_engine,
    interrupts_as_keyboard,
    why_not_real,
)
from corepin.allocation.qos import BeSuppress, CpuBurst, QosPolicy
from corepin.enforcement.cgroups import CpuQuota
from corepin.enforcement.qos import QosMember

HERE = Path(__file__).resolve()
PERIOD_US = 100_000
POLICIES = ("none", "cpuBurstOnly", "auto")
LABEL = {"none": "burst off", "cpuBurstOnly": "static (cpuBurstOnly)", "auto": "auto"}
TARGET_THROTTLE_CUT = 0.80
TARGET_P99_CUT = 0.30


# ---------------------------------------------------------------- the probe (own process)
def worker(command: int, reply: int, spin_s: float) -> None:
    """Wait for a byte, spin `spin_s` of this process's CPU time, answer; until EOF."""
    x = 0
    while os.read(command, 1):
        start = time.process_time()
        while time.process_time() - start < spin_s:
            for _ in range(300):
                x = (x * 7 + 1) & 0xFFFFFFFF
        os.write(reply, b".")
    os._exit(0)


def probe_main(args: argparse.Namespace) -> int:
    """The bursty service: prints one JSON line with each burst's completion time (ms)."""
    replies_r, replies_w = os.pipe()
    commands = []
    kids = []
    for _ in range(args.workers):
        cmd_r, cmd_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(replies_r)
            for fd in commands:  # the earlier workers' pipes: their EOF must not wait on us
                os.close(fd)
            os.close(cmd_w)
            worker(cmd_r, replies_w, args.spin_ms / 1000)
        os.close(cmd_r)
        commands.append(cmd_w)
        kids.append(pid)
    os.close(replies_w)
    print("ready", flush=True)
    sys.stdin.readline()  # go
    every = args.every_ms / 1000
    jitter = random.Random(args.seed)
    completions, late = [], 0
    begin = time.monotonic()
    n = 0
    while True:
        if n * every >= args.duration:
            break
        due = begin + n * every + jitter.uniform(0, args.jitter_ms / 1000)
        now = time.monotonic()
        if now < due:
            time.sleep(due - now)
        else:
            late += n > 0 and now - due > 0.001
        released = time.monotonic()
        for fd in commands:
            os.write(fd, b"g")
        got = 0
        while got < args.workers:
            select.select([replies_r], [], [])
            got += len(os.read(replies_r, args.workers - got))
        completions.append((time.monotonic() - released) * 1000)
        n += 1
    for fd in commands:
        os.close(fd)
    for pid in kids:
        os.waitpid(pid, 0)
    print(json.dumps({"completions_ms": completions, "late": late}), flush=True)
    return 0


# ---------------------------------------------------------------- the benchmark
def scenario(
    scratch: Scratch, tag: str, policy_name: str, args: argparse.Namespace
) -> dict[str, Any]:
    group = scratch.group(f"burst-{tag}")
    base = CpuQuota.for_cpus(args.quota, PERIOD_US)
    assert base.quota_us is not None
    scratch.write(CPU, group, "cpu.cfs_period_us", str(PERIOD_US))
    scratch.write(CPU, group, "cpu.cfs_quota_us", str(base.quota_us))
    engine, node = host_engine(None)
    policy = QosPolicy(
        be_suppress=BeSuppress(policy="off"),
        cpu_burst=CpuBurst(
            policy=policy_name,
            burst_percent=args.burst_percent,
            max_quota_percent=args.max_quota_percent,
            share_usage_limit_percent=args.share_limit,
        ),
    )
    probe = subprocess.Popen(
        scratch.enter_argv(
            group,
            [
                sys.executable,
                str(HERE),
                "--as-probe",
                "--workers",
                str(args.workers),
                "--spin-ms",
                str(args.spin_ms),
                "--every-ms",
                str(args.every_ms),
                "--duration",
                str(args.duration),
                "--jitter-ms",
                str(args.jitter_ms),
                "--seed",
                str(args.seed),
            ],
        ),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert probe.stdin is not None and probe.stdout is not None
    members = [QosMember("burst-probe", "LS", group, (probe.pid,), base_quota=base)]
    loop = Periodic(lambda: engine.period(members, node, policy), args.interval)
    try:
        if probe.stdout.readline().strip() != "ready":
            raise SystemExit(
                f"the probe did not start: {probe.stderr.read() if probe.stderr else ''}"
            )
        loop.start()
        while not loop.results and loop.error is None and loop.is_alive():
            time.sleep(0.01)  # the first period applied the policy
        before = scratch.cpu_stat(group)
        probe.stdin.write("go\n")
        probe.stdin.flush()
        out, err = probe.communicate(timeout=args.duration * 4 + 60)
        after = scratch.cpu_stat(group)
        in_force = {
            "quota_us": scratch.read(CPU, group, "cpu.cfs_quota_us"),
            "burst_us": scratch.read(CPU, group, "cpu.cfs_burst_us"),
        }
    finally:
        if probe.poll() is None:
            probe.kill()
            probe.wait()
        loop.close()
    if probe.returncode != 0:
        raise SystemExit(f"probe failed ({probe.returncode}): {err.strip()}")
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    delta = {k: after[k] - before.get(k, 0) for k in after}
    result["stat"] = delta
    result["in_force"] = in_force
    reports = [r for _t, r in loop.results]
    result["burst_changes"] = sum(r.burst_changes for r in reports)
    # the engine holds burst back while the shared pool is busier than shareUsageLimitPercent
    shares = [
        100 * max(0.0, r.usage["node"] - r.usage["LSE"]) / len(node.shared_pool)
        for r in reports
        if r.usage
    ]
    result["pool_busy"] = shares
    result["held_back"] = sum(1 for x in shares if x > args.share_limit)
    result["problems"] = sorted({p for r in reports for p in r.problems})
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quota", type=float, default=1.0, help="the limit, CPUs (per 100 ms)")
    parser.add_argument("--workers", type=int, default=4, help="processes per burst")
    parser.add_argument("--spin-ms", type=float, default=30.0, help="CPU time of each worker")
    parser.add_argument("--every-ms", type=float, default=200.0, help="one burst every ...")
    parser.add_argument(
        "--jitter-ms",
        type=float,
        default=100.0,
        help="each burst starts up to this much after its slot (uniform, seeded): bursts land "
        "at every phase of the CFS period, not at one phase that happens to throttle or not",
    )
    parser.add_argument("--seed", type=int, default=17)
    parser.add_argument("--duration", type=float, default=30.0, help="seconds per scenario")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--interval", type=float, default=1.0, help="QoS period, seconds")
    parser.add_argument("--burst-percent", type=int, default=1000)
    parser.add_argument("--max-quota-percent", type=int, default=300)
    parser.add_argument("--share-limit", type=int, default=50, help="shareUsageLimitPercent")
    parser.add_argument("--quick", action="store_true", help="smoke run: 1 round of 4 s")
    parser.add_argument("--json", action="store_true", help="also print the raw results")
    parser.add_argument("--as-probe", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.as_probe:
        return probe_main(args)
    if args.quick:
        args.rounds, args.duration = 1, 4.0
    problem = why_not_real()
    if problem is not None:
        print(f"CPU burst: skipped: {problem}")
        return 0
    interrupts_as_keyboard()
    scratch = Scratch()
    results: dict[str, list[dict[str, Any]]] = {p: [] for p in POLICIES}
    try:
        for rnd in range(args.rounds):
            for policy_name in POLICIES:
                results[policy_name].append(
                    scenario(scratch, f"{rnd}-{policy_name}", policy_name, args)
                )
    finally:
        scratch.close()
    report(results, args)
    return 0


def report(results: dict[str, list[dict[str, Any]]], args: argparse.Namespace) -> None:
    cpus = len(os.sched_getaffinity(0))
    demand = args.workers * args.spin_ms / args.every_ms
    print(
        f"CPU burst: {cpus} CPUs; quota {args.quota} CPU per {PERIOD_US // 1000} ms; bursts of "
        f"{args.workers} processes x {args.spin_ms:g} ms CPU every {args.every_ms:g} ms "
        f"(+ 0-{args.jitter_ms:g} ms, seed {args.seed}) "
        f"(average {demand:.2f} CPU); {args.duration:g} s x {args.rounds} rounds per policy; "
        f"engine period {args.interval} s; burstPercent {args.burst_percent}, maxQuotaPercent "
        f"{args.max_quota_percent}, shareUsageLimitPercent {args.share_limit}; 1-min load "
        f"average at the end {os.getloadavg()[0]:.2f}"
    )
    print(
        "| policy | bursts | throttled periods | p50 ms | p99 ms | max ms | late starts | "
        "kernel bursts | engine changes | periods over the share limit | "
        "quota / burst us at the end |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    figures: dict[str, dict[str, float]] = {}
    for policy_name, runs in results.items():
        times = sorted(t for r in runs for t in r["completions_ms"])
        periods = sum(r["stat"].get("nr_periods", 0) for r in runs)
        throttled = sum(r["stat"].get("nr_throttled", 0) for r in runs)
        share = throttled / periods if periods else 0.0
        figures[policy_name] = {"share": share, "p99": percentile(times, 99)}
        end = runs[-1]["in_force"]
        print(
            f"| {LABEL[policy_name]} | {len(times)} | {100 * share:.1f} % ({throttled}/{periods}) "
            f"| {median(times):.1f} | {percentile(times, 99):.1f} | {times[-1]:.1f} | "
            f"{sum(r['late'] for r in runs)} | {sum(r['stat'].get('nr_bursts', 0) for r in runs)} "
            f"| {sum(r['burst_changes'] for r in runs)} | "
            f"{sum(r['held_back'] for r in runs)}/{sum(len(r['pool_busy']) for r in runs)} | "
            f"{end['quota_us']} / {end['burst_us']} |"
        )
        for p in sorted({p for r in runs for p in r["problems"]}):
            print(f"  engine problem with {policy_name}: {p}")
    off = figures["none"]
    missed = []
    for policy_name in ("cpuBurstOnly", "auto"):
        got = figures[policy_name]
        cut = 1 - got["share"] / off["share"] if off["share"] else float("nan")
        p99_cut = 1 - got["p99"] / off["p99"]
        print(
            f"{LABEL[policy_name]} vs burst off: throttling down {100 * cut:.0f} % "
            f"(target >= {100 * TARGET_THROTTLE_CUT:.0f} %), p99 down {100 * p99_cut:.0f} % "
            f"(target >= {100 * TARGET_P99_CUT:.0f} %)"
        )
        if not cut >= TARGET_THROTTLE_CUT:
            missed.append(f"{LABEL[policy_name]}: throttling down {100 * cut:.0f} %")
        if p99_cut < TARGET_P99_CUT:
            missed.append(f"{LABEL[policy_name]}: p99 down {100 * p99_cut:.0f} %")
    if not off["share"]:
        missed.append("burst off was never throttled: raise --workers or --spin-ms")
    print("missed targets: " + ("; ".join(missed) if missed else "none"))
    if args.json:
        print(json.dumps(results, indent=1))


if __name__ == "__main__":
    raise SystemExit(main())
