"""The move executor's memory step on a cgroup v1 tree standing in for cgroupfs (this machine
has one NUMA node, so a real move never changes `cpuset.mems`): a move to CPUs of another
node sets `cpuset.memory_migrate` to 1 on the run's group before its `cpuset.mems` changes, so
the kernel moves the pages; a move that keeps the nodes leaves it alone. The run is a real `sleep`
on a synthetic machine whose two NUMA nodes hold CPUs 0 and 1 (this machine's)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from corepin.agent.host.agent import HostAgent
from corepin.agent.host.rebalance import execute, movable_runs
from corepin.agent.host.settings import HostSettings
from corepin.allocation.alignment import Alignment
from corepin.allocation.rebalance import Move
from corepin.core.cpuset import CPUSet
from corepin.enforcement.cgroups import CgroupV1
from corepin.enforcement.faketree import make_fake_v1
from corepin.state.model import Assignment
from corepin.state.owners import ProcessOwner
from corepin.sysfs.procfs import process_start_time
from corepin.topology.model import CPUInfo, Topology
from support.helpers import reap

C = CPUSet.parse
SAME = Alignment(1, 1, 0)

pytestmark = pytest.mark.skipif(
    sorted(os.sched_getaffinity(0))[:2] != [0, 1], reason="needs CPUs 0 and 1"
)


def two_nodes() -> Topology:
    return Topology(
        [
            CPUInfo(0, socket=0, die=0, numa=0, l3=0, core=0),
            CPUInfo(1, socket=0, die=0, numa=1, l3=1, core=1),
        ]
    )


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(["sleep", "60"])
    yield proc
    reap(proc)


def a_run(
    tmp_path: Path, sleeper: subprocess.Popen[bytes], **fields: object
) -> tuple[HostAgent, CgroupV1, str, list[tuple[str, str]]]:
    """A host on a fake v1 tree with one run (the sleeper) on CPU 0, node 0, in its group;
    the writes to the run's group, in order, are recorded."""
    fake = make_fake_v1(tmp_path / "cg", cpus=C("0-1"), mems=C("0-1"))
    state_dir = tmp_path / "state"
    state_dir.mkdir(mode=0o700)
    settings = HostSettings(
        state_dir=str(state_dir), cgroups="on", cgroup_root=str(tmp_path / "cg")
    )
    host = HostAgent(settings, two_nodes())
    path = host.pinner.cgroup_path_for("run-1")
    host.pinner.prepare(path, C("0"), C("0"))
    Path(fake.dir(path), "cgroup.procs").write_text(f"{sleeper.pid}\n")
    Path(fake.dir(path), "cpuset.memory_migrate").write_text("0\n")
    owner = ProcessOwner(
        pid=sleeper.pid, start_time=process_start_time(sleeper.pid), cgroup=path, name="sleep"
    )
    run = Assignment("run-1", cpus=C("0"), mems=C("0"), owner=owner, **fields)  # type: ignore[arg-type]
    with host.transaction() as txn:
        txn.commit(txn.state.add(run))
    writes: list[tuple[str, str]] = []
    driver = host.pinner.driver
    assert isinstance(driver, CgroupV1)
    original = driver.write_file

    def recording(group: str, name: str, value: str, root: str | None = None) -> None:
        if driver.rel(group) == path:
            writes.append((name, value))
        original(group, name, value, root)

    driver.write_file = recording  # type: ignore[method-assign]
    return host, driver, path, writes


def test_a_move_to_another_node_migrates_memory_before_the_nodes_change(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    host, driver, path, writes = a_run(tmp_path, sleeper)
    notes = execute(host, [Move("run-1", C("0"), C("1"), C("1"), SAME, SAME)])
    assert not [n for n in notes if n.action == "failed"], notes
    assert driver.read_file(path, "cpuset.memory_migrate").strip() == "1"
    assert driver.read_cpus(path) == C("1") and driver.read_mems(path) == C("1")
    names = [name for name, _ in writes]
    assert names.index("cpuset.memory_migrate") < names.index("cpuset.mems"), writes
    run = host.read_state().get("run-1")
    assert run is not None and (run.cpus, run.mems) == (C("1"), C("1"))
    assert os.sched_getaffinity(sleeper.pid) == {1}


def test_a_move_within_the_node_leaves_memory_migrate_alone(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    host, driver, path, writes = a_run(tmp_path, sleeper)
    execute(host, [Move("run-1", C("0"), C("1"), C("1"), SAME, SAME)])
    writes.clear()
    Path(driver.dir(path), "cpuset.memory_migrate").write_text("0\n")
    with host.transaction() as txn:  # a move that keeps node 1: back onto CPU 1 from 1
        run = txn.state.get("run-1")
        assert run is not None and run.mems == C("1")
    execute(host, [Move("run-1", C("1"), C("1"), C("1"), SAME, SAME)])
    assert ("cpuset.memory_migrate", "1") not in writes, writes
    assert driver.read_file(path, "cpuset.memory_migrate").strip() == "0"


def test_opted_out_and_reserved_runs_are_not_offered_to_the_planner(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    host, *_ = a_run(tmp_path, sleeper)
    assert [m.id for m in movable_runs(host, host.read_state())] == ["run-1"]
    with host.transaction() as txn:
        run = txn.state.get("run-1")
        assert run is not None
        txn.commit(txn.state.replace_assignment(run.evolve(rebalance=False)))
    assert movable_runs(host, host.read_state()) == []
