"""Machines whose sysfs attributes disagree with each other, and corepin still starts on them.

The kernel's sysfs is the truth and discovery never refuses a machine it describes. Where its
attributes disagree, corepin takes the interpretation hwloc and lscpu take and notes it once
(logger `corepin.sysfs`, INFO: quiet by default):

- AMD family 15h compute units: `thread_siblings_list` pairs two cores that keep their own
  `core_id`; they are two single-thread cores (hwloc, cadvisor and the kubelet agree).
- DynamIQ arm64 SoCs on kernels that number packages per cluster: one L3 (and one NUMA node)
  spans several packages; the model keeps both facts.
- `shared_cpu_list` and `shared_cpu_map` that disagree: the map wins (what hwloc and lscpu read).

The trees are written by `corepin.testing.write_sysfs_tree` with per-CPU overrides that say
what such kernels print (see the real dumps cited in `corepin.testing.machines`).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tempfile
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from corepin import CPUSet, Topology
from corepin.allocation.policies import POLICY_NAMES, get_policy
from corepin.allocation.simulate import parse_trace, replay
from corepin.allocation.tracegen import ChurnOptions, generate_trace
from corepin.allocation.types import Request
from corepin.cli.main import main
from corepin.cli.render import svg as svg_module
from corepin.cli.render.tree import render_tree
from corepin.cli.topology_cmd import FORMATS
from corepin.testing import (
    OMISSIONS,
    compute_unit_files,
    expected_after,
    package_core_ids,
    write_sysfs_tree,
)
from corepin.testing.machines import ClusterSpec, SyntheticSpec, clustered, named, synthetic
from corepin.topology.discover import discover
from corepin.topology.model import CPUInfo, NUMANode
from support.budget import examples
from support.helpers import run_corepin
from support.strategies import cluster_specs, compute_unit_specs

#: what a 2.6/3.x-era kernel lacks (no die_id, core_cpus_list, cluster_id or cache ids)
OLD = frozenset({"die_id", "core_cpus_list", "cluster_id", "cache_id"})


def opteron_like() -> Topology:
    """An Opteron 6200/6300 scaled down: 2 packages x 2 dies (one NUMA node and one L3 each) x
    2 compute units of 2 single-thread cores sharing an L2 (16 CPUs, linear numbering)."""
    rows = [
        CPUInfo(cpu, socket=cpu // 8, die=0, numa=cpu // 4, l3=cpu // 4, l2=cpu // 2, core=cpu)
        for cpu in range(16)
    ]
    nodes = [
        NUMANode(
            node,
            CPUSet.range(4 * node, 4 * node + 3),
            {m: 10 if m == node else 16 if m // 2 == node // 2 else 22 for m in range(4)},
        )
        for node in range(4)
    ]
    return Topology(rows, nodes, name="opteron_like")


def per_cluster_packages() -> Topology:
    """An 8-CPU phone SoC as a kernel that numbers packages per cluster sees it, before the
    L3 is taken into account: packages 0 (CPUs 0-3), 1 (4-5), 2 (6-7), private L2s."""
    rows = [
        CPUInfo(
            cpu,
            socket=0 if cpu < 4 else 1 if cpu < 6 else 2,
            die=None,
            numa=0,
            l3=0 if cpu < 4 else 4 if cpu < 6 else 6,
            l2=cpu,
            core=cpu,
            capacity=1024 if cpu >= 4 else 414,
        )
        for cpu in range(8)
    ]
    return Topology(rows, [NUMANode(0, CPUSet.range(0, 7), {0: 10})])


def one_l3_over_all_clusters(topo: Topology) -> dict[int, dict[str, int | str | CPUSet | None]]:
    """The DSU's L3: one instance, id 0, listed by every CPU with all CPUs."""
    files: dict[int, dict[str, int | str | CPUSet | None]] = {}
    for cpu in topo.online_cpus:
        files[cpu] = {
            "cache/index3/shared_cpu_list": topo.online_cpus,
            "cache/index3/shared_cpu_map": topo.online_cpus,
            "cache/index3/id": 0,
        }
    for cpu, more in package_core_ids(topo).items():
        files[cpu].update(more)
    return files


