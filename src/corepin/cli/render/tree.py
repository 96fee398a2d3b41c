"""`corepin topology -o tree`: the pool tree socket -> die -> NUMA -> L3 -> core, indented."""

from __future__ import annotations

from corepin.cli.render._common import short_core_type, summary
from corepin.topology.model import PoolNode, Topology

_NAMES = {
    "machine": "machine",
    "socket": "socket",
    "die": "die",
    "numa": "NUMA node",
    "l3": "L3",
    "core": "core",
}


def render_tree(topology: Topology) -> str:
    """One line per pool-tree node down to cores; a core line lists its threads (CPUs)."""
    lines = [summary(topology)]
    isolated = topology.isolated_cpus

    def visit(node: PoolNode, depth: int) -> None:
        name = _NAMES.get(node.kind, node.kind)
        label = name if node.id is None else f"{name} {node.id}"
        pad = "  " * depth
        if node.kind == "core":
            extra = []
            info = topology.cpu(node.cpus.first())
            kind = short_core_type(info.core_type)
            if kind:
                extra.append(f"{kind}-core" if kind in ("P", "E") else kind)
            iso = node.cpus & isolated
            if iso:
                extra.append("isolated" if iso == node.cpus else f"isolated {iso}")
            suffix = f"  [{', '.join(extra)}]" if extra else ""
            lines.append(f"{pad}{label}: threads {node.cpus}{suffix}")
            return
        lines.append(f"{pad}{label}: CPUs {node.cpus} ({len(node.cpus)})")
        for child in node.children:
            if child.kind == "die" and len(node.children) == 1:
                for grandchild in child.children:  # one die per socket: say nothing about it
                    visit(grandchild, depth + 1)
            else:
                visit(child, depth + 1)

    visit(topology.pool_tree(), 0)
    for numa in topology.numa_nodes:
        if numa.memory_only:
            lines.append(f"  NUMA node {numa.id}: memory only")
    if topology.offline_cpus:
        lines.append(f"  offline: CPUs {topology.offline_cpus}")
    return "\n".join(lines) + "\n"
