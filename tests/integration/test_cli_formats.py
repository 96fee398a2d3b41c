"""The command line as a whole: every flag has help, every reporting command takes `-o
table|json|yaml` (default `table`, `text` its old alias), JSON is indented, times in JSON are
RFC 3339 text; and the papercuts: a missing state directory, a corrupt checkpoint,
`Topology.from_json` given text."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from corepin.cli.main import build_parser, main
from corepin.core.errors import TopologyError
from corepin.testing.catalogue import machine
from corepin.topology.model import Topology
from support.helpers import reap, wait_for

#: the commands that report something, and the formats each has besides table, json and yaml
REPORTING = {
    "topology": {"tree", "svg"},
    "allocate": set(),
    "simulate": set(),
    "report": {"svg"},
    "reconcile": set(),
    "release": set(),
    "reserve": set(),
    "shield": set(),
    "pin": set(),
    "migrate": set(),
}
RFC3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")


def subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def output_action(cmd: argparse.ArgumentParser) -> argparse.Action:
    return next(a for a in cmd._actions if "--output" in a.option_strings)


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_every_flag_of_every_command_has_help() -> None:
    missing = [
        f"{name} {'/'.join(action.option_strings) or action.dest}"
        for name, cmd in subcommands().items()
        for action in cmd._actions
        if not action.help
    ]
    assert missing == []


@pytest.mark.parametrize("name", sorted(REPORTING))
def test_every_reporting_command_takes_table_json_and_yaml(name: str) -> None:
    action = output_action(subcommands()[name])
    assert action.option_strings == ["-o", "--output"]
    assert action.choices is not None
    assert set(action.choices) == {"table", "json", "yaml"} | REPORTING[name]
    assert action.default in ("table", None)  # simulate: None means table, and is checked
    convert = action.type
    assert callable(convert) and convert("text") == "table", "the old name stays"


def test_no_other_command_has_an_output_flag() -> None:
    for name, cmd in subcommands().items():
        if name not in REPORTING:
            assert not any("--output" in a.option_strings for a in cmd._actions), name


def test_text_is_still_accepted_and_means_table(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["allocate", "--machine", "laptop", "--count", "2"]
    assert run([*argv, "-o", "text"], capsys) == run(argv, capsys) == (0, "0,4\n", "")


def test_a_format_a_command_lacks_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["allocate", "--machine", "laptop", "--count", "2", "-o", "svg"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'svg'" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [
        ["topology", "--machine", "arm-clusters"],
        ["allocate", "--machine", "epyc-4l3", "--count", "4"],
    ],
)
def test_json_is_indented_and_yaml_says_the_same(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    code, as_json, _ = run([*argv, "-o", "json"], capsys)
    assert code == 0
    assert as_json.startswith("{\n  ") and as_json.endswith("}\n")
    code, as_yaml, _ = run([*argv, "-o", "yaml"], capsys)
    assert code == 0
    assert yaml.safe_load(as_yaml) == json.loads(as_json)


# ---------------------------------------------------------------------- host commands


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh state directory of this host (no cgroups), as COREPIN_STATE_DIR."""
    path = tmp_path / "state"
    monkeypatch.setenv("COREPIN_STATE_DIR", str(path))
    monkeypatch.setenv("COREPIN_CGROUPS", "off")
    return path


@pytest.fixture
def sleeper(state: Path) -> Iterator[str]:
    """A shared `corepin run -- sleep 60` in `state`: its allocation id."""
    argv = ["run", "--shared", "--name", "sleeper", "--", "sleep", "60"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "corepin", *argv],
        env=dict(os.environ),
        stdout=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: (state / "state.json").exists() and _ids(state), what="the run")
        yield _ids(state)[0]
    finally:
        reap(proc)


def _ids(state: Path) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-m", "corepin", "report", "-o", "json"],
        capture_output=True,
        text=True,
        env=dict(os.environ),
    )
    if done.returncode != 0:
        return []
    return [a["id"] for a in json.loads(done.stdout)["allocations"]]


def floats(data: Any) -> list[float]:
    if isinstance(data, float):
        return [data]
    if isinstance(data, dict):
        return [f for value in data.values() for f in floats(value)]
    if isinstance(data, list):
        return [f for value in data for f in floats(value)]
    return []


