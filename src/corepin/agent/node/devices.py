"""The devices the kubelet gave the node's containers, for the node agent: read from the
kubelet's PodResources API (`corepin.kube.podresources`, `--pod-resources-socket`).

- `container_numa(namespace, pod)`: container name -> the NUMA nodes of its devices (the worker
  asks it before deciding a pod's CPUs: `SyncContext.device_numa`);
- `node_devices()`: the node's devices per resource and NUMA node, with how many no container
  holds (`NodeCPUTopology.status.devices`).

Without the socket (or when the kubelet does not answer) the agent works as before: no device
is known, and the agent says so once - a warning when the API is first found missing, and an
info line when it answers again. An empty socket path turns the API off.
"""

from __future__ import annotations

import logging
import threading

from corepin.core.cpuset import CPUSet
from corepin.kube.models import NodeDevices
from corepin.kube.podresources import (
    PodResourcesClient,
    PodResourcesUnavailable,
    container_numa,
    devices_by_numa,
)

log = logging.getLogger("corepin.agent.node")


class DeviceSource:
    """The kubelet's PodResources API as the agent uses it (see the module docstring)."""

    def __init__(self, socket: str, *, timeout: float = 5.0) -> None:
        self.socket = socket
        self._client = PodResourcesClient(socket, timeout=timeout) if socket else None
        self._lock = threading.Lock()  # (the worker and the publisher both ask)
        self._missing: bool | None = None  # None: not asked yet

    @property
    def enabled(self) -> bool:
        return self._client is not None

    def container_numa(self, namespace: str, pod: str) -> dict[str, CPUSet]:
        """Container name -> NUMA nodes of its devices, for the containers of one pod that hold
        devices of a known NUMA node (empty without the API)."""
        if self._client is None:
            return {}
        with self._lock:
            try:
                listed = self._client.list()
            except PodResourcesUnavailable as exc:
                self._gone(exc)
                return {}
            self._back()
        return container_numa(listed, namespace, pod)

    def node_devices(self) -> tuple[NodeDevices, ...]:
        """The node's devices per resource and NUMA node (empty without the API)."""
        if self._client is None:
            return ()
        with self._lock:
            try:
                allocatable = self._client.allocatable()
                used = [g for groups in self._client.list().values() for g in groups]
            except PodResourcesUnavailable as exc:
                self._gone(exc)
                return ()
            self._back()
        return tuple(
            NodeDevices(row.resource, row.numa, row.count, row.allocatable)
            for row in devices_by_numa(allocatable, used)
        )

    def _gone(self, exc: PodResourcesUnavailable) -> None:
        if self._missing is not True:
            log.warning(
                "event=pod_resources_unavailable socket=%s error=%s; exclusive CPUs are not "
                "aligned with devices until the kubelet's PodResources API answers",
                self.socket,
                exc,
            )
        self._missing = True

    def _back(self) -> None:
        if self._missing:
            log.info("event=pod_resources_available socket=%s", self.socket)
        self._missing = False

    def close(self) -> None:
        if self._client is not None:
            self._client.close()


__all__ = ["DeviceSource"]
