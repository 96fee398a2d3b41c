"""`corepin nri`, the NRI plugin of containerd: unpinned time, the latency it adds to a
container's creation, and 100 containers created at once (issue 16), on a real containerd.

Set-up: the CRI test bed of the end-to-end tests (`tests/support/cri_harness.py`: a private
containerd 1.7 with the CRI and NRI on, runc, pods in the host's network on cgroupfs, below a
cgroup of its own) on this machine; `corepin nri` runs as its own process on the bed's NRI
socket (`python -m corepin nri`, ready once its /healthz answers 200: synchronized with the
runtime); this process plays the kubelet through the CRI. Every container first prints its
Cpus_allowed_list (its first command), then sleeps. Needs root, a cgroup v1 cpuset hierarchy
and the bed (`sh scripts/fetch-containerd-nri.sh`); otherwise it prints why it skips and exits 0.

Figures:
1. Unpinned time: with the plugin the runtime creates a container with the cpuset of the
   plugin's reply, so the container's first line (its CPUs when its first instruction ran)
   already is its exclusive CPU: counted over every exclusive container of this run (its first
   line, its cgroup's `cpuset.cpus` and its allowed CPUs now are the same single CPU). Beside
   it, the node agent's pod event to cgroup applied, the time a container of the agent mode runs
   unpinned at the least: measured now by `bench_agent.py --quick` (a subprocess, before the bed
   starts), or the figure the README records when that cannot run (`--no-agent`, `--quick`).
2. CreateContainer + StartContainer (the two CRI calls, timed together, per container) with
   the plugin connected and with no plugin, in the same containerd, one container at a time
   beside one running shared container: an exclusive 1-CPU container (the plugin's reply also
   narrows the shared one) and a shared 500m container (no other container changes), their
   order alternating. Blocks of `--block` steps in the order with, without, without, with
   (repeated), so a drift of the machine weighs on both alike. "Without" is the same daemon
   with the plugin's process stopped (SIGTERM: it closes its connection, the runtime forgets it
   and answers alone); the pod sandbox is run before and removed after each sample, untimed.
   Median, p90, p99 (nearest rank) and the median added; target <= 5 ms. Then, with the
   plugin, an exclusive container beside 10 running shared containers and beside 1: the
   runtime applies the reply's update of each narrowed container before CreateContainer
   returns, so this gives the cost per shared container on the node.
3. `--burst` containers created at once (`--in-flight` CRI calls in flight): the first
   (CPUs - 1) exclusive (1000m, `corepin.io/cpu-policy: exclusive` on the pod), the rest shared
   (500m; the shared pool is never emptied). Their pod sandboxes are run first (concurrently,
   timed apart), then every container is created and started concurrently, exclusive ones
   submitted first. Checked once the last call returned: each exclusive container's first line,
   live cpuset and allowed CPUs are its own single CPU; no two exclusive overlap; each shared
   container's live cpuset and allowed CPUs are exactly the shared pool (online minus the
   exclusive CPUs); a shared container found elsewhere is given 5 s to be repaired. Total wall
   time, p50/p99 create+start under this load, then every pod is removed. A wrong pin (still
   wrong after the 5 s) is a correctness failure: the script prints it and exits 1.

Usage (root, ~70-110 s on 2 CPUs): .venv/bin/python benchmarks/bench_nri.py [--quick] [--no-agent]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
from _common import median, percentile  # noqa: E402
from corepin.core.cpuset import CPUSet  # noqa: E402
from support.cri_client import report_then  # noqa: E402
from support.cri_harness import BedDidNotStart, CriBed, cri_testbed, skip_reason  # noqa: E402
from support.ports import free_port  # noqa: E402

T = TypeVar("T")
SIDES = ("with", "without")
#: exclusive: 1000m in a pod marked exclusive (the plugin's reply also narrows the running
#: shared neighbour); shared: 500m (the reply is the shared pool, no other container changes)
KINDS = ("exclusive", "shared")
EXCLUSIVE = {"corepin.io/cpu-policy": "exclusive"}
TARGET_ADDED_MS = 5.0
#: how long a shared container found on the wrong CPUs in the burst is given to be repaired
SETTLE_S = 5.0
#: running shared containers beside the exclusive one in the series of figure 2b
NEIGHBOURS = 10
#: the README's record of bench_agent.py (60 pods, one at a time), used with --no-agent
AGENT_RECORDED = (27.3, 43.5)
AGENT_LINE = re.compile(r"corepin agent\s+median\s+([\d.]+) ms\s+p99\s+([\d.]+) ms")


def online() -> CPUSet:
    """The CPUs of the machine (the cpuset root's, as the bed's containers see them)."""
    return CPUSet.parse(Path("/sys/fs/cgroup/cpuset/cpuset.cpus").read_text())


def stats(values_ms: Sequence[float]) -> tuple[float, float, float]:
    ordered = sorted(values_ms)
    return median(ordered), percentile(ordered, 90), percentile(ordered, 99)


def timed(call: Callable[[], T]) -> tuple[T, float]:
    started = time.perf_counter()
    got = call()
    return got, (time.perf_counter() - started) * 1000


# ---------------------------------------------------------------------- the node agent's figure


def agent_figure(skip: bool) -> str:
    """The node agent's pod event to cgroup applied (median, p99), measured now by
    `bench_agent.py --quick` or, with `skip` or when it fails, the README's record."""
    recorded = (
        f"median {AGENT_RECORDED[0]:.1f} ms, p99 {AGENT_RECORDED[1]:.1f} ms "
        "(recorded in the README: bench_agent.py, 60 pods; not measured in this run)"
    )
    if skip:
        return recorded
    try:
        done = subprocess.run(
            [sys.executable, str(HERE / "bench_agent.py"), "--quick"],
            capture_output=True,
            text=True,
            timeout=90,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return recorded
    found = AGENT_LINE.search(done.stdout)
    if done.returncode != 0 or found is None:
        return recorded
    return (
        f"median {float(found[1]):.1f} ms, p99 {float(found[2]):.1f} ms "
        "(bench_agent.py --quick in this run, 10 pods one at a time)"
    )


# ---------------------------------------------------------------------- the plugin's process


class Plugin:
    """One `corepin nri` process on the bed's NRI socket (started by this script)."""

    def __init__(self, socket: str, state_dir: Path, log: Path, port: int) -> None:
        self.socket, self.state_dir, self.log, self.port = socket, state_dir, log, port
        self.process: subprocess.Popen[bytes] | None = None
        #: sum and count of the plugin's own answer times, over every process started
        self.answer_seconds = 0.0
        self.answers = 0

    def start(self, timeout: float = 30) -> None:
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "corepin",
                    "nri",
                    "--socket",
                    self.socket,
                    "--state-dir",
                    str(self.state_dir),
                    "--node-name",
                    "bench",
                    "--metrics-address",
                    f"127.0.0.1:{self.port}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout
        while not self._get("/healthz"):
            if self.process.poll() is not None:
                raise SystemExit(f"corepin nri exited: {self.tail()}")
            if time.monotonic() > deadline:
                raise SystemExit(f"corepin nri not synchronized in {timeout:g} s: {self.tail()}")
            time.sleep(0.02)

    def stop(self) -> None:
        """Read its answer times, then SIGTERM (SIGKILL after 10 s) and wait for it."""
        process, self.process = self.process, None
        if process is None:
            return
        metrics = self._get("/metrics") or ""
        total = re.search(r"^corepin_nri_request_duration_seconds_sum (\S+)$", metrics, re.M)
        count = re.search(r"^corepin_nri_request_duration_seconds_count (\S+)$", metrics, re.M)
        if total and count:
            self.answer_seconds += float(total[1])
            self.answers += int(float(count[1]))
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def _get(self, path: str) -> str | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=1) as r:
                return str(r.read().decode()) if r.status == 200 else None
        except OSError:
            return None

    def tail(self) -> str:
        with contextlib.suppress(OSError):
            return self.log.read_text(errors="replace")[-600:].replace("\n", " | ")
        return "(no log)"


