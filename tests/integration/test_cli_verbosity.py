"""Informational notes stay quiet unless asked for.

corepin logs notes (sysfs fallbacks on old kernels, repairs of a restored state): every
subcommand prints none of them by default, and prints them on stderr with `-v` (before or after
the subcommand) or COREPIN_LOG=info. The tree used here is this machine's own topology written
as an old kernel would lay it out (no die_id, core_cpus_list, cluster_id, cache ids or
isolated list), so that discovery falls back and `corepin run` can still pin to real CPUs.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
from pathlib import Path

import pytest

from corepin.cli.main import main
from corepin.testing import write_sysfs_tree
from corepin.testing.sysfs_tree import OLD_KERNEL
from corepin.topology.discover import discover
from support.helpers import run_corepin

SYSFS_NOTE = "corepin.sysfs WARNING sysfs fallback"
STATE_NOTE = "corepin.state INFO event="


@pytest.fixture(scope="module")
def old_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("old-kernel")
    write_sysfs_tree(discover("/"), root, omit=OLD_KERNEL)
    return root


def commands(tree: Path, work: Path) -> dict[str, list[str]]:
    """One command line per subcommand, each reading the old-kernel tree."""
    trace = work / "trace.json"
    trace.write_text(json.dumps({"events": [{"op": "add", "id": "a/b/c", "cpus": 1}]}))
    kubelet = work / "cpu_manager_state"
    kubelet.write_text('{"policyName":"none","defaultCpuSet":"","checksum":0}')
    sysfs = ["--sysfs-root", str(tree)]
    host = ["--state-dir", str(work / "state"), "--cgroups", "off", *sysfs]
    return {
        "topology": ["topology", *sysfs],
        "allocate": ["allocate", *sysfs, "--count", "1"],
        "simulate --generate": [
            "simulate", "--generate", *sysfs, "--events", "4", "--out", str(work / "gen.json"),
        ],
        "simulate": ["simulate", *sysfs, "--trace", str(trace)],
        "run": ["run", *host, "--", "true"],
        "report": ["report", *host],
        "reconcile": ["reconcile", "--once", *host],
        "migrate": ["migrate", "--from-kubelet", str(kubelet), *host, "--dry-run"],
    }  # fmt: skip


NAMES = list(commands(Path("/t"), Path("/tmp")))
#: Subcommands that start from an empty state and so log the state's repairs too.
WITH_STATE = {"run", "report", "reconcile"}


def _run(argv: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k != "COREPIN_LOG"}
    out = run_corepin(*argv, env={**base, **(env or {})})
    assert out.returncode == 0, (argv, out.stderr)
    return out


@pytest.mark.parametrize("name", NAMES)
def test_no_notes_are_printed_by_default(name: str, old_tree: Path, tmp_path: Path) -> None:
    out = _run(commands(old_tree, tmp_path)[name])
    assert out.stderr == ""


@pytest.mark.parametrize("where", ["before", "after"], ids=["corepin -v CMD", "corepin CMD -v"])
@pytest.mark.parametrize("name", NAMES)
def test_dash_v_prints_the_notes(name: str, where: str, old_tree: Path, tmp_path: Path) -> None:
    argv = commands(old_tree, tmp_path)[name]
    argv = ["-v", *argv] if where == "before" else [argv[0], "-v", *argv[1:]]
    err = _run(argv).stderr
    assert SYSFS_NOTE in err and "kind=die_id_missing" in err, err
    assert (STATE_NOTE in err) == (name in WITH_STATE), err
    assert "DEBUG" not in err


@pytest.mark.parametrize("name", ["topology", "report"])
def test_corepin_log_info_prints_the_same_notes_as_dash_v(
    name: str, old_tree: Path, tmp_path: Path
) -> None:
    argv = commands(old_tree, tmp_path)[name]
    by_env = _run(argv, {"COREPIN_LOG": "info"}).stderr
    by_option = _run(["-v", *argv]).stderr
    assert by_env == by_option and SYSFS_NOTE in by_env


def test_an_unknown_corepin_log_level_is_refused(old_tree: Path, tmp_path: Path) -> None:
    out = run_corepin(
        *commands(old_tree, tmp_path)["topology"], env={**os.environ, "COREPIN_LOG": "loud"}
    )
    assert out.returncode == 2 and "COREPIN_LOG='loud'" in out.stderr


def test_main_leaves_the_logging_of_its_caller_as_it_found_it(
    old_tree: Path,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["topology", "--sysfs-root", str(old_tree)]) == 0
    assert capsys.readouterr().err == ""
    with caplog.at_level(logging.WARNING, logger="corepin.sysfs"):
        discover(old_tree)
    assert any("die_id_missing" in r.getMessage() for r in caplog.records)
