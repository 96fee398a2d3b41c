"""A real kernel with 4 NUMA nodes of 2 cores without SMT over 2 sockets (one L3 per socket
spanning two nodes): topology discovery, and NUMA placement of topology-aware against
kubelet-static on a churn trace through `corepin run`, judged from /proc against sysfs."""

from __future__ import annotations

import pytest

from vm import SHAPES, Guest
from vm import skip_reason as vm_skip_reason
from vm.checks import placement, topology, topology_mismatches

pytestmark = [
    pytest.mark.vm,
    pytest.mark.skipif(vm_skip_reason() is not None, reason=vm_skip_reason() or ""),
]

SHAPE = SHAPES["numa4-nosmt"]

#: a churn trace on which kubelet-static splits a 2-CPU run over two nodes (the shortest found by
#: replaying small traces through the simulator with this guest's topology)
TRACE = [
    ("add", "r0", 2),
    ("add", "r1", 3),
    ("remove", "r0", 0),
    ("add", "r2", 1),
    ("add", "r3", 2),
    ("add", "r4", 2),
]


def test_corepin_topology_is_the_shape_qemu_was_asked_for(vm_numa4_nosmt: Guest) -> None:
    data = topology(vm_numa4_nosmt)
    assert topology_mismatches(SHAPE, data) == []
    # asymmetric distances: the node on the same socket is nearer
    assert data["numa_nodes"][0]["distances"] == {"0": 10, "1": 11, "2": 21, "3": 21}


def test_topology_aware_keeps_runs_on_one_node_where_kubelet_static_does_not(
    vm_numa4_nosmt: Guest,
) -> None:
    got = placement(vm_numa4_nosmt, TRACE)
    assert len(got["nodes"]) == 4 and len(got["l3"]) == 2
    aware, static = got["topology-aware"], got["kubelet-static"]
    assert aware["numa"] == aware["l3"] == 1.0, aware["cpus"]
    assert static["numa"] < aware["numa"], static["cpus"]
