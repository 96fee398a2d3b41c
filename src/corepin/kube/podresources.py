"""A client of the kubelet's PodResources API (`v1.PodResourcesLister`, gRPC over the kubelet's
unix socket): which devices the kubelet gave each container, and on which NUMA nodes they sit.

- `PodResourcesClient(socket)`: `list()` -> `{ContainerKey: (DeviceGroup, ...)}` for every
  container that holds devices; `allocatable()` -> the devices the kubelet can give, one
  `DeviceGroup` per resource and NUMA node (a device of no NUMA node: `numa` None);
- `devices_by_numa(allocatable, used)`: the node's devices per resource and NUMA node with how
  many of them no container holds (what `NodeCPUTopology.status.devices` publishes);
- `numa_nodes(groups)`: the NUMA nodes of some devices (a `CPUSet` of node ids).

Any failure (no socket, the kubelet not answering, an RPC error) is `PodResourcesUnavailable`
(an EnvironmentProblem naming the socket): the caller decides whether it matters.

The messages are generated at install time from `proto/podresources/api.proto` (setup.py); the
methods are called by their wire paths, so no untyped stub is needed.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Final

import grpc

from corepin.core.cpuset import CPUSet
from corepin.core.errors import EnvironmentProblem
from corepin.core.record import record
from corepin.kube.gen.podresources import api_pb2

DEFAULT_SOCKET: Final = "/var/lib/kubelet/pod-resources/kubelet.sock"
DEFAULT_TIMEOUT: Final = 5.0
#: the method paths of the kubelet's service
LIST_METHOD: Final = "/v1.PodResourcesLister/List"
ALLOCATABLE_METHOD: Final = "/v1.PodResourcesLister/GetAllocatableResources"
#: the largest answer read (a node of many pods and devices stays far below it)
MAX_MESSAGE: Final = 16 * 1024 * 1024


class PodResourcesUnavailable(EnvironmentProblem):
    """The kubelet's PodResources API cannot be read (no socket, no answer, an error)."""

    default_reason = "pod_resources_unavailable"


@record
class ContainerKey:
    """A container of a pod, as the kubelet names it."""

    namespace: str
    pod: str
    container: str


@record
class DeviceGroup:
    """Devices of one resource (e.g. `nvidia.com/gpu`) and the NUMA nodes they sit on (empty
    when the kubelet reports none)."""

    resource: str
    ids: tuple[str, ...]
    numa: CPUSet = CPUSet()


def _numa(topology: api_pb2.TopologyInfo) -> CPUSet:
    return CPUSet(int(n.ID) for n in topology.nodes if n.ID >= 0)


def _groups(rows: Iterable[api_pb2.ContainerDevices]) -> tuple[DeviceGroup, ...]:
    return tuple(
        DeviceGroup(r.resource_name, tuple(r.device_ids), _numa(r.topology))
        for r in rows
        if r.resource_name and r.device_ids
    )


def numa_nodes(groups: Iterable[DeviceGroup]) -> CPUSet:
    """The NUMA nodes the devices of `groups` sit on (empty: none known)."""
    out = CPUSet()
    for g in groups:
        out |= g.numa
    return out


@record
class DeviceCount:
    """One row of a node's devices: `count` devices of `resource` on NUMA node `numa` (None: the
    kubelet knows no NUMA node for them), `allocatable` of them held by no container."""

    resource: str
    numa: int | None
    count: int
    allocatable: int


def devices_by_numa(
    allocatable: Iterable[DeviceGroup], used: Iterable[DeviceGroup] = ()
) -> tuple[DeviceCount, ...]:
    """The node's devices per resource and NUMA node, sorted; a device is counted once, on the
    lowest NUMA node the kubelet names for it, and is not allocatable when a container of
    `used` holds it."""
    held = {(g.resource, i) for g in used for i in g.ids}
    where: dict[tuple[str, str], int | None] = {}
    for g in allocatable:
        node = g.numa.first() if g.numa else None
        for i in g.ids:
            where.setdefault((g.resource, i), node)
    totals: dict[tuple[str, int | None], list[int]] = {}
    for (resource, ident), node in where.items():
        row = totals.setdefault((resource, node), [0, 0])
        row[0] += 1
        if (resource, ident) not in held:
            row[1] += 1
    return tuple(
        DeviceCount(resource, node, total, free)
        for (resource, node), (total, free) in sorted(
            totals.items(), key=lambda kv: (kv[0][0], -1 if kv[0][1] is None else kv[0][1])
        )
    )


