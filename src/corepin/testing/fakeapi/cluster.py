"""The state behind the fake API server and the API server's semantics for each kind, put
together: `Cluster` is the store (store.py: revisions, history, snapshots, lists and watches),
the served types (registry.py) and the write semantics, one mixin per concern: creates and
updates (writes.py), patches and server-side apply (patching.py), deletion, garbage collection
and namespaces (deletion.py), CRD serving (crds.py), pods' binding and eviction
(subresources.py); the built-in kinds' rules are functions (kinds.py) and the disruption
controller keeps PodDisruptionBudgets' status after each write of a pod or a budget.

Every public method takes the lock; HTTP handler threads and tests may call them concurrently.
"""

from __future__ import annotations

import builtins
from collections import deque

from corepin.testing.fakeapi import disruption
from corepin.testing.fakeapi.crds import CrdServing
from corepin.testing.fakeapi.deletion import Deletion
from corepin.testing.fakeapi.patching import (
    APPLY_PATCH,
    JSON_PATCH,
    MERGE_PATCH,
    STRATEGIC_PATCH,
    Patching,
)
from corepin.testing.fakeapi.resources import ResourceType
from corepin.testing.fakeapi.selectors import FieldSelector, LabelSelector
from corepin.testing.fakeapi.store import (
    Change,
    Obj,
    Snapshot,
    Storage,
    Watcher,
    now_text,
    view_of,
)
from corepin.testing.fakeapi.subresources import Subresources
from corepin.testing.fakeapi.writes import WriteOptions, WriteResult

__all__ = [
    "APPLY_PATCH",
    "INITIAL_NAMESPACES",
    "JSON_PATCH",
    "MERGE_PATCH",
    "STRATEGIC_PATCH",
    "Change",
    "Cluster",
    "Snapshot",
    "Watcher",
    "WriteOptions",
    "WriteResult",
    "now_text",
]

INITIAL_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")


class Cluster(Patching, Deletion, CrdServing, Subresources):
    """Objects, revisions and history of one fake API server."""

    def __init__(self, *, history_limit: int = 1000, graceful_pod_deletion: bool = False) -> None:
        super().__init__(history_limit=history_limit, graceful_pod_deletion=graceful_pod_deletion)
        self._syncing = False  # the disruption controller is writing PDB statuses
        self.store.on_commit = self._after_commit
        for name in INITIAL_NAMESPACES:
            self.create(
                self.resource("", "v1", "namespaces"),
                "",
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}},
                WriteOptions(field_manager="kube-apiserver"),
            )

    def _after_commit(self, storage: Storage, namespace: str) -> None:
        """The disruption controller's turn after a write of a pod or a budget."""
        if storage in (disruption.PODS, disruption.PDBS) and not self._syncing:
            self._syncing = True
            try:
                disruption.sync_namespace(self, namespace)
            finally:
                self._syncing = False

    # ------------------------------------------------------------------ the state, to look at
    @property
    def rv(self) -> int:
        """The current revision."""
        return self.store.rv

    @property
    def compacted_rv(self) -> int:
        return self.store.compacted_rv

    @property
    def history_limit(self) -> int:
        return self.store.history_limit

    @property
    def versions(self) -> dict[tuple[Storage, str, str], builtins.list[tuple[int, Obj | None]]]:
        return self.store.versions

    @property
    def history(self) -> deque[Change]:
        return self.store.history

    @property
    def watchers(self) -> builtins.list[Watcher]:
        return self.store.watchers

    @property
    def types(self) -> dict[tuple[str, str], dict[str, ResourceType]]:
        return self.registry.types

    @property
    def group_order(self) -> builtins.list[str]:
        return self.registry.group_order

    # ------------------------------------------------------------------ resource types
    def find_resource(self, group: str, version: str, plural: str) -> ResourceType | None:
        return self.registry.find_resource(group, version, plural)

    def group_versions(self) -> dict[str, builtins.list[str]]:
        """Served groups (in registration order) and their versions; "" is the core group."""
        return self.registry.group_versions()

    def resources_of(self, group: str, version: str) -> builtins.list[ResourceType]:
        return self.registry.resources_of(group, version)

    # ------------------------------------------------------------------ revisions
    def snapshot(self) -> Snapshot:
        return self.store.snapshot()

    def restore(self, snapshot: Snapshot) -> int:
        """Back to `snapshot` (an etcd restore): objects, history and revision; open watches
        are cut (the API server restarts). Resource types served now stay served."""
        return self.store.restore(snapshot)

    def compact(self, rv: int | None = None) -> int:
        """Forget history up to `rv` (default: now): watches and continue tokens from older
        revisions get 410 Gone. Returns the compacted revision."""
        return self.store.compact(rv)

    # ------------------------------------------------------------------ reads
    def view(self, rt: ResourceType, stored: Obj) -> Obj:
        """A stored object as served through `rt`."""
        return view_of(rt, stored)

    def get(self, rt: ResourceType, namespace: str, name: str) -> Obj:
        return self.store.get(rt, namespace, name)

    def list(
        self,
        rt: ResourceType,
        namespace: str | None,
        labels: LabelSelector,
        fields: FieldSelector,
        *,
        limit: int = 0,
        continue_token: str = "",
        resource_version: str = "",
        rv_match: str = "",
        typed_items: bool = True,
    ) -> Obj:
        """A list answer; `typed_items` drops kind/apiVersion from built-in items as the
        server's typed lists do (custom resource items keep them)."""
        return self.store.list(
            rt,
            namespace,
            labels,
            fields,
            limit=limit,
            continue_token=continue_token,
            resource_version=resource_version,
            rv_match=rv_match,
            typed_items=typed_items,
        )

    # ------------------------------------------------------------------ watches
    def open_watch(
        self,
        rt: ResourceType,
        namespace: str | None,
        labels: LabelSelector,
        fields: FieldSelector,
        resource_version: str,
        *,
        send_initial: bool = False,
    ) -> tuple[Watcher, builtins.list[tuple[str, Obj]], int]:
        """Register a watcher. Returns it, the events to send first, and the revision the
        initial state was taken at. A too-old revision raises 410 (sent as an ERROR event)."""
        return self.store.open_watch(
            rt, namespace, labels, fields, resource_version, send_initial=send_initial
        )

    def close_watch(self, watcher: Watcher) -> None:
        self.store.close_watch(watcher)

    def drop_watches(self, *, abrupt: bool = True, storage: Storage | None = None) -> int:
        """End every open watch (abrupt: the connection is cut without the final chunk)."""
        return self.store.drop_watches(abrupt=abrupt, storage=storage)

    def bookmark_rv(self, watcher: Watcher) -> int | None:
        """The revision a bookmark may report now (None while changes are still queued)."""
        return self.store.bookmark_rv(watcher)
