"""The whole-machine shield, checked from inside a machine that is ours (a test-bed guest).

Run INSIDE a guest (never on a shared host: it shields every task of the machine, its kernel
threads and its IRQs):

    python tests/vm/shield_guest_check.py --state-dir /tmp/shield-state [--hierarchy v2|v1]

It records every task's cgroup and affinity and every IRQ's affinity, raises
`corepin shield on --kthreads --irqs` on the whole hierarchy, starts an exclusive run, then
checks in /proc that no task but the run may use the run's CPU (per-CPU kernel threads the
kernel pins excepted), that kernel threads that can move have moved, and that IRQs that can
move have moved; then takes the shield down and checks that every task, kernel thread and IRQ
is back as it was. With `--hierarchy v1` it first mounts a cgroup v1 cpuset hierarchy (the
guest's kernel must not run with cgroup_no_v1=all) and shields that one.

Prints one JSON object (`ok`, `problems`, figures); exits 0 when `ok`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

PF_KTHREAD = 0x00200000
PF_NO_SETAFFINITY = 0x04000000


def corepin(
    state: str, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    command, rest = args[0], args[1:]
    argv = [sys.executable, "-m", "corepin", command, "--state-dir", state, *rest]
    return subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env)


def parse_list(text: str) -> set[int]:
    out: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def tasks() -> dict[tuple[int, int], dict[str, Any]]:
    """(pid, tid) -> comm, flags, start time, allowed CPUs, cgroup line of every thread."""
    out: dict[tuple[int, int], dict[str, Any]] = {}
    for pid_dir in Path("/proc").iterdir():
        if not pid_dir.name.isdigit():
            continue
        pid = int(pid_dir.name)
        try:
            cgroup = (pid_dir / "cgroup").read_text().strip()
            tids = [int(t.name) for t in (pid_dir / "task").iterdir()]
        except OSError:
            continue
        for tid in tids:
            base = pid_dir / "task" / str(tid)
            try:
                stat = (base / "stat").read_text()
                status = (base / "status").read_text()
            except OSError:
                continue
            rest = stat[stat.rfind(")") + 2 :].split()
            allowed = next(
                line.split(":", 1)[1].strip()
                for line in status.splitlines()
                if line.startswith("Cpus_allowed_list:")
            )
            out[(pid, tid)] = {
                "comm": stat[stat.find("(") + 1 : stat.rfind(")")],
                "state": rest[0],
                "flags": int(rest[6]),
                "start": int(rest[19]),
                "cpus": parse_list(allowed),
                "cgroup": cgroup,
            }
    return out


def irqs() -> dict[str, set[int]]:
    out = {}
    for d in Path("/proc/irq").iterdir():
        if d.name.isdigit():
            try:
                out[d.name] = parse_list((d / "smp_affinity_list").read_text())
            except OSError:
                continue
    return out


def cpusets(root: Path) -> dict[str, tuple[str | None, str | None]]:
    """group -> (cpuset.cpus, cpuset.mems) of every group of the hierarchy at `root` (None
    where a group has no such file: a v2 group whose parent gives no cpuset)."""
    out: dict[str, tuple[str | None, str | None]] = {}
    for d in sorted([root, *[p for p in root.rglob("*") if p.is_dir()]]):
        values = []
        for name in ("cpuset.cpus", "cpuset.mems"):
            try:
                values.append((d / name).read_text().strip())
            except OSError:
                values.append(None)
        out[str(d.relative_to(root))] = (values[0], values[1])
    return out


def v1_groups(root: Path, held: list[subprocess.Popen[bytes]]) -> None:
    """Groups of a v1 cpuset hierarchy that a host has: one with CPUs and memory nodes of its
    own and a narrower child, each holding a task the check starts."""
    cpus = sorted(parse_list((root / "cpuset.cpus").read_text()))
    mems = sorted(parse_list((root / "cpuset.mems").read_text()))
    layout = (
        ("cpv1a", f"{cpus[0]}-{cpus[-1]}", str(mems[-1])),
        ("cpv1a/b", f"{cpus[len(cpus) // 2]}-{cpus[-1]}", str(mems[-1])),
        ("cpv1c", f"{cpus[0]}-{cpus[len(cpus) // 2]}", f"{mems[0]}-{mems[-1]}"),
    )
    for name, group_cpus, group_mems in layout:
        group = root / name
        group.mkdir()
        (group / "cpuset.cpus").write_text(group_cpus + "\n")
        (group / "cpuset.mems").write_text(group_mems + "\n")
        proc = subprocess.Popen(["sleep", "3600"])
        (group / "cgroup.procs").write_text(f"{proc.pid}\n")
        held.append(proc)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--state-dir", required=True)
    parser.add_argument("--hierarchy", choices=("v2", "v1"), default="v2")
    parser.add_argument(
        "--this-machine-is-mine",
        action="store_true",
        help="required: the check shields every task, kernel thread and IRQ of the machine",
    )
    args = parser.parse_args()
    if not args.this_machine_is_mine:
        parser.error(
            "this shields the whole machine: run it in a guest, with --this-machine-is-mine"
        )
    env = dict(os.environ)
    problems: list[str] = []
    figures: dict[str, Any] = {}
    held: list[subprocess.Popen[bytes]] = []
    if args.hierarchy == "v1":
        root = "/tmp/corepin-v1"
        os.makedirs(f"{root}/cpuset", exist_ok=True)
        # the controller must be off in every cgroup v2 subtree_control (an earlier v2 check
        # or run may have left it on) before v1 can have it: deepest groups first
        groups = Path("/sys/fs/cgroup").rglob("cgroup.subtree_control")
        for control in sorted(groups, key=lambda p: len(p.parts), reverse=True):
            with contextlib.suppress(OSError):
                control.write_text("-cpuset\n")
        done = subprocess.run(["mount", "-t", "cgroup", "-o", "cpuset", "cpuset", f"{root}/cpuset"])
        if done.returncode != 0:
            print(json.dumps({"ok": False, "skip": "no cgroup v1 cpuset in this kernel"}))
            return 3
        env["COREPIN_CGROUP_ROOT"] = root
        hierarchy = Path(root, "cpuset")
        v1_groups(hierarchy, held)
    else:
        hierarchy = Path("/sys/fs/cgroup")
    try:
        return shield(args, env, hierarchy, problems, figures)
    finally:
        for proc in held:
            proc.kill()
            proc.wait()
        if args.hierarchy == "v1":
            time.sleep(0.3)
            for name in ("cpv1a/b", "cpv1a", "cpv1c"):
                with contextlib.suppress(OSError):
                    (hierarchy / name).rmdir()


def shield(
    args: argparse.Namespace,
    env: dict[str, str],
    hierarchy: Path,
    problems: list[str],
    figures: dict[str, Any],
) -> int:
    before_groups = cpusets(hierarchy)
    before_tasks = tasks()
    before_irqs = irqs()
    started = time.monotonic()
    on = corepin(args.state_dir, "shield", "on", "--kthreads", "--irqs", "-o", "json", env=env)
    figures["on_seconds"] = round(time.monotonic() - started, 3)
    if on.returncode != 0:
        print(json.dumps({"ok": False, "problems": [f"shield on: {on.stderr.strip()}"]}))
        return 1
    notes = json.loads(on.stdout)["notes"]
    refused_irqs = {
        n["target"].split()[1]
        for n in notes
        if n["action"] == "refused" and n["target"].startswith("irq ")
    }
    run = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "corepin",
            "run",
            "--state-dir",
            args.state_dir,
            "--exclusive",
            "1",
            "--",
            "sleep",
            "600",
        ],
        env=env,
    )
    try:
        deadline = time.monotonic() + 60
        shielded_cpus: set[int] = set()
        rows: list[dict[str, Any]] = []
        while time.monotonic() < deadline and not rows:
            report = corepin(args.state_dir, "report", "-o", "json", env=env)
            rows = json.loads(report.stdout)["allocations"] if report.returncode == 0 else []
            time.sleep(0.2)
        if not rows:
            problems.append("the exclusive run did not start")
        else:
            mine = parse_list(rows[0]["cpus"])
            shielded_cpus |= mine
            run_pid = rows[0]["pid"]
            figures["exclusive_cpus"] = sorted(mine)
            time.sleep(0.5)
            now = tasks()
            exposed = []
            pinned_per_cpu = 0
            for (pid, tid), t in now.items():
                if pid == run_pid or t["state"] in ("Z", "X") or not t["cpus"] & mine:
                    continue
                if t["flags"] & PF_KTHREAD and (
                    t["flags"] & PF_NO_SETAFFINITY or len(t["cpus"]) == 1
                ):
                    pinned_per_cpu += 1  # the kernel pins it there: reported by the shield
                    continue
                if t["flags"] & PF_KTHREAD and t["comm"].startswith("irq/"):
                    continue  # follows its IRQ (a refused one stays)
                exposed.append(f"{pid}/{tid} {t['comm']} cpus={sorted(t['cpus'])}")
            figures["per_cpu_kernel_threads_left"] = pinned_per_cpu
            if exposed:
                problems.append(f"tasks still allowed on the exclusive CPU: {exposed[:20]}")
            status = json.loads(
                corepin(args.state_dir, "shield", "status", "-o", "json", env=env).stdout
            )
            # the kernel may take a new affinity and keep the old one (the legacy timer and
            # cascade): the shield reports those, in its notes or in its status
            refused_irqs |= {row["irq"] for row in status.get("irqs_kept", [])}
            moved_irqs = [n for n, cpus in irqs().items() if cpus & mine and n not in refused_irqs]
            if moved_irqs:
                problems.append(f"IRQs left on the exclusive CPU: {moved_irqs}")
            figures["irqs_refused"] = sorted(refused_irqs)
            if status.get("exposed"):
                problems.append(f"shield status reports exposed tasks: {status['exposed'][:10]}")
    finally:
        run.terminate()
        run.wait(timeout=60)
    started = time.monotonic()
    off = corepin(args.state_dir, "shield", "off", env=env)
    figures["off_seconds"] = round(time.monotonic() - started, 3)
    if off.returncode != 0:
        problems.append(f"shield off: {off.stdout.strip()} {off.stderr.strip()}")
    after_tasks = tasks()
    for key, t in before_tasks.items():
        a = after_tasks.get(key)
        if a is None or a["start"] != t["start"]:
            continue  # exited meanwhile
        if (
            t["flags"] & PF_KTHREAD
            and a["cgroup"] == t["cgroup"]
            and a["cpus"] != t["cpus"] - shielded_cpus
        ):
            # the kernel itself re-binds some of its threads (a workqueue's rescuer follows the
            # pool it rescues): only one left where the shield narrowed it was not restored
            continue
        if (a["cgroup"], a["cpus"]) != (t["cgroup"], t["cpus"]):
            problems.append(
                f"{key} {t['comm']}: was {t['cgroup']} on {sorted(t['cpus'])}, now "
                f"{a['cgroup']} on {sorted(a['cpus'])}"
            )
    after_groups = cpusets(hierarchy)
    figures["groups_checked"] = len(before_groups)
    for group, values in before_groups.items():
        if group not in after_groups:
            continue  # a group that went away meanwhile (a service's, say)
        if after_groups[group] != values:
            problems.append(f"{group}: cpuset.cpus/mems were {values}, now {after_groups[group]}")
    after_irqs = irqs()
    for n, cpus in before_irqs.items():
        if n in after_irqs and after_irqs[n] != cpus:
            problems.append(f"IRQ {n}: was {sorted(cpus)}, now {sorted(after_irqs[n])}")
    print(json.dumps({"ok": not problems, "problems": problems[:50], "figures": figures}))
    return 0 if not problems else 1


if __name__ == "__main__":
    raise SystemExit(main())
