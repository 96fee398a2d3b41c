"""What a pod asks of a node, as the node agent will read it (pure).

`pod_request(pod, binding=None)` runs the agent's own plan of the pod
(`corepin.kube.podplan.plan_pod`, with the user's PodCPUBinding when there is one) and keeps
what placement needs: per app container, in order, the kind of CPUs the agent will give it
(`exclusive`, `share`, or `shared` for the shared pool), how many, at which exclusiveness
level, its workload family and its explicit CPUs. A container whose request the agent would
ignore (an ineligible CPU limit, a malformed annotation) runs on the shared pool there, so it
asks for nothing here either.

`PodRequest.signature` is a hashable summary of what decides fit: two pods with the same
signature fit the same nodes, which lets `Cluster` reuse one decision for a burst of alike pods.

`PodRequest.devices` are the devices the pod asks for (extended resources in its containers'
limits, such as `nvidia.com/gpu: 1`; `corepin.kube.podplan.device_requests`) and
`device_alignment` its `corepin.io/device-alignment`: they never decide fit (the kubelet and
the default scheduler count devices), only the score (`corepin.placement.score`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from corepin.core.cpuset import CPUSet
from corepin.core.record import field, record
from corepin.kube.podplan import device_requests, plan_pod

#: the agent's assignment kind per effective container policy
KIND_OF: Final = {"none": "shared", "share": "share", "exclusive": "exclusive"}

#: What decides a container's fit: kind, count, level, workload, explicit CPUs.
AskKey = tuple[str, int, str, str | None, CPUSet | None]
#: What decides a pod's fit: (name, *key) of each container that holds CPUs, in order.
Signature = tuple[tuple[str, str, int, str, str | None, CPUSet | None], ...]

#: What a pod's devices add to its score: ((resource, count), ...) and its alignment.
DeviceKey = tuple[tuple[tuple[str, int], ...], str]

#: what a pod without any corepin request fits with
NOTHING: Final[Signature] = ()


@record
class ContainerAsk:
    """One app container: `kind` exclusive | share | shared, `count` CPUs (0 for shared)."""

    name: str
    kind: str = "shared"
    count: int = 0
    level: str = "cpu"
    workload: str | None = None
    cpus: CPUSet | None = None  # explicit CPUs of a PodCPUBinding
    ignored: str = ""  # why the agent will ignore what it asked ("" when it will not)

    @property
    def holds(self) -> bool:
        return self.kind != "shared"

    @property
    def key(self) -> AskKey:
        return (self.kind, self.count, self.level, self.workload, self.cpus)


@record
class PodRequest:
    """A pod's request: its identity and its containers in order."""

    namespace: str
    name: str
    uid: str
    containers: tuple[ContainerAsk, ...] = ()
    workload: str | None = None
    problem: str = ""  # malformed annotations: every container runs on the shared pool
    #: devices asked for ((resource, count), sorted) and how its CPUs should follow them
    devices: tuple[tuple[str, int], ...] = ()
    device_alignment: str = "preferred"
    #: the pod's labels (which CPUReservations it matches; never part of the signature)
    labels: Mapping[str, str] = field(default_factory=dict, compare=False)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def holds(self) -> bool:
        """Whether any container asks for CPUs of its own."""
        return any(c.holds for c in self.containers)

    @property
    def cpus(self) -> int:
        """CPUs asked for in all (exclusive and share)."""
        return sum(c.count for c in self.containers if c.holds)

    @property
    def device_key(self) -> DeviceKey:
        """What the pod's devices add to its score (nothing with alignment `none`)."""
        if self.device_alignment == "none" or not self.devices:
            return ((), "none")
        return (self.devices, self.device_alignment)

    @property
    def signature(self) -> Signature:
        """What decides fit: the holding containers' asks, in order."""
        return tuple((c.name, *c.key) for c in self.containers if c.holds) or NOTHING

    def describe(self) -> str:
        """One line for messages: `2 exclusive CPU(s) at level core for container 'app'`..."""
        parts = []
        for c in self.containers:
            if not c.holds:
                continue
            where = f" at level {c.level}" if c.level != "cpu" else ""
            cpus = f" (CPUs {c.cpus})" if c.cpus is not None else ""
            parts.append(f"{c.count} {c.kind} CPU(s){where}{cpus} for container {c.name!r}")
        return "; ".join(parts) if parts else "no CPUs of its own"


def pod_request(pod: Mapping[str, Any], binding: Mapping[str, Any] | None = None) -> PodRequest:
    """The request of `pod` (never raises: what cannot be read asks for nothing, as the agent
    runs it on the shared pool)."""
    plan = plan_pod(pod, binding)
    asks = []
    workload: str | None = None
    for c in plan.containers:
        kind = KIND_OF.get(c.policy, "shared")
        count = c.count if kind != "shared" else 0
        if kind != "shared" and count <= 0:
            kind, count = "shared", 0
        asks.append(
            ContainerAsk(
                name=c.name,
                kind=kind,
                count=count,
                level=c.level,
                workload=c.workload,
                cpus=c.cpus if kind != "shared" else None,
                ignored=c.problem,
            )
        )
        workload = workload or c.workload
    alignment = plan.containers[0].device_alignment if plan.containers else "preferred"
    meta = pod.get("metadata")
    raw = meta.get("labels") if isinstance(meta, Mapping) else None
    labels = (
        {k: v for k, v in raw.items() if isinstance(k, str) and isinstance(v, str)}
        if isinstance(raw, Mapping)
        else {}
    )
    return PodRequest(
        namespace=plan.namespace,
        name=plan.name,
        uid=plan.uid,
        containers=tuple(asks),
        workload=workload,
        problem=plan.problem,
        devices=tuple(device_requests(pod).items()),
        device_alignment=alignment,
        labels=labels,
    )


__all__ = ["KIND_OF", "ContainerAsk", "DeviceKey", "PodRequest", "pod_request"]
