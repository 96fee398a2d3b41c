"""CPUs near a device from the command line: `corepin allocate --near` on a topology file or a
synthetic sysfs tree with PCI devices, and `corepin run --near` running real commands (cgroups
off) on a synthetic tree of this machine's CPUs, with the run's devices in `corepin report`."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

import support.alloc_topologies as T
from corepin.core.cpuset import CPUSet
from corepin.testing.devices import gpu, nic, nvme, with_devices
from corepin.testing.sysfs_tree import write_sysfs_tree
from corepin.topology.model import CPUInfo, Topology
from support.helpers import corepin_argv, run_corepin

ONLINE = sorted(os.sched_getaffinity(0))

# ---------------------------------------------------------------- corepin allocate


def two_sockets() -> Topology:
    """2 sockets, one NUMA node each (node 0: 0-3,8-11; node 1: 4-7,12-15), a GPU and an
    NVMe disk on node 1, a NIC on node 0."""
    return with_devices(
        T.build(2, 1, 1, 4, 2),
        gpu("0000:b1:00.0", numa=1),
        nvme("0000:c2:00.0", numa=1),
        nic("0000:17:00.0", numa=0, ifname="ens1f0"),
    )


@pytest.fixture(params=["topology-file", "sysfs-root"])
def source(request: pytest.FixtureRequest, tmp_path: Path) -> list[str]:
    """The machine as a `--topology` file or as a sysfs tree (devices discovered)."""
    if request.param == "topology-file":
        path = tmp_path / "topo.json"
        path.write_text(json.dumps(two_sockets().to_json()))
        return ["--topology", str(path)]
    return ["--sysfs-root", str(write_sysfs_tree(two_sockets(), tmp_path / "root"))]


def allocate(source: list[str], *args: str) -> subprocess.CompletedProcess[str]:
    return run_corepin("allocate", *source, *args)


@pytest.mark.parametrize(
    "device", ["/dev/nvidia0", "renderD128", "b1:00.0", "0000:c2:00.0", "nvme0n1", "/dev/nvme0"]
)
def test_allocate_near_a_device_takes_its_numa_nodes_cpus(source: list[str], device: str) -> None:
    done = allocate(source, "--count", "4", "--near", device, "-o", "json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert CPUSet.parse(data["cpus"]) <= CPUSet.parse("4-7,12-15")
    assert data["mems"] == "1"
    assert data["near"] == {"devices": [device], "cpus": "4-7,12-15", "strict": False}
    assert data["explanation"][0]["level"] == "near"


def test_without_near_the_same_request_lands_on_node_0(source: list[str]) -> None:
    done = allocate(source, "--count", "4")
    assert done.returncode == 0, done.stderr
    assert CPUSet.parse(done.stdout.strip()) <= CPUSet.parse("0-3,8-11")


@pytest.mark.parametrize("policy", ["kubelet-static", "workload-aware"])
def test_every_policy_takes_the_near_option(source: list[str], policy: str) -> None:
    done = allocate(source, "--count", "2", "--near", "nvidia0", "--policy", policy)
    assert done.returncode == 0, done.stderr
    assert CPUSet.parse(done.stdout.strip()) <= CPUSet.parse("4-7,12-15")


def test_preferred_falls_back_and_strict_exits_3(source: list[str]) -> None:
    args = ("--count", "6", "--available", "0-5,8-13", "--near", "nvidia0")
    preferred = allocate(source, *args)
    assert preferred.returncode == 0, preferred.stderr
    assert len(CPUSet.parse(preferred.stdout.strip())) == 6
    strict = allocate(source, *args, "--near-strict")
    assert strict.returncode == 3
    assert "near the device" in strict.stderr and "near_unsatisfiable" in strict.stderr


def test_an_unknown_device_exits_2_naming_it_and_listing_the_machines(source: list[str]) -> None:
    done = allocate(source, "--count", "1", "--near", "eth7")
    assert done.returncode == 2
    assert "'eth7'" in done.stderr
    assert "0000:b1:00.0 (gpu" in done.stderr and "0000:17:00.0 (nic ens1f0)" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--near-strict"], "--near-strict needs --near"),
        (["--near", "nvidia0", "--option", "shared"], "exclusive requests only"),
        (["--near", "nvidia0", "--option", "near=1"], "give one"),
    ],
)
def test_bad_near_usage_exits_2(source: list[str], args: list[str], needle: str) -> None:
    done = allocate(source, "--count", "1", *args)
    assert done.returncode == 2
    assert needle in done.stderr


# ---------------------------------------------------------------- corepin run

needs_two_cpus = pytest.mark.skipif(len(ONLINE) < 2, reason="needs 2 CPUs")


def this_machine(root: Path, *, devices: bool = True) -> str:
    """A sysfs tree of this machine's online CPUs on NUMA node 0 (the kernel's), one core
    each; a NIC `eth1` local to the last CPU, a GPU local to the first."""
    topo = Topology([CPUInfo(cpu, socket=0, die=0, numa=0, core=cpu) for cpu in ONLINE])
    if devices:
        topo = with_devices(
            topo,
            nic("0000:17:00.0", numa=0, ifname="eth1", local_cpus=CPUSet([ONLINE[-1]])),
            gpu("0000:b1:00.0", numa=0, local_cpus=CPUSet([ONLINE[0]])),
        )
    return str(write_sysfs_tree(topo, root))


def corepin_run(state: Path, sysfs: str, *args: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("COREPIN_")}
    return run_corepin(
        "run",
        "--state-dir",
        str(state),
        "--cgroups",
        "off",
        "--sysfs-root",
        sysfs,
        *args,
        env=environ,
        timeout=60,
    )


def report_from_inside(state: Path, sysfs: str, fmt: str) -> str:
    """A shell command that prints `corepin report -o FMT` (run by CMD while it holds CPUs)."""
    argv = corepin_argv(
        "report", "--state-dir", str(state), "--cgroups", "off", "--sysfs-root", sysfs, "-o", fmt
    )
    return " ".join(f"'{a}'" for a in argv)


@needs_two_cpus
def test_run_near_a_nic_lands_on_its_cpus_and_report_names_the_device(tmp_path: Path) -> None:
    sysfs = this_machine(tmp_path / "root")
    state = tmp_path / "state"
    show = (
        "grep Cpus_allowed_list /proc/self/status; echo MEMS=$COREPIN_MEMS; "
        f"{report_from_inside(state, sysfs, 'json')}; {report_from_inside(state, sysfs, 'table')}"
    )
    done = corepin_run(state, sysfs, "--exclusive", "1", "--near", "eth1", "--", "sh", "-c", show)
    assert done.returncode == 0, done.stderr
    assert f"Cpus_allowed_list:\t{ONLINE[-1]}\n" in done.stdout
    assert "MEMS=0\n" in done.stdout
    start = done.stdout.index("{")
    report, end = json.JSONDecoder().raw_decode(done.stdout[start:])
    (row,) = report["allocations"]
    assert row["near"] == ["eth1"] and row["cpus"] == str(ONLINE[-1])
    table = done.stdout[start + end :]
    header = next(line for line in table.splitlines() if line.startswith("ID"))
    assert "NEAR" in header.split()
    assert any(line.split()[0] == row["id"] and "eth1" in line for line in table.splitlines()[1:])


@needs_two_cpus
def test_without_near_the_run_takes_the_first_cpu_and_the_table_has_no_near_column(
    tmp_path: Path,
) -> None:
    sysfs = this_machine(tmp_path / "root")
    state = tmp_path / "state"
    show = f"grep Cpus_allowed_list /proc/self/status; {report_from_inside(state, sysfs, 'table')}"
    done = corepin_run(state, sysfs, "--exclusive", "1", "--", "sh", "-c", show)
    assert done.returncode == 0, done.stderr
    assert f"Cpus_allowed_list:\t{ONLINE[0]}\n" in done.stdout
    assert "NEAR" not in done.stdout


@needs_two_cpus
def test_run_near_strict_exits_3_when_the_devices_cpus_are_too_few(tmp_path: Path) -> None:
    sysfs = this_machine(tmp_path / "root")
    marker = tmp_path / "ran"
    done = corepin_run(
        tmp_path / "state",
        sysfs,
        "--exclusive",
        "2",
        "--near",
        "/dev/nvidia0",
        "--near-strict",
        "--",
        "touch",
        str(marker),
    )
    assert done.returncode == 3, done.stderr
    assert "near the device" in done.stderr
    assert not marker.exists()


@needs_two_cpus
def test_run_near_without_strict_runs_across_the_device_and_beyond(tmp_path: Path) -> None:
    sysfs = this_machine(tmp_path / "root")
    done = corepin_run(
        tmp_path / "state",
        sysfs,
        "--exclusive",
        "2",
        "--near",
        "nvidia0",
        "--",
        "grep",
        "Cpus_allowed_list",
        "/proc/self/status",
    )
    assert done.returncode == 0, done.stderr
    assert CPUSet.parse(done.stdout.split()[-1]) == CPUSet(ONLINE[:2])


@pytest.mark.parametrize(
    ("devices", "needle"),
    [(True, "0000:17:00.0 (nic eth1)"), (False, "no PCI devices are known")],
    ids=["a machine with other devices", "a machine without PCI sysfs"],
)
def test_run_near_a_device_the_machine_lacks_exits_2_before_cmd_starts(
    tmp_path: Path, devices: bool, needle: str
) -> None:
    sysfs = this_machine(tmp_path / "root", devices=devices)
    marker = tmp_path / "ran"
    done = corepin_run(
        tmp_path / "state",
        sysfs,
        "--exclusive",
        "1",
        "--near",
        "ib0",
        "--",
        "touch",
        str(marker),
    )
    assert done.returncode == 2
    assert "'ib0'" in done.stderr and needle in done.stderr
    assert not marker.exists()


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--near", "eth1"], "--exclusive runs only"),
        (["--cpus", "0", "--near", "eth1"], "--exclusive runs only"),
        (["--exclusive", "1", "--near-strict"], "--near-strict needs --near"),
    ],
    ids=["a shared run", "explicit cpus", "strict alone"],
)
def test_bad_run_near_usage_exits_2(tmp_path: Path, args: list[str], needle: str) -> None:
    sysfs = this_machine(tmp_path / "root")
    done = corepin_run(tmp_path / "state", sysfs, *args, "--", "true")
    assert done.returncode == 2
    assert needle in done.stderr