# ---------------------------------------------------------------------- AMD compute units


def test_a_compute_unit_is_two_single_thread_cores_sharing_an_l2(tmp_path: Path) -> None:
    topo = opteron_like()
    write_sysfs_tree(topo, tmp_path, overrides=compute_unit_files(topo))
    got = discover(tmp_path)
    assert got == topo
    assert got.threads_per_core == 1
    assert got.siblings_of(0) == CPUSet.of(0)
    assert got.siblings_of(1) == CPUSet.of(1)
    assert got.cpus_in_l2s(got.l2_of(0) or 0) == CPUSet.of(0, 1)


def test_a_compute_unit_kernel_with_stale_cache_lists_reads_the_cache_maps(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """As the Opteron 6276 dump in hwloc's tests: L1i/L2 `shared_cpu_list` name the CPU alone,
    `shared_cpu_map` the compute unit; no die_id, core_cpus_list or cache ids."""
    topo = opteron_like()
    write_sysfs_tree(topo, tmp_path, omit=OLD, overrides=compute_unit_files(topo, stale_lists=True))
    with caplog.at_level(logging.INFO, logger="corepin.sysfs"):
        got = discover(tmp_path)
    assert got == expected_after(topo, OLD)
    assert got.cpus_in_l2s(got.l2_of(9) or 0) == CPUSet.of(8, 9)
    notes = [r.getMessage() for r in caplog.records if r.name == "corepin.sysfs"]
    assert any("kind=smt_siblings_core_id_differ" in n for n in notes)
    assert any("kind=shared_cpu_list_map_differ" in n for n in notes)
    assert all(r.levelno < logging.WARNING for r in caplog.records if "differ" in r.getMessage())


# ---------------------------------------------------------------------- DynamIQ


def test_one_l3_over_several_packages_is_kept_as_one_cache_spanning_them(tmp_path: Path) -> None:
    topo = per_cluster_packages()
    write_sysfs_tree(topo, tmp_path, overrides=one_l3_over_all_clusters(topo))
    got = discover(tmp_path)
    assert got.socket_ids() == [0, 1, 2]
    assert got.l3_ids() == [0]
    assert got.cpus_in_l3s(0) == CPUSet.range(0, 7)
    assert got.sockets_in(got.cpus_in_l3s(0)) == [0, 1, 2]
    assert got.numa_node(0).cpus == CPUSet.range(0, 7)
    assert [got.cpu(c).core_type for c in (0, 3, 4, 7)] == [
        "efficiency",
        "efficiency",
        "performance",
        "performance",
    ]


# ---------------------------------------------------------------------- named machines


def dynamiq_kernel_files(topo: Topology) -> dict[int, dict[str, int | str | CPUSet | None]]:
    """As a Snapdragon 845 / Kirin 980 kernel prints it: core ids restart in every package."""
    return package_core_ids(topo)


KERNEL_FILES = {
    "amd_compute_units": compute_unit_files,
    "arm_dynamiq": dynamiq_kernel_files,
}


@pytest.mark.parametrize("name", sorted(KERNEL_FILES))
@pytest.mark.parametrize("old_kernel", [False, True], ids=["current kernel", "old kernel"])
def test_named_odd_machine_survives_a_sysfs_round_trip_as_its_kernel_writes_it(
    name: str, old_kernel: bool, tmp_path: Path
) -> None:
    topo = named(name)
    omit = OLD if old_kernel else frozenset()
    files = KERNEL_FILES[name](topo)
    write_sysfs_tree(topo, tmp_path, omit=omit, overrides=files)
    assert discover(tmp_path) == expected_after(topo, omit)


def test_amd_compute_units_is_shaped_like_an_opteron_6300() -> None:
    topo = named("amd_compute_units")
    assert topo.threads_per_core == 1
    assert len(topo.core_ids()) == 32
    assert topo.cpus_in_l2s(topo.l2_of(6) or 0) == CPUSet.of(6, 7)
    assert topo.cpus_in_l3s(topo.l3_of(8) or 0) == CPUSet.range(8, 15)
    assert topo.numa_nodes_in_socket(1) == [2, 3]


def test_arm_dynamiq_has_one_l3_and_one_numa_node_over_three_packages() -> None:
    topo = named("arm_dynamiq")
    assert [topo.cpus_in_sockets(s) for s in topo.socket_ids()] == [
        CPUSet.range(0, 3),
        CPUSet.range(4, 5),
        CPUSet.range(6, 7),
    ]
    assert topo.l3_ids() == [0] and topo.cpus_in_l3s(0) == CPUSet.range(0, 7)
    assert topo.numa_nodes_in_socket(2) == [0]
    assert {topo.cpu(c).die for c in topo.online_cpus} == {None}
    assert topo.cpu(5).core_type == "performance" and topo.cpu(2).core_type == "efficiency"


# ---------------------------------------------------------------------- the other odd readings


def discover_noting(root: Path, caplog: pytest.LogCaptureFixture) -> tuple[Topology, set[str]]:
    with caplog.at_level(logging.INFO, logger="corepin.sysfs"):
        got = discover(root)
    kinds = set()
    for record in caplog.records:
        text = record.getMessage()
        if record.name == "corepin.sysfs" and text.startswith("sysfs interpretation"):
            kinds.add(text.split()[2].removeprefix("kind="))
    return got, kinds


def singles(*rows: tuple[int, int, int, int | None]) -> Topology:
    """Single-thread cores: (cpu, socket, numa, l2) each, one L3 per socket."""
    infos = [CPUInfo(cpu, socket=s, die=0, numa=n, l3=s, l2=l2, core=cpu) for cpu, s, n, l2 in rows]
    nodes: dict[int, int] = {}
    for cpu, _, n, _ in rows:
        nodes[n] = nodes.get(n, 0) | (1 << cpu)
    return Topology(
        infos,
        [
            NUMANode(n, CPUSet.from_bits(m), {o: 10 if o == n else 20 for o in nodes})
            for n, m in sorted(nodes.items())
        ],
    )


def test_siblings_in_two_numa_nodes_become_one_core_per_thread(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    topo = singles((0, 0, 0, 0), (1, 0, 1, 1), (2, 0, 0, 2), (3, 0, 1, 3))
    pair = CPUSet.of(0, 1)
    files: dict[int, dict[str, int | str | CPUSet | None]] = {
        cpu: {
            "topology/core_cpus_list": pair,
            "topology/thread_siblings_list": pair,
            "topology/core_id": 0,
        }
        for cpu in (0, 1)
    }
    write_sysfs_tree(topo, tmp_path, overrides=files)
    got, kinds = discover_noting(tmp_path, caplog)
    assert got == topo
    assert kinds == {"smt_siblings_span_numa_nodes"}


def test_siblings_in_two_packages_are_split_by_package(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    topo = singles((0, 0, 0, 0), (1, 1, 0, 1))
    pair = CPUSet.of(0, 1)
    files: dict[int, dict[str, int | str | CPUSet | None]] = {
        cpu: {"topology/core_cpus_list": pair, "topology/core_id": 0} for cpu in (0, 1)
    }
    write_sysfs_tree(topo, tmp_path, overrides=files)
    got, kinds = discover_noting(tmp_path, caplog)
    assert got == topo
    assert "smt_siblings_span_packages" in kinds


def test_an_l2_shared_across_a_package_boundary_is_one_l2_over_both(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    topo = singles((0, 0, 0, 0), (1, 1, 0, 0), (2, 1, 0, 2))
    write_sysfs_tree(topo, tmp_path)
    got, kinds = discover_noting(tmp_path, caplog)
    assert got == topo
    assert got.sockets_in(got.cpus_in_l2s(0)) == [0, 1]
    assert kinds == {"cache_spans_packages", "numa_spans_packages"}


def two_thread_core() -> Topology:
    """One socket, one node, cores {0,1} and {2,3}, each with its own L2."""
    rows = [CPUInfo(c, socket=0, die=0, numa=0, l3=0, l2=c & ~1, core=c & ~1) for c in range(4)]
    return Topology(rows, [NUMANode(0, CPUSet.range(0, 3), {0: 10})])


def test_cache_lists_that_leave_out_a_sibling_are_completed_with_the_core(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    topo = two_thread_core()
    files: dict[int, dict[str, int | str | CPUSet | None]] = {
        cpu: {
            "cache/index2/shared_cpu_list": CPUSet.of(cpu),
            "cache/index2/shared_cpu_map": CPUSet.of(cpu),
        }
        for cpu in (0, 1)
    }
    write_sysfs_tree(topo, tmp_path, overrides=files)
    got, kinds = discover_noting(tmp_path, caplog)
    assert got == topo
    assert kinds == {"cache_splits_core"}


def test_a_cache_list_that_conflicts_with_the_others_is_outvoted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """As in hwloc's 40intel64-4n10c+pci-conflicts tree: one CPU's L3 map names CPUs of other
    L3s. The sets most CPUs list win; merging transitively would make one L3 of all four."""
    rows = [
        CPUInfo(c, socket=c // 4, die=0, numa=c // 4, l3=c // 4, l2=c, core=c) for c in range(8)
    ]
    nodes = [
        NUMANode(n, CPUSet.range(4 * n, 4 * n + 3), {0: 10 + 11 * n, 1: 21 - 11 * n})
        for n in (0, 1)
    ]
    topo = Topology(rows, nodes)
    bogus = CPUSet.of(0, 5)
    files: dict[int, dict[str, int | str | CPUSet | None]] = {
        5: {"cache/index3/shared_cpu_list": bogus, "cache/index3/shared_cpu_map": bogus}
    }
    write_sysfs_tree(topo, tmp_path, overrides=files)
    got, kinds = discover_noting(tmp_path, caplog)
    assert got == topo
    assert kinds == {"l3_lists_disagree"}


def test_sibling_lists_that_overlap_without_agreeing_are_not_merged_into_one_core(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """CPUs 0 and 1 list each other, CPU 2 lists {1, 2}: hwloc keeps core {0, 1} and drops the
    intersecting {1, 2}; a transitive merge would make one three-thread core."""
    rows = [CPUInfo(c, socket=0, die=0, numa=0, l3=0, l2=c & ~1, core=c & ~1) for c in range(4)]
    topo = Topology(rows, [NUMANode(0, CPUSet.range(0, 3), {0: 10})])
    files: dict[int, dict[str, int | str | CPUSet | None]] = {
        2: {"topology/core_cpus_list": CPUSet.of(1, 2), "topology/core_id": 2}
    }
    write_sysfs_tree(topo, tmp_path, overrides=files)
    got, kinds = discover_noting(tmp_path, caplog)
    assert got == topo
    assert got.siblings_of(1) == CPUSet.of(0, 1)
    assert kinds == {"smt_siblings_lists_disagree"}


def test_a_cpu_listed_by_two_numa_nodes_stays_in_the_lowest(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    topo = singles((0, 0, 0, 0), (1, 0, 0, 1), (2, 0, 1, 2), (3, 0, 1, 3))
    write_sysfs_tree(topo, tmp_path)
    node1 = tmp_path / "sys/devices/system/node/node1/cpulist"
    node1.write_text("1-3\n")
    got, kinds = discover_noting(tmp_path, caplog)
    assert got == topo
    assert kinds == {"cpu_in_several_numa_nodes"}


def test_a_sound_machine_needs_no_interpretation(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    topo = named("multi_numa_per_socket")
    write_sysfs_tree(topo, tmp_path, overrides=package_core_ids(topo))
    got, kinds = discover_noting(tmp_path, caplog)
    assert got == topo
    assert kinds == set()


# ---------------------------------------------------------------------- properties


@contextmanager
def scratch() -> Iterator[Path]:
    base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    root = Path(tempfile.mkdtemp(prefix="corepin-odd-", dir=base))
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


PROPERTY = settings(max_examples=examples(60))


@PROPERTY
@given(spec=compute_unit_specs(), stale=st.booleans(), data=st.data())
def test_compute_unit_machines_discover_as_single_thread_cores_whatever_the_kernel_omits(
    spec: SyntheticSpec, stale: bool, data: st.DataObject
) -> None:
    topo = synthetic(spec)
    # a stale L2 list is only read right through its map, so the map must stay
    allowed = sorted(OMISSIONS - {"shared_cpu_map"}) if stale else sorted(OMISSIONS)
    omit = data.draw(st.sets(st.sampled_from(allowed)))
    with scratch() as root:
        write_sysfs_tree(
            topo, root, omit=omit, overrides=compute_unit_files(topo, stale_lists=stale)
        )
        got = discover(root)
    assert got == expected_after(topo, omit)
    assert got.threads_per_core == 1


@PROPERTY
@given(spec=cluster_specs(), data=st.data())
def test_cluster_machines_round_trip_with_caches_and_nodes_over_several_packages(
    spec: ClusterSpec, data: st.DataObject
) -> None:
    topo = clustered(spec)
    omit = data.draw(st.sets(st.sampled_from(sorted(OMISSIONS))))
    with scratch() as root:
        write_sysfs_tree(topo, root, omit=omit, overrides=package_core_ids(topo))
        got = discover(root)
    assert got == expected_after(topo, omit)
    for info in got.cpus:
        if info.online and info.l3 is not None:
            assert got.cpus_in_l3s(info.l3) == topo.cpus_in_l3s(topo.l3_of(info.cpu) or 0)


@PROPERTY
@given(spec=st.one_of(cluster_specs(), compute_unit_specs()))
def test_the_pool_tree_holds_every_online_cpu_once_and_its_levels_nest(
    spec: ClusterSpec | SyntheticSpec,
) -> None:
    topo = clustered(spec) if isinstance(spec, ClusterSpec) else synthetic(spec)
    tree = topo.pool_tree()
    leaves = [n.id for n in tree.walk() if n.kind == "thread"]
    assert sorted(leaves) == topo.online_cpus.sorted()
    for node in tree.walk():
        union = 0
        for child in node.children:
            assert child.cpus <= node.cpus
            assert not child.cpus.bits & union
            union |= child.cpus.bits
        if node.children:
            assert union == node.cpus.bits


# ---------------------------------------------------------------------- corepin topology


def odd_tree(name: str, root: Path) -> Topology:
    topo = named(name)
    write_sysfs_tree(topo, root, overrides=KERNEL_FILES[name](topo))
    return topo


@pytest.mark.parametrize("name", sorted(KERNEL_FILES))
def test_corepin_topology_shows_the_machine_in_every_form(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    topo = odd_tree(name, tmp_path)
    root = str(tmp_path)
    outputs = {}
    for fmt in FORMATS:
        assert main(["topology", "--sysfs-root", root, "-o", fmt]) == 0, fmt
        outputs[fmt] = capsys.readouterr().out
    assert Topology.from_json(json.loads(outputs["json"])) == topo
    assert yaml.safe_load(outputs["yaml"]) == topo.to_json()
    table = outputs["table"].splitlines()
    header = next(i for i, line in enumerate(table) if line.startswith("SOCKET"))
    rows = [line for line in table[header + 1 :] if re.match(r"\d+\s", line)]
    assert len(rows) == len(topo.core_ids())
    threads = [line for line in outputs["tree"].splitlines() if line.lstrip().startswith("core ")]
    assert len(threads) == len(topo.core_ids())
    svg = ET.fromstring(outputs["svg"].encode())
    titles = [t.text or "" for t in svg.iter("{http://www.w3.org/2000/svg}title")]
    assert sum(1 for t in titles if re.match(r"CPU \d+$", t)) == len(topo.present_cpus)


def test_the_tree_and_the_picture_put_the_dynamiq_l3_around_its_packages() -> None:
    topo = named("arm_dynamiq")
    assert topo.level_order() == ("numa", "l3", "socket", "die", "core")
    assert render_tree(topo).splitlines()[1:5] == [
        "machine: CPUs 0-7 (8)",
        "  NUMA node 0: CPUs 0-7 (8)",
        "    L3 0: CPUs 0-7 (8)",
        "      socket 0: CPUs 0-3 (4)",
    ]
    box = svg_module._layout(topo, None)
    (numa,) = box.children
    (l3,) = numa.children
    assert (numa.label, l3.label) == ("NUMA node 0", "L3 #0")
    assert [s.label for s in l3.children] == ["Socket 0", "Socket 1", "Socket 2"]


def test_sub_numa_clusters_sit_inside_their_l3_and_a_partial_overlap_keeps_the_order() -> None:
    snc = clustered(ClusterSpec(clusters=(2, 2), numa_nodes=2, package_per_cluster=False))
    assert snc.level_order() == ("socket", "die", "l3", "numa", "core")
    assert named("sixteen_numa").level_order() == ("socket", "die", "numa", "l3", "core")
    # an L3 that straddles two NUMA nodes without holding either whole: parts per node
    rows = [
        CPUInfo(c, socket=0, die=0, numa=c // 3, l3=0 if c < 2 else 2, l2=c, core=c)
        for c in range(6)
    ]
    straddle = Topology(rows, [NUMANode(0, CPUSet.range(0, 2)), NUMANode(1, CPUSet.range(3, 5))])
    assert straddle.level_order() == ("socket", "die", "numa", "l3", "core")
    tree = straddle.pool_tree()
    l3_parts = [(n.id, n.cpus) for n in tree.walk() if n.kind == "l3"]
    assert l3_parts == [(0, CPUSet.of(0, 1)), (2, CPUSet.of(2)), (2, CPUSet.range(3, 5))]


def test_cpus_without_a_numa_node_still_appear_in_the_pool_tree() -> None:
    rows = [
        CPUInfo(0, socket=0, die=0, numa=None, l3=0, l2=0, core=0),
        CPUInfo(1, socket=0, die=0, numa=0, l3=0, l2=1, core=1),
    ]
    topo = Topology(rows, [NUMANode(0, CPUSet.of(1))])
    leaves = [n.id for n in topo.pool_tree().walk() if n.kind == "thread"]
    assert sorted(leaves) == [0, 1]


def test_the_readings_are_quiet_by_default_and_shown_with_corepin_log_info(
    tmp_path: Path,
) -> None:
    odd_tree("amd_compute_units", tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "COREPIN_LOG"}
    quiet = run_corepin("topology", "--sysfs-root", str(tmp_path), "-o", "json", env=env)
    assert quiet.returncode == 0 and quiet.stderr == ""
    loud = run_corepin(
        "topology", "--sysfs-root", str(tmp_path), "-o", "json", env={**env, "COREPIN_LOG": "info"}
    )
    assert loud.returncode == 0
    notes = [line for line in loud.stderr.splitlines() if "sysfs interpretation" in line]
    assert len(notes) == 1 and "kind=smt_siblings_core_id_differ" in notes[0]
    assert json.loads(loud.stdout) == json.loads(quiet.stdout)


# ---------------------------------------------------------------------- allocation on them


def test_topology_aware_keeps_small_requests_inside_one_dynamiq_cluster() -> None:
    topo = named("arm_dynamiq")
    policy = get_policy("topology-aware")
    for n in (1, 2, 3, 4):
        got = policy.decide(topo, Request(n), topo.online_cpus).cpus
        assert len(topo.sockets_in(got)) == 1, (n, got)
    # the efficiency cluster is busy: two CPUs go to one performance cluster, not across two
    got = policy.decide(topo, Request(2), CPUSet.range(4, 7) | CPUSet.of(0)).cpus
    assert got in (CPUSet.of(4, 5), CPUSet.of(6, 7))


def test_socket_level_on_dynamiq_reserves_whole_clusters() -> None:
    topo = named("arm_dynamiq")
    decision = get_policy("topology-aware").decide(
        topo, Request(3, level="socket"), topo.online_cpus
    )
    assert decision.withheld in (CPUSet.range(0, 3), CPUSet.range(4, 7))
    assert decision.cpus <= decision.withheld


@pytest.mark.parametrize("policy", POLICY_NAMES)
@pytest.mark.parametrize("name", sorted(KERNEL_FILES))
def test_the_simulator_replays_a_churn_trace_on_odd_machines(name: str, policy: str) -> None:
    topo = named(name)
    levels = policy != "kubelet-static"
    trace = parse_trace(
        generate_trace(topo, seed=7, options=ChurnOptions(events=300, levels=levels))
    )
    result = replay(topo, trace, get_policy(policy))
    assert result.admitted > 0
    for ratio in (result.numa_aligned_ratio, result.llc_aligned_ratio, result.full_core_ratio):
        assert ratio is None or 0.0 <= ratio <= 1.0
