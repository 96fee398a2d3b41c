"""`scripts/demo.sh` (what `make demo` runs) end to end on this machine, with a short hold."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from support.paths import REPO


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="the demo pins 1 of 2+ CPUs")
def test_the_demo_shows_shared_and_exclusive_runs_side_by_side_and_cleans_up(
    tmp_path: Path,
) -> None:
    bindir = Path(sys.executable).parent
    env = dict(
        os.environ,
        COREPIN=str(bindir / "corepin"),
        DEMO_DIR=str(tmp_path / "build"),
        COREPIN_DEMO_STATE=str(tmp_path / "state"),
        COREPIN_DEMO_SECONDS="5",
        COREPIN_CGROUPS="off",
    )
    if not (bindir / "corepin").exists():
        pytest.skip(f"no corepin console script next to {sys.executable}")
    out = subprocess.run(
        ["sh", str(REPO / "scripts" / "demo.sh")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    text = out.stdout
    assert "== this machine" in text
    assert "latency: COREPIN_CPUS=" in text
    middle = text.split("== corepin report")[1].split("== stopping")[0]
    rows = [line.split() for line in middle.splitlines() if line.startswith("run-")]
    kinds = {row[1]: (row[3], row[4]) for row in rows}
    assert set(kinds) == {"web", "batch", "latency"}
    (latency_row,) = [line for line in middle.splitlines() if " latency " in line]
    assert latency_row.rstrip().endswith("exec sleep 5"), "the command column is whole"
    pid_lines = [line for line in middle.splitlines() if line.startswith("pid ")]
    assert len(pid_lines) == 3, "one line per allocation, each once"
    assert len({line.split()[1] for line in pid_lines}) == 3
    exclusive_cpu = kinds["latency"][1]
    assert kinds["latency"][0] == "exclusive"
    for name in ("web", "batch"):
        assert kinds[name][0] == "shared"
        assert exclusive_cpu not in kinds[name][1].split(","), "shared runs were re-pinned"
    assert (tmp_path / "build" / "topology-this-machine.svg").exists()
    svg = (tmp_path / "build" / "report-this-machine.svg").read_text()
    assert "latency" in svg
    assert "(no allocations)" in text.split("== stopping")[1]
