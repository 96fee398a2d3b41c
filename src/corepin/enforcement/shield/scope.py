"""What a shield covers: its scope, the groups it leaves alone, and what "confined" means.

Pure rules on a `ShieldRecord`, shared by every part of the shield (no I/O).
"""

from __future__ import annotations

from corepin.core.cpuset import CPUSet
from corepin.state.shield import ShieldRecord

__all__ = ["confine", "excluded", "in_scope"]


def confine(cpus: CPUSet, system: CPUSet) -> CPUSet:
    """`cpus` within the system set, or the whole system set when none of them is in it."""
    return (cpus & system) or system


def in_scope(record: ShieldRecord, path: str) -> bool:
    """Whether the group `path` (as /proc/PID/cgroup names it: `/a/b`) is the record's scope
    or below it, outside its excluded groups."""
    scope = "/" + record.scope if record.scope else "/"
    if scope != "/" and path != scope and not path.startswith(scope + "/"):
        return False
    rel = path.strip("/")
    return not any(rel == e or rel.startswith(e + "/") for e in record.excluded)


def excluded(record: ShieldRecord, path: str) -> bool:
    """Whether the group `path` (relative) is one the shield leaves alone: its own groups, the
    record's excluded ones (corepin's, the kubelet's), or one below them."""
    own = (record.system_group, record.managed_group)
    return any(path == i or path.startswith(i + "/") for i in (*own, *record.excluded))
