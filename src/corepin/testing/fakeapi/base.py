"""What the parts of the fake's `Cluster` share: the store and the served types, and the
operations one part asks of another (declared here, done in the part that owns them: deletion
in `deletion.py`, CRD serving in `crds.py`).

`Cluster` (`cluster.py`) puts the parts together: `Writes` and `Patching` (writes.py,
patching.py), `Deletion`, `CrdServing` and `Subresources`, each a mixin of `ClusterBase`.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod

from corepin.testing.fakeapi.registry import Registry
from corepin.testing.fakeapi.resources import ResourceType
from corepin.testing.fakeapi.store import Key, Obj, Storage, Store


class ClusterBase(ABC):
    """The state of one fake API server: `store` (objects, revisions, watches) and `registry`
    (the resource types served)."""

    def __init__(self, *, history_limit: int = 1000, graceful_pod_deletion: bool = False) -> None:
        self.store = Store(history_limit=history_limit)
        self.registry = Registry(self.store.lock)
        #: pods on a node are deleted gracefully: they wait for the kubelet's final delete
        self.graceful_pod_deletion = graceful_pod_deletion

    @property
    def lock(self) -> threading.RLock:
        return self.store.lock

    @property
    def objects(self) -> dict[Storage, dict[Key, Obj]]:
        return self.store.objects

    def resource(self, group: str, version: str, plural: str) -> ResourceType:
        """The served type (404 when none)."""
        return self.registry.resource(group, version, plural)

    def commit(
        self, rt: ResourceType, namespace: str, name: str, kind: str, obj: Obj, old: Obj | None
    ) -> Obj:
        """Store one change (the caller holds the lock); returns the stored object."""
        return self.store.commit(rt, namespace, name, kind, obj, old)

    # ------------------------------------------------------------------ done by the parts
    @abstractmethod
    def delete(
        self,
        rt: ResourceType,
        namespace: str,
        name: str,
        options: Obj | None = None,
        dry_run: bool = False,
    ) -> tuple[Obj, bool]:
        """Delete (or start deleting) one object (deletion.py)."""

    @abstractmethod
    def _remove(self, rt: ResourceType, ns: str, name: str, *, dependents: bool = True) -> Obj:
        """Take an object out of the store now (deletion.py)."""

    @abstractmethod
    def _pod_waits_for_kubelet(self, rt: ResourceType, obj: Obj) -> bool:
        """A pod being deleted stays until its kubelet deletes it (deletion.py)."""

    @abstractmethod
    def _serve_crd(self, crd: Obj) -> None:
        """Serve the types of a stored CRD and record that in its status (crds.py)."""

    @abstractmethod
    def _unserve_crd(self, crd: Obj) -> None:
        """Stop serving a deleted CRD's types; its objects go (crds.py)."""
