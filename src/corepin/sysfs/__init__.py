"""Readers of the host's kernel interfaces; every reader takes a root path, returns typed
records and raises `SysfsError` naming the file it could not use.

- `corepin.sysfs.files`: file access under a root, CPU list / mask parsing (cached), the
  one-warning-per-kind fallback log (logger `corepin.sysfs`);
- `corepin.sysfs.cpu`: sys/devices/system/cpu (CPU sets, topology, caches, hybrid core kinds);
- `corepin.sysfs.node`: sys/devices/system/node (NUMA nodes, distances, memory);
- `corepin.sysfs.topology`: `read_sysfs(root)`, everything topology discovery needs;
- `corepin.sysfs.records`: the record types;
- `corepin.sysfs.procfs`: /proc readers (processes, affinity, cgroups).

Nothing is imported here, so importing one reader does not load the others.
"""
