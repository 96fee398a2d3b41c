"""Host-mode access to the state directory: a locked transaction whose state has been checked
against the live topology (boot validation), and a lock-free read for reports.

A state written on another machine shape (a CPU went offline, the topology changed) is adopted
when every assignment still fits the machine; otherwise corepin refuses with an operator-facing
message instead of pinning anything to CPUs that are not there.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from corepin.core.errors import StateError

if TYPE_CHECKING:
    from corepin.agent.host.settings import HostSettings
    from corepin.state.model import HostState
    from corepin.state.store import Transaction
    from corepin.topology.model import Topology


class HostTransaction:
    """A state transaction whose `state` has been validated against the live topology.

    `commit` writes through the state layer; nothing is written unless it is called, so a
    reconcile that finds nothing to do performs no write at all.
    """

    def __init__(self, inner: Transaction, state: HostState) -> None:
        self._inner = inner
        self._state = state

    @property
    def state(self) -> HostState:
        return self._state

    def commit(self, new_state: HostState) -> HostState:
        self._state = self._inner.commit(new_state)
        return self._state


def adopt(
    state: HostState,
    topology: Topology,
    source: str,
    dead_ids: Callable[[HostState], set[str]] | None = None,
) -> HostState:
    """`state` checked against the live `topology` by `corepin.state.validate` (safe repairs
    adopted, unsafe states refused with StateError telling the operator what to do).

    Assignments named by `dead_ids` (nothing of them is alive) are not checked (their CPUs may
    be the very ones that went away): they stay in the state for the caller to free and
    report."""
    from corepin.state.validate import validate

    gone = dead_ids(state) if dead_ids is not None and state.assignments else set()
    dead = {a.id: a for a in state if a.id in gone}
    try:
        checked, _ = validate(state.remove_many(dead), topology)
    except StateError as exc:
        raise StateError(f"{source}: {exc.message}", reason=exc.reason) from None
    if dead:
        checked = checked.evolve(assignments={**checked.assignments, **dead})
    return checked


@contextmanager
def open_transaction(
    settings: HostSettings,
    topology: Topology,
    dead_ids: Callable[[HostState], set[str]] | None = None,
) -> Iterator[HostTransaction]:
    from corepin.state.store import StateStore

    store = StateStore(settings.state_dir, proc_root=settings.proc_root)
    with store.transaction(settings.lock_timeout) as tx:
        yield HostTransaction(tx, adopt(tx.state, topology, store.path, dead_ids))


def read_state(
    settings: HostSettings,
    topology: Topology,
    dead_ids: Callable[[HostState], set[str]] | None = None,
) -> HostState:
    """The committed state for reports (no lock; an empty state when there is none yet)."""
    from corepin.state.model import HostState
    from corepin.state.store import StateStore

    store = StateStore(settings.state_dir, proc_root=settings.proc_root)
    state = store.read()
    return adopt(state or HostState(), topology, store.path, dead_ids)
