"""Nonsense on the command line is refused, not ignored: exit 2 and a message naming the bad
value, and nothing written.

Empty names (`--state-dir ''`), options that contradict each other (`reconcile --once
--interval 5`), options that the chosen mode never reads (`simulate --out` without
`--generate`, `topology --title` without `-o svg`, `allocate --option workload=...` for a policy
without workload families) and out-of-range values in input files.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import pytest

import support.alloc_topologies as T
from corepin.agent.host.settings import HostSettings
from corepin.cli.main import main
from corepin.core.errors import InputError
from corepin.state import state_dir_from
from corepin.state.store import DEFAULT_STATE_DIR
from support.helpers import run_corepin


@pytest.fixture
def topo_file(tmp_path: Path) -> Path:
    path = tmp_path / "topo.json"
    path.write_text(json.dumps(T.two_numa_per_socket_32_cpus().to_json()))
    return path


@pytest.fixture
def trace_file(tmp_path: Path) -> Path:
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"events": [{"op": "add", "id": "a/b/c", "cpus": 2}]}))
    return path


def refused(argv: list[str], capsys: pytest.CaptureFixture[str], *named: str) -> str:
    """Run `corepin ARGV` in this process; assert exit 2 and that stderr names `named`."""
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 2, (code, out, err)
    assert out == "", out
    for needle in named:
        assert needle in err, (needle, err)
    assert "Traceback" not in err and "internal error" not in err
    return err


# ---------------------------------------------------------------------- the state directory


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "--state-dir", "", "--", "true"],
        ["report", "--state-dir", ""],
        ["reconcile", "--once", "--state-dir", ""],
        ["migrate", "--quarantine", "--state-dir", ""],
    ],
    ids=lambda argv: f"corepin {argv[0]} --state-dir ''",
)
def test_an_empty_state_dir_option_is_refused(
    argv: list[str],
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)  # were '' taken for '.', this is where it would write
    refused(argv, capsys, "--state-dir ''")
    assert list(tmp_path.iterdir()) == []


def test_an_empty_state_dir_variable_means_unset() -> None:
    settings = HostSettings.from_args(argparse.Namespace(), {"COREPIN_STATE_DIR": ""})
    assert settings.state_dir == DEFAULT_STATE_DIR
    assert state_dir_from({"COREPIN_STATE_DIR": ""}, None) == DEFAULT_STATE_DIR
    with pytest.raises(InputError, match="--state-dir ''"):
        state_dir_from({"COREPIN_STATE_DIR": "/x"}, "")


def test_a_lock_timeout_that_is_not_a_number_of_seconds_is_refused(tmp_path: Path) -> None:
    for bad in ("soon", "0", "-1", "inf", "nan"):
        out = run_corepin(
            "report",
            "--state-dir",
            str(tmp_path / "s"),
            env={**os.environ, "COREPIN_LOCK_TIMEOUT": bad},
        )
        assert out.returncode == 2, (bad, out.stderr)
        assert f"COREPIN_LOCK_TIMEOUT={bad!r}" in out.stderr


def test_reconcile_once_with_an_interval_is_a_contradiction(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    state = tmp_path / "state"
    argv = ["reconcile", "--once", "--interval", "5", "--state-dir", str(state)]
    refused(argv, capsys, "--once", "--interval 5")
    assert not state.exists()


# ---------------------------------------------------------------------- simulate


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        (["--out", "OUT"], "--out"),
        (["--seed", "3"], "--seed"),
        (["--events", "10"], "--events"),
    ],
    ids=["--out", "--seed", "--events"],
)
def test_generation_options_without_generate_are_refused(
    extra: list[str],
    named: str,
    topo_file: Path,
    trace_file: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    extra = [str(tmp_path / "out.json") if a == "OUT" else a for a in extra]
    argv = ["simulate", "--topology", str(topo_file), "--trace", str(trace_file), *extra]
    refused(argv, capsys, named, "--generate")
    assert not (tmp_path / "out.json").exists()


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        (["--policy", "kubelet-static"], "--policy"),
        (["--decisions", "DEC"], "--decisions"),
        (["-o", "json"], "-o json"),
        (["--trace", "TRACE"], "--trace"),
    ],
    ids=["--policy", "--decisions", "-o json", "--trace"],
)
def test_replay_options_with_generate_are_refused(
    extra: list[str],
    named: str,
    topo_file: Path,
    trace_file: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    where = {"DEC": str(tmp_path / "dec.jsonl"), "TRACE": str(trace_file)}
    extra = [where.get(a, a) for a in extra]
    out = tmp_path / "gen.json"
    argv = ["simulate", "--generate", "--topology", str(topo_file), "--out", str(out), *extra]
    refused(argv, capsys, named)
    assert not out.exists() and not (tmp_path / "dec.jsonl").exists()


# ---------------------------------------------------------------------- topology input


@pytest.mark.parametrize("cpu", [8192, 100000, 10**30])
@pytest.mark.parametrize("command", ["topology", "allocate", "simulate"])
def test_a_topology_file_with_an_out_of_range_cpu_id_exits_2(
    cpu: int,
    command: str,
    topo_file: Path,
    trace_file: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    data = json.loads(topo_file.read_text())
    data["cpus"][3]["cpu"] = cpu
    topo_file.write_text(json.dumps(data))
    extra = {
        "topology": [],
        "allocate": ["--count", "1"],
        "simulate": ["--trace", str(trace_file)],
    }[command]
    refused([command, "--topology", str(topo_file), *extra], capsys, str(cpu), "cpus[3]")


@pytest.mark.parametrize("option", ["--topology", "--sysfs-root"])
@pytest.mark.parametrize("command", ["topology", "allocate", "simulate"])
def test_an_empty_topology_source_is_refused_not_replaced_by_this_machine(
    option: str, command: str, trace_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    extra = {
        "topology": [],
        "allocate": ["--count", "1"],
        "simulate": ["--trace", str(trace_file)],
    }[command]
    refused([command, option, "", *extra], capsys, f"{option} ''")


def test_a_title_without_an_svg_picture_is_refused(
    topo_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["topology", "--topology", str(topo_file), "--title", "rack 7", "-o", "json"]
    refused(argv, capsys, "--title 'rack 7'", "-o svg")


# ---------------------------------------------------------------------- allocate options


@pytest.mark.parametrize(
    ("options", "policy", "named"),
    [
        (["shared", "level=core"], "topology-aware", "level=core"),
        (["shared", "numa=1"], "topology-aware", "numa=1"),
        (["shared", "smt=spread"], "kubelet-static", "smt=spread"),
        (["workload=cpu-bound"], "topology-aware", "workload=cpu-bound"),
        (["workload=io-bound"], "kubelet-static", "workload=io-bound"),
        (["prefer-isolated=false"], "kubelet-static", "prefer-isolated=false"),
    ],
    ids=[
        "a level on a shared request",
        "a NUMA hint on a shared request",
        "an SMT preference on a shared request",
        "a workload family for topology-aware",
        "a workload family for kubelet-static",
        "prefer-isolated for kubelet-static",
    ],
)
def test_allocate_options_the_decision_would_ignore_are_refused(
    options: list[str],
    policy: str,
    named: str,
    topo_file: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["allocate", "--topology", str(topo_file), "--count", "2", "--policy", policy]
    for option in options:
        argv += ["--option", option]
    refused(argv, capsys, named)


def test_allocate_options_a_decision_uses_are_still_accepted(
    topo_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["allocate", "--topology", str(topo_file), "--count", "2"]
    for extra in (
        ["--option", "shared", "--option", "level=cpu"],
        ["--policy", "workload-aware", "--option", "workload=cpu-bound"],
        ["--option", "prefer-isolated=false", "--option", "numa=1"],
    ):
        assert main([*base, *extra]) == 0, capsys.readouterr().err
    capsys.readouterr()


# ---------------------------------------------------------------------- migrate


@pytest.mark.parametrize(
    "extra", [["--cgroups", "off"], ["--dry-run"]], ids=["--cgroups", "--dry-run"]
)
def test_quarantine_refuses_the_import_options(
    extra: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["migrate", "--quarantine", "--state-dir", str(tmp_path / "s"), *extra]
    refused(argv, capsys, extra[0])
