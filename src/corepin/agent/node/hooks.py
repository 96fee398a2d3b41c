"""What the node agent reports as it works: `Hooks`, one call per measured event.

The agent calls them; `corepin agent` turns them into its Prometheus metrics
(`corepin.agent.node.metrics.AgentMetrics`), tests and benchmarks into whatever they count.
Every method is optional to override.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from corepin.allocation.qos import QosPolicy
    from corepin.enforcement.qos.engine import QosReport
    from corepin.state.model import HostState
    from corepin.topology.model import Topology


class Hooks:
    """What the agent reports as it works (metrics); every method is optional to override."""

    def decided(self, seconds: float) -> None: ...

    def pinning(self, ok: bool, reason: str = "") -> None: ...

    def cgroup_writes(self, count: int) -> None: ...

    def reconciled(self, seconds: float) -> None: ...

    def pinned_after(self, seconds: float) -> None: ...

    def state(self, state: HostState, topology: Topology) -> None: ...

    def qos_period(self, report: QosReport, cpu_seconds: float) -> None:
        """One QoS period done (`cpu_seconds`: the CPU time it took)."""

    def qos_policy(self, policy: QosPolicy) -> None:
        """The node QoS policy in force changed."""

    def rebalance_advised(self) -> None:
        """A move advised (`--rebalance report`), once per container and advice."""

    def rebalance_moved(self, seconds: float) -> None:
        """A container moved live (`--rebalance move`): `seconds` from the start of the move
        (its decision applied to the state) to its cgroup written."""


__all__ = ["Hooks"]
