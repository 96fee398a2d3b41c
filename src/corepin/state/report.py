"""The data of `corepin report`: one dict built from a state, whoever holds it.

Host mode reads the state from its state directory, `corepin report --agent` gets it from a
running agent over gRPC, `corepin report --node` from the node's `NodeCPUTopology`; all three
print this same form (and the same table, YAML and SVG drawn from it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from corepin.state.model import HostState

#: `status` values whose processes still hold the allocation (`alive` is true).
ALIVE: Final = ("running", "lingering")


def report_data(
    state: HostState,
    statuses: Mapping[str, str | None] | None = None,
    *,
    pools: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The report of `state`. `statuses`: assignment id -> running | lingering | dead | unknown
    (an id without one, or None, reports `status` and `alive` as null: the source does not
    know). `pools`: pool texts to show instead of the derived ones (what a published object
    says: `shared_pool`, `free`, `reserved`, `isolated`)."""
    statuses = statuses or {}
    pool = state.shared_pool
    allocations = []
    for a in state:
        process = a.process
        status = statuses.get(a.id)
        allocations.append(
            {
                "id": a.id,
                "pid": a.pid,
                "cpus": str(a.affinity(pool)),
                "exclusive": a.exclusive,
                "kind": a.kind,
                "qos_class": a.qos_class,
                "exclusive_cpus": str(a.cpus) if a.holds else "",
                "withheld": str(a.withheld),
                "mems": str(a.mems),
                "level": a.level,
                "workload": a.workload,
                "near": list(a.near),
                "name": process.name if process is not None else a.label,
                "command": process.command if process is not None else "",
                "owner_pid": process.runner_pid if process is not None else None,
                "owner": a.owner.to_json() if a.owner is not None else None,
                "cgroup": a.cgroup,
                "created": a.created,
                "policy": a.policy,
                "status": status,
                "alive": None if status is None else status in ALIVE,
            }
        )
    data: dict[str, Any] = {
        "allocations": allocations,
        "shared_pool": str(pool),
        "free": str(state.free),
        "online": str(state.online),
        "isolated": str(state.isolated),
        "reserved": str(state.reserved),
        "exclusive": str(state.exclusive_cpus),
        "held": str(state.held),
        "revision": state.revision,
    }
    for key, value in (pools or {}).items():
        if key in data:
            data[key] = value
    return data
