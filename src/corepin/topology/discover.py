"""Topology discovery: read a sysfs tree, build the machine model.

`discover(sysfs_root)` reads `<root>/sys/devices/system/{cpu,node}` (and the hybrid PMU lists
under `<root>/sys/devices/`) through `corepin.sysfs`, then builds the `Topology` with the pure
rules of `corepin.topology.build`. Missing required files raise `SysfsError` naming the path;
optional ones fall back as documented in `corepin.sysfs.cpu` / `corepin.sysfs.node`, with one
warning per kind of fallback on the `corepin.sysfs` logger. Files that disagree with each other
never make discovery refuse the machine: the reading hwloc and lscpu take is chosen and logged
once per kind at INFO on the same logger (see `corepin.topology.build`).

PCI devices come from `<root>/sys/bus/pci/devices` (`corepin.sysfs.pci`; the NVIDIA driver's
minors from `<root>/proc`): a tree without PCI sysfs gives a machine without devices.
"""

from __future__ import annotations

import os

from corepin.sysfs.pci import PciFunction, read_pci_devices
from corepin.sysfs.topology import read_sysfs
from corepin.topology.build import build_topology
from corepin.topology.devices import Device
from corepin.topology.model import Topology

__all__ = ["discover"]


def discover(sysfs_root: str | os.PathLike[str] = "/") -> Topology:
    """The machine model of the sysfs tree under `sysfs_root` (`/` for this host)."""
    snapshot, fallbacks = read_sysfs(sysfs_root)
    root = os.fspath(sysfs_root)
    name = "host" if root in ("/", "") else os.path.basename(os.path.normpath(root))
    topology = build_topology(
        snapshot, note=fallbacks.note, interpret=fallbacks.interpret, name=name
    )
    functions = read_pci_devices(root)
    if not functions:
        return topology
    return Topology(
        topology.cpus,
        topology.numa_nodes,
        name=topology.name,
        devices=[_device(f) for f in functions],
    )


def _device(function: PciFunction) -> Device:
    return Device(
        address=function.address,
        pci_class=function.pci_class,
        vendor=function.vendor,
        device=function.device,
        numa=function.numa,
        local_cpus=function.local_cpus,
        names=function.names,
    )
