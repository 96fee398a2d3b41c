"""Operator commands on real processes this test starts: `corepin pin --pid`, `run --cpus`,
`run --wait` (first come, first served), `release`, memory policies (`--membind`,
`--interleave`, `--preferred`, read back from the command's own /proc/PID/numa_maps), reserved
CPUs, and `report`'s live view. Machines this host is not (several NUMA nodes, kernel threads
to refuse) are stand-in sysfs and /proc trees.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from corepin.core.cpuset import CPUSet
from corepin.testing.proc_tree import PF_KTHREAD, ProcTree
from corepin.testing.sysfs_tree import write_sysfs_tree
from corepin.topology.model import CPUInfo, Topology
from support.helpers import (
    allowed_cpus,
    corepin_argv,
    reap,
    remove_state_cgroups,
    run_corepin,
    wait_for,
)

ONLINE = CPUSet(os.sched_getaffinity(0))
two_cpus = pytest.mark.skipif(len(ONLINE) < 2, reason="needs two CPUs")
#: heap and stack lines of the command's own numa_maps, and its COREPIN_MEMS
SHOW_MAPS = (
    "grep -E ' (heap|stack)( |$)' /proc/$$/numa_maps | cut -d' ' -f2 | sort -u; "
    'echo "mems=$COREPIN_MEMS"'
)


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    path = tmp_path / "state"
    monkeypatch.setenv("COREPIN_STATE_DIR", str(path))  # never the host's default
    yield path
    remove_state_cgroups(path)


def corepin(state: Path, command: str, *args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
    return run_corepin(command, "--state-dir", str(state), *args, **kw)


def report(state: Path, *extra: str) -> dict[str, Any]:
    out = corepin(state, "report", "-o", "json", *extra)
    assert out.returncode == 0, out.stderr
    data: dict[str, Any] = json.loads(out.stdout)
    return data


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[Any]]]:
    started: list[subprocess.Popen[Any]] = []
    yield started
    for p in started:
        if p.poll() is None:
            # SIGTERM first: a `corepin run` forwards it to its command (a session of its own,
            # out of reach of killpg) and releases its CPUs and cgroup; SIGKILL what is left
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGTERM)
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    p.kill()
        reap(p, None)


THREADED = (
    "import subprocess, threading, time, sys\n"
    "child = subprocess.Popen(['sleep', '600'])\n"
    "[threading.Thread(target=time.sleep, args=(600,), daemon=True).start() for _ in range(3)]\n"
    "print(child.pid, flush=True)\n"
    "time.sleep(600)\n"
)


def threaded(procs: list[subprocess.Popen[Any]]) -> tuple[subprocess.Popen[str], int]:
    """A process of ours with three threads and a child: (it, the child's pid)."""
    p = subprocess.Popen(
        [sys.executable, "-c", THREADED], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    procs.append(p)
    assert p.stdout is not None
    return p, int(p.stdout.readline())


def thread_cpus(pid: int) -> set[str]:
    return {allowed_cpus_of_thread(pid, int(t)) for t in os.listdir(f"/proc/{pid}/task")}


def allowed_cpus_of_thread(pid: int, tid: int) -> str:
    for line in Path(f"/proc/{pid}/task/{tid}/status").read_text().splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return line.split(":", 1)[1].strip()
    raise AssertionError("no Cpus_allowed_list")


# ---------------------------------------------------------------------- pin --pid


@two_cpus
def test_pin_adopts_a_running_process_its_threads_and_children(
    state: Path, procs: list[subprocess.Popen[Any]]
) -> None:
    p, child = threaded(procs)
    out = corepin(state, "pin", "--pid", str(p.pid), "--exclusive", "1", "-o", "json")
    assert out.returncode == 0, out.stderr
    pinned = json.loads(out.stdout)
    cpus = pinned["cpus"]
    assert pinned["pid"] == p.pid and pinned["kind"] == "exclusive" and len(CPUSet.parse(cpus)) == 1
    assert thread_cpus(p.pid) == {cpus} and len(os.listdir(f"/proc/{p.pid}/task")) == 4
    assert allowed_cpus(child) == cpus
    (row,) = report(state)["allocations"]
    assert (row["id"], row["status"], row["processes"], row["live_cpus"]) == (
        pinned["id"],
        "running",
        2,
        cpus,
    )
    # freed when it is gone (pid and start time)
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    wait_for(lambda: not os.path.exists(f"/proc/{child}"), what="the child to go")
    assert report(state)["allocations"][0]["status"] == "dead"
    freed = corepin(state, "reconcile", "--once")
    assert freed.returncode == 0 and f"freed {pinned['id']}" in freed.stdout
    assert report(state)["allocations"] == []


@two_cpus
def test_pin_takes_exact_cpus_and_the_shared_pool(
    state: Path, procs: list[subprocess.Popen[Any]]
) -> None:
    a, _ = threaded(procs)
    b, _ = threaded(procs)
    last = str(ONLINE.last())
    assert corepin(state, "pin", "--pid", str(a.pid), "--cpus", last).returncode == 0
    assert thread_cpus(a.pid) == {last}
    shared = corepin(state, "pin", "--pid", str(b.pid), "--shared")
    assert shared.returncode == 0, shared.stderr
    assert thread_cpus(b.pid) == {str(ONLINE - CPUSet.parse(last))}


def test_pin_refuses_what_it_must_not_adopt(
    state: Path, procs: list[subprocess.Popen[Any]], tmp_path: Path
) -> None:
    p, child = threaded(procs)
    assert corepin(state, "pin", "--pid", str(p.pid)).returncode == 0
    again = corepin(state, "pin", "--pid", str(p.pid))
    assert again.returncode == 2 and "already holds allocation" in again.stderr
    of_run = corepin(state, "pin", "--pid", str(child))
    assert of_run.returncode == 2 and "already belongs to allocation" in of_run.stderr
    gone = corepin(state, "pin", "--pid", "4194303")
    assert gone.returncode == 2 and "no process 4194303" in gone.stderr
    # a kernel thread, described by a stand-in /proc (this host's are not ours to touch)
    tree = ProcTree(tmp_path / "proc")
    tree.add(2, "kthreadd", start=2, cpus=ONLINE, flags=PF_KTHREAD, ppid=0)
    tree.add(77, "kworker/u8:2", start=77, cpus=ONLINE, flags=PF_KTHREAD, ppid=2)
    for pid in ("2", "77"):
        out = corepin(tmp_path / "other-state", "pin", "--pid", pid, "--proc-root", str(tree.root))
        assert out.returncode == 2 and "is a kernel thread" in out.stderr, out.stderr
    assert "Traceback" not in again.stderr + of_run.stderr + gone.stderr


# ---------------------------------------------------------------------- run --cpus


@two_cpus
def test_run_cpus_gets_exactly_those_and_names_the_holder_when_taken(
    state: Path, procs: list[subprocess.Popen[Any]]
) -> None:
    last = str(ONLINE.last())
    holder = subprocess.Popen(
        corepin_argv(
            "run",
            "--state-dir",
            str(state),
            "--name",
            "holder",
            "--cpus",
            last,
            "--",
            "sh",
            "-c",
            'echo "$COREPIN_CPUS_EXCLUSIVE $COREPIN_CPUS"; exec sleep 600',
        ),
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    procs.append(holder)
    assert holder.stdout is not None
    assert holder.stdout.readline().split() == [last, last]
    (row,) = report(state)["allocations"]
    taken = corepin(state, "run", "--cpus", last, "--", "true")
    assert taken.returncode == 3, taken.stderr
    assert f"CPUs {last} are held by {row['id']} (holder)" in taken.stderr
    absent = corepin(state, "run", "--cpus", "4000", "--", "true")
    assert absent.returncode == 2 and "not online CPUs of this machine" in absent.stderr
    both = corepin(state, "run", "--cpus", last, "--exclusive", "1", "--", "true")
    assert both.returncode == 2


# ---------------------------------------------------------------------- run --wait

WAITERS = 20


@two_cpus
def test_twenty_waiters_get_the_cpus_in_the_order_they_arrived(
    state: Path, procs: list[subprocess.Popen[Any]], tmp_path: Path
) -> None:
    order = tmp_path / "order"
    every = str(ONLINE)
    blocker = subprocess.Popen(
        corepin_argv("run", "--state-dir", str(state), "--cpus", every, "--", "sleep", "600"),
        start_new_session=True,
    )
    procs.append(blocker)
    wait_for(lambda: len(report(state)["allocations"]) == 1, what="the blocker")
    waiters = []
    for i in range(WAITERS):
        w = subprocess.Popen(
            corepin_argv(
                "run",
                "--state-dir",
                str(state),
                "--exclusive",
                str(len(ONLINE)),
                "--wait",
                "300",
                "--",
                "sh",
                "-c",
                f"echo {i} >> {order}",
            ),
            stderr=subprocess.PIPE,
            text=True,
        )
        procs.append(w)
        waiters.append(w)
        assert w.stderr is not None
        line = w.stderr.readline()  # it has its ticket: the next one arrives after it
        assert "waiting for CPUs" in line and f"({i} run(s) ahead in line)" in line, line
    assert not order.exists(), "nobody ran while the CPUs were held"
    os.killpg(blocker.pid, signal.SIGTERM)
    for w in waiters:
        assert w.wait(timeout=240) == 0
    assert order.read_text().split() == [str(i) for i in range(WAITERS)]
    assert report(state)["allocations"] == []
    queue = state / "state.wait.queue"
    assert sorted(os.listdir(queue)) == [], "every ticket was given back"


@two_cpus
def test_a_wait_that_runs_out_gives_up_with_exit_3(
    state: Path, procs: list[subprocess.Popen[Any]]
) -> None:
    blocker = subprocess.Popen(
        corepin_argv("run", "--state-dir", str(state), "--cpus", str(ONLINE), "--", "sleep", "600"),
        start_new_session=True,
    )
    procs.append(blocker)
    wait_for(lambda: len(report(state)["allocations"]) == 1, what="the blocker")
    began = time.monotonic()
    out = corepin(state, "run", "--exclusive", "1", "--wait", "1", "--", "true")
    took = time.monotonic() - began
    assert out.returncode == 3, out.stderr
    assert "waited 1." in out.stderr and "--wait 1" in out.stderr
    assert 1.0 <= took < 10
    nowait = corepin(state, "run", "--exclusive", "1", "--", "true")
    assert nowait.returncode == 3 and "waited" not in nowait.stderr


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process (started by the test) has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def waiter(state: Path, procs: list[subprocess.Popen[Any]], *cmd: str) -> subprocess.Popen[str]:
    """`corepin run --exclusive 1 --wait 120 -- CMD`, returned once it says it waits."""
    w = subprocess.Popen(
        corepin_argv(
            "run", "--state-dir", str(state), "--exclusive", "1", "--wait", "120", "--", *cmd
        ),
        stderr=subprocess.PIPE,
        text=True,
    )
    procs.append(w)
    assert w.stderr is not None
    line = w.stderr.readline()
    assert "waiting for CPUs" in line, line
    return w


@two_cpus
def test_waiting_runs_sleep_instead_of_spinning(
    state: Path, procs: list[subprocess.Popen[Any]]
) -> None:
    blocker = subprocess.Popen(
        corepin_argv("run", "--state-dir", str(state), "--cpus", str(ONLINE), "--", "sleep", "600"),
        start_new_session=True,
    )
    procs.append(blocker)
    wait_for(lambda: len(report(state)["allocations"]) == 1, what="the blocker")
    first = waiter(state, procs, "true")
    second = waiter(state, procs, "true")
    before = [cpu_seconds(w.pid) for w in (first, second)]
    time.sleep(3.0)
    used = [cpu_seconds(w.pid) - b for w, b in zip((first, second), before, strict=True)]
    # a spinning waiter uses about as much CPU as the time it waits (3 s)
    assert all(u < 0.5 for u in used), f"CPU used over a 3 s wait: {used}"
    os.killpg(blocker.pid, signal.SIGTERM)
    assert first.wait(timeout=60) == 0 and second.wait(timeout=60) == 0


@two_cpus
def test_a_stopped_waiter_at_the_head_of_the_line_lets_the_next_one_go_first(
    state: Path, procs: list[subprocess.Popen[Any]], tmp_path: Path
) -> None:
    order = tmp_path / "order"
    blocker = subprocess.Popen(
        corepin_argv("run", "--state-dir", str(state), "--cpus", str(ONLINE), "--", "sleep", "600"),
        start_new_session=True,
    )
    procs.append(blocker)
    wait_for(lambda: len(report(state)["allocations"]) == 1, what="the blocker")
    stopped = waiter(state, procs, "sh", "-c", f"echo stopped >> {order}")
    behind = waiter(state, procs, "sh", "-c", f"echo behind >> {order}")
    os.kill(stopped.pid, signal.SIGSTOP)  # Ctrl-Z of a waiting run
    try:
        os.killpg(blocker.pid, signal.SIGTERM)
        assert behind.wait(timeout=60) == 0, "the run behind a stopped one got its CPUs"
        assert order.read_text().split() == ["behind"]
    finally:
        os.kill(stopped.pid, signal.SIGCONT)
    assert stopped.wait(timeout=60) == 0, "the stopped run resumed and got its CPUs"
    assert order.read_text().split() == ["behind", "stopped"]


# ---------------------------------------------------------------------- release


@two_cpus
def test_release_of_a_pinned_process_frees_its_cpus_and_kill_ends_it(
    state: Path, procs: list[subprocess.Popen[Any]]
) -> None:
    a, _ = threaded(procs)
    b, b_child = threaded(procs)
    ida = json.loads(
        corepin(state, "pin", "--pid", str(a.pid), "--exclusive", "1", "-o", "json").stdout
    )["id"]
    out = corepin(state, "release", ida)
    assert out.returncode == 0, out.stderr
    assert "its processes now run in the shared pool" in out.stdout
    assert thread_cpus(a.pid) == {str(ONLINE)}
    idb = json.loads(
        corepin(state, "pin", "--pid", str(b.pid), "--exclusive", "1", "-o", "json").stdout
    )["id"]
    killed = corepin(state, "release", idb, "--kill")
    assert killed.returncode == 0, killed.stderr
    assert b.wait(timeout=30) != 0
    wait_for(lambda: not os.path.exists(f"/proc/{b_child}"), what="b's child killed")
    assert [r["id"] for r in report(state)["allocations"]] == [ida]


# ---------------------------------------------------------------------- memory policies


def numa_policies(stdout: str) -> tuple[set[str], str]:
    lines = stdout.split()
    mems = next(x for x in lines if x.startswith("mems="))
    return {x for x in lines if not x.startswith("mems=")}, mems[5:]


@pytest.mark.parametrize(
    ("flag", "shown"),
    [("--membind", "bind:0"), ("--interleave", "interleave:0"), ("--preferred", "prefer:0")],
)
@pytest.mark.parametrize("cgroups", ["off", "auto"])
def test_memory_policies_show_in_the_commands_numa_maps(
    state: Path, flag: str, shown: str, cgroups: str
) -> None:
    out = corepin(state, "run", "--cgroups", cgroups, flag, "0", "--", "sh", "-c", SHOW_MAPS)
    assert out.returncode == 0, out.stderr
    assert numa_policies(out.stdout) == ({shown}, "0")


def fake_two_nodes(root: Path) -> str:
    """This machine's CPUs placed in NUMA nodes 0 and 1 (the kernel has only node 0)."""
    cpus = [CPUInfo(c, socket=0, die=0, numa=i % 2, core=c) for i, c in enumerate(ONLINE)]
    write_sysfs_tree(Topology(cpus), root)
    return str(root)


@two_cpus
def test_memory_policies_are_checked_against_the_machines_nodes(
    state: Path, tmp_path: Path
) -> None:
    sysfs = fake_two_nodes(tmp_path / "sysfs")
    base = ("--cgroups", "off", "--sysfs-root", sysfs)
    unknown = corepin(state, "run", *base, "--membind", "0,5", "--", "true")
    assert unknown.returncode == 2 and "NUMA node(s) 5 do not exist here" in unknown.stderr
    several = corepin(state, "run", *base, "--preferred", "0-1", "--", "true")
    assert several.returncode == 2 and "--preferred takes one NUMA node" in several.stderr
    # node 1 is in the (stand-in) topology but not in this kernel: set_mempolicy says EINVAL
    # (with 0-1 the kernel would keep the node it has), and CMD never starts
    marker = tmp_path / "ran"
    refused = corepin(state, "run", *base, "--membind", "1", "--", "touch", str(marker))
    assert refused.returncode == 4 and "EINVAL" in refused.stderr, refused.stderr
    assert not marker.exists()
    kept = corepin(state, "run", *base, "--interleave", "0-1", "--", "sh", "-c", SHOW_MAPS)
    assert kept.returncode == 0, kept.stderr
    assert numa_policies(kept.stdout)[0] <= {"interleave:0", "interleave:0-1"}
    # the policy's nodes, not the CPUs' node, are what the command is told
    ok = corepin(
        state,
        "run",
        *base,
        "--exclusive",
        "1",
        "--option",
        "numa=1",
        "--membind",
        "0",
        "--",
        "sh",
        "-c",
        SHOW_MAPS,
    )
    assert ok.returncode == 0, ok.stderr
    assert numa_policies(ok.stdout) == ({"bind:0"}, "0")


# ---------------------------------------------------------------------- reserved CPUs


@two_cpus
def test_reserved_cpus_are_kept_in_the_state_never_handed_out_and_guarded(
    state: Path, procs: list[subprocess.Popen[Any]]
) -> None:
    first = str(ONLINE.first())
    out = corepin(state, "reconcile", "--once", "--reserved-cpus", first)
    assert out.returncode == 0 and f"reserved CPUs - -> {first}" in out.stdout
    assert report(state)["reserved"] == first
    everything = corepin(state, "run", "--exclusive", str(len(ONLINE)), "--", "true")
    assert everything.returncode == 3
    on_it = corepin(state, "run", "--cpus", first, "--", "true")
    assert on_it.returncode == 3 and "reserved" in on_it.stderr
    held = subprocess.Popen(
        corepin_argv("run", "--state-dir", str(state), "--exclusive", "1", "--", "sleep", "600"),
        start_new_session=True,
    )
    procs.append(held)
    wait_for(lambda: len(report(state)["allocations"]) == 1, what="the exclusive run")
    (row,) = report(state)["allocations"]
    assert row["cpus"] != first, "a reserved CPU is never handed out"
    clash = corepin(state, "reconcile", "--once", "--reserved-cpus", row["cpus"])
    assert clash.returncode == 3
    assert f"{row['id']} holds {row['cpus']}" in clash.stderr and "release those" in clash.stderr
    assert report(state)["reserved"] == first, "a refused change changes nothing"
    by_count = corepin(state, "reconcile", "--once", "--reserved-count", "0")
    assert by_count.returncode == 0 and report(state)["reserved"] == ""


# ---------------------------------------------------------------------- report


def test_report_shows_live_use_and_marks_dead_and_lingering_runs_in_every_format(
    state: Path, procs: list[subprocess.Popen[Any]], tmp_path: Path
) -> None:
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
    procs.append(busy)
    assert corepin(state, "pin", "--pid", str(busy.pid), "--exclusive", "1").returncode == 0
    # a run whose CMD left a daemon behind: lingering
    linger = corepin(state, "run", "--", "sh", "-c", "sleep 120 >/dev/null 2>&1 & exit 0")
    assert linger.returncode == 0
    data = report(state, "--sample", "0.5")
    rows = {r["name"]: r for r in data["allocations"]}
    hot = next(r for r in rows.values() if r["pid"] == busy.pid)
    assert hot["status"] == "running" and hot["processes"] == 1
    assert hot["cpu_percent"] > 20 and hot["cpu_percent_over"] == "0.5 s"
    assert hot["live_cpus"] == hot["cpus"] and len(CPUSet.parse(hot["live_cpus"])) == 1
    assert rows["sh"]["status"] == "lingering" and rows["sh"]["processes"] == 1
    os.killpg(busy.pid, signal.SIGKILL)
    busy.wait()
    table = corepin(state, "report").stdout
    rows_by_status = {line.split()[0]: line.split() for line in table.splitlines()[1:3]}
    assert "dead" in rows_by_status[hot["id"]] and "lingering" in rows_by_status[rows["sh"]["id"]]
    assert "dead: nothing of the run is left" in table
    yaml_text = corepin(state, "report", "-o", "yaml").stdout
    assert "status: dead" in yaml_text and "status: lingering" in yaml_text
    svg = corepin(state, "report", "-o", "svg").stdout
    assert f"(pid {busy.pid}) [dead]" in svg, "the dead run's CPU is marked in the picture"
    assert corepin(state, "release", rows["sh"]["id"], "--kill").returncode == 0
