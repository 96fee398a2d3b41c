"""The shield on cgroup v2 layouts the kernel allows, checked inside a machine that is ours (a
test-bed guest): run INSIDE a guest, never on a shared host.

    python tests/vm/shield_v2_guest_check.py --this-machine-is-mine --state-dir DIR LAYOUT

Layouts (each built below /sys/fs/cgroup with scratch `sleep` tasks, cpuset and memory on at
the root as on a systemd host):

- `flat`: a scope /cpv2f whose own group holds three tasks and that has no child (the kernel
  would let it enable cpuset with those tasks in it and turn it into a thread root);
- `internal`: a scope /cpv2s whose own group holds three tasks (the "internal process" case),
  a group below it holding a task and giving no controller to its own child (which holds one
  too), a leaf with a task, and a threaded subtree (a thread root with a threaded child holding
  one thread of a two-thread process);
- `threadroot`: a scope /cpv2t that is a thread root already: a task in it, a threaded child
  holding one thread of a two-thread process whose main thread is in the scope;
- `inherit`: a scope /cpv2e that gives cpuset to its children already: a leaf with tasks and
  an empty cpuset.cpus (inheriting), and a sibling with CPUs of its own.

For each: snapshot (every group's cpuset.cpus - absent or empty included -, subtree_control,
cgroup.type, every thread's group), `shield on --scope`, `run --exclusive 1`, check in /proc
that no thread of the scope but the run's may use the run's CPU and that `shield status`
lists nothing exposed, `shield off`, and check that the snapshot is what it was.

Prints one JSON object (`ok`, `problems`, figures); exits 0 when `ok`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path("/sys/fs/cgroup")
THREADS = (
    "import threading, time, sys\n"
    "def spin():\n"
    "    open(sys.argv[1], 'w').write(str(threading.get_native_id())); time.sleep(3600)\n"
    "threading.Thread(target=spin, daemon=True).start(); time.sleep(3600)\n"
)


def corepin(state: str, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "corepin", args[0], "--state-dir", state, *args[1:]]
    return subprocess.run(argv, capture_output=True, text=True, timeout=300)


def parse_list(text: str) -> set[int]:
    out: set[int] = set()
    for part in text.strip().split(","):
        if part:
            lo, _, hi = part.partition("-")
            out.update(range(int(lo), int(hi or lo) + 1))
    return out


def write(path: Path, value: str) -> None:
    path.write_text(value + "\n")


def sleeper(group: Path) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(["sleep", "3600"])
    write(group / "cgroup.procs", str(proc.pid))
    return proc


def read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def snapshot(scope: Path) -> dict[str, Any]:
    groups: dict[str, Any] = {}
    for d in sorted([scope, *[p for p in scope.rglob("*") if p.is_dir()]]):
        rel = str(d.relative_to(ROOT))
        groups[rel] = {
            "cpus": read(d / "cpuset.cpus"),
            "partition": read(d / "cpuset.cpus.partition"),
            "mems": read(d / "cpuset.mems"),
            "subtree_control": read(d / "cgroup.subtree_control"),
            "type": read(d / "cgroup.type"),
            "threads": sorted((read(d / "cgroup.threads") or "").split()),
        }
    return {"groups": groups, "root_subtree_control": read(ROOT / "cgroup.subtree_control")}


def scope_threads(scope: Path) -> dict[int, tuple[str, set[int]]]:
    """tid -> (comm, allowed CPUs) of every thread in the scope's groups."""
    out: dict[int, tuple[str, set[int]]] = {}
    for d in [scope, *[p for p in scope.rglob("*") if p.is_dir()]]:
        for tid in (read(d / "cgroup.threads") or "").split():
            status = read(Path(f"/proc/{tid}/status")) or ""
            fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
            if "Cpus_allowed_list" in fields:
                out[int(tid)] = (
                    fields["Name"].strip(),
                    parse_list(fields["Cpus_allowed_list"].strip()),
                )
    return out


