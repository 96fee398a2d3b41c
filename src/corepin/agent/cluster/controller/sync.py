"""The controller's work on one key, from the informers' caches to the writes:

- `sync_binding(namespace, name)`: delete the binding when its pod is gone, give a
  user-written one an owner reference to its pod, then have its node decided (or decide it
  alone when it has no node: pod missing or not scheduled, spec unreadable);
- `sync_node(name)`: decide every user-written binding whose pod runs on the node (conflicts
  are a per-node question: `rules.decide_node`) and write the statuses that change.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from corepin.agent.cluster.controller import rules
from corepin.agent.cluster.controller.writer import BindingWriter, Key, read_pod
from corepin.kube.client import KubeClient
from corepin.kube.informer import Cache, Obj
from corepin.kube.models import (
    FieldError,
    ObjectMeta,
    ObjectView,
    PodCPUBinding,
    is_agent_binding,
    pod_owner_uid,
)
from corepin.kube.workqueue import WorkQueue


class BindingSync:
    """Decides the bindings of one controller (see the module docstring); the worker's."""

    def __init__(
        self,
        client: KubeClient,
        pods: Cache,
        bindings: Cache,
        topologies: Cache,
        writer: BindingWriter,
        queue: WorkQueue[Key],
    ) -> None:
        self.client = client
        self.pods = pods
        self.bindings = bindings
        self.topologies = topologies
        self.writer = writer
        self.queue = queue
        self._lock = threading.Lock()
        # node name -> (spec, status accounting, facts): NodeCPUTopology parsed once per change
        self._facts: dict[str, tuple[Any, Any, rules.NodeFacts]] = {}

    def forget_node(self, name: str) -> None:
        """The node's NodeCPUTopology is gone."""
        with self._lock:
            self._facts.pop(name, None)

    # ------------------------------------------------------------------ pods
    def _cached_pod(self, namespace: str, name: str) -> rules.PodFacts | None:
        pod = self.pods.get(name, namespace)
        return None if pod is None else rules.pod_facts(pod)

    @staticmethod
    def _node_of(obj: Mapping[str, Any], pod: rules.PodFacts | None) -> str | None:
        if pod is not None and pod.node:
            return pod.node
        status = obj.get("status")
        found = status.get("nodeName") if isinstance(status, Mapping) else None
        return str(found) if found else None

    # ------------------------------------------------------------------ bindings
    def sync_binding(self, namespace: str, name: str) -> None:
        obj = self.bindings.get(name, namespace)
        if obj is None:
            self.writer.forget(namespace, name)
            return
        obj = self.writer.current(obj)
        try:
            meta = ObjectMeta.from_dict(ObjectView(obj).metadata)
        except FieldError as exc:
            self.writer.write_verdict(obj, rules.invalid_spec(exc))
            return
        agent = is_agent_binding(meta.labels)
        pod_name = rules.binding_pod(obj)[1]
        owner = pod_owner_uid(meta.owner_references, pod_name)
        pod = self._cached_pod(namespace, pod_name) if pod_name else None
        if owner is not None and (pod is None or pod.uid != owner):
            pod = read_pod(self.client, namespace, pod_name)
            if pod is None or pod.uid != owner:
                self.writer.delete_orphan(obj, owner, pod)
                return
        if agent:
            node = self._node_of(obj, pod)
            if node:
                self.queue.add(("node", node))
            return
        try:
            binding = PodCPUBinding.from_dict(obj)
        except FieldError as exc:
            self.writer.write_verdict(obj, rules.invalid_spec(exc))
            return
        if pod is None:
            pod = read_pod(self.client, namespace, pod_name)
        if pod is not None and owner is None:
            self.writer.adopt(obj, pod)
        if pod is not None and pod.node:
            self.queue.add(("node", pod.node))
            return
        self.writer.write_verdict(obj, rules.check_binding(binding, pod, None))

    # ------------------------------------------------------------------ nodes
    def _node_facts(self, node: str) -> rules.NodeFacts | None:
        ncpt = self.topologies.get(node)
        if ncpt is None:
            return None
        spec = ncpt.get("spec")
        accounting = rules.accounting(ncpt)
        with self._lock:
            cached = self._facts.get(node)
        if cached is not None and cached[0] == spec and cached[1] == accounting:
            return cached[2]
        facts = rules.node_facts(ncpt)
        with self._lock:
            self._facts[node] = (spec, accounting, facts)
        return facts

    def _entry(
        self, obj: Obj, node: str, facts: rules.NodeFacts | None
    ) -> tuple[rules.Entry, Obj] | None:
        """The binding as an entry of `node`'s decision, or None when it is not on `node`."""
        meta = ObjectView(obj).metadata
        try:
            binding = PodCPUBinding.from_dict(obj)
        except FieldError:
            return None  # decided on its own (no node)
        agent = is_agent_binding(binding.metadata.labels)
        owner = pod_owner_uid(binding.metadata.owner_references, binding.spec.pod_name)
        if agent and (
            facts is None
            or not facts.confirms(
                binding.namespace, binding.spec.pod_name, owner, binding.spec.containers
            )
        ):
            # The label only says "not a request" (neither the agent nor this controller acts
            # on such a binding as one); it never makes a binding the agent's record. Anyone
            # who may create bindings may set it, so the record must be confirmed by what the
            # node's agent publishes through its NodeCPUTopology status (cluster scoped,
            # written by that node's agent only): an allocation of this pod uid and container
            # on exactly these CPUs. Unconfirmed (a forgery, or the agent's status not out
            # yet: the node is decided again when it is), it counts for nothing.
            return None
        phase = rules.status_phase(obj)
        holding = agent or phase in rules.HOLDING_PHASES
        pod = self._cached_pod(binding.namespace, binding.spec.pod_name)
        matches = pod is not None and (owner is None or owner == pod.uid)
        on = pod.node if matches and pod is not None else None
        if on is None and holding:
            on = self._node_of(obj, None)
        if on != node or not (matches or holding):
            return None
        cpus = rules.explicit_cpus(binding)
        if phase == "Applied" and not agent:
            cpus = cpus | rules.status_cpus(obj)
        claim = None
        if facts is not None and facts.topology is not None and cpus:
            claim = rules.claim_of(
                binding.namespace,
                binding.name,
                binding.spec.pod_name,
                binding.spec.level,
                cpus,
                facts.topology,
            )
        own = None if agent or not matches else rules.check_binding(binding, pod, facts)
        entry = rules.Entry(
            binding.namespace,
            binding.name,
            binding.spec.pod_name,
            str(meta.get("creationTimestamp") or ""),
            agent,
            holding,
            own,
            claim,
        )
        return entry, obj

    def sync_node(self, node: str) -> None:
        facts = self._node_facts(node)
        entries: list[rules.Entry] = []
        objects: dict[tuple[str, str], Obj] = {}
        for cached in self.bindings.list():
            obj = self.writer.current(cached)
            found = self._entry(obj, node, facts)
            if found is not None:
                entries.append(found[0])
                objects[found[0].key] = found[1]
        for key, verdict in sorted(rules.decide_node(node, entries).items()):
            self.writer.write_verdict(objects[key], verdict)


__all__ = ["BindingSync"]
