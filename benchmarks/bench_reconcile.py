"""Reconcile of a steady state: 500 container cgroups with nothing to change.

Builds 500 container cgroups in the kubelet's cgroupfs layout (burstable, besteffort and
guaranteed pods, containerd ids) in a fake cgroup tree (on tmpfs when there is one), converges
them once with the reconcile engine, then times further passes in which nothing differs. Each
target sets cpuset.cpus, cpuset.mems and the CFS quota, so every pass reads three files per
target. Compared in the same run with the naive way: re-write every file of every target each
pass (what a controller without read-before-write does).

Rows: fake cgroup v1 tree (cpuset + separate cpu hierarchy), fake cgroup v2 tree, and, when run
as root on a host with a writable v1 cpuset hierarchy (`--real`, default on when possible),
500 scratch groups under the real cpuset mount (removed afterwards). A last row times process
targets: real sleeping processes pinned with sched_setaffinity, nothing to change.

Target (issue 4): <= 50 ms for 500 targets and zero writes.

    python benchmarks/bench_reconcile.py [--targets N] [--repeats N] [--no-real] [--quick]
"""

from __future__ import annotations

import argparse
import gc
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from _common import median, percentile, table
from corepin.core.cpuset import CPUSet
from corepin.enforcement.cgroups import CgroupDriver, CgroupV1, CpuQuota
from corepin.enforcement.faketree import make_fake_v1, make_fake_v2
from corepin.enforcement.layout import container_cgroup_path
from corepin.enforcement.reconcile import CgroupTarget, ProcessTarget, Reconciler
from corepin.sysfs.procfs import process_start_time

TARGET_MS = 50.0
QOS = ("burstable", "besteffort", "guaranteed")


def build_targets(drv: CgroupDriver, count: int, cpus: CPUSet, prefix: str) -> list[CgroupTarget]:
    cpu_list = cpus.sorted()
    targets = []
    for i in range(count):
        uid = str(uuid.UUID(int=i + 1))
        path = container_cgroup_path("cgroupfs", QOS[i % 3], uid, "containerd", f"{i + 1:064x}")
        path = f"{prefix}/{path}" if prefix else path
        drv.create(path)
        mine = CPUSet.of(cpu_list[i % len(cpu_list)])
        quota = CpuQuota.unlimited() if i % 2 else CpuQuota.for_cpus(1)
        targets.append(CgroupTarget(path, cpus=mine, mems=CPUSet.of(0), quota=quota))
    return targets


def naive_pass(drv: CgroupDriver, targets: list[CgroupTarget]) -> None:
    for t in targets:
        assert t.cpus is not None and t.mems is not None and t.quota is not None
        drv.write_mems(t.path, t.mems)
        drv.write_cpus(t.path, t.cpus)
        drv.write_quota(t.path, t.quota)


def timed(fn: Callable[[], object], repeats: int) -> list[float]:
    out = []
    gc.disable()
    try:
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            out.append((time.perf_counter() - start) * 1000)
    finally:
        gc.enable()
    return sorted(out)


