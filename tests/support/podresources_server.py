"""The tests' own kubelet PodResources server: a real grpcio server on a real unix socket,
answering `v1.PodResourcesLister` `List` and `GetAllocatableResources` from data the test gives.

    with PodResourcesServer(tmp_path / "kubelet.sock") as server:
        server.allocatable = [Devices("nvidia.com/gpu", ["gpu0"], numa=[0]), ...]
        server.assign("default", "train", "main", Devices("nvidia.com/gpu", ["gpu1"], numa=[1]))

`from_kubelet(harness)` fills the assignments from the test kubelet's pods: a container whose
limits name an extended resource listed in `allocatable` gets that many devices of it, the
first ones no other container holds, as the kubelet's device manager gives them.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from corepin.kube.gen.podresources import api_pb2, api_pb2_grpc


@dataclass(frozen=True)
class Devices:
    """Devices of one resource on some NUMA nodes (none: the kubelet knows no NUMA node)."""

    resource: str
    ids: list[str]
    numa: list[int] = field(default_factory=list)

    def message(self) -> api_pb2.ContainerDevices:
        return api_pb2.ContainerDevices(
            resource_name=self.resource,
            device_ids=list(self.ids),
            topology=api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=n) for n in self.numa]),
        )


class _Lister(api_pb2_grpc.PodResourcesListerServicer):  # type: ignore[misc]
    def __init__(self, owner: PodResourcesServer) -> None:
        self.owner = owner

    def List(self, request: Any, context: Any) -> api_pb2.ListPodResourcesResponse:
        return self.owner.list_response()

    def GetAllocatableResources(
        self, request: Any, context: Any
    ) -> api_pb2.AllocatableResourcesResponse:
        return self.owner.allocatable_response()


class PodResourcesServer:
    """A PodResources server on `socket` (see the module docstring); `calls` counts the RPCs."""

    def __init__(self, socket: Path | str) -> None:
        self.socket = str(socket)
        self.allocatable: list[Devices] = []
        self.cpu_ids: list[int] = []
        self._assigned: dict[tuple[str, str, str], list[Devices]] = {}
        self._lock = threading.Lock()
        self.calls: dict[str, int] = {"List": 0, "GetAllocatableResources": 0}
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        api_pb2_grpc.add_PodResourcesListerServicer_to_server(_Lister(self), self._server)
        if self._server.add_insecure_port(f"unix:{self.socket}") == 0:
            raise RuntimeError(f"cannot listen on {self.socket}")

    # ------------------------------------------------------------------ data
    def assign(self, namespace: str, pod: str, container: str, *devices: Devices) -> None:
        with self._lock:
            self._assigned.setdefault((namespace, pod, container), []).extend(devices)

    def forget(self, namespace: str, pod: str) -> None:
        with self._lock:
            for key in [k for k in self._assigned if k[:2] == (namespace, pod)]:
                del self._assigned[key]

    def from_kubelet(self, pods: Iterable[Mapping[str, Any]]) -> None:
        """Give the containers of `pods` (API pod objects, e.g. the test kubelet's) the devices
        their limits ask for, as the kubelet's device manager would."""
        for pod in pods:
            meta = pod.get("metadata") or {}
            ns, name = meta.get("namespace") or "default", meta.get("name", "")
            for c in (pod.get("spec") or {}).get("containers") or []:
                limits = (c.get("resources") or {}).get("limits") or {}
                key = (ns, name, c["name"])
                if key in self._assigned:
                    continue
                for resource, quantity in sorted(limits.items()):
                    wanted = int(str(quantity)) if resource not in ("cpu", "memory") else 0
                    given = self._free_of(resource, wanted)
                    if given:
                        self.assign(ns, name, c["name"], *given)

    def _free_of(self, resource: str, wanted: int) -> list[Devices]:
        held = {i for ds in self._assigned.values() for d in ds for i in d.ids}
        out: list[Devices] = []
        for d in self.allocatable:
            if d.resource != resource:
                continue
            for i in d.ids:
                if wanted and i not in held:
                    out.append(Devices(resource, [i], list(d.numa)))
                    wanted -= 1
        return out

    # ------------------------------------------------------------------ answers
    def list_response(self) -> api_pb2.ListPodResourcesResponse:
        with self._lock:
            self.calls["List"] += 1
            pods: dict[tuple[str, str], list[api_pb2.ContainerResources]] = {}
            for (ns, pod, container), devices in sorted(self._assigned.items()):
                pods.setdefault((ns, pod), []).append(
                    api_pb2.ContainerResources(
                        name=container, devices=[d.message() for d in devices]
                    )
                )
        return api_pb2.ListPodResourcesResponse(
            pod_resources=[
                api_pb2.PodResources(name=pod, namespace=ns, containers=rows)
                for (ns, pod), rows in pods.items()
            ]
        )

    def allocatable_response(self) -> api_pb2.AllocatableResourcesResponse:
        with self._lock:
            self.calls["GetAllocatableResources"] += 1
            return api_pb2.AllocatableResourcesResponse(
                devices=[d.message() for d in self.allocatable], cpu_ids=list(self.cpu_ids)
            )

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> PodResourcesServer:
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop(grace=None).wait()

    def __enter__(self) -> PodResourcesServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
