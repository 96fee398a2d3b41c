"""Does a pod fit a node, and on which CPUs (pure).

`fit(view, request, pools=None)` decides every app container of the pod in order, exactly as
the node agent's sync does when the containers start (`corepin.agent.node.sync`):

- a container on the shared pool (`none`, or a request the agent would ignore) always runs;
- a container with explicit CPUs (a PodCPUBinding) is exclusive on them: they must be free
  there (`NodePools.check_hold` with the units of its level) and leave a CPU in the shared pool;
- any other `exclusive` or `share` container: `decide(pools, topology, Request(count,
  level=..., workload=...), <the node's policy>, kind=..., keep_shared=True)`; its CPUs and
  withheld units are then held before the next container is decided.

`pools` defaults to the view's published pools; the caller passes the pools with its in-flight
placements held (`corepin.placement.ledger`). The answer says which CPUs each container would
get and the pools afterwards (for scoring and for `--bind-cpus`), or why it cannot fit, in a
sentence a user can act on.

`node_problem(view, now, stale_after)` is the check that comes first: an unusable view, a
`Ready` condition that is not True, or a heartbeat older than `stale_after` seconds.
"""

from __future__ import annotations

from typing import Final

from corepin.allocation.decide import decide
from corepin.allocation.levels import withheld_for
from corepin.allocation.pools import NodePools
from corepin.allocation.types import Request
from corepin.core.cpuset import CPUSet
from corepin.core.errors import AllocationError, CorepinError
from corepin.core.record import record
from corepin.placement.node import NodeView
from corepin.placement.request import ContainerAsk, PodRequest

#: machine-readable reasons (metrics labels) of a node that does not pass
NO_TOPOLOGY: Final = "no_topology"
NOT_READY: Final = "not_ready"
STALE: Final = "stale"
UNUSABLE: Final = "unusable"
NO_FIT: Final = "no_fit"


@record
class Placed:
    """What one container would get: its CPUs, the CPUs held for it (its level's units), its
    memory nodes."""

    container: str
    kind: str
    cpus: CPUSet
    withheld: CPUSet
    mems: CPUSet
    level: str = "cpu"
    workload: str | None = None


@record
class Fit:
    """The answer for one node: `ok`, or `code` and `reason` (a sentence) when not."""

    node: str
    ok: bool
    reason: str = ""
    code: str = ""
    placed: tuple[Placed, ...] = ()
    pools: NodePools | None = None  # the node's pools with the pod placed (when ok)


def node_problem(
    view: NodeView, now: float, stale_after: float, *, heartbeat: float | None = None
) -> Fit | None:
    """Why the node cannot take any pod that asks for CPUs (None when it can); `heartbeat`
    overrides the view's (a later heartbeat with nothing else changed)."""
    beat = view.heartbeat if heartbeat is None else heartbeat
    if view.problem:
        return Fit(view.name, False, f"node {view.name}: {view.problem}", UNUSABLE)
    if not view.ready:
        return Fit(
            view.name,
            False,
            f"node {view.name}: its corepin agent is not ready ({view.not_ready}); check the "
            "corepin agent pod on that node",
            NOT_READY,
        )
    if beat is None or now - beat > stale_after:
        age = "never" if beat is None else f"{now - beat:.0f} s ago"
        return Fit(
            view.name,
            False,
            f"node {view.name}: its corepin agent last reported {age} (stale after "
            f"{stale_after:g} s), so its free CPUs are unknown; check the corepin agent pod on "
            "that node",
            STALE,
        )
    return None


def no_topology(node: str) -> Fit:
    """The answer for a node without a NodeCPUTopology."""
    return Fit(
        node,
        False,
        f"node {node}: no corepin agent publishes its CPUs (no NodeCPUTopology {node!r}); run "
        "the corepin agent there or keep the pod off the node",
        NO_TOPOLOGY,
    )


def _what(c: ContainerAsk) -> str:
    level = f" at exclusiveness level {c.level}" if c.level != "cpu" else ""
    workload = f" ({c.workload})" if c.workload else ""
    if c.cpus is not None:
        return f"exclusive CPUs {c.cpus}{level}"
    return f"{c.count} {c.kind} CPU(s){level}{workload}"


def fit(view: NodeView, request: PodRequest, pools: NodePools | None = None) -> Fit:
    """Place every container of `request` on the node (see the module docstring)."""
    current = view.pools if pools is None else pools
    if not request.holds:
        return Fit(view.name, True, pools=current)
    if view.policy is None:
        return Fit(view.name, False, f"node {view.name}: {view.problem}", UNUSABLE)
    topology = view.topology
    placed: list[Placed] = []
    for c in request.containers:
        if not c.holds:
            continue
        try:
            if c.cpus is not None:
                cpus = c.cpus
                withheld = withheld_for(topology, c.level, cpus)
                current.check_hold("exclusive", withheld)
                if not current.keeps_shared_pool(withheld):
                    raise AllocationError(
                        f"CPUs {withheld} would leave no CPU in the shared pool",
                        reason="shared_pool_exhausted",
                    )
                kind = "exclusive"
            else:
                kind = c.kind
                decision = decide(
                    current,
                    topology,
                    Request(c.count, level=c.level, workload=c.workload),
                    view.policy,
                    kind=kind,
                    keep_shared=True,
                )
                cpus, withheld = decision.cpus, decision.withheld | decision.cpus
            current = current.hold(kind, withheld)
        except CorepinError as exc:
            return Fit(
                view.name,
                False,
                f"node {view.name}: container {c.name!r} asks for {_what(c)}: {exc.message}",
                NO_FIT,
            )
        placed.append(
            Placed(c.name, kind, cpus, withheld, topology.mems_of(cpus), c.level, c.workload)
        )
    return Fit(view.name, True, placed=tuple(placed), pools=current)


__all__ = ["Fit", "Placed", "fit", "no_topology", "node_problem"]
