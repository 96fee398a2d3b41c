"""Noisy neighbour with the shield: is an exclusive CPU really exclusive when the neighbours
are tasks corepin does not manage?

A latency probe (probe.py) runs with `corepin run --exclusive 1` while 3 CPU hogs (hog.py)
run in the shield's scope. On this host the scope is a scratch cpuset group holding only the
benchmark's own processes (`corepin-bench-<random>`); `--whole-machine` shields the whole
hierarchy instead, which only a machine that is yours may do (a test-bed guest:
`--this-machine-is-mine` is required with it).

Scenarios, interleaved within each round, all in the same run (figures: median over rounds):

1. `alone`: the probe with no hog anywhere (its CPU idle but for the host itself);
2. `unmanaged`: 3 hogs started in the scope, not managed by corepin, no shield: they run on
   the probe's "exclusive" CPU too;
3. `unmanaged, shielded`: the same hogs, `corepin shield on --scope S` before the probe: they
   are moved to the system set, which gives up the probe's CPU before the probe starts;
4. `managed --shared`: the hogs started with `corepin run --shared` (re-pinned off the probe's
   CPU by corepin itself), no shield;
5. `managed --shared, shielded`: the same with the shield on.

Targets (issue 11): shielded p50 within 1.15x and p99 within 1.3x of `alone`.

A second part times `corepin shield on` and `off` (the whole command, as an operator waits for
it) on a scope holding 1,000 sleeping processes of the benchmark's own (target: <= 1 s each).

Usage: .venv/bin/python benchmarks/noisy_neighbour/shield.py [--rounds 3] [--iterations 20000]
       [--tasks 1000] [--skip-tasks]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PROBE = HERE / "probe.py"
HOG = HERE / "hog.py"
PY = sys.executable
CPUSET = Path("/sys/fs/cgroup/cpuset")
HOGS = 3


def corepin(*args: str) -> list[str]:
    return [PY, "-m", "corepin", *args]


class Scope:
    """Where the hogs live: a scratch cpuset group (or, --whole-machine, the root)."""

    def __init__(self, whole: bool) -> None:
        self.whole = whole
        self.name = "" if whole else f"corepin-bench-{uuid.uuid4().hex[:8]}"
        self.path = CPUSET / self.name if not whole else None
        if self.path is not None:
            self.path.mkdir()
            for f in ("cpuset.cpus", "cpuset.mems"):
                (self.path / f).write_text((CPUSET / f).read_text())

    def enter_argv(self, argv: list[str]) -> list[str]:
        """`argv` started inside the scope."""
        if self.path is None:
            return argv
        return ["sh", "-c", f'echo $$ > "{self.path}/cgroup.procs" && exec "$@"', "sh", *argv]

    def shield_args(self) -> list[str]:
        return [] if self.whole else ["--scope", self.name]

    def close(self) -> None:
        if self.path is None:
            return
        for _ in range(100):
            with contextlib.suppress(OSError):
                for d in sorted(
                    (d for d, _s, _f in os.walk(self.path)), key=lambda x: -x.count("/")
                ):
                    os.rmdir(d)
                return
            time.sleep(0.05)


def start_hogs(argv: list[str]) -> subprocess.Popen[str]:
    hog = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    assert hog.stdout is not None
    if not hog.stdout.readline():
        raise SystemExit(f"hogs did not start: {hog.stderr.read() if hog.stderr else ''}")
    time.sleep(0.3)
    return hog


def stop(proc: subprocess.Popen[Any]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def probe(state: str, iterations: int) -> dict[str, Any]:
    done = subprocess.run(
        corepin(
            "run",
            "--state-dir",
            state,
            "--exclusive",
            "1",
            "--",
            PY,
            str(PROBE),
            "--iterations",
            str(iterations),
        ),
        capture_output=True,
        text=True,
        timeout=900,
    )
    if done.returncode != 0:
        raise SystemExit(f"probe failed ({done.returncode}): {done.stderr.strip()}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def shield(state: str, action: str, scope: Scope) -> None:
    extra = scope.shield_args() if action == "on" else []
    done = subprocess.run(
        corepin("shield", action, "--state-dir", state, *extra), capture_output=True, text=True
    )
    if done.returncode != 0:
        raise SystemExit(f"shield {action} failed: {done.stdout} {done.stderr}")


def scenario(
    name: str, scope: Scope, state: str, iterations: int, *, hogs: str | None, shielded: bool
) -> dict[str, Any]:
    hog = None
    try:
        if hogs == "unmanaged":
            hog = start_hogs(scope.enter_argv([PY, str(HOG), str(HOGS)]))
        elif hogs == "managed":
            hog = start_hogs(
                scope.enter_argv(
                    corepin("run", "--state-dir", state, "--shared", "--", PY, str(HOG), str(HOGS))
                )
            )
        if shielded:
            shield(state, "on", scope)
        return probe(state, iterations)
    finally:
        if shielded:
            shield(state, "off", scope)
        if hog is not None:
            stop(hog)


SCENARIOS: list[tuple[str, str | None, bool]] = [
    ("alone", None, False),
    ("unmanaged", "unmanaged", False),
    ("unmanaged, shielded", "unmanaged", True),
    ("managed --shared", "managed", False),
    ("managed --shared, shielded", "managed", True),
]


def sleepers(scope: Scope, count: int) -> subprocess.Popen[str]:
    """A parent in the scope that forks `count` sleeping children (each just pauses)."""
    code = (
        "import os, signal, sys\n"
        f"n = {count}\n"
        "kids = []\n"
        "for _ in range(n):\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        "        signal.pause(); os._exit(0)\n"
        "    kids.append(pid)\n"
        "print('ready', flush=True)\n"
        "sys.stdin.read()\n"
        "for k in kids: os.kill(k, 9)\n"
        "for k in kids: os.waitpid(k, 0)\n"
    )
    proc = subprocess.Popen(
        scope.enter_argv([PY, "-c", code]),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != "ready":
        raise SystemExit("the sleepers did not start")
    return proc


def time_on_off(
    scope: Scope, state: str, count: int, repeat: int
) -> tuple[list[float], list[float]]:
    parent = sleepers(scope, count)
    ons, offs = [], []
    try:
        for _ in range(repeat):
            t = time.perf_counter()
            shield(state, "on", scope)
            ons.append(time.perf_counter() - t)
            t = time.perf_counter()
            shield(state, "off", scope)
            offs.append(time.perf_counter() - t)
    finally:
        assert parent.stdin is not None
        parent.stdin.close()
        parent.wait(timeout=60)
    return ons, offs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=20000)
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3, help="on/off timings")
    parser.add_argument("--skip-tasks", action="store_true", help="no 1,000-task timing")
    parser.add_argument("--whole-machine", action="store_true")
    parser.add_argument("--this-machine-is-mine", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.whole_machine and not args.this_machine_is_mine:
        parser.error(
            "--whole-machine shields every task of this machine: only in a machine "
            "that is yours (a guest), with --this-machine-is-mine"
        )
    if len(os.sched_getaffinity(0)) < 2:
        raise SystemExit("needs at least 2 CPUs")
    tmp = tempfile.mkdtemp(prefix="corepin-bench-shield-")
    state = str(Path(tmp) / "state")
    scope = Scope(args.whole_machine)
    results: dict[str, list[dict[str, Any]]] = {name: [] for name, _, _ in SCENARIOS}
    timing: tuple[list[float], list[float]] | None = None
    try:
        for _ in range(args.rounds):
            for name, hogs, shielded in SCENARIOS:
                results[name].append(
                    scenario(name, scope, state, args.iterations, hogs=hogs, shielded=shielded)
                )
        if not args.skip_tasks:
            timing = time_on_off(scope, state, args.tasks, args.repeat)
    finally:
        with contextlib.suppress(SystemExit):
            shield(state, "off", scope)
        scope.close()
        shutil.rmtree(tmp, ignore_errors=True)
    load = os.getloadavg()
    where = "the whole machine" if args.whole_machine else f"scratch scope /{scope.name}"
    print(
        f"noisy neighbour, shield: {len(os.sched_getaffinity(0))} CPUs, {HOGS} hogs in "
        f"{where}, probe {args.iterations} steps, {args.rounds} rounds (median), 1-min load "
        f"average at the end {load[0]:.2f}"
    )
    print("| scenario | p50 us | p99 us | p99.9 us | p50 / alone | p99 / alone | probe CPU |")
    print("|---|---:|---:|---:|---:|---:|---|")
    med: dict[str, dict[str, float]] = {}
    for name, runs in results.items():
        med[name] = {
            k: statistics.median(r[k] for r in runs) for k in ("p50_us", "p99_us", "p999_us")
        }
    alone = med["alone"]
    for name, runs in results.items():
        m = med[name]
        print(
            f"| {name} | {m['p50_us']:.1f} | {m['p99_us']:.1f} | {m['p999_us']:.1f} | "
            f"{m['p50_us'] / alone['p50_us']:.2f}x | {m['p99_us'] / alone['p99_us']:.2f}x | "
            f"{runs[-1]['affinity']} |"
        )
    for name in ("unmanaged, shielded", "managed --shared, shielded"):
        m = med[name]
        p50, p99 = m["p50_us"] / alone["p50_us"], m["p99_us"] / alone["p99_us"]
        verdict = "pass" if p50 <= 1.15 and p99 <= 1.3 else "MISS"
        print(f"{name}: p50 {p50:.2f}x (<= 1.15x), p99 {p99:.2f}x (<= 1.3x): {verdict}")
    if timing is not None:
        ons, offs = timing
        print(
            f"shield on / off with {args.tasks} sleeping tasks in the scope (whole command, "
            f"{len(ons)} times): on median {statistics.median(ons):.3f} s (max {max(ons):.3f}), "
            f"off median {statistics.median(offs):.3f} s (max {max(offs):.3f}); target <= 1 s: "
            + ("pass" if max(statistics.median(ons), statistics.median(offs)) <= 1.0 else "MISS")
        )
    if args.json:
        print(json.dumps({"results": results, "timing": timing}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
