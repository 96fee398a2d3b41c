"""Discovery against real-machine sysfs trees from ../shared/fixtures/sysfs.

Each machine directory holds `sys/` and `expected.json` (ground truth from hwloc, util-linux or
the NRI plugins' tests, see its SOURCE.txt). Group labels are free: what must agree is how CPUs
are grouped into sockets, NUMA nodes, physical cores and L3 instances, and the online set; for
upstream-asserted machines also L3 sets, isolated CPUs, P/E core kinds and NUMA distances.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from corepin import CPUSet, Topology
from corepin.topology.discover import discover
from support.paths import SYSFS_FIXTURES

FIXTURES = SYSFS_FIXTURES
MACHINES = sorted(p.name for p in FIXTURES.glob("*") if (p / "expected.json").exists())


def machine(name: str) -> Path:
    path = FIXTURES / name
    if not (path / "expected.json").exists():
        pytest.skip(f"fixture {path} is not available")
    return path


def partition(labels: dict[int, Any], cpus: set[int]) -> set[frozenset[int]]:
    groups: dict[Any, set[int]] = {}
    for cpu in cpus:
        groups.setdefault(labels.get(cpu, ("missing", cpu)), set()).add(cpu)
    return {frozenset(g) for g in groups.values()}


def cpulist(text: str | None) -> set[int]:
    return set(CPUSet.parse(text or ""))


def compare_with_expected(path: Path) -> list[str]:
    """The parity tool's comparison, done here on `discover(path).to_json()`."""
    exp = json.loads((path / "expected.json").read_text())
    out = discover(path).to_json()
    got = {row["cpu"]: row for row in out["cpus"]}
    problems: list[str] = []
    if "cpus" in exp:
        cpus = {int(c) for c in exp["cpus"]}
        offline = sorted(c for c in cpus if not got.get(c, {}).get("online"))
        if offline:
            problems.append(f"expected online but not: {offline}")
        checks = {
            "socket": ("socket", lambda e: e["package"]),
            "core": ("core", lambda e: e["thread_siblings"]),
            "l3": ("l3", lambda e: e.get("l3_cpus")),
        }
        if "cgroup-cpuset-restricted" not in path.name:
            checks["numa"] = ("numa", lambda e: e["numa"])
        for name, (field, label) in checks.items():
            want = partition({int(c): label(e) for c, e in exp["cpus"].items()}, cpus)
            have = partition({c: row.get(field) for c, row in got.items()}, cpus)
            if want != have:
                problems.append(f"{name} grouping differs")
    asserted = exp.get("asserted_by_upstream")
    if asserted is not None:
        l3: dict[int, str] = {}
        for row in asserted.get("cache_discovery", []):
            if row["level"] == 3:
                l3[row["cpu"]] = row["shared_cpus"]
        for cpu, shared in asserted.get("llc_cpuset_by_cpu", {}).items():
            l3[int(cpu)] = shared
        for cpu, shared in l3.items():
            label = got[cpu]["l3"]
            mates = {c for c, row in got.items() if label is not None and row["l3"] == label}
            if mates != cpulist(shared):
                problems.append(f"L3 of CPU {cpu}: want {shared}, got {sorted(mates)}")
        iso = {c for c, row in got.items() if row["isolated"]}
        if iso != cpulist(exp.get("isolated_cpus_sysfs")):
            problems.append(f"isolated CPUs differ: {sorted(iso)}")
        for key, value in asserted.items():
            if key.startswith(("p_cores", "e_cores")):
                want = cpulist(value)
                kinds = {got[c]["core_type"] for c in want}
                others = {row["core_type"] for c, row in got.items() if c not in want}
                if None in kinds or len(kinds) != 1 or kinds & others:
                    problems.append(f"{key}: core types {kinds} vs others {others}")
        nodes = {n["id"]: n for n in out["numa_nodes"]}
        for node, spec in asserted.get("closest_nodes_by_distance", {}).items():
            dist = nodes[int(node)]["distances"]
            for group, value in zip(spec["groups"], spec["distances"], strict=True):
                for other in group:
                    if dist.get(str(other)) != value:
                        problems.append(f"distance {node}->{other} is {dist.get(str(other))}")
    return problems


@pytest.mark.parametrize("name", MACHINES or ["(no fixtures)"])
def test_discovered_topology_groups_cpus_like_the_upstream_ground_truth(name: str) -> None:
    assert compare_with_expected(machine(name)) == []


@pytest.mark.parametrize("name", MACHINES or ["(no fixtures)"])
def test_discovered_topology_survives_a_json_round_trip(name: str) -> None:
    topo = discover(machine(name))
    assert Topology.from_json(json.loads(json.dumps(topo.to_json()))) == topo


