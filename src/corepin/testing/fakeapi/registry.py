"""The resource types one fake API server serves: the built-in kinds and those its
CustomResourceDefinitions add, by group and version, for routing and discovery.
"""

from __future__ import annotations

import threading

from corepin.testing.fakeapi import errors as err
from corepin.testing.fakeapi.resources import Column, ResourceType, builtin_types
from corepin.testing.fakeapi.store import Obj, Storage


class Registry:
    """Served resource types by (group, version) and plural, groups in registration order.

    The lock is the store's: the types change with the CRDs stored."""

    def __init__(self, lock: threading.RLock) -> None:
        self.lock = lock
        self.types: dict[tuple[str, str], dict[str, ResourceType]] = {}
        self.group_order: list[str] = []
        for rt in builtin_types():
            self.register(rt)

    def register(self, rt: ResourceType) -> None:
        self.types.setdefault((rt.group, rt.version), {})[rt.plural] = rt
        if rt.group and rt.group not in self.group_order:
            self.group_order.append(rt.group)

    def unregister(self, storage: Storage) -> None:
        """Stop serving every version of `storage` (group, plural)."""
        for gv in list(self.types):
            self.types[gv] = {p: t for p, t in self.types[gv].items() if t.storage != storage}
            if not self.types[gv]:
                del self.types[gv]

    def drop_custom(self, group: str, plural: str) -> None:
        """Forget the custom resource types of `plural` in `group` (before a CRD is served
        again), leaving the group-versions in place."""
        for rt_list in self.types.values():
            for name, rt in list(rt_list.items()):
                if not rt.builtin and rt.group == group and rt.plural == plural:
                    del rt_list[name]

    def resource(self, group: str, version: str, plural: str) -> ResourceType:
        with self.lock:
            found = self.types.get((group, version), {}).get(plural)
        if found is None:
            raise err.ApiFailure(
                404, "NotFound", "the server could not find the requested resource", {}
            )
        return found

    def find_resource(self, group: str, version: str, plural: str) -> ResourceType | None:
        with self.lock:
            return self.types.get((group, version), {}).get(plural)

    def group_versions(self) -> dict[str, list[str]]:
        """Served groups (in registration order) and their versions; "" is the core group."""
        with self.lock:
            out: dict[str, list[str]] = {}
            for group, version in self.types:
                if self.types[(group, version)]:
                    out.setdefault(group, []).append(version)
            return out

    def resources_of(self, group: str, version: str) -> list[ResourceType]:
        with self.lock:
            return list(self.types.get((group, version), {}).values())

    def any_type(self, storage: Storage) -> ResourceType | None:
        """One type serving `storage` (events.k8s.io's view of events excepted)."""
        for types in self.types.values():
            for rt in types.values():
                if rt.storage == storage and rt.group != "events.k8s.io":
                    return rt
        return None


def crd_resource_types(crd: Obj) -> list[ResourceType]:
    """The resource types a CustomResourceDefinition serves: one per served version."""
    spec = crd.get("spec") or {}
    group = spec["group"]
    names = spec["names"]
    out: list[ResourceType] = []
    for version in spec.get("versions") or []:
        if not version.get("served", True):
            continue
        subresources = frozenset(
            k for k in (version.get("subresources") or {}) if k in ("status", "scale")
        )
        columns = tuple(
            Column(
                c["name"],
                c.get("type", "string"),
                c.get("jsonPath", ""),
                int(c.get("priority", 0)),
                c.get("description", ""),
            )
            for c in version.get("additionalPrinterColumns") or []
        )
        if not version.get("additionalPrinterColumns"):
            columns = (Column("Age", "date", ".metadata.creationTimestamp"),)
        out.append(
            ResourceType(
                group,
                version["name"],
                names["plural"],
                names.get("singular") or names["kind"].lower(),
                names["kind"],
                spec.get("scope") == "Namespaced",
                tuple(names.get("shortNames") or ()),
                tuple(names.get("categories") or ()),
                subresources,
                None,
                columns,
                False,
                ((version.get("schema") or {}).get("openAPIV3Schema")),
                False,
                True,
                (group, names["plural"]),
            )
        )
    return out
