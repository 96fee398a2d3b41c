"""Adoption of a restored state: the checkpoint checked against the live topology before anyone
acts on it (host mode at every command, the node agent at every checkpoint it did not write).

A state written on another machine shape (a CPU went offline, the topology changed) is adopted
when every assignment still fits the machine; otherwise corepin refuses with an operator-facing
message instead of pinning anything to CPUs that are not there (`corepin.state.validate`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from corepin.core.errors import StateError
from corepin.state.model import HostState
from corepin.state.validate import validate

if TYPE_CHECKING:
    from corepin.state.store import StateStore
    from corepin.topology.model import Topology

#: the ids of a state's assignments of which nothing is alive any more
DeadIds = Callable[[HostState], set[str]]


def adopt(
    state: HostState,
    topology: Topology,
    source: str,
    dead_ids: DeadIds | None = None,
) -> HostState:
    """`state` checked against the live `topology` by `corepin.state.validate` (safe repairs
    adopted, unsafe states refused with StateError telling the operator what to do).

    Assignments named by `dead_ids` (nothing of them is alive) are not checked (their CPUs may
    be the very ones that went away): they stay in the state for the caller to free and
    report."""
    gone = dead_ids(state) if dead_ids is not None and state.assignments else set()
    dead = {a.id: a for a in state if a.id in gone}
    try:
        checked, _ = validate(state.remove_many(dead), topology)
    except StateError as exc:
        raise StateError(f"{source}: {exc.message}", reason=exc.reason) from None
    if dead:
        checked = checked.evolve(assignments={**checked.assignments, **dead})
    return checked


def read_state(
    store: StateStore,
    topology: Topology,
    dead_ids: DeadIds | None = None,
) -> HostState:
    """The committed state for reports (no lock; an empty state when there is none yet)."""
    return adopt(store.read() or HostState(), topology, store.path, dead_ids)


__all__ = ["DeadIds", "adopt", "read_state"]
