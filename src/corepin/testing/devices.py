"""PCI devices for synthetic machines: build them, attach them to a `Topology`, write them out.

`gpu(...)`, `nic(...)`, `nvme(...)` and `accelerator(...)` make a `Device` with the class code,
ids and names such a device has; `with_devices(topology, *devices)` attaches them, giving each
device without local CPUs the CPUs of its NUMA node (all online CPUs when it has none), as a
kernel reports them. "2 sockets, a GPU on node 1, a NIC on node 0":

    with_devices(dual_socket_ht(), gpu("0000:81:00.0", numa=1), nic("0000:01:00.0", numa=0))

`write_pci_devices(devices, root)` lays the devices out as Linux does (`write_sysfs_tree` calls
it for `topology.devices`): the function's directory `sys/devices/pci<domain>:<bus>/<address>/`
with `class`, `vendor`, `device`, `numa_node` (-1 for none) and `local_cpulist`, the symlink
`sys/bus/pci/devices/<address>` to it, and a directory per name: `net/<ifname>`,
`nvme/<ctrl>` and `nvme/<ctrl>/<ctrl>nN`, `block/<name>`, `drm/card*`, `drm/renderD*`,
`accel/accel*`; an `nvidiaN` name becomes the NVIDIA driver's
`proc/driver/nvidia/gpus/<address>/information` (`Device Minor: N`). Where a name goes follows
from its form; any other name is a network interface for a NIC and a block device otherwise.
Discovery gives the names back in `corepin.sysfs.pci.name_order`, which these builders and
`with_devices` use, so `discover(write_sysfs_tree(t)) == t` holds with devices too.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path

from corepin.core.cpuset import CPUSet
from corepin.core.record import replace
from corepin.sysfs.pci import NVIDIA_VENDOR, name_order
from corepin.topology.devices import Device
from corepin.topology.model import Topology

__all__ = [
    "accelerator",
    "gpu",
    "nic",
    "nvme",
    "with_devices",
    "write_pci_devices",
]

_DRM = re.compile(r"^(card|renderD)\d+$")
#: no local CPUs given: `with_devices` gives the device its NUMA node's
_NO_CPUS = CPUSet()


def _ordered(names: Iterable[str], pci_class: int) -> tuple[str, ...]:
    hint = "" if pci_class >> 16 == 0x02 else "block"
    return tuple(sorted(names, key=lambda n: name_order(n, hint)))


def gpu(
    address: str,
    *,
    numa: int | None = None,
    index: int = 0,
    nvidia: bool = True,
    local_cpus: CPUSet = _NO_CPUS,
) -> Device:
    """A 3D controller (class 0x030200): `card<index>`, `renderD<128+index>`, and with `nvidia`
    an NVIDIA one (vendor 0x10de, an H100's id) with `nvidia<index>`."""
    names = [f"card{index}", f"renderD{128 + index}"]
    if nvidia:
        names.append(f"nvidia{index}")
    return Device(
        address,
        pci_class=0x030200,
        vendor=NVIDIA_VENDOR if nvidia else 0x1002,
        device=0x2330 if nvidia else 0x74A1,
        numa=numa,
        local_cpus=local_cpus,
        names=_ordered(names, 0x030200),
    )


def nic(
    address: str,
    *,
    numa: int | None = None,
    ifname: str = "eth0",
    local_cpus: CPUSet = _NO_CPUS,
) -> Device:
    """An Ethernet controller (class 0x020000, Mellanox ConnectX-6 ids) named `ifname`."""
    return Device(
        address,
        pci_class=0x020000,
        vendor=0x15B3,
        device=0x101B,
        numa=numa,
        local_cpus=local_cpus,
        names=(ifname,),
    )


def nvme(
    address: str,
    *,
    numa: int | None = None,
    index: int = 0,
    namespaces: int = 1,
    local_cpus: CPUSet = _NO_CPUS,
) -> Device:
    """An NVMe controller (class 0x010802) `nvme<index>` with block devices `nvme<index>n1..`."""
    names = [f"nvme{index}", *(f"nvme{index}n{n}" for n in range(1, namespaces + 1))]
    return Device(
        address,
        pci_class=0x010802,
        vendor=0x144D,
        device=0xA80A,
        numa=numa,
        local_cpus=local_cpus,
        names=_ordered(names, 0x010802),
    )


def accelerator(
    address: str,
    *,
    numa: int | None = None,
    index: int = 0,
    local_cpus: CPUSet = _NO_CPUS,
) -> Device:
    """A processing accelerator (class 0x120000, Intel Gaudi ids) with `accel<index>`."""
    return Device(
        address,
        pci_class=0x120000,
        vendor=0x1DA3,
        device=0x1020,
        numa=numa,
        local_cpus=local_cpus,
        names=(f"accel{index}",),
    )


def with_devices(topology: Topology, *devices: Device) -> Topology:
    """`topology` with `devices` added to its own, their names in discovery's order (see the
    module docstring)."""
    filled = []
    for device in devices:
        local = device.local_cpus
        if not local:
            local = (
                topology.cpus_in_numa_nodes(device.numa)
                if device.numa is not None
                else topology.online_cpus
            )
        names = _ordered(device.names, device.pci_class)
        filled.append(replace(device, local_cpus=local, names=names))
    return Topology(
        topology.cpus,
        topology.numa_nodes,
        name=topology.name,
        devices=[*topology.devices, *filled],
    )


def _touch_dir(path: str) -> None:
    os.makedirs(path, exist_ok=True)


def _write(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="ascii") as handle:
        handle.write(text + "\n")


def write_pci_devices(devices: Iterable[Device], root: str | os.PathLike[str]) -> Path:
    """Write `devices` under `root` as Linux lays them out (see the module docstring)."""
    base = os.fspath(root)
    bus = os.path.join(base, "sys", "bus", "pci", "devices")
    for device in devices:
        domain, bus_no, _ = device.address.split(":")
        rel = os.path.join("devices", f"pci{domain}:{bus_no}", device.address)
        where = os.path.join(base, "sys", rel)
        _write(os.path.join(where, "class"), f"0x{device.pci_class:06x}")
        _write(os.path.join(where, "vendor"), f"0x{device.vendor:04x}")
        _write(os.path.join(where, "device"), f"0x{device.device:04x}")
        _write(os.path.join(where, "numa_node"), str(-1 if device.numa is None else device.numa))
        _write(os.path.join(where, "local_cpulist"), str(device.local_cpus))
        _write(os.path.join(where, "local_cpus"), device.local_cpus.to_mask())
        for name in device.names:
            _write_name(base, where, device, name)
        os.makedirs(bus, exist_ok=True)
        link = os.path.join(bus, device.address)
        if not os.path.lexists(link):
            os.symlink(os.path.join("..", "..", "..", rel), link)
    return Path(root)


def _write_name(base: str, where: str, device: Device, name: str) -> None:
    if re.match(r"^nvidia\d+$", name):
        info = os.path.join(base, "proc", "driver", "nvidia", "gpus", device.address)
        _write(
            os.path.join(info, "information"),
            f"Model: \t\t NVIDIA H100\nIRQ:   \t\t 42\nDevice Minor: \t {name[6:]}\n"
            f"Bus Location: \t {device.address}",
        )
    elif _DRM.match(name):
        _write(os.path.join(where, "drm", name, "dev"), "226:0")
    elif re.match(r"^accel\d+$", name):
        _write(os.path.join(where, "accel", name, "dev"), "261:0")
    elif re.match(r"^nvme\d+$", name):
        _touch_dir(os.path.join(where, "nvme", name))
    elif m := re.match(r"^(nvme\d+)n\d+$", name):
        _write(os.path.join(where, "nvme", m.group(1), name, "size"), "2048")
    elif device.kind == "nic":
        _write(os.path.join(where, "net", name, "ifindex"), "2")
    else:
        _write(os.path.join(where, "block", name, "size"), "2048")
