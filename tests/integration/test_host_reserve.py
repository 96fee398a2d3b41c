"""`corepin reserve` and `corepin run --reservation` on this host with real processes (affinity
only, and in real cpuset cgroups where the host has a writable v1 cpuset hierarchy): CPUs held
for a run to come, the run that gets exactly them, no other run ever on them, the end of a
reservation (used up, deleted, expired) and `corepin report`'s `reservations`."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from corepin.core.cpuset import CPUSet
from support.helpers import allowed_cpus, corepin_argv, kill_and_remove_cgroup, reap, wait_for

ONLINE = sorted(os.sched_getaffinity(0))
CPUSET_ROOT = Path("/sys/fs/cgroup/cpuset")

needs_two_cpus = pytest.mark.skipif(len(ONLINE) < 2, reason="needs at least 2 CPUs")
needs_cpuset = pytest.mark.skipif(
    not (os.geteuid() == 0 and (CPUSET_ROOT / "cpuset.cpus").exists()),
    reason="needs root and a cgroup v1 cpuset hierarchy at " + str(CPUSET_ROOT),
)


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("COREPIN_")}


def argv(state: Path, *args: str, cgroups: str = "off") -> list[str]:
    return corepin_argv(args[0], "--state-dir", str(state), "--cgroups", cgroups, *args[1:])


def corepin(
    state: Path, *args: str, cgroups: str = "off", timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv(state, *args, cgroups=cgroups),
        capture_output=True,
        text=True,
        timeout=timeout,
        env=_env(),
        check=False,
    )


def report(state: Path) -> dict[str, Any]:
    out = corepin(state, "report", "-o", "json")
    assert out.returncode == 0, out.stderr
    data: dict[str, Any] = json.loads(out.stdout)
    return data


def one_line_error(done: subprocess.CompletedProcess[str], code: int) -> str:
    assert done.returncode == code, (done.returncode, done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert lines and "Traceback" not in done.stderr, done.stderr
    return lines[-1]


@pytest.fixture
def state(tmp_path: Path) -> Path:
    return tmp_path / "state"


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


def start(state: Path, *args: str, cgroups: str = "off") -> subprocess.Popen[str]:
    return subprocess.Popen(argv(state, "run", *args, cgroups=cgroups), env=_env(), text=True)


# ---------------------------------------------------------------- reserve, report


@needs_two_cpus
def test_a_reservation_holds_its_cpus_out_of_the_free_set_and_the_shared_pool(
    state: Path,
) -> None:
    done = corepin(state, "reserve", "db", "--cpus", "1", "-o", "json")
    assert done.returncode == 0, done.stderr
    made = json.loads(done.stdout)
    cpus = CPUSet.parse(made["cpus"])
    assert len(cpus) == 1 and made["name"] == "db"
    assert made["expires"] is None and made["consumed_by"] is None
    data = report(state)
    assert data["reservations"] == [
        {
            "name": "db",
            "cpus": str(cpus),
            "expires": None,
            "consumed_by": None,
            "withheld": str(cpus),
            "level": "cpu",
            "reusable": False,
        }
    ]
    assert not cpus & CPUSet.parse(data["free"])
    assert not cpus & CPUSet.parse(data["shared_pool"])
    for key in ("allocations", "shared_pool", "free", "online", "held", "revision"):
        assert key in data, key
    table = corepin(state, "report")
    assert table.returncode == 0, table.stderr
    assert "Reservations:" in table.stdout
    assert re.search(rf"^db\s+{cpus}\s", table.stdout, re.M), table.stdout


def test_a_ttl_gives_an_rfc3339_expiry_and_yaml_and_table_print(state: Path) -> None:
    done = corepin(state, "reserve", "web", "--cpus", "1", "--ttl", "3600", "-o", "yaml")
    assert done.returncode == 0, done.stderr
    assert re.search(r"expires: '?\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ'?", done.stdout), done.stdout
    (row,) = report(state)["reservations"]
    stamp = time.mktime(time.strptime(row["expires"], "%Y-%m-%dT%H:%M:%SZ")) - time.timezone
    assert 3500 < stamp - time.time() <= 3600
    table = corepin(state, "reserve", "--delete", "web")
    assert table.returncode == 0, table.stderr
    assert "deleted reservation web" in table.stdout
    assert report(state)["reservations"] == []


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["Bad_Name", "--cpus", "1"], "lower-case"),
        (["ok", "--cpu-list", "0-"], "0-"),
        (["ok", "--cpu-list", "4096"], "not online"),
        (["ok", "--cpus", "1", "--ttl", "0"], "--ttl"),
        (["ok", "--cpus", "1", "--ttl", "soon"], "--ttl"),
        (["ok"], "--cpus N or --cpu-list"),
        (["--cpus", "1"], "no reservation name"),
        (["--delete", "nothing"], "no reservation named 'nothing'"),
        (["ok", "--cpus", "0"], "positive integer"),
    ],
)
def test_bad_names_lists_and_ttls_exit_2_with_one_line(
    state: Path, args: list[str], needle: str
) -> None:
    line = one_line_error(corepin(state, "reserve", *args), 2)
    assert needle in line, line
    assert report(state)["reservations"] == []


@needs_two_cpus
def test_a_cpu_list_that_is_not_free_exits_3_naming_the_holder(
    state: Path, background: list[subprocess.Popen[str]]
) -> None:
    assert corepin(state, "reserve", "first", "--cpu-list", str(ONLINE[1])).returncode == 0
    line = one_line_error(corepin(state, "reserve", "second", "--cpu-list", str(ONLINE[1])), 3)
    assert "reservation first" in line, line
    background.append(start(state, "--cpus", str(ONLINE[0]), "--", "sleep", "60"))
    wait_for(lambda: len(report(state)["allocations"]) == 1, what="the run to be recorded")
    run_id = report(state)["allocations"][0]["id"]
    line = one_line_error(corepin(state, "reserve", "third", "--cpu-list", str(ONLINE[0])), 3)
    assert run_id in line and "sleep" in line, line
    taken = one_line_error(corepin(state, "reserve", "first", "--cpus", "1"), 2)
    assert "already exists" in taken


# ---------------------------------------------------------------- run --reservation


def show_cpus() -> list[str]:
    return ["--", "sh", "-c", "grep Cpus_allowed_list /proc/self/status; echo $COREPIN_CPUS"]


@needs_two_cpus
def test_a_run_on_a_reservation_gets_exactly_its_cpus_and_uses_it_up(state: Path) -> None:
    assert corepin(state, "reserve", "job", "--cpu-list", str(ONLINE[1])).returncode == 0
    done = corepin(state, "run", "--reservation", "job", *show_cpus())
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [f"Cpus_allowed_list:\t{ONLINE[1]}", str(ONLINE[1])]
    assert report(state)["reservations"] == [], "a one-time reservation ends with its run"
    line = one_line_error(corepin(state, "run", "--reservation", "job", "--", "true"), 3)
    assert "no reservation named 'job'" in line


@needs_two_cpus
def test_a_reusable_reservation_comes_back_and_records_its_run_while_in_use(
    state: Path, background: list[subprocess.Popen[str]]
) -> None:
    assert (
        corepin(state, "reserve", "svc", "--cpu-list", str(ONLINE[1]), "--reusable").returncode == 0
    )
    background.append(start(state, "--reservation", "svc", "--", "sleep", "60"))
    wait_for(lambda: len(report(state)["allocations"]) == 1, what="the run to be recorded")
    data = report(state)
    (row,) = data["allocations"]
    assert row["reservation"] == "svc" and row["cpus"] == str(ONLINE[1])
    assert data["reservations"][0]["consumed_by"] == row["id"]
    wait_for(lambda: allowed_cpus(int(row["pid"])) == str(ONLINE[1]), what="the run's pin")
    line = one_line_error(corepin(state, "run", "--reservation", "svc", "--", "true"), 3)
    assert "in use by " + row["id"] in line
    background[0].send_signal(signal.SIGTERM)
    background[0].wait(timeout=30)
    data = report(state)
    assert data["allocations"] == []
    assert data["reservations"][0]["consumed_by"] is None
    done = corepin(state, "run", "--reservation", "svc", *show_cpus())
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == f"Cpus_allowed_list:\t{ONLINE[1]}"


@needs_two_cpus
def test_no_other_run_ever_gets_reserved_cpus(
    state: Path, background: list[subprocess.Popen[str]]
) -> None:
    reserved = str(ONLINE[0])
    assert corepin(state, "reserve", "hold", "--cpu-list", reserved).returncode == 0
    too_many = one_line_error(
        corepin(state, "run", "--exclusive", str(len(ONLINE)), "--", "true"), 3
    )
    assert "cannot allocate" in too_many or "not enough" in too_many, too_many
    named = one_line_error(corepin(state, "run", "--cpus", reserved, "--", "true"), 3)
    assert "reservation hold" in named
    for _ in range(3):
        done = corepin(state, "run", "--exclusive", "1", *show_cpus())
        assert done.returncode == 0, done.stderr
        assert reserved not in CPUSet.parse(done.stdout.splitlines()[-1])
    shared = corepin(state, "run", "--shared", *show_cpus())
    assert shared.returncode == 0, shared.stderr
    assert int(reserved) not in CPUSet.parse(shared.stdout.splitlines()[0].split(":")[1].strip())
    # a shared run already there leaves the CPUs a new reservation takes, at once
    assert corepin(state, "reserve", "--delete", "hold").returncode == 0
    background.append(start(state, "--shared", "--", "sleep", "60"))
    wait_for(lambda: len(report(state)["allocations"]) == 1, what="the shared run")
    pid = int(report(state)["allocations"][0]["pid"])
    wait_for(lambda: allowed_cpus(pid) == str(CPUSet(ONLINE)), what="the whole pool")
    assert corepin(state, "reserve", "later", "--cpu-list", reserved).returncode == 0
    assert int(reserved) not in CPUSet.parse(allowed_cpus(pid))


def test_reservation_excludes_exclusive_and_cpus_and_level(state: Path) -> None:
    for args in (["--exclusive", "1"], ["--cpus", "0"], ["--shared"]):
        done = corepin(state, "run", "--reservation", "x", *args, "--", "true")
        assert done.returncode == 2, done.stderr
    line = one_line_error(
        corepin(state, "run", "--reservation", "x", "--level", "core", "--", "true"), 2
    )
    assert "--level" in line
    assert one_line_error(corepin(state, "run", "--reservation", "X!", "--", "true"), 2)


@needs_two_cpus
@pytest.mark.parametrize("reusable", [False, True])
def test_releasing_a_run_on_a_reservation_ends_or_frees_the_reservation(
    state: Path, background: list[subprocess.Popen[str]], reusable: bool
) -> None:
    cpu = str(ONLINE[1])
    extra = ["--reusable"] if reusable else []
    assert corepin(state, "reserve", "rel", "--cpu-list", cpu, *extra).returncode == 0
    background.append(start(state, "--reservation", "rel", "--", "sleep", "60"))
    wait_for(lambda: len(report(state)["allocations"]) == 1, what="the run to be recorded")
    (row,) = report(state)["allocations"]
    done = corepin(state, "release", row["id"])
    assert done.returncode == 0, done.stderr
    data = report(state)
    assert data["allocations"][0]["kind"] == "shared", "its processes live on, shared"
    if reusable:
        assert data["reservations"][0]["consumed_by"] is None
        assert int(cpu) not in CPUSet.parse(data["shared_pool"])
    else:
        assert data["reservations"] == []
        assert int(cpu) in CPUSet.parse(data["shared_pool"])
    wait_for(
        lambda: int(cpu) in CPUSet.parse(allowed_cpus(int(row["pid"]))) or reusable,
        what="the released run in the shared pool",
    )


# ---------------------------------------------------------------- expiry, delete


@needs_two_cpus
def test_an_expired_reservation_is_never_shown_and_cannot_be_run_on(state: Path) -> None:
    assert corepin(state, "reserve", "brief", "--cpus", "1", "--ttl", "0.5").returncode == 0
    wait_for(lambda: report(state)["reservations"] == [], what="the reservation to expire")
    assert report(state)["free"] == str(CPUSet(ONLINE))
    line = one_line_error(corepin(state, "run", "--reservation", "brief", "--", "true"), 3)
    assert "no reservation named 'brief'" in line


@needs_two_cpus
def test_an_expired_reservation_in_use_ends_and_its_run_keeps_its_cpus(
    state: Path, background: list[subprocess.Popen[str]]
) -> None:
    cpu = str(ONLINE[1])
    assert corepin(state, "reserve", "soon", "--cpu-list", cpu, "--ttl", "2").returncode == 0
    background.append(start(state, "--reservation", "soon", "--", "sleep", "60"))
    wait_for(lambda: len(report(state)["allocations"]) == 1, what="the run to be recorded")
    wait_for(lambda: report(state)["reservations"] == [], what="the reservation to expire")
    out = corepin(state, "reconcile", "--once")
    assert out.returncode == 0, out.stderr
    assert f"expired reservation soon: CPUs {cpu}" in out.stdout, out.stdout
    data = report(state)
    (row,) = data["allocations"]
    assert row["cpus"] == cpu and row["reservation"] is None and row["status"] == "running"
    assert int(cpu) not in CPUSet.parse(data["free"])
    assert allowed_cpus(int(row["pid"])) == cpu


@needs_two_cpus
def test_deleting_a_reservation_in_use_leaves_its_run_on_its_cpus(
    state: Path, background: list[subprocess.Popen[str]]
) -> None:
    cpu = str(ONLINE[1])
    assert corepin(state, "reserve", "gone", "--cpu-list", cpu).returncode == 0
    background.append(start(state, "--reservation", "gone", "--", "sleep", "60"))
    wait_for(lambda: len(report(state)["allocations"]) == 1, what="the run to be recorded")
    done = corepin(state, "reserve", "--delete", "gone", "-o", "json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["deleted"]["name"] == "gone"
    data = report(state)
    assert data["reservations"] == []
    assert data["allocations"][0]["cpus"] == cpu
    background[0].send_signal(signal.SIGTERM)
    background[0].wait(timeout=30)
    assert report(state)["free"] == str(CPUSet(ONLINE))


# ---------------------------------------------------------------- real cgroups


@needs_cpuset
@needs_two_cpus
@pytest.mark.realhost
def test_a_run_on_a_reservation_gets_a_cpuset_group_of_exactly_its_cpus(state: Path) -> None:
    cpu = str(ONLINE[1])
    made = corepin(state, "reserve", "grp", "--cpu-list", cpu, cgroups="on")
    assert made.returncode == 0, made.stderr
    script = (
        "grep Cpus_allowed_list /proc/self/status; g=$(grep cpuset /proc/self/cgroup | "
        f"cut -d: -f3); cat {CPUSET_ROOT}$g/cpuset.cpus; echo $g"
    )
    done = corepin(state, "run", "--reservation", "grp", "--", "sh", "-c", script, cgroups="on")
    try:
        assert done.returncode == 0, done.stderr
        lines = done.stdout.splitlines()
        assert lines[0] == f"Cpus_allowed_list:\t{cpu}"
        assert lines[1] == cpu
        assert re.fullmatch(r"/corepin/sd-[0-9a-f]{12}/run-[0-9]+-[0-9a-f]{4}", lines[2])
        assert not (CPUSET_ROOT / lines[2].lstrip("/")).exists()
    finally:
        for line in done.stdout.splitlines()[2:3]:
            parent = CPUSET_ROOT / line.lstrip("/").rsplit("/", 1)[0]
            assert kill_and_remove_cgroup(parent)
