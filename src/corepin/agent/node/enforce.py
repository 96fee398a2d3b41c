"""Container cgroups of the node agent: where they are and what they should hold.

A container's cgroup comes from its pod uid, QoS class, runtime and container id in the
kubelet's layout (`corepin.enforcement.layout`, cgroupfs `kubepods/...` or systemd
`kubepods.slice/...`, below `--kubelet-cgroup-root`); when it is not where the layout says
(a runtime with another naming), the kubepods tree is searched for the id. Every path is built
from validated components, so a container id with path characters never becomes a path.

What is written (through the one reconcile engine, `corepin.enforcement.reconcile`, which reads
first and writes only what differs - a steady state writes nothing):
- `cpuset.cpus`: the container's CPUs (exclusive, share) or the shared pool (none);
- `cpuset.mems`: the NUMA nodes of those CPUs, or every memory node for the shared pool;
- CFS quota: removed for exclusive containers, and for the pod cgroup when every app container
  of the pod is exclusive; put back to the kubelet's value (limit x period) when a container
  stops being exclusive.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from corepin.core.cpuset import CPUSet
from corepin.core.errors import CorepinError
from corepin.enforcement.layout import KUBEPODS, KUBEPODS_SLICE
from corepin.enforcement.wanted import cpus_and_mems

if TYPE_CHECKING:
    from corepin.enforcement.cgroups import CgroupDriver, CpuQuota
    from corepin.enforcement.reconcile import CgroupTarget, ReconcileReport
    from corepin.state.model import Assignment, HostState
    from corepin.topology.model import Topology

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
        from corepin.core.ids import split_cgroup_path

        if layout not in LAYOUTS:
            raise ValueError(f"unknown cgroup driver {layout!r}")
        self.driver = driver
        self.topology = topology
        self.kubelet_root = "/".join(split_cgroup_path(kubelet_root))
        self._layout = layout
        self.proc_root = proc_root
        self.writes = 0
        self._all_mems = CPUSet(n.id for n in topology.numa_nodes) or CPUSet.of(0)

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

    def pod_path(self, qos: str, pod_uid: str) -> str:
        from corepin.enforcement.layout import pod_cgroup_path

        return pod_cgroup_path(self.layout, qos, pod_uid, cgroup_root=self.kubelet_root)

    def container_path(self, qos: str, pod_uid: str, runtime: str, container_id: str) -> str | None:
        """The container's cgroup (relative to the hierarchy), or None when it is not there."""
        from corepin.enforcement.layout import container_cgroup_path, find_container_cgroup

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
    ) -> list[CgroupTarget]:
        """Targets for the containers of `assignments` that have a cgroup; `quotas` maps a
        cgroup path (container or pod) to the CFS quota it should have (None: leave it)."""
        from corepin.enforcement.reconcile import CgroupTarget

        pool = state.shared_pool
        quotas = dict(quotas or {})
        out: list[CgroupTarget] = []
        seen: set[str] = set()
        for a in assignments:
            path = a.cgroup
            if a.container is None or path is None or path in seen:
                continue
            seen.add(path)
            cpus, mems = cpus_and_mems(a, pool, self.topology, pool_mems=self._all_mems)
            if not cpus:
                continue
            out.append(
                CgroupTarget(path, cpus=cpus, mems=mems, quota=quotas.pop(path, None), owner=a.id)
            )
        for path, quota in sorted(quotas.items()):
            if quota is not None and path not in seen and self.driver.exists(path):
                out.append(CgroupTarget(path, quota=quota, owner=path))
        return out

    def apply(self, targets: list[CgroupTarget]) -> ReconcileReport:
        """Make the cgroups match `targets` (missing groups land in the report, not errors)."""
        from corepin.enforcement.reconcile import Reconciler

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


def open_hierarchy(cgroup_root: str) -> CgroupDriver:
    """The cpuset hierarchy the agent writes (v1 or v2), EnvironmentProblem when unusable."""
    from corepin.core.errors import CgroupError
    from corepin.enforcement.cgroups import open_cpuset_hierarchy

    driver = open_cpuset_hierarchy(cgroup_root)
    if not os.path.isdir(driver.root):
        raise CgroupError(
            driver.root,
            "no cpuset hierarchy here: mount the host's cgroup file system into the agent "
            "(--cgroup-root)",
            reason="no_cpuset_hierarchy",
        )
    return driver
