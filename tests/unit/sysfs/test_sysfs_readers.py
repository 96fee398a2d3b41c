"""The sysfs readers: required files, named-file errors, fallbacks, odd kernels, speed.

Trees are written by `corepin.testing.write_sysfs_tree` from synthetic machines and then edited
the way real kernels and firmware differ (garbage, missing files, sparse node ids, ids that
restart per package).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from corepin import CPUSet, SysfsError
from corepin.core.errors import EXIT_ENVIRONMENT
from corepin.sysfs.files import SysfsFiles
from corepin.sysfs.node import parse_meminfo_total
from corepin.sysfs.topology import read_sysfs
from corepin.testing import write_sysfs_tree
from corepin.testing.machines import SyntheticSpec, dual_socket_ht, large_1024, synthetic
from corepin.topology.discover import discover

CPU = "sys/devices/system/cpu"
NODE = "sys/devices/system/node"


@pytest.fixture
def tree() -> Iterator[Path]:
    """A dual-socket HT machine (32 CPUs) written to a scratch directory (tmpfs when there)."""
    base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    root = Path(tempfile.mkdtemp(prefix="corepin-sysfs-", dir=base))
    try:
        write_sysfs_tree(dual_socket_ht(), root)
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def put(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def fallback_kinds(caplog: pytest.LogCaptureFixture) -> Counter[str]:
    return Counter(
        r.getMessage().split()[2].removeprefix("kind=")
        for r in caplog.records
        if r.name == "corepin.sysfs"
    )


# ---------------------------------------------------------------- required files


def test_a_root_without_the_cpu_directory_raises_a_sysfs_error_naming_that_directory(
    tmp_path: Path,
) -> None:
    with pytest.raises(SysfsError) as err:
        discover(tmp_path)
    assert str(tmp_path / CPU) in str(err.value)
    assert err.value.exit_code == EXIT_ENVIRONMENT


def test_missing_present_file_with_no_cpu_directories_names_the_present_file(
    tmp_path: Path,
) -> None:
    (tmp_path / CPU).mkdir(parents=True)
    with pytest.raises(SysfsError) as err:
        discover(tmp_path)
    assert err.value.path == str(tmp_path / CPU / "present")


def test_missing_online_file_with_no_cpu_directories_names_the_online_file(
    tmp_path: Path,
) -> None:
    put(tmp_path, f"{CPU}/present", "0-3\n")
    with pytest.raises(SysfsError) as err:
        discover(tmp_path)
    assert err.value.path == str(tmp_path / CPU / "online")


def test_missing_level_file_inside_a_cache_index_directory_is_an_error_naming_it(
    tree: Path,
) -> None:
    (tree / CPU / "cpu5/cache/index2/level").unlink()
    with pytest.raises(SysfsError, match=r"cpu5/cache/index2/level: required file is missing"):
        discover(tree)


# ---------------------------------------------------------------- garbage names the file


@pytest.mark.parametrize(
    ("rel", "text", "problem"),
    [
        (f"{CPU}/cpu3/topology/physical_package_id", "zero\n", "expected an integer, got 'zero'"),
        (f"{CPU}/cpu3/topology/core_cpus_list", "3,,19\n", "not a CPU list"),
        (f"{CPU}/cpu3/cache/index3/shared_cpu_list", "0-\n", "not a CPU list"),
        (f"{CPU}/cpu3/cache/index3/id", "0x1\n", "expected an integer"),
        (f"{CPU}/online", "0-31,x\n", "not a CPU list"),
        (f"{CPU}/isolated", "-1\n", "not a CPU list"),
        (f"{NODE}/node1/cpulist", "8-15,24-31-40\n", "not a CPU list"),
        (f"{NODE}/node0/distance", "10 twenty\n", "expected distances"),
        (f"{NODE}/node0/meminfo", "Node 0 MemTotal: lots kB\n", "unreadable MemTotal"),
    ],
    ids=lambda v: str(v).split("/")[-1] if "/" in str(v) else str(v)[:12],
)
def test_garbage_in_a_sysfs_file_raises_a_sysfs_error_naming_the_file_and_the_problem(
    tree: Path, rel: str, text: str, problem: str
) -> None:
    put(tree, rel, text)
    with pytest.raises(SysfsError) as err:
        discover(tree)
    assert err.value.path == str(tree / rel)
    assert problem in str(err.value)


def test_non_ascii_bytes_in_a_file_are_reported_with_the_file(tree: Path) -> None:
    (tree / CPU / "present").write_bytes(b"0-31\xff\n")
    with pytest.raises(SysfsError, match="present: not ASCII text"):
        discover(tree)


# ---------------------------------------------------------------- fallbacks


def test_missing_present_file_falls_back_to_cpu_directories_with_one_warning(
    tree: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tree / CPU / "present").unlink()
    with caplog.at_level(logging.WARNING, logger="corepin.sysfs"):
        topo = discover(tree)
    assert topo == dual_socket_ht()
    assert fallback_kinds(caplog)["present_missing"] == 1


def test_missing_online_file_reads_per_cpu_online_files_and_cpu0_without_one_is_online(
    tree: Path,
) -> None:
    (tree / CPU / "online").unlink()
    (tree / CPU / "cpu0/online").unlink()
    put(tree, f"{CPU}/cpu7/online", "0\n")
    topo = discover(tree)
    assert topo.online_cpus == CPUSet.range(0, 31) - CPUSet.of(7)


def test_an_old_kernel_logs_each_kind_of_fallback_once_however_many_cpus_need_it(
    tree: Path, caplog: pytest.LogCaptureFixture
) -> None:
    for cpu in range(32):
        (tree / CPU / f"cpu{cpu}/topology/die_id").unlink()
        (tree / CPU / f"cpu{cpu}/topology/core_cpus_list").unlink()
    with caplog.at_level(logging.WARNING, logger="corepin.sysfs"):
        topo = discover(tree)
    kinds = fallback_kinds(caplog)
    assert kinds["die_id_missing"] == 1
    assert kinds["core_cpus_list_missing"] == 1
    assert topo.siblings_of(0) == CPUSet.of(0, 16)
    record = next(r for r in caplog.records if "die_id_missing" in r.getMessage())
    assert "path=" in record.getMessage() and "action=" in record.getMessage()


def test_without_any_sibling_list_cores_are_grouped_by_package_die_and_core_id(
    tree: Path,
) -> None:
    for cpu in range(32):
        (tree / CPU / f"cpu{cpu}/topology/core_cpus_list").unlink()
        (tree / CPU / f"cpu{cpu}/topology/thread_siblings_list").unlink()
    assert discover(tree) == dual_socket_ht()


def test_node_cpulist_missing_falls_back_to_the_hex_cpumap(tree: Path) -> None:
    (tree / NODE / "node1/cpulist").unlink()
    assert discover(tree).numa_node(1).cpus == CPUSet.parse("8-15,24-31")


def test_without_a_node_directory_every_online_cpu_is_in_node_0(tree: Path) -> None:
    shutil.rmtree(tree / NODE)
    topo = discover(tree)
    assert topo.numa_node_ids() == [0]
    assert topo.cpus_in_numa_nodes(0) == CPUSet.range(0, 31)


def test_whitespace_nul_padding_and_null_text_are_tolerated(tree: Path) -> None:
    (tree / CPU / "isolated").write_text("  (null)\n")
    (tree / CPU / "offline").write_bytes(b"\0\0\n")
    topo = discover(tree)
    assert topo.isolated_cpus == CPUSet()


# ---------------------------------------------------------------- NUMA distances


def write_sparse_nodes(root: Path, rows: dict[int, str], online: str | None) -> None:
    """Three nodes 0, 2, 5 (cpus 0-7, 8-15, none) with the given distance rows."""
    shutil.rmtree(root / NODE)
    if online is not None:
        put(root, f"{NODE}/online", online)
    put(root, f"{NODE}/possible", "0-7")
    for node, cpus in ((0, "0-7,16-23"), (2, "8-15,24-31"), (5, "")):
        put(root, f"{NODE}/node{node}/cpulist", cpus)
        put(root, f"{NODE}/node{node}/distance", rows[node])


def test_distance_rows_follow_online_node_order_not_node_ids_when_ids_are_sparse(
    tree: Path,
) -> None:
    rows = {0: "10 21 17", 2: "21 10 28", 5: "17 28 10"}
    write_sparse_nodes(tree, rows, online="0,2,5")
    topo = discover(tree)
    assert topo.numa_node(0).distances == {0: 10, 2: 21, 5: 17}
    assert topo.numa_node(5).distances == {0: 17, 2: 28, 5: 10}
    assert topo.numa_node(5).memory_only
    assert topo.numa_node_ids() == [0, 2]


def test_without_node_online_the_node_directories_give_the_distance_order(tree: Path) -> None:
    write_sparse_nodes(tree, {0: "10 21 17", 2: "21 10 28", 5: "17 28 10"}, online=None)
    assert discover(tree).numa_node(2).distances == {0: 21, 2: 10, 5: 28}


def test_a_distance_row_of_the_wrong_length_is_dropped_with_a_warning(
    tree: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write_sparse_nodes(tree, {0: "10 21", 2: "21 10 28", 5: "17 28 10"}, online="0,2,5")
    with caplog.at_level(logging.WARNING, logger="corepin.sysfs"):
        topo = discover(tree)
    assert topo.numa_node(0).distances == {}
    assert topo.numa_node(2).distances == {0: 21, 2: 10, 5: 28}
    assert fallback_kinds(caplog)["node_distance_length"] == 1


def test_node_meminfo_gives_the_memory_size_in_kb() -> None:
    text = "Node 3 MemTotal:       32823132 kB\nNode 3 MemFree:  1 kB\n"
    assert parse_meminfo_total("meminfo", text) == 32823132
    assert parse_meminfo_total("meminfo", "Node 3 MemFree: 1 kB\n") is None


# ---------------------------------------------------------------- identity of units


def test_l3_ids_that_restart_per_package_still_give_two_distinct_l3_instances(
    tree: Path, caplog: pytest.LogCaptureFixture
) -> None:
    for cpu in range(32):
        put(tree, f"{CPU}/cpu{cpu}/cache/index3/id", "0\n")
    with caplog.at_level(logging.WARNING, logger="corepin.sysfs"):
        topo = discover(tree)
    assert topo.l3_ids() == [0, 8]
    assert topo.cpus_in_l3s(8) == CPUSet.parse("8-15,24-31")
    assert fallback_kinds(caplog)["l3_id_inconsistent"] == 1


def test_cache_ids_that_disagree_inside_one_instance_fall_back_to_the_lowest_cpu(
    tree: Path,
) -> None:
    put(tree, f"{CPU}/cpu20/cache/index3/id", "7\n")
    topo = discover(tree)
    assert topo.l3_ids() == [0, 8]


def test_shared_cpu_lists_that_include_offline_cpus_are_restricted_to_online_ones(
    tree: Path,
) -> None:
    put(tree, f"{CPU}/online", "1-31")
    put(tree, f"{CPU}/cpu0/online", "0")
    shutil.rmtree(tree / CPU / "cpu0/topology")
    topo = discover(tree)
    assert topo.cpus_in_l3s(topo.l3_of(1) or 0) == CPUSet.parse("1-7,16-23")
    assert topo.siblings_of(16) == CPUSet.of(16)
    assert topo.cpu(0).core is None


def test_negative_package_id_is_replaced_by_the_lowest_cpu_of_the_package(tree: Path) -> None:
    for cpu in range(32):
        put(tree, f"{CPU}/cpu{cpu}/topology/physical_package_id", "-1\n")
    topo = discover(tree)
    assert topo.socket_ids() == [0, 8]


def test_negative_die_id_means_the_platform_has_no_dies(tree: Path) -> None:
    for cpu in range(32):
        put(tree, f"{CPU}/cpu{cpu}/topology/die_id", "-1\n")
    topo = discover(tree)
    assert topo.die_ids() == []
    assert topo.cpu(0).die is None


def test_cpu_capacity_marks_the_highest_capacity_cpus_as_performance_cores(tree: Path) -> None:
    for cpu in range(32):
        put(tree, f"{CPU}/cpu{cpu}/cpu_capacity", "1024\n" if cpu < 8 else "512\n")
    topo = discover(tree)
    assert topo.cpu(3).core_type == "performance" and topo.cpu(3).capacity == 1024
    assert topo.cpu(12).core_type == "efficiency" and topo.cpu(12).capacity == 512


def test_equal_cpu_capacities_give_no_core_type(tree: Path) -> None:
    for cpu in range(32):
        put(tree, f"{CPU}/cpu{cpu}/cpu_capacity", "1024\n")
    assert {c.core_type for c in discover(tree).cpus} == {None}


def test_hybrid_pmu_lists_win_over_capacity(tree: Path) -> None:
    put(tree, "sys/devices/cpu_core/cpus", "0-15")
    put(tree, "sys/devices/cpu_atom/cpus", "16-31")
    for cpu in range(32):
        put(tree, f"{CPU}/cpu{cpu}/cpu_capacity", "100\n")
    topo = discover(tree)
    assert topo.cpu(0).core_type == "performance"
    assert topo.cpu(16).core_type == "efficiency"


def test_cluster_ids_name_clusters_and_ids_repeating_per_package_fall_back_to_lowest_cpu(
    tree: Path,
) -> None:
    def write_clusters(ident: str) -> None:
        for cpu in range(32):
            first = cpu % 16 // 4 * 4  # cores of 4: {0-3,16-19}, {4-7,20-23}, ...
            put(tree, f"{CPU}/cpu{cpu}/topology/cluster_id", ident.format(first=first))
            put(
                tree,
                f"{CPU}/cpu{cpu}/topology/cluster_cpus_list",
                f"{first}-{first + 3},{first + 16}-{first + 19}",
            )

    write_clusters("{first}0")
    assert [discover(tree).cpu(c).cluster for c in (0, 19, 4, 12)] == [0, 0, 40, 120]
    write_clusters("1")  # one id for every cluster: not usable as a name
    topo = discover(tree)
    assert [topo.cpu(c).cluster for c in (0, 19, 4, 23, 12)] == [0, 0, 4, 4, 12]


# ---------------------------------------------------------------- reading discipline, speed


def test_discovery_reads_each_file_at_most_once(
    tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads: Counter[str] = Counter()
    original = SysfsFiles.text

    def counting(self: SysfsFiles, path: str, *, required: bool = True) -> str | None:
        reads[path] += 1
        return original(self, path, required=required)

    monkeypatch.setattr(SysfsFiles, "text", counting)
    read_sysfs(tree)
    assert reads and max(reads.values()) == 1


def test_discovery_of_a_1024_cpu_tree_takes_well_under_a_second_of_cpu_time() -> None:
    base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    root = tempfile.mkdtemp(prefix="corepin-1024-", dir=base)
    try:
        topo = large_1024()
        write_sysfs_tree(topo, root)
        discover(root)  # warm the page cache
        start = time.process_time()
        got = discover(root)
        spent = time.process_time() - start
    finally:
        shutil.rmtree(root, ignore_errors=True)
    assert got == topo
    assert spent < 1.5, f"discovery of 1024 CPUs took {spent:.2f}s of CPU time"


def test_write_then_discover_keeps_memory_sizes_and_memory_only_nodes(tmp_path: Path) -> None:
    topo = synthetic(SyntheticSpec(sockets=2, memory_only_nodes=2, memory_kb_per_node=1 << 20))
    write_sysfs_tree(topo, tmp_path)
    got = discover(tmp_path)
    assert got == topo
    assert [n.id for n in got.numa_nodes if n.memory_only] == [2, 3]
    assert got.numa_node(2).memory_kb == 1 << 20


@pytest.mark.parametrize("sentinel", ["-1", "65535", "4294967295"])
def test_cluster_id_sentinels_mean_no_cluster_without_a_warning(
    tree: Path, sentinel: str, caplog: pytest.LogCaptureFixture
) -> None:
    for cpu in range(32):
        put(tree, f"{CPU}/cpu{cpu}/topology/cluster_id", sentinel)
    with caplog.at_level(logging.WARNING, logger="corepin.sysfs"):
        topo = discover(tree)
    assert {c.cluster for c in topo.cpus} == {None}
    assert not fallback_kinds(caplog)