def threads(group: Path, second: Path) -> subprocess.Popen[bytes]:
    """A two-thread process in `group`, its second thread moved to the threaded `second`."""
    tid_file = Path(f"/tmp/cpv2-tid-{group.name}")
    tid_file.unlink(missing_ok=True)
    proc = subprocess.Popen([sys.executable, "-c", THREADS, str(tid_file)])
    write(group / "cgroup.procs", str(proc.pid))
    deadline = time.monotonic() + 30
    while not (tid_file.exists() and tid_file.read_text()) and time.monotonic() < deadline:
        time.sleep(0.1)
    write(second / "cgroup.threads", tid_file.read_text())
    return proc


def build(layout: str, held: list[subprocess.Popen[bytes]]) -> Path:
    write(ROOT / "cgroup.subtree_control", "+cpuset +memory")
    if layout == "internal":
        scope = ROOT / "cpv2s"
        scope.mkdir()
        for _ in range(3):
            held.append(sleeper(scope))
        for sub in ("leaf", "mid", "mid/child", "app", "app/t"):
            (scope / sub).mkdir()
        held.append(sleeper(scope / "leaf"))
        held.append(sleeper(scope / "mid"))
        held.append(sleeper(scope / "mid/child"))
        write(scope / "app/t/cgroup.type", "threaded")
        held.append(threads(scope / "app", scope / "app/t"))
        return scope
    if layout == "threadroot":  # the scope is a thread root: tasks in it, a threaded child
        scope = ROOT / "cpv2t"
        scope.mkdir()
        (scope / "t").mkdir()
        write(scope / "t/cgroup.type", "threaded")
        held.append(sleeper(scope))
        held.append(threads(scope, scope / "t"))
        return scope
    if layout == "flat":  # the scope's own group holds every task: nothing below it
        scope = ROOT / "cpv2f"
        scope.mkdir()
        for _ in range(3):
            held.append(sleeper(scope))
        return scope
    scope = ROOT / "cpv2e"
    scope.mkdir()
    write(scope / "cgroup.subtree_control", "+cpuset")
    for sub in ("leaf", "fixed"):
        (scope / sub).mkdir()
    held.append(sleeper(scope / "leaf"))
    held.append(sleeper(scope / "leaf"))
    write(scope / "fixed/cpuset.cpus", "1-2")
    held.append(sleeper(scope / "fixed"))
    return scope


def partition_scope(layout: str) -> Path:
    return ROOT / ("cpv2p" if layout == "partition" else "cpv2q")


def build_partition(layout: str, mine: int, held: list[subprocess.Popen[bytes]]) -> Path:
    """A partition on the exclusive run's CPU `mine` below the scope: valid (`partition`: the
    scope is a partition root of that CPU and one more, the root's child, so a partition
    below it is valid) or invalid (`badpartition`: the scope is a plain member, and a
    partition below a member is "root invalid"). A member leaf with a task beside it."""
    write(ROOT / "cgroup.subtree_control", "+cpuset +memory")
    online = sorted(parse_list(read(ROOT / "cpuset.cpus.effective") or ""))
    other = next(c for c in reversed(online) if c not in (0, mine))
    scope = partition_scope(layout)
    scope.mkdir()
    if layout == "partition":
        write(scope / "cpuset.cpus", f"{min(mine, other)},{max(mine, other)}")
        write(scope / "cpuset.cpus.partition", "root")
    write(scope / "cgroup.subtree_control", "+cpuset")
    for sub in ("part", "part/inner", "leaf"):
        (scope / sub).mkdir()
    write(scope / "part/cpuset.cpus", str(mine))
    write(scope / "part/cpuset.cpus.partition", "root")
    # tasks below the partition, none in it: a group that gives cpuset to its children and
    # holds a task is a thread root, whose domain child could take none
    write(scope / "part/cgroup.subtree_control", "+cpuset")
    held.append(sleeper(scope / "part/inner"))
    held.append(sleeper(scope / "part/inner"))
    held.append(sleeper(scope / "leaf"))
    return scope


