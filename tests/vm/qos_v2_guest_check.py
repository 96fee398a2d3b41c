"""The node QoS loop on cgroup v2, checked inside a machine that is ours (a test-bed guest): run
INSIDE a guest, never on a shared host.

    python tests/vm/qos_v2_guest_check.py --this-machine-is-mine PART [--state-dir DIR]

Every part builds below /sys/fs/cgroup (cpuset and cpu on at the root), runs real busy loops,
checks what the kernel then holds (cgroup files, every thread's Cpus_allowed_list in /proc)
and removes everything it made. The node, for `QosEngine` over `CgroupV2`: CPU 0 reserved, the
last CPU exclusive, the one before it LSR, the shared pool all but the last; the candidates for
BE are the rest. Parts:

- `engine`: `cpqos/besteffort` (empty cpuset.cpus) with `pod1` (empty, a busy loop) and `pod2`
  (CPUs of its own, a busy loop), `cpqos/ls` (two busy loops). `cpuset`: the first period keeps
  BE off the reserved, exclusive and LSR CPUs, the measured ones shrink it to the budget in the
  BE group and pod2, pod1 stays empty and its effective CPUs follow; `idle`: `beCPUIdle` sets
  the BE group's cpu.idle 1 and back to 0; `cfsquota`: the budget as cpu.max, the cpusets put
  back (see "off" below), `off` puts cpu.max back to max; `burst`: the kernel refuses a
  cpu.max.burst above cpu.max, `write_burst_us` clamps and reads back, the engine's static
  burst writes it.
- a layout of the BE group (`threadroot`, `threadedpod`, `inherit`, `outside`, `partition`;
  see `build_layout`): after `cpuset` periods every thread of the BE work may run only on the
  BE set, no group outside the BE subtree (and no other file of it) changed, and `off` puts
  back what was there: an empty (inheriting) value stays or comes back empty where the kernel
  allows it (it refuses to empty a populated cpuset: ENOSPC, then the CPUs the group had, less
  the exclusive ones), a value of its own comes back less the exclusive CPUs.
- `host`: host mode end to end with the real CLI (`python -m corepin`, `--state-dir DIR`,
  cgroups on): two BE runs and one LS run (busy loops, shared) and one exclusive run;
  `reconcile --once --qos-config` with `cpuset` (BE threads only on the BE set, never on the
  exclusive CPU, the LS run keeps its CPUs), `cfsQuota` (the BE group's cpu.max), `beCPUIdle`
  (cpu.idle 1); `report -o json` shows every run's `qos_class`; nothing is left afterwards.
- `burst`: a group with cpu.max 50000 100000 and a bursty load (two processes each busy half
  of the time): `cpuBurstOnly` writes cpu.max.burst clamped to the quota (read back); `auto`
  raises cpu.max while nr_throttled grows and lowers it back to the base when the load stops.

Prints one JSON object: `ok`, `problems`, `verdicts` (name -> true/false) and figures; exits 0
when `ok`.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from corepin.allocation.qos import BeSuppress, CpuBurst, QosPolicy, be_quota_us, next_be_cpus
from corepin.core.cpuset import CPUSet
from corepin.core.errors import CgroupError
from corepin.enforcement.cgroups import CgroupV2, CpuQuota
from corepin.enforcement.qos import CpuControl, QosEngine, QosMember, QosNode, QosReport

ROOT = Path("/sys/fs/cgroup")
TOP, BE, POD1, POD2, LS = (
    "cpqos",
    "cpqos/besteffort",
    "cpqos/besteffort/pod1",
    "cpqos/besteffort/pod2",
    "cpqos/ls",
)
#: busy threads: `python -c BUSY N [TIDFILE]` spins in its main thread and N more, and writes
#: the N threads' ids to TIDFILE
BUSY = (
    "import os, sys, threading\n"
    "def spin():\n"
    "    while True:\n"
    "        pass\n"
    "ts = [threading.Thread(target=spin, daemon=True) for _ in range(int(sys.argv[1]))]\n"
    "for t in ts:\n"
    "    t.start()\n"
    "if len(sys.argv) > 2:\n"
    "    open(sys.argv[2] + '.tmp', 'w').write(' '.join(str(t.native_id) for t in ts))\n"
    "    os.rename(sys.argv[2] + '.tmp', sys.argv[2])\n"
    "spin()\n"
)
#: a bursty load: busy for half of every 100 ms, asleep for the other half
BURSTY = (
    "import time\n"
    "while True:\n"
    "    end = time.monotonic() + 0.05\n"
    "    while time.monotonic() < end:\n"
    "        pass\n"
    "    time.sleep(0.05)\n"
)
PAUSE = 1.0
FIELDS = (
    "cpuset.cpus",
    "cpuset.cpus.partition",
    "cpuset.mems",
    "cpu.max",
    "cpu.max.burst",
    "cpu.idle",
    "cpu.weight",
    "cgroup.subtree_control",
    "cgroup.type",
)


def read(group: str, name: str) -> str:
    try:
        return (ROOT / group / name).read_text().strip()
    except OSError:
        return "<missing>"


def write(group: str, name: str, value: str) -> None:
    (ROOT / group / name).write_text(value + "\n")


def allowed(tid: int | str) -> CPUSet | None:
    """The thread's Cpus_allowed_list (None when it is gone)."""
    try:
        text = Path(f"/proc/{tid}/status").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return CPUSet.parse(line.split(":", 1)[1].strip())
    return None


