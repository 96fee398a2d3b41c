"""What an assignment's cpuset should hold: one rule for host mode and the node agent.

`cpus_and_mems` gives the CPUs (cpuset.cpus, and the affinity of its threads) and the memory
nodes (cpuset.mems) of an assignment while the shared pool is `pool`:

- CPUs: the assignment's affinity (its own CPUs, with the shared pool where it asked for it);
- memory nodes of an exclusive or share assignment: the nodes it recorded (a memory policy it
  asked for, `--membind`), else those of its CPUs;
- memory nodes of a shared or mixed one (it runs on the shared pool): `pool_mems` when the
  caller gives them (the node agent hands every memory node of the machine, as the kubelet
  does), else those of its CPUs and any it recorded (host mode).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from corepin.core.cpuset import CPUSet

if TYPE_CHECKING:
    from corepin.state.model import Assignment
    from corepin.topology.model import Topology

__all__ = ["cpus_and_mems"]


def cpus_and_mems(
    a: Assignment, pool: CPUSet, topology: Topology, *, pool_mems: CPUSet | None = None
) -> tuple[CPUSet, CPUSet]:
    """(CPUs, memory nodes) assignment `a` should have with shared pool `pool` (see the module
    docstring)."""
    cpus = a.affinity(pool)
    if a.kind in ("exclusive", "share"):
        return cpus, a.mems or topology.mems_of(cpus)
    if pool_mems is not None:
        return cpus, pool_mems
    return cpus, topology.mems_of(cpus) | a.mems
