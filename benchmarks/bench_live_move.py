"""A live move of a running exclusive run: from the decision to every thread of its process tree
on the new CPUs, through the executor `corepin reconcile --rebalance` uses
(`corepin.agent.host.rebalance.execute`: state transaction, cpuset cgroup in place, every
thread's affinity, the shared runs re-pinned).

Target (issue 19): median <= 50 ms over 50 moves, with no moment where the run has no CPU or
shares one with another exclusive run.

Set-up, all made by the bench and removed afterwards (even on failure): a scratch state
directory, a scratch cpuset cgroup parent `corepin-test-bench-<pid>`, an exclusive run
(`corepin run --cpus 0`, through the same Runner) whose command is a process tree of 2
processes with 3 busy threads each, and a shared run (`sleep`) in the shared pool. The run is
moved `--moves` times between two CPU sets, {0} and {1} by default: on a 2-CPU machine these
are the only two sets a 1-CPU run can move between (give others with --cpus-a/--cpus-b on a
bigger machine).

Each move: the clock starts at the decision (the Move is made), `execute` runs, and then
/proc/<pid>/task/*/status (Cpus_allowed_list) of every thread of the tree is read until all of
them are on the new CPUs; that time is one sample. Meanwhile a sampler thread reads every
thread's Cpus_allowed_list in a loop and counts samples where a thread had no CPU, or was on a
CPU that is neither the old nor the new set (another exclusive run's, or the shared pool's).

Baseline (same run, same threads): the run's cgroup is widened to both sets, and then a bare
`sched_setaffinity` of every thread of the tree from one set to the other, timed the same way
(decision to all threads seen on the new set) - the floor of any move that pins thread by
thread.

Usage (root, cpuset cgroups): .venv/bin/python benchmarks/bench_live_move.py [--moves 50]
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
import threading
import time
from pathlib import Path

from _common import median, percentile
from corepin.agent.host.agent import HostAgent
from corepin.agent.host.rebalance import execute
from corepin.agent.host.settings import HostSettings
from corepin.allocation.alignment import alignment_of
from corepin.allocation.rebalance import Move
from corepin.core.cpuset import CPUSet

TARGET_MS = 50.0

#: The run's command: 2 processes (a fork), 3 busy threads each, until killed.
TREE = (
    "import os, threading\n"
    "def spin():\n"
    "    while True: pass\n"
    "os.fork()\n"
    "for _ in range(3): threading.Thread(target=spin, daemon=True).start()\n"
    "threading.Event().wait()\n"
)

#: Runs `corepin run` through the Runner with the bench's settings (a scratch cgroup parent).
DRIVER = (
    "import sys\n"
    "from corepin.agent.host.agent import HostAgent\n"
    "from corepin.agent.host.run import Runner, RunSpec\n"
    "from corepin.agent.host.settings import HostSettings\n"
    "from corepin.core.cpuset import CPUSet\n"
    "s = HostSettings(state_dir=sys.argv[1], cgroups='on', cgroup_parent=sys.argv[2])\n"
    "cpus = CPUSet.parse(sys.argv[3]) if sys.argv[3] else None\n"
    "sys.exit(Runner(HostAgent(s)).run(sys.argv[4:], RunSpec(cpus=cpus)))\n"
)


def affinity_of(pid: int) -> dict[int, CPUSet]:
    """tid -> Cpus_allowed_list of every thread of `pid` (threads gone meanwhile are left out)."""
    out: dict[int, CPUSet] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/status", encoding="ascii") as handle:
                for line in handle:
                    if line.startswith("Cpus_allowed_list:"):
                        out[int(tid)] = CPUSet.parse(line.split(":", 1)[1].strip())
                        break
        except OSError:
            continue
    return out


def tree_threads(pids: list[int]) -> dict[int, CPUSet]:
    out: dict[int, CPUSet] = {}
    for pid in pids:
        out.update(affinity_of(pid))
    return out


class Sampler(threading.Thread):
    """Reads every thread's affinity in a loop; counts samples with no CPU, with a CPU outside
    both sets `a` and `b` the run moves between (another run's), and on both sets at once (a
    moment where the run may run on the CPUs the shared run is on)."""

    def __init__(self, pids: list[int], a: CPUSet, b: CPUSet) -> None:
        super().__init__(daemon=True)
        self.pids = pids
        self.a, self.b = a, b
        self.stop = threading.Event()
        self.samples = 0
        self.empty = 0
        self.outside = 0
        self.both = 0

    def run(self) -> None:
        while not self.stop.is_set():
            for cpus in tree_threads(self.pids).values():
                self.samples += 1
                if not cpus:
                    self.empty += 1
                elif not cpus <= self.a | self.b:
                    self.outside += 1
                elif cpus & self.a and cpus & self.b:
                    self.both += 1


def wait_on(pids: list[int], cpus: CPUSet, count: int, deadline: float = 5.0) -> None:
    """Until all `count` threads of `pids` show `cpus` (RuntimeError after `deadline` s)."""
    end = time.monotonic() + deadline
    while True:
        seen = tree_threads(pids)
        if len(seen) >= count and all(c == cpus for c in seen.values()):
            return
        if time.monotonic() > end:
            raise RuntimeError(f"threads not on {cpus}: {seen}")


def start(state: str, parent: str, cpus: str, argv: list[str]) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent / "src"))
    return subprocess.Popen([sys.executable, "-c", DRIVER, state, parent, cpus, *argv], env=env)


def summary(label: str, ms: list[float]) -> str:
    ms = sorted(ms)
    return (
        f"  {label:<44} median {median(ms):7.2f} ms   p95 {percentile(ms, 95):7.2f} ms   "
        f"min {ms[0]:6.2f}   max {ms[-1]:7.2f}   (n={len(ms)})"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--moves", type=int, default=50)
    parser.add_argument("--cpus-a", default="0", help="one CPU set (default: 0)")
    parser.add_argument("--cpus-b", default="1", help="the other (default: 1)")
    args = parser.parse_args()
    a, b = CPUSet.parse(args.cpus_a), CPUSet.parse(args.cpus_b)
    online = CPUSet(os.sched_getaffinity(0))
    cpuset_root = Path("/sys/fs/cgroup/cpuset")
    if os.geteuid() != 0 or not (cpuset_root / "cpuset.cpus").exists():
        print("bench_live_move: needs root and a cgroup v1 cpuset hierarchy", file=sys.stderr)
        return 2
    if a & b or not (a | b) <= online or len(a) != len(b):
        print(
            f"bench_live_move: {a} and {b}: two disjoint online sets of one size", file=sys.stderr
        )
        return 2
    if len(online) == 2:
        print(
            "there is no room for a second exclusive run on 2 CPUs: the other CPU is the "
            "shared pool's, where a shared run sleeps"
        )
    print(
        f"machine: {len(online)} CPUs online ({online}); moving between {{{a}}} and {{{b}}}"
        + (" (the only two 1-CPU sets of a 2-CPU machine)" if len(online) == 2 else "")
    )
    state = tempfile.mkdtemp(prefix="corepin-bench-move-")
    parent = f"corepin-test-bench-{os.getpid()}"
    settings = HostSettings(state_dir=state, cgroups="on", cgroup_parent=parent)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        procs.append(start(state, parent, str(a), [sys.executable, "-c", TREE]))
        procs.append(start(state, parent, "", ["sleep", "3600"]))
        host = HostAgent(settings)
        end = time.monotonic() + 30
        while len(host.read_state().assignments) < 2 and time.monotonic() < end:
            time.sleep(0.05)
        run = next(x for x in host.read_state() if x.exclusive)
        group = cpuset_root / parent / run.id
        while len((group / "cgroup.procs").read_text().split()) < 2:
            time.sleep(0.05)
        pids = [int(p) for p in (group / "cgroup.procs").read_text().split()]
        threads = 0
        while threads < 8:  # 2 processes x (main + 3 busy)
            time.sleep(0.05)
            threads = len(tree_threads(pids))
        print(
            f"run {run.id}: {len(pids)} processes, {threads} threads, in cgroup {parent}/{run.id}"
        )
        topo = host.topology
        sampler = Sampler(pids, a, b)
        sampler.start()
        took: list[float] = []
        executed: list[float] = []
        old, new = a, b
        for _ in range(args.moves):
            t0 = time.perf_counter()
            move = Move(run.id, old, new, new, alignment_of(topo, old), alignment_of(topo, new))
            execute(HostAgent(settings, topo), [move])
            t1 = time.perf_counter()
            wait_on(pids, new, threads)
            t2 = time.perf_counter()
            executed.append((t1 - t0) * 1000)
            took.append((t2 - t0) * 1000)
            old, new = new, old
        sampler.stop.set()
        sampler.join()
        # baseline: the same threads, widened cgroup, bare sched_setaffinity thread by thread
        (group / "cpuset.cpus").write_text(str(a | b))
        bare: list[float] = []
        for _ in range(args.moves):
            t0 = time.perf_counter()
            for tid in tree_threads(pids):
                with contextlib.suppress(ProcessLookupError):
                    os.sched_setaffinity(tid, new)
            wait_on(pids, new, threads)
            bare.append((time.perf_counter() - t0) * 1000)
            old, new = new, old
        print(f"moves of the run, decision to all {threads} threads seen on the new CPUs:")
        print(summary("corepin executor (execute + /proc check)", took))
        print(summary("  of which execute() (lock, state, cgroup, pins)", executed))
        print(summary("baseline: bare sched_setaffinity per thread", bare))
        verdict = "met" if median(sorted(took)) <= TARGET_MS else "NOT met"
        print(f"target median <= {TARGET_MS:g} ms: {verdict}")
        print(
            f"sampler: {sampler.samples} thread samples during the moves; with no CPU: "
            f"{sampler.empty}; on a CPU outside {{{a}}} and {{{b}}} (another run's): "
            f"{sampler.outside}; on both sets at once: {sampler.both}"
        )
        print(
            "note: 1 NUMA node here, so cpuset.mems does not change and no page moves "
            "(cpuset.memory_migrate is set only when a move changes the nodes)"
        )
        return 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        _remove_group(cpuset_root / parent)
        shutil.rmtree(state, ignore_errors=True)


def _remove_group(base: Path) -> None:
    """Remove the scratch cgroup parent (processes left in it are killed first)."""
    for _ in range(100):
        if not base.exists():
            return
        for d, _dirs, _files in os.walk(base, topdown=False):
            with contextlib.suppress(OSError):
                for pid in Path(d, "cgroup.procs").read_text().split():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(pid), signal.SIGKILL)
            with contextlib.suppress(OSError):
                os.rmdir(d)
        time.sleep(0.05)
    print(f"bench_live_move: could not remove {base}", file=sys.stderr)


if __name__ == "__main__":
    raise SystemExit(main())
