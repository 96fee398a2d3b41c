"""Topology discovery: read a sysfs tree, build the machine model.

`discover(sysfs_root)` reads `<root>/sys/devices/system/{cpu,node}` (and the hybrid PMU lists
under `<root>/sys/devices/`) through `corepin.sysfs`, then builds the `Topology` with the pure
rules of `corepin.topology.build`. Missing required files raise `SysfsError` naming the path;
optional ones fall back as documented in `corepin.sysfs.cpu` / `corepin.sysfs.node`, with one
warning per kind of fallback on the `corepin.sysfs` logger. Files that disagree with each other
never make discovery refuse the machine: the reading hwloc and lscpu take is chosen and logged
once per kind at INFO on the same logger (see `corepin.topology.build`).
"""

from __future__ import annotations

import os

from corepin.sysfs.topology import read_sysfs
from corepin.topology.build import build_topology
from corepin.topology.model import Topology

__all__ = ["discover"]


def discover(sysfs_root: str | os.PathLike[str] = "/") -> Topology:
    """The machine model of the sysfs tree under `sysfs_root` (`/` for this host)."""
    snapshot, fallbacks = read_sysfs(sysfs_root)
    root = os.fspath(sysfs_root)
    name = "host" if root in ("/", "") else os.path.basename(os.path.normpath(root))
    return build_topology(snapshot, note=fallbacks.note, interpret=fallbacks.interpret, name=name)
