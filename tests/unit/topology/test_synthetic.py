"""Synthetic machines: shapes of the named topologies, numbering, options, validation, and the
round trip `discover(write_sysfs_tree(topology)) == topology` (also with old-kernel omissions).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corepin import CPUSet, Topology, TopologyError
from corepin.testing import OLD_KERNEL, OMISSIONS, expected_after, write_sysfs_tree
from corepin.testing.machines import (
    NAMED,
    ClusterSpec,
    SyntheticSpec,
    clustered,
    named,
    synthetic,
)
from corepin.topology.discover import discover
from support.budget import examples
from support.strategies import synthetic_specs


@contextmanager
def scratch() -> Iterator[Path]:
    base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    root = Path(tempfile.mkdtemp(prefix="corepin-synth-", dir=base))
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


# name, CPUs, sockets, NUMA nodes with CPUs, L3 instances, cores, threads per core
SHAPES = [
    ("single_socket_ht", 16, 1, 1, 1, 8, 2),
    ("dual_socket_ht", 32, 2, 2, 2, 16, 2),
    ("multi_numa_per_socket", 48, 2, 4, 4, 24, 2),
    ("multi_l3_per_numa", 128, 2, 2, 16, 64, 2),
    ("sixteen_numa", 64, 2, 16, 16, 32, 2),
    ("hybrid", 16, 1, 1, 1, 12, 2),
    ("offline_cpus", 16, 2, 2, 2, 7, 2),
    ("amd_compute_units", 32, 2, 4, 4, 32, 1),
    ("arm_dynamiq", 8, 3, 1, 1, 8, 1),
    ("large_64", 64, 2, 4, 8, 32, 2),
    ("large_256", 256, 2, 8, 32, 128, 2),
    ("large_1024", 1024, 4, 16, 64, 512, 2),
]


@pytest.mark.parametrize(
    ("name", "cpus", "sockets", "numa", "l3", "cores", "threads"),
    SHAPES,
    ids=[s[0] for s in SHAPES],
)
def test_named_topology_has_the_documented_shape(
    name: str, cpus: int, sockets: int, numa: int, l3: int, cores: int, threads: int
) -> None:
    topo = named(name)
    assert len(topo.present_cpus) == cpus
    assert len(topo.socket_ids()) == sockets
    assert len(topo.numa_node_ids()) == numa
    assert len(topo.l3_ids()) == l3
    assert len(topo.core_ids()) == cores
    assert topo.threads_per_core == threads
    assert topo.name == name


def test_every_named_topology_is_listed_and_unknown_names_are_a_topology_error() -> None:
    assert set(NAMED) == {s[0] for s in SHAPES}
    with pytest.raises(TopologyError, match="unknown synthetic topology 'nope'"):
        named("nope")


def test_interleaved_numbering_puts_every_thread_0_before_any_thread_1_like_linux_x86() -> None:
    topo = named("dual_socket_ht")
    assert topo.siblings_of(0) == CPUSet.of(0, 16)
    assert topo.cpus_in_sockets(1) == CPUSet.parse("8-15,24-31")


def test_linear_numbering_keeps_the_threads_of_a_core_consecutive() -> None:
    topo = synthetic(SyntheticSpec(sockets=2, cores_per_l3=4, numbering="linear"))
    assert topo.siblings_of(2) == CPUSet.of(2, 3)
    assert topo.cpus_in_sockets(1) == CPUSet.range(8, 15)


def test_hybrid_has_two_thread_performance_cores_then_single_thread_efficiency_cores() -> None:
    topo = named("hybrid")
    assert {topo.cpu(c).core_type for c in range(8)} == {"performance"}
    assert {topo.cpu(c).core_type for c in range(8, 16)} == {"efficiency"}
    assert topo.cpus_in_l2s(topo.l2_of(8) or 0) == CPUSet.range(8, 11)
    assert topo.cpus_in_l2s(topo.l2_of(12) or 0) == CPUSet.range(12, 15)
    assert topo.siblings_of(6) == CPUSet.of(6, 7)


def test_offline_cpus_have_no_topology_and_cores_are_named_by_their_lowest_online_cpu() -> None:
    topo = named("offline_cpus")
    assert topo.offline_cpus == CPUSet.of(0, 3, 11, 13)
    assert topo.cpu(0).to_json() | {"cpu": 0} == {
        "cpu": 0,
        "online": False,
        "socket": None,
        "die": None,
        "numa": None,
        "l3": None,
        "l2": None,
        "core": None,
        "isolated": False,
        "core_type": None,
        "cluster": None,
        "capacity": None,
    }
    assert topo.cpu(8).core == 8  # CPU 0, its sibling, is offline
    assert topo.isolated_cpus == CPUSet.of(6, 14)
    assert 0 not in topo.numa_node(0).cpus


def test_numa_distances_are_10_local_11_same_die_12_same_socket_21_remote() -> None:
    topo = synthetic(SyntheticSpec(sockets=2, dies_per_socket=2, numa_per_die=2, cores_per_l3=1))
    assert topo.numa_node(0).distances == {0: 10, 1: 11, 2: 12, 3: 12, 4: 21, 5: 21, 6: 21, 7: 21}


def test_memory_only_nodes_come_after_cpu_nodes_and_have_no_cpus() -> None:
    topo = synthetic(SyntheticSpec(sockets=2, memory_only_nodes=2, memory_kb_per_node=4096))
    assert [n.id for n in topo.numa_nodes] == [0, 1, 2, 3]
    assert [n.memory_only for n in topo.numa_nodes] == [False, False, True, True]
    assert topo.numa_node(2).distances[0] == 14 and topo.numa_node(2).distances[1] == 24


def test_cores_share_an_l2_in_groups_of_cores_per_l2_inside_each_l3() -> None:
    topo = synthetic(SyntheticSpec(cores_per_l3=5, threads_per_core=1, cores_per_l2=2))
    l2s = [topo.cpus_in_l2s(i) for i in topo.l2_ids()]
    assert l2s == [CPUSet.of(0, 1), CPUSet.of(2, 3), CPUSet.of(4)]


def test_cluster_machines_number_packages_per_cluster_or_clusters_inside_one_package() -> None:
    spec = ClusterSpec(clusters=(2, 3), capacities=(512, 1024), l3="shared")
    per_cluster = clustered(spec)
    assert per_cluster.socket_ids() == [0, 1]
    assert per_cluster.cpus_in_l3s(0) == CPUSet.range(0, 4)
    assert {c.cluster for c in per_cluster.cpus} == {None}
    one_package = clustered(dataclasses.replace(spec, package_per_cluster=False))
    assert one_package.socket_ids() == [0]
    assert [one_package.cpu(c).cluster for c in (1, 2)] == [0, 1]
    assert [one_package.cpu(c).core_type for c in (1, 2)] == ["efficiency", "performance"]


def test_cluster_core_types_follow_the_capacities_of_online_cpus() -> None:
    topo = clustered(ClusterSpec(clusters=(1, 2), capacities=(1024, 512), offline=(0,)))
    assert {topo.cpu(c).core_type for c in (1, 2)} == {None}  # one capacity left online
    assert topo.cpu(1).capacity == 512


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (ClusterSpec(clusters=()), "at least one core"),
        (ClusterSpec(clusters=(2, 0)), "at least one core"),
        (ClusterSpec(capacities=(1,)), "one positive value per cluster"),
        (ClusterSpec(numa_nodes=3), "3 NUMA nodes for 2 clusters"),
        (ClusterSpec(threads_per_core=0), "threads_per_core"),
        (ClusterSpec(offline=(8,)), r"offline CPUs \[8\] are outside 0-7"),
        (ClusterSpec(clusters=(1,), offline=(0,)), "at least one CPU must stay online"),
        (ClusterSpec(l3="everywhere"), "l3 must be"),  # type: ignore[arg-type]
    ],
    ids=[
        "no clusters",
        "empty cluster",
        "capacities of the wrong length",
        "more NUMA nodes than clusters",
        "no threads",
        "offline out of range",
        "all offline",
        "unknown L3 layout",
    ],
)
def test_invalid_cluster_specs_are_rejected_with_a_topology_error_naming_the_problem(
    spec: ClusterSpec, message: str
) -> None:
    with pytest.raises(TopologyError, match=message):
        clustered(spec)


def test_socket_ids_can_be_sparse_firmware_ids() -> None:
    topo = synthetic(SyntheticSpec(sockets=2, socket_ids=(36, 8442)))
    assert topo.socket_ids() == [36, 8442]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (SyntheticSpec(sockets=0), "sockets must be at least 1"),
        (SyntheticSpec(dies_per_socket=2, numa_per_socket=3), "cannot be split evenly"),
        (SyntheticSpec(cores_per_l3=0), "at least one core"),
        (SyntheticSpec(offline=(99,)), r"offline CPUs \[99\] are outside 0-7"),
        (SyntheticSpec(offline=tuple(range(8))), "at least one CPU must stay online"),
        (SyntheticSpec(sockets=2, socket_ids=(1, 1)), "distinct"),
        (SyntheticSpec(numbering="zigzag"), "numbering must be"),  # type: ignore[arg-type]
        (SyntheticSpec(cores_per_l2=0), "cores_per_l2 must be at least 1"),
    ],
    ids=[
        "no sockets",
        "uneven dies",
        "empty L3",
        "offline out of range",
        "all offline",
        "duplicate socket ids",
        "unknown numbering",
        "no cores per L2",
    ],
)
def test_invalid_specs_are_rejected_with_a_topology_error_naming_the_problem(
    spec: SyntheticSpec, message: str
) -> None:
    with pytest.raises(TopologyError, match=message):
        synthetic(spec)


@pytest.mark.parametrize("name", sorted(set(NAMED) - {"large_256", "large_1024"}))
def test_named_topology_survives_json_and_a_sysfs_round_trip(name: str) -> None:
    topo = named(name)
    assert Topology.from_json(json.loads(json.dumps(topo.to_json()))) == topo
    with scratch() as root:
        write_sysfs_tree(topo, root)
        assert discover(root) == topo


def test_unknown_omissions_are_rejected() -> None:
    with scratch() as root, pytest.raises(ValueError, match="unknown sysfs omissions"):
        write_sysfs_tree(named("single_socket_ht"), root, omit={"everything"})


@settings(max_examples=examples(60))
@given(spec=synthetic_specs())
def test_discovering_a_written_synthetic_tree_gives_back_the_same_topology(
    spec: SyntheticSpec,
) -> None:
    topo = synthetic(spec)
    with scratch() as root:
        write_sysfs_tree(topo, root)
        assert discover(root) == topo


@settings(max_examples=examples(60))
@given(
    spec=synthetic_specs(), omit=st.sets(st.sampled_from(sorted(OMISSIONS))) | st.just(OLD_KERNEL)
)
def test_discovery_with_old_kernel_or_missing_files_gives_the_documented_fallback_topology(
    spec: SyntheticSpec, omit: frozenset[str]
) -> None:
    topo = synthetic(spec)
    with scratch() as root:
        write_sysfs_tree(topo, root, omit=omit)
        got = discover(root)
    want = expected_after(topo, omit)
    assert got == want
    # whatever was left out, the grouping of CPUs into cores and caches never changes
    for info in topo.cpus:
        if info.online:
            assert got.siblings_of(info.cpu) == topo.siblings_of(info.cpu)
            l3, got_l3 = info.l3, got.l3_of(info.cpu)
            assert (l3 is None) == (got_l3 is None)
            if l3 is not None and got_l3 is not None:
                assert got.cpus_in_l3s(got_l3) == topo.cpus_in_l3s(l3)
