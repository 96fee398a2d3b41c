"""Writes in the fake API server: create, replace (update, also through `status` and `resize`)
and what every write goes through: kind and namespace checks, generated names, defaulting and
pruning by a CRD's schema (`fieldValidation`), validation, managed fields, generations, no-op
updates, and what each subresource may change. Patches and server-side apply: patching.py.
"""

from __future__ import annotations

import copy
import json
import random
import uuid
from dataclasses import dataclass, field

from corepin.testing.fakeapi import apply as ssa
from corepin.testing.fakeapi import errors as err
from corepin.testing.fakeapi.base import ClusterBase
from corepin.testing.fakeapi.kinds import builtin_problems, check_name, default_pod, prepare_builtin
from corepin.testing.fakeapi.resources import ResourceType
from corepin.testing.fakeapi.schema import FieldError, apply_defaults, prune, validate
from corepin.testing.fakeapi.store import Obj, meta_of, now_text, to_storage, view_of

_GENERATE_CHARS = "bcdfghjklmnpqrstvwxz2456789"


@dataclass
class WriteOptions:
    field_manager: str = ""
    field_validation: str = "Warn"  # Strict | Warn | Ignore
    dry_run: bool = False
    force: bool = False


@dataclass
class WriteResult:
    obj: Obj
    created: bool = False
    warnings: list[str] = field(default_factory=list)


