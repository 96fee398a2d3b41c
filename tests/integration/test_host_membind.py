"""Memory binding of runs outside a cpuset cgroup: `set_mempolicy(MPOL_BIND)` before exec.

Unit tests cover the node mask (one 64-bit word per 64 node ids) and the errno mapping; the rest
run the real `corepin run --cgroups off` and read the command's own /proc/PID/numa_maps. This
machine may have a single NUMA node, so multi-node machines are described by synthetic sysfs
trees (`--sysfs-root`) whose CPUs are this machine's CPUs placed in chosen NUMA nodes: nodes the
kernel does not have make `set_mempolicy` fail with EINVAL, which must stop CMD with exit 4.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corepin.core.cpuset import CPUSet
from corepin.core.errors import EXIT_ENVIRONMENT, EnvironmentProblem
from corepin.enforcement.mempolicy import (
    MemoryPolicyError,
    bind_memory,
    nodemask,
    syscall_number,
)
from corepin.testing.sysfs_tree import write_sysfs_tree
from corepin.topology.model import CPUInfo, Topology
from support import strategies
from support.budget import examples
from support.helpers import run_corepin

ONLINE = sorted(os.sched_getaffinity(0))
NODE_DIR = Path("/sys/devices/system/node")
#: Mapping lines of the command's heap and stack, printed by the command itself.
SHOW_MAPS = (
    "grep -E ' (heap|stack)( |$)' /proc/$$/numa_maps; grep Mems_allowed_list /proc/$$/status"
)


def kernel_nodes() -> list[int]:
    return sorted(int(p.name[4:]) for p in NODE_DIR.glob("node[0-9]*"))


def missing_node() -> int:
    """A NUMA node id this kernel does not have."""
    nodes = kernel_nodes()
    return (max(nodes) + 1) if nodes else 1


def mems_allowed(pid: int | str = "self") -> str:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Mems_allowed_list:"):
            return line.split(":", 1)[1].strip()
    raise AssertionError("no Mems_allowed_list")


def policies(stdout: str) -> dict[str, str]:
    """{'heap': 'bind:0', 'stack': ...} from numa_maps lines (address, policy, details)."""
    out: dict[str, str] = {}
    for line in stdout.splitlines():
        fields = line.split()
        for name in ("heap", "stack"):
            if name in fields[2:]:
                out[name] = fields[1]
    return out


def fake_machine(root: Path, nodes: list[int]) -> str:
    """A sysfs tree of this machine's online CPUs, CPU i placed in NUMA node nodes[i % len]."""
    cpus = [
        CPUInfo(cpu, socket=0, die=0, numa=nodes[i % len(nodes)], core=cpu)
        for i, cpu in enumerate(ONLINE)
    ]
    write_sysfs_tree(Topology(cpus), root)
    return str(root)


def corepin_run(
    state: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("COREPIN_")}
    environ.update(env or {})
    return run_corepin(
        "run", "--state-dir", str(state), "--cgroups", "off", *args, env=environ, timeout=60
    )


# ---------------------------------------------------------------------- node mask


def test_node_zero_is_bit_zero_of_a_single_word_and_maxnode_counts_one_past_the_bits() -> None:
    assert nodemask(CPUSet([0])) == ([1], 65)
    assert nodemask(CPUSet([0, 63])) == ([1 | 1 << 63], 65)


def test_node_ids_of_64_and_above_spill_into_the_following_words() -> None:
    assert nodemask(CPUSet([64])) == ([0, 1], 129)
    assert nodemask(CPUSet([1, 70, 130])) == ([2, 1 << 6, 1 << 2], 193)


def test_an_empty_node_set_is_refused_with_a_memory_policy_error() -> None:
    with pytest.raises(MemoryPolicyError, match="no NUMA node"):
        nodemask(CPUSet())


@settings(max_examples=examples(100))
@given(strategies.cpu_id_sets(st.integers(min_value=0, max_value=1023), min_size=1, max_size=40))
def test_the_mask_words_hold_exactly_the_nodes_and_maxnode_covers_them(nodes: set[int]) -> None:
    words, maxnode = nodemask(CPUSet(nodes))
    assert all(0 <= w < 1 << 64 for w in words)
    assert sum(w << (64 * i) for i, w in enumerate(words)) == CPUSet(nodes).bits
    assert words[-1] != 0, "no trailing empty word"
    assert maxnode == 64 * len(words) + 1 and max(nodes) < maxnode - 1


