"""The pods' POST-only subresources in the fake API server: `binding` (what a scheduler does
to place a pod) and `eviction` (PodDisruptionBudgets honoured; see disruption.py).
"""

from __future__ import annotations

import copy

from corepin.testing.fakeapi import disruption
from corepin.testing.fakeapi import errors as err
from corepin.testing.fakeapi.base import ClusterBase
from corepin.testing.fakeapi.schema import FieldError
from corepin.testing.fakeapi.store import Obj, meta_of, now_text


class Subresources(ClusterBase):
    """pods/eviction and pods/binding."""

    # ------------------------------------------------------------------ pods/eviction
    def evict(self, namespace: str, name: str, body: Obj, dry_run: list[str]) -> Obj:
        """POST pods/NAME/eviction (PodDisruptionBudgets honoured; see disruption.py)."""
        return disruption.evict(self, namespace, name, body, dry_run)

    # ------------------------------------------------------------------ pods/binding
    def bind(self, namespace: str, name: str, binding: Obj) -> Obj:
        rt = self.resource("", "v1", "pods")
        with self.lock:
            current = self.store.objects_of(rt).get((namespace, name))
            if current is None:
                raise err.not_found(rt, name)
            bmeta = binding.get("metadata") or {}
            if bmeta.get("name") not in (None, name):
                raise err.bad_request("name in URL does not match name in Binding object")
            target = binding.get("target") or {}
            node = target.get("name")
            if not node:
                raise err.invalid(
                    rt, name, [FieldError("target.name", "FieldValueRequired", "Required value")]
                )
            if (current.get("spec") or {}).get("nodeName"):
                raise err.conflict(
                    rt,
                    name,
                    f'pod {name} is already assigned to node "{current["spec"]["nodeName"]}"',
                    resource="pods/binding",
                )
            if meta_of(current).get("deletionTimestamp"):
                raise err.conflict(
                    rt,
                    name,
                    f"pod {name} is being deleted, cannot be assigned to a host",
                    resource="pods/binding",
                )
            new = copy.deepcopy(current)
            new.setdefault("spec", {})["nodeName"] = node
            if bmeta.get("annotations"):
                meta_of(new).setdefault("annotations", {}).update(bmeta["annotations"])
            conditions = [
                c
                for c in (new.setdefault("status", {}).get("conditions") or [])
                if c.get("type") != "PodScheduled"
            ]
            conditions.append(
                {
                    "type": "PodScheduled",
                    "status": "True",
                    "lastProbeTime": None,
                    "lastTransitionTime": now_text(),
                }
            )
            new["status"]["conditions"] = conditions
            self.commit(rt, namespace, name, "MODIFIED", new, current)
            return {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Success",
                "code": 201,
            }