def partition_check(layout: str, state: str) -> dict[str, Any]:
    """The run first (its CPU is the partition's), then the layout, `shield on`: the shield
    leaves the partition and everything below it as it is, names every thread of the scope
    still allowed on the run's CPU as exposed and then exits 4 (0 when there is none), covers
    the other groups; `shield off` puts everything back."""
    problems: list[str] = []
    figures: dict[str, Any] = {"layout": layout}
    held: list[subprocess.Popen[bytes]] = []
    run, mine = start_run(state)
    scope = partition_scope(layout)
    try:
        if mine is None:
            return {"ok": False, "problems": ["the exclusive run did not start"], "figures": {}}
        figures["exclusive_cpus"] = [mine]
        scope = build_partition(layout, mine, held)
        before = snapshot(scope)
        figures["partitions"] = {
            k: v["partition"] for k, v in before["groups"].items() if v["partition"] != "member"
        }
        valid = before["groups"][f"{scope.name}/part"]["partition"] == "root"
        if valid != (layout == "partition"):
            problems.append(f"layout: {scope.name}/part is {figures['partitions']}")
        on = corepin(state, "shield", "on", "--scope", scope.name, "-o", "json")
        figures["on_rc"] = on.returncode
        time.sleep(0.3)
        during = snapshot(scope)
        for key, b in before["groups"].items():
            if key.startswith(f"{scope.name}/part") and during["groups"].get(key) != b:
                problems.append(
                    f"the shield changed the partition {key}: was {b}, now "
                    f"{during['groups'].get(key)}"
                )
        on_cpu = {tid: comm for tid, (comm, cpus) in scope_threads(scope).items() if mine in cpus}
        figures["allowed_on_run_cpu"] = sorted(on_cpu)
        outside = [
            t
            for t in on_cpu
            if f"/{scope.name}/part" not in (read(Path(f"/proc/{t}/cgroup")) or "")
        ]
        if outside:
            problems.append(f"threads outside the partition allowed on the run's CPU: {outside}")
        status = json.loads(corepin(state, "shield", "status", "-o", "json").stdout)
        named = {int(e["tid"]) for e in status.get("exposed", [])} | {
            int(e["pid"]) for e in status.get("exposed", [])
        }
        figures["exposed"] = sorted(named)
        if set(on_cpu) - named:
            problems.append(f"not listed as exposed: {sorted(set(on_cpu) - named)}")
        if on.returncode != (4 if on_cpu else 0):
            problems.append(f"shield on exit {on.returncode} with {len(on_cpu)} exposed task(s)")
        off = corepin(state, "shield", "off")
        figures["off_rc"] = off.returncode
        if off.returncode != 0:
            problems.append(f"shield off exit {off.returncode}: {off.stdout.strip()[-800:]}")
        after = snapshot(scope)
        for key in sorted(set(before["groups"]) | set(after["groups"])):
            b, a = before["groups"].get(key), after["groups"].get(key)
            if a != b:
                problems.append(f"{key}: was {b}, now {a}")
    finally:
        if scope.exists():
            teardown(scope, held)
        run.terminate()
        run.wait(timeout=60)
    return {"ok": not problems, "problems": problems, "figures": figures}


