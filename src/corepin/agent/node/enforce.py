"""Container cgroups of the node agent: where they are and what they should hold.

A container's cgroup comes from its pod uid, QoS class, runtime and container id in the
kubelet's layout (`corepin.enforcement.layout`, cgroupfs `kubepods/...` or systemd
`kubepods.slice/...`, below `--kubelet-cgroup-root`); when it is not where the layout says
(a runtime with another naming), the kubepods tree is searched for the id. Every path is built
from validated components, so a container id with path characters never becomes a path.

What is written (through the one reconcile engine, `corepin.enforcement.reconcile`, which reads
first and writes only what differs - a steady state writes nothing):
- `cpuset.cpus`: the container's CPUs (exclusive, share) or the shared pool (none) - for a
  best-effort container the part of it the QoS loop leaves BE work (`be_cpus`), when it
  squeezes BE work by cpuset;
- `cpuset.mems`: the NUMA nodes of those CPUs, or every memory node for the shared pool;
- CFS quota: removed for exclusive containers, and for the pod cgroup when every app container
  of the pod is exclusive; put back to the kubelet's value (limit x period) when a container
  stops being exclusive (`quotas`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from corepin.agent.node.quantities import absurd_cpu
from corepin.agent.node.sync import pod_assignments
from corepin.core.cpuset import CPUSet
from corepin.core.errors import CgroupError, CorepinError
from corepin.core.ids import split_cgroup_path
from corepin.core.quantity import parse_quantity
from corepin.core.record import replace
from corepin.enforcement.cgroups import CgroupDriver, CpuQuota, open_cpuset_hierarchy
from corepin.enforcement.layout import (
    KUBEPODS,
    KUBEPODS_SLICE,
    container_cgroup_path,
    find_container_cgroup,
    pod_cgroup_path,
    qos_cgroup_path,
)
from corepin.enforcement.reconcile import CgroupTarget, Reconciler, ReconcileReport
from corepin.enforcement.wanted import cpus_and_mems
from corepin.kube.models import PodView
from corepin.kube.podplan import PodPlan
from corepin.state.kubelet import KUBELET_POLICY
from corepin.state.model import Assignment, HostState
from corepin.topology.model import Topology

log = logging.getLogger("corepin.agent.node")

LAYOUTS = ("auto", "cgroupfs", "systemd")


class ContainerCgroups:
    """The cgroups of the node's containers on one cpuset hierarchy."""

    def __init__(
        self,
        driver: CgroupDriver,
        topology: Topology,
        *,
        kubelet_root: str = "/",
        layout: str = "auto",
        proc_root: str = "/proc",
    ) -> None:
        if layout not in LAYOUTS:
            raise ValueError(f"unknown cgroup driver {layout!r}")
        self.driver = driver
        self.topology = topology
        self.kubelet_root = "/".join(split_cgroup_path(kubelet_root))
        self._layout = layout
        self.proc_root = proc_root
        self.writes = 0
        self._all_mems = CPUSet(n.id for n in topology.numa_nodes) or CPUSet.of(0)

    def say_hierarchy(self, cgroup_root: str) -> None:
        """Log the cgroup hierarchies the agent writes, once (CFS quota needs the cpu one)."""
        driver = self.driver
        cpu = getattr(driver, "cpu_root", driver.root) if driver.version == 1 else driver.root
        log.info("event=cgroups version=%d cpuset=%s cpu=%s", driver.version, driver.root, cpu)
        if not driver.has_cpu_controller():
            log.warning(
                "event=no_cpu_controller cgroup_root=%s: no cpu controller found below the "
                "cgroup root; exclusive containers keep their CFS quota",
                cgroup_root,
            )

    # ------------------------------------------------------------------ layout
    @property
    def layout(self) -> str:
        """cgroupfs or systemd: as configured, else what exists below the kubelet root."""
        if self._layout == "auto":
            systemd = self._join(KUBEPODS_SLICE)
            self._layout = "systemd" if self.driver.exists(systemd) else "cgroupfs"
        return self._layout

    def _join(self, rel: str) -> str:
        return f"{self.kubelet_root}/{rel}" if self.kubelet_root else rel

    @property
    def kubepods(self) -> str:
        return self._join(KUBEPODS_SLICE if self.layout == "systemd" else KUBEPODS)

    @property
    def be_group(self) -> str:
        """The kubelet's BestEffort QoS cgroup (`kubepods/besteffort`, or
        `kubepods.slice/kubepods-besteffort.slice` with systemd), relative to the hierarchy."""
        return qos_cgroup_path(self.layout, "besteffort", cgroup_root=self.kubelet_root)

    def pod_path(self, qos: str, pod_uid: str) -> str:
        return pod_cgroup_path(self.layout, qos, pod_uid, cgroup_root=self.kubelet_root)

    def container_path(self, qos: str, pod_uid: str, runtime: str, container_id: str) -> str | None:
        """The container's cgroup (relative to the hierarchy), or None when it is not there."""
        try:
            path = container_cgroup_path(
                self.layout, qos, pod_uid, runtime, container_id, cgroup_root=self.kubelet_root
            )
        except CorepinError:
            return None
        if self.driver.exists(path):
            return path
        try:
            return find_container_cgroup(
                self.driver.root, container_id, runtime=runtime, under=(self.kubepods,)
            )
        except CorepinError:
            return None

    # ------------------------------------------------------------------ targets
    def targets(
        self,
        state: HostState,
        assignments: Iterable[Assignment],
        quotas: Mapping[str, CpuQuota | None] | None = None,
        *,
        be_cpus: CPUSet | None = None,
        is_be: Callable[[Assignment], bool] | None = None,
    ) -> list[CgroupTarget]:
        """Targets for the containers of `assignments` that have a cgroup; `quotas` maps a
        cgroup path (container or pod) to the CFS quota it should have (None: leave it);
        `be_cpus`: the CPUs the QoS loop leaves best-effort work, for the assignments `is_be`
        says are BE (`corepin.enforcement.wanted`)."""
        pool = state.shared_pool
        quotas = dict(quotas or {})
        out: list[CgroupTarget] = []
        seen: set[str] = set()
        for a in assignments:
            path = a.cgroup
            if a.container is None or path is None or path in seen:
                continue
            seen.add(path)
            be = be_cpus if be_cpus and is_be is not None and is_be(a) else None
            cpus, mems = cpus_and_mems(a, pool, self.topology, pool_mems=self._all_mems, be_cpus=be)
            if not cpus:
                continue
            out.append(
                CgroupTarget(path, cpus=cpus, mems=mems, quota=quotas.pop(path, None), owner=a.id)
            )
        for path, quota in sorted(quotas.items()):
            if quota is not None and path not in seen and self.driver.exists(path):
                out.append(CgroupTarget(path, quota=quota, owner=path))
        return out

    def attach(self, state: HostState, plan: PodPlan) -> HostState:
        """The pod's assignments with the cgroup path of their current container."""
        for a in pod_assignments(state, plan.uid):
            owner = a.container
            if owner is None or not owner.container_id or a.policy == KUBELET_POLICY:
                continue
            path = self.container_path(
                plan.qos, plan.uid, owner.runtime or "containerd", owner.container_id
            )
            if path != owner.cgroup:
                state = state.replace_assignment(a.evolve(owner=replace(owner, cgroup=path)))
        return state

    def quotas(
        self, state: HostState, plan: PodPlan, pod: Mapping[str, Any]
    ) -> dict[str, CpuQuota | None]:
        """CFS quota per cgroup: none for exclusive containers (and their pod when every app
        container is exclusive), the kubelet's limit x period for the others."""
        if not self.driver.has_cpu_controller():
            return {}  # (said once at start-up)
        limits = cpu_limits(pod)
        out: dict[str, CpuQuota | None] = {}
        exclusive = 0
        for a in pod_assignments(state, plan.uid):
            owner = a.container
            if owner is None or a.cgroup is None or a.policy == KUBELET_POLICY:
                continue
            if plan.container(owner.container) is None:
                continue  # an init container: the kubelet's quota stays
            limit = limits.get(owner.container)
            if a.kind == "exclusive" and (limit is None or limit >= len(a.cpus)):
                # no quota: the container's CPUs bound it as tightly as its limit would. An
                # exclusive set larger than the limit (never planned so; a stale or foreign
                # record) keeps the limit's quota: a pin never lifts a limit
                out[a.cgroup] = CpuQuota.unlimited()
                exclusive += 1
            elif limit is not None:
                out[a.cgroup] = CpuQuota.for_cpus(limit)
        if plan.containers and exclusive == len(plan.containers):
            out[self.pod_path(plan.qos, plan.uid)] = CpuQuota.unlimited()
        elif exclusive == 0 and len(limits) == len(plan.containers) and plan.containers:
            pod_path = self.pod_path(plan.qos, plan.uid)
            try:
                current = self.driver.read_quota_fast(pod_path, CpuQuota.unlimited())
            except CorepinError:
                current = None
            if current is not None and current.is_unlimited:
                out[pod_path] = CpuQuota.for_cpus(sum(limits.values()))
        return out

    def apply(self, targets: list[CgroupTarget]) -> ReconcileReport:
        """Make the cgroups match `targets` (missing groups land in the report, not errors)."""
        live: list[CgroupTarget] = []
        missing: list[str] = []
        for t in targets:
            if self.driver.exists(t.path):
                live.append(t)
            else:
                missing.append(t.path)
        report = Reconciler(
            self.driver, proc_root=self.proc_root, topology=self.topology
        ).reconcile(live)
        report.missing.extend(missing)
        self.writes += report.writes
        return report


def cpu_limits(pod: Mapping[str, Any]) -> dict[str, float]:
    """The CPU limit of each app container of `pod` that has one (in CPUs; absurd or
    malformed quantities left out)."""
    limits: dict[str, float] = {}
    for c in PodView(pod).spec.get("containers") or []:
        raw = ((c.get("resources") or {}).get("limits") or {}).get("cpu")
        if raw is not None and not absurd_cpu(raw):
            try:
                limits[c.get("name")] = float(parse_quantity(raw))
            except CorepinError:
                continue
    return limits


def open_hierarchy(cgroup_root: str) -> CgroupDriver:
    """The cpuset hierarchy the agent writes (v1 or v2), EnvironmentProblem when unusable."""
    driver = open_cpuset_hierarchy(cgroup_root)
    if not os.path.isdir(driver.root):
        raise CgroupError(
            driver.root,
            "no cpuset hierarchy here: mount the host's cgroup file system into the agent "
            "(--cgroup-root)",
            reason="no_cpuset_hierarchy",
        )
    return driver
