"""`corepin run` / `report` / `reconcile` on this host with real processes and real affinity.

Every test uses its own state directory in tmp. Tests that place runs in real cpuset cgroups
are marked `realhost` and skip (with the reason) when the host has no writable cpuset
hierarchy; the others run with `--cgroups off` (affinity only) and work as any user.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.helpers import allowed_cpus, corepin_argv, run_corepin, wait_for

ONLINE = sorted(os.sched_getaffinity(0))
CPUSET_ROOT = Path("/sys/fs/cgroup/cpuset")


def cpuset_writable() -> bool:
    return os.geteuid() == 0 and (CPUSET_ROOT / "cpuset.cpus").exists()


needs_cpuset = pytest.mark.skipif(
    not cpuset_writable(),
    reason="needs root and a cgroup v1 cpuset hierarchy at " + str(CPUSET_ROOT),
)
needs_two_cpus = pytest.mark.skipif(len(ONLINE) < 2, reason="needs at least 2 CPUs")


def corepin(*args: str, state: Path, cgroups: str = "off") -> list[str]:
    return corepin_argv(args[0], "--state-dir", str(state), "--cgroups", cgroups, *args[1:])


def run(
    *args: str, state: Path, cgroups: str = "off", timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return run_corepin(
        args[0], "--state-dir", str(state), "--cgroups", cgroups, *args[1:], timeout=timeout
    )


def report(state: Path) -> dict[str, object]:
    out = run("report", "-o", "json", state=state)
    assert out.returncode == 0, out.stderr
    data: dict[str, object] = json.loads(out.stdout)
    return data


def allocations(state: Path) -> list[dict[str, object]]:
    data = report(state)
    allocs = data["allocations"]
    assert isinstance(allocs, list)
    return allocs


@pytest.fixture
def state(tmp_path: Path) -> Path:
    return tmp_path / "state"


@pytest.fixture
def background() -> Iterator[list[subprocess.Popen[str]]]:
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=10)


def test_exclusive_run_is_pinned_and_learns_its_cpus_from_the_environment(state: Path) -> None:
    out = run(
        "run",
        "--exclusive",
        "1",
        "--",
        "sh",
        "-c",
        "grep Cpus_allowed_list /proc/self/status; env",
        state=state,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    allowed = lines[0].split(":", 1)[1].strip()
    env = dict(line.split("=", 1) for line in lines[1:] if line.startswith("COREPIN_"))
    assert env["COREPIN_CPUS"] == allowed
    assert env["COREPIN_CPUS_EXCLUSIVE"] == allowed
    assert env["COREPIN_CPUS_SHARED"] == ""
    assert env["COREPIN_MEMS"] != ""
    assert int(allowed) in ONLINE
    assert allocations(state) == [], "the allocation is released when CMD exits"


def test_run_returns_the_exit_code_of_the_command(state: Path) -> None:
    assert run("run", "--exclusive", "1", "--", "sh", "-c", "exit 7", state=state).returncode == 7
    assert run("run", "--shared", "--", "true", state=state).returncode == 0


def test_command_killed_by_a_signal_gives_128_plus_the_signal(state: Path) -> None:
    out = run("run", "--exclusive", "1", "--", "sh", "-c", "kill -9 $$", state=state)
    assert out.returncode == 128 + 9
    assert allocations(state) == []


def test_missing_command_is_a_usage_error_with_exit_2(state: Path) -> None:
    out = run("run", "--exclusive", "1", state=state)
    assert out.returncode == 2
    assert "no command given" in out.stderr
    assert "Traceback" not in out.stderr


def test_command_not_found_exits_127_and_frees_the_allocation(state: Path) -> None:
    out = run("run", "--exclusive", "1", "--", "/no/such/program", state=state)
    assert out.returncode == 127
    assert "/no/such/program" in out.stderr
    assert allocations(state) == []


def test_asking_for_more_cpus_than_the_machine_has_exits_3_before_the_command_starts(
    state: Path, tmp_path: Path
) -> None:
    marker = tmp_path / "started"
    out = run(
        "run",
        "--exclusive",
        str(len(ONLINE) + 1),
        "--",
        "touch",
        str(marker),
        state=state,
    )
    assert out.returncode == 3
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "cannot allocate" in out.stderr
    assert not marker.exists()


@needs_two_cpus
def test_with_shared_gives_exclusive_plus_shared_pool_in_one_mask(state: Path) -> None:
    out = run(
        "run",
        "--exclusive",
        "1",
        "--with-shared",
        "--",
        "sh",
        "-c",
        "grep Cpus_allowed_list /proc/self/status; env",
        state=state,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    env = dict(line.split("=", 1) for line in lines[1:] if line.startswith("COREPIN_"))
    exclusive = {int(env["COREPIN_CPUS_EXCLUSIVE"])}
    shared = set(ONLINE) - exclusive
    assert env["COREPIN_CPUS_SHARED"] == ",".join(map(str, sorted(shared)))
    assert lines[0].split(":", 1)[1].strip() == env["COREPIN_CPUS"]
    assert set(range(len(ONLINE))) >= exclusive | shared


def test_with_shared_without_exclusive_is_a_usage_error(state: Path) -> None:
    assert run("run", "--with-shared", "--", "true", state=state).returncode == 2


@needs_two_cpus
def test_concurrent_exclusive_runs_never_share_a_cpu_and_losers_exit_3(
    state: Path, tmp_path: Path
) -> None:
    """20 `corepin run --exclusive 1` at once on this machine: exactly as many win as there are
    CPUs, winners hold different CPUs, every loser exits 3 with a one-line reason."""
    n = 20
    hold = 12.0
    procs = []
    for i in range(n):
        log = tmp_path / f"out{i}"
        script = f'echo "$COREPIN_CPUS" > {log}; sleep {hold}'
        procs.append(
            subprocess.Popen(
                corepin("run", "--exclusive", "1", "--", "sh", "-c", script, state=state),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    started = time.monotonic()
    losers = []
    winners = []
    for i, p in enumerate(procs):
        try:
            _, err = p.communicate(timeout=hold + 60)
        finally:
            if p.poll() is None:
                p.kill()
        if p.returncode == 3:
            losers.append(err)
        else:
            assert p.returncode == 0, err
            winners.append((tmp_path / f"out{i}").read_text().strip())
    elapsed = time.monotonic() - started
    assert elapsed < 2 * hold + 30
    assert len(winners) == len(ONLINE), winners
    assert len(set(winners)) == len(winners), f"two winners share a CPU: {winners}"
    assert sorted(int(w) for w in winners) == ONLINE
    assert len(losers) == n - len(ONLINE)
    for err in losers:
        assert len(err.strip().splitlines()) == 1, err
        assert "cannot allocate 1 exclusive CPU" in err, err
    assert allocations(state) == []


@needs_two_cpus
def test_shared_runs_are_repinned_when_an_exclusive_run_comes_and_goes(
    state: Path, background: list[subprocess.Popen[str]]
) -> None:
    shared = subprocess.Popen(
        corepin("run", "--shared", "--", "sleep", "60", state=state), text=True
    )
    background.append(shared)
    wait_for(lambda: len(allocations(state)) == 1, what="the shared run to be recorded")
    child = allocations(state)[0]["pid"]
    assert isinstance(child, int)
    wait_for(lambda: allowed_cpus(child) == f"{ONLINE[0]}-{ONLINE[-1]}", what="shared affinity")

    exclusive = subprocess.Popen(
        corepin("run", "--exclusive", "1", "--", "sleep", "3", state=state), text=True
    )
    background.append(exclusive)
    wait_for(lambda: len(allocations(state)) == 2, what="the exclusive run to be recorded")
    data = report(state)
    mine = next(a for a in data["allocations"] if a["exclusive"])  # type: ignore[union-attr]
    pool = data["shared_pool"]
    assert pool and mine["cpus"] not in pool.split(",")  # type: ignore[union-attr]
    assert allowed_cpus(child) == pool, "the shared process shrank to the new pool"
    assert exclusive.wait(timeout=30) == 0
    wait_for(
        lambda: allowed_cpus(child) == f"{ONLINE[0]}-{ONLINE[-1]}",
        what="the shared process to grow back to every CPU",
    )
    shared.send_signal(signal.SIGTERM)
    assert shared.wait(timeout=30) == 128 + signal.SIGTERM
    assert allocations(state) == []


def test_sigterm_to_corepin_is_forwarded_and_the_allocation_released(
    state: Path, background: list[subprocess.Popen[str]]
) -> None:
    p = subprocess.Popen(corepin("run", "--exclusive", "1", "--", "sleep", "60", state=state))
    background.append(p)
    wait_for(lambda: len(allocations(state)) == 1, what="the run to be recorded")
    child = allocations(state)[0]["pid"]
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=30) == 128 + signal.SIGTERM
    assert not Path(f"/proc/{child}").exists() or "Z" in Path(f"/proc/{child}/stat").read_text()
    assert allocations(state) == []


def test_kill_9_of_corepin_and_its_command_is_freed_by_reconcile(state: Path) -> None:
    p = subprocess.Popen(
        corepin("run", "--exclusive", "1", "--", "sleep", "60", state=state),
        start_new_session=True,
    )
    try:
        wait_for(lambda: len(allocations(state)) == 1, what="the run to be recorded")
        held = allocations(state)[0]
        os.killpg(p.pid, signal.SIGKILL)
        p.wait(timeout=10)
        # CMD leads a session of its own (its processes are found by it): kill it too
        os.killpg(held["pid"], signal.SIGKILL)
        wait_for(lambda: not Path(f"/proc/{held['pid']}").exists(), what="the child to go")
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    assert [a["id"] for a in allocations(state)] == [held["id"]], "nobody released it yet"
    out = run("reconcile", "--once", state=state)
    assert out.returncode == 0, out.stderr
    assert f"freed {held['id']}" in out.stdout
    assert allocations(state) == []
    assert report(state)["free"] == f"{ONLINE[0]}-{ONLINE[-1]}" if len(ONLINE) > 1 else "0"


def test_kill_9_of_corepin_alone_keeps_the_cpus_while_the_command_lives(state: Path) -> None:
    p = subprocess.Popen(corepin("run", "--exclusive", "1", "--", "sleep", "60", state=state))
    wait_for(lambda: len(allocations(state)) == 1, what="the run to be recorded")
    held = allocations(state)[0]
    child = held["pid"]
    assert isinstance(child, int)
    try:
        p.kill()
        p.wait(timeout=10)
        out = run("reconcile", "--once", state=state)
        assert out.returncode == 0
        assert [a["id"] for a in allocations(state)] == [held["id"]]
    finally:
        os.kill(child, signal.SIGKILL)
    wait_for(lambda: "freed" in run("reconcile", "--once", state=state).stdout, what="a free")
    assert allocations(state) == []


def test_reconcile_repins_a_process_that_widened_its_affinity_and_then_writes_nothing(
    state: Path, background: list[subprocess.Popen[str]]
) -> None:
    p = subprocess.Popen(corepin("run", "--exclusive", "1", "--", "sleep", "60", state=state))
    background.append(p)
    wait_for(lambda: len(allocations(state)) == 1, what="the run to be recorded")
    held = allocations(state)[0]
    child = held["pid"]
    assert isinstance(child, int)
    os.sched_setaffinity(child, ONLINE)  # drift: escaped its CPUs
    out = run("reconcile", "--once", state=state)
    assert out.returncode == 0, out.stderr
    assert f"repinned {held['id']}" in out.stdout
    assert allowed_cpus(child) == held["cpus"]
    checkpoint = state / "state.json"
    before = checkpoint.stat().st_mtime_ns
    again = run("reconcile", "--once", state=state)
    assert again.stdout.strip() == "nothing to do"
    assert checkpoint.stat().st_mtime_ns == before, "steady state: the checkpoint is not written"
    p.send_signal(signal.SIGTERM)
    p.wait(timeout=30)


def test_reconcile_loop_runs_until_sigterm(state: Path) -> None:
    p = subprocess.Popen(
        corepin("reconcile", "--interval", "0.2", "-o", "json", state=state),
        stdout=subprocess.PIPE,
        text=True,
    )
    time.sleep(1.5)
    p.send_signal(signal.SIGTERM)
    out, _ = p.communicate(timeout=10)
    assert p.returncode == 0
    passes = [json.loads(line) for line in out.splitlines()]
    assert len(passes) >= 2
    assert all(entry == {"changes": []} for entry in passes)


def test_report_json_has_the_contract_fields(
    state: Path, background: list[subprocess.Popen[str]]
) -> None:
    p = subprocess.Popen(
        corepin("run", "--exclusive", "1", "--name", "probe", "--", "sleep", "60", state=state)
    )
    background.append(p)
    wait_for(lambda: len(allocations(state)) == 1, what="the run to be recorded")
    data = report(state)
    assert set(data) >= {"allocations", "shared_pool", "free"}
    (entry,) = data["allocations"]  # type: ignore[misc]
    assert set(entry) >= {"id", "pid", "cpus", "exclusive"}
    assert entry["exclusive"] is True
    assert entry["name"] == "probe"
    assert entry["owner_pid"] == p.pid
    assert allowed_cpus(entry["pid"]) == entry["cpus"]
    held = {int(entry["cpus"])}
    assert data["free"] == ",".join(str(c) for c in ONLINE if c not in held)
    table = run("report", state=state)
    assert "probe" in table.stdout and "shared pool:" in table.stdout
    yaml_out = run("report", "-o", "yaml", state=state)
    assert "allocations:" in yaml_out.stdout
    svg = run("report", "-o", "svg", state=state)
    assert svg.stdout.lstrip().startswith("<?xml") and "probe" in svg.stdout
    p.send_signal(signal.SIGTERM)
    p.wait(timeout=30)


def test_report_on_an_empty_state_directory_shows_everything_free(state: Path) -> None:
    data = report(state)
    assert data["allocations"] == []
    assert data["shared_pool"] == data["free"]


@needs_cpuset
@pytest.mark.realhost
def test_run_in_a_real_cpuset_cgroup_gets_the_cpus_and_the_numa_nodes(state: Path) -> None:
    out = run(
        "run",
        "--exclusive",
        "1",
        "--",
        "sh",
        "-c",
        "grep -E 'Cpus_allowed_list|Mems_allowed_list' /proc/self/status; "
        "grep cpuset /proc/self/cgroup; echo $COREPIN_CPUS $COREPIN_MEMS",
        state=state,
        cgroups="on",
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    cpus = lines[0].split(":", 1)[1].strip()
    mems = lines[1].split(":", 1)[1].strip()
    group = lines[2].split(":", 2)[2]
    assert re.fullmatch(r"/corepin/sd-[0-9a-f]{12}/run-[0-9]+-[0-9a-f]{4}", group), group
    assert lines[3] == f"{cpus} {mems}"
    assert not (CPUSET_ROOT / group.lstrip("/")).exists(), "the run's cgroup is removed after"
    parent = CPUSET_ROOT / group.lstrip("/").rsplit("/", 1)[0]
    assert not parent.exists(), "the state directory's own parent group goes with its last run"


@needs_cpuset
@needs_two_cpus
@pytest.mark.realhost
def test_reconcile_restores_a_cgroup_whose_cpuset_drifted(
    state: Path, background: list[subprocess.Popen[str]]
) -> None:
    p = subprocess.Popen(
        corepin("run", "--exclusive", "1", "--", "sleep", "60", state=state, cgroups="on")
    )
    background.append(p)
    wait_for(lambda: len(allocations(state)) == 1, what="the run to be recorded")
    held = allocations(state)[0]
    group = CPUSET_ROOT / str(held["cgroup"])
    wait_for(lambda: (group / "cgroup.procs").exists(), what="the run's cgroup")
    (group / "cpuset.cpus").write_text(f"{ONLINE[0]}-{ONLINE[-1]}")
    out = run("reconcile", "--once", state=state, cgroups="on")
    assert out.returncode == 0, out.stderr
    assert "cpuset.cpus" in out.stdout
    assert (group / "cpuset.cpus").read_text().strip() == held["cpus"]
    assert allowed_cpus(int(held["pid"])) == held["cpus"]  # type: ignore[call-overload]
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=30) == 128 + signal.SIGTERM
    assert not group.exists()


@needs_cpuset
@needs_two_cpus
@pytest.mark.realhost
def test_a_steady_state_reconcile_writes_nothing_at_all(
    state: Path, background: list[subprocess.Popen[str]]
) -> None:
    from corepin.agent.host.agent import HostAgent
    from corepin.agent.host.reconcile import reconcile_once
    from corepin.agent.host.settings import HostSettings

    for args in (("--shared",), ("--exclusive", "1"), ("--shared",)):
        p = subprocess.Popen(corepin("run", *args, "--", "sleep", "60", state=state, cgroups="on"))
        background.append(p)
        expected = len(background)
        wait_for(lambda n=expected: len(allocations(state)) == n, what="the runs to be recorded")
    agent = HostAgent(HostSettings(state_dir=str(state), cgroups="on"))
    checkpoint = state / "state.json"
    before = checkpoint.stat().st_mtime_ns
    assert reconcile_once(agent) == []
    assert agent.pinner.writes == 0, "no cgroup file, affinity or checkpoint was written"
    assert checkpoint.stat().st_mtime_ns == before
    for p in background:
        p.send_signal(signal.SIGTERM)
    for p in background:
        assert p.wait(timeout=30) == 128 + signal.SIGTERM
    assert allocations(state) == []


# ---------------------------------------------------------------------- start-up path


def test_telling_live_runs_alive_reads_their_processes_and_scans_nothing_else(
    state: Path, background: list[subprocess.Popen[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run beside other live runs learns they live from their own stat files: every
    process of the host is scanned only when a run may be dead (to tell it from a lingering
    one), as in the release of a run."""
    import corepin.sysfs.procfs as procfs
    from corepin.agent.host.agent import HostAgent
    from corepin.agent.host.liveness import DEAD, RUNNING
    from corepin.agent.host.settings import HostSettings

    p = subprocess.Popen(corepin("run", "--shared", "--", "sleep", "60", state=state))
    background.append(p)
    wait_for(lambda: len(allocations(state)) == 1, what="the run to be recorded")
    scans: list[str] = []
    real = procfs.process_table

    def counted(proc_root: str = "/proc") -> dict[int, procfs.ProcStat]:
        scans.append(proc_root)
        return real(proc_root)

    monkeypatch.setattr(procfs, "process_table", counted)
    agent = HostAgent(HostSettings(state_dir=str(state), cgroups="off"))
    live = agent.read_state()
    assert len(live.assignments) == 1
    assert scans == [], "the live run was told alive without a scan of every process"
    with agent.transaction() as txn:
        kept, freed = agent.liveness.reap(txn.state)
    assert freed == [] and kept.assignments.keys() == live.assignments.keys()
    assert scans == []
    assert agent.liveness.statuses(live) == {a.id: RUNNING for a in live}
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=30) == 128 + signal.SIGTERM
    # a run whose processes are gone needs the scan (its session or tree might live on)
    scans.clear()
    fresh = HostAgent(HostSettings(state_dir=str(state), cgroups="off"))
    assert fresh.liveness.statuses(live) == {a.id: DEAD for a in live}
    assert scans == ["/proc"]


