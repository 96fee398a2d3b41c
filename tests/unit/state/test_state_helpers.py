"""Shared helpers of the state-layer tests: small named topologies built from plain records."""

from __future__ import annotations

from collections.abc import Iterable

from corepin.core.cpuset import CPUSet
from corepin.topology.model import CPUInfo, NUMANode, Topology


def machine(
    cpus: int = 8,
    *,
    numa_nodes: int = 2,
    smt: int = 2,
    offline: Iterable[int] = (),
    absent: Iterable[int] = (),
) -> Topology:
    """One socket, `numa_nodes` equal NUMA nodes (one L3 each), SMT siblings `cpu` and
    `cpu + cpus/smt` (Linux numbering); `offline` CPUs present but offline, `absent` not listed."""
    off = set(offline)
    gone = set(absent)
    cores = cpus // smt
    per_node = max(1, cores // numa_nodes)
    rows = []
    for cpu in range(cpus):
        if cpu in gone:
            continue
        core = cpu % cores
        node = min(core // per_node, numa_nodes - 1)
        if cpu in off:
            rows.append(CPUInfo.offline(cpu))
        else:
            rows.append(CPUInfo(cpu=cpu, socket=0, die=0, numa=node, l3=node, l2=core, core=core))
    nodes = []
    for node in range(numa_nodes):
        members = CPUSet(r.cpu for r in rows if r.numa == node)
        nodes.append(
            NUMANode(node, members, {n: 10 if n == node else 20 for n in range(numa_nodes)})
        )
    return Topology(rows, nodes, name=f"test-{cpus}cpu")
