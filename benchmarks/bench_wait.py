"""Waiting in host mode: `corepin run --wait` and the state lock's line (issue 14).

Prints three figures, each beside a baseline measured in the same run:

1. CPU time one `corepin run --exclusive 1 --wait` uses over a 3 s wait while every CPU is
   held (from /proc/PID/stat of the waiter, counted from the moment it says it waits), for
   the head of the line and the run behind it; baseline: `sleep 3` (target: < 0.1 s);
2. the makespan of 20 concurrent `corepin run --exclusive 1 --wait -- sleep 0.3` on a machine
   of 2 CPUs (a stand-in sysfs with 2 of this machine's CPUs), from their launch to the last
   exit; baselines: the ideal (20 x 0.3 s / 2) and `xargs -P 2` running the same 20 sleeps
   (target: <= 2x the ideal);
3. how long `corepin reconcile --once` takes when a `corepin run` stopped with SIGSTOP sits at
   the head of the state lock's line, and when a waiter that never takes the lock does;
   baseline: `reconcile --once` with nobody in line (target: delay <= ~1 s).

Everything runs against scratch state directories in tmp with `--cgroups off`; the only
processes signalled are the ones this script started.

Usage: .venv/bin/python benchmarks/bench_wait.py [--src DIR] [--waiters 20]
(`--src`: run the corepin of another checkout's src/, e.g. to measure an older version.)
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TICK = os.sysconf("SC_CLK_TCK")

HOLDER = """
    import sys
    from corepin.state import StateStore
    with StateStore(sys.argv[1]).lock(timeout=60):
        print("locked", flush=True)
        sys.stdin.readline()
"""
SQUATTER = """
    import os, sys
    from corepin.state.lock import QUEUE_DIR, _open_queue, _take_ticket
    dir_fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY)
    _take_ticket(_open_queue(dir_fd, os.path.join(sys.argv[1], QUEUE_DIR)))
    print("queued", flush=True)
    sys.stdin.readline()
"""


class Bench:
    def __init__(self, src: Path, tmp: Path) -> None:
        self.tmp = tmp
        self.env = {**os.environ, "PYTHONPATH": str(src), "COREPIN_CGROUPS": "off"}
        self.env.pop("COREPIN_STATE_DIR", None)
        self.started: list[subprocess.Popen[str]] = []

    def corepin(self, state: Path, *args: str) -> list[str]:
        return [sys.executable, "-m", "corepin", args[0], "--state-dir", str(state), *args[1:]]

    def spawn(self, argv: list[str], **kw: object) -> subprocess.Popen[str]:
        p = subprocess.Popen(argv, env=self.env, text=True, **kw)  # type: ignore[call-overload]
        self.started.append(p)
        return p  # type: ignore[no-any-return]

    def python(self, code: str, *args: str) -> subprocess.Popen[str]:
        argv = [sys.executable, "-c", textwrap.dedent(code), *args]
        return self.spawn(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def block_all(self, state: Path, cpus: str, *extra: str) -> subprocess.Popen[str]:
        """A run holding `cpus` until killed; returned once it is recorded."""
        blocker = self.spawn(
            self.corepin(state, "run", *extra, "--cpus", cpus, "--", "sleep", "600"),
            start_new_session=True,
        )
        deadline = time.monotonic() + 30
        while not (state / "state.json").exists():
            if time.monotonic() > deadline or blocker.poll() is not None:
                raise SystemExit("the blocking run did not start")
            time.sleep(0.05)
        time.sleep(0.2)
        return blocker

    def stop_all(self) -> None:
        """End what this script started and is still running (a run's group: its command)."""
        for p in self.started:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signal.SIGCONT)
                    if _leads(p.pid):
                        os.killpg(p.pid, signal.SIGTERM)
                    else:
                        p.terminate()
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()


def _leads(pid: int) -> bool:
    try:
        return os.getpgid(pid) == pid
    except ProcessLookupError:
        return False


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def waiter_cpu(b: Bench, cpus: str, seconds: float) -> tuple[float, float, float]:
    """CPU used over `seconds` by the head of the line, the run behind it, and `sleep`."""
    state = b.tmp / "cpu"
    blocker = b.block_all(state, cpus)
    waiters = []
    for _ in range(2):
        w = b.spawn(
            b.corepin(state, "run", "--exclusive", "1", "--wait", "120", "--", "true"),
            stderr=subprocess.PIPE,
        )
        assert w.stderr is not None
        line = w.stderr.readline()
        if "waiting for CPUs" not in line:
            raise SystemExit(f"the waiter did not wait: {line!r}")
        waiters.append(w)
    sleeper = b.spawn(["sleep", str(seconds)])
    before = [cpu_seconds(w.pid) for w in waiters]
    time.sleep(seconds)
    used = [cpu_seconds(w.pid) - t for w, t in zip(waiters, before, strict=True)]
    base = cpu_seconds(sleeper.pid) if sleeper.poll() is None else 0.0
    os.killpg(blocker.pid, signal.SIGTERM)
    for w in waiters:
        w.wait(timeout=60)
    return used[0], used[1], base