@needs_cpuset
@pytest.mark.realhost
def test_cmd_joins_its_cgroup_as_its_one_thread_and_its_threads_and_children_follow(
    state: Path,
) -> None:
    """On cgroup v1 the held child joins its cpuset through `tasks` with 0 (itself, its only
    thread), which the kernel does without the write lock on every thread group of the system
    that moving a whole process through `cgroup.procs` waits for (an RCU grace period): CMD,
    the threads it starts and its children are all in the run's group."""
    import sys as _sys

    probe = (
        "import os, threading, subprocess\n"
        "def group(path):\n"
        "    return [l.split(':', 2)[2] for l in open(path).read().splitlines()"
        " if ':cpuset:' in l][0]\n"
        "seen = [group('/proc/self/cgroup')]\n"
        "t = threading.Thread(target=lambda: seen.append("
        "group(f'/proc/self/task/{threading.get_native_id()}/cgroup')))\n"
        "t.start(); t.join()\n"
        "c = subprocess.Popen(['sleep', '5'])\n"
        "seen.append(group(f'/proc/{c.pid}/cgroup')); c.kill(); c.wait()\n"
        "print(' '.join(seen))\n"
    )
    out = run(
        "run", "--exclusive", "1", "--", _sys.executable, "-c", probe, state=state, cgroups="on"
    )
    assert out.returncode == 0, out.stderr
    groups = out.stdout.split()
    assert len(groups) == 3 and len(set(groups)) == 1, groups
    assert re.fullmatch(r"/corepin/sd-[0-9a-f]{12}/run-[0-9]+-[0-9a-f]{4}", groups[0]), groups
    assert not (CPUSET_ROOT / groups[0].lstrip("/")).exists(), "the run's cgroup is removed"