def groups_below(group: str) -> list[str]:
    """`group` and every group below it, parents first."""
    base = ROOT / group
    found = sorted((p for p in base.rglob("*") if p.is_dir()), key=lambda p: len(p.parts))
    return [group, *(str(p.relative_to(ROOT)) for p in found)]


def snapshot() -> dict[str, dict[str, Any]]:
    """Every group of the hierarchy (the root as ""): its files in FIELDS and its threads."""
    out: dict[str, dict[str, Any]] = {}
    for group in groups_below(""):
        row: dict[str, Any] = {name: read(group, name) for name in FIELDS}
        row["threads"] = sorted(read(group, "cgroup.threads").split())
        out[group] = row
    return out


def root_files(snap: dict[str, Any] | None) -> dict[str, Any]:
    """The hierarchy root's files in a snapshot (or one row of it), without its threads
    (every process this check starts passes through the root)."""
    row = (snap or {}).get("", snap) or {}
    return {k: v for k, v in row.items() if k != "threads"}


def inside(group: str, subtree: str) -> bool:
    return group == subtree or group.startswith(subtree + "/")


class Verdicts:
    """Named verdicts (each true until one check of it fails), problems and figures."""

    def __init__(self, names: Iterable[str]) -> None:
        self.names = tuple(names)
        self.verdicts: dict[str, bool] = {}
        self.problems: list[str] = []
        self.figures: dict[str, Any] = {}

    def __call__(self, name: str, ok: bool, detail: object = "") -> bool:
        self.verdicts[name] = self.verdicts.get(name, True) and ok
        if not ok:
            self.problems.append(f"{name}: {detail}")
        return ok

    def result(self) -> dict[str, Any]:
        for name in self.names:
            self.verdicts.setdefault(name, False)
        return {
            "ok": not self.problems and all(self.verdicts.values()),
            "problems": self.problems,
            "verdicts": self.verdicts,
            "figures": self.figures,
        }


