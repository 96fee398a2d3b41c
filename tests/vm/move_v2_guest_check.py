"""Live moves of a running workload on cgroup v2, checked inside a machine that is ours (a
test-bed guest with several NUMA nodes): run INSIDE a guest, never on a shared host.

    python tests/vm/move_v2_guest_check.py --this-machine-is-mine LAYOUT

A move is what rebalancing and reservations do to a running exclusive container: the
reconciler (`corepin.enforcement.reconcile`, `CgroupTarget(migrate_memory=True)`) rewrites the
container group's cpuset.cpus and cpuset.mems in place, from the CPUs of the first NUMA node to
those of the last. The workload is a process with four threads (three asleep in a loop, the main
one spinning) that placed 16 MiB of anonymous memory on the first node before the move. While the
move runs, a sampler thread reads every thread's Cpus_allowed_list as fast as it can.

Layouts (each the way a container may sit in a v2 hierarchy):
- `plain`: `cpmove/ctr` has CPUs and memory nodes of its own;
- `inherit`: the pod `cpmove/pod` has them and its container `cpmove/pod/ctr` inherits (empty
  cpuset.cpus and cpuset.mems): the move writes the container, widening the pod first;
- `threaded`: the pod `cpmove/tpod` is a threaded subtree root and the workload's threads sit in
  its threaded child `cpmove/tpod/ctr`;
- `partition`: as `plain`, with a sibling `cpmove/part` that is a cpuset partition root owning
  the CPUs of another node: the move never touches it.

Verdicts: `moved` (every thread may run only on the new CPUs afterwards), `never empty` (no
sample saw a thread with no CPU), `never elsewhere` (no sample saw a thread allowed on a CPU
outside old and new: never on another workload's CPUs), `pages followed` (at least 90 % of the
16 MiB is on the new node afterwards, read from /proc/PID/numa_maps), `untouched` (for
`partition`: the partition's files and tasks are as they were), `clean` (nothing left).
Figures: the move's time, samples taken, pages per node before and after.

Prints one JSON object: `ok`, `problems`, `verdicts`, `figures`; exits 0 when `ok`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from qos_v2_guest_check import ROOT, Verdicts, allowed, read, write

from corepin.core.cpuset import CPUSet
from corepin.enforcement.cgroups import CgroupV2
from corepin.enforcement.reconcile import CgroupTarget, Reconciler
from corepin.topology.discover import discover

LAYOUTS = ("plain", "inherit", "threaded", "partition")
VERDICTS = ("moved", "never empty", "never elsewhere", "pages followed", "untouched", "clean")
MIB = 16
#: the workload: places MIB MiB of anonymous memory, writes "<buffer address> <thread ids>" to
#: argv[1], then keeps three threads asleep in a loop and the main one spinning
WORKLOAD = (
    "import ctypes, mmap, os, sys, threading, time\n"
    f"buf = mmap.mmap(-1, {MIB} << 20)\n"
    f"for i in range(0, {MIB} << 20, 4096):\n"
    "    buf[i] = 1\n"
    "addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))\n"
    "def nap():\n"
    "    while True:\n"
    "        time.sleep(0.001)\n"
    "ts = [threading.Thread(target=nap, daemon=True) for _ in range(3)]\n"
    "for t in ts:\n"
    "    t.start()\n"
    "ids = ' '.join(str(t.native_id) for t in ts)\n"
    "open(sys.argv[1] + '.tmp', 'w').write(f'{addr:x} {ids}')\n"
    "os.rename(sys.argv[1] + '.tmp', sys.argv[1])\n"
    "while True:\n"
    "    pass\n"
)


def pages_by_node(pid: int, address: str) -> dict[int, int]:
    """Pages of the mapping at `address` per NUMA node (from /proc/PID/numa_maps)."""
    out: dict[int, int] = {}
    for line in Path(f"/proc/{pid}/numa_maps").read_text().splitlines():
        if not line.startswith(address + " "):
            continue
        for word in line.split()[1:]:
            if word.startswith("N") and "=" in word:
                node, count = word[1:].split("=", 1)
                out[int(node)] = out.get(int(node), 0) + int(count)
    return out


class Sampler(threading.Thread):
    """Reads the threads' Cpus_allowed_list until stopped; keeps every set it saw."""

    def __init__(self, tids: list[int]) -> None:
        super().__init__(daemon=True)
        self.tids = tids
        self.seen: list[CPUSet] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            for tid in self.tids:
                got = allowed(tid)
                if got is not None:
                    self.seen.append(got)


