"""A real kernel with 2 sockets x 2 NUMA nodes x SMT2 (16 CPUs, one L3 per node) and cgroup v2
only: topology discovery, host mode on v2 cpusets (exclusive and shared runs, memory binding,
shared pool re-pinning, reconcile of drift, cpuset partitions and their invalid states).

Everything runs in one guest (`vm_numa4_smt2`, booted once); each test runs its scenario as one
shell script in the guest and checks what the guest's kernel says (/proc/PID/status,
/proc/PID/numa_maps, the cgroup files), never corepin's own model."""

from __future__ import annotations

import json

import pytest

from vm import SHAPES, Guest
from vm import skip_reason as vm_skip_reason
from vm.checks import PROBE, lines, probe_self, topology, topology_mismatches

pytestmark = [
    pytest.mark.vm,
    pytest.mark.skipif(vm_skip_reason() is not None, reason=vm_skip_reason() or ""),
]

SHAPE = SHAPES["numa4-smt2"]
NODE_CPUS = {n: set(SHAPE.cpus_of_node(n)) for n in range(SHAPE.nodes)}
ALL = set(range(SHAPE.cpus))


#: shell: JSON on stdin to one line
ONE_LINE = "python -c 'import json, sys; print(json.dumps(json.load(sys.stdin)))'"


def cpus(text: str) -> set[int]:
    out: set[int] = set()
    for part in text.split(","):
        if part:
            lo, _, hi = part.partition("-")
            out.update(range(int(lo), int(hi or lo) + 1))
    return out


def script(*body: str, state: str = "/tmp/corepin-state") -> str:
    """A guest shell script running corepin with cgroups required and a scratch state dir."""
    return "\n".join(
        [
            "set -e",
            f"export COREPIN_STATE_DIR={state} COREPIN_CGROUPS=on",
            f"rm -rf {state}; mkdir -m 700 {state}",
            *body,
        ]
    )


def hold(name: str, *run_args: str) -> str:
    """Start `corepin run ARGS -- probe self --hold /tmp/h/NAME` in the background and wait
    until the probe has written its line."""
    return "\n".join(
        [
            "mkdir -p /tmp/h",
            f"corepin run {' '.join(run_args)} -- {probe_self('--hold', f'/tmp/h/{name}')} "
            f"> /tmp/h/{name}.out 2>&1 &",
            f"echo $! > /tmp/h/{name}.runner",
            f"while [ ! -e /tmp/h/{name} ]; do kill -0 $(cat /tmp/h/{name}.runner) 2> /dev/null"
            f" || {{ cat /tmp/h/{name}.out >&2; exit 1; }}; sleep 0.1; done",
        ]
    )


def pid_of(name: str) -> str:
    """Shell: the pid in the probe line of the held run `name`."""
    return f"$(sed 's/.*\"pid\": \\([0-9]*\\).*/\\1/' /tmp/h/{name})"


def release(name: str) -> str:
    return f"echo > /tmp/h/{name}.done; wait $(cat /tmp/h/{name}.runner)"


def test_corepin_topology_is_the_shape_qemu_was_asked_for(vm_numa4_smt2: Guest) -> None:
    data = topology(vm_numa4_smt2)
    assert topology_mismatches(SHAPE, data) == []
    assert len({r["socket"] for r in data["cpus"]}) == 2


def test_an_exclusive_run_gets_whole_cores_of_one_node_and_its_memory_in_a_v2_cpuset(
    vm_numa4_smt2: Guest,
) -> None:
    result = vm_numa4_smt2.run(
        script(
            f"corepin run --exclusive 4 -- {probe_self()}",
            "cat /sys/fs/cgroup/cgroup.subtree_control",
        )
    ).check()
    [line] = lines(result.stdout)
    got = cpus(line["cpus"])
    assert len(got) == 4
    [node] = [n for n, c in NODE_CPUS.items() if got <= c]
    assert line["mems"] == str(node)
    assert line["env"]["COREPIN_CPUS_EXCLUSIVE"] == line["cpus"]
    # the run's own v2 group below corepin/<state dir key>/, cpuset enabled on the way down
    parent, _, run_id = line["cgroup"].rpartition("/")
    assert parent.startswith("/corepin/sd-") and run_id.startswith("run-")
    assert "cpuset" in result.stdout.splitlines()[-1].split()


