"""`corepin topology -o table`: one row per physical core, grouped by socket, NUMA node and L3,
then one row per device (GPU, NIC, NVMe, accelerator) with its NUMA node and local CPUs."""

from __future__ import annotations

from collections.abc import Sequence

from corepin.cli.render._common import short_core_type, shown_devices, summary
from corepin.core.cpuset import CPUSet
from corepin.topology.model import CPUInfo, Topology


def _cell(value: int | str | None) -> str:
    return "-" if value is None or value == "" else str(value)


def _sort_key(value: int | None) -> int:
    return -1 if value is None else value


def format_columns(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Left-aligned columns separated by two spaces, no trailing blanks."""
    widths = [len(h) for h in header]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))
    out = []
    for row in [header, *rows]:
        out.append("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip())
    return out


def _multi_core_l2(topology: Topology) -> bool:
    """True when some L2 instance is shared by more than one core (clusters, E-core modules)."""
    cores_per_l2: dict[int, set[int]] = {}
    for info in topology.cpus:
        if info.online and info.l2 is not None and info.core is not None:
            cores_per_l2.setdefault(info.l2, set()).add(info.core)
    return any(len(cores) > 1 for cores in cores_per_l2.values())


def render_table(topology: Topology) -> str:
    """The machine as a table, one row per physical core, with a summary line above it."""
    by_core: dict[int, list[CPUInfo]] = {}
    loose_offline: list[int] = []
    for info in topology.cpus:
        if info.core is None:
            if not info.online:
                loose_offline.append(info.cpu)
            continue
        by_core.setdefault(info.core, []).append(info)

    sockets = topology.socket_ids()
    show_die = len(topology.die_ids()) > len(sockets)
    show_l2 = _multi_core_l2(topology)
    show_type = any(c.core_type for c in topology.cpus)
    show_cluster = show_l2 and any(c.cluster is not None for c in topology.cpus)

    header = ["SOCKET"]
    if show_die:
        header.append("DIE")
    header += ["NUMA", "L3"]
    if show_cluster:
        header.append("CLUSTER")
    if show_l2:
        header.append("L2")
    header.append("CORE")
    if show_type:
        header.append("TYPE")
    header += ["CPUS", "FLAGS"]

    def first_online(members: list[CPUInfo]) -> CPUInfo:
        return next((m for m in members if m.online), members[0])

    cores = sorted(
        by_core.items(),
        key=lambda item: tuple(
            _sort_key(getattr(first_online(item[1]), attr))
            for attr in ("socket", "die", "numa", "l3", "l2", "core")
        ),
    )
    groups: list[list[list[str]]] = []
    last_socket: object = object()
    for core, members in cores:
        info = first_online(members)
        cpus = CPUSet(m.cpu for m in members)
        isolated = CPUSet(m.cpu for m in members if m.isolated)
        offline = CPUSet(m.cpu for m in members if not m.online)
        flags = []
        if offline:
            flags.append("offline" if offline == cpus else f"offline:{offline}")
        if isolated:
            flags.append("isolated" if isolated == cpus else f"isolated:{isolated}")
        row = [_cell(info.socket)]
        if show_die:
            row.append(_cell(info.die))
        row += [_cell(info.numa), _cell(info.l3)]
        if show_cluster:
            row.append(_cell(info.cluster))
        if show_l2:
            row.append(_cell(info.l2))
        row.append(str(core))
        if show_type:
            kind = short_core_type(info.core_type)
            row.append(f"{kind}-core" if kind in ("P", "E") else _cell(kind))
        row += [str(cpus), ",".join(flags)]
        if info.socket != last_socket:
            groups.append([])
            last_socket = info.socket
        groups[-1].append(row)

    lines = [summary(topology), ""]
    all_rows = [row for group in groups for row in group]
    formatted = format_columns(header, all_rows)
    lines.append(formatted[0])
    at = 1
    for i, group in enumerate(groups):
        if i:
            lines.append("")
        lines.extend(formatted[at : at + len(group)])
        at += len(group)
    devices = _device_lines(topology)
    if devices:
        lines.append("")
        lines.extend(devices)

    notes = []
    if loose_offline:
        notes.append(f"offline CPUs (topology unknown while offline): {CPUSet(loose_offline)}")
    if topology.isolated_cpus:
        notes.append(f"isolated CPUs (isolcpus): {topology.isolated_cpus}")
    for node in topology.numa_nodes:
        if node.memory_only:
            size = f", {_size(node.memory_kb)}" if node.memory_kb is not None else ""
            notes.append(f"NUMA node {node.id}: memory only, no CPUs{size}")
    if notes:
        lines.append("")
        lines.extend(notes)
    distances = _distance_lines(topology)
    if distances:
        lines.append("")
        lines.extend(distances)
    return "\n".join(lines) + "\n"


def _size(kb: int) -> str:
    if kb >= 1024 * 1024:
        return f"{kb / (1024 * 1024):.1f} GiB"
    return f"{kb / 1024:.0f} MiB"


def _device_lines(topology: Topology) -> list[str]:
    rows = [
        [d.address, d.kind, ",".join(d.names) or "-", _cell(d.numa), _cell(str(d.local_cpus))]
        for d in shown_devices(topology)
    ]
    if not rows:
        return []
    return format_columns(["DEVICE", "KIND", "NAMES", "NUMA", "LOCAL CPUS"], rows)


def _distance_lines(topology: Topology) -> list[str]:
    nodes = topology.numa_nodes
    if len(nodes) < 2 or not any(n.distances for n in nodes):
        return []
    header = ["NUMA distances", *(str(n.id) for n in nodes)]
    rows = [[f"node {n.id}", *(_cell(n.distances.get(m.id)) for m in nodes)] for n in nodes]
    return format_columns(header, rows)