class Held:
    """Processes started here (killed at the end) and groups made here (removed, deepest
    first)."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        self.groups: list[str] = []

    def mkdir(self, *groups: str) -> None:
        for group in groups:
            (ROOT / group).mkdir()
            self.groups.append(group)

    def busy(self, group: str, threads: int = 0) -> tuple[subprocess.Popen[bytes], list[str]]:
        """A busy process with `threads` more busy threads, moved to `group`: it and the ids
        of the extra threads."""
        tid_file = Path(f"/tmp/cpqos-tids-{len(self.procs)}")
        tid_file.unlink(missing_ok=True)
        argv = [sys.executable, "-c", BUSY, str(threads)]
        proc = subprocess.Popen([*argv, str(tid_file)] if threads else argv)
        self.procs.append(proc)
        tids: list[str] = []
        if threads:
            deadline = time.monotonic() + 60
            while not tid_file.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            tids = tid_file.read_text().split()
        write(group, "cgroup.procs", str(proc.pid))
        return proc, tids

    def start(self, argv: list[str]) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(argv)
        self.procs.append(proc)
        return proc

    def teardown(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
            proc.wait()
        time.sleep(0.3)
        for group in sorted(self.groups, key=lambda g: -g.count("/")):
            for _ in range(50):
                try:
                    (ROOT / group).rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)


def test_node(online: CPUSet, be_group: str) -> QosNode:
    last = online.last()
    return QosNode(
        online=online,
        reserved=CPUSet.of(online.first()),
        exclusive=CPUSet.of(last),
        lsr=CPUSet.of(online.sorted()[-2]),
        shared_pool=online - CPUSet.of(last),
        be_group=be_group,
    )


def candidates_of(node: QosNode) -> CPUSet:
    return node.shared_pool - node.exclusive - node.reserved - node.lsr


# ---------------------------------------------------------------------- part `engine`
def engine_check() -> dict[str, Any]:
    v = Verdicts(("cpuset", "children", "inherit", "idle", "cfsquota", "burst"))
    held = Held()
    try:
        write("", "cgroup.subtree_control", "+cpuset +cpu")
        held.mkdir(TOP, BE, POD1, POD2, LS)
        for group in (TOP, BE):
            write(group, "cgroup.subtree_control", "+cpuset +cpu")
        online = CPUSet.parse(read("", "cpuset.cpus.effective"))
        write(POD2, "cpuset.cpus", str(online))
        be_loops = [held.busy(POD1)[0], held.busy(POD2)[0]]
        held.busy(LS)
        held.busy(LS)
        node = test_node(online, BE)
        candidates = candidates_of(node)
        driver = CgroupV2(str(ROOT))
        cpu = CpuControl(driver)
        engine = QosEngine(cpu, driver)
        members = [
            QosMember("ls", "LS", LS, base_quota=CpuQuota(50_000, 100_000)),
            QosMember("pod1", "BE", POD1),
            QosMember("pod2", "BE", POD2),
        ]
        policy = QosPolicy(be_suppress=BeSuppress("cpuset", 65, 2))
        first = engine.period(members, node, policy)
        v.figures["first"] = {"be_cpus": str(first.be_cpus), "problems": first.problems}
        v("cpuset", first.be_cpus == candidates, f"first period {first.be_cpus}")
        v("cpuset", read(BE, "cpuset.cpus") == str(candidates), read(BE, "cpuset.cpus"))
        previous = first.be_cpus or CPUSet()
        for _ in range(2):
            time.sleep(PAUSE)
            report = engine.period(members, node, policy)
            budget = report.be_budget
            v.figures.setdefault("periods", []).append(
                {
                    "usage": report.usage,
                    "budget": budget,
                    "be_cpus": str(report.be_cpus),
                    "problems": report.problems,
                }
            )
            if not v("cpuset", budget is not None, "no budget after a measured period"):
                continue
            want = next_be_cpus(previous, budget or 0.0, candidates, len(online), 2)
            v("cpuset", report.be_cpus == want, f"{report.be_cpus} != {want}")
            v("cpuset", report.usage.get("LS", 0) > 0.2, f"LS usage {report.usage}")
            previous = want
        v("cpuset", len(previous) < len(candidates), f"BE did not shrink: {previous}")
        for group in (BE, POD2):
            v("cpuset", read(group, "cpuset.cpus") == str(previous), group)
        v("children", read(POD2, "cpuset.cpus") == str(previous), read(POD2, "cpuset.cpus"))
        v("inherit", read(POD1, "cpuset.cpus") == "", f"pod1 {read(POD1, 'cpuset.cpus')!r}")
        v(
            "inherit",
            read(POD1, "cpuset.cpus.effective") == str(previous),
            f"pod1 effective {read(POD1, 'cpuset.cpus.effective')}",
        )
        for proc in be_loops:
            v("children", allowed(proc.pid) == previous, f"{proc.pid} on {allowed(proc.pid)}")
        v.figures["be_cpus"] = str(previous)

        idle = QosPolicy(be_suppress=BeSuppress("cpuset", 65, 2), be_cpu_idle=True)
        engine.period(members, node, idle)
        v("idle", read(BE, "cpu.idle") == "1", f"cpu.idle {read(BE, 'cpu.idle')}")
        engine.period(members, node, policy)
        v("idle", read(BE, "cpu.idle") == "0", f"cpu.idle after off {read(BE, 'cpu.idle')}")

        time.sleep(PAUSE)
        quota = engine.period(members, node, QosPolicy(be_suppress=BeSuppress("cfsQuota", 65, 2)))
        v.figures["cfsquota"] = {
            "budget": quota.be_budget,
            "cpu.max": read(BE, "cpu.max"),
            "changes": [str(n) for n in quota.changes],
            "problems": quota.problems,
        }
        if v("cfsquota", quota.be_budget is not None, "no budget"):
            want_max = f"{be_quota_us(quota.be_budget or 0.0, 100_000)} 100000"
            v("cfsquota", read(BE, "cpu.max") == want_max, f"{read(BE, 'cpu.max')} != {want_max}")
        # put back: pod1 was never written; the BE group was empty (inheriting all) but holds
        # tasks below it, which the kernel does not let go empty: all but the exclusive CPU;
        # pod2 had all of them: all but the exclusive CPU
        kept = str(online - node.exclusive)
        v("cfsquota", read(POD1, "cpuset.cpus") == "", "pod1 is no longer empty")
        v("cfsquota", read(BE, "cpuset.cpus") == kept, f"BE group {read(BE, 'cpuset.cpus')!r}")
        v("cfsquota", read(POD2, "cpuset.cpus") == kept, f"pod2 {read(POD2, 'cpuset.cpus')}")
        engine.period(members, node, QosPolicy(be_suppress=BeSuppress("off", 65, 2)))
        v("cfsquota", read(BE, "cpu.max") == "max 100000", f"after off: {read(BE, 'cpu.max')}")

        driver.write_quota(LS, CpuQuota(50_000, 100_000))
        try:
            write(LS, "cpu.max.burst", "60000")
            v("burst", False, "the kernel took a burst above the quota")
        except OSError as err:
            v.figures["burst_refusal"] = os.strerror(err.errno or 0)
        held_us = cpu.write_burst_us(LS, 1_000_000)
        v("burst", held_us == 50_000 and read(LS, "cpu.max.burst") == "50000", f"held {held_us}")
        cpu.write_burst_us(LS, 0)
        static = QosPolicy(
            be_suppress=BeSuppress("off", 65, 2),
            cpu_burst=CpuBurst("cpuBurstOnly", burst_percent=1000),
        )
        report = engine.period(members, node, static)
        v("burst", read(LS, "cpu.max.burst") == "50000", f"engine: {report.problems}")
        v.figures["burst_changes"] = report.burst_changes
    except (CgroupError, OSError) as err:
        v.problems.append(f"error: {err}")
    finally:
        held.teardown()
    return v.result()


# ---------------------------------------------------------------------- part: a layout
LAYOUTS = ("threadroot", "threadedpod", "inherit", "outside", "partition")
PARTITIONS = ("cpqos-root", "cpqos-isolated")


def build_layout(name: str, held: Held, online: CPUSet) -> list[QosMember]:
    """The BE group `cpqos/besteffort` in layout `name` with busy work in it; the BE members.

    - `threadroot`: the BE group holds a process itself and is a thread root: threaded children
      `t1` (empty cpuset.cpus) and `t2` (every CPU), each holding one thread of a process
      whose main thread is in the BE group;
    - `threadedpod`: a pod below the BE group holds a process and is a thread root, its
      threaded children `t1` (empty) and `t2` (CPUs 1-2) hold threads of a second process;
    - `inherit`: pods with empty cpuset.cpus (inheriting): `pod1` with a container `c1` (empty
      too) holding a process, `pod2` holding a two-thread process;
    - `outside`: pods with CPUs of their own outside the BE set the budget leaves: `p1` CPUs
      1-2 (candidates the BE set drops), `p2` the reserved CPU, `p3` the exclusive CPU, and
      `p4` empty;
    - `partition`: cpuset partitions directly below the root take the two highest candidate
      CPUs (one `root`, one `isolated`, each holding a sleeping task), which the BE group had
      as its own cpuset.cpus (its effective CPUs then fall back to its parent's: every CPU
      left, the exclusive one included); `pod1` (empty) and `pod2` (every CPU) hold busy loops.
    """
    cpu_on = "+cpuset +cpu"
    last = online.last()
    if name == "partition":
        top = candidates_of(test_node(online, BE)).sorted()[-2:]
        write(BE, "cpuset.cpus", ",".join(map(str, top)))
        for group, cpu, mode in zip(PARTITIONS, reversed(top), ("root", "isolated"), strict=True):
            held.mkdir(group)
            write(group, "cpuset.cpus", str(cpu))
            write(group, "cpuset.cpus.partition", mode)
            proc = held.start(["sleep", "3600"])
            write(group, "cgroup.procs", str(proc.pid))
        write(BE, "cgroup.subtree_control", cpu_on)
        held.mkdir(f"{BE}/pod1", f"{BE}/pod2")
        write(f"{BE}/pod2", "cpuset.cpus", str(online))
        held.busy(f"{BE}/pod1")
        held.busy(f"{BE}/pod2", 1)
        return [QosMember(p, "BE", f"{BE}/{p}") for p in ("pod1", "pod2")]
    if name == "threadroot":
        held.mkdir(f"{BE}/t1", f"{BE}/t2")
        for t in ("t1", "t2"):
            write(f"{BE}/{t}", "cgroup.type", "threaded")
        held.busy(BE)
        _proc, tids = held.busy(BE, 2)
        write(BE, "cgroup.subtree_control", cpu_on)
        write(f"{BE}/t2", "cpuset.cpus", str(online))
        write(f"{BE}/t1", "cgroup.threads", tids[0])
        write(f"{BE}/t2", "cgroup.threads", tids[1])
        return [QosMember("be", "BE", BE)]
    write(BE, "cgroup.subtree_control", cpu_on)
    if name == "threadedpod":
        pod = f"{BE}/pod"
        held.mkdir(pod, f"{pod}/t1", f"{pod}/t2")
        for t in ("t1", "t2"):
            write(f"{pod}/{t}", "cgroup.type", "threaded")
        held.busy(pod)
        _proc, tids = held.busy(pod, 2)
        write(pod, "cgroup.subtree_control", cpu_on)
        write(f"{pod}/t2", "cpuset.cpus", "1-2")
        write(f"{pod}/t1", "cgroup.threads", tids[0])
        write(f"{pod}/t2", "cgroup.threads", tids[1])
        return [QosMember("pod", "BE", pod)]
    if name == "inherit":
        held.mkdir(f"{BE}/pod1", f"{BE}/pod1/c1", f"{BE}/pod2")
        write(f"{BE}/pod1", "cgroup.subtree_control", cpu_on)
        held.busy(f"{BE}/pod1/c1")
        held.busy(f"{BE}/pod2", 1)
        return [QosMember("c1", "BE", f"{BE}/pod1/c1"), QosMember("pod2", "BE", f"{BE}/pod2")]
    pods = {"p1": "1-2", "p2": str(online.first()), "p3": str(last), "p4": ""}
    for pod, cpus in pods.items():
        held.mkdir(f"{BE}/{pod}")
        if cpus:
            write(f"{BE}/{pod}", "cpuset.cpus", cpus)
        held.busy(f"{BE}/{pod}")
    return [QosMember(p, "BE", f"{BE}/{p}") for p in pods]


def put_back(before: dict[str, Any], populated: bool, node: QosNode, written: bool) -> str:
    """What `off` should leave in a BE group's cpuset.cpus: the value before when corepin never
    wrote it; an empty one empty again unless the group is populated (the kernel refuses:
    then the CPUs it had, less the exclusive ones); a value of its own less the exclusive
    CPUs (the candidates when nothing is left)."""
    value = before["cpuset.cpus"]
    if not written:
        return str(value)
    if value == "" and not populated:
        return ""
    had = CPUSet.parse(value or before["effective"])
    return str((had & node.online) - node.exclusive or candidates_of(node))


def layout_check(name: str) -> dict[str, Any]:
    v = Verdicts(("confined", "outside untouched", "off restores", "no problem"))
    v.figures["layout"] = name
    held = Held()
    reports: list[QosReport] = []
    try:
        write("", "cgroup.subtree_control", "+cpuset +cpu")
        held.mkdir(TOP, LS, BE)
        write(TOP, "cgroup.subtree_control", "+cpuset +cpu")
        online = CPUSet.parse(read("", "cpuset.cpus.effective"))
        held.busy(LS)
        held.busy(LS)
        members = [QosMember("ls", "LS", LS), *build_layout(name, held, online)]
        node = test_node(online, BE)
        before = snapshot()
        for group in groups_below(BE):
            before[group]["effective"] = read(group, "cpuset.cpus.effective")
        v.figures["before"] = {g: before[g]["cpuset.cpus"] for g in groups_below(BE)}
        v.figures["before_effective"] = {g: before[g]["effective"] for g in groups_below(BE)}
        driver = CgroupV2(str(ROOT))
        engine = QosEngine(CpuControl(driver), driver)
        policy = QosPolicy(be_suppress=BeSuppress("cpuset", 65, 2))
        for n in range(3):
            if n:
                time.sleep(PAUSE)
            reports.append(engine.period(members, node, policy))
        be = engine.be_cpus or CPUSet()
        v.figures["be_cpus"] = str(be)
        v.figures["budgets"] = [r.be_budget for r in reports]
        v("confined", bool(be) and be <= candidates_of(node), f"BE set {be}")
        during = snapshot()
        v.figures["during"] = {g: during[g]["cpuset.cpus"] for g in groups_below(BE)}
        seen = 0
        for group in groups_below(BE):
            effective = CPUSet.parse(read(group, "cpuset.cpus.effective"))
            v("confined", effective <= be, f"{group} effective {effective} (BE set {be})")
            for tid in during[group]["threads"]:
                cpus = allowed(tid)
                if cpus is not None:
                    seen += 1
                    v("confined", bool(cpus) and cpus <= be, f"thread {tid} in {group}: {cpus}")
        v.figures["be_threads"] = seen
        v("confined", seen >= 2, f"{seen} BE threads seen")
        for group, row in before.items():
            if group and not inside(group, BE):
                v("outside untouched", during.get(group) == row, f"{group}: {during.get(group)}")
        v("outside untouched", root_files(during) == root_files(before), root_files(during))
        written = {n.target for r in reports for n in r.changes}
        off = engine.period(members, node, QosPolicy(be_suppress=BeSuppress("off", 65, 2)))
        reports.append(off)
        after = snapshot()
        v.figures["after"] = {g: after[g]["cpuset.cpus"] for g in groups_below(BE)}
        v.figures["changes"] = [str(n) for r in reports for n in r.changes]
        for group, row in before.items():
            now = after.get(group)
            if not group:
                v("outside untouched", root_files(now) == root_files(row), root_files(now))
                continue
            if not inside(group, BE):
                v("outside untouched", now == row, f"after off {group}: {now}")
                continue
            if now is None:
                v("off restores", False, f"{group} is gone")
                continue
            populated = any(before[g]["threads"] for g in before if inside(g, group))
            want = put_back(row, populated, node, group in written)
            v("off restores", now["cpuset.cpus"] == want, f"{group}: {now['cpuset.cpus']!r}")
            for key in (*FIELDS, "threads"):
                if key != "cpuset.cpus":
                    v("off restores", now[key] == row[key], f"{group} {key}: {now[key]!r}")
        for report in reports:
            v("no problem", not report.problems, report.problems)
    except (CgroupError, OSError) as err:
        v.problems.append(f"error: {err!r}")
    finally:
        held.teardown()
    return v.result()


# ---------------------------------------------------------------------- part `host`
def corepin(state: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "corepin", args[0], "--state-dir", state, *args[1:]]
    env = {**os.environ, "COREPIN_CGROUPS": "on"}
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)


def runs(state: str) -> dict[str, dict[str, Any]]:
    """The state directory's allocations by name (`corepin report -o json`)."""
    report = corepin(state, "report", "-o", "json")
    if report.returncode != 0:
        return {}
    return {row["name"]: row for row in json.loads(report.stdout)["allocations"]}


