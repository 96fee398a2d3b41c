"""The node QoS loop on cgroup v2, checked inside a machine that is ours (a test-bed guest): run
INSIDE a guest, never on a shared host.

    python tests/vm/qos_v2_guest_check.py --this-machine-is-mine

Builds below /sys/fs/cgroup (cpuset and cpu on at the root): `cpqos/besteffort` (the BE group,
empty cpuset.cpus: it inherits) with `pod1` (empty cpuset.cpus, inheriting, a busy loop in it)
and `pod2` (CPUs of its own, a busy loop), and `cpqos/ls` (two busy loops). The node: CPU 0
reserved, the last CPU exclusive, the one before it LSR; the candidates for BE are the rest.
Then, with `QosEngine` over `CgroupV2`:

- `cpuset`: the first period keeps BE off the reserved, exclusive and LSR CPUs; once measured,
  BE shrinks to what the budget allows, in the BE group and pod2, pod1 stays empty and its
  effective CPUs follow, and the kernel confines both loops to the set;
- `idle`: `beCPUIdle` sets the BE group's cpu.idle to 1, and back to 0 when turned off;
- `cfsquota`: the budget as the BE group's cpu.max; the cpusets put back: pod2 the candidates,
  and the BE group, empty before, too (the kernel refuses to empty a cpuset with tasks below
  it: ENOSPC), pod1 still empty; `off` puts cpu.max back to max;
- `burst`: with cpu.max 50000 the kernel refuses a cpu.max.burst of 60000, `write_burst_us`
  clamps 1 s to 50000 and reads it back, and the engine's static burst writes it.

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
from pathlib import Path
from typing import Any

from corepin.allocation.qos import BeSuppress, CpuBurst, QosPolicy, be_quota_us, next_be_cpus
from corepin.core.cpuset import CPUSet
from corepin.core.errors import CgroupError
from corepin.enforcement.cgroups import CgroupV2, CpuQuota
from corepin.enforcement.qos import CpuControl, QosEngine, QosMember, QosNode

ROOT = Path("/sys/fs/cgroup")
TOP, BE, POD1, POD2, LS = (
    "cpqos",
    "cpqos/besteffort",
    "cpqos/besteffort/pod1",
    "cpqos/besteffort/pod2",
    "cpqos/ls",
)
SPIN = "while True:\n    pass\n"
PAUSE = 1.0


def read(group: str, name: str) -> str:
    try:
        return (ROOT / group / name).read_text().strip()
    except OSError:
        return "<missing>"


def allowed(pid: int) -> str:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return line.split(":", 1)[1].strip()
    return ""


class Bed:
    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        (ROOT / "cgroup.subtree_control").write_text("+cpuset +cpu")
        for group in (TOP, BE, POD1, POD2, LS):
            (ROOT / group).mkdir()
        for group in (TOP, BE):
            (ROOT / group / "cgroup.subtree_control").write_text("+cpuset +cpu")
        self.online = CPUSet.parse(read("", "cpuset.cpus.effective"))
        (ROOT / POD2 / "cpuset.cpus").write_text(str(self.online))
        self.be_loops = [self.spin(POD1), self.spin(POD2)]
        self.ls_loops = [self.spin(LS), self.spin(LS)]
        last = self.online.last()
        self.node = QosNode(
            online=self.online,
            reserved=CPUSet.of(self.online.first()),
            exclusive=CPUSet.of(last),
            lsr=CPUSet.of(self.online.sorted()[-2]),
            shared_pool=self.online - CPUSet.of(last),
            be_group=BE,
        )
        self.candidates = self.node.shared_pool - self.node.reserved - self.node.lsr
        self.driver = CgroupV2(str(ROOT))
        self.cpu = CpuControl(self.driver)
        self.engine = QosEngine(self.cpu, self.driver)
        self.members = [
            QosMember("ls", "LS", LS, base_quota=CpuQuota(50_000, 100_000)),
            QosMember("pod1", "BE", POD1),
            QosMember("pod2", "BE", POD2),
        ]

    def spin(self, group: str) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen([sys.executable, "-c", SPIN])
        (ROOT / group / "cgroup.procs").write_text(str(proc.pid))
        self.procs.append(proc)
        return proc

    def teardown(self) -> None:
        for proc in self.procs:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        time.sleep(0.3)
        for group in (POD1, POD2, BE, LS, TOP):
            for _ in range(50):
                try:
                    (ROOT / group).rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)


def check() -> dict[str, Any]:
    problems: list[str] = []
    verdicts: dict[str, bool] = {}
    figures: dict[str, Any] = {}
    bed = Bed()

    def verdict(name: str, ok: bool, detail: str) -> None:
        verdicts[name] = verdicts.get(name, True) and ok
        if not ok:
            problems.append(f"{name}: {detail}")

    try:
        policy = QosPolicy(be_suppress=BeSuppress("cpuset", 65, 2))
        first = bed.engine.period(bed.members, bed.node, policy)
        figures["first"] = {"be_cpus": str(first.be_cpus), "problems": first.problems}
        verdict("cpuset", first.be_cpus == bed.candidates, f"first period {first.be_cpus}")
        verdict("cpuset", read(BE, "cpuset.cpus") == str(bed.candidates), read(BE, "cpuset.cpus"))
        previous = first.be_cpus or CPUSet()
        for _ in range(2):
            time.sleep(PAUSE)
            report = bed.engine.period(bed.members, bed.node, policy)
            budget = report.be_budget
            figures.setdefault("periods", []).append(
                {
                    "usage": report.usage,
                    "budget": budget,
                    "be_cpus": str(report.be_cpus),
                    "problems": report.problems,
                }
            )
            if budget is None:
                verdict("cpuset", False, "no budget after a measured period")
                continue
            want = next_be_cpus(previous, budget, bed.candidates, len(bed.online), 2)
            verdict("cpuset", report.be_cpus == want, f"{report.be_cpus} != {want}")
            verdict("cpuset", report.usage.get("LS", 0) > 0.2, f"LS usage {report.usage}")
            previous = want
        verdict("cpuset", len(previous) < len(bed.candidates), f"BE did not shrink: {previous}")
        for group in (BE, POD2):
            verdict(
                "cpuset",
                read(group, "cpuset.cpus") == str(previous),
                f"{group}: {read(group, 'cpuset.cpus')}",
            )
        verdict("children", read(POD2, "cpuset.cpus") == str(previous), read(POD2, "cpuset.cpus"))
        verdict(
            "inherit",
            read(POD1, "cpuset.cpus") == "",
            f"pod1 cpuset.cpus {read(POD1, 'cpuset.cpus')!r}",
        )
        verdict(
            "inherit",
            read(POD1, "cpuset.cpus.effective") == str(previous),
            f"pod1 effective {read(POD1, 'cpuset.cpus.effective')}",
        )
        for proc in bed.be_loops:
            verdict(
                "children", allowed(proc.pid) == str(previous), f"{proc.pid} on {allowed(proc.pid)}"
            )
        figures["be_cpus"] = str(previous)

        idle = QosPolicy(be_suppress=BeSuppress("cpuset", 65, 2), be_cpu_idle=True)
        bed.engine.period(bed.members, bed.node, idle)
        verdict("idle", read(BE, "cpu.idle") == "1", f"cpu.idle {read(BE, 'cpu.idle')}")
        bed.engine.period(bed.members, bed.node, policy)
        verdict("idle", read(BE, "cpu.idle") == "0", f"cpu.idle after off {read(BE, 'cpu.idle')}")

        time.sleep(PAUSE)
        quota = bed.engine.period(
            bed.members, bed.node, QosPolicy(be_suppress=BeSuppress("cfsQuota", 65, 2))
        )
        figures["cfsquota"] = {
            "budget": quota.be_budget,
            "cpu.max": read(BE, "cpu.max"),
            "changes": [str(n) for n in quota.changes],
            "problems": quota.problems,
        }
        if quota.be_budget is None:
            verdict("cfsquota", False, "no budget")
        else:
            want_max = f"{be_quota_us(quota.be_budget, 100_000)} 100000"
            verdict(
                "cfsquota",
                read(BE, "cpu.max") == want_max,
                f"cpu.max {read(BE, 'cpu.max')} != {want_max}",
            )
        verdict("cfsquota", read(POD1, "cpuset.cpus") == "", "pod1 is no longer empty")
        verdict(
            "cfsquota",
            read(BE, "cpuset.cpus") == str(bed.candidates),
            f"BE cpuset not put back: {read(BE, 'cpuset.cpus')!r}",
        )
        verdict(
            "cfsquota",
            read(POD2, "cpuset.cpus") == str(bed.candidates),
            f"pod2 {read(POD2, 'cpuset.cpus')}",
        )
        bed.engine.period(bed.members, bed.node, QosPolicy(be_suppress=BeSuppress("off", 65, 2)))
        verdict(
            "cfsquota", read(BE, "cpu.max") == "max 100000", f"after off: {read(BE, 'cpu.max')}"
        )

        bed.driver.write_quota(LS, CpuQuota(50_000, 100_000))
        try:
            (ROOT / LS / "cpu.max.burst").write_text("60000")
            verdict("burst", False, "the kernel took a burst above the quota")
        except OSError as err:
            figures["burst_refusal"] = os.strerror(err.errno or 0)
        held = bed.cpu.write_burst_us(LS, 1_000_000)
        verdict("burst", held == 50_000 and read(LS, "cpu.max.burst") == "50000", f"held {held}")
        bed.cpu.write_burst_us(LS, 0)
        static = QosPolicy(
            be_suppress=BeSuppress("off", 65, 2),
            cpu_burst=CpuBurst("cpuBurstOnly", burst_percent=1000),
        )
        report = bed.engine.period(bed.members, bed.node, static)
        verdict(
            "burst",
            read(LS, "cpu.max.burst") == "50000",
            f"engine: {read(LS, 'cpu.max.burst')} {report.problems}",
        )
        figures["burst_changes"] = report.burst_changes
    except (CgroupError, OSError) as err:
        problems.append(f"error: {err}")
    finally:
        bed.teardown()
    for name in ("cpuset", "children", "inherit", "idle", "cfsquota", "burst"):
        verdicts.setdefault(name, False)
    return {
        "ok": not problems and all(verdicts.values()),
        "problems": problems,
        "verdicts": verdicts,
        "figures": figures,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--this-machine-is-mine", action="store_true")
    args = parser.parse_args()
    if not args.this_machine_is_mine:
        parser.error("this writes the machine's cgroups: run it in a guest, --this-machine-is-mine")
    data = check()
    print(json.dumps(data))
    return 0 if data["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
