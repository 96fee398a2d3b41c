"""Host mode attacked on purpose: double booking by processes that outlive CMD, recycled pids,
forged labels, lost exit codes, Ctrl-C during start-up, two state directories on one host.

Every test starts, signals and re-pins only processes it started itself (through `corepin run`
or directly), uses its own state directory, and removes every scratch cgroup it makes.
"""

from __future__ import annotations

import contextlib
import json
import os
import pty
import random
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_host_run import (
    CPUSET_ROOT,
    ONLINE,
    allocations,
    corepin,
    needs_cpuset,
    needs_two_cpus,
    report,
    run,
)

from corepin.agent.host.settings import HostSettings
from corepin.core.cpuset import CPUSet
from corepin.enforcement.faketree import make_fake_v1
from corepin.state import Assignment, ContainerOwner, HostState, ProcessOwner, StateStore
from corepin.sysfs.procfs import process_start_time, process_table
from support.helpers import allowed_cpus, kill_and_remove_cgroup, run_corepin, wait_for


@pytest.fixture
def state(tmp_path: Path) -> Path:
    return tmp_path / "state"


@pytest.fixture
def reaper() -> Iterator[list[int]]:
    """Process groups (session leaders started by corepin run for the test) to kill at the end."""
    groups: list[int] = []
    yield groups
    for pgid in groups:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)


def session_members(sid: int) -> list[int]:
    return [pid for pid, st in process_table().items() if st.session == sid and st.alive]


def write_state(state_dir: Path, state: HostState) -> None:
    store = StateStore(state_dir)
    with store.transaction() as tx:
        tx.commit(state)


# ---------------------------------------------------------------------- no double booking


@needs_two_cpus
def test_a_daemon_left_behind_by_cmd_keeps_its_cpus_until_it_exits(
    state: Path, reaper: list[int]
) -> None:
    out = run(
        "run",
        "--exclusive",
        "1",
        "--name",
        "daemonizer",
        "--",
        "sh",
        "-c",
        "sleep 30 >/dev/null 2>&1 & echo $COREPIN_CPUS",
        state=state,
    )
    assert out.returncode == 0, out.stderr
    held_cpu = out.stdout.strip()
    assert "still run" in out.stderr and "corepin release" in out.stderr
    [lingering] = allocations(state)
    reaper.append(int(str(lingering["pid"])))
    assert lingering["status"] == "lingering" and lingering["cpus"] == held_cpu
    sleepers = session_members(int(str(lingering["pid"])))
    assert sleepers and all(allowed_cpus(p) == held_cpu for p in sleepers)
    second = run("run", "--exclusive", "1", "--", "sh", "-c", "echo $COREPIN_CPUS", state=state)
    assert second.returncode == 0, second.stderr
    assert second.stdout.strip() != held_cpu, "the lingering run's CPU was handed out twice"
    table = run("report", state=state).stdout
    assert re.search(r"daemonizer .* lingering ", table), table
    out = run("reconcile", "--once", state=state)
    assert [a["id"] for a in allocations(state)] == [lingering["id"]], "reconcile keeps it"
    done = run("release", str(lingering["id"]), "--kill", state=state)
    assert done.returncode == 0, done.stderr
    assert f"killed {lingering['id']}: 1 process(es)" in done.stdout
    wait_for(lambda: not session_members(int(str(lingering["pid"]))), what="the daemon to go")
    assert allocations(state) == []


def test_release_without_kill_moves_the_processes_to_the_shared_pool(
    state: Path, reaper: list[int]
) -> None:
    out = run(
        "run", "--exclusive", "1", "--", "sh", "-c", "sleep 30 >/dev/null 2>&1 &", state=state
    )
    assert out.returncode == 0, out.stderr
    [held] = allocations(state)
    reaper.append(int(str(held["pid"])))
    done = run("release", str(held["id"]), state=state)
    assert done.returncode == 0, done.stderr
    assert "now run in the shared pool" in done.stdout
    [after] = allocations(state)
    assert after["kind"] == "shared" and after["status"] == "lingering"
    pool = report(state)["shared_pool"]
    assert all(allowed_cpus(p) == pool for p in session_members(int(str(held["pid"]))))
    assert report(state)["free"] == pool, "its CPU is free again"
    unknown = run("release", "run-0-none", state=state)
    assert unknown.returncode == 2 and "no allocation 'run-0-none'" in unknown.stderr


