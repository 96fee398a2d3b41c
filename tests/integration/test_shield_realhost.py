"""The shield on this host's real cpuset hierarchy (cgroup v1), on a scratch scope.

This machine runs services that are not ours: every test here shields only a scratch group
`corepin-shieldtest-<random>` below the cpuset root that holds processes the test started,
never the whole hierarchy, never kernel threads or IRQs (those are tested on stand-in trees in
test_shield_engine.py, and for real in the guests: test_shield_guest.py). Each test removes its
scope, its processes and the state directory's groups again, even when it fails. What is
checked comes from /proc (Cpus_allowed_list of every thread, /proc/PID/cgroup).
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from corepin.core.cpuset import CPUSet
from support.helpers import (
    corepin_argv,
    kill_and_remove_cgroup,
    reap,
    remove_state_cgroups,
    run_corepin,
    wait_for,
)

CPUSET = Path("/sys/fs/cgroup/cpuset")


def _skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root to write cgroups"
    if not (CPUSET / "cpuset.cpus").exists():
        return f"no cgroup v1 cpuset hierarchy at {CPUSET}"
    if not os.access(CPUSET, os.W_OK):
        return f"{CPUSET} is not writable"
    if len(os.sched_getaffinity(0)) < 2:
        return "needs two CPUs"
    return None


_REASON = _skip_reason()
pytestmark = [
    pytest.mark.realhost,
    pytest.mark.skipif(_REASON is not None, reason=_REASON or ""),
]
ONLINE = CPUSet.parse((CPUSET / "cpuset.cpus").read_text()) if _REASON is None else CPUSet()


class Scope:
    """A scratch cpuset group with the test's own processes in it."""

    def __init__(self, state: Path) -> None:
        self.name = f"corepin-shieldtest-{uuid.uuid4().hex[:10]}"
        self.path = CPUSET / self.name
        self.state = state
        self.procs: list[subprocess.Popen[bytes]] = []
        self.path.mkdir()
        for name in ("cpuset.cpus", "cpuset.mems"):
            (self.path / name).write_text((CPUSET / name).read_text())

    def group(self, rel: str, cpus: str) -> Path:
        path = self.path / rel
        path.mkdir()
        (path / "cpuset.cpus").write_text(cpus)
        (path / "cpuset.mems").write_text((self.path / "cpuset.mems").read_text())
        return path

    def start(self, argv: list[str], group: str = "", **kw: object) -> subprocess.Popen[bytes]:
        """A process of ours, started directly inside the scope (or its `group`)."""
        procs = self.path / group / "cgroup.procs" if group else self.path / "cgroup.procs"
        script = f'echo $$ > "{procs}" && exec "$@"'
        proc = subprocess.Popen(["sh", "-c", script, "sh", *argv], **kw)  # type: ignore[call-overload]
        self.procs.append(proc)
        wait_for(lambda: proc.pid in self.pids(), what=f"pid {proc.pid} in {procs}")
        return proc

    def sleeper(self, group: str = "") -> subprocess.Popen[bytes]:
        return self.start(["sleep", "600"], group)

    def pids(self) -> set[int]:
        """Every process in the scope's subtree."""
        out: set[int] = set()
        for d, _dirs, _files in os.walk(self.path):
            out.update(int(p) for p in Path(d, "cgroup.procs").read_text().split())
        return out

    def corepin(self, *args: str) -> subprocess.CompletedProcess[str]:
        # the state directory right after the subcommand: after `--` it would be CMD's
        return run_corepin(args[0], "--state-dir", str(self.state), *args[1:])

    def shield(self, action: str, *extra: str) -> subprocess.CompletedProcess[str]:
        scope = ("--scope", self.name) if action == "on" else ()
        return self.corepin("shield", action, *scope, *extra)

    def close(self) -> None:
        self.corepin("shield", "off")  # whatever a failed test left up
        for proc in self.procs:
            reap(proc, None)
        assert kill_and_remove_cgroup(self.path), f"could not clean up {self.path}"


