"""A real kernel with one socket and one NUMA node split into two L3 caches (2 dies x 3 cores x
SMT2): topology discovery, and placement quality of topology-aware against kubelet-static on a
churn trace through `corepin run`, judged from the runs' /proc against the guest's sysfs."""

from __future__ import annotations

import pytest

from vm import SHAPES, Guest
from vm import skip_reason as vm_skip_reason
from vm.checks import placement, topology, topology_mismatches

pytestmark = [
    pytest.mark.vm,
    pytest.mark.skipif(vm_skip_reason() is not None, reason=vm_skip_reason() or ""),
]

SHAPE = SHAPES["l3x2"]

#: 3, 4, 3 and 2 CPUs: kubelet-static (in the simulator with this guest's topology) takes 0-2,
#: then 4-7 and 3,8-9 across both L3s; topology-aware keeps every run within one L3
TRACE = [("add", "r1", 3), ("add", "r2", 4), ("add", "r3", 3), ("add", "r4", 2)]


def test_corepin_topology_is_the_shape_qemu_was_asked_for(vm_l3x2: Guest) -> None:
    data = topology(vm_l3x2)
    assert topology_mismatches(SHAPE, data) == []
    assert len({r["l3"] for r in data["cpus"]}) == 2 and len(data["numa_nodes"]) == 1


def test_topology_aware_keeps_every_run_on_one_l3_where_kubelet_static_does_not(
    vm_l3x2: Guest,
) -> None:
    got = placement(vm_l3x2, TRACE)
    assert [sorted(u) for u in got["l3"]] == [list(range(0, 6)), list(range(6, 12))]
    aware, static = got["topology-aware"], got["kubelet-static"]
    assert aware["l3"] == 1.0, aware["cpus"]
    assert static["l3"] < aware["l3"], static["cpus"]
    assert aware["numa"] == static["numa"] == 1.0