def threads_of(pid: int) -> list[str]:
    try:
        return os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []


def host_check(state: str) -> dict[str, Any]:
    v = Verdicts(
        (
            "the runs started",
            "cpuset",
            "exclusive untouched",
            "LS keeps its CPUs",
            "cfsquota",
            "cpuset put back",
            "idle",
            "report",
            "clean",
        )
    )
    held = Held()
    env = {**os.environ, "COREPIN_CGROUPS": "on"}
    config = Path(state, "qos.yaml")
    base = [sys.executable, "-m", "corepin", "run", "--state-dir", state]
    parent: str | None = None
    try:
        os.makedirs(state, mode=0o700, exist_ok=True)
        starts = [
            ("ex", ["--exclusive", "1", "--", "sleep", "3600"]),
            ("be1", ["--shared", "--qos-class", "BE", "--", sys.executable, "-c", BUSY, "1"]),
            ("be2", ["--shared", "--qos-class", "BE", "--", sys.executable, "-c", BUSY, "1"]),
            ("ls", ["--shared", "--", sys.executable, "-c", BUSY, "1"]),
        ]
        rows: dict[str, dict[str, Any]] = {}
        for name, args in starts:
            held.procs.append(subprocess.Popen([*base, "--name", name, *args], env=env))
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                rows = runs(state)
                if name in rows and rows[name].get("pid"):
                    break
                time.sleep(0.3)
        time.sleep(0.5)  # (the busy loops start their second thread)
        rows = runs(state)
        if not v("the runs started", len(rows) == 4, sorted(rows)):
            return v.result()
        mine = CPUSet.parse(rows["ex"]["cpus"])
        be_group = os.path.dirname(rows["be1"]["cgroup"].strip("/"))
        parent = os.path.dirname(be_group)
        v.figures.update(exclusive=str(mine), be_group=be_group, pool=runs_pool(state))
        v("the runs started", be_group.endswith("/besteffort"), rows["be1"]["cgroup"])
        ls_before = {t: allowed(t) for t in threads_of(rows["ls"]["pid"])}
        v.figures["ls_before"] = sorted({str(c) for c in ls_before.values()})

        config.write_text("beSuppress: {policy: cpuset, minCPUs: 1}\n")
        first = corepin(state, "reconcile", "--once", "--qos-config", str(config), "-o", "json")
        v.figures["cpuset_changes"] = first.stdout.strip()[-3000:]
        v("cpuset", first.returncode == 0, f"reconcile exit {first.returncode}: {first.stderr}")
        be_set = CPUSet.parse(read(be_group, "cpuset.cpus.effective"))
        pool = CPUSet.parse(runs_pool(state))
        v.figures["be_set"] = str(be_set)
        v("cpuset", bool(be_set) and be_set < pool, f"BE set {be_set}, pool {pool}")
        v("exclusive untouched", not be_set & mine, f"BE set {be_set} has {mine}")
        seen = 0
        for name in ("be1", "be2"):
            for tid in threads_of(rows[name]["pid"]):
                cpus = allowed(tid)
                if cpus is None:
                    continue
                seen += 1
                v("cpuset", bool(cpus) and cpus <= be_set, f"{name} thread {tid} on {cpus}")
                v("exclusive untouched", not cpus & mine, f"{name} thread {tid} on {cpus}")
        v("cpuset", seen >= 4, f"{seen} BE threads")
        for tid in threads_of(rows["ex"]["pid"]):
            v("exclusive untouched", allowed(tid) == mine, f"ex thread {tid}: {allowed(tid)}")
        ls_after = {t: allowed(t) for t in threads_of(rows["ls"]["pid"])}
        v("LS keeps its CPUs", ls_after == ls_before and bool(ls_after), f"{ls_after}")

        config.write_text("beSuppress: {policy: cfsQuota, minCPUs: 1}\n")
        quota = corepin(state, "reconcile", "--once", "--qos-config", str(config), "-o", "json")
        v.figures["cfsquota_changes"] = quota.stdout.strip()[-3000:]
        v.figures["cpu.max"] = read(be_group, "cpu.max")
        v.figures["parent_subtree_control"] = read(parent, "cgroup.subtree_control")
        v("cfsquota", quota.returncode == 0, f"reconcile exit {quota.returncode}: {quota.stderr}")
        words = read(be_group, "cpu.max").split()
        v("cfsquota", len(words) == 2 and words[0].isdigit(), f"cpu.max {words}")
        # the cpuset is put back though an earlier process narrowed it: empty (inheriting),
        # or - the kernel keeps a group with tasks below it from going empty - the pool
        back = read(be_group, "cpuset.cpus")
        v.figures["be_cpuset_after_cfsquota"] = back
        v("cpuset put back", back in ("", str(pool)), f"BE group cpuset.cpus {back!r}")

        config.write_text("beSuppress: {policy: cfsQuota, minCPUs: 1}\nbeCPUIdle: true\n")
        idle = corepin(state, "reconcile", "--once", "--qos-config", str(config), "-o", "json")
        v("idle", idle.returncode == 0, f"reconcile exit {idle.returncode}: {idle.stderr}")
        v("idle", read(be_group, "cpu.idle") == "1", f"cpu.idle {read(be_group, 'cpu.idle')}")
        for name in ("be1", "be2"):  # (the pass after: the runs' groups follow the BE group)
            for tid in threads_of(rows[name]["pid"]):
                cpus = allowed(tid)
                v("cpuset put back", cpus in (None, pool), f"{name} thread {tid} on {cpus}")

        classes = {name: row.get("qos_class") for name, row in runs(state).items()}
        v.figures["classes"] = classes
        want = {"ex": "LSE", "be1": "BE", "be2": "BE", "ls": "LS"}
        v("report", classes == want, classes)
    except (CgroupError, OSError, ValueError, KeyError) as err:
        v.problems.append(f"error: {err!r}")
    finally:
        for proc in held.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in held.procs:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        last = corepin(state, "reconcile", "--once", "-o", "json")
        v.figures["cleanup_changes"] = last.stdout.strip()[-2000:]
    left = runs(state)
    v("clean", not left, f"allocations left: {sorted(left)}")
    if parent is not None:
        groups = groups_below(parent) if (ROOT / parent).exists() else []
        v("clean", not groups, f"groups left: {groups}")
    return v.result()


