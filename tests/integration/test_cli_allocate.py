"""`corepin allocate`: output forms, exit codes, messages."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import support.alloc_topologies as T
from corepin.cli.main import main
from support.helpers import run_corepin
from support.paths import SYSFS_FIXTURES


@pytest.fixture
def topo_file(tmp_path: Path) -> str:
    path = tmp_path / "topo.json"
    path.write_text(json.dumps(T.two_numa_per_socket_32_cpus().to_json()))
    return str(path)


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(["allocate", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_text_output_is_the_linux_cpu_list(
    topo_file: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(["--topology", topo_file, "--count", "4"], capsys)
    assert (code, out, err) == (0, "0-1,16-17\n", "")


def test_json_output_has_cpus_mems_reserved_policy_and_explanation(
    topo_file: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--topology", topo_file, "--count", "1", "--available", "1-31"]
    code, out, _ = run([*argv, "--option", "level=numa", "-o", "json"], capsys)
    assert code == 0
    data = json.loads(out)
    assert data["cpus"] == "4"
    assert data["mems"] == "1"
    assert data["reserved"] == "4-7,20-23"
    assert data["policy"] == "topology-aware"
    assert [s["level"] for s in data["explanation"]][:3] == ["pool", "level", "numa"]
    assert all(set(s) == {"level", "choice", "reason"} for s in data["explanation"])


@pytest.mark.parametrize("policy", ["topology-aware", "kubelet-static", "workload-aware"])
def test_every_policy_is_reachable_from_the_command(
    policy: str, topo_file: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(["--topology", topo_file, "--count", "3", "--policy", policy], capsys)
    assert code == 0
    assert len(out.strip().replace("-", ",").split(",")) >= 2


def test_workload_option_reaches_the_workload_aware_policy(
    topo_file: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--topology", topo_file, "--count", "4", "--policy", "workload-aware"]
    code, out, _ = run([*argv, "--option", "workload=memory-bound", "-o", "json"], capsys)
    assert code == 0
    assert json.loads(out)["mems"] == "0-3"


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--count", "-1"], "'-1'"),
        (["--count", "0"], "'0'"),
        (["--count", "abc"], "'abc'"),
        (["--count", "2.5"], "'2.5'"),
        (["--count", "2", "--available", "5-2"], "'5-2'"),
        (["--count", "2", "--available", "40-41"], "40-41"),
        (["--count", "2", "--available", "1,,2"], "'1,,2'"),
        (["--count", "2", "--option", "bogus"], "'bogus'"),
        (["--count", "2", "--option", "level=rack"], "'rack'"),
        (["--count", "2", "--policy", "nope"], "'nope'"),
        (["--count", "2", "--policy", "kubelet-static", "--option", "frobnicate"], "frobnicate"),
    ],
    ids=[
        "a negative count",
        "a zero count",
        "a count that is not a number",
        "a fractional count",
        "a backwards available range",
        "available CPUs outside the topology",
        "an available list with an empty element",
        "an unknown option",
        "an unknown exclusiveness level",
        "an unknown policy",
        "an option the kubelet policy does not know",
    ],
)
def test_bad_input_exits_2_naming_the_value(
    argv: list[str], named: str, topo_file: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(["--topology", topo_file, *argv], capsys)
    assert code == 2
    assert out == ""
    assert named in err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def _write(tmp_path: Path, name: str, content: object) -> str:
    path = tmp_path / name
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return str(path)


def _cpu(cpu: int, core: int, numa: int = 0) -> dict[str, object]:
    return {"cpu": cpu, "socket": 0, "die": 0, "numa": numa, "l3": 0, "core": core}


@pytest.mark.parametrize(
    ("content", "named"),
    [
        ({"cpus": [_cpu(0, 0), _cpu(0, 0)]}, "CPU 0"),
        ({"cpus": [_cpu(0, 0, numa=0), _cpu(1, 0, numa=1)]}, "core 0"),
        ("{not json", "not valid JSON"),
        ({"cpus": []}, "cpus"),
        ({"cpus": [{"cpu": "zero"}]}, "'zero'"),
    ],
    ids=[
        "a topology file listing a CPU twice",
        "a topology file with a CPU in two cores",
        "a topology file that is not JSON",
        "a topology file without CPUs",
        "a topology file with a CPU id that is not a number",
    ],
)
def test_bad_topology_files_exit_2_naming_the_problem(
    content: object, named: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write(tmp_path, "bad.json", content)
    code, _, err = run(["--topology", path, "--count", "1"], capsys)
    assert code == 2
    assert named in err
    assert "Traceback" not in err


def test_a_missing_topology_file_exits_2_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = str(tmp_path / "absent.json")
    code, _, err = run(["--topology", missing, "--count", "1"], capsys)
    assert code == 2
    assert "absent.json" in err


@pytest.mark.parametrize(
    ("argv", "reason"),
    [
        (["--count", "33"], "not_enough_cpus"),
        (["--count", "3", "--option", "full-pcpus-only"], "smt_alignment"),
        (
            ["--count", "1", "--available", "1-3,5-7,9-11,13-31", "--option", "level=numa"],
            "level_unsatisfiable",
        ),
        (
            ["--count", "3", "--policy", "kubelet-static", "--option", "full-pcpus-only"],
            "smt_alignment",
        ),
    ],
    ids=[
        "more CPUs than the machine has",
        "an odd count with full physical cores required",
        "no entirely free NUMA node for level numa",
        "the kubelet policy's SMT alignment error",
    ],
)
def test_unsatisfiable_requests_exit_3_with_a_one_line_reason(
    argv: list[str], reason: str, topo_file: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(["--topology", topo_file, *argv], capsys)
    assert code == 3
    assert out == ""
    assert len(err.strip().splitlines()) == 1
    assert reason in err


def test_the_installed_command_never_prints_a_traceback(topo_file: str, tmp_path: Path) -> None:
    dup = _write(tmp_path, "dup.json", {"cpus": [_cpu(0, 0), _cpu(0, 0)]})
    for argv, code in (
        (["--topology", topo_file, "--count", "2"], 0),
        (["--topology", topo_file, "--count", "-1"], 2),
        (["--topology", dup, "--count", "1"], 2),
        (["--topology", topo_file, "--count", "99"], 3),
    ):
        proc = run_corepin("allocate", *argv)
        assert proc.returncode == code, proc.stderr
        assert "Traceback" not in proc.stderr


def test_sysfs_root_is_a_topology_source(capsys: pytest.CaptureFixture[str]) -> None:
    root = SYSFS_FIXTURES / "intel-2s-8c-ht-32cpu"
    if not root.is_dir():
        pytest.skip("fixture intel-2s-8c-ht-32cpu is absent")
    code, out, err = run(["--sysfs-root", str(root), "--count", "4", "-o", "json"], capsys)
    assert code == 0, err
    data = json.loads(out)
    assert len(data["mems"]) == 1
