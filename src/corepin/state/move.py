"""A live move in the state: one workload's CPUs replaced by others of the same number, the
same kind and level, as rebalancing and reservations do to a running exclusive workload (host
runs, `corepin.agent.host.rebalance`; containers, `corepin.agent.node.move`). Pure: the state
in, the state out; the callers apply the cgroups and affinities after the commit.
"""

from __future__ import annotations

from corepin.core.cpuset import CPUSet
from corepin.core.errors import AllocationError, RequestError
from corepin.state.model import Assignment, HostState


def move_assignment(
    state: HostState, assignment_id: str, cpus: CPUSet, withheld: CPUSet, mems: CPUSet
) -> tuple[HostState, Assignment, Assignment]:
    """The state where `assignment_id` holds `cpus` (withholding `withheld`, which takes in
    `cpus`; memory nodes `mems`) instead of its CPUs, and the assignment before and after.

    RequestError for an unknown id, one that holds no CPUs of its own or runs on a reservation,
    or a change of size; AllocationError (reason as `HostState.add` gives it) when the new CPUs
    are neither free nor its own. Nothing changes then."""
    old = state.get(assignment_id)
    if old is None:
        raise RequestError(f"no assignment with id {assignment_id!r}", reason="unknown_id")
    if not old.holds or old.kind not in ("exclusive", "mixed", "share"):
        raise RequestError(f"{assignment_id!r} holds no CPUs of its own: nothing to move")
    if old.reservation is not None:
        raise RequestError(
            f"{assignment_id!r} runs on reservation {old.reservation!r}: it is not moved",
            reason="on_reservation",
        )
    if len(cpus) != len(old.cpus):
        raise RequestError(
            f"{assignment_id!r}: a move keeps the size ({len(old.cpus)} CPUs), got {cpus}"
        )
    new = old.evolve(cpus=cpus, withheld=withheld | cpus, mems=mems)
    try:
        moved = state.remove(assignment_id).add(new)
    except AllocationError as exc:
        raise AllocationError(
            f"cannot move {assignment_id!r} to CPUs {cpus}: {exc.message}", reason=exc.reason
        ) from None
    return moved, old, new


__all__ = ["move_assignment"]
