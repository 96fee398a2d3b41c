"""`corepin topology -o tree`: the pool tree socket -> die -> NUMA -> L3 -> core, indented; each
device (GPU, NIC, NVMe, accelerator) under its NUMA node, those without one under the machine."""

from __future__ import annotations

from corepin.cli.render._common import device_line, short_core_type, shown_devices, summary
from corepin.topology.devices import Device
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
    by_node: dict[int | None, list[Device]] = {}
    for device in shown_devices(topology):
        by_node.setdefault(device.numa, []).append(device)

    def devices_of(node: int | None, depth: int) -> None:
        for device in by_node.pop(node, []):
            lines.append(f"{'  ' * depth}{device_line(device)}: local CPUs {device.local_cpus}")

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
        if node.kind == "numa" and isinstance(node.id, int):
            devices_of(node.id, depth + 1)

    visit(topology.pool_tree(), 0)
    for numa in topology.numa_nodes:
        if numa.memory_only:
            lines.append(f"  NUMA node {numa.id}: memory only")
            devices_of(numa.id, 2)
    for node in sorted(by_node, key=lambda n: -1 if n is None else n):
        devices_of(node, 1)  # no NUMA node, or one the tree does not show
    if topology.offline_cpus:
        lines.append(f"  offline: CPUs {topology.offline_cpus}")
    return "\n".join(lines) + "\n"