@needs_cpuset
@pytest.mark.realhost
def test_a_run_group_on_cgroup_v1_is_joined_through_its_tasks_file(state: Path) -> None:
    from corepin.agent.host.pinning import Pinner
    from corepin.agent.host.settings import HostSettings
    from corepin.core.cpuset import CPUSet
    from corepin.topology.discover import discover

    settings = HostSettings(state_dir=str(state), cgroups="on")
    pinner = Pinner(settings, discover())
    path = pinner.cgroup_path_for("run-1-abcd")
    try:
        join = pinner.prepare(path, CPUSet.of(ONLINE[0]), CPUSet.of(0))
        assert join == str(CPUSET_ROOT / path / "tasks")
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # what the held child of a run does, then it tells where it is
            try:
                os.close(read)
                with open(join, "w") as handle:
                    handle.write("0")
                with open("/proc/self/cgroup") as handle:
                    os.write(write, handle.read().encode())
            finally:
                os._exit(0)
        os.close(write)
        with os.fdopen(read) as handle:
            lines = handle.read().splitlines()
        os.waitpid(pid, 0)
    finally:
        pinner.remove_orphans(set())
    assert [line.split(":", 2)[2] for line in lines if ":cpuset:" in line] == [f"/{path}"]
    assert not (CPUSET_ROOT / settings.cgroup_parent).exists(), "the scratch groups are removed"


END_PROBE = """
import atexit, sys
if sys.argv[2] == "atexit":
    atexit.register(lambda: print("exit handler ran", flush=True))
print("printed before, still buffered")  # stdout is a pipe: block-buffered
sys.argv = ["corepin", "run", "--state-dir", sys.argv[1], "--cgroups", "off", "--exclusive",
            "1", "--", "sh", "-c", "exit 5"]
from corepin.__main__ import entry
raise SystemExit(entry())
"""


@pytest.mark.parametrize("mode", ["plain", "atexit"])
def test_corepin_run_ends_with_cmds_code_its_output_flushed_and_exit_handlers_run(
    state: Path, mode: str
) -> None:
    """`corepin run` may end its process without Python's shutdown, but never loses anything
    to it: buffered output is written, CMD's exit code is the process's, and a registered exit
    handler (a library user's, coverage's) still runs."""
    import sys as _sys

    done = subprocess.run(
        [_sys.executable, "-c", END_PROBE, str(state), mode],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 5, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "printed before, still buffered"
    assert lines[1:] == (["exit handler ran"] if mode == "atexit" else [])
    assert allocations(state) == []