# ---------------------------------------------------------------------- measurements


@dataclass
class Burst:
    """What the burst measured."""

    count: int
    in_flight: int
    exclusive: int
    pool: CPUSet
    sandboxes_s: float
    containers_s: float
    removed_s: float
    latencies: list[float]
    #: shared containers whose first line already was the shared pool
    first_shared: int
    #: shared containers not on the shared pool when the last call returned; of them repaired
    off_at_once: int
    repaired: int


class Bench:
    """The bed, the plugin, and what was found wrong (printed at the end)."""

    def __init__(self, bed: CriBed, plugin: Plugin) -> None:
        self.bed = bed
        self.cri = bed.cri
        self.plugin = plugin
        self.online = online()
        self.wrong: list[str] = []
        #: exclusive containers created with the plugin: (checked, pinned right from the start)
        self.exclusive_checked = 0
        self.exclusive_right = 0
        #: exclusive containers created without the plugin: whose first line was every CPU
        self.unpinned_without = 0
        self.without_checked = 0

    def container(self, pod: str, milli: int) -> tuple[str, float]:
        """Create and start a container (timed: the two CRI calls); its id and milliseconds."""

        def both() -> str:
            cid = self.cri.create_container(
                pod, "app", report_then(), cpu_request_milli=milli, cpu_limit_milli=milli
            )
            self.cri.start(cid)
            return cid

        return timed(both)

    def check_exclusive(self, cid: str, what: str) -> CPUSet:
        """Its first line, live cpuset and allowed CPUs: one CPU, the same; counted."""
        first = CPUSet.parse(self.cri.reported_cpus(cid))
        live = CPUSet.parse(self.bed.live_cpuset(cid))
        allowed = CPUSet.parse(self.bed.live_allowed_cpus(cid))
        self.exclusive_checked += 1
        if len(first) == 1 and first == live == allowed:
            self.exclusive_right += 1
        else:
            self.wrong.append(
                f"{what}: first line {first}, cpuset.cpus {live}, allowed {allowed} "
                "(wanted one CPU of its own in all three)"
            )
        return first

    def latency(self, per_side: int, block: int) -> dict[tuple[str, str], list[float]]:
        """Create+start with and without the plugin, in blocks with, without, without, with;
        each step one exclusive and one shared container (their order alternating). After
        each switch one step is untimed: the first containers after a plugin (re)start or
        stop pay for cold paths, on either side."""
        times: dict[tuple[str, str], list[float]] = {
            (side, kind): [] for side in SIDES for kind in KINDS
        }
        order = ("with", "without", "without", "with")
        neighbour = self.cri.run_pod("neighbour")
        self.container(neighbour, 500)
        blocks = [order[b % 4] for b in range(2 * -(-per_side // block))]
        n = 0
        for b, side in enumerate(blocks):
            if side == "with" and self.plugin.process is None:
                self.plugin.start()
            elif side == "without" and self.plugin.process is not None:
                self.plugin.stop()
                time.sleep(0.2)  # the runtime has seen the connection close
            switched = b == 0 or blocks[b - 1] != side
            for step in range(-1 if switched else 0, block):
                for kind in KINDS if n % 2 else KINDS[::-1]:
                    ms = self.step(side, kind, f"lat-{n}-{kind}")
                    if step >= 0:
                        times[side, kind].append(ms)
                n += 1
        if self.plugin.process is None:
            self.plugin.start()
        self.cri.remove_pod(neighbour)
        return times

    def step(self, side: str, kind: str, name: str) -> float:
        """One container in a pod of its own (run before, removed after, untimed): its
        create+start in milliseconds; an exclusive one's pin checked (with the plugin) or
        its first line counted (without)."""
        exclusive = kind == "exclusive"
        pod = self.cri.run_pod(name, annotations=EXCLUSIVE if exclusive else None)
        cid, ms = self.container(pod, 1000 if exclusive else 500)
        if exclusive and side == "with":
            self.check_exclusive(cid, f"{name} (with the plugin)")
        elif exclusive:
            self.without_checked += 1
            first = CPUSet.parse(self.cri.reported_cpus(cid))
            self.unpinned_without += first == self.online
        self.cri.remove_pod(pod)
        return ms

    def neighbours(self, many: int, samples: int) -> dict[int, list[float]]:
        """Create+start of an exclusive container with the plugin beside `many` running shared
        containers (its reply narrows each of them), then beside one: milliseconds by count."""
        pods = [self.cri.run_pod(f"neighbour-{i}") for i in range(many)]
        cids = [self.container(pod, 500)[0] for pod in pods]
        times: dict[int, list[float]] = {many: [], 1: []}
        for count in (many, 1):
            if count == 1:
                for pod in pods[1:]:
                    self.cri.remove_pod(pod)
            for n in range(samples):
                pod = self.cri.run_pod(f"beside-{count}-{n}", annotations=EXCLUSIVE)
                cid, ms = self.container(pod, 1000)
                times[count].append(ms)
                mine = self.check_exclusive(cid, f"exclusive beside {count} shared ({n})")
                for other in cids[:count]:
                    if self.shared_pin(other) != (self.online - mine,) * 2:
                        self.wrong.append(
                            f"shared {other[:12]} is on {self.shared_pin(other)[0]} after the "
                            f"exclusive container beside it was created on {mine}"
                        )
                self.cri.remove_pod(pod)
        self.cri.remove_pod(pods[0])
        return times

    def burst(self, count: int, in_flight: int) -> Burst:
        """`count` containers at once; checks (into `wrong`) and timings."""
        n_exclusive = len(self.online) - 1
        exclusive = [i < n_exclusive for i in range(count)]
        with ThreadPoolExecutor(in_flight) as pool:
            began = time.perf_counter()
            pods = list(
                pool.map(
                    lambda i: self.cri.run_pod(
                        f"burst-{i}", annotations=EXCLUSIVE if exclusive[i] else None
                    ),
                    range(count),
                )
            )
            sandboxes_s = time.perf_counter() - began
            began = time.perf_counter()
            made = list(
                pool.map(
                    lambda i: self.container(pods[i], 1000 if exclusive[i] else 500),
                    range(count),
                )
            )
            containers_s = time.perf_counter() - began
        cids = [cid for cid, _ms in made]
        shared = [cid for i, cid in enumerate(cids) if not exclusive[i]]
        # the shared containers' pins as soon as the last call returned
        at_once = {cid: self.shared_pin(cid) for cid in shared}
        mine = [
            self.check_exclusive(cid, f"burst exclusive {i}")
            for i, cid in enumerate(cids)
            if exclusive[i]
        ]
        taken = CPUSet().union(*mine)
        if len(taken) != sum(len(c) for c in mine):
            self.wrong.append(f"exclusive containers overlap: {[str(c) for c in mine]}")
        pool_cpus = self.online - taken
        first_shared = sum(
            1 for cid in shared if CPUSet.parse(self.cri.reported_cpus(cid)) == pool_cpus
        )
        off = [cid for cid in shared if at_once[cid] != (pool_cpus, pool_cpus)]
        deadline = time.monotonic() + SETTLE_S
        still = off
        while still and time.monotonic() < deadline:
            time.sleep(0.1)
            still = [cid for cid in still if self.shared_pin(cid) != (pool_cpus, pool_cpus)]
        for cid in still:
            live, allowed = self.shared_pin(cid)
            self.wrong.append(
                f"burst shared {shared.index(cid)} ({cid[:12]}): cpuset.cpus {live}, allowed "
                f"{allowed} {SETTLE_S:g} s after the last call (wanted the shared pool "
                f"{pool_cpus}; {at_once[cid][0]} when the last call returned)"
            )
        began = time.perf_counter()
        with ThreadPoolExecutor(in_flight) as pool:
            list(pool.map(self.cri.remove_pod, pods))
        removed_s = time.perf_counter() - began
        return Burst(
            count=count,
            in_flight=in_flight,
            exclusive=n_exclusive,
            pool=pool_cpus,
            sandboxes_s=sandboxes_s,
            containers_s=containers_s,
            removed_s=removed_s,
            latencies=[ms for _cid, ms in made],
            first_shared=first_shared,
            off_at_once=len(off),
            repaired=len(off) - len(still),
        )

    def shared_pin(self, cid: str) -> tuple[CPUSet, CPUSet]:
        """A container's live cpuset.cpus and allowed CPUs."""
        return (
            CPUSet.parse(self.bed.live_cpuset(cid)),
            CPUSet.parse(self.bed.live_allowed_cpus(cid)),
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer samples (CI smoke)")
    parser.add_argument("--samples", type=int, help="containers per side (default 40)")
    parser.add_argument("--block", type=int, default=5, help="containers per block (5)")
    parser.add_argument("--burst", type=int, help="containers created at once (default 100)")
    parser.add_argument("--in-flight", type=int, default=8, help="CRI calls in flight (8)")
    parser.add_argument(
        "--no-agent", action="store_true", help="print the README's agent figure, do not run it"
    )
    args = parser.parse_args()
    reason = skip_reason()
    if reason is not None:
        print(f"bench_nri: skipped: {reason}")
        return 0
    per_side = args.samples or (10 if args.quick else 40)
    burst = args.burst or (30 if args.quick else 100)
    began = time.monotonic()
    agent = agent_figure(args.no_agent or args.quick)
    tmp = Path(tempfile.mkdtemp(prefix="corepin-bench-nri-"))
    try:
        with cri_testbed(tmp / "bed", tmp / "cri-api") as bed:
            plugin = Plugin(bed.nri_socket, tmp / "state", tmp / "nri.log", free_port())
            bench = Bench(bed, plugin)
            try:
                plugin.start()
                lat = bench.latency(per_side, args.block)
                beside = bench.neighbours(NEIGHBOURS, 4 if args.quick else 8)
                got = bench.burst(burst, args.in_flight)
            finally:
                plugin.stop()
            version = bed.cri.version()
    except BedDidNotStart as exc:
        print(f"bench_nri: skipped: the CRI test bed did not start: {exc}")
        return 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    report(bench, lat, beside, got, agent, args.block, version)
    print(f"whole benchmark: {time.monotonic() - began:.0f} s")
    if bench.wrong:
        print(f"WRONG ({len(bench.wrong)}):")
        for line in bench.wrong[:20]:
            print(f"  {line}")
        return 1
    print("all pinned right, no overlap")
    return 0


def report(
    bench: Bench,
    lat: dict[tuple[str, str], list[float]],
    beside: dict[int, list[float]],
    got: Burst,
    agent: str,
    block: int,
    version: str,
) -> None:
    cpus = bench.online
    print(
        f"machine: {len(cpus)} CPUs ({cpus}), {version}, runc, cgroup v1 cpuset; "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    # -------------------------------------------------------------- 1. unpinned time
    print(
        f"unpinned time 0 ms: {bench.exclusive_right}/{bench.exclusive_checked} exclusive "
        "containers' first instruction ran on their own CPU (first line = cpuset.cpus = "
        "allowed CPUs = one CPU)"
    )
    print(
        f"  without a plugin: {bench.unpinned_without}/{bench.without_checked} exclusive "
        f"containers' first line was every CPU ({cpus})"
    )
    print(f"  node agent, pod event to cgroup applied (its least unpinned time): {agent}")
    # -------------------------------------------------------------- 2. latency
    n = len(lat["with", "exclusive"])
    print(
        f"CreateContainer + StartContainer, one container at a time ({n} per line; blocks of "
        f"{block} with/without/without/with, one containerd; without = plugin process stopped):"
    )
    for kind, what in (
        ("exclusive", "exclusive 1 CPU (the reply also narrows 1 shared neighbour)"),
        ("shared", "shared 500m (no other container changes)"),
    ):
        w, wo = stats(lat["with", kind]), stats(lat["without", kind])
        print(f"  {what}:")
        for label, (p50, p90, p99) in (("with corepin nri", w), ("no plugin", wo)):
            print(f"    {label:<17} median {p50:6.1f} ms   p90 {p90:6.1f} ms   p99 {p99:6.1f} ms")
        added = w[0] - wo[0]
        verdict = "met" if added <= TARGET_ADDED_MS else "NOT met"
        print(
            f"    added: median {added:+.1f} ms (target <= {TARGET_ADDED_MS:g} ms: {verdict}), "
            f"p90 {w[1] - wo[1]:+.1f} ms"
        )
    many, one = median(sorted(beside[NEIGHBOURS])), median(sorted(beside[1]))
    print(
        f"  exclusive 1 CPU with the plugin beside {NEIGHBOURS} running shared containers (the "
        f"reply narrows each): median {many:.1f} ms; beside 1: {one:.1f} ms "
        f"({len(beside[1])} each): {(many - one) / (NEIGHBOURS - 1):.1f} ms per shared container"
    )
    plugin = bench.plugin
    if plugin.answers:
        mean = plugin.answer_seconds / plugin.answers * 1000
        print(
            f"  the plugin's own answer time: mean {mean:.2f} ms over {plugin.answers} NRI "
            "requests of every kind (corepin_nri_request_duration_seconds)"
        )
    # -------------------------------------------------------------- 3. burst
    b50, _b90, b99 = stats(got.latencies)
    shared = got.count - got.exclusive
    print(
        f"{got.count} containers created at once ({got.exclusive} exclusive, {shared} shared "
        f"on a pool of {got.pool}; {got.in_flight} CRI calls in flight):"
    )
    print(
        f"  pod sandboxes run in {got.sandboxes_s:.2f} s; containers created and started in "
        f"{got.containers_s:.2f} s, per container p50 {b50:.1f} ms, p99 {b99:.1f} ms; every "
        f"pod removed in {got.removed_s:.2f} s"
    )
    print(
        f"  shared containers whose first line already was the shared pool: "
        f"{got.first_shared}/{shared}; on the shared pool when the last call returned: "
        f"{shared - got.off_at_once}/{shared}"
        + (
            f" ({got.repaired} of the other {got.off_at_once} repaired within {SETTLE_S:g} s)"
            if got.off_at_once
            else ""
        )
    )


if __name__ == "__main__":
    raise SystemExit(main())
