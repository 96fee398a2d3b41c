"""Serving CustomResourceDefinitions: a stored CRD's versions become served resource types and
its status says so (names accepted, established); a deleted CRD's types stop being served, its
objects go and the watches on them end.
"""

from __future__ import annotations

import copy

from corepin.testing.fakeapi.base import ClusterBase
from corepin.testing.fakeapi.registry import crd_resource_types
from corepin.testing.fakeapi.store import Obj, meta_of, now_text


def crd_status(crd: Obj) -> Obj:
    """The status the API server gives a CRD it serves."""
    spec = crd.get("spec") or {}
    return {
        "acceptedNames": copy.deepcopy(spec["names"]),
        "storedVersions": [v["name"] for v in spec.get("versions") or [] if v.get("storage")],
        "conditions": [
            {
                "type": "NamesAccepted",
                "status": "True",
                "reason": "NoConflicts",
                "message": "no conflicts found",
                "lastTransitionTime": now_text(),
            },
            {
                "type": "Established",
                "status": "True",
                "reason": "InitialNamesAccepted",
                "message": "the initial names have been accepted",
                "lastTransitionTime": now_text(),
            },
        ],
    }


class CrdServing(ClusterBase):
    """The apiextensions side of the cluster (the caller holds the lock)."""

    def _serve_crd(self, crd: Obj) -> None:
        spec = crd.get("spec") or {}
        self.registry.drop_custom(spec["group"], spec["names"]["plural"])
        for rt in crd_resource_types(crd):
            self.registry.register(rt)
        rt = self.resource("apiextensions.k8s.io", "v1", "customresourcedefinitions")
        name = meta_of(crd)["name"]
        current = self.store.objects_of(rt)[("", name)]
        status = crd_status(crd)
        if (
            current.get("status", {}).get("acceptedNames") != status["acceptedNames"]
            or current.get("status", {}).get("storedVersions") != status["storedVersions"]
        ):
            new = copy.deepcopy(current)
            new["status"] = status
            self.commit(rt, "", name, "MODIFIED", new, current)

    def _unserve_crd(self, crd: Obj) -> None:
        spec = crd.get("spec") or {}
        group, plural = spec.get("group", ""), (spec.get("names") or {}).get("plural", "")
        storage = (group, plural)
        rt = self.registry.any_type(storage)
        if rt is not None:
            for key in list(self.objects.get(storage, {})):
                self._remove(rt, key[0], key[1])
        self.store.drop_watches(abrupt=False, storage=storage)
        self.registry.unregister(storage)
