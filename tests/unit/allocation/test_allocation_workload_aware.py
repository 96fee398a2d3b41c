"""The `workload-aware` policy: one behaviour per workload family."""

from __future__ import annotations

import pytest

import support.alloc_topologies as T
from corepin.allocation.types import Request
from corepin.allocation.workload_aware import WorkloadAwarePolicy, parse_usage
from corepin.core.cpuset import CPUSet
from corepin.core.errors import AllocationError, RequestError

POLICY = WorkloadAwarePolicy()


def test_memory_bound_spreads_evenly_over_all_numa_nodes_alternating_sockets() -> None:
    topo = T.two_numa_per_socket_32_cpus()  # 4 nodes, 2 per socket
    d = POLICY.decide(topo, Request(8, workload="memory-bound"), topo.online_cpus)
    assert len(d.cpus) == 8
    assert str(d.mems) == "0-3"
    per_node = [len(d.cpus & topo.cpus_in_numa_nodes(i)) for i in range(4)]
    assert per_node == [2, 2, 2, 2]


def test_memory_bound_with_fewer_cpus_than_nodes_alternates_sockets_first() -> None:
    topo = T.two_numa_per_socket_32_cpus()
    d = POLICY.decide(topo, Request(2, workload="memory-bound"), topo.online_cpus)
    assert len(topo.sockets_in(d.cpus)) == 2
    assert str(d.mems) == "0,2"


def test_memory_bound_caps_a_nearly_full_node_and_gives_the_rest_to_the_others() -> None:
    topo = T.two_numa_per_socket_32_cpus()
    avail = topo.online_cpus - CPUSet.parse("0-3,16-18")  # node 0 has one CPU left (19)
    d = POLICY.decide(topo, Request(10, workload="memory-bound"), avail)
    per_node = [len(d.cpus & topo.cpus_in_numa_nodes(i)) for i in range(4)]
    assert per_node == [1, 3, 3, 3]


def test_memory_bound_whole_sockets_reserves_the_fewest_entirely_free_sockets() -> None:
    topo = T.two_numa_per_socket_32_cpus()
    avail = topo.online_cpus - CPUSet.of(0)
    request = Request(4, workload="memory-bound", options={"whole-sockets": "true"})
    d = POLICY.decide(topo, request, avail)
    socket1 = topo.cpus_in_sockets(1)
    assert d.cpus <= socket1
    assert d.withheld == socket1
    assert str(d.mems) == "2-3"


def test_memory_bound_whole_sockets_fails_when_no_socket_is_entirely_free() -> None:
    topo = T.two_numa_per_socket_32_cpus()
    avail = topo.online_cpus - CPUSet.of(0, 8)
    with pytest.raises(AllocationError) as info:
        POLICY.decide(topo, Request(2, workload="memory-bound", level="socket"), avail)
    assert info.value.reason == "level_unsatisfiable"


def test_cpu_bound_takes_one_thread_of_distinct_idle_cores_and_withholds_the_siblings() -> None:
    topo = T.two_sockets_24_cpus()  # cores 0-11, siblings +12
    avail = topo.online_cpus - CPUSet.of(13)  # core 1 is no longer idle
    d = POLICY.decide(topo, Request(4, workload="cpu-bound"), avail)
    cores = topo.cores_in(d.cpus)
    assert len(cores) == 4, "one thread per core"
    assert 1 not in cores, "a core with a busy sibling is not idle"
    assert len(topo.sockets_in(d.cpus)) == 1
    assert d.withheld == topo.cpus_in_cores(*cores)
    assert str(d.cpus) == "0,2-4"


def test_cpu_bound_prefers_the_socket_that_fits_best() -> None:
    topo = T.two_sockets_24_cpus()
    avail = topo.online_cpus - CPUSet.parse("0-2")  # socket 0 has 3 idle cores left
    d = POLICY.decide(topo, Request(3, workload="cpu-bound"), avail)
    assert str(d.cpus) == "3-5"


def test_cpu_bound_without_enough_idle_cores_is_unsatisfiable() -> None:
    topo = T.one_socket_8_cpus()
    avail = CPUSet.parse("0-2,4")  # idle cores: 0 only (1,2 lost siblings 5,6)
    with pytest.raises(AllocationError) as info:
        POLICY.decide(topo, Request(2, workload="cpu-bound"), avail)
    assert info.value.reason == "not_enough_idle_cores"


def test_io_bound_packs_onto_the_free_siblings_of_partly_used_cores_first() -> None:
    topo = T.one_socket_8_cpus()
    avail = CPUSet.parse("1-7") - CPUSet.of(1)  # cores 0 and 1 half used: 4 and 5 free
    d = POLICY.decide(topo, Request(4, workload="io-bound"), avail)
    assert str(d.cpus) == "2,4-6"
    assert len(topo.cores_in(d.cpus)) == 3


def test_io_bound_on_an_empty_machine_takes_whole_cores() -> None:
    topo = T.four_l3_per_numa_64_cpus()
    d = POLICY.decide(topo, Request(4, workload="io-bound"), topo.online_cpus)
    assert str(d.cpus) == "0-1,32-33"


def test_best_effort_shares_the_least_shared_cpus_and_reserves_nothing() -> None:
    topo = T.one_socket_8_cpus()
    usage = {0: 2, 1: 1, 2: 0, 3: 4}
    d = POLICY.decide(topo, Request(2, workload="best-effort"), CPUSet.parse("0-3"), usage=usage)
    assert str(d.cpus) == "1-2"
    assert not d.withheld


def test_best_effort_reads_usage_from_the_option_too() -> None:
    topo = T.one_socket_8_cpus()
    request = Request(1, workload="best-effort", options={"usage": "0:3,1:3,2:1"})
    d = POLICY.decide(topo, request, CPUSet.parse("0-2"))
    assert str(d.cpus) == "2"


def test_best_effort_never_uses_isolated_cpus_unless_allowed() -> None:
    topo = T.isolated_8_cpus()
    d = POLICY.decide(topo, Request(4, workload="best-effort"), topo.online_cpus)
    assert d.cpus.isdisjoint(topo.isolated_cpus)
    with pytest.raises(AllocationError):
        POLICY.decide(topo, Request(5, workload="best-effort"), topo.online_cpus)
    allowed = Request(5, workload="best-effort", options={"allow-isolated": "true"})
    assert len(POLICY.decide(topo, allowed, topo.online_cpus).cpus) == 5


def test_no_workload_family_is_the_topology_aware_choice() -> None:
    topo = T.four_l3_per_numa_64_cpus()
    d = POLICY.decide(topo, Request(4), CPUSet.parse("1-31,33-63"))
    assert str(d.cpus) == "1-2,33-34"
    assert d.policy == "workload-aware"


@pytest.mark.parametrize("text", ["0:x", "3", "a:1", "1:-2"])
def test_a_malformed_usage_option_is_a_request_error_naming_it(text: str) -> None:
    with pytest.raises(RequestError, match="usage"):
        parse_usage(text)


def test_every_family_is_deterministic() -> None:
    topo = T.two_numa_per_socket_32_cpus()
    avail = topo.online_cpus - CPUSet.parse("3,9,17")
    for family in ("memory-bound", "cpu-bound", "io-bound", "best-effort"):
        a = POLICY.decide(topo, Request(5, workload=family), avail)
        b = WorkloadAwarePolicy().decide(topo, Request(5, workload=family), avail)
        assert a == b, family
