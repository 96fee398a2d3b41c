"""The one state transaction host mode and the node agent work through: a locked
read-modify-write of the state directory whose state has been adopted (checked against the live
topology, `corepin.state.adopt`) before the caller sees it.

```python
with open_transaction(store, topology, timeout=10.0) as txn:
    state = txn.state                       # adopted: fits the live machine
    txn.commit(state.add(assignment))       # atomic write, revision + 1
```

Nothing is written unless `commit` is called, so a reconcile that finds nothing to do performs
no write at all; `commit_if_changed` writes only a state that differs from the current one (a
long-running writer such as the node agent calls it after every batch of work). A caller that
keeps its own copy of the checkpoint passes it as `cached`: when the file is still that version
it is neither read nor adopted again (`reused`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from corepin.state.adopt import DeadIds, adopt
from corepin.state.store import DEFAULT_LOCK_TIMEOUT, Stamp, StateStore, Transaction

if TYPE_CHECKING:
    from corepin.state.model import HostState
    from corepin.topology.model import Topology


class CheckedTransaction:
    """A state transaction whose `state` has been checked against the live topology."""

    __slots__ = ("_inner", "_state", "written")

    def __init__(self, inner: Transaction, state: HostState) -> None:
        self._inner = inner
        self._state = state
        #: the last state this transaction wrote (None: nothing written yet)
        self.written: HostState | None = None

    @property
    def state(self) -> HostState:
        """The current state (after any commit in this transaction)."""
        return self._state

    @property
    def stamp(self) -> Stamp | None:
        """The checkpoint's version on disk (after a commit: the one written)."""
        return self._inner.stamp

    @property
    def reused(self) -> bool:
        """Whether `state` is the caller's cached copy (the file had not changed)."""
        return self._inner.reused

    @property
    def existed(self) -> bool:
        """Whether a checkpoint existed when the transaction began."""
        return self._inner.existed

    def commit(self, new_state: HostState) -> HostState:
        """Write `new_state` (with the next revision) atomically; returns what was written."""
        self._state = self.written = self._inner.commit(new_state)
        return self._state

    def commit_if_changed(self, new_state: HostState) -> HostState:
        """`commit`, unless `new_state` equals the current state: then nothing is written and
        the current state is returned."""
        if new_state == self._state:
            return new_state
        return self.commit(new_state)


@contextmanager
def open_transaction(
    store: StateStore,
    topology: Topology,
    *,
    timeout: float = DEFAULT_LOCK_TIMEOUT,
    dead_ids: DeadIds | None = None,
    cached: tuple[Stamp, HostState] | None = None,
) -> Iterator[CheckedTransaction]:
    """The transaction of `store` (its lock waited for up to `timeout` seconds), its state
    adopted for `topology` unless it is the `cached` copy (see the module docstring);
    `dead_ids`: see `corepin.state.adopt.adopt`."""
    with store.transaction(timeout, cached=cached) as tx:
        state = tx.state if tx.reused else adopt(tx.state, topology, store.path, dead_ids)
        yield CheckedTransaction(tx, state)


__all__ = ["CheckedTransaction", "open_transaction"]