def test_the_syscall_number_follows_the_architecture_and_unknown_ones_exit_4() -> None:
    assert syscall_number("x86_64") == 238
    assert syscall_number("aarch64") == 237
    with pytest.raises(EnvironmentProblem, match="'vax'") as caught:
        syscall_number("vax")
    assert caught.value.exit_code == EXIT_ENVIRONMENT


# ---------------------------------------------------------------------- the syscall itself


def test_binding_to_an_existing_node_shows_as_bind_in_the_processes_numa_maps() -> None:
    node = kernel_nodes()[0] if kernel_nodes() else 0
    code = (
        "from corepin.core.cpuset import CPUSet\n"
        "from corepin.enforcement.mempolicy import bind_memory\n"
        f"bind_memory(CPUSet([{node}]))\n"
        "x = bytearray(1 << 20)\n"
        "print(open('/proc/self/numa_maps').read())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert policies(done.stdout)["heap"] == f"bind:{node}"


@pytest.mark.parametrize("offset", [0, 64], ids=["one-word mask", "two-word mask"])
def test_binding_to_a_node_the_kernel_lacks_raises_einval_naming_the_node(offset: int) -> None:
    node = missing_node() + offset
    before = Path("/proc/self/numa_maps").read_text()
    with pytest.raises(MemoryPolicyError) as caught:
        bind_memory(CPUSet([node]))
    err = caught.value
    assert err.errno == errno.EINVAL and err.exit_code == EXIT_ENVIRONMENT
    assert f"NUMA node(s) {node}" in str(err) and "EINVAL" in str(err)
    assert err.reason == "membind_failed"
    assert " bind:" not in before and " bind:" not in Path("/proc/self/numa_maps").read_text()


# ---------------------------------------------------------------------- corepin run


def test_a_forced_run_binds_the_commands_heap_and_stack_and_keeps_its_allowed_mems(
    tmp_path: Path,
) -> None:
    done = corepin_run(
        tmp_path / "state", "--", "sh", "-c", SHOW_MAPS, env={"COREPIN_FORCE_MEMBIND": "1"}
    )
    assert done.returncode == 0, done.stderr
    nodes = ",".join(str(n) for n in kernel_nodes()) or "0"
    assert policies(done.stdout) == {"heap": f"bind:{nodes}", "stack": f"bind:{nodes}"}
    assert f"Mems_allowed_list:\t{mems_allowed()}" in done.stdout


@pytest.mark.skipif(len(kernel_nodes()) > 1, reason="this machine has several NUMA nodes")
def test_on_a_single_numa_machine_a_run_leaves_the_memory_policy_alone(tmp_path: Path) -> None:
    done = corepin_run(tmp_path / "state", "--", "sh", "-c", SHOW_MAPS)
    assert done.returncode == 0, done.stderr
    assert policies(done.stdout) == {"heap": "default", "stack": "default"}


@pytest.mark.skipif(len(ONLINE) < 2, reason="needs 2 CPUs to describe two NUMA nodes")
def test_a_machine_with_two_numa_nodes_binds_without_being_forced(tmp_path: Path) -> None:
    # node 0 exists; the other node does not, and the kernel keeps the nodes it has
    sysfs = fake_machine(tmp_path / "sysfs", [0, missing_node()])
    done = corepin_run(tmp_path / "state", "--sysfs-root", sysfs, "--", "sh", "-c", SHOW_MAPS)
    assert done.returncode == 0, done.stderr
    assert policies(done.stdout) == {"heap": "bind:0", "stack": "bind:0"}


@pytest.mark.parametrize("offset", [0, 64], ids=["node below 64", "node of 64 and above"])
def test_a_bind_the_kernel_refuses_exits_4_before_cmd_starts_and_frees_the_cpus(
    tmp_path: Path, offset: int
) -> None:
    node = missing_node() + offset
    sysfs = fake_machine(tmp_path / "sysfs", [node])
    marker = tmp_path / "cmd-ran"
    state = tmp_path / "state"
    done = corepin_run(
        state,
        "--sysfs-root",
        sysfs,
        "--exclusive",
        "1",
        "--",
        "touch",
        str(marker),
        env={"COREPIN_FORCE_MEMBIND": "1"},
    )
    assert done.returncode == EXIT_ENVIRONMENT, done.stderr
    assert f"NUMA node(s) {node}" in done.stderr and "EINVAL" in done.stderr
    assert "Traceback" not in done.stderr
    assert not marker.exists(), "CMD must not run when its memory cannot be bound"
    shown = run_corepin(
        "report", "--state-dir", str(state), "--cgroups", "off", "--sysfs-root", sysfs, "-o", "json"
    )
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["allocations"] == [], "the failed run left an allocation"
