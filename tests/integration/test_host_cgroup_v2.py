"""Host mode on a cgroup v2 hierarchy, on a fake v2 tree (the real kernel's behaviour is checked
in guests: tests/vm/test_vm_numa4_smt2.py): where runs' groups go, which controllers are enabled
on the way down, partitions asked of v1 or of shared runs, v2 without cpuset, and what
`cpuset.cpus.partition` texts mean."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from corepin.agent.settings import state_dir_key
from corepin.core.cpuset import CPUSet
from corepin.enforcement.cgroups import CgroupV2, PartitionState, open_cpuset_hierarchy
from corepin.enforcement.faketree import make_fake_v1, make_fake_v2
from support.helpers import corepin_argv, reap, run_corepin, wait_for

ONLINE = CPUSet(os.sched_getaffinity(0))
CPU = str(ONLINE.first())


@pytest.fixture
def v2_root(tmp_path: Path) -> Path:
    make_fake_v2(tmp_path / "cg", cpus=ONLINE, mems=CPUSet.of(0))
    return tmp_path / "cg" / "unified"


def corepin_run(
    tmp_path: Path, root: Path, *args: str, cmd: str = "true"
) -> subprocess.CompletedProcess[str]:
    return run_corepin(
        "run",
        "--state-dir",
        str(tmp_path / "state"),
        "--cgroups",
        "on",
        "--cgroup-root",
        str(root),
        *args,
        "--",
        "sh",
        "-c",
        cmd,
    )


def test_a_directory_with_cgroup_controllers_and_no_cpuset_below_is_a_v2_root(
    v2_root: Path,
) -> None:
    driver = open_cpuset_hierarchy(v2_root)
    assert isinstance(driver, CgroupV2) and driver.fake_tree and driver.root == str(v2_root)


def test_an_exclusive_run_gets_its_group_below_the_state_dirs_parent_with_cpuset_enabled(
    tmp_path: Path, v2_root: Path
) -> None:
    key = state_dir_key(str(tmp_path / "state"))
    show = (
        f"cd {v2_root}; awk 1 corepin/{key}/run-*/cpuset.cpus corepin/{key}/run-*/cpuset.mems "
        f"corepin/{key}/run-*/cgroup.procs cgroup.subtree_control corepin/cgroup.subtree_control "
        f"corepin/{key}/cgroup.subtree_control; echo $$"
    )
    out = corepin_run(tmp_path, v2_root, "--exclusive", "1", cmd=show)
    assert out.returncode == 0, out.stderr
    cpus, mems, procs, root_ctl, corepin_ctl, key_ctl, pid = out.stdout.splitlines()
    assert CPUSet.parse(cpus) <= ONLINE and len(CPUSet.parse(cpus)) == 1
    assert mems == "0"
    assert procs == pid  # the child joined its group before it ran CMD
    assert "cpuset" in root_ctl.split() and corepin_ctl == key_ctl == "+cpuset"


def test_a_partitioned_run_gets_a_group_directly_below_the_root(
    tmp_path: Path, v2_root: Path
) -> None:
    key = state_dir_key(str(tmp_path / "state"))
    show = f"cat {v2_root}/corepin.{key}.run-*/cpuset.cpus.partition"
    out = corepin_run(tmp_path, v2_root, "--exclusive", "1", "--partition", "isolated", cmd=show)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "isolated"
    # directly below the root (its parent must be a partition), not below corepin/
    assert [p.name.startswith(f"corepin.{key}.run-") for p in v2_root.glob("corepin.*")] == [True]
    assert not list(v2_root.glob("corepin/*/run-*"))


def test_a_partition_on_cgroup_v1_exits_4_saying_it_needs_v2(tmp_path: Path) -> None:
    make_fake_v1(tmp_path / "cg", cpus=ONLINE, mems=CPUSet.of(0), separate_cpu_mount=False)
    out = corepin_run(tmp_path, tmp_path / "cg", "--exclusive", "1", "--partition", "root")
    assert out.returncode == 4, out.stderr
    assert "--partition root needs cpuset cgroups on cgroup v2 (this is v1)" in out.stderr


@pytest.mark.parametrize("mode", [["--shared"], ["--exclusive", "1", "--with-shared"]])
def test_a_partition_of_a_run_that_shares_cpus_is_refused_with_exit_2(
    tmp_path: Path, v2_root: Path, mode: list[str]
) -> None:
    out = corepin_run(tmp_path, v2_root, *mode, "--partition", "root")
    assert out.returncode == 2, out.stderr
    assert "--partition applies to exclusive runs" in out.stderr


def test_a_v2_hierarchy_without_the_cpuset_controller_exits_4_naming_cgroup_controllers(
    tmp_path: Path, v2_root: Path
) -> None:
    (v2_root / "cgroup.controllers").write_text("cpu io memory pids\n")
    out = corepin_run(tmp_path, v2_root, "--exclusive", "1")
    assert out.returncode == 4, out.stderr
    assert str(v2_root / "cgroup.controllers") in out.stderr
    assert "offers no cpuset controller" in out.stderr


def test_cgroups_auto_on_a_v2_hierarchy_without_cpuset_falls_back_to_affinity(
    tmp_path: Path, v2_root: Path
) -> None:
    (v2_root / "cgroup.controllers").write_text("cpu io memory pids\n")
    out = run_corepin(
        "run",
        "--state-dir",
        str(tmp_path / "state"),
        "--cgroup-root",
        str(v2_root),
        "--exclusive",
        "1",
        "--",
        "sh",
        "-c",
        "echo $COREPIN_CPUS",
        env={**os.environ, "COREPIN_CGROUPS": "auto"},
    )
    assert out.returncode == 0, out.stderr
    assert len(CPUSet.parse(out.stdout.strip())) == 1
    assert not (v2_root / "corepin").exists()


@pytest.mark.parametrize(
    ("text", "mode", "valid", "reason", "shown"),
    [
        ("member", "member", True, None, "member"),
        ("root", "root", True, None, "root"),
        ("isolated\n", "isolated", True, None, "isolated"),
        (
            "root invalid (Cpu list in cpuset.cpus not exclusive)",
            "root",
            False,
            "Cpu list in cpuset.cpus not exclusive",
            "root invalid (Cpu list in cpuset.cpus not exclusive)",
        ),
        ("isolated invalid", "isolated", False, None, "isolated invalid"),
        ("root bogus", "root", False, "bogus", "root invalid (bogus)"),
    ],
    ids=[
        "a member is valid and not a partition",
        "a valid root partition",
        "a valid isolated partition (trailing newline)",
        "an invalid root keeps the kernel's reason",
        "an invalid isolated partition of an older kernel has no reason",
        "an unknown suffix counts as invalid, kept as the reason",
    ],
)
def test_partition_texts_of_the_kernel_parse(
    text: str, mode: str, valid: bool, reason: str | None, shown: str
) -> None:
    state = PartitionState.parse(text)
    assert (state.mode, state.valid, state.reason) == (mode, valid, reason)
    assert str(state) == shown
    assert state.exclusive == (valid and mode != "member")


def test_set_partition_reads_back_what_the_group_says(v2_root: Path) -> None:
    driver = CgroupV2(str(v2_root), fake_tree=True)
    driver.create("part")
    assert driver.read_partition("part") == PartitionState("member")
    assert driver.set_partition("part", "root") == PartitionState("root")
    with pytest.raises(ValueError, match="unknown partition mode"):
        driver.set_partition("part", "exclusive")


def test_a_partitioned_run_released_to_the_shared_pool_becomes_a_member_first(
    tmp_path: Path, v2_root: Path
) -> None:
    state = str(tmp_path / "state")
    common = ["--state-dir", state, "--cgroups", "on", "--cgroup-root", str(v2_root)]
    runner = subprocess.Popen(
        corepin_argv(
            "run", *common, "--exclusive", "1", "--partition", "root", "--", "sleep", "60"
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    child = 0
    try:

        def claimed() -> bool:  # (the group's files appear before the partition is written)
            return any(
                p.read_text().strip() == "root"
                for p in v2_root.glob("corepin.*/cpuset.cpus.partition")
            )

        wait_for(claimed, what="the run's group to become a partition")
        [group] = v2_root.glob("corepin.*")
        report = json.loads(run_corepin("report", "-o", "json", "--state-dir", state).stdout)
        [run] = report["allocations"]
        child = run["pid"]
        out = run_corepin("release", run["id"], *common)
        assert out.returncode == 0, out.stderr
        # no longer exclusive: the partition is undone before its CPUs become the shared pool
        assert "partition root -> member (the run is not exclusive any more" in out.stdout
        assert (group / "cpuset.cpus.partition").read_text().strip() == "member"
        assert CPUSet.parse((group / "cpuset.cpus").read_text().strip()) == ONLINE
    finally:
        if child:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)
        reap(runner)
