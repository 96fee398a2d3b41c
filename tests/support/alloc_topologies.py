"""Named in-code topologies for the allocation tests (no files), each named by its shape and its
CPU count (the synthetic machines of `corepin.testing.machines` are numbered differently and
have names of their own).

`build(...)` numbers CPUs the way Linux does on x86: the first thread of every core first
(0..cores-1), then the second threads (cores..2*cores-1), so CPU i and i+cores are SMT siblings.
`core` ids follow the model's convention (lowest sibling CPU id).
"""

from __future__ import annotations

from collections.abc import Iterable

from corepin.core.cpuset import CPUSet
from corepin.topology.model import CPUInfo, NUMANode, Topology


def build(
    sockets: int = 1,
    numa_per_socket: int = 1,
    l3_per_numa: int = 1,
    cores_per_l3: int = 4,
    threads: int = 2,
    *,
    isolated: Iterable[int] = (),
    offline: Iterable[int] = (),
    name: str = "",
    with_l3: bool = True,
) -> Topology:
    iso = set(isolated)
    off = set(offline)
    cores_total = sockets * numa_per_socket * l3_per_numa * cores_per_l3
    rows: list[CPUInfo] = []
    node_cpus: dict[int, list[int]] = {}
    core_index = 0
    for s in range(sockets):
        for nn in range(numa_per_socket):
            node = s * numa_per_socket + nn
            for ll in range(l3_per_numa):
                l3 = node * l3_per_numa + ll
                for _ in range(cores_per_l3):
                    cpus = [core_index + k * cores_total for k in range(threads)]
                    for cpu in cpus:
                        node_cpus.setdefault(node, []).append(cpu)
                        if cpu in off:
                            rows.append(CPUInfo.offline(cpu))
                            continue
                        rows.append(
                            CPUInfo(
                                cpu,
                                socket=s,
                                die=0,
                                numa=node,
                                l3=l3 if with_l3 else None,
                                l2=cpus[0],
                                core=min(c for c in cpus if c not in off),
                                isolated=cpu in iso,
                            )
                        )
                    core_index += 1
    nodes_total = sockets * numa_per_socket
    nodes = []
    for node in range(nodes_total):
        dist = {}
        for other in range(nodes_total):
            if other == node:
                dist[other] = 10
            elif other // numa_per_socket == node // numa_per_socket:
                dist[other] = 12
            else:
                dist[other] = 32
        online_cpus = [c for c in node_cpus.get(node, []) if c not in off]
        nodes.append(NUMANode(node, CPUSet(online_cpus), dist))
    return Topology(rows, nodes, name=name)


def one_socket_8_cpus() -> Topology:
    """1 socket, 1 NUMA node, 1 L3, 4 cores x 2 threads (8 CPUs)."""
    return build(1, 1, 1, 4, 2, name="one-socket-8-cpus")


def two_sockets_24_cpus() -> Topology:
    """2 sockets x 1 NUMA x 1 L3 x 6 cores x 2 threads (24 CPUs), as DualSocketHT."""
    return build(2, 1, 1, 6, 2, name="two-sockets-24-cpus")


def two_numa_per_socket_32_cpus() -> Topology:
    """2 sockets x 2 NUMA x 1 L3 x 4 cores x 2 threads (32 CPUs)."""
    return build(2, 2, 1, 4, 2, name="two-numa-per-socket-32-cpus")


def four_l3_per_numa_64_cpus() -> Topology:
    """EPYC-like: 2 sockets x 1 NUMA x 4 L3 x 4 cores x 2 threads (64 CPUs)."""
    return build(2, 1, 4, 4, 2, name="four-l3-per-numa-64-cpus")


def no_smt_16_cpus() -> Topology:
    """1 socket x 2 NUMA x 2 L3 x 4 cores x 1 thread (16 CPUs)."""
    return build(1, 2, 2, 4, 1, name="no-smt-16-cpus")


def isolated_8_cpus() -> Topology:
    """one_socket_8_cpus with CPUs 2,3,6,7 (cores 2 and 3) isolated."""
    return build(1, 1, 1, 4, 2, isolated=(2, 3, 6, 7), name="isolated-8-cpus")


def offline_24_cpus() -> Topology:
    """two_sockets_24_cpus with CPUs 5 and 17 (both threads of core 5) and 20 offline."""
    return build(2, 1, 1, 6, 2, offline=(5, 17, 20), name="offline-24-cpus")


def big(cpus: int) -> Topology:
    """A large machine: 256 CPUs = 2 sockets x 2 NUMA x 2 L3 x 16 cores x 2;
    1024 CPUs = 4 sockets x 4 NUMA x 4 L3 x 8 cores x 2 (16 NUMA nodes)."""
    if cpus == 64:
        return build(2, 1, 2, 8, 2, name="64")
    if cpus == 256:
        return build(2, 2, 2, 16, 2, name="256")
    if cpus == 1024:
        return build(4, 4, 4, 8, 2, name="1024")
    raise ValueError(cpus)


NAMED = {
    "one-socket-8-cpus": one_socket_8_cpus,
    "two-sockets-24-cpus": two_sockets_24_cpus,
    "two-numa-per-socket-32-cpus": two_numa_per_socket_32_cpus,
    "four-l3-per-numa-64-cpus": four_l3_per_numa_64_cpus,
    "no-smt-16-cpus": no_smt_16_cpus,
    "isolated-8-cpus": isolated_8_cpus,
    "offline-24-cpus": offline_24_cpus,
}
