"""`corepin shield on|off|status` in host mode: each a transaction of the state directory, so
the shield's record changes with the pools it follows (the mechanism:
`corepin.enforcement.shield.control`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from corepin.agent.host.agent import HostAgent

if TYPE_CHECKING:
    from corepin.enforcement.shield.result import ShieldResult


def shield_on(host: HostAgent, *, scope: str, kthreads: bool, irqs: bool) -> ShieldResult:
    """`corepin shield on`: raise the shield and record it."""
    with host.transaction() as txn:
        state, _ = host.liveness.reap(txn.state)
        state = host.with_reserved(state)
        result = host.shield.on(
            state,
            host.liveness.table(),
            scope=scope,
            kthreads=kthreads,
            irqs=irqs,
            cgroup_pids=host.pinner.cgroup_pids,
        )
        txn.commit(state.evolve(shield=result.record))
    return result


def shield_off(host: HostAgent) -> ShieldResult:
    """`corepin shield off`: undo the shield; what could not be undone stays recorded
    (EnvironmentProblem after the commit, so another `off` can finish it)."""
    with host.transaction() as txn:
        state, _ = host.liveness.reap(txn.state)
        result = host.shield.off(state, host.liveness.table(), cgroup_pids=host.pinner.cgroup_pids)
        txn.commit(state.evolve(shield=result.record))
    return result


def shield_status(host: HostAgent) -> dict[str, Any]:
    """What `corepin shield status` shows (`Shield.status`)."""
    state = host.read_state()
    return host.shield.status(state, host.liveness.table())
