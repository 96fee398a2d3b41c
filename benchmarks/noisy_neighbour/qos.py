"""Noisy best-effort neighbour: does best-effort (BE) suppression keep a latency-sensitive probe
on the shared pool fast while BE hogs fill every CPU, and do the hogs keep running?

The latency probe (probe.py) runs in an LS group on the whole shared pool; the hogs (hog.py, one
busy process per CPU) in a BE group. Both are scratch groups `corepin-bench-<random>/...` in
the host's cgroup v1 cpuset, cpu and cpuacct hierarchies (removed afterwards, also after
Ctrl-C). The QoS engine (`corepin.enforcement.qos.QosEngine`) runs its period every
`--interval` seconds in a thread of this script, as a node's loop does, with the LS and BE
groups as its members and the BE group as the node's BE group.

Scenarios, interleaved within each round, all in the same run (figures: median over rounds):

1. `alone`: the probe with no hog (the baseline);
2. `BE hogs, suppression off`: policy `off` (the hogs have every CPU);
3. `BE hogs, suppression cpuset`: policy `cpuset` (`--slo` percent, `--min-cpus`): the BE
   group's cpuset shrinks to the budget;
4. `BE hogs, suppression cfsQuota`: the same budget as a CFS quota of the BE group.

The engine runs `--settle` seconds with the hogs before the probe starts (suppression in force).
The hogs' CPU is the BE group's cpuacct usage over the probe's run, in CPUs (they must keep
running: never 0). Both groups keep the default cpu.shares (1024): the probe never sleeps, so
CFS group scheduling already gives it most of a CPU, and the hogs show in its p99.9 (one time
slice, ~4 ms) more than in its p99.

`--via command` runs the same scenarios as users do, with a state directory of the benchmark's
own: the hogs as `corepin run --qos-class BE --shared`, the loop as `corepin reconcile
--interval --qos-config FILE`, the probe as `corepin run --shared` (class LS); the BE run's
cpuset is sampled every 50 ms while the probe runs (corepin's groups of that state directory
are removed afterwards).

Target (issue 17): p99 with suppression within 1.5x of the probe alone.

Usage: .venv/bin/python benchmarks/noisy_neighbour/qos.py [--rounds 3] [--iterations 20000]
       [--interval 0.5] [--via engine|command] [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # benchmarks/: _common, _qos_real

from _common import REPO  # noqa: E402
from _qos_real import (  # noqa: E402
    CPU,
    CPUACCT,
    CPUSET,
    Periodic,
    Scratch,
    host_engine,
    interrupts_as_keyboard,
    start,
    stop,
    why_not_real,
)
from corepin.agent.host.settings import CGROUP_PARENT  # noqa: E402
from corepin.agent.settings import state_dir_key  # noqa: E402
from corepin.allocation.qos import BeSuppress, QosPolicy  # noqa: E402
from corepin.enforcement.qos import QosMember  # noqa: E402

PROBE = HERE / "probe.py"
HOG = HERE / "hog.py"
PY = sys.executable
TARGET_P99 = 1.5

#: (name, BE policy or None for no hogs)
SCENARIOS: list[tuple[str, str | None]] = [
    ("alone", None),
    ("BE hogs, suppression off", "off"),
    ("BE hogs, suppression cpuset", "cpuset"),
    ("BE hogs, suppression cfsQuota", "cfsQuota"),
]


def run_probe(scratch: Scratch, ls: str, iterations: int) -> tuple[dict[str, Any], float]:
    """The probe in group `ls`; its result and its wall time (s)."""
    started = time.monotonic()
    done = subprocess.run(
        scratch.enter_argv(ls, [PY, str(PROBE), "--iterations", str(iterations)]),
        capture_output=True,
        text=True,
        timeout=900,
    )
    wall = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"probe failed ({done.returncode}): {done.stderr.strip()}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result, wall


def scenario(
    scratch: Scratch, tag: str, policy_name: str | None, args: argparse.Namespace
) -> dict[str, Any]:
    ls = scratch.group(f"ls-{tag}")
    if policy_name is None:
        result, _wall = run_probe(scratch, ls, args.iterations)
        result["be_cpus_used"] = None
        return result
    be = scratch.group(f"be-{tag}")
    engine, node = host_engine(be)
    policy = QosPolicy(
        be_suppress=BeSuppress(policy=policy_name, slo_percent=args.slo, min_cpus=args.min_cpus)
    )
    hogs = start(scratch.enter_argv(be, [PY, str(HOG), str(args.hogs)]), ready_line=True)
    members = [QosMember("probe", "LS", ls), QosMember("hogs", "BE", be)]
    loop = Periodic(lambda: engine.period(members, node, policy), args.interval)
    try:
        loop.start()
        time.sleep(args.settle)
        used_before, started = scratch.usage_ns(be), time.monotonic()
        result, _wall = run_probe(scratch, ls, args.iterations)
        used, ended = scratch.usage_ns(be) - used_before, time.monotonic()
        during = loop.between(started, ended)
    finally:
        try:
            loop.close()
        finally:
            stop(hogs)
    result["be_cpus_used"] = used / 1e9 / (ended - started)
    result["be_cpuset"] = sorted({str(r.be_cpus) for r in during if r.be_cpus is not None})
    result["be_quota_us"] = sorted({r.be_quota_us for r in during if r.be_quota_us is not None})
    result["periods"] = len(during)
    result["problems"] = sorted({p for r in during for p in r.problems})
    return result


# ---------------------------------------------------------------- the command path
def corepin(*argv: str) -> list[str]:
    return [PY, "-m", "corepin", *argv]


def group_of(pid: int, controller: str) -> str | None:
    """The process's group in a v1 hierarchy (relative), None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/cgroup").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        _, names, path = line.split(":", 2)
        if controller in names.split(","):
            return path.lstrip("/")
    return None


