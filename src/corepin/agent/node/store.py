"""The node agent's state: one checkpoint shared with host mode, read through one transaction.

Every batch of work is one locked transaction (`corepin.state.transaction`). The checkpoint is
read and adopted (validated against the live topology) only when it is not the version this
agent last read or wrote - another writer changed it, or this is the first time; otherwise the
agent's own copy serves. Every state committed (and the first one read) goes to `on_state`
(the agent's metrics and its gRPC feed).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from corepin.state.model import HostState
from corepin.state.store import Stamp, StateStore
from corepin.state.transaction import CheckedTransaction, open_transaction
from corepin.topology.model import Topology


class NodeStore:
    """The state directory of the agent and its last committed state."""

    def __init__(
        self,
        state_dir: str,
        proc_root: str,
        topology: Topology,
        on_state: Callable[[HostState], None],
    ) -> None:
        self.state_dir = state_dir
        self.proc_root = proc_root
        self.topology = topology
        self.on_state = on_state
        self._store: StateStore | None = None
        self._cached: tuple[Stamp, HostState] | None = None
        self._state: HostState | None = None

    @property
    def state(self) -> HostState | None:
        """The node state as last committed (read-only snapshot)."""
        return self._state

    @contextmanager
    def transaction(self) -> Iterator[CheckedTransaction]:
        """The state transaction: locked; the checkpoint read and validated only when it is not
        the version this agent last read or wrote (another writer, or the first time)."""
        store = self._store
        if store is None:
            store = self._store = StateStore(self.state_dir, proc_root=self.proc_root)
        with open_transaction(store, self.topology, cached=self._cached) as txn:
            yield txn
            if txn.written is not None:
                self._cached = (txn.stamp, txn.written) if txn.stamp is not None else None
                self._state = txn.written
                self.on_state(txn.written)
            elif self._state is None or txn.reused is False:
                state = txn.state
                self._state = state
                self._cached = (txn.stamp, state) if txn.stamp is not None and txn.existed else None
                self.on_state(state)


__all__ = ["NodeStore"]