def setup(layout: str, old: CPUSet, old_mems: CPUSet, other: CPUSet) -> tuple[str, str]:
    """Build the layout; (the group the workload joins, the group the move targets)."""
    write("", "cgroup.subtree_control", "+cpuset")
    os.makedirs(ROOT / "cpmove", exist_ok=True)
    write("cpmove", "cgroup.subtree_control", "+cpuset")
    if layout in ("plain", "partition"):
        if layout == "partition":
            os.makedirs(ROOT / "cpmove/part", exist_ok=True)
            write("cpmove/part", "cpuset.cpus", str(other))
            write("cpmove/part", "cpuset.cpus.partition", "root")
        os.makedirs(ROOT / "cpmove/ctr", exist_ok=True)
        write("cpmove/ctr", "cpuset.cpus", str(old))
        write("cpmove/ctr", "cpuset.mems", str(old_mems))
        return "cpmove/ctr", "cpmove/ctr"
    pod = "cpmove/pod" if layout == "inherit" else "cpmove/tpod"
    os.makedirs(ROOT / pod, exist_ok=True)
    write(pod, "cpuset.cpus", str(old))
    write(pod, "cpuset.mems", str(old_mems))
    write(pod, "cgroup.subtree_control", "+cpuset")
    os.makedirs(ROOT / pod / "ctr", exist_ok=True)
    if layout == "threaded":
        write(f"{pod}/ctr", "cgroup.type", "threaded")
    return f"{pod}/ctr", f"{pod}/ctr"


def teardown() -> None:
    for group in sorted(
        (p for p in (ROOT / "cpmove").rglob("*") if p.is_dir()),
        key=lambda p: -len(p.parts),
    ):
        group.rmdir()
    if (ROOT / "cpmove").is_dir():
        (ROOT / "cpmove").rmdir()


def check(layout: str) -> dict[str, Any]:
    v = Verdicts(VERDICTS)
    topo = discover("/")
    nodes = topo.numa_node_ids()
    first, last = nodes[0], nodes[-1]
    old, new = topo.cpus_in_numa_nodes(first), topo.cpus_in_numa_nodes(last)
    other = topo.cpus_in_numa_nodes(nodes[-2]) if len(nodes) > 2 else CPUSet()
    join, target = setup(layout, old, CPUSet.of(first), other)
    part_before = {n: read("cpmove/part", n) for n in ("cpuset.cpus", "cpuset.cpus.partition")}
    ready = Path(f"/tmp/cpmove-{os.getpid()}")
    child = subprocess.Popen([sys.executable, "-c", WORKLOAD, str(ready)])
    try:
        if layout == "threaded":
            # the process stays in its parent's domain; its threads move into the threaded child
            write(join.rsplit("/", 1)[0], "cgroup.procs", str(child.pid))
        else:
            write(join, "cgroup.procs", str(child.pid))
        deadline = time.monotonic() + 30
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        address, *ids = ready.read_text().split()
        tids = [child.pid, *map(int, ids)]
        if layout == "threaded":
            for tid in tids:
                write(join, "cgroup.threads", str(tid))
        before = pages_by_node(child.pid, address)
        v.figures["pages before"] = before
        sampler = Sampler(tids)
        sampler.start()
        time.sleep(0.05)
        reconciler = Reconciler(CgroupV2(str(ROOT)), topology=topo)
        start = time.perf_counter()
        report = reconciler.reconcile(
            [CgroupTarget(target, cpus=new, mems=CPUSet.of(last), migrate_memory=True)]
        )
        v.figures["move ms"] = round((time.perf_counter() - start) * 1000, 2)
        time.sleep(0.05)
        sampler.stop.set()
        sampler.join()
        v.figures["samples"] = len(sampler.seen)
        v.figures["changes"] = [c.to_json() for c in report.changes]
        v("moved", report.ok, [str(e) for e in report.errors])
        after_sets = {tid: allowed(tid) for tid in tids}
        v("moved", all(s == new for s in after_sets.values()), after_sets)
        v("never empty", all(sampler.seen), "a sample saw a thread with no CPU")
        outside = [str(s) for s in sampler.seen if not s <= old | new]
        v("never elsewhere", not outside, outside[:5])
        after = pages_by_node(child.pid, address)
        v.figures["pages after"] = after
        total = sum(after.values()) or 1
        v("pages followed", after.get(last, 0) >= 0.9 * total, after)
        part_after = {n: read("cpmove/part", n) for n in part_before}
        v("untouched", part_after == part_before, (part_before, part_after))
    finally:
        child.kill()
        child.wait()
        ready.unlink(missing_ok=True)
        time.sleep(0.1)
        teardown()
    v("clean", not (ROOT / "cpmove").exists(), "cpmove is left")
    return v.result()


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("layout", choices=LAYOUTS)
    parser.add_argument("--this-machine-is-mine", action="store_true")
    args = parser.parse_args()
    if not args.this_machine_is_mine:
        parser.error("this writes the machine's cgroups: run it in a guest, --this-machine-is-mine")
    data = check(args.layout)
    print(json.dumps(data))
    return 0 if data["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