@pytest.fixture
def scope(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Scope]:
    state = tmp_path / "state"
    # every corepin these tests start uses the scratch state, even one started without
    # --state-dir: never the host's default state directory
    monkeypatch.setenv("COREPIN_STATE_DIR", str(state))
    s = Scope(state)
    try:
        yield s
    finally:
        s.close()
        remove_state_cgroups(state)  # (a pinned task's group: its parent stays until reconcile)


def threads_allowed(pid: int) -> dict[int, CPUSet]:
    """tid -> Cpus_allowed_list of every thread of `pid` (empty when it exited)."""
    out = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return {}
    for tid in tids:
        try:
            text = Path(f"/proc/{pid}/task/{tid}/status").read_text()
        except FileNotFoundError:
            continue
        for line in text.splitlines():
            if line.startswith("Cpus_allowed_list:"):
                out[int(tid)] = CPUSet.parse(line.split(":", 1)[1].strip())
    return out


def cpuset_group(pid: int) -> str:
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "cpuset" in controllers.split(","):
            return path
    raise AssertionError(f"no cpuset line for {pid}")


def allocations(scope: Scope) -> list[dict[str, object]]:
    out = scope.corepin("report", "-o", "json")
    assert out.returncode == 0, out.stderr
    rows: list[dict[str, object]] = json.loads(out.stdout)["allocations"]
    return rows


def test_after_shield_on_no_task_of_the_scope_but_the_exclusive_run_may_use_its_cpu(
    scope: Scope,
) -> None:
    sleepers = [scope.sleeper() for _ in range(3)]
    scope.group("svc", str(ONLINE))
    inner = scope.sleeper("svc")
    on = scope.shield("on")
    assert on.returncode == 0, on.stderr
    # an exclusive run started from inside the shielded scope (its shell is in the system set):
    # affinity only, so it stays in the scope, as a managed process
    run = scope.start(
        corepin_argv(
            "run",
            "--state-dir",
            str(scope.state),
            "--cgroups",
            "off",
            "--exclusive",
            "1",
            "--",
            "sleep",
            "600",
        ),
        stderr=subprocess.PIPE,
    )
    wait_for(lambda: len(allocations(scope)) == 1, what="the exclusive run")
    (row,) = allocations(scope)
    exclusive = CPUSet.parse(str(row["cpus"]))
    run_pid = int(str(row["pid"]))
    assert len(exclusive) == 1
    wait_for(lambda: threads_allowed(run_pid).get(run_pid) == exclusive, what="the run pinned")
    checked = 0
    for pid in scope.pids():
        if pid == run_pid:
            continue
        for tid, allowed in threads_allowed(pid).items():
            checked += 1
            assert not allowed & exclusive, f"pid {pid} tid {tid} may run on {allowed}"
    assert checked >= len(sleepers) + 2, "the sleepers, the svc one and corepin run itself"
    assert run_pid in scope.pids(), "the run is a task of the scope too"
    assert cpuset_group(inner.pid) == f"/{scope.name}/svc", "narrowed in place, not moved"
    status = scope.shield("status", "-o", "json")
    assert status.returncode == 0, status.stderr
    data = json.loads(status.stdout)
    assert data["exposed"] == [] and data["system_cpus"] == str(ONLINE - exclusive)
    run.terminate()


