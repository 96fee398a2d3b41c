"""The reserved CPUs of a node, as host mode and the node agent ask for them.

A node's reserved CPUs are given as an explicit list (`--reserved-cpus`, a reservation
annotation) or as a count. A list must name online CPUs; a count is chosen the way the kubelet
chooses its own reserved CPUs, by the one chooser `corepin.allocation.kubelet_static.
select_reserved` (whole cores, packed, lowest ids on a uniform machine).
"""

from __future__ import annotations

from corepin.allocation.kubelet_static import select_reserved
from corepin.core.cpuset import CPUSet
from corepin.core.errors import RequestError
from corepin.topology.model import Topology


def reserved_cpus(topology: Topology, count: int = 0, explicit: CPUSet | None = None) -> CPUSet:
    """The reserved CPUs: `explicit` when given (must be online CPUs of the topology), else
    `count` CPUs chosen as the kubelet chooses them. RequestError (reason `bad_reservation`)
    for CPUs that are not online, a negative count or more CPUs than are online."""
    online = topology.online_cpus
    if explicit is not None:
        if not explicit.issubset(online):
            raise RequestError(
                f"reserved CPUs {explicit - online} are not online CPUs of this topology",
                reason="bad_reservation",
            )
        return explicit
    if count < 0:
        raise RequestError(
            f"reserved CPU count cannot be negative: {count}", reason="bad_reservation"
        )
    if count == 0:
        return CPUSet()
    if count > len(online):
        raise RequestError(
            f"cannot reserve {count} CPUs: the topology has {len(online)} online",
            reason="bad_reservation",
        )
    return select_reserved(topology, count)
