"""Small helpers shared by the renderers."""

from __future__ import annotations

from corepin.topology.devices import Device
from corepin.topology.model import Topology

#: how the pictures name a device kind
KIND_LABELS = {"gpu": "GPU", "nic": "NIC", "nvme": "NVMe", "accelerator": "accelerator"}


def plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def summary(topology: Topology) -> str:
    """One line: how many sockets, NUMA nodes, L3 instances, cores and CPUs the machine has."""
    parts = [plural(len(topology.socket_ids()), "socket")]
    dies = topology.die_ids()
    if len(dies) > len(topology.socket_ids()):
        parts.append(plural(len(dies), "die"))
    numa_total = len(topology.numa_nodes)
    memory_only = sum(1 for n in topology.numa_nodes if n.memory_only)
    numa = plural(numa_total, "NUMA node")
    if memory_only:
        numa += f" ({memory_only} memory-only)"
    parts.append(numa)
    if topology.l3_ids():
        parts.append(plural(len(topology.l3_ids()), "L3 cache"))
    parts.append(plural(len(topology.core_ids()), "core"))
    online, present = len(topology.online_cpus), len(topology.present_cpus)
    cpus = plural(present, "CPU")
    if online != present:
        cpus += f" ({online} online)"
    parts.append(cpus)
    if topology.threads_per_core > 1:
        parts.append(f"{topology.threads_per_core} threads per core")
    return ", ".join(parts)


def short_core_type(core_type: str | None) -> str:
    """'P' for performance cores, 'E' for efficiency cores, else the kernel's name (or '')."""
    if not core_type:
        return ""
    low = core_type.lower()
    if low in ("p", "performance", "cpu_core", "core", "big", "pcore", "p-core"):
        return "P"
    if low in ("e", "efficiency", "efficient", "cpu_atom", "atom", "little", "ecore", "e-core"):
        return "E"
    return core_type


def shown_devices(topology: Topology) -> list[Device]:
    """The devices the table, tree and picture show: GPUs, NICs, NVMe and accelerators (bridges
    and the like appear in the JSON only), by address."""
    return [d for d in topology.devices if d.kind in KIND_LABELS]


def device_line(device: Device) -> str:
    """`GPU 0000:81:00.0 (card0, renderD128, nvidia0)`: the kind, the address, the names."""
    names = f" ({', '.join(device.names)})" if device.names else ""
    return f"{KIND_LABELS.get(device.kind, device.kind)} {device.address}{names}"