def test_memory_of_an_exclusive_run_on_node_2_lands_on_node_2(vm_numa4_smt2: Guest) -> None:
    result = vm_numa4_smt2.run(
        script(f"corepin run --exclusive 2 --option numa=2 -- {probe_self('--alloc-mb', '48')}")
    ).check()
    [line] = lines(result.stdout)
    assert cpus(line["cpus"]) <= NODE_CPUS[2]
    assert line["mems"] == "2"
    pages = line["pages"]
    assert sum(pages.values()) >= 48 * 256
    assert set(pages) == {"2"}, f"pages per node: {pages}"


def test_shared_runs_shrink_and_grow_with_exclusive_runs(vm_numa4_smt2: Guest) -> None:
    result = vm_numa4_smt2.run(
        script(
            hold("shared", "--shared"),
            "cat /tmp/h/shared; S=" + pid_of("shared"),
            f"corepin run --exclusive 4 --option numa=1 -- sh -c '{PROBE} self; {PROBE} pid '$S",
            f"{PROBE} pid $S",
            "corepin report -o json | " + ONE_LINE,
            release("shared"),
        )
    ).check()
    shared0, exclusive, shared_during, shared_after, report = lines(result.stdout)[:5]
    assert cpus(shared0["cpus"]) == ALL and shared0["mems"] == "0-3"
    took = cpus(exclusive["cpus"])
    assert took <= NODE_CPUS[1] and len(took) == 4
    assert cpus(shared_during["cpus"]) == ALL - took
    assert cpus(shared_after["cpus"]) == ALL
    [shared] = report["allocations"]
    assert shared["exclusive"] is False and cpus(report["shared_pool"]) == ALL


def test_reconcile_repairs_a_drifted_cpuset_and_affinity(vm_numa4_smt2: Guest) -> None:
    result = vm_numa4_smt2.run(
        script(
            hold("ex", "--exclusive", "2", "--option", "numa=3"),
            "P=" + pid_of("ex"),
            "G=$(sed -n 's/^0:://p' /proc/$P/cgroup)",
            # drift: someone widens the run's cpuset and moves its affinity off its CPUs
            "echo 0-15 > /sys/fs/cgroup$G/cpuset.cpus; taskset -pc 0 $P > /dev/null",
            f"{PROBE} pid $P",
            "corepin reconcile --once -o json > /tmp/h/reconcile.json",
            f"{PROBE} pid $P; {PROBE} cgroup $G",
            "cat /tmp/h/ex",
            release("ex"),
            "cat /tmp/h/reconcile.json",
        )
    ).check()
    drifted, repaired, group, held = lines(result.stdout)[:4]
    want = cpus(held["cpus"])
    assert want <= NODE_CPUS[3] and len(want) == 2
    assert drifted["cpus"] == "0"
    assert cpus(repaired["cpus"]) == want
    assert cpus(group["cpuset.cpus"]) == want and group["cpuset.mems"] == "3"
    text = json.dumps(lines(result.stdout)[-1]["changes"])
    assert "repinned" in text and "0-15" in text


def test_an_isolated_partition_takes_the_cpus_of_an_exclusive_run_from_everyone_else(
    vm_numa4_smt2: Guest,
) -> None:
    result = vm_numa4_smt2.run(
        script(
            hold("part", "--exclusive", "4", "--option", "numa=2", "--partition", "isolated"),
            "P=" + pid_of("part"),
            "G=$(sed -n 's/^0:://p' /proc/$P/cgroup)",
            f"{PROBE} cgroup $G /",
            # a process outside the partition cannot be put on its CPUs
            "if taskset -c 8 true 2> /dev/null; then echo outside-ran; else echo outside-refused; "
            "fi",
            release("part"),
            f"{PROBE} cgroup /",
            "ls /sys/fs/cgroup | grep -c '^corepin\\.' || true",
        )
    ).check()
    group, root_during, root_after = lines(result.stdout)[:3]
    assert group["cpuset.cpus.partition"] == "isolated"
    assert cpus(group["cpuset.cpus.effective"]) == NODE_CPUS[2]
    assert group["path"].startswith("/corepin.sd-")
    assert cpus(root_during["cpuset.cpus.effective"]) == ALL - NODE_CPUS[2]
    assert "outside-refused" in result.stdout
    # the run ended: its partition group is gone and the CPUs are everyone's again
    assert cpus(root_after["cpuset.cpus.effective"]) == ALL
    assert result.stdout.rstrip().splitlines()[-1] == "0"