class PodResourcesClient:
    """The kubelet's PodResources API over its unix socket (see the module docstring)."""

    def __init__(self, socket: str = DEFAULT_SOCKET, *, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.socket = socket
        self.timeout = timeout
        self._channel: grpc.Channel | None = None

    def _call(self, method: str, request: bytes) -> bytes:
        if not os.path.exists(self.socket):
            raise PodResourcesUnavailable(
                f"no kubelet PodResources socket at {self.socket}", reason="no_pod_resources"
            )
        if self._channel is None:
            self._channel = grpc.insecure_channel(
                f"unix:{os.path.abspath(self.socket)}",
                options=[("grpc.max_receive_message_length", MAX_MESSAGE)],
            )
        call: grpc.UnaryUnaryMultiCallable[bytes, bytes] = self._channel.unary_unary(method)
        try:
            answer = call(request, timeout=self.timeout)
        except grpc.RpcError as exc:
            code = exc.code() if isinstance(exc, grpc.Call) else None
            detail = exc.details() if isinstance(exc, grpc.Call) else str(exc)
            name = code.name if code is not None else "error"
            raise PodResourcesUnavailable(
                f"the kubelet's PodResources API at {self.socket} answered {method} with "
                f"{name}: {detail}"
            ) from None
        if not isinstance(answer, bytes):
            raise PodResourcesUnavailable(f"{method} at {self.socket}: not a message")
        return answer

    def list(self) -> dict[ContainerKey, tuple[DeviceGroup, ...]]:
        """The devices of every container that holds any (`List`)."""
        raw = self._call(LIST_METHOD, api_pb2.ListPodResourcesRequest().SerializeToString())
        answer = api_pb2.ListPodResourcesResponse.FromString(raw)
        out: dict[ContainerKey, tuple[DeviceGroup, ...]] = {}
        for pod in answer.pod_resources:
            for c in pod.containers:
                groups = _groups(c.devices)
                if groups:
                    out[ContainerKey(pod.namespace or "default", pod.name, c.name)] = groups
        return out

    def allocatable(self) -> tuple[DeviceGroup, ...]:
        """The devices the kubelet can give, one group per resource and NUMA node
        (`GetAllocatableResources`)."""
        raw = self._call(
            ALLOCATABLE_METHOD, api_pb2.AllocatableResourcesRequest().SerializeToString()
        )
        answer = api_pb2.AllocatableResourcesResponse.FromString(raw)
        merged: dict[tuple[str, CPUSet], list[str]] = {}
        for g in _groups(answer.devices):
            merged.setdefault((g.resource, g.numa), []).extend(g.ids)
        return tuple(
            DeviceGroup(resource, tuple(sorted(ids)), numa)
            for (resource, numa), ids in sorted(
                merged.items(), key=lambda kv: (kv[0][0], kv[0][1].bits)
            )
        )

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None


def container_numa(
    listed: Mapping[ContainerKey, tuple[DeviceGroup, ...]], namespace: str, pod: str
) -> dict[str, CPUSet]:
    """Container name -> the NUMA nodes of its devices, for the containers of one pod that hold
    devices with a known NUMA node."""
    out: dict[str, CPUSet] = {}
    for key, groups in listed.items():
        if key.namespace == namespace and key.pod == pod:
            nodes = numa_nodes(groups)
            if nodes:
                out[key.container] = nodes
    return out


__all__ = [
    "ALLOCATABLE_METHOD",
    "DEFAULT_SOCKET",
    "LIST_METHOD",
    "ContainerKey",
    "DeviceCount",
    "DeviceGroup",
    "PodResourcesClient",
    "PodResourcesUnavailable",
    "container_numa",
    "devices_by_numa",
    "numa_nodes",
]