def test_report_gives_created_as_rfc3339_text_and_no_epoch_anywhere(
    state: Path, sleeper: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(["report", "-o", "json"], capsys)
    assert code == 0 and out.startswith("{\n  ")
    data = json.loads(out)
    (row,) = data["allocations"]
    assert {"id", "pid", "cpus", "exclusive"} <= set(row), "the contract keys stay"
    assert row["id"] == sleeper
    assert RFC3339.match(row["created"]), row["created"]
    assert [f for f in floats(data) if f > 1e9] == [], "no epoch float"
    code, out, _ = run(["report", "-o", "yaml"], capsys)
    assert yaml.safe_load(out)["allocations"][0]["created"] == row["created"]


def test_release_reserve_reconcile_and_migrate_pretty_print_json(
    state: Path, sleeper: str, capsys: pytest.CaptureFixture[str]
) -> None:
    documents = []
    for argv in (
        ["reserve", "later", "--cpus", "1", "-o", "json"],
        ["reserve", "--delete", "later", "-o", "json"],
        ["release", sleeper, "-o", "json"],
        ["reconcile", "--once", "-o", "json"],
        ["shield", "status", "-o", "json"],
    ):
        code, out, err = run(argv, capsys)
        assert code == 0, (argv, err)
        assert out.startswith("{\n  "), (argv, out)
        documents.append(json.loads(out))
    reserved, deleted, released, *_ = documents
    assert RFC3339.match(reserved["expires"] or "2000-01-01T00:00:00Z")
    assert deleted["deleted"]["name"] == "later"
    assert any(sleeper in change["target"] + change["detail"] for change in released["changes"])
    empty = state.parent / "empty"
    empty.mkdir(mode=0o700)
    code, out, _ = run(["migrate", "--quarantine", "--state-dir", str(empty), "-o", "yaml"], capsys)
    assert code == 0 and yaml.safe_load(out)["moved_to"] is None


def test_report_of_a_missing_state_directory_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The empty state such a directory stands for (exit 0: scripts read "nothing held"), the
    table naming the directory: a typo is not an idle host. Nothing on stderr (notes there are
    for -v)."""
    missing = tmp_path / "nonexistent" / "x"
    said = f"state directory '{missing}' does not exist: nothing has run with it yet"
    given = ["--state-dir", str(missing), "--cgroups", "off"]
    code, out, err = run(["report", "-o", "json", *given], capsys)
    assert (code, err) == (0, "")
    assert json.loads(out)["allocations"] == []
    code, out, err = run(["report", *given], capsys)
    assert (code, err) == (0, "")
    assert f"(no allocations: {said})" in out
    assert "(no allocations)" not in out
    code, out, err = run(["shield", "status", *given], capsys)
    assert (code, err) == (0, "")
    assert out.endswith(f"({said})\n")
    assert not missing.parent.exists(), "a command that reads creates nothing"
    state = tmp_path / "there"
    state.mkdir(mode=0o700)
    code, out, err = run(["report", "--state-dir", str(state), "--cgroups", "off"], capsys)
    assert (code, err) == (0, "") and "(no allocations)\n" in out


def test_a_corrupt_checkpoint_says_how_to_quarantine_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "state dir"
    state.mkdir(mode=0o700)
    (state / "state.json").write_text('{"version": ')
    code, _, err = run(["report", "--state-dir", str(state), "--cgroups", "off"], capsys)
    assert code == 2
    assert f"corepin migrate --quarantine --state-dir '{state}'" in err
    code, out, _ = run(["migrate", "--quarantine", "--state-dir", str(state)], capsys)
    assert code == 0 and "moved the checkpoint" in out
    code, out, _ = run(["report", "--state-dir", str(state), "--cgroups", "off"], capsys)
    assert code == 0 and "(no allocations)" in out


def test_a_kubelet_checkpoint_error_does_not_point_at_quarantine(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "cpu_manager_state"
    bad.write_text("{")
    argv = ["migrate", "--from-kubelet", str(bad), "--state-dir", str(tmp_path / "s")]
    code, _, err = run([*argv, "--dry-run", "--cgroups", "off"], capsys)
    assert code == 2 and "quarantine" not in err


# ---------------------------------------------------------------------- Topology.from_json


def test_topology_from_json_takes_text_and_bytes() -> None:
    topology = machine("gpu-server")
    text = json.dumps(topology.to_json())
    assert Topology.from_json(text) == topology
    assert Topology.from_json(text.encode()) == topology
    assert Topology.from_json(topology.to_json()) == topology


def test_topology_from_json_names_what_is_wrong_with_text() -> None:
    with pytest.raises(TopologyError, match=r"not valid JSON: .* line 1 column"):
        Topology.from_json('{"cpus": [')
    with pytest.raises(TopologyError, match="must be an object"):
        Topology.from_json("[1, 2]")
    with pytest.raises(TopologyError, match="not UTF-8"):
        Topology.from_json(b"\xff\xfe{")