@needs_cpuset
@pytest.mark.realhost
def test_in_a_cgroup_the_run_is_held_while_its_cgroup_holds_processes(
    state: Path, reaper: list[int]
) -> None:
    out = run(
        "run",
        "--exclusive",
        "1",
        "--",
        "sh",
        "-c",
        "sleep 30 >/dev/null 2>&1 &",
        state=state,
        cgroups="on",
    )
    assert out.returncode == 0, out.stderr
    [held] = allocations(state)
    reaper.append(int(str(held["pid"])))
    group = CPUSET_ROOT / str(held["cgroup"])
    try:
        assert held["status"] == "lingering"
        assert (group / "cgroup.procs").read_text().split(), "the daemon is in the run's cgroup"
        done = run("release", str(held["id"]), "--kill", state=state, cgroups="on")
        assert done.returncode == 0, done.stderr
        assert allocations(state) == []
        assert not group.exists(), "the run's cgroup is removed with it"
        assert not group.parent.exists(), "and its state directory's parent group"
    finally:
        kill_and_remove_cgroup(group)
        if group.parent.exists() and not any(p.is_dir() for p in group.parent.iterdir()):
            group.parent.rmdir()


def test_a_foreground_run_on_a_terminal_records_what_outlives_cmd(state: Path) -> None:
    """On a terminal CMD stays in corepin's session (it may be interactive): corepin becomes its
    child subreaper and records the processes CMD leaves behind."""
    argv = corepin(
        "run",
        "--exclusive",
        "1",
        "--",
        "sh",
        "-c",
        "nohup sleep 30 >/dev/null 2>&1 & echo bg=$!",
        state=state,
    )
    pid, fd = pty.fork()
    if pid == 0:  # the child: a session leader with the pty as its controlling terminal
        os.execv(argv[0], argv)
    chunks = []
    try:
        while True:
            try:
                data = os.read(fd, 1024)
            except OSError:
                break
            if not data:
                break
            chunks.append(data)
    finally:
        _, status = os.waitpid(pid, 0)
        os.close(fd)
    text = b"".join(chunks).decode(errors="replace")
    assert os.waitstatus_to_exitcode(status) == 0, text
    background = int(re.search(r"bg=(\d+)", text).group(1))  # type: ignore[union-attr]
    try:
        [held] = allocations(state)
        assert held["status"] == "lingering"
        owner = held["owner"]
        assert isinstance(owner, dict) and owner["session"] is None
        assert [m[0] for m in owner["members"]] == [background]
    finally:
        os.kill(background, signal.SIGKILL)
    wait_for(lambda: "freed" in run("reconcile", "--once", state=state).stdout, what="a free")


@needs_two_cpus
def test_shrinking_the_shared_pool_pins_children_forked_during_the_repin(
    state: Path, reaper: list[int]
) -> None:
    """A shared run that forks all the time: after an exclusive run starts, no process of the
    shared run may still be allowed on the exclusive CPU (without cgroups)."""
    forker = subprocess.Popen(
        corepin(
            "run",
            "--shared",
            "--",
            "sh",
            "-c",
            "while :; do sleep 0.2 & sleep 0.001; done",
            state=state,
        ),
        stdout=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: len(allocations(state)) == 1, what="the shared run")
        sid = int(str(allocations(state)[0]["pid"]))
        reaper.append(sid)
        for _ in range(5):
            excl = subprocess.Popen(
                corepin(
                    "run",
                    "--exclusive",
                    "1",
                    "--",
                    "sh",
                    "-c",
                    "echo $COREPIN_CPUS; sleep 1",
                    state=state,
                ),
                stdout=subprocess.PIPE,
                text=True,
            )
            assert excl.stdout is not None
            mine = CPUSet.parse(excl.stdout.readline().strip())
            leaked = []
            for p in session_members(sid):
                try:
                    allowed = CPUSet.parse(allowed_cpus(p))
                except (AssertionError, FileNotFoundError, ProcessLookupError):
                    continue
                if allowed & mine:
                    leaked.append((p, str(allowed)))
            assert excl.wait(timeout=30) == 0
            excl.stdout.close()
            assert leaked == [], f"processes of the shared run still on CPU {mine}: {leaked}"
    finally:
        forker.send_signal(signal.SIGTERM)
        forker.wait(timeout=30)


def test_cgroups_off_never_frees_an_assignment_tied_to_a_cgroup_it_cannot_see(
    state: Path, tmp_path: Path
) -> None:
    fake = tmp_path / "cgroup"
    online = CPUSet(os.sched_getaffinity(0))
    make_fake_v1(fake, cpus=online, mems=CPUSet.of(0), separate_cpu_mount=False)
    pod = fake / "cpuset" / "kubepods" / "pod0f1e2d3c-aaaa-bbbb-cccc-000000000001"
    ctr = pod / ("c" * 64)
    ctr.mkdir(parents=True)
    owner = ContainerOwner(
        pod_uid="0f1e2d3c-aaaa-bbbb-cccc-000000000001",
        container="app",
        container_id="c" * 64,
        cgroup=f"kubepods/{pod.name}/{'c' * 64}",
    )
    write_state(
        state,
        HostState(
            online=online,
            assignments={"pod/x/app": Assignment("pod/x/app", cpus=CPUSet.of(0), owner=owner)},
        ),
    )
    nowhere = tmp_path / "no-cgroups-here"
    nowhere.mkdir()
    for root in (fake, nowhere):
        out = run("reconcile", "--once", "--cgroup-root", str(root), state=state)
        assert out.returncode == 0, out.stderr
        assert [a["id"] for a in allocations(state)] == ["pod/x/app"], root
    ctr.rmdir()
    out = run("reconcile", "--once", "--cgroup-root", str(fake), state=state)
    assert "freed pod/x/app" in out.stdout, "a cgroup seen gone frees its assignment"


