"""Noisy neighbour: does `corepin run --exclusive` protect a latency-sensitive probe from a hog?

Scenarios (each `--rounds` times, figures are the median over rounds):

1. `idle`: the probe alone (reference).
2. `unmanaged`: the probe beside a CPU hog with one busy process per online CPU, both left to
   the scheduler.
3. `corepin`: the hog started with `corepin run --shared`, then the probe with
   `corepin run --exclusive 1`; the hog is re-pinned to the shrunken shared pool when the probe
   takes its CPU (on a 2-CPU machine: probe on one CPU, both hog processes on the other).

The probe (probe.py) times a fixed small compute step (default 20k iterations) and reports
p50/p99 of the per-iteration wall time. The hog's own progress is the other side of the trade:
its spin rate is not measured here, only that it keeps running.

Usage: .venv/bin/python benchmarks/noisy_neighbour/run.py [--rounds 3] [--iterations 20000]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PROBE = HERE / "probe.py"
HOG = HERE / "hog.py"
PY = sys.executable


def corepin(*args: str) -> list[str]:
    return [PY, "-m", "corepin", *args]


def probe_cmd(iterations: int) -> list[str]:
    return [PY, str(PROBE), "--iterations", str(iterations)]


def run_probe(cmd: list[str]) -> dict[str, Any]:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"probe failed ({done.returncode}): {done.stderr.strip()}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def start_hog(cmd: list[str]) -> subprocess.Popen[str]:
    hog = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert hog.stdout is not None
    line = hog.stdout.readline()  # "hog: N spinners on CPUs [...]": it is running
    if not line:
        raise SystemExit(f"hog did not start: {hog.stderr.read() if hog.stderr else ''}")
    time.sleep(0.3)
    return hog


def stop_hog(hog: subprocess.Popen[str]) -> None:
    hog.send_signal(signal.SIGTERM)
    try:
        hog.wait(timeout=20)
    except subprocess.TimeoutExpired:
        hog.kill()
        hog.wait()


def scenario_idle(iterations: int, _state: Path, _n: int) -> dict[str, Any]:
    return run_probe(probe_cmd(iterations))


def scenario_unmanaged(iterations: int, _state: Path, n: int) -> dict[str, Any]:
    hog = start_hog([PY, str(HOG), str(n)])
    try:
        return run_probe(probe_cmd(iterations))
    finally:
        stop_hog(hog)


def scenario_corepin(iterations: int, state: Path, n: int) -> dict[str, Any]:
    hog = start_hog(
        corepin("run", "--state-dir", str(state), "--shared", "--", PY, str(HOG), str(n))
    )
    try:
        probe = subprocess.Popen(
            corepin("run", "--state-dir", str(state), "--exclusive", "1", "--")
            + probe_cmd(iterations),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        time.sleep(0.5)
        hog_cpus = _hog_affinity(state)  # sampled while the probe runs
        out, err = probe.communicate(timeout=600)
        if probe.returncode != 0:
            raise SystemExit(f"probe failed ({probe.returncode}): {err.strip()}")
        result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
        result["hog_affinity_during"] = hog_cpus
        return result
    finally:
        stop_hog(hog)


def _hog_affinity(state: Path) -> str:
    """Cpus_allowed_list of the hog's processes (from /proc, via the report's pid)."""
    done = subprocess.run(
        corepin("report", "--state-dir", str(state), "-o", "json"),
        capture_output=True,
        text=True,
    )
    data = json.loads(done.stdout)
    seen = set()
    for a in data["allocations"]:
        if a["exclusive"]:
            continue
        for line in Path(f"/proc/{a['pid']}/status").read_text().splitlines():
            if line.startswith("Cpus_allowed_list:"):
                seen.add(line.split(":", 1)[1].strip())
    return ";".join(sorted(seen))


SCENARIOS = {
    "idle (probe alone)": scenario_idle,
    "unmanaged (probe + hog)": scenario_unmanaged,
    "corepin (probe --exclusive 1, hog --shared)": scenario_corepin,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=20000)
    parser.add_argument(
        "--hog-processes", type=int, default=len(os.sched_getaffinity(0)), metavar="N"
    )
    parser.add_argument("--json", action="store_true", help="also print the raw results")
    args = parser.parse_args()
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in SCENARIOS}
    with tempfile.TemporaryDirectory(prefix="corepin-noisy-") as tmp:
        for rnd in range(args.rounds):
            for name, scenario in SCENARIOS.items():
                state = Path(tmp) / f"state-{rnd}"
                results[name].append(scenario(args.iterations, state, args.hog_processes))
    cpus = len(os.sched_getaffinity(0))
    load = os.getloadavg()
    print(
        f"noisy neighbour: {cpus} CPUs, hog = {args.hog_processes} busy processes, probe = "
        f"{args.iterations} steps, {args.rounds} rounds (median), 1-min load average at the end "
        f"{load[0]:.2f}"
    )
    header = f"| {'scenario':<44} | {'p50 us':>8} | {'p99 us':>9} | {'p99.9 us':>9} | probe CPUs |"
    print(header)
    print("|" + "|".join("-" * (len(c)) for c in header.split("|")[1:-1]) + "|")
    med: dict[str, dict[str, float]] = {}
    for name, runs in results.items():
        med[name] = {
            k: statistics.median(r[k] for r in runs) for k in ("p50_us", "p99_us", "p999_us")
        }
        where = runs[-1]["affinity"]
        print(
            f"| {name:<44} | {med[name]['p50_us']:8.1f} | {med[name]['p99_us']:9.1f} | "
            f"{med[name]['p999_us']:9.1f} | {where:<10} |"
        )
    un = med["unmanaged (probe + hog)"]
    cp = med["corepin (probe --exclusive 1, hog --shared)"]
    p50_ratio = un["p50_us"] / cp["p50_us"]
    p99_ratio = un["p99_us"] / cp["p99_us"]
    print(f"p50 unmanaged / corepin: {p50_ratio:.2f}x")
    verdict = ">= 2x: pass" if p99_ratio >= 2 else "below 2x"
    print(f"p99 unmanaged / corepin: {p99_ratio:.1f}x ({verdict})")
    hog_where = results["corepin (probe --exclusive 1, hog --shared)"][-1]["hog_affinity_during"]
    print(f"hog shared pool while the probe ran: CPUs {hog_where}")
    if args.json:
        print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