def makespan(b: Bench, cpus: list[int], count: int, each: float) -> tuple[float, float, int]:
    """Wall time of `count` concurrent waiters of `each` seconds on a 2-CPU stand-in machine,
    of `xargs -P 2` running the same sleeps, and how many runs failed."""
    from corepin.testing.sysfs_tree import write_sysfs_tree
    from corepin.topology.model import CPUInfo, Topology

    sysfs = b.tmp / "sysfs"
    write_sysfs_tree(Topology([CPUInfo(c, socket=0, die=0, numa=0, core=c) for c in cpus]), sysfs)
    state = b.tmp / "makespan"
    argv = ["run", "--sysfs-root", str(sysfs), "--exclusive", "1", "--wait", "120"]
    began = time.monotonic()
    runs = [
        b.spawn(b.corepin(state, *argv, "--", "sleep", str(each)), stderr=subprocess.DEVNULL)
        for _ in range(count)
    ]
    failed = sum(1 for r in runs if r.wait(timeout=300) != 0)
    took = time.monotonic() - began
    began = time.monotonic()
    subprocess.run(
        ["xargs", "-P", "2", "-n", "1", "sleep"],
        input=" ".join([str(each)] * count),
        text=True,
        check=True,
    )
    return took, time.monotonic() - began, failed


def reconcile_time(b: Bench, state: Path, timeout: str) -> tuple[float, int]:
    env = {**b.env, "COREPIN_LOCK_TIMEOUT": timeout}
    began = time.monotonic()
    done = subprocess.run(
        b.corepin(state, "reconcile", "--once"), env=env, capture_output=True, text=True
    )
    return time.monotonic() - began, done.returncode


def stopped_head(b: Bench, timeout: str) -> tuple[float, int, float, int, float, int]:
    """reconcile --once behind a stopped run, behind a squatter, and with nobody in line."""
    state = b.tmp / "lock"
    idle, idle_rc = reconcile_time(b, state, timeout)  # also creates the state directory
    idle, idle_rc = reconcile_time(b, state, timeout)
    holder = b.python(HOLDER, str(state))
    assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
    run = b.spawn(b.corepin(state, "run", "--exclusive", "1", "--", "true"))
    queue = state / "state.lock.queue"
    deadline = time.monotonic() + 30
    while not [n for n in os.listdir(queue) if not n.startswith(".")]:
        if time.monotonic() > deadline:
            raise SystemExit("the run did not queue for the lock")
        time.sleep(0.01)
    os.kill(run.pid, signal.SIGSTOP)
    assert holder.stdin is not None
    holder.stdin.write("go\n")
    holder.stdin.flush()
    holder.wait(timeout=10)
    stopped, stopped_rc = reconcile_time(b, state, timeout)
    os.kill(run.pid, signal.SIGCONT)
    run.wait(timeout=60)
    squatter = b.python(SQUATTER, str(state))
    assert squatter.stdout is not None and squatter.stdout.readline().strip() == "queued"
    slow, slow_rc = reconcile_time(b, state, timeout)
    assert squatter.stdin is not None
    squatter.stdin.write("go\n")
    squatter.stdin.flush()
    squatter.wait(timeout=10)
    return stopped, stopped_rc, slow, slow_rc, idle, idle_rc


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", type=Path, default=REPO / "src", help="corepin's src/ to run")
    parser.add_argument("--waiters", type=int, default=20)
    parser.add_argument("--each", type=float, default=0.3, help="seconds each waiter runs")
    parser.add_argument("--lock-timeout", default="12", help="COREPIN_LOCK_TIMEOUT for (3)")
    args = parser.parse_args()
    online = sorted(os.sched_getaffinity(0))
    if len(online) < 2:
        print("needs at least two CPUs")
        return 2
    sys.path.insert(0, str(REPO / "src"))
    tmp = Path(tempfile.mkdtemp(prefix="corepin-bench-wait-"))
    b = Bench(args.src.resolve(), tmp)
    try:
        load = os.getloadavg()
        print(f"corepin from {args.src}; load average before: {load[0]:.2f} {load[1]:.2f}")
        every = ",".join(str(c) for c in online)
        head, second, base = waiter_cpu(b, every, 3.0)
        print("1. CPU used over a 3 s wait (target < 0.1 s)")
        print(f"   head of the line     {head:6.2f} s")
        print(f"   second in line       {second:6.2f} s")
        print(f"   baseline: sleep 3    {base:6.2f} s")
        took, xargs, failed = makespan(b, online[:2], args.waiters, args.each)
        ideal = args.waiters * args.each / 2
        print(f"2. {args.waiters} waiters of {args.each} s on 2 CPUs (target <= 2x ideal)")
        print(
            f"   corepin run --wait   {took:6.2f} s = {took / ideal:.2f}x ideal ({failed} failed)"
        )
        print(f"   baseline: xargs -P 2 {xargs:6.2f} s = {xargs / ideal:.2f}x ideal")
        print(f"   ideal                {ideal:6.2f} s")
        stopped, s_rc, slow, slow_rc, idle, idle_rc = stopped_head(b, args.lock_timeout)
        print("3. reconcile --once with a waiter at the head of the lock's line (target ~1 s)")
        print(
            f"   behind a stopped run {stopped:6.2f} s (exit {s_rc}), delay {stopped - idle:.2f} s"
        )
        print(f"   behind a slow waiter {slow:6.2f} s (exit {slow_rc}), delay {slow - idle:.2f} s")
        print(f"   baseline: no line    {idle:6.2f} s (exit {idle_rc})")
    finally:
        b.stop_all()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
