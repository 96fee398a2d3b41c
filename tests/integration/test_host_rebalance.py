"""`corepin reconcile --rebalance` and the move executor with real processes.

This machine has 2 CPUs and 1 NUMA node, where no run can be misaligned. So the planner's side
runs on a synthetic sysfs tree of 4 CPUs in 2 NUMA nodes (node 0: CPUs 0 and 2, node 1: CPUs 1
and 3), with real runs pinned by affinity (`--cgroups off`): a run given CPUs 1-2 (the kernel
keeps the real one of them, 1) spans both nodes, CPU 3 is reserved, so the one better set is
0,2 and the move shows in the run's real affinity (0); the engine reports that the kernel
narrowed 0,2 to 0 (CPU 2 is not real), which is expected here. The executor's side runs on
real cpuset cgroups on CPUs 0 and 1: a run with busy threads moved between them, with a shared
run beside it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from corepin.core.cpuset import CPUSet
from corepin.testing.sysfs_tree import write_sysfs_tree
from corepin.topology.model import CPUInfo, Topology
from support.helpers import allowed_cpus, corepin_argv, kill_and_remove_cgroup, reap, wait_for

ONLINE = sorted(os.sched_getaffinity(0))
CPUSET_ROOT = Path("/sys/fs/cgroup/cpuset")

needs_cpus_0_1 = pytest.mark.skipif(
    ONLINE[:2] != [0, 1], reason="needs CPUs 0 and 1 (the synthetic tree maps them)"
)
needs_cpuset = pytest.mark.skipif(
    not (os.geteuid() == 0 and (CPUSET_ROOT / "cpuset.cpus").exists()),
    reason="needs root and a cgroup v1 cpuset hierarchy at " + str(CPUSET_ROOT),
)


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("COREPIN_")}


@pytest.fixture
def machine(tmp_path: Path) -> list[str]:
    """--state-dir and --sysfs-root of a 2-node synthetic machine (see the module docstring)."""
    topo = Topology(
        [
            CPUInfo(0, socket=0, die=0, numa=0, l3=0, core=0),
            CPUInfo(1, socket=0, die=0, numa=1, l3=1, core=1),
            CPUInfo(2, socket=0, die=0, numa=0, l3=0, core=2),
            CPUInfo(3, socket=0, die=0, numa=1, l3=1, core=3),
        ]
    )
    root = write_sysfs_tree(topo, tmp_path / "root")
    return ["--state-dir", str(tmp_path / "state"), "--sysfs-root", str(root), "--cgroups", "off"]


@pytest.fixture
def background() -> Iterator[list[subprocess.Popen[str]]]:
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                reap(p)


def corepin(machine: list[str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        corepin_argv(args[0], *machine, *args[1:]),
        capture_output=True,
        text=True,
        timeout=60,
        env=_env(),
        check=False,
    )


def start(machine: list[str], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(corepin_argv("run", *machine, *args), env=_env(), text=True)


def allocations(machine: list[str]) -> list[dict[str, Any]]:
    out = corepin(machine, "report", "-o", "json")
    assert out.returncode == 0, out.stderr
    rows: list[dict[str, Any]] = json.loads(out.stdout)["allocations"]
    return rows


def misaligned_run(
    machine: list[str], background: list[subprocess.Popen[str]], *options: str
) -> dict[str, Any]:
    """A run on CPUs 1-2 (both NUMA nodes) with CPU 3 reserved; its report row."""
    background.append(
        start(
            machine,
            "--cpus",
            "1-2",
            "--membind",
            "0",
            "--reserved-cpus",
            "3",
            *options,
            "--",
            "sleep",
            "60",
        )
    )
    wait_for(lambda: len(allocations(machine)) == 1, what="the run to be recorded")
    (row,) = allocations(machine)
    wait_for(lambda: allowed_cpus(int(row["pid"])) == "1", what="the run's pin")
    return row


@needs_cpus_0_1
def test_rebalance_moves_a_run_spanning_two_nodes_live_and_says_why(
    machine: list[str], background: list[subprocess.Popen[str]]
) -> None:
    row = misaligned_run(machine, background)
    plain = corepin(machine, "reconcile", "--once")
    assert plain.returncode == 0, plain.stderr
    assert "moved" not in plain.stdout, "only --rebalance moves runs"
    done = corepin(machine, "reconcile", "--once", "--rebalance")
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stdout.splitlines() if line.startswith("moved ")]
    assert lines == [
        f"moved {row['id']}: from CPUs 1-2 to 0,2: spans 2 NUMA nodes and 2 L3 caches "
        "where 1 and 1 would do; moved to 0,2"
    ], done.stdout
    assert allowed_cpus(int(row["pid"])) == "0", "the process follows at once"
    (after,) = allocations(machine)
    assert after["cpus"] == "0,2" and after["withheld"] == "0,2" and after["mems"] == "0"
    again = corepin(machine, "reconcile", "--once", "--rebalance", "-o", "json")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["moves"] == [], "an aligned run stays"


@needs_cpus_0_1
def test_rebalance_json_lists_each_move(
    machine: list[str], background: list[subprocess.Popen[str]]
) -> None:
    row = misaligned_run(machine, background)
    done = corepin(machine, "reconcile", "--once", "--rebalance", "-o", "json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    (move,) = data["moves"]
    assert move["id"] == row["id"] and move["old"] == "1-2" and move["new"] == "0,2"
    assert move["before"] == {"numa": 2, "l3": 2, "partial_cores": 0}
    assert move["after"] == {"numa": 1, "l3": 1, "partial_cores": 0}
    assert {"action": "moved", "target": row["id"]}.items() <= data["changes"][0].items()


@needs_cpus_0_1
def test_a_run_that_asked_not_to_move_stays(
    machine: list[str], background: list[subprocess.Popen[str]]
) -> None:
    row = misaligned_run(machine, background, "--no-rebalance")
    done = corepin(machine, "reconcile", "--once", "--rebalance", "-o", "json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["moves"] == []
    assert allocations(machine)[0]["cpus"] == "1-2"
    assert allocations(machine)[0]["rebalance"] is False
    assert allowed_cpus(int(row["pid"])) == "1"


@needs_cpus_0_1
def test_a_run_on_a_reservation_is_never_moved(
    machine: list[str], background: list[subprocess.Popen[str]]
) -> None:
    made = corepin(machine, "reserve", "split", "--cpu-list", "1-2")
    assert made.returncode == 0, made.stderr
    background.append(
        start(machine, "--reservation", "split", "--membind", "0", "--", "sleep", "60")
    )
    wait_for(lambda: len(allocations(machine)) == 1, what="the run to be recorded")
    done = corepin(machine, "reconcile", "--once", "--rebalance", "-o", "json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["moves"] == []
    assert allocations(machine)[0]["cpus"] == "1-2"


@needs_cpus_0_1
def test_the_rebalance_loop_moves_and_stops_on_sigterm(
    machine: list[str], background: list[subprocess.Popen[str]]
) -> None:
    row = misaligned_run(machine, background)
    loop = subprocess.Popen(
        corepin_argv("reconcile", *machine, "--rebalance", "--interval", "0.2"),
        env=_env(),
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        wait_for(lambda: allowed_cpus(int(row["pid"])) == "0", what="the move")
        loop.send_signal(signal.SIGTERM)
        out, err = loop.communicate(timeout=30)
    finally:
        reap(loop)
    assert loop.returncode == 0, err
    moves = [line for line in out.splitlines() if line.startswith("moved ")]
    assert len(moves) == 1, out


# ---------------------------------------------------------------- the executor, real cgroups

BUSY = (
    "import threading\n"
    "def spin():\n"
    "    while True: pass\n"
    "for _ in range(3): threading.Thread(target=spin, daemon=True).start()\n"
    "threading.Event().wait()\n"
)


def threads_of(pid: int) -> dict[int, str]:
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            text = Path(f"/proc/{pid}/task/{tid}/status").read_text()
        except OSError:
            continue
        for line in text.splitlines():
            if line.startswith("Cpus_allowed_list:"):
                out[int(tid)] = line.split(":", 1)[1].strip()
    return out


@needs_cpuset
@needs_cpus_0_1
@pytest.mark.realhost
def test_the_executor_moves_a_run_in_its_cpuset_group_and_every_thread(
    tmp_path: Path, background: list[subprocess.Popen[str]]
) -> None:
    import sys

    from corepin.agent.host.agent import HostAgent
    from corepin.agent.host.rebalance import execute
    from corepin.agent.host.settings import HostSettings
    from corepin.allocation.alignment import Alignment
    from corepin.allocation.rebalance import Move

    state = tmp_path / "state"
    settings = HostSettings(state_dir=str(state), cgroups="on")
    host_args = ["--state-dir", str(state), "--cgroups", "on"]
    parent = CPUSET_ROOT / settings.cgroup_parent
    try:
        background.append(start(host_args, "--cpus", "0", "--", sys.executable, "-c", BUSY))
        background.append(start(host_args, "--shared", "--", "sleep", "60"))
        wait_for(lambda: len(allocations(host_args)) == 2, what="both runs")
        rows = {r["kind"]: r for r in allocations(host_args)}
        run, shared = rows["exclusive"], rows["shared"]
        pid = int(run["pid"])
        wait_for(lambda: len(threads_of(pid)) == 4, what="the busy threads")
        group = CPUSET_ROOT / str(run["cgroup"])
        same = Alignment(1, 1, 0)
        for old, new in ((0, 1), (1, 0)):
            notes = execute(
                HostAgent(settings),
                [Move(run["id"], CPUSet([old]), CPUSet([new]), CPUSet([new]), same, same)],
            )
            assert not [n for n in notes if n.action == "failed"], notes
            assert (group / "cpuset.cpus").read_text().strip() == str(new)
            assert set(threads_of(pid).values()) == {str(new)}
            assert allowed_cpus(int(shared["pid"])) == str(1 - new), "shared runs follow"
            rows = {r["kind"]: r for r in allocations(host_args)}
            assert rows["exclusive"]["cpus"] == str(new)
            assert rows["shared"]["cpus"] == str(1 - new)
        from corepin.core.errors import AllocationError

        with pytest.raises(AllocationError, match="stale"):
            execute(
                HostAgent(settings),
                [Move(run["id"], CPUSet([1]), CPUSet([0]), CPUSet([0]), same, same)],
            )
    finally:
        for p in background:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                p.wait(timeout=30)
        assert kill_and_remove_cgroup(parent)


@needs_cpus_0_1
def test_a_rebalance_limit_caps_the_moves_of_a_pass_and_is_checked(
    machine: list[str], background: list[subprocess.Popen[str]]
) -> None:
    for bad, words in (
        (["--rebalance", "--rebalance-limit", "0"], "expected a whole number >= 1, got '0'"),
        (["--rebalance-limit", "1"], "give --rebalance too"),
    ):
        done = corepin(machine, "reconcile", "--once", *bad)
        assert done.returncode == 2 and words in done.stderr, (bad, done.stderr)
    row = misaligned_run(machine, background)
    done = corepin(
        machine, "reconcile", "--once", "--rebalance", "--rebalance-limit", "1", "-o", "json"
    )
    assert done.returncode == 0, done.stderr
    assert [m["id"] for m in json.loads(done.stdout)["moves"]] == [row["id"]]
