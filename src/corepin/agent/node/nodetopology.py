"""The node as the node agent publishes it: its NodeCPUTopology (spec: the machine, the policy,
the reserved CPUs; status: pools, free CPUs, who holds what, a heartbeat and the `Ready`
condition) and, when that CRD is served, its NodeResourceTopology (one zone per NUMA node, for
the scheduler-plugins' NodeResourceTopologyMatch).

The spec is written when the agent starts and when the reservation changes, as a whole (a JSON
patch replacing `/spec`: a merge patch would keep keys others added); an edit by someone else is
put right at the next status write, whose answer shows the spec. The status is rewritten on
every heartbeat and whenever what is held changes. Everything goes through the typed models of
`corepin.kube.models`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from corepin.agent.node.devices import DeviceSource
from corepin.agent.node.promises import Promises
from corepin.agent.node.records import utc_now
from corepin.agent.node.settings import NodeSettings
from corepin.agent.node.watches import Watches
from corepin.core.cpuset import CPUSet
from corepin.core.errors import ApiAlreadyExists, ApiNotFound, CorepinError
from corepin.kube.client import Obj
from corepin.kube.models import (
    AGENT_MANAGER,
    LABEL_MANAGED_BY,
    Allocation,
    Condition,
    NodeCPUTopology,
    NodeCPUTopologySpec,
    NodeCPUTopologyStatus,
    NodeDevices,
    ObjectMeta,
    ObjectView,
    OwnerReference,
    format_time,
    node_owner,
    node_resource_topology,
    parse_time,
)
from corepin.kube.models.ncpt import HeldReservation
from corepin.kube.resources import NCPT, NRT
from corepin.state.model import Assignment, HostState
from corepin.topology.model import Topology

log = logging.getLogger("corepin.agent.node")


def node_status(
    state: HostState,
    topology: Topology,
    heartbeat: str,
    *,
    promised: CPUSet | None = None,
    qos_class: Callable[[Assignment], str] | None = None,
    devices: tuple[NodeDevices, ...] = (),
) -> dict[str, Any]:
    """`NodeCPUTopology.status` of a node state, `heartbeat` its time (RFC 3339). CPUs
    `promised` to pods by PodCPUBindings (their containers not running yet) are not offered as
    free; `qos_class` gives each row its container's QoS class (none without it); `devices`
    are the node's devices per NUMA node (from the kubelet)."""
    free = state.free - (promised or CPUSet())
    allocations = []
    for a in state:
        owner = a.container
        if owner is None or not a.holds or not owner.namespace or not owner.pod:
            continue  # (an imported kubelet entry whose pod was not seen yet: counted, unnamed)
        allocations.append(
            Allocation(
                namespace=owner.namespace,
                pod=owner.pod,
                pod_uid=owner.pod_uid,
                container=owner.container,
                cpus=a.cpus,
                mems=a.mems,
                policy="share" if a.kind == "share" else "exclusive",
                level=a.level,
                workload=a.workload,  # (the placement core scores memory-bound sockets)
                qos_class=None if qos_class is None else qos_class(a),
            )
        )
    stamp = parse_time(heartbeat, "status.heartbeatTime")
    ready = Condition(
        "Ready", "True", stamp, "AgentRunning", "the node agent publishes this node's CPUs"
    )
    return NodeCPUTopologyStatus(
        shared_pool=state.shared_pool,
        reserved_cpus=state.reserved,
        isolated_cpus=state.isolated,
        free=free,
        free_by_numa={n: free & topology.cpus_in_numa_nodes(n) for n in topology.numa_node_ids()},
        free_by_l3={c: free & topology.cpus_in_l3s(c) for c in topology.l3_ids()},
        allocations=tuple(allocations),
        heartbeat_time=stamp,
        conditions=(ready,),
        devices=devices,
        reservations=held_reservations(state),
    ).to_dict()


def held_reservations(state: HostState) -> tuple[HeldReservation, ...]:
    """`status.reservations`: every reservation the state holds, its phase (`Succeeded` once
    a one-time reservation is in use, else `Available`) and the pod running on it."""
    out = []
    for r in state.reservations.values():
        users = []
        for ident in r.consumed_by:
            a = state.get(ident)
            owner = None if a is None else a.container
            if owner is not None and owner.namespace and owner.pod:
                users.append(f"{owner.namespace}/{owner.pod}")
        phase = "Succeeded" if r.in_use and not r.reusable else "Available"
        out.append(HeldReservation(r.name, r.cpus, phase, ",".join(users) or None))
    return tuple(out)