def runs_pool(state: str) -> str:
    report = corepin(state, "report", "-o", "json")
    return str(json.loads(report.stdout)["shared_pool"]) if report.returncode == 0 else ""


# ---------------------------------------------------------------------- part `burst`
def burst_check() -> dict[str, Any]:
    v = Verdicts(("clamped", "raised while throttled", "lowered when idle", "no problem"))
    held = Held()
    group = "cpqos-burst"
    base = CpuQuota(50_000, 100_000)
    try:
        write("", "cgroup.subtree_control", "+cpuset +cpu")
        held.mkdir(group)
        write(group, "cpu.max", "50000 100000")
        driver = CgroupV2(str(ROOT))
        cpu = CpuControl(driver)
        engine = QosEngine(cpu, driver)
        online = CPUSet.parse(read("", "cpuset.cpus.effective"))
        node = QosNode(online, CPUSet(), CPUSet(), CPUSet(), online, None)
        members = [QosMember("svc", "LS", group, base_quota=base)]
        for _ in range(2):
            proc = held.start([sys.executable, "-c", BURSTY])
            write(group, "cgroup.procs", str(proc.pid))
        off = BeSuppress("off", 65, 2)
        static = QosPolicy(be_suppress=off, cpu_burst=CpuBurst("cpuBurstOnly", 1000))
        report = engine.period(members, node, static)
        v("no problem", not report.problems, report.problems)
        v(
            "clamped",
            read(group, "cpu.max.burst") == "50000" and read(group, "cpu.max") == "50000 100000",
            f"{read(group, 'cpu.max.burst')} / {read(group, 'cpu.max')}",
        )
        auto = QosPolicy(be_suppress=off, cpu_burst=CpuBurst("auto", 100, 300, 90))
        quotas: list[int] = []
        counters: list[int] = []
        for _ in range(4):
            time.sleep(PAUSE)
            report = engine.period(members, node, auto)
            v("no problem", not report.problems, report.problems)
            quotas.append(int(read(group, "cpu.max").split()[0]))
            stat = cpu.throttling(group)
            counters.append(stat.nr_throttled if stat is not None else -1)
            v("clamped", int(read(group, "cpu.max.burst")) <= quotas[-1], read(group, "cpu.max"))
        v.figures.update(raised=quotas, nr_throttled=counters)
        v("raised while throttled", counters[-1] > counters[0] > 0, f"nr_throttled {counters}")
        v(
            "raised while throttled",
            quotas[-1] > quotas[0] > 50_000 and quotas[-1] <= 150_000,
            f"cpu.max quotas {quotas}",
        )
        for proc in held.procs:
            proc.kill()
            proc.wait()
        lowered: list[int] = []
        for _ in range(8):
            time.sleep(PAUSE)
            report = engine.period(members, node, auto)
            v("no problem", not report.problems, report.problems)
            lowered.append(int(read(group, "cpu.max").split()[0]))
            v("clamped", int(read(group, "cpu.max.burst")) <= lowered[-1], read(group, "cpu.max"))
            if lowered[-1] == 50_000:
                break
        v.figures["lowered"] = lowered
        v("lowered when idle", lowered[-1] == 50_000, f"cpu.max quotas {lowered}")
        v("lowered when idle", lowered == sorted(lowered, reverse=True), f"{lowered}")
    except (CgroupError, OSError, ValueError) as err:
        v.problems.append(f"error: {err!r}")
    finally:
        held.teardown()
    return v.result()


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("part", choices=("engine", "host", "burst", *LAYOUTS))
    parser.add_argument("--state-dir", default="/tmp/cpqos-host-state")
    parser.add_argument("--this-machine-is-mine", action="store_true")
    args = parser.parse_args()
    if not args.this_machine_is_mine:
        parser.error("this writes the machine's cgroups: run it in a guest, --this-machine-is-mine")
    if args.part == "engine":
        data = engine_check()
    elif args.part == "host":
        data = host_check(args.state_dir)
    elif args.part == "burst":
        data = burst_check()
    else:
        data = layout_check(args.part)
    print(json.dumps(data))
    return 0 if data["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
