"""The controller's writes to PodCPUBindings, with optimistic concurrency: deleting a binding
whose pod is gone, adopting a user-written one (an owner reference to its pod), and writing
the status a verdict calls for (with its Event and log line).

Every write carries the resourceVersion read; a 409 Conflict re-reads the object (a GET),
decides again on what it now says, and writes again - at most `conflict_retries` times, then
`ConflictsExhausted` (the worker queues the key again with backoff). Statuses go through the
status subresource.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Mapping
from typing import Any

from corepin.agent.cluster.controller import rules
from corepin.agent.cluster.controller.metrics import ControllerMetrics
from corepin.core.errors import ApiConflict, ApiNotFound, CorepinError
from corepin.kube.client import KubeClient, Resource
from corepin.kube.events import EventRecorder
from corepin.kube.informer import Obj
from corepin.kube.models import (
    VALIDATED,
    ObjectMeta,
    ObjectView,
    find_condition,
    pod_owner,
    pod_owner_uid,
)
from corepin.kube.resources import PCB, PODS
from corepin.kube.workqueue import WorkQueue

Key = tuple[str, ...]

log = logging.getLogger("corepin.controller")


class ConflictsExhausted(CorepinError):
    """A write kept meeting 409 Conflict: the key is queued again with backoff."""

    default_reason = "conflicts_exhausted"


def reread_after_conflict(
    client: KubeClient,
    metrics: ControllerMetrics,
    resource: Resource,
    name: str,
    namespace: str | None = None,
) -> Obj | None:
    """After a 409 on a write: count it and read the object again (None: it is gone, so
    there is nothing left to write)."""
    metrics.conflicts.labels(resource.plural).inc()
    try:
        return client.get(resource, name, namespace)
    except ApiNotFound:
        return None


def read_pod(client: KubeClient, namespace: str, name: str) -> rules.PodFacts | None:
    """The pod as the API has it now (a GET: the cache may not have seen it yet)."""
    if not name:
        return None
    try:
        return rules.pod_facts(client.get(PODS, name, namespace))
    except ApiNotFound:
        return None


class BindingWriter:
    """The writes of one controller to PodCPUBindings (see the module docstring); the
    worker's alone, like what it remembers of its last status writes."""

    def __init__(
        self,
        client: KubeClient,
        metrics: ControllerMetrics,
        events: EventRecorder,
        queue: WorkQueue[Key],
        *,
        conflict_retries: int,
        clock: Callable[[], dt.datetime],
    ) -> None:
        self.client = client
        self.conflict_retries = conflict_retries
        self.metrics = metrics
        self.events = events
        self.queue = queue
        self._clock = clock
        # (namespace, binding name) -> (resourceVersion our last status write replaced, the
        # object it returned): newer than a cached copy still at that version (worker only)
        self._written: dict[tuple[str, str], tuple[str, Obj]] = {}

    # ------------------------------------------------------------------ our last writes
    def current(self, obj: Obj) -> Obj:
        """The cached binding, or what our last status write of it returned while the cache
        still holds the version that write replaced (its watch event is on the way): deciding
        on the older copy would write again only to get a 409."""
        meta = ObjectView(obj).metadata
        key = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        written = self._written.get(key)
        if written is None:
            return obj
        if written[0] == meta.get("resourceVersion"):
            return written[1]
        del self._written[key]  # the cache has moved on (to our write or past it)
        return obj

    def forget(self, namespace: str, name: str) -> None:
        """The binding is gone."""
        self._written.pop((namespace, name), None)

    def _reread(self, name: str, namespace: str) -> Obj | None:
        return reread_after_conflict(self.client, self.metrics, PCB, name, namespace)

    # ------------------------------------------------------------------ owners
    def delete_orphan(self, obj: Obj, owner: str, pod: rules.PodFacts | None) -> None:
        """Delete a binding whose pod (uid `owner`) is gone (`pod` is what has the name now,
        if anything), with the binding's uid and resourceVersion as preconditions; on 409
        re-read and decide again."""
        for _ in range(self.conflict_retries):
            meta = ObjectView(obj).metadata
            ns, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
            pod_name = rules.binding_pod(obj)[1]
            try:
                self.client.delete(
                    PCB,
                    name,
                    ns,
                    uid=str(meta.get("uid") or "") or None,
                    resource_version=str(meta.get("resourceVersion") or "") or None,
                )
            except ApiNotFound:
                return
            except ApiConflict:
                reread = self._reread(name, ns)
                if reread is None:
                    return
                fresh = reread
                fresh_owner = pod_owner_uid(
                    ObjectMeta.from_dict(ObjectView(fresh).metadata).owner_references, pod_name
                )
                if fresh_owner is None or fresh.get("metadata", {}).get("uid") != meta.get("uid"):
                    self.queue.add(("binding", ns, name))
                    return
                obj, owner = fresh, fresh_owner
                pod = read_pod(self.client, ns, pod_name)
                if pod is not None and pod.uid == owner:
                    return  # the pod is there after all
                continue
            self.metrics.orphans_deleted.inc()
            why = (
                f"pod {ns}/{pod_name} (uid {owner}) is gone"
                if pod is None or not pod.uid
                else f"pod {ns}/{pod_name} is now uid {pod.uid}, not {owner}"
            )
            log.info("event=orphan_deleted binding=%s/%s pod_uid=%s", ns, name, owner)
            self.events.event(obj, "Normal", "OrphanDeleted", f"deleted: {why}")
            return
        raise ConflictsExhausted(f"deleting orphaned binding {rules.label(*rules.key_of(obj))}")

    def adopt(self, obj: Obj, pod: rules.PodFacts) -> None:
        """Give a user-written binding an owner reference to its pod (so it goes with that
        pod incarnation, by the garbage collector or by this controller)."""
        for _ in range(self.conflict_retries):
            body = {k: v for k, v in obj.items() if k != "status"}
            meta = dict(ObjectView(obj).metadata)
            owners = list(meta.get("ownerReferences") or [])
            owners.append(pod_owner(pod.name, pod.uid).to_dict())
            meta["ownerReferences"] = owners
            body["metadata"] = meta
            ns, name = rules.key_of(obj)
            try:
                self.client.replace(PCB, body, ns)
            except ApiNotFound:
                return
            except ApiConflict:
                reread = self._reread(name, ns)
                if reread is None:
                    return
                obj = reread
                fresh = ObjectMeta.from_dict(ObjectView(obj).metadata)
                if pod_owner_uid(fresh.owner_references, pod.name) is not None:
                    return
                continue
            self.metrics.adopted.inc()
            log.info("event=adopted binding=%s/%s pod=%s pod_uid=%s", ns, name, pod.name, pod.uid)
            return
        raise ConflictsExhausted(f"adopting binding {rules.label(*rules.key_of(obj))}")

    # ------------------------------------------------------------------ status
    def write_verdict(self, obj: Obj, verdict: rules.Verdict) -> None:
        """Write the status `verdict` calls for (nothing when it is there already)."""
        ns, name = rules.key_of(obj)
        uid = ObjectView(obj).metadata.get("uid")
        generation = ObjectView(obj).metadata.get("generation")
        for _ in range(self.conflict_retries):
            old = obj.get("status") if isinstance(obj.get("status"), Mapping) else None
            status = rules.next_status(old, verdict, self._clock())
            if status is None:
                return
            body = {**obj, "status": status}
            try:
                written = self.client.replace_status(PCB, body, ns)
            except ApiNotFound:
                return
            except ApiConflict:
                reread = self._reread(name, ns)
                if reread is None:
                    return
                obj = reread
                fresh = ObjectView(obj).metadata
                if fresh.get("uid") != uid or fresh.get("generation") != generation:
                    # the spec (or the object) changed: decide it again from scratch
                    self.queue.add(("binding", ns, name))
                    return
                continue
            replaced = ObjectView(obj).metadata.get("resourceVersion")
            if (
                replaced
                and isinstance(written, Mapping)
                and ObjectView(written).metadata.get("resourceVersion")
            ):
                self._written[(ns, name)] = (str(replaced), written)
            self._report(obj, old, status, verdict)
            return
        raise ConflictsExhausted(f"writing the status of binding {ns}/{name}")

    def _report(
        self, obj: Obj, old: Mapping[str, Any] | None, new: Mapping[str, Any], v: rules.Verdict
    ) -> None:
        ns, name = rules.key_of(obj)
        before = str((old or {}).get("phase") or "Pending")
        after = str(new.get("phase") or "Pending")
        self.metrics.verdicts.labels(v.phase, v.reason).inc()
        log.info(
            "event=binding_status binding=%s/%s phase=%s previous=%s reason=%s node=%s message=%r",
            ns,
            name,
            after,
            before,
            v.reason,
            v.node or "",
            v.message,
        )
        old_conditions = rules.read_conditions(old or {})
        previous = find_condition(old_conditions, VALIDATED)
        changed = (
            previous is None
            or previous.reason != v.reason
            or previous.status != v.condition_status
            or before != after
        )
        if changed:
            kind = "Warning" if v.phase == rules.FAILED else "Normal"
            reason = VALIDATED if v.phase == rules.VALID else v.reason
            self.events.event(obj, kind, reason, v.message)


__all__ = ["BindingWriter", "ConflictsExhausted", "read_pod", "reread_after_conflict"]
