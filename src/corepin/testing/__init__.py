"""Helpers for tests and benchmarks: synthetic sysfs trees written from a `Topology`.

`write_sysfs_tree(topology, root, omit=...)` lays out the files a kernel would show for the
machine; `expected_after(topology, omit)` is what discovery must return for such a tree.
Synthetic machines themselves come from `corepin.topology.synthetic`.
"""

from __future__ import annotations

from corepin.testing.sysfs_tree import OLD_KERNEL, OMISSIONS, expected_after, write_sysfs_tree

__all__ = ["OLD_KERNEL", "OMISSIONS", "expected_after", "write_sysfs_tree"]