class Writes(ClusterBase):
    """POST and PUT, and the steps every write shares."""

    def create(
        self,
        rt: ResourceType,
        namespace: str,
        body: Obj,
        options: WriteOptions | None = None,
        *,
        prechecked: bool = False,
    ) -> WriteResult:
        opts = options or WriteOptions()
        with self.lock:
            obj = to_storage(rt, copy.deepcopy(body))
            self._check_type(rt, obj)
            meta = meta_of(obj)
            ns = self._scope_namespace(rt, namespace, meta)
            if meta.get("resourceVersion"):
                raise err.internal("resourceVersion should not be set on objects to be created")
            if not meta.get("name") and meta.get("generateName"):
                meta["name"] = meta["generateName"] + "".join(
                    random.choice(_GENERATE_CHARS) for _ in range(5)
                )
            name = str(meta.get("name") or "")
            if not name:
                raise err.invalid(
                    rt,
                    "",
                    [
                        FieldError(
                            "metadata.name",
                            "FieldValueRequired",
                            "Required value: name or generateName is required",
                        )
                    ],
                )
            check_name(rt, name)
            if (ns, name) in self.store.objects_of(rt):
                raise err.already_exists(rt, name)
            for key in ("uid", "deletionTimestamp", "deletionGracePeriodSeconds", "selfLink"):
                meta.pop(key, None)
            meta["uid"] = str(uuid.uuid4())
            meta["creationTimestamp"] = now_text()
            if rt.track_generation:
                meta["generation"] = 1
            else:
                meta.pop("generation", None)
            warnings = self._prepare_create(rt, obj, opts)
            self._validate(rt, name, obj, None)
            if opts.field_manager:
                entries = ssa.track_update(
                    None, self._strip(obj), [], opts.field_manager, rt.api_version, "", rt.list_keys
                )
                meta["managedFields"] = [e.to_json() for e in entries]
            elif not prechecked:
                meta.pop("managedFields", None)
            if opts.dry_run:
                return WriteResult(view_of(rt, obj), True, warnings)
            stored = self.commit(rt, ns, name, "ADDED", obj, None)
            if rt.group == "apiextensions.k8s.io":
                self._serve_crd(stored)
                stored = self.store.objects_of(rt)[(ns, name)]
            return WriteResult(view_of(rt, stored), True, warnings)

    def _check_type(self, rt: ResourceType, obj: Obj) -> None:
        api_version = obj.setdefault(
            "apiVersion", rt.api_version if rt.group != "events.k8s.io" else "v1"
        )
        kind = obj.setdefault("kind", rt.kind)
        expected = "v1" if rt.group == "events.k8s.io" else rt.api_version
        if kind != rt.kind:
            raise err.bad_request(
                f"the server could not find the requested resource: kind "
                f"{kind} does not match {rt.kind}"
            )
        if api_version != expected:
            raise err.bad_request(
                f"the API version in the data ({api_version}) does not match "
                f"the expected API version ({rt.api_version})"
            )

    def _scope_namespace(self, rt: ResourceType, namespace: str, meta: Obj) -> str:
        if not rt.namespaced:
            meta.pop("namespace", None)
            return ""
        given = meta.get("namespace")
        if given and given != namespace:
            raise err.bad_request(
                "the namespace of the provided object does not match the "
                "namespace sent on the request"
            )
        meta["namespace"] = namespace
        if ("", namespace) not in self.objects.get(("", "namespaces"), {}):
            raise err.ApiFailure(
                404,
                "NotFound",
                f'namespaces "{namespace}" not found',
                {"name": namespace, "kind": "namespaces"},
            )
        return namespace

    def _prepare_create(self, rt: ResourceType, obj: Obj, opts: WriteOptions) -> list[str]:
        if rt.builtin:
            prepare_builtin(rt, obj)
            return []
        if "status" in rt.subresources:
            obj.pop("status", None)
        return self._schema(rt, obj, opts)

    def _schema(self, rt: ResourceType, obj: Obj, opts: WriteOptions) -> list[str]:
        if rt.schema is None:
            return []
        dropped: list[str] = []
        prune(obj, rt.schema, "", dropped, root=True)
        apply_defaults(obj, rt.schema)
        if dropped and opts.field_validation == "Strict":
            fields = ", ".join(f'unknown field "{d}"' for d in dropped)
            raise err.bad_request(
                f'{rt.kind} in version "{rt.version}" cannot be handled as a '
                f"{rt.kind}: strict decoding error: {fields}"
            )
        if opts.field_validation == "Ignore":
            return []
        return [f'unknown field "{d}"' for d in dropped]

    def _validate(
        self, rt: ResourceType, name: str, obj: Obj, old: Obj | None, subresource: str = ""
    ) -> None:
        problems = (
            validate(obj, rt.schema)
            if rt.schema is not None
            else builtin_problems(rt, obj, old, subresource)
        )
        meta = meta_of(obj)
        for key in ("labels", "annotations"):
            value = meta.get(key)
            if value is not None and (
                not isinstance(value, dict) or any(not isinstance(v, str) for v in value.values())
            ):
                problems.append(
                    FieldError(
                        f"metadata.{key}",
                        "FieldValueTypeInvalid",
                        "Invalid value: must be a map of strings",
                    )
                )
        if problems:
            raise err.invalid(rt, name, problems)

    # ------------------------------------------------------------------ writes: update
    def replace(
        self,
        rt: ResourceType,
        namespace: str,
        name: str,
        body: Obj,
        options: WriteOptions | None = None,
        subresource: str = "",
    ) -> WriteResult:
        opts = options or WriteOptions()
        with self.lock:
            ns = namespace if rt.namespaced else ""
            current = self.store.objects_of(rt).get((ns, name))
            new = to_storage(rt, copy.deepcopy(body))
            meta = meta_of(new)
            if meta.get("name") not in (None, name):
                raise err.bad_request(
                    f"the name of the object ({meta.get('name')}) does not "
                    f"match the name on the URL ({name})"
                )
            if current is None:
                if rt.allow_create_on_update and not subresource:
                    meta["name"] = name
                    meta.pop("resourceVersion", None)
                    return self.create(rt, namespace, new, opts)
                raise err.not_found(rt, name)
            self._check_type(rt, new)
            if rt.namespaced and meta.get("namespace") not in (None, "", ns):
                raise err.bad_request(
                    "the namespace of the provided object does not match the "
                    "namespace sent on the request"
                )
            given_rv = meta.get("resourceVersion")
            if given_rv and given_rv != meta_of(current)["resourceVersion"]:
                raise err.conflict(rt, name)
            return self._update_tracked(rt, ns, name, current, new, opts, subresource)

    def _update_tracked(
        self,
        rt: ResourceType,
        ns: str,
        name: str,
        current: Obj,
        new: Obj,
        opts: WriteOptions,
        subresource: str,
    ) -> WriteResult:
        """`_update` of an update or a patch, the writer's fields recorded in managedFields
        when it names a field manager (as the API server does for both)."""
        entries = ssa.entries_from(current)
        if opts.field_manager:
            entries = ssa.track_update(
                self._strip(current),
                self._strip(new),
                entries,
                opts.field_manager,
                rt.api_version,
                subresource,
                rt.list_keys,
            )
        return self._update(rt, ns, name, current, new, opts, subresource, entries)

    def _strip(self, obj: Obj) -> Obj:
        out = {k: v for k, v in obj.items()}
        out["metadata"] = {k: v for k, v in meta_of(obj).items() if k != "managedFields"}
        return out

    def _update(
        self,
        rt: ResourceType,
        ns: str,
        name: str,
        current: Obj,
        new: Obj,
        opts: WriteOptions,
        subresource: str,
        entries: list[ssa.ManagerEntry],
    ) -> WriteResult:
        new = self._merge_scope(rt, current, new, subresource)
        meta = meta_of(new)
        old_meta = meta_of(current)
        for key in (
            "uid",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "namespace",
            "name",
        ):
            if key in old_meta:
                meta[key] = old_meta[key]
            else:
                meta.pop(key, None)
        meta["resourceVersion"] = old_meta["resourceVersion"]
        if old_meta.get("deletionTimestamp"):
            added = set(meta.get("finalizers") or []) - set(old_meta.get("finalizers") or [])
            if added:
                raise err.invalid(
                    rt,
                    name,
                    [
                        FieldError(
                            "metadata.finalizers",
                            "FieldValueForbidden",
                            "Forbidden: no new finalizers can be added if the object is being "
                            f"deleted, found new finalizers {json.dumps(sorted(added))}",
                        )
                    ],
                )
        warnings: list[str] = []
        if not rt.builtin and not subresource:
            warnings = self._schema(rt, new, opts)
        elif not rt.builtin and rt.schema is not None:
            apply_defaults(new, rt.schema)
            dropped: list[str] = []
            prune(new, rt.schema, "", dropped, root=True)
        self._validate(rt, name, new, current, subresource)
        if rt.track_generation:
            generation = int(old_meta.get("generation") or 1)
            ignore = {"metadata", "status"} if "status" in rt.subresources else {"metadata"}
            before = {k: v for k, v in current.items() if k not in ignore}
            after = {k: v for k, v in new.items() if k not in ignore}
            meta["generation"] = generation + 1 if before != after else generation
        meta["managedFields"] = [e.to_json() for e in entries]
        if not meta["managedFields"]:
            meta.pop("managedFields")
        if self._same(current, new):
            return WriteResult(view_of(rt, current), False, warnings)
        if opts.dry_run:
            return WriteResult(view_of(rt, new), False, warnings)
        stored = self.commit(rt, ns, name, "MODIFIED", new, current)
        if (
            meta.get("deletionTimestamp")
            and not meta.get("finalizers")
            and not self._pod_waits_for_kubelet(rt, stored)
        ):
            self._remove(rt, ns, name)
        if rt.group == "apiextensions.k8s.io" and name in {
            n for (_, n) in self.store.objects_of(rt)
        }:
            self._serve_crd(self.store.objects_of(rt)[(ns, name)])
            stored = self.store.objects_of(rt)[(ns, name)]
        return WriteResult(view_of(rt, stored), False, warnings)

    def _same(self, a: Obj, b: Obj) -> bool:
        def canon(obj: Obj) -> Obj:
            out = copy.deepcopy(obj)
            meta = meta_of(out)
            meta.pop("resourceVersion", None)
            for entry in meta.get("managedFields") or []:
                entry.pop("time", None)
            out.pop("apiVersion", None)
            out.pop("kind", None)
            return out

        return canon(a) == canon(b)

    def _merge_scope(self, rt: ResourceType, current: Obj, new: Obj, subresource: str) -> Obj:
        """What a write through the main endpoint or /status may change."""
        if subresource == "status":
            out = copy.deepcopy(current)
            if "status" in new:
                out["status"] = new["status"]
            else:
                out.pop("status", None)
            if rt.plural == "pods":
                new_meta, out_meta = meta_of(new), meta_of(out)
                for key in ("labels", "annotations"):
                    if key in new_meta:
                        out_meta[key] = new_meta[key]
            out["metadata"]["managedFields"] = meta_of(new).get("managedFields")
            return out
        if subresource == "resize" and rt.plural == "pods" and rt.builtin:
            # only the spec comes from the request (validation then allows nothing but the
            # containers' resources and resize policies to differ); the API server's defaulting
            # runs on it again
            out = copy.deepcopy(current)
            out["spec"] = copy.deepcopy(new.get("spec") or {})
            out["metadata"]["managedFields"] = meta_of(new).get("managedFields")
            default_pod(out)
            return out
        if "status" in rt.subresources:
            if "status" in current:
                new["status"] = copy.deepcopy(current["status"])
            else:
                new.pop("status", None)
        return new
