"""`--machine NAME` on `corepin topology`, `allocate` and `simulate`: the catalogue of named
synthetic shapes (`corepin.testing.catalogue`), `--machine list`, unknown names, and that each
shape is what discovery would read from such a machine's sysfs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from corepin.cli.main import main
from corepin.testing import write_sysfs_tree
from corepin.testing.catalogue import MACHINES, describe, machine, names
from corepin.topology.discover import discover
from corepin.topology.model import Topology


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("command", ["topology", "allocate", "simulate"])
def test_machine_list_prints_the_names_one_per_line(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run([command, "--machine", "list"], capsys)
    assert (code, err) == (0, "")
    assert out.splitlines() == list(MACHINES)


@pytest.mark.parametrize("command", ["topology", "allocate", "simulate"])
def test_an_unknown_machine_is_exit_2_naming_it_and_the_choices(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [command, "--machine", "cray-1"]
    if command == "allocate":
        argv += ["--count", "1"]
    if command == "simulate":
        argv += ["--generate"]
    code, out, err = run(argv, capsys)
    assert (code, out) == (2, "")
    assert "'cray-1'" in err
    assert all(name in err for name in MACHINES)


def test_machine_and_topology_file_are_mutually_exclusive(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["topology", "--machine", "laptop", "--sysfs-root", str(tmp_path)])
    assert exit_info.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


def test_the_catalogue_has_the_shapes_the_docs_promise() -> None:
    assert {"intel-2s-ht", "epyc-4l3", "alderlake", "arm-clusters", "gpu-server"} <= set(names())
    assert all(name == name.lower() and " " not in name and "_" not in name for name in names())
    intel = machine("intel-2s-ht")
    assert len(intel.socket_ids()) == 2 and intel.threads_per_core == 2
    epyc = machine("epyc-4l3")
    for node in epyc.numa_nodes:
        l3s = {epyc.cpu(c).l3 for c in node.cpus}
        assert len(l3s) == 4, f"node {node.id} has L3s {l3s}"
    alder = machine("alderlake")
    assert {alder.cpu(c).core_type for c in alder.online_cpus} == {"performance", "efficiency"}
    arm = machine("arm-clusters")
    assert len(arm.socket_ids()) == 3 and len(arm.numa_nodes) == 1
    snc = machine("intel-2s-snc4")
    assert len(snc.numa_nodes) == 8 and len(snc.socket_ids()) == 2
    gpus = [d for d in machine("gpu-server").devices if d.kind == "gpu"]
    assert sorted(d.numa for d in gpus if d.numa is not None) == [0, 0, 1, 1]
    assert "Alder Lake" in describe("alderlake")


@pytest.mark.parametrize("name", list(MACHINES))
def test_each_machine_is_what_discovery_reads_from_its_sysfs(name: str, tmp_path: Path) -> None:
    built = machine(name)
    root = write_sysfs_tree(built, tmp_path)
    assert discover(root) == built


@pytest.mark.parametrize("name", list(MACHINES))
def test_topology_json_of_a_machine_round_trips(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(["topology", "--machine", name, "-o", "json"], capsys)
    assert code == 0
    assert Topology.from_json(out) == machine(name)


def test_allocate_on_a_named_machine_uses_its_shape(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        ["allocate", "--machine", "gpu-server", "--count", "4", "--near", "nvidia2", "-o", "json"],
        capsys,
    )
    assert code == 0
    data = json.loads(out)
    assert data["mems"] == "1", "CPUs near GPU 2 are on NUMA node 1"


def test_simulate_generates_and_replays_on_a_named_machine(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "trace.json"
    argv = ["--machine", "epyc-4l3"]
    assert (
        run(["simulate", "--generate", *argv, "--events", "40", "--out", str(trace)], capsys)[0]
        == 0
    )
    code, out, _ = run(
        ["simulate", *argv, "--trace", str(trace), "--policy", "topology-aware", "-o", "json"],
        capsys,
    )
    assert code == 0
    (result,) = json.loads(out)
    assert result["policy"] == "topology-aware" and result["events"] == 40