def start_run(state: str) -> tuple[subprocess.Popen[bytes], int | None]:
    """`corepin run --exclusive 1 -- sleep 600` and its CPU (None when it did not start)."""
    run = subprocess.Popen(
        [
            *(sys.executable, "-m", "corepin", "run", "--state-dir", state),
            *("--exclusive", "1", "--", "sleep", "600"),
        ]
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        report = corepin(state, "report", "-o", "json")
        rows = json.loads(report.stdout)["allocations"] if report.returncode == 0 else []
        if rows:
            return run, min(parse_list(rows[0]["cpus"]))
        time.sleep(0.2)
    return run, None


def teardown(scope: Path, held: list[subprocess.Popen[bytes]]) -> None:
    for proc in held:
        proc.kill()
        proc.wait()
    time.sleep(0.3)
    for d in sorted([p for p in scope.rglob("*") if p.is_dir()], key=lambda p: -len(p.parts)):
        d.rmdir()
    scope.rmdir()


def check(layout: str, state: str) -> dict[str, Any]:
    problems: list[str] = []
    figures: dict[str, Any] = {"layout": layout}
    held: list[subprocess.Popen[bytes]] = []
    scope = build(layout, held)
    try:
        before = snapshot(scope)
        on = corepin(state, "shield", "on", "--scope", scope.name, "-o", "json")
        figures["on_rc"] = on.returncode
        if on.returncode != 0:
            problems.append(f"shield on exit {on.returncode}: {on.stderr.strip()[-600:]}")
        figures["during"] = snapshot(scope)["groups"].get(scope.name, {}).get("type")
        run = subprocess.Popen(
            [
                *(sys.executable, "-m", "corepin", "run", "--state-dir", state),
                "--exclusive",
                "1",
                "--",
                "sleep",
                "600",
            ]
        )
        try:
            rows: list[dict[str, Any]] = []
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not rows:
                report = corepin(state, "report", "-o", "json")
                rows = json.loads(report.stdout)["allocations"] if report.returncode == 0 else []
                time.sleep(0.2)
            if not rows:
                problems.append("the exclusive run did not start")
            else:
                mine = parse_list(rows[0]["cpus"])
                figures["exclusive_cpus"] = sorted(mine)
                time.sleep(0.3)
                exposed = [
                    f"{tid} {comm} cpus={sorted(cpus)}"
                    for tid, (comm, cpus) in scope_threads(scope).items()
                    if cpus & mine
                ]
                if exposed:
                    problems.append(f"threads of the scope allowed on the run's CPU: {exposed}")
                status = json.loads(corepin(state, "shield", "status", "-o", "json").stdout)
                if status.get("exposed"):
                    problems.append(f"shield status lists exposed tasks: {status['exposed']}")
        finally:
            run.terminate()
            run.wait(timeout=60)
        off = corepin(state, "shield", "off")
        figures["off_rc"] = off.returncode
        if off.returncode != 0:
            problems.append(f"shield off exit {off.returncode}: {off.stdout.strip()[-800:]}")
            again = corepin(state, "shield", "off")
            figures["second_off_rc"] = again.returncode
        after = snapshot(scope)
        for key in sorted(set(before["groups"]) | set(after["groups"])):
            b, a = before["groups"].get(key), after["groups"].get(key)
            if a != b:
                problems.append(f"{key}: was {b}, now {a}")
        if after["root_subtree_control"] != before["root_subtree_control"]:
            problems.append(
                f"root subtree_control: was {before['root_subtree_control']}, "
                f"now {after['root_subtree_control']}"
            )
    finally:
        teardown(scope, held)
    return {"ok": not problems, "problems": problems, "figures": figures}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "layout",
        choices=("flat", "internal", "inherit", "threadroot", "partition", "badpartition"),
    )
    parser.add_argument("--state-dir", required=True)
    parser.add_argument("--this-machine-is-mine", action="store_true")
    args = parser.parse_args()
    if not args.this_machine_is_mine:
        parser.error("this moves tasks of the machine: run it in a guest, --this-machine-is-mine")
    os.makedirs(args.state_dir, mode=0o700, exist_ok=True)
    if args.layout in ("partition", "badpartition"):
        data = partition_check(args.layout, args.state_dir)
    else:
        data = check(args.layout, args.state_dir)
    print(json.dumps(data))
    return 0 if data["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
