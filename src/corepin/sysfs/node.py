"""Reader of sys/devices/system/node: NUMA nodes, their CPUs, distances and memory.

The whole directory is optional (a kernel built without CONFIG_NUMA has none; discovery then
puts every CPU in node 0). Inside it:

| file                   | when absent                                                     |
|------------------------|-----------------------------------------------------------------|
| `online`               | every `nodeN/` directory counts as online                       |
| `nodeN/cpulist`        | `nodeN/cpumap` (hex mask, what pre-2.6.27 kernels offered)      |
| `nodeN/distance`       | the node has no distances                                       |
| `nodeN/meminfo`        | memory size unknown (no warning: it is informational)           |

`nodeN/distance` is one row of numbers in the order of the kernel's *online* nodes, not of
node ids: with sparse ids (nodes 0, 2, 5) the second number is the distance to node 2. When the
row length matches neither the online nodes, nor the possible nodes, nor the node directories,
the row is dropped with a warning rather than mapped to the wrong nodes. Only nodes listed
online (or present as directories when `online` is missing) are returned; a node with no CPUs
is a memory-only node.
"""

from __future__ import annotations

import os

from corepin.core.cpuset import CPUSet
from corepin.core.errors import SysfsError
from corepin.sysfs.files import SysfsFiles
from corepin.sysfs.records import NodeRecord, NodeSystem

__all__ = ["NODE_DIR", "map_distance_row", "parse_meminfo_total", "read_node_system"]

NODE_DIR = "sys/devices/system/node"
_join = os.path.join


def read_node_system(files: SysfsFiles) -> NodeSystem | None:
    base = files.path(NODE_DIR)
    names = files.listdir(base, required=False)
    if names is None:
        files.note("node_dir_missing", base, "no NUMA information: every CPU is in node 0")
        return None
    dirs = sorted(int(n[4:]) for n in names if n.startswith("node") and n[4:].isdigit())
    online_path = _join(base, "online")
    online = files.cpulist(online_path, required=False)
    if online is None:
        files.note("node_online_missing", online_path, "every nodeN directory counts as online")
    possible = files.cpulist(_join(base, "possible"), required=False)
    orders: list[list[int]] = []
    if online is not None:
        orders.append(online.sorted())
    if possible is not None:
        orders.append(possible.sorted())
    orders.append(dirs)

    nodes: list[NodeRecord] = []
    for node in dirs:
        if online is not None and node not in online:
            continue
        node_dir = _join(base, f"node{node}")
        cpus = files.cpus_list_or_mask(
            _join(node_dir, "cpulist"),
            _join(node_dir, "cpumap"),
            kinds=("node_cpulist_missing", "node_cpus_missing"),
            default=CPUSet(),
            action="the node has no CPUs",
        )
        dist_path = _join(node_dir, "distance")
        row = files.text(dist_path, required=False)
        distances: dict[int, int] = {}
        if row is None:
            files.note("node_distance_missing", dist_path, "no NUMA distances")
        else:
            distances = map_distance_row(files, dist_path, node, row, orders)
        mem_path = _join(node_dir, "meminfo")
        meminfo = files.text(mem_path, required=False)
        memory = parse_meminfo_total(mem_path, meminfo) if meminfo is not None else None
        nodes.append(NodeRecord(node, cpus, distances, memory))
    return NodeSystem(tuple(nodes), online=online, possible=possible)


def map_distance_row(
    files: SysfsFiles, path: str, node: int, row: str, orders: list[list[int]]
) -> dict[int, int]:
    """Map a `distance` row onto node ids, trying the candidate node orders in turn."""
    try:
        values = [int(v) for v in row.split()]
    except ValueError:
        raise SysfsError(path, f"expected distances (integers), got {row[:80]!r}") from None
    if not values:
        return {}
    for order in orders:
        if len(order) == len(values) and node in order:
            return dict(zip(order, values, strict=True))
    files.note(
        "node_distance_length",
        path,
        f"ignoring a row of {len(values)} distances that matches no list of nodes",
    )
    return {}


def parse_meminfo_total(path: str, text: str) -> int | None:
    """`MemTotal` in kB from a node meminfo (`Node 0 MemTotal:  32823132 kB`)."""
    for line in text.splitlines():
        words = line.split()
        if "MemTotal:" in words:
            at = words.index("MemTotal:")
            try:
                return int(words[at + 1])
            except (IndexError, ValueError):
                raise SysfsError(path, f"unreadable MemTotal line {line.strip()!r}") from None
    return None
