"""What an assignment's cpuset should hold: one rule for host mode and the node agent.

`cpus_and_mems` gives the CPUs (cpuset.cpus, and the affinity of its threads) and the memory
nodes (cpuset.mems) of an assignment while the shared pool is `pool`:

- CPUs: the assignment's affinity (its own CPUs, with the shared pool where it asked for it);
- memory nodes of an exclusive or share assignment: the nodes it recorded (a memory policy it
  asked for, `--membind`), else those of its CPUs;
- memory nodes of a shared or mixed one (it runs on the shared pool): `pool_mems` when the
  caller gives them (the node agent hands every memory node of the machine, as the kubelet
  does), else those of its CPUs and any it recorded (host mode).

Best-effort work squeezed by the QoS loop (`corepin.enforcement.qos`): the caller passes
`be_cpus`, the CPUs BE work may use now, for a BE assignment; for a `shared` one they stand
for the shared pool (those of them still in the pool; all of them when none is - the loop
follows the pool at its next period, and a cgroup v1 child must stay within its BE parent), so
the agent and the loop write the same set and never undo each other. Other kinds keep their
own CPUs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from corepin.core.cpuset import CPUSet

if TYPE_CHECKING:
    from corepin.state.model import Assignment
    from corepin.topology.model import Topology

__all__ = ["cpus_and_mems"]


def cpus_and_mems(
    a: Assignment,
    pool: CPUSet,
    topology: Topology,
    *,
    pool_mems: CPUSet | None = None,
    be_cpus: CPUSet | None = None,
) -> tuple[CPUSet, CPUSet]:
    """(CPUs, memory nodes) assignment `a` should have with shared pool `pool`; `be_cpus`: the
    best-effort set, given for a BE assignment (see the module docstring)."""
    if be_cpus and a.kind == "shared":
        pool = (be_cpus & pool) or be_cpus
    cpus = a.affinity(pool)
    if a.kind in ("exclusive", "share"):
        return cpus, a.mems or topology.mems_of(cpus)
    if pool_mems is not None:
        return cpus, pool_mems
    return cpus, topology.mems_of(cpus) | a.mems
