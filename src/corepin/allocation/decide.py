"""One decision out of a node's pools: the call host mode, the node agent, the simulator and
the placement core all make.

`decide` takes the node's `NodePools` (`corepin.allocation.pools`), picks the pool a request
draws from (the free set for exclusive, mixed and share requests; the shared pool for shared
and best-effort ones) and asks the policy. It knows no policy by name: a policy that can place
best-effort workloads by usage says so by being a `BestEffortPlacer`.
"""

from __future__ import annotations

from collections.abc import Mapping

from corepin.allocation.pools import EXCLUSIVE_KINDS, KINDS, NodePools
from corepin.allocation.types import BestEffortPlacer, Decision, Policy, Request
from corepin.core.cpuset import CPUSet
from corepin.core.errors import AllocationError, RequestError
from corepin.topology.model import Topology


def decide(
    pools: NodePools,
    topology: Topology,
    request: Request,
    policy: Policy,
    *,
    kind: str | None = None,
    usage: Mapping[int, int] | None = None,
    keep_shared: bool = False,
) -> Decision:
    """Decide `request` with `policy` out of the right pool of `pools`.

    `kind` defaults to `exclusive` for exclusive requests and `shared` otherwise. Exclusive,
    mixed and share requests take CPUs from the free set (a best-effort workload is placed in
    the shared pool instead, on its least used CPUs given `usage` - CPU -> number of shared
    workloads pinned there - when the policy can). Shared requests get the shared pool (the
    decision's `cpus`; with option `allow-isolated` the isolated CPUs too) and withhold nothing.
    With `keep_shared`, an exclusive decision that would leave the shared pool empty is refused
    (reason `shared_pool_exhausted`); an empty shared pool refuses shared requests (reason
    `shared_pool_empty`).
    """
    kind = kind or ("exclusive" if request.exclusive else "shared")
    if kind not in KINDS:
        raise RequestError(f"unknown assignment kind {kind!r}", reason="bad_kind")
    if kind != "shared" and request.workload != "best-effort":
        free = pools.free
        if len(free) < request.count:
            raise AllocationError(
                f"cannot allocate {request.count} {kind} CPU(s): only {len(free)} free "
                f"({free or 'none'}) of online {CPUSet.from_bits(pools.online)}",
                reason="not_enough_cpus",
            )
        decision = policy.decide(topology, request, free)
        if (
            keep_shared
            and kind in EXCLUSIVE_KINDS
            and not pools.keeps_shared_pool(decision.withheld)
        ):
            raise AllocationError(
                f"cannot allocate {request.count} {kind} CPU(s): CPUs {decision.withheld} would "
                "leave no CPU in the shared pool for the running shared workloads",
                reason="shared_pool_exhausted",
            )
        return decision
    pool = pools.shared_pool_for(allow_isolated="allow-isolated" in request.options)
    if not pool:
        raise AllocationError(
            "the shared pool is empty: every CPU that may run shared work is held exclusively "
            f"({pools.exclusive_cpus or 'none'}), reserved or isolated",
            reason="shared_pool_empty",
        )
    if request.workload == "best-effort" and isinstance(policy, BestEffortPlacer):
        placed = policy.place_best_effort(topology, request, pool, usage)
        return Decision(placed.cpus, placed.mems, CPUSet(), placed.policy, placed.explanation)
    return Decision(pool, topology.mems_of(pool), CPUSet(), policy.name)
