"""Output that cannot be written is a one-line error with an exit code, never an "internal
error": a full disk on standard output is an environment problem (exit 4), an output file that
cannot be written is named (exit 2). /dev/full stands in for the full disk."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from corepin.testing.machines import single_socket_ht
from support.helpers import corepin_argv, run_corepin

DEV_FULL = Path("/dev/full")
pytestmark = pytest.mark.skipif(not DEV_FULL.exists(), reason="no /dev/full on this host")


@pytest.fixture
def topo_file(tmp_path: Path) -> str:
    path = tmp_path / "topology.json"
    path.write_text(json.dumps(single_socket_ht().to_json()), encoding="utf-8")
    return str(path)


@pytest.mark.parametrize(
    "args",
    [["topology", "-o", "json"], ["allocate", "--count", "2"]],
    ids=["topology output to a full disk", "an allocation decision printed to a full disk"],
)
def test_standard_output_on_a_full_disk_exits_4_without_a_traceback(
    args: list[str], topo_file: str
) -> None:
    with DEV_FULL.open("w") as full:
        done = subprocess.run(
            corepin_argv(*args, "--topology", topo_file),
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            check=False,
        )
    assert done.returncode == 4, done.stderr
    assert "cannot write to standard output" in done.stderr
    assert "Traceback" not in done.stderr and "internal error" not in done.stderr


def test_a_decisions_file_on_a_full_disk_exits_2_naming_it(topo_file: str, tmp_path: Path) -> None:
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps({"events": [{"op": "add", "id": "a", "cpus": 2}]}))
    done = run_corepin(
        "simulate", "--topology", topo_file, "--trace", str(trace), "--decisions", str(DEV_FULL)
    )
    assert done.returncode == 2, done.stderr
    assert f"cannot write decisions file '{DEV_FULL}'" in done.stderr
    assert "Traceback" not in done.stderr and "internal error" not in done.stderr


def test_an_output_file_on_a_full_disk_exits_2_naming_it(topo_file: str) -> None:
    done = run_corepin("topology", "--topology", topo_file, "-o", "svg", "--out", str(DEV_FULL))
    assert done.returncode == 2, done.stderr
    assert f"cannot write output file '{DEV_FULL}'" in done.stderr
