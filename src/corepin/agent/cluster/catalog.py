"""Informers feeding the placement core: what the scheduler and the extender read, never a list
per request.

`PlacementFeed(client, cluster)` keeps, by list + watch (`corepin.kube.informer`):

- every `NodeCPUTopology`, read into a `NodeView` on each change (a machine's topology is
  parsed once for all the nodes of the same hardware, and not again while the node's spec is
  unchanged: a heartbeat costs the status only);
- every `PodCPUBinding` a user (or `corepin scheduler --bind-cpus`) wrote, indexed by
  namespace and pod name, so a pod is planned with its binding as the agent plans it;
- every pod: bound pods the nodes do not show yet are counted in flight, deleted or finished
  ones released (`Cluster.observe_pod`); `on_pod` hands every pod event to the scheduler;
- with `nodes=True`, the Node objects (the scheduler filters cordoned and tainted nodes);
- every `CPUReservation` (`Cluster.set_reservation` while active, `remove_reservation` once
  done or gone; `on_reservation` hands each event on). Its informer is not waited for: a
  cluster without that CRD places pods as before.

The topologies are listed before the pods, so a pod bound before a restart finds its node.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from corepin.core.errors import CorepinError, EnvironmentProblem
from corepin.kube.informer import Informer, Obj
from corepin.kube.models import (
    LABEL_MANAGED_BY,
    CPUReservation,
    NodeCPUTopology,
    NodeCPUTopologyStatus,
    ObjectMeta,
    ObjectView,
    PodView,
    parse_time,
)
from corepin.kube.resources import CPUR, NCPT, NODES, PCB, PODS
from corepin.placement.node import node_view
from corepin.placement.request import PodRequest, pod_request
from corepin.placement.reservations import reservation_view

if TYPE_CHECKING:
    from corepin.kube.client import KubeClient
    from corepin.kube.models import NodeCPUTopologySpec
    from corepin.placement.cluster import Cluster
    from corepin.topology.model import Topology

log = logging.getLogger("corepin.agent.cluster.scheduler")

#: the label of the PodCPUBindings the node agent writes (records of its pins, not requests)
AGENT = "corepin-agent"

PodHandler = Callable[[str, Mapping[str, Any]], None]
ReservationHandler = Callable[[str, Mapping[str, Any]], None]
#: pod requests remembered (a pod's plan costs a few hundred microseconds)
REMEMBERED = 4096


class PlacementFeed:
    """Informers -> `Cluster` (see the module docstring)."""

    def __init__(
        self,
        client: KubeClient,
        cluster: Cluster,
        *,
        nodes: bool = False,
        on_pod: PodHandler | None = None,
        on_topology: Callable[[str], None] | None = None,
        on_reservation: ReservationHandler | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.client = client
        self.cluster = cluster
        self.clock = clock
        self._on_pod = on_pod
        self._on_topology = on_topology
        self._on_reservation = on_reservation
        self._lock = threading.Lock()
        self._specs: dict[str, tuple[Any, NodeCPUTopologySpec]] = {}
        self._topologies: dict[str, Topology] = {}
        self._statuses: dict[str, tuple[Any, Any]] = {}  # node -> (spec, status less clocks)
        self._requests: OrderedDict[tuple[Any, ...], PodRequest] = OrderedDict()
        self._bindings: dict[tuple[str, str], dict[str, Any]] = {}
        self.topologies = Informer(client, NCPT, name="nodecputopologies")
        self.bindings = Informer(client, PCB, name="podcpubindings")
        self.pods = Informer(client, PODS, name="pods")
        self.nodes: Informer | None = Informer(client, NODES, name="nodes") if nodes else None
        self.reservations = Informer(client, CPUR, name="cpureservations")
        self.reservations.add_handlers(
            on_add=lambda o: self._reservation("add", o),
            on_update=lambda _old, new: self._reservation("update", new),
            on_delete=lambda o: self._reservation("delete", o),
        )
        self.topologies.add_handlers(
            on_add=lambda o: self._topology(o, added=True),
            on_update=lambda _old, new: self._topology(new, added=False),
            on_delete=self._topology_gone,
        )
        self.bindings.add_handlers(
            on_add=self._binding,
            on_update=lambda _old, new: self._binding(new),
            on_delete=self._binding_gone,
        )
        self.pods.add_handlers(
            on_add=lambda o: self._pod("add", o),
            on_update=lambda _old, new: self._pod("update", new),
            on_delete=lambda o: self._pod("delete", o),
        )
        self.informers = [self.topologies, self.bindings, self.pods]
        if self.nodes is not None:
            self.informers.append(self.nodes)

    # ------------------------------------------------------------------ lifecycle
    def start(self, timeout: float = 60.0) -> None:
        """Start the informers, topologies first; EnvironmentProblem when a list does not come
        back within `timeout` seconds."""
        deadline = time.monotonic() + timeout
        for informer in self.informers:
            informer.start()
            if not informer.wait_for_sync(max(0.1, deadline - time.monotonic())):
                self.stop()
                raise EnvironmentProblem(
                    f"the API did not answer the {informer.name} list within {timeout:g} s",
                    reason="api_sync_timeout",
                )
        self.reservations.start()  # not waited for (module docstring)
        self.reservations.wait_for_sync(min(1.0, max(0.0, deadline - time.monotonic())))

    def stop(self, timeout: float = 2.0) -> None:
        for informer in [*self.informers, self.reservations]:
            informer.stop(timeout / (1 + len(self.informers)))

    @property
    def synced(self) -> bool:
        return all(i.synced for i in self.informers)

    @property
    def watch_restarts(self) -> int:
        return sum(i.stats.watch_restarts for i in self.informers)

    # ------------------------------------------------------------------ reads
    def cached_pod(self, name: str, namespace: str) -> Obj | None:
        """The pod as the informer last saw it (None: not seen)."""
        return self.pods.cache.get(name, namespace)

    def cached_node(self, name: str) -> Obj | None:
        """The Node object as the informer last saw it (None: not seen, or nodes are not
        watched)."""
        return None if self.nodes is None else self.nodes.cache.get(name)

    def binding_for(self, namespace: str, pod: str) -> dict[str, Any] | None:
        """The user's PodCPUBinding of the pod (as the agent picks it), or None."""
        with self._lock:
            return self._bindings.get((namespace, pod))

    def request_of(self, pod: Mapping[str, Any]) -> PodRequest:
        """The pod's request, planned with its user binding as the agent plans it (remembered
        per pod uid, resource version and binding version: kube-scheduler sends the same pod
        to filter and to prioritize)."""
        view = ObjectView(pod)
        meta = view.metadata  # raw values below, as ever (str() of a missing name is "None")
        binding = self.binding_for(view.namespace or "default", str(meta.get("name")))
        version = meta.get("resourceVersion")
        key = None
        if isinstance(version, str) and version and isinstance(meta.get("uid"), str):
            bmeta = ObjectView(binding).metadata
            key = (meta["uid"], version, bmeta.get("uid"), bmeta.get("resourceVersion"))
            with self._lock:
                known = self._requests.get(key)
            if known is not None:
                return known
        request = pod_request(pod, binding)
        if key is not None:
            with self._lock:
                self._requests[key] = request
                if len(self._requests) > REMEMBERED:
                    self._requests.popitem(last=False)
        return request

    # ------------------------------------------------------------------ handlers
    def _topology(self, obj: Mapping[str, Any], *, added: bool) -> None:
        view = ObjectView(obj)
        meta, name = view.metadata, view.name
        if not name:
            return
        status = obj.get("status")
        quiet = _without_clock(status)
        seen = self._statuses.get(name)
        if (
            not added
            and seen is not None
            and seen[0] == obj.get("spec")
            and seen[1] == quiet
            and isinstance(status, Mapping)
        ):
            # only the heartbeat moved on: keep the view and its cached answers
            try:
                stamp = parse_time(status.get("heartbeatTime"), "status.heartbeatTime")
            except CorepinError:
                stamp = None
            if stamp is not None and self.cluster.beat(name, stamp.timestamp()):
                return
        self._statuses[name] = (obj.get("spec"), quiet)
        try:
            raw_spec = obj.get("spec")
            known = self._specs.get(name)
            if known is not None and known[0] == raw_spec:
                ncpt = NodeCPUTopology(
                    ObjectMeta.from_dict(meta),
                    known[1],
                    None if status is None else NodeCPUTopologyStatus.from_dict(status),
                )
            else:
                ncpt = NodeCPUTopology.from_dict(obj, topologies=self._topologies)
                self._specs[name] = (raw_spec, ncpt.spec)
            self.cluster.set_node(node_view(ncpt, version=view.resource_version))
        except CorepinError as exc:
            log.warning("event=topology_unreadable node=%s error=%s", name, exc)
            self.cluster.set_unreadable(name, str(exc))
            return
        if added:
            now = self.clock()
            for pod in self.pods.cache.list():
                if PodView(pod).spec.get("nodeName") == name:  # the raw value, as ever
                    self.cluster.observe_pod(pod, self.request_of, now)
        if self._on_topology is not None:
            self._on_topology(name)

    def _topology_gone(self, obj: Mapping[str, Any]) -> None:
        name = ObjectView(obj).name
        self._specs.pop(name, None)
        self._statuses.pop(name, None)
        self.cluster.remove_node(name)
        if self._on_topology is not None:
            self._on_topology(name)

    @staticmethod
    def _binding_key(obj: Mapping[str, Any]) -> tuple[str, str] | None:
        view = ObjectView(obj)
        if view.labels.get(LABEL_MANAGED_BY) == AGENT:
            return None
        pod = view.spec.get("podName")
        if not isinstance(pod, str):
            return None
        return (view.namespace or "default", pod)

    def _binding(self, obj: Mapping[str, Any]) -> None:
        key = self._binding_key(obj)
        if key is None:
            return
        with self._lock:
            if ObjectView(obj).status.get("phase") == "Failed":
                self._bindings.pop(key, None)
            else:
                self._bindings[key] = dict(obj)

    def _binding_gone(self, obj: Mapping[str, Any]) -> None:
        key = self._binding_key(obj)
        if key is not None:
            with self._lock:
                current = self._bindings.get(key)
                name = ObjectView(obj).metadata.get("name")  # the raw names, as ever
                if current is not None and ObjectView(current).metadata.get("name") == name:
                    del self._bindings[key]

    def _reservation(self, what: str, obj: Mapping[str, Any]) -> None:
        name = ObjectView(obj).name
        if not name:
            return
        view = None
        if what != "delete":
            try:
                view = reservation_view(CPUReservation.from_dict(obj))
            except CorepinError as exc:
                log.warning("event=reservation_unreadable reservation=%s error=%s", name, exc)
        if view is None:
            self.cluster.remove_reservation(name)
        else:
            self.cluster.set_reservation(view)
        if self._on_reservation is not None:
            self._on_reservation(what, obj)

    def _pod(self, what: str, pod: Mapping[str, Any]) -> None:
        if what == "delete":
            uid = ObjectView(pod).uid
            if uid:
                self.cluster.forget_pod(uid)
        else:
            self.cluster.observe_pod(pod, self.request_of, self.clock())
        if self._on_pod is not None:
            self._on_pod(what, pod)


def _without_clock(status: Any) -> Any:
    """A published status less what changes on every heartbeat (the heartbeat time and the
    conditions' transition times), to tell a heartbeat from a change."""
    if not isinstance(status, Mapping):
        return status
    out = {k: v for k, v in status.items() if k != "heartbeatTime"}
    conditions = out.get("conditions")
    if isinstance(conditions, list):
        out["conditions"] = [
            {k: v for k, v in c.items() if k != "lastTransitionTime"}
            if isinstance(c, Mapping)
            else c
            for c in conditions
        ]
    return out


__all__ = ["PlacementFeed"]