def test_a_task_forked_in_the_scope_after_shield_on_lands_on_the_system_set(
    scope: Scope,
) -> None:
    forker = scope.start(
        ["sh", "-c", "while read line; do sleep 600 & echo $!; done"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert scope.shield("on").returncode == 0
    ex = scope.corepin("run", "--exclusive", "1", "--", "true")
    assert ex.returncode == 0, ex.stderr
    held = subprocess.Popen(
        corepin_argv(
            "run", "--state-dir", str(scope.state), "--exclusive", "1", "--", "sleep", "600"
        ),
    )
    scope.procs.append(held)  # type: ignore[arg-type]
    wait_for(lambda: len(allocations(scope)) == 1, what="the exclusive run")
    system = CPUSet.parse((scope.path / "corepin.system" / "cpuset.cpus").read_text())
    assert forker.stdin is not None and forker.stdout is not None
    forker.stdin.write(b"go\n")
    forker.stdin.flush()
    child = int(forker.stdout.readline())
    assert cpuset_group(child) == f"/{scope.name}/corepin.system"
    assert set(threads_allowed(child).values()) == {system}
    assert system == ONLINE - CPUSet.parse(str(allocations(scope)[0]["cpus"]))
    os.kill(child, 9)
    held.terminate()


def test_an_exclusive_run_after_shield_on_finds_its_cpu_taken_from_the_system_set(
    scope: Scope,
) -> None:
    scope.sleeper()
    assert scope.shield("on").returncode == 0
    system = scope.path / "corepin.system" / "cpuset.cpus"
    assert CPUSet.parse(system.read_text()) == ONLINE
    # the command reads the system set the moment it starts
    out = scope.corepin(
        "run",
        "--exclusive",
        "1",
        "--",
        "sh",
        "-c",
        f'echo "$COREPIN_CPUS_EXCLUSIVE"; cat "{system}"',
    )
    assert out.returncode == 0, out.stderr
    mine, seen = (CPUSet.parse(x) for x in out.stdout.split())
    assert seen == ONLINE - mine, "the system set gave up the CPU before the run started"
    assert CPUSet.parse(system.read_text()) == ONLINE, "and took it back after"


def test_shield_off_restores_every_tasks_original_cpuset_and_affinity(scope: Scope) -> None:
    scope.group("narrow", str(ONLINE.last()))
    tasks = [scope.sleeper(), scope.sleeper(), scope.sleeper("narrow")]
    before = {p.pid: (cpuset_group(p.pid), threads_allowed(p.pid)) for p in tasks}
    assert scope.shield("on").returncode == 0
    held = subprocess.Popen(
        corepin_argv(
            "run", "--state-dir", str(scope.state), "--exclusive", "1", "--", "sleep", "600"
        ),
    )
    scope.procs.append(held)  # type: ignore[arg-type]
    wait_for(lambda: len(allocations(scope)) == 1, what="the exclusive run")
    during = {p.pid: cpuset_group(p.pid) for p in tasks}
    assert during[tasks[0].pid] == f"/{scope.name}/corepin.system"
    assert during[tasks[2].pid] == f"/{scope.name}/narrow"
    held.terminate()
    held.wait()
    off = scope.shield("off")
    assert off.returncode == 0, off.stdout + off.stderr
    after = {p.pid: (cpuset_group(p.pid), threads_allowed(p.pid)) for p in tasks}
    assert after == before
    assert not (scope.path / "corepin.system").exists()
    assert (scope.path / "narrow" / "cpuset.cpus").read_text().strip() == str(ONLINE.last())
    assert json.loads(scope.shield("status", "-o", "json").stdout)["on"] is False


def test_reconcile_adopts_a_task_that_joined_the_scope_after_shield_on(scope: Scope) -> None:
    scope.sleeper()
    assert scope.shield("on").returncode == 0
    late = scope.sleeper()
    assert cpuset_group(late.pid) == f"/{scope.name}"
    out = scope.corepin("reconcile", "--once")
    assert out.returncode == 0, out.stderr
    assert "moved" in out.stdout
    assert cpuset_group(late.pid) == f"/{scope.name}/corepin.system"
    quiet = scope.corepin("reconcile", "--once")
    assert quiet.stdout.strip() == "nothing to do"


def test_the_affinity_only_shield_confines_and_restores_the_scope_tasks(scope: Scope) -> None:
    tasks = [scope.sleeper(), scope.sleeper()]
    on = scope.shield("on", "--cgroups", "off")
    assert on.returncode == 0, on.stderr
    assert "affinity-only shield (--cgroups off)" in on.stderr
    held = subprocess.Popen(
        corepin_argv(
            "run", "--state-dir", str(scope.state), "--exclusive", "1", "--", "sleep", "600"
        ),
    )
    scope.procs.append(held)  # type: ignore[arg-type]
    wait_for(lambda: len(allocations(scope)) == 1, what="the exclusive run")
    exclusive = CPUSet.parse(str(allocations(scope)[0]["cpus"]))
    for task in tasks:
        assert set(threads_allowed(task.pid).values()) == {ONLINE - exclusive}
        assert cpuset_group(task.pid) == f"/{scope.name}", "nothing moved between groups"
    held.terminate()
    held.wait()
    off = scope.shield("off")
    assert off.returncode == 0, off.stdout + off.stderr
    for task in tasks:
        assert set(threads_allowed(task.pid).values()) == {ONLINE}


def test_a_second_exclusive_run_that_would_empty_the_system_set_is_refused(
    scope: Scope,
) -> None:
    assert scope.shield("on").returncode == 0
    held = subprocess.Popen(
        corepin_argv(
            "run", "--state-dir", str(scope.state), "--exclusive", "1", "--", "sleep", "600"
        ),
    )
    scope.procs.append(held)  # type: ignore[arg-type]
    wait_for(lambda: len(allocations(scope)) == 1, what="the exclusive run")
    more = scope.corepin("run", "--exclusive", str(len(ONLINE) - 1), "--", "true")
    assert more.returncode == 3, more.stderr
    assert "shared pool" in more.stderr
    held.terminate()


def test_pin_of_a_shielded_task_moves_it_out_of_the_system_set_and_off_puts_it_back(
    scope: Scope,
) -> None:
    task = scope.sleeper()
    other = scope.sleeper()
    assert scope.shield("on").returncode == 0
    assert cpuset_group(task.pid) == f"/{scope.name}/corepin.system"
    out = scope.corepin("pin", "--pid", str(task.pid), "--exclusive", "1", "-o", "json")
    assert out.returncode == 0, out.stderr
    cpus = CPUSet.parse(json.loads(out.stdout)["cpus"])
    assert cpuset_group(task.pid) == f"/{scope.name}/corepin.managed"
    assert set(threads_allowed(task.pid).values()) == {cpus}
    assert set(threads_allowed(other.pid).values()) == {ONLINE - cpus}, "the system set shrank"
    off = scope.shield("off")
    assert off.returncode == 0, off.stdout + off.stderr
    assert cpuset_group(task.pid) == f"/{scope.name}", "back where it was before the shield"
    assert set(threads_allowed(task.pid).values()) == {cpus}, "still pinned by corepin"


def test_an_affinity_only_run_started_inside_the_system_set_gets_its_cpu(scope: Scope) -> None:
    scope.sleeper()
    assert scope.shield("on").returncode == 0
    # a shell the shield moved into the system set starts an exclusive run without a cgroup of
    # its own: the system set gives up the CPU, so the command must start elsewhere
    out = subprocess.run(
        [
            "sh",
            "-c",
            f'echo $$ > "{scope.path}/corepin.system/cgroup.procs" && exec "$@"',
            "sh",
            *corepin_argv(
                "run",
                "--state-dir",
                str(scope.state),
                "--cgroups",
                "off",
                "--exclusive",
                "1",
                "--",
                "sh",
                "-c",
                'echo "$COREPIN_CPUS_EXCLUSIVE"; grep Cpus_allowed_list: /proc/self/status; '
                "grep cpuset /proc/self/cgroup",
            ),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    mine, allowed, group = out.stdout.splitlines()
    assert allowed.split()[-1] == mine
    assert group.endswith(f"/{scope.name}/corepin.managed")
    assert scope.shield("off").returncode == 0