def test_two_state_directories_never_remove_each_others_cgroups(tmp_path: Path) -> None:
    fake = tmp_path / "cgroup"
    online = CPUSet(os.sched_getaffinity(0))
    driver = make_fake_v1(fake, cpus=online, mems=CPUSet.of(0), separate_cpu_mount=False)
    first, second = tmp_path / "one", tmp_path / "two"
    parent_one = HostSettings(state_dir=str(first)).cgroup_parent
    parent_two = HostSettings(state_dir=str(second)).cgroup_parent
    assert parent_one != parent_two and parent_one.startswith("corepin/")
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        group = f"{parent_one}/run-1-abcd"
        driver.create(group)  # momentarily empty, as before CMD joins it
        owner = ProcessOwner(sleeper.pid, process_start_time(sleeper.pid), cgroup=group)
        write_state(
            first,
            HostState(
                online=online,
                assignments={"run-1-abcd": Assignment("run-1-abcd", kind="shared", owner=owner)},
            ),
        )
        for state_dir in (second, first):
            out = run_corepin(
                "reconcile",
                "--once",
                "--state-dir",
                str(state_dir),
                "--cgroups",
                "on",
                "--cgroup-root",
                str(fake),
            )
            assert out.returncode == 0, out.stderr
            assert (fake / "cpuset" / group).is_dir(), f"reconcile of {state_dir} removed it"
    finally:
        sleeper.kill()
        sleeper.wait()


# ---------------------------------------------------------------------- pid reuse, labels


def test_reconcile_never_pins_a_recycled_pid_nor_its_children(state: Path) -> None:
    victim = subprocess.Popen(["sh", "-c", "sleep 30 & wait"])
    try:
        wait_for(
            lambda: any(st.ppid == victim.pid for st in process_table().values()),
            what="the victim's child",
        )
        child = next(p for p, st in process_table().items() if st.ppid == victim.pid)
        before = {victim.pid: allowed_cpus(victim.pid), child: allowed_cpus(child)}
        recycled = ProcessOwner(victim.pid, process_start_time(victim.pid) + 1, name="old run")
        write_state(
            state,
            HostState(
                online=CPUSet(os.sched_getaffinity(0)),
                assignments={
                    "run-9-0000": Assignment(
                        "run-9-0000", cpus=CPUSet.of(ONLINE[0]), owner=recycled
                    )
                },
            ),
        )
        out = run("reconcile", "--once", state=state)
        assert out.returncode == 0, out.stderr
        assert "freed run-9-0000" in out.stdout, "a recycled pid does not keep it alive"
        assert {p: allowed_cpus(p) for p in before} == before, "the recycled pid was re-pinned"
    finally:
        victim.kill()
        victim.wait()


def test_names_and_commands_with_control_characters_cannot_forge_report_rows(
    state: Path, reaper: list[int]
) -> None:
    forged = "x\nrun-1-ffff  root  1  exclusive  0  0  running  forged"
    p = subprocess.Popen(
        corepin(
            "run", "--shared", "--name", forged, "--", "sh", "-c", "sleep 30 #\x1b[2J", state=state
        ),
    )
    try:
        wait_for(lambda: len(allocations(state)) == 1, what="the run")
        reaper.append(int(str(allocations(state)[0]["pid"])))
        table = run("report", state=state).stdout
        rows = [line for line in table.splitlines() if line.startswith("run-")]
        assert len(rows) == 1, table
        assert "x\\nrun-1-ffff" in rows[0] and "\\x1b[2J" in rows[0]
        assert "\x1b" not in table
        data = json.loads(run("report", "-o", "json", state=state).stdout)
        assert data["allocations"][0]["name"] == forged, "JSON keeps the real name, escaped"
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=30)


# ---------------------------------------------------------------------- exit codes