@pytest.mark.parametrize("name", MACHINES or ["(no fixtures)"])
def test_every_core_l3_and_numa_value_is_unique_machine_wide_and_online_cpus_have_a_core(
    name: str,
) -> None:
    topo = discover(machine(name))
    for info in topo.cpus:
        if info.online:
            assert info.core == min(topo.siblings_of(info.cpu))
        else:
            assert (info.socket, info.core, info.l3, info.numa) == (None, None, None, None)
    for l3 in topo.l3_ids():
        assert len(topo.sockets_in(topo.cpus_in_l3s(l3))) == 1


def test_epyc_naples_has_16_l3_named_by_cache_id_and_8_numa_nodes_read_from_cpumap() -> None:
    topo = discover(machine("amd-2s-epyc7451-naples-16l3"))
    assert topo.l3_ids() == list(range(16))
    assert topo.cpus_in_l3s(0) == CPUSet.parse("0-2,48-50")
    assert [n.id for n in topo.numa_nodes] == list(range(8))
    assert topo.numa_node(1).cpus == CPUSet.parse("6-11,54-59")
    assert topo.threads_per_core == 2
    assert {c.die for c in topo.cpus} == {0}  # no die_id files: one die per package


def test_kunpeng_keeps_firmware_package_ids_and_names_l3_by_lowest_cpu_without_cache_id() -> None:
    topo = discover(machine("arm-kunpeng920-2s-clusters"))
    assert topo.socket_ids() == [36, 8442]
    assert topo.l3_ids() == [0, 32, 64, 96]
    assert {c.die for c in topo.cpus} == {None}  # die_id is -1 on this platform
    assert topo.cpu(0).cluster == topo.cpu(3).cluster != topo.cpu(4).cluster
    assert topo.numa_node(0).distances == {0: 10, 1: 16, 2: 32, 3: 33}


def test_haswell_offline_cpus_have_null_fields_and_offline_node0_leaves_package0_without_numa() -> (
    None
):
    topo = discover(machine("intel-2s-haswell-offline-cpu0-node0"))
    assert topo.offline_cpus == CPUSet.parse("0-3,21-23")
    assert topo.cpu(0).to_json()["socket"] is None
    assert topo.cpus_in_l3s(topo.l3_of(4) or 0) == CPUSet.parse("4,6,8,10,12,14,16,18,20")
    assert [n.id for n in topo.numa_nodes] == [1]
    assert topo.numa_of(4) is None and topo.numa_of(5) == 1
    # the distance row has two entries (possible nodes 0-1) while only node 1 is online
    assert topo.numa_node(1).distances == {1: 10}
    assert topo.numa_node(1).cpus == CPUSet.parse("5,7,9,11,13,15,17,19")


def test_qemu_2p4die_machine_has_8_dies_16_numa_nodes_and_one_l3_per_die() -> None:
    topo = discover(machine("intel-fake-2p4die-16numa-ht"))
    assert len(topo.die_ids()) == 8
    assert len(topo.numa_node_ids()) == 16
    assert len(topo.l3_ids()) == 8
    assert topo.numa_node(3).distances[3] == 10 and topo.numa_node(3).distances[15] == 20


def test_alder_lake_reports_performance_and_efficiency_cores_and_shared_efficiency_l2() -> None:
    topo = discover(machine("intel-hybrid-alderlake-16cpu-nri-sample1"))
    kinds = {c.cpu: c.core_type for c in topo.cpus}
    assert {kinds[c] for c in range(8)} == {"performance"}
    assert {kinds[c] for c in range(8, 16)} == {"efficiency"}
    assert topo.cpus_in_l2s(topo.l2_of(8) or 0) == CPUSet.parse("8-11")
    assert topo.siblings_of(2) == CPUSet.of(2, 3)
    assert topo.siblings_of(9) == CPUSet.of(9)
    # cluster ids asserted by nri-plugins: 0-1 -> 0, 2-3 -> 8, ..., 8-11 -> 32, 12-15 -> 40
    assert [topo.cpu(c).cluster for c in (0, 1, 2, 7, 8, 11, 12, 15)] == [
        0,
        0,
        8,
        24,
        32,
        32,
        40,
        40,
    ]


def test_intel_2s_ignores_possible_but_absent_cpus() -> None:
    topo = discover(machine("intel-2s-8c-ht-32cpu"))
    assert topo.present_cpus == CPUSet.range(0, 31)
    assert topo.numa_node(0).distances == {0: 10, 1: 21}


def test_each_fallback_kind_is_logged_once_per_discovery(caplog: pytest.LogCaptureFixture) -> None:
    path = machine("amd-2s-epyc7451-naples-16l3")
    with caplog.at_level(logging.WARNING, logger="corepin.sysfs"):
        discover(path)
    kinds = [r.getMessage().split()[2] for r in caplog.records if r.name == "corepin.sysfs"]
    assert "kind=die_id_missing" in kinds
    assert len(kinds) == len(set(kinds))
