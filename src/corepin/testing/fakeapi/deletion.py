"""Deletion in the fake API server: preconditions, graceful deletion of pods on a node (they
stay, with a deletion timestamp, until the kubelet deletes them), finalizers, namespaces (their
content goes first), propagation policies and the garbage collector's background deletion of
dependents, and deletecollection.
"""

from __future__ import annotations

import copy
import datetime as dt
from collections.abc import Iterable
from typing import Any

from corepin.testing.fakeapi import errors as err
from corepin.testing.fakeapi.base import ClusterBase
from corepin.testing.fakeapi.resources import ResourceType
from corepin.testing.fakeapi.selectors import FieldSelector, LabelSelector
from corepin.testing.fakeapi.store import Key, Obj, meta_of, now_text, view_of


class Deletion(ClusterBase):
    """DELETE and what follows from it."""

    def delete(
        self,
        rt: ResourceType,
        namespace: str,
        name: str,
        options: Obj | None = None,
        dry_run: bool = False,
    ) -> tuple[Obj, bool]:
        """Delete (or start deleting) one object; returns its last state and whether it is
        gone now."""
        opts = options or {}
        with self.lock:
            ns = namespace if rt.namespaced else ""
            current = self.store.objects_of(rt).get((ns, name))
            if current is None:
                raise err.not_found(rt, name)
            meta = meta_of(current)
            pre = opts.get("preconditions") or {}
            if pre.get("uid") and pre["uid"] != meta.get("uid"):
                raise err.conflict(
                    rt,
                    name,
                    f"Precondition failed: UID in precondition: "
                    f"{pre['uid']}, UID in object meta: {meta.get('uid')}",
                )
            if pre.get("resourceVersion") and pre["resourceVersion"] != meta["resourceVersion"]:
                raise err.conflict(
                    rt,
                    name,
                    "Precondition failed: ResourceVersion in "
                    f"precondition: {pre['resourceVersion']}, ResourceVersion in "
                    f"object meta: {meta['resourceVersion']}",
                )
            if dry_run:
                return view_of(rt, current), False
            grace = opts.get("gracePeriodSeconds")
            if rt.plural == "pods" and rt.builtin and self._graceful(current, grace):
                seconds = int(
                    grace
                    if grace is not None
                    else (current.get("spec") or {}).get("terminationGracePeriodSeconds", 30)
                )
                new = copy.deepcopy(current)
                new_meta = meta_of(new)
                if (
                    new_meta.get("deletionGracePeriodSeconds") is not None
                    and seconds >= new_meta["deletionGracePeriodSeconds"]
                ):
                    return view_of(rt, current), False
                when = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=seconds)
                new_meta["deletionTimestamp"] = when.strftime("%Y-%m-%dT%H:%M:%SZ")
                new_meta["deletionGracePeriodSeconds"] = seconds
                stored = self.commit(rt, ns, name, "MODIFIED", new, current)
                return view_of(rt, stored), False
            if meta.get("finalizers") or (
                rt.plural == "namespaces" and rt.builtin and self._namespace_has_content(name)
            ):
                if meta.get("deletionTimestamp"):
                    return view_of(rt, current), False
                new = copy.deepcopy(current)
                meta_of(new)["deletionTimestamp"] = now_text()
                meta_of(new)["deletionGracePeriodSeconds"] = 0
                if rt.plural == "namespaces" and rt.builtin:
                    new.setdefault("status", {})["phase"] = "Terminating"
                stored = self.commit(rt, ns, name, "MODIFIED", new, current)
                if rt.plural == "namespaces" and rt.builtin:
                    self._empty_namespace(name)
                    if not meta_of(stored).get("finalizers"):
                        return view_of(rt, self._remove(rt, ns, name)), True
                return view_of(rt, stored), False
            policy = opts.get("propagationPolicy") or "Background"
            if policy == "Orphan":
                self._orphan(meta.get("uid", ""))
            last = self._remove(rt, ns, name, dependents=policy != "Orphan")
            return view_of(rt, last), True

    def _graceful(self, pod: Obj, grace: Any) -> bool:
        if not self.graceful_pod_deletion or grace == 0:
            return False
        return bool((pod.get("spec") or {}).get("nodeName"))

    def _pod_waits_for_kubelet(self, rt: ResourceType, obj: Obj) -> bool:
        return (
            rt.plural == "pods"
            and rt.builtin
            and self._graceful(obj, None)
            and meta_of(obj).get("deletionGracePeriodSeconds", 0) != 0
        )

    def _remove(self, rt: ResourceType, ns: str, name: str, *, dependents: bool = True) -> Obj:
        current = self.store.objects_of(rt)[(ns, name)]
        last = self.commit(rt, ns, name, "DELETED", current, current)
        if rt.group == "apiextensions.k8s.io":
            self._unserve_crd(last)
        if dependents:
            self._collect_garbage(meta_of(last).get("uid", ""))
        return last

    def _namespace_has_content(self, namespace: str) -> bool:
        return any(
            k[0] == namespace
            for s, objs in self.objects.items()
            if s != ("", "namespaces")
            for k in objs
        )

    def _empty_namespace(self, namespace: str) -> None:
        for storage, objs in list(self.objects.items()):
            rt = self.registry.any_type(storage)
            if rt is None or not rt.namespaced:
                continue
            for key in [k for k in objs if k[0] == namespace]:
                if key in objs:
                    self._remove(rt, key[0], key[1])
        ns_rt = self.resource("", "v1", "namespaces")
        current = self.store.objects_of(ns_rt).get(("", namespace))
        if current is not None:
            new = copy.deepcopy(current)
            new.setdefault("spec", {})["finalizers"] = []
            self.commit(ns_rt, "", namespace, "MODIFIED", new, current)

    def _dependents(self, uid: str) -> Iterable[tuple[ResourceType, Key, Obj]]:
        for storage, objs in list(self.objects.items()):
            rt = self.registry.any_type(storage)
            if rt is None:
                continue
            for key, obj in list(objs.items()):
                refs = meta_of(obj).get("ownerReferences") or []
                if any(r.get("uid") == uid for r in refs):
                    yield rt, key, obj

    def _collect_garbage(self, uid: str) -> None:
        """The garbage collector's background deletion: dependents whose owners are all gone."""
        if not uid:
            return
        live = {(meta_of(o).get("uid")) for objs in self.objects.values() for o in objs.values()}
        for rt, key, obj in list(self._dependents(uid)):
            owners = {r.get("uid") for r in meta_of(obj).get("ownerReferences") or []}
            if owners & live:
                continue
            if key in self.store.objects_of(rt):
                self.delete(rt, key[0], key[1])

    def _orphan(self, uid: str) -> None:
        for rt, key, obj in list(self._dependents(uid)):
            new = copy.deepcopy(obj)
            refs = [r for r in meta_of(new).get("ownerReferences") or [] if r.get("uid") != uid]
            if refs:
                meta_of(new)["ownerReferences"] = refs
            else:
                meta_of(new).pop("ownerReferences", None)
            self.commit(rt, key[0], key[1], "MODIFIED", new, obj)

    def delete_collection(
        self, rt: ResourceType, namespace: str | None, labels: LabelSelector, fields: FieldSelector
    ) -> Obj:
        with self.lock:
            listing = self.store.list(rt, namespace, labels, fields)
            for item in listing["items"]:
                meta = item["metadata"]
                self.delete(rt, meta.get("namespace", ""), meta["name"])
            return listing