def test_cmds_exit_code_survives_a_caller_that_ignores_sigchld(state: Path) -> None:
    # a fresh interpreter sets SIGCHLD to "ignore" and execs corepin, which inherits it (no
    # preexec_fn: running Python in a fork of this multi-threaded test process is unsafe)
    argv = corepin("run", "--exclusive", "1", "--", "sh", "-c", "exit 7", state=state)
    ignoring = (
        "import os, signal, sys; signal.signal(signal.SIGCHLD, signal.SIG_IGN); "
        "os.execv(sys.argv[1], sys.argv[1:])"
    )
    out = subprocess.run(
        [sys.executable, "-c", ignoring, *argv],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 7, out.stderr
    assert allocations(state) == []


def test_cmds_exit_code_is_returned_when_the_release_cannot_be_written(state: Path) -> None:
    corrupt = f"printf garbage > {state / 'state.json'}; exit 7"
    out = run("run", "--exclusive", "1", "--", "sh", "-c", corrupt, state=state)
    assert out.returncode == 7, out.stderr
    assert "warning: could not release" in out.stderr and "reconcile" in out.stderr
    assert "Traceback" not in out.stderr


def _has_child(pid: int, comm: str | None = None) -> bool:
    return any(
        st.ppid == pid and (comm is None or st.comm == comm) for st in process_table().values()
    )


#: When the Ctrl-C comes: a random moment of the first 0.3 s (loading, deciding, locking,
#: forking, committing), right after CMD is forked, or once CMD runs.
STAGES = ("at a random early moment", "once CMD is forked", "once CMD runs")


@pytest.mark.parametrize("stage", STAGES)
def test_ctrl_c_at_any_moment_of_start_up_exits_130_without_a_trace_or_a_leak(
    state: Path, stage: str
) -> None:
    rng = random.Random(stage)
    reached = 0
    for _ in range(8):
        p = subprocess.Popen(
            [*corepin("run", "--exclusive", "1", "--", "sleep", "30", state=state)],
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            if stage == STAGES[0]:
                time.sleep(rng.uniform(0.0, 0.3))
            else:
                comm = "sleep" if stage == STAGES[2] else None
                pid = p.pid
                wait_for(
                    lambda pid=pid, comm=comm: _has_child(pid, comm),  # type: ignore[misc]
                    what=stage,
                )
            p.send_signal(signal.SIGINT)
            _, err = p.communicate(timeout=30)
        finally:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
        assert allocations(state) == [], "an interrupted start-up left an allocation behind"
        assert not _has_child(p.pid)
        if "Traceback" in err and "corepin" not in err:
            # the Ctrl-C hit the interpreter's own start-up (site, runpy) before any of
            # corepin ran: Python's behaviour, nothing of corepin's to judge (or to leak)
            continue
        reached += 1
        # before the interpreter installs its handler, SIGINT ends it the default way (the
        # shell's 130 too); from then on corepin exits 130 itself
        assert p.returncode == 130 or (p.returncode == -signal.SIGINT and not err), (
            p.returncode,
            err,
        )
        assert "Traceback" not in err and "internal error" not in err, err
    assert reached >= 4, "too few interrupts reached corepin's own start-up"


# ---------------------------------------------------------------------- request options


def test_run_takes_every_request_option_allocate_takes(state: Path) -> None:
    for options in (
        ["workload=cpu-bound"],
        ["workload=memory-bound", "smt=spread"],
        ["numa=0", "prefer-isolated=false"],
        ["level=core"],
    ):
        argv = ["run", "--exclusive", "1", "--policy", "workload-aware"]
        for option in options:
            argv += ["--option", option]
        out = run(*argv, "--", "true", state=state)
        assert out.returncode == 0, (options, out.stderr)
    best = run(
        "run",
        "--exclusive",
        "1",
        "--option",
        "workload=best-effort",
        "--policy",
        "workload-aware",
        "--",
        "sh",
        "-c",
        "echo $COREPIN_CPUS_SHARED",
        state=state,
    )
    assert best.returncode == 0 and len(CPUSet.parse(best.stdout.strip())) == 1, best.stderr


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--exclusive", "1", "--option", "numa=9"], "NUMA node(s) 9"),
        (["--exclusive", "1", "--option", "smt=auto", "--option", "smt=spread"], "given twice"),
        (["--exclusive", "1", "--level", "core", "--option", "level=numa"], "level is given twice"),
        (["--shared", "--option", "level=core"], "applies to --exclusive runs only"),
        (["--exclusive", "1", "--option", "workload=gpu"], "unknown workload family 'gpu'"),
        (["--exclusive", "1", "--option", "frobnicate"], "unknown option 'frobnicate'"),
    ],
    ids=[
        "a NUMA node the machine lacks",
        "a repeated option",
        "a level given twice",
        "a level for a shared run",
        "an unknown workload family",
        "an unknown option",
    ],
)
def test_nonsense_run_options_are_refused_with_exit_2(
    state: Path, argv: list[str], fragment: str
) -> None:
    out = run("run", *argv, "--", "true", state=state)
    assert out.returncode == 2, out.stderr
    assert fragment in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    assert not (state / "state.json").exists() or allocations(state) == []
