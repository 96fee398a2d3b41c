"""PATCH in the fake API server: JSON merge patches, JSON patches, strategic merge patches
(built-in kinds only) and server-side apply (field managers, conflicts, `force`), each ending in
the update every write goes through (writes.py).
"""

from __future__ import annotations

import copy
from typing import Any

from corepin.testing.fakeapi import apply as ssa
from corepin.testing.fakeapi import errors as err
from corepin.testing.fakeapi.patch import PatchError, json_patch, merge_patch, strategic_merge_patch
from corepin.testing.fakeapi.resources import ResourceType
from corepin.testing.fakeapi.store import Obj, meta_of, to_storage, view_of
from corepin.testing.fakeapi.writes import WriteOptions, WriteResult, Writes

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"


class Patching(Writes):
    """PATCH, by content type."""

    def patch(
        self,
        rt: ResourceType,
        namespace: str,
        name: str,
        patch_type: str,
        body: Any,
        options: WriteOptions | None = None,
        subresource: str = "",
    ) -> WriteResult:
        opts = options or WriteOptions()
        with self.lock:
            ns = namespace if rt.namespaced else ""
            current = self.store.objects_of(rt).get((ns, name))
            if patch_type == APPLY_PATCH:
                return self._apply(rt, namespace, name, body, opts, subresource, current)
            if patch_type == STRATEGIC_PATCH and not rt.builtin:
                raise err.unsupported_media([JSON_PATCH, MERGE_PATCH, APPLY_PATCH])
            if patch_type not in (MERGE_PATCH, JSON_PATCH, STRATEGIC_PATCH):
                raise err.unsupported_media([JSON_PATCH, MERGE_PATCH, STRATEGIC_PATCH, APPLY_PATCH])
            if current is None:
                raise err.not_found(rt, name)
            view = view_of(rt, current)
            try:
                if patch_type == MERGE_PATCH:
                    if not isinstance(body, dict):
                        raise PatchError("json: cannot unmarshal into object", 400)
                    patched = merge_patch(view, body)
                elif patch_type == JSON_PATCH:
                    patched = json_patch(view, body)
                else:
                    if not isinstance(body, dict):
                        raise PatchError("json: cannot unmarshal into object", 400)
                    patched = strategic_merge_patch(view, body, rt.list_keys)
            except PatchError as exc:
                if exc.code == 400:
                    raise err.bad_request(str(exc)) from None
                raise err.ApiFailure(422, "Invalid", str(exc)) from None
            if not isinstance(patched, dict):
                raise err.bad_request("the patch did not produce an object")
            patched_meta = meta_of(patched)
            patched_rv = patched_meta.get("resourceVersion")
            if patched_rv and patched_rv != meta_of(view).get("resourceVersion"):
                raise err.conflict(rt, name)
            if patched_meta.get("uid") not in (None, meta_of(view).get("uid")):
                raise err.conflict(
                    rt,
                    name,
                    "Precondition failed: UID in precondition: "
                    f"{patched_meta.get('uid')}, UID in object meta: "
                    f"{meta_of(view).get('uid')}",
                )
            new = to_storage(rt, patched)
            return self._update_tracked(rt, ns, name, current, new, opts, subresource)

    def _apply(
        self,
        rt: ResourceType,
        namespace: str,
        name: str,
        body: Any,
        opts: WriteOptions,
        subresource: str,
        current: Obj | None,
    ) -> WriteResult:
        if not opts.field_manager:
            raise err.ApiFailure(
                422,
                "Invalid",
                'PatchOptions.meta.k8s.io "" is invalid: '
                "fieldManager: Required value: is required for apply patch",
            )
        if not isinstance(body, dict):
            raise err.bad_request(
                "error decoding YAML: the applied configuration must be an object"
            )
        if body.get("apiVersion") != rt.api_version or body.get("kind") != rt.kind:
            raise err.bad_request(
                f"the API version and kind in the applied configuration "
                f"({body.get('apiVersion')}, {body.get('kind')}) must be "
                f"{rt.api_version}, {rt.kind}"
            )
        if meta_of(body).get("name") not in (None, name):
            raise err.bad_request(
                f"the name of the object ({meta_of(body).get('name')}) does not "
                f"match the name on the URL ({name})"
            )
        applied = to_storage(rt, copy.deepcopy(body))
        meta_of(applied)["name"] = name
        if current is None:
            if subresource:
                raise err.not_found(rt, name)
            merged, entries = ssa.server_side_apply(
                None, applied, [], opts.field_manager, rt.api_version, "", opts.force, rt.list_keys
            )
            meta_of(merged)["managedFields"] = [e.to_json() for e in entries]
            create_opts = WriteOptions("", opts.field_validation, opts.dry_run)
            result = self.create(rt, namespace, merged, create_opts, prechecked=True)
            return result
        try:
            merged, entries = ssa.server_side_apply(
                self._strip(current),
                applied,
                ssa.entries_from(current),
                opts.field_manager,
                rt.api_version,
                subresource,
                opts.force,
                rt.list_keys,
            )
        except ssa.ApplyConflicts as exc:
            causes = [
                {
                    "reason": "FieldManagerConflict",
                    "message": f'conflict with "{c.manager}" using {exc.api_version}',
                    "field": c.path,
                }
                for c in exc.conflicts
            ]
            raise err.ApiFailure(
                409, "Conflict", str(exc), {"name": name, "kind": rt.plural, "causes": causes}
            ) from None
        given_rv = meta_of(applied).get("resourceVersion")
        if given_rv and given_rv != meta_of(current)["resourceVersion"]:
            raise err.conflict(rt, name)
        ns = namespace if rt.namespaced else ""
        return self._update(rt, ns, name, current, merged, opts, subresource, entries)
