"""One call that reads every sysfs fact topology discovery needs.

`read_sysfs(root)` returns a `SysfsSnapshot` plus the `Fallbacks` it used (see
`corepin.sysfs.cpu` and `corepin.sysfs.node` for the files and their fallbacks). Each file is
read at most once.
"""

from __future__ import annotations

import os

from corepin.sysfs.cpu import read_cpu_system
from corepin.sysfs.files import Fallbacks, SysfsFiles
from corepin.sysfs.node import read_node_system
from corepin.sysfs.records import SysfsSnapshot

__all__ = ["read_sysfs"]


def read_sysfs(root: str | os.PathLike[str] = "/") -> tuple[SysfsSnapshot, Fallbacks]:
    files = SysfsFiles(root)
    cpu = read_cpu_system(files)
    nodes = read_node_system(files)
    return SysfsSnapshot(files.root, cpu, nodes), files.fallbacks
