"""Validated user PodCPUBindings as the node agent reads them: the binding of each pod, and the
CPUs such bindings promise to pods whose containers do not hold them yet.

Who may make the agent withhold CPUs this way matters: any tenant may create a binding, and a
label (`corepin.io/node`) is whatever its writer says. So only a binding in phase
`Validated`/`Applied` counts (no status, `Pending`: nothing is withheld), only for the
containers it may give CPUs to (eligible, exactly their limit), and only for a pod this node
runs: its `spec.nodeName` as the pod informer (field selector) sees it. The one exception is the
scheduler's own flow, which validates the binding and only then binds the pod: a validated
binding whose status names this node (the status subresource, written by the controller or the
scheduler) holds its CPUs for a pod that the API shows not bound anywhere yet (read with a GET,
not from a label), for at most `PROMISE_GRACE` seconds - long enough for the bind to reach this
node, too short for a binding of a pod that never comes to withhold CPUs for long.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from typing import Any, Final

from corepin.agent.node.sync import pod_assignments
from corepin.agent.node.watches import Watches
from corepin.allocation.levels import withheld_for
from corepin.core.cpuset import CPUSet
from corepin.core.errors import ApiNotFound, CorepinError
from corepin.kube.models import (
    ObjectMeta,
    ObjectView,
    PodView,
    corepin_level,
    is_agent_binding,
    pod_owner_uid,
)
from corepin.kube.podplan import binding_cpus, binding_refusals
from corepin.kube.resources import PODS
from corepin.state.model import HostState
from corepin.topology.model import Topology

log = logging.getLogger("corepin.agent.node")

#: seconds a validated binding holds its CPUs for a pod not bound to this node yet
PROMISE_GRACE: Final = 30.0


class Promises:
    """The validated user bindings of the node's pods and the CPUs they promise."""

    def __init__(self, watches: Watches, topology: Topology) -> None:
        self.watches = watches
        self.machine = topology
        self.node_name = watches.node_name
        #: how long a binding holds CPUs for a pod not bound here yet (`PROMISE_GRACE`)
        self.grace = PROMISE_GRACE
        self._lock = threading.Lock()
        # binding uid -> (first seen, resourceVersion checked, its pod may come here)
        self._incoming_seen: dict[str, tuple[float, str, bool]] = {}

    def user_bindings(self) -> dict[tuple[str, str], Mapping[str, Any]]:
        """(namespace, pod) -> the user's PodCPUBinding for that pod once the controller
        validated it (phase `Validated`, or `Applied`); bindings the agent wrote itself are its
        records, not requests (`corepin.kube.models.is_agent_binding`). A binding whose owner
        reference names another incarnation of the pod is not this pod's. Whether the binding
        fits the pod's limits is checked where it is applied (`plan_pod`), whatever its status
        says."""
        out: dict[tuple[str, str], Mapping[str, Any]] = {}
        for b in self.watches.binding_list():
            view = ObjectView(b)
            if is_agent_binding(view.labels):
                continue
            if view.status.get("phase") in ("Validated", "Applied"):
                # str() of the raw namespace, as ever ("None" when it has none)
                key = (str(view.metadata.get("namespace")), str(view.spec.get("podName")))
                pod = self.watches.pod(key[1], key[0])
                if pod is not None and not owned_by(b, pod):
                    continue
                out.setdefault(key, b)
        return out

    def promised(self, state: HostState, exclude: tuple[str, str] = ("", "")) -> CPUSet:
        """CPUs that validated user PodCPUBindings name for pods bound to this node whose
        containers do not hold them yet (the scheduler's --bind-cpus chose them before the pods
        ran), `exclude` = (namespace, pod) aside: decisions from annotations leave them alone,
        and the published free set does not offer them (see the module docstring)."""
        out = CPUSet()
        now = time.monotonic()
        live: set[str] = set()
        for b in self.watches.binding_list():
            view = ObjectView(b)
            if is_agent_binding(view.labels):
                continue
            status = view.status
            if status.get("phase") not in ("Validated", "Applied"):
                continue
            spec = view.spec
            key = (view.namespace or "default", str(spec.get("podName")))
            live.add(str(view.metadata.get("uid")))  # str() of the raw uid, as `_incoming` keys
            if key == exclude:
                continue
            pod = self.watches.pod(key[1], key[0])
            if pod is not None:
                here = PodView(pod).spec.get("nodeName") == self.node_name  # the raw value
                if not here or not owned_by(b, pod) or binding_refusals(pod, spec):
                    continue
            elif status.get("nodeName") != self.node_name or not self._incoming(b, now):
                continue
            uid = ObjectView(pod).uid
            held = CPUSet().union(*(a.withheld for a in pod_assignments(state, uid) if a.holds))
            try:
                level = corepin_level(spec.get("exclusivenessLevel") or "cpu")
                wanted = CPUSet().union(
                    *(
                        withheld_for(self.machine, level, cpus & self.machine.online_cpus)
                        for cpus in binding_cpus(spec).values()
                    )
                )
            except CorepinError:
                continue
            out |= wanted - held
        with self._lock:
            for gone in set(self._incoming_seen) - live:
                del self._incoming_seen[gone]
        return out & state.free

    def _incoming(self, binding: Mapping[str, Any], now: float) -> bool:
        """Whether a validated binding naming this node, whose pod this node does not run,
        holds its CPUs now: the pod (read once per binding version with a GET) exists, is
        the binding's incarnation, is bound to no node yet (or to this one: the watch is on
        its way), fits the binding, and the binding was first seen less than `grace` seconds
        ago."""
        view = ObjectView(binding)
        meta = view.metadata  # str() of the raw fields, as ever ("None" for one missing)
        uid, version = str(meta.get("uid")), view.resource_version
        with self._lock:
            seen = self._incoming_seen.get(uid)
        if seen is None or seen[1] != version:
            spec = view.spec
            try:
                pod = self.watches.client.get(
                    PODS, str(spec.get("podName")), str(meta.get("namespace"))
                )
            except ApiNotFound:
                pod = None
            except CorepinError as exc:
                log.warning("event=promise_check_failed binding=%s error=%s", meta.get("name"), exc)
                return False
            node = PodView(pod).spec.get("nodeName")  # the raw value
            ok = (
                pod is not None
                and node in (None, "", self.node_name)
                and owned_by(binding, pod)
                and not binding_refusals(pod, spec)
            )
            # the grace runs from the first sight of the binding, not of this version: a
            # binding rewritten again and again does not hold CPUs for longer
            seen = (now if seen is None else seen[0], version, ok)
            with self._lock:
                self._incoming_seen[uid] = seen
        return seen[2] and now - seen[0] < self.grace


def owned_by(binding: Mapping[str, Any], pod: Mapping[str, Any]) -> bool:
    """Whether `binding` may be `pod`'s: it names the pod and, when it has an owner reference
    to a pod of that name, that reference is this pod's uid (not an earlier incarnation's)."""
    pod_view, binding_view = ObjectView(pod), ObjectView(binding)
    name = pod_view.name
    if binding_view.spec.get("podName") != name:
        return False
    try:
        owners = ObjectMeta.from_dict(binding_view.metadata).owner_references
    except CorepinError:
        return False
    owner = pod_owner_uid(owners, name)
    return owner is None or owner == pod_view.metadata.get("uid")  # the raw uid, as ever


__all__ = ["PROMISE_GRACE", "Promises", "owned_by"]