def run_tree(name: str, drv: CgroupDriver, targets: list[CgroupTarget], repeats: int) -> list[str]:
    engine = Reconciler(drv)
    first = engine.reconcile(targets)
    if not first.ok:
        raise SystemExit(f"{name}: converging failed: {first.errors[:3]}")
    writes: list[int] = []

    def steady() -> None:
        report = engine.reconcile(targets)
        writes.append(report.writes)

    steady_ms = timed(steady, repeats)
    before = drv.writes
    naive_ms = timed(lambda: naive_pass(drv, targets), max(3, repeats // 3))
    naive_writes = (drv.writes - before) // max(3, repeats // 3)
    med = median(steady_ms)
    return [
        name,
        str(len(targets)),
        f"{med:.1f}",
        f"{percentile(steady_ms, 95):.1f}",
        str(max(writes)),
        f"{median(naive_ms):.1f}",
        str(naive_writes),
        f"{median(naive_ms) / med:.1f}x",
        "ok" if med <= TARGET_MS and max(writes) == 0 else "MISSED",
    ]


def fast_tmp() -> tempfile.TemporaryDirectory[str]:
    shm = Path("/dev/shm")
    usable = shm.is_dir() and os.access(shm, os.W_OK)
    return tempfile.TemporaryDirectory(prefix="corepin-bench-", dir=shm if usable else None)


def real_cpuset_root() -> Path | None:
    root = Path("/sys/fs/cgroup/cpuset")
    if os.geteuid() != 0 or not (root / "cpuset.cpus").exists() or not os.access(root, os.W_OK):
        return None
    return root


def remove_tree(drv: CgroupDriver, top: str) -> None:
    for dirpath, _dirs, _files in sorted(os.walk(drv.dir(top)), key=lambda e: -e[0].count("/")):
        os.rmdir(dirpath)


def process_row(count: int, repeats: int) -> list[str]:
    procs = [subprocess.Popen(["sleep", "600"]) for _ in range(count)]
    try:
        online = CPUSet(os.sched_getaffinity(0))
        targets = [
            ProcessTarget(p.pid, online, start_time=process_start_time(p.pid)) for p in procs
        ]
        engine = Reconciler(None)
        engine.reconcile(targets)
        writes: list[int] = []
        ms = timed(lambda: writes.append(engine.reconcile(targets).writes), repeats)
        return [
            "process trees (real, affinity)",
            str(count),
            f"{median(ms):.1f}",
            f"{percentile(ms, 95):.1f}",
            str(max(writes)),
            "-",
            "-",
            "-",
            "ok" if max(writes) == 0 else "MISSED",
        ]
    finally:
        for p in procs:
            p.kill()
            p.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--processes", type=int, default=50)
    parser.add_argument("--no-real", action="store_true", help="skip the real cpuset hierarchy")
    parser.add_argument("--quick", action="store_true", help="CI smoke: few repeats")
    args = parser.parse_args(argv)
    repeats = 5 if args.quick else args.repeats
    cpus = CPUSet.parse("0-7")
    rows = [
        [
            "tree",
            "targets",
            "steady ms",
            "p95 ms",
            "writes",
            "naive ms",
            "naive writes",
            "speedup",
            f"<= {TARGET_MS:.0f} ms, 0 writes",
        ]
    ]
    with fast_tmp() as tmp:
        v1 = make_fake_v1(Path(tmp) / "v1", cpus=cpus, mems=CPUSet.of(0))
        rows.append(
            run_tree("fake cgroup v1", v1, build_targets(v1, args.targets, cpus, ""), repeats)
        )
        v2 = make_fake_v2(Path(tmp) / "v2", cpus=cpus, mems=CPUSet.of(0))
        rows.append(
            run_tree("fake cgroup v2", v2, build_targets(v2, args.targets, cpus, ""), repeats)
        )
    real = None if args.no_real else real_cpuset_root()
    if real is not None:
        top = f"corepin-bench-{uuid.uuid4().hex[:8]}"
        drv = CgroupV1(real, None)
        online = CPUSet(os.sched_getaffinity(0))
        try:
            targets = [
                CgroupTarget(t.path, cpus=t.cpus, mems=t.mems)
                for t in build_targets(drv, args.targets, online, top)
            ]
            rows.append(run_tree_no_quota("real cgroup v1 cpuset", drv, targets, repeats))
        finally:
            remove_tree(drv, top)
    rows.append(process_row(args.processes, repeats))
    version = sys.version.split()[0]
    print(f"reconcile of a steady state ({repeats} timed passes each; python {version})")
    print(table(rows))
    print(
        "\nsteady = corepin reconcile with nothing to change (reads, compares, writes nothing);\n"
        "naive = re-write cpuset.mems, cpuset.cpus and the quota of every target each pass."
    )
    return 0


def run_tree_no_quota(
    name: str, drv: CgroupDriver, targets: list[CgroupTarget], repeats: int
) -> list[str]:
    engine = Reconciler(drv)
    first = engine.reconcile(targets)
    if not first.ok:
        raise SystemExit(f"{name}: converging failed: {first.errors[:3]}")
    writes: list[int] = []
    steady_ms = timed(lambda: writes.append(engine.reconcile(targets).writes), repeats)

    def naive() -> None:
        for t in targets:
            assert t.cpus is not None and t.mems is not None
            drv.write_mems(t.path, t.mems)
            drv.write_cpus(t.path, t.cpus)

    naive_ms = timed(naive, max(3, repeats // 3))
    med = median(steady_ms)
    return [
        name + " (no quota)",
        str(len(targets)),
        f"{med:.1f}",
        f"{percentile(steady_ms, 95):.1f}",
        str(max(writes)),
        f"{median(naive_ms):.1f}",
        str(2 * len(targets)),
        f"{median(naive_ms) / med:.1f}x",
        "ok" if med <= TARGET_MS and max(writes) == 0 else "MISSED",
    ]


if __name__ == "__main__":
    raise SystemExit(main())