class TopologyPublisher:
    """The node's NodeCPUTopology and NodeResourceTopology."""

    def __init__(
        self,
        settings: NodeSettings,
        watches: Watches,
        topology: Topology,
        promises: Promises,
        clock: Callable[[], float],
        qos_class: Callable[[Assignment], str] | None = None,
        devices: DeviceSource | None = None,
    ) -> None:
        self.settings = settings
        self.devices = devices
        self.qos_class = qos_class
        self.watches = watches
        self.client = watches.client
        self.machine = topology
        self.promises = promises
        self.clock = clock
        self._nrt = True
        self._ncpt_created = False
        self._spec_stored: object = None  # NodeCPUTopology.spec as the API stored what we wrote
        self._last_reserved: str | None = None
        self._had_reservations = False

    def publish(self, state: HostState | None) -> None:
        """The node's NodeCPUTopology (spec and status with a heartbeat) and, when its CRD is
        served, its NodeResourceTopology."""
        if state is None:
            return
        node = self.settings.node_name
        wanted = NodeCPUTopologySpec(
            self.machine, self.settings.policy, self.settings.options, state.reserved
        )
        spec = wanted.to_dict()
        now = format_time(utc_now(self.clock))
        status = node_status(
            state,
            self.machine,
            now,
            promised=self.promises.promised(state),
            qos_class=self.qos_class,
            devices=() if self.devices is None else self.devices.node_devices(),
        )
        # (a merge patch keeps a key it does not name: the last reservation gone removes the list)
        if self._had_reservations and "reservations" not in status:
            status["reservations"] = None
        self._had_reservations = "reservations" in status and status["reservations"] is not None
        try:
            if not self._ncpt_created:
                owner = self._node_owner()
                meta = ObjectMeta(
                    node,
                    labels={LABEL_MANAGED_BY: AGENT_MANAGER},
                    owner_references=() if owner is None else (owner,),
                )
                try:
                    written = self.client.create(NCPT, NodeCPUTopology(meta, wanted).to_dict())
                except ApiAlreadyExists:
                    written = self._replace_spec(spec)
                self._ncpt_created = True
                self._spec_stored = (written or {}).get("spec")
                self._last_reserved = spec.get("reservedCPUs")
            else:
                self._spec_changed(spec)
            written = self.client.patch_status(NCPT, node, {"status": status})
            # (the answer shows the spec as it is now: someone else's edit is put right)
            found = (written or {}).get("spec")
            if found != self._spec_stored and _plain(found) != _plain(spec):
                log.warning("event=topology_spec_repaired node=%s", node)
                self._spec_stored = (self._replace_spec(spec) or {}).get("spec")
        except ApiNotFound:
            self._ncpt_created = False
        except CorepinError as exc:
            log.warning("event=topology_publish_failed node=%s error=%s", node, exc)
        if self._nrt:
            self._publish_nrt(state)

    def _spec_changed(self, spec: dict[str, Any]) -> None:
        if spec.get("reservedCPUs") != self._last_reserved:
            self._spec_stored = (self._replace_spec(spec) or {}).get("spec")
            self._last_reserved = spec.get("reservedCPUs")

    def _replace_spec(self, spec: dict[str, Any]) -> Obj:
        """Put the whole spec (a JSON patch: a merge patch would keep keys others added)."""
        return self.client.patch(
            NCPT,
            self.settings.node_name,
            [{"op": "replace", "path": "/spec", "value": dict(spec)}],
            patch_type="json",
        )

    def _node_owner(self) -> OwnerReference | None:
        uid = ObjectView(self.watches.node()).metadata.get("uid")  # raw: node_owner takes it
        return node_owner(self.settings.node_name, uid) if uid else None

    def _publish_nrt(self, state: HostState) -> None:
        body = node_resource_topology(
            self.settings.node_name, self.machine, free=state.free, reserved=state.reserved
        )
        try:
            try:
                self.client.create(NRT, body)
            except ApiAlreadyExists:
                current = self.client.get(NRT, self.settings.node_name)
                # the raw value (None when it has none), as ever
                body["metadata"]["resourceVersion"] = ObjectView(current).metadata.get(
                    "resourceVersion"
                )
                self.client.replace(NRT, body)
        except ApiNotFound:
            self._nrt = False  # the NodeResourceTopology CRD is not served: never mind
        except CorepinError as exc:
            log.warning("event=nrt_publish_failed error=%s", exc)


def _plain(value: object) -> object:
    """`value` as JSON would give it back (tuples as lists), for comparing with the API's."""
    return json.loads(json.dumps(value))


__all__ = ["TopologyPublisher", "held_reservations", "node_status"]