def scenario_command(
    state: Path, tag: str, policy_name: str | None, args: argparse.Namespace
) -> dict[str, Any]:
    """The same scenario as `corepin` users run it: `run --qos-class BE` for the hogs,
    `reconcile --interval` for the loop, `run --shared` (LS) for the probe."""
    probe = corepin("run", "--state-dir", str(state), "--shared", "--", PY, str(PROBE))
    probe += ["--iterations", str(args.iterations)]
    if policy_name is None:
        result, _wall = _run(probe)
        result["be_cpus_used"] = None
        return result
    policy = state.parent / f"qos-{tag}.json"
    policy.write_text(
        json.dumps(
            {
                "beSuppress": {
                    "policy": policy_name,
                    "sloPercent": args.slo,
                    "minCPUs": args.min_cpus,
                }
            }
        )
    )
    hogs = start(
        [
            *corepin("run", "--state-dir", str(state), "--qos-class", "BE", "--shared", "--"),
            PY,
            str(HOG),
            str(args.hogs),
        ],
        ready_line=True,
    )
    loop = None
    try:
        # `corepin run` stays the parent of CMD (it holds the allocation): the hog is its child
        hog = int(Path(f"/proc/{hogs.pid}/task/{hogs.pid}/children").read_text().split()[0])
        be = group_of(hog, "cpuacct")
        be_cpuset = group_of(hog, "cpuset")
        if be is None or be_cpuset is None:
            raise SystemExit("the BE run has no cgroup (is `corepin run` using cgroups?)")
        loop = subprocess.Popen(
            [
                *corepin("reconcile", "--state-dir", str(state), "--interval", str(args.interval)),
                "--qos-config",
                str(policy),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        time.sleep(args.settle)
        seen: list[str] = []
        sampling = threading.Event()

        def sample() -> None:
            while not sampling.wait(0.05):
                with contextlib.suppress(OSError):
                    seen.append((CPUSET / be_cpuset / "cpuset.cpus").read_text().strip())

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        used_before, started = Scratch.usage_ns(be), time.monotonic()
        try:
            result, _wall = _run(probe)
        finally:
            sampling.set()
            sampler.join()
        used, ended = Scratch.usage_ns(be) - used_before, time.monotonic()
    finally:
        if loop is not None:
            stop(loop)
        stop(hogs)
    out = loop.stdout.read() if loop is not None and loop.stdout is not None else ""
    result["be_cpus_used"] = used / 1e9 / (ended - started)
    counts = {c: seen.count(c) for c in sorted(set(seen))}
    result["be_cpuset"] = [
        f"{c} ({100 * n / len(seen):.0f} % of samples)" for c, n in counts.items()
    ]
    result["be_quota_us"] = []
    result["loop_lines"] = len(out.splitlines())
    result["problems"] = [line for line in out.splitlines() if "error" in line.lower()][:5]
    return result


def remove_state_groups(state: Path) -> None:
    """corepin's group of this state directory (`corepin/<key>`) where it is left empty."""
    rel = f"{CGROUP_PARENT}/{state_dir_key(str(state))}"
    for mount in (CPUSET, CPU, CPUACCT):
        top = mount / rel
        if top.is_dir():
            for d in sorted((d for d, _s, _f in os.walk(top)), key=lambda x: -x.count(os.sep)):
                with contextlib.suppress(OSError):
                    os.rmdir(d)


def _run(cmd: list[str]) -> tuple[dict[str, Any], float]:
    started = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    wall = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"probe failed ({done.returncode}): {done.stderr.strip()}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result, wall


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=20000)
    parser.add_argument("--interval", type=float, default=0.5, help="QoS period, seconds")
    parser.add_argument("--settle", type=float, default=2.0, help="engine runs before the probe")
    parser.add_argument("--slo", type=int, default=65, help="beSuppress.sloPercent")
    parser.add_argument("--min-cpus", type=int, default=1, help="beSuppress.minCPUs")
    parser.add_argument("--hogs", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument(
        "--via",
        choices=("engine", "command"),
        default="engine",
        help="engine: QosEngine.period in a thread of this script, on scratch groups; command: "
        "`corepin run --qos-class BE`, `corepin reconcile --interval`, `corepin run --shared` "
        "with a state directory of the benchmark's own",
    )
    parser.add_argument("--quick", action="store_true", help="smoke run: 1 round, short probe")
    parser.add_argument("--json", action="store_true", help="also print the raw results")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.iterations, args.settle = 1, 3000, 1.0
    problem = why_not_real()
    if problem is not None:
        print(f"noisy neighbour, QoS: skipped: {problem}")
        return 0
    interrupts_as_keyboard()
    results: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in SCENARIOS}
    if args.via == "command":
        tmp = Path(tempfile.mkdtemp(prefix="corepin-bench-qos-"))
        try:
            for rnd in range(args.rounds):
                for i, (name, policy_name) in enumerate(SCENARIOS):
                    got = scenario_command(tmp / "state", f"{rnd}-{i}", policy_name, args)
                    results[name].append(got)
        finally:
            remove_state_groups(tmp / "state")
            shutil.rmtree(tmp, ignore_errors=True)
        report(results, args)
        return 0
    scratch = Scratch()
    try:
        for rnd in range(args.rounds):
            for i, (name, policy_name) in enumerate(SCENARIOS):
                results[name].append(scenario(scratch, f"{rnd}-{i}", policy_name, args))
    finally:
        scratch.close()
    report(results, args)
    return 0


def report(results: dict[str, list[dict[str, Any]]], args: argparse.Namespace) -> None:
    cpus = len(os.sched_getaffinity(0))
    load = os.getloadavg()
    print(
        f"noisy neighbour, QoS: {cpus} CPUs, {args.hogs} BE hogs, probe {args.iterations} steps "
        f"(LS, shared pool), QoS period {args.interval} s "
        + ("in the benchmark" if args.via == "engine" else "(`corepin reconcile --interval`)")
        + f", sloPercent "
        f"{args.slo}, minCPUs {args.min_cpus}, {args.rounds} rounds (median), 1-min load "
        f"average at the end {load[0]:.2f}; checkout {REPO}"
    )
    print(
        "| scenario | p50 us | p99 us | p99.9 us | p50 / alone | p99 / alone | p99.9 / alone | "
        "BE hogs got (CPUs) | BE cpuset / quota in force |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|")
    med: dict[str, dict[str, float]] = {}
    for name, runs in results.items():
        med[name] = {
            k: statistics.median(r[k] for r in runs) for k in ("p50_us", "p99_us", "p999_us")
        }
    alone = med["alone"]
    missed = []
    for name, runs in results.items():
        m = med[name]
        used = [r["be_cpus_used"] for r in runs if r["be_cpus_used"] is not None]
        got = f"{statistics.median(used):.2f}" if used else "-"
        force = "-"
        if runs[-1].get("be_cpuset") or runs[-1].get("be_quota_us"):
            quotas = runs[-1]["be_quota_us"]
            force = " ".join(
                [f"cpus {c}" for c in runs[-1]["be_cpuset"]]
                + ([f"quota {min(quotas)}-{max(quotas)} us"] if quotas else [])
            )
        if runs[-1].get("loop_lines") is not None:
            force += f"; reconcile printed {runs[-1]['loop_lines']} lines"
        p99_ratio = m["p99_us"] / alone["p99_us"]
        print(
            f"| {name} | {m['p50_us']:.1f} | {m['p99_us']:.1f} | {m['p999_us']:.1f} | "
            f"{m['p50_us'] / alone['p50_us']:.2f}x | {p99_ratio:.2f}x | "
            f"{m['p999_us'] / alone['p999_us']:.2f}x | {got} | {force} |"
        )
        if "suppression" in name and "off" not in name:
            if p99_ratio > TARGET_P99:
                missed.append(f"{name}: p99 {p99_ratio:.2f}x of alone (target <= {TARGET_P99}x)")
            if used and min(used) <= 0.01:
                missed.append(f"{name}: the BE hogs stopped (got {min(used):.3f} CPUs)")
        problems = sorted({p for r in runs for p in r.get("problems", [])})
        for p in problems:
            print(f"  engine problem in {name}: {p}")
    print("\nmissed targets: " + ("; ".join(missed) if missed else "none"))
    if args.json:
        print(json.dumps(results, indent=1))


if __name__ == "__main__":
    raise SystemExit(main())
