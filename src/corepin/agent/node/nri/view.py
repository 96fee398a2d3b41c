"""What the container runtime told the NRI plugin: its pods and containers (pure: no I/O).

The runtime reports pods and containers through NRI (Synchronize, then one event at a time).
`RuntimeView` keeps them, and `pod_object` shows one pod the way the node agent's pod plan
reads a pod from the Kubernetes API (`corepin.kube.podplan.plan_pod`), so the NRI plugin
decides by exactly the agent's rules: the policy from the pod's annotations (NRI passes them
with the pod), eligibility from the container's CPU request and limit. The runtime knows those
only as the kubelet turned them into Linux resources, and they are turned back here:

- limit = CFS quota / period (no quota, or a quota <= 0: no limit);
- request = shares x 1000 / 1024 millicores (the kubelet writes request x 1024 / 1000; whole
  CPUs come back exactly, and nothing else comes back as a whole number).

A container's state is the runtime's: created or running counts as running for the plan (a
container being created gets its CPUs before it starts), stopped as terminated. When a pod has
two containers of one name (a restarted container beside its stopped predecessor, until the
kubelet removes it), the newest one that is not stopped speaks for the name.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator, Mapping
from fractions import Fraction
from typing import Any, Final

from corepin.core.record import record, replace
from corepin.nri.gen import api_pb2

#: runtime names (ConfigureRequest.runtime_name) to the scheme of a Kubernetes container id
RUNTIME_SCHEMES: Final = {"containerd": "containerd", "cri-o": "cri-o", "crio": "cri-o"}
#: container annotation (set in the CreateContainer adjustment) keeping the kubelet's CFS quota
#: and period of a container whose quota the plugin lifts, as "QUOTA/PERIOD": after a restart
#: the runtime reports the lifted quota (-1), and this tells the limit it stands for
ANN_CPU_LIMIT: Final = "corepin.io/cfs-quota"
_HEX64: Final = re.compile(r"[0-9a-f]{64}")
#: NRI container states that run (or are about to)
LIVE_STATES: Final = (
    api_pb2.CONTAINER_CREATED,
    api_pb2.CONTAINER_RUNNING,
    api_pb2.CONTAINER_PAUSED,
)


@record
class CpuAsk:
    """A container's CPU resources as the runtime was asked to set them (None: not set)."""

    quota: int | None = None
    period: int | None = None
    shares: int | None = None

    @classmethod
    def of(cls, resources: api_pb2.LinuxResources | None) -> CpuAsk:
        """The CPU part of NRI Linux resources (an unset optional field is None)."""
        if resources is None or not resources.HasField("cpu"):
            return cls()
        cpu = resources.cpu
        # 0 is "not set" in the CRI's resources, which the runtime passes on as they came
        return cls(
            quota=(cpu.quota.value or None) if cpu.HasField("quota") else None,
            period=(cpu.period.value or None) if cpu.HasField("period") else None,
            shares=(cpu.shares.value or None) if cpu.HasField("shares") else None,
        )

    def merged(self, newer: CpuAsk) -> CpuAsk:
        """This ask with what `newer` sets (an update names only what changes)."""
        return CpuAsk(
            quota=self.quota if newer.quota is None else newer.quota,
            period=self.period if newer.period is None else newer.period,
            shares=self.shares if newer.shares is None else newer.shares,
        )

    def with_kept_limit(self, annotations: Mapping[str, str]) -> CpuAsk:
        """This ask with the quota and period of `ANN_CPU_LIMIT` when its quota is lifted."""
        kept = annotations.get(ANN_CPU_LIMIT, "")
        quota, _, period = kept.partition("/")
        if self.quota != -1 or not quota.isdigit() or not period.isdigit():
            return self
        return replace(self, quota=int(quota), period=int(period))

    def limit_text(self) -> str:
        """The value of `ANN_CPU_LIMIT` for this ask ("" when it has no quota to keep)."""
        if self.quota is None or self.quota <= 0 or not self.period:
            return ""
        return f"{self.quota}/{self.period}"

    def resources(self) -> dict[str, dict[str, str]]:
        """The Kubernetes `resources` (limits and requests of cpu) this ask came from."""
        out: dict[str, dict[str, str]] = {"limits": {}, "requests": {}}
        if self.quota is not None and self.quota > 0 and self.period:
            out["limits"]["cpu"] = _quantity(Fraction(self.quota, self.period))
        if self.shares is not None and self.shares > 0:
            out["requests"]["cpu"] = _quantity(Fraction(self.shares, 1024))
        return out


