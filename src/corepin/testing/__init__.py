"""Helpers for tests and benchmarks: synthetic sysfs trees written from a `Topology`.

`write_sysfs_tree(topology, root, omit=..., overrides=...)` lays out the files a kernel would
show for the machine (overrides: what a kernel prints where it disagrees with the model, e.g.
`compute_unit_files(topology)` or `package_core_ids(topology)`); `expected_after(topology,
omit)` is what discovery must return for such a tree. Synthetic machines themselves come from
`corepin.testing.machines`; PCI devices for them (`gpu`, `nic`, `nvme`, `accelerator`,
`with_devices`) from `corepin.testing.devices`.
"""

from __future__ import annotations

from corepin.testing.devices import accelerator, gpu, nic, nvme, with_devices, write_pci_devices
from corepin.testing.sysfs_tree import (
    OLD_KERNEL,
    OMISSIONS,
    Overrides,
    compute_unit_files,
    expected_after,
    package_core_ids,
    write_sysfs_tree,
)

__all__ = [
    "OLD_KERNEL",
    "OMISSIONS",
    "Overrides",
    "accelerator",
    "compute_unit_files",
    "expected_after",
    "gpu",
    "nic",
    "nvme",
    "package_core_ids",
    "with_devices",
    "write_pci_devices",
    "write_sysfs_tree",
]