def test_a_partition_the_kernel_refuses_falls_back_to_a_plain_cpuset(
    vm_numa4_smt2: Guest,
) -> None:
    result = vm_numa4_smt2.run(
        script(
            # another group of the host holds node 3's CPUs: a partition there is not exclusive
            "mkdir -p /sys/fs/cgroup/blocker && echo 12-15 > /sys/fs/cgroup/blocker/cpuset.cpus",
            f"corepin run --exclusive 4 --option numa=3 --partition root -- sh -c '{PROBE} self;"
            " G=$(sed -n s/^0:://p /proc/self/cgroup); " + PROBE + " cgroup $G'",
            "rmdir /sys/fs/cgroup/blocker",
        )
    ).check()
    me, group = lines(result.stdout)[:2]
    assert cpus(me["cpus"]) == NODE_CPUS[3]
    assert group["cpuset.cpus.partition"] == "member"
    assert cpus(group["cpuset.cpus.effective"]) == NODE_CPUS[3]
    assert "partition root invalid" in result.stderr
    assert "keeps a plain cpuset on CPUs 12-15" in result.stderr


def test_reconcile_reports_a_partition_the_kernel_invalidated_and_falls_back(
    vm_numa4_smt2: Guest,
) -> None:
    result = vm_numa4_smt2.run(
        script(
            "mkdir -p /sys/fs/cgroup/neighbour && echo 4 > /sys/fs/cgroup/neighbour/cpuset.cpus",
            hold("p", "--exclusive", "4", "--option", "numa=0", "--partition", "root"),
            "P=" + pid_of("p"),
            "G=$(sed -n 's/^0:://p' /proc/$P/cgroup)",
            f"{PROBE} cgroup $G",
            # drift: the partition's CPUs now overlap the neighbour's, the kernel invalidates it
            "echo 0-4 > /sys/fs/cgroup$G/cpuset.cpus",
            f"{PROBE} cgroup $G",
            "corepin reconcile --once -o json > /tmp/h/rec.json",
            f"{PROBE} cgroup $G; {PROBE} pid $P",
            release("p"),
            "rmdir /sys/fs/cgroup/neighbour",
            "cat /tmp/h/rec.json",
        )
    ).check()
    valid, invalid, after, proc = lines(result.stdout)[:4]
    assert valid["cpuset.cpus.partition"] == "root"
    assert invalid["cpuset.cpus.partition"].startswith("root invalid")
    assert after["cpuset.cpus.partition"] == "member"
    assert cpus(after["cpuset.cpus"]) == NODE_CPUS[0] == cpus(proc["cpus"])
    report = json.dumps(lines(result.stdout)[-1]["changes"])
    assert "partition root invalid" in report and "-> member" in report


def test_the_node_agent_pins_kubelet_processes_on_cgroup_v2(vm_numa4_smt2: Guest) -> None:
    """`corepin agent` against the fake API server in the guest, pods in the kubelet's cgroupfs
    layout under a scratch kubelet cgroup root, one process per container (agent_scenario.py)."""
    result = vm_numa4_smt2.run("python tests/vm/agent_scenario.py /tmp/agent-e2e", timeout=600)
    [out] = lines(result.stdout)
    assert result.returncode == 0 and "error" not in out, out
    pinned = out["pinned"]
    big, small, shared = (cpus(pinned[n]["allowed"]) for n in ("big", "small", "shared"))
    # the kernel pins each process to its container's cpuset, as the agent wrote it
    for name in ("big", "small", "shared"):
        assert pinned[name]["allowed"] == pinned[name]["cpus"], name
    assert len(big) == 4 and len(small) == 2 and not big & small
    [node] = [n for n, c in NODE_CPUS.items() if big <= c]
    assert pinned["big"]["mems"] == str(node)
    assert any(small <= c for c in NODE_CPUS.values())
    assert shared == ALL - big - small
    # the exclusive pods went away: the burstable one has the whole machine again
    assert cpus(out["after_delete"]["allowed"]) == ALL
    assert out["agent_exit"] == 0