def _quantity(cpus: Fraction) -> str:
    """A CPU quantity as Kubernetes writes one: whole CPUs plainly, else millicores (a
    fraction of a millicore rounded down, which never makes a whole number)."""
    if cpus.denominator == 1:
        return str(cpus.numerator)
    return f"{int(cpus * 1000)}m"


@record
class RuntimeContainer:
    """One container as the runtime reported it; `seq` orders the reports."""

    id: str
    pod_id: str
    name: str
    state: int
    ask: CpuAsk
    #: the CPUs and memory nodes the runtime last reported or was told ("" when not known)
    cpus: str = ""
    mems: str = ""
    seq: int = 0
    #: an update was sent or held back before it ran: its pin is checked again once it runs
    stale: bool = False

    @property
    def live(self) -> bool:
        return self.state in LIVE_STATES

    @property
    def running(self) -> bool:
        return self.state == api_pb2.CONTAINER_RUNNING


@record
class RuntimePod:
    """One pod sandbox as the runtime reported it."""

    id: str
    name: str
    namespace: str
    uid: str
    annotations: Mapping[str, str]
    labels: Mapping[str, str]
    cgroup_parent: str = ""


class RuntimeView:
    """The runtime's pods and containers, kept from NRI requests."""

    def __init__(self) -> None:
        self.pods: dict[str, RuntimePod] = {}
        self.containers: dict[str, RuntimeContainer] = {}
        #: pod id -> ids of its containers (a pod's containers without a scan of every one)
        self._in_pod: dict[str, set[str]] = {}
        self._seq = 0

    def clear(self) -> None:
        self.pods.clear()
        self.containers.clear()
        self._in_pod.clear()

    # ------------------------------------------------------------------ what NRI reported
    def pod(self, pod: api_pb2.PodSandbox) -> RuntimePod:
        """Record (or refresh) a pod sandbox."""
        known = RuntimePod(
            id=pod.id,
            name=pod.name,
            namespace=pod.namespace or "default",
            uid=pod.uid or pod.id,
            annotations=dict(pod.annotations),
            labels=dict(pod.labels),
            cgroup_parent=pod.linux.cgroup_parent if pod.HasField("linux") else "",
        )
        self.pods[pod.id] = known
        return known

    def container(
        self, container: api_pb2.Container, *, state: int | None = None
    ) -> RuntimeContainer:
        """Record (or refresh) a container; `state` overrides the reported one. The CPU ask
        is read when the container is first seen (later reports show the plugin's own pin;
        `set_ask` records a change the kubelet asks for)."""
        resources = container.linux.resources if container.HasField("linux") else None
        cpu = resources.cpu if resources is not None and resources.HasField("cpu") else None
        self._seq += 1
        old = self.containers.get(container.id)
        ask = (
            old.ask
            if old is not None
            else CpuAsk.of(resources).with_kept_limit(container.annotations)
        )
        known = RuntimeContainer(
            id=container.id,
            pod_id=container.pod_sandbox_id,
            name=container.name,
            state=container.state if state is None else state,
            ask=ask,
            cpus=cpu.cpus if cpu is not None else (old.cpus if old else ""),
            mems=cpu.mems if cpu is not None else (old.mems if old else ""),
            seq=old.seq if old is not None else self._seq,
            stale=old.stale if old is not None else False,
        )
        self.containers[container.id] = known
        self._in_pod.setdefault(known.pod_id, set()).add(known.id)
        return known

    def set_state(self, container_id: str, state: int) -> RuntimeContainer | None:
        known = self.containers.get(container_id)
        if known is not None:
            known = self.containers[container_id] = replace(known, state=state)
        return known

    def set_ask(self, container_id: str, ask: CpuAsk) -> None:
        known = self.containers.get(container_id)
        if known is not None:
            self.containers[container_id] = replace(known, ask=known.ask.merged(ask))

    def told(self, container_id: str, cpus: str, mems: str) -> None:
        """The runtime was told (or reported) these CPUs and memory nodes for a container."""
        known = self.containers.get(container_id)
        if known is not None:
            self.containers[container_id] = replace(known, cpus=cpus, mems=mems)

    def set_stale(self, container_id: str, stale: bool) -> None:
        known = self.containers.get(container_id)
        if known is not None:
            self.containers[container_id] = replace(known, stale=stale)

    def drop_container(self, container_id: str) -> RuntimeContainer | None:
        gone = self.containers.pop(container_id, None)
        if gone is not None:
            self._in_pod.get(gone.pod_id, set()).discard(container_id)
        return gone

    def drop_pod(self, pod_id: str) -> RuntimePod | None:
        for cid in self._in_pod.pop(pod_id, set()):
            self.containers.pop(cid, None)
        return self.pods.pop(pod_id, None)

    # ------------------------------------------------------------------ reading it
    def live(self) -> Iterator[RuntimeContainer]:
        """Containers that run or are about to."""
        return (c for c in self.containers.values() if c.live)

    def of_pod(self, pod_id: str) -> list[RuntimeContainer]:
        """The container that speaks for each name of the pod (see the module docstring)."""
        chosen: dict[str, RuntimeContainer] = {}
        mine = (self.containers[cid] for cid in self._in_pod.get(pod_id, ()))
        for c in sorted(mine, key=lambda c: c.seq):
            have = chosen.get(c.name)
            if have is None or c.live or not have.live:
                chosen[c.name] = c
        return list(chosen.values())

    def speaks_for(self, container: RuntimeContainer) -> bool:
        """True when `container` is the one that speaks for its name in its pod."""
        return any(c.id == container.id for c in self.of_pod(container.pod_id))

    def pod_object(self, pod_id: str, runtime: str = "containerd") -> dict[str, Any]:
        """The pod as `plan_pod` reads a pod of the API (see the module docstring)."""
        pod = self.pods[pod_id]
        scheme = RUNTIME_SCHEMES.get(runtime, "containerd")
        containers = []
        statuses = []
        for c in self.of_pod(pod_id):
            containers.append({"name": c.name, "resources": c.ask.resources()})
            if c.live:
                state: dict[str, Any] = {"running": {}}
            elif c.state == api_pb2.CONTAINER_STOPPED:
                state = {"terminated": {}}
            else:
                state = {"waiting": {}}
            statuses.append(
                {"name": c.name, "containerID": f"{scheme}://{plan_id(c.id)}", "state": state}
            )
        status: dict[str, Any] = {"containerStatuses": statuses}
        qos = qos_of_parent(pod.cgroup_parent)
        if qos:
            status["qosClass"] = qos
        return {
            "metadata": {
                "name": pod.name,
                "namespace": pod.namespace,
                "uid": pod.uid,
                "annotations": dict(pod.annotations),
                "labels": dict(pod.labels),
            },
            "spec": {"containers": containers},
            "status": status,
        }


def plan_id(container_id: str) -> str:
    """The container id as the pod plan takes one (64 lowercase hex digits, as containerd and
    CRI-O make them); another runtime's id is named by the SHA-256 of it, stable and unique."""
    if _HEX64.fullmatch(container_id):
        return container_id
    return hashlib.sha256(container_id.encode("utf-8", "surrogateescape")).hexdigest()


def qos_of_parent(cgroup_parent: str) -> str:
    """The Kubernetes QoS class the kubelet's cgroup parent of a pod names ("" when it names
    none): `.../kubepods/besteffort/pod...`, `kubepods-burstable-pod....slice`, and
    `kubepods/pod...` for Guaranteed."""
    words = cgroup_parent.replace(".slice", "").replace("-", "/").split("/")
    if "kubepods" not in words:
        return ""
    if "besteffort" in words:
        return "BestEffort"
    if "burstable" in words:
        return "Burstable"
    return "Guaranteed"


__all__ = [
    "ANN_CPU_LIMIT",
    "LIVE_STATES",
    "CpuAsk",
    "RuntimeContainer",
    "RuntimePod",
    "RuntimeView",
    "plan_id",
    "qos_of_parent",
]
