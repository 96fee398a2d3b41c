"""The node agent's system shield (`--shield-system`): everything outside the kubelet's pods
(system daemons, the kubelet, the runtime) kept on the reserved CPUs and the shared pool.

Raised the first time the agent commits a state, re-sized whenever the pools change, repaired
(drift, new tasks) on every resync - always before the containers get their CPUs. A shield that
cannot be raised or synced is logged (once, until it works again) and tried again with the next
batch; the containers are pinned all the same.
"""

from __future__ import annotations

import logging

from corepin.agent.node.enforce import ContainerCgroups
from corepin.agent.node.settings import NodeSettings
from corepin.core.errors import CorepinError
from corepin.enforcement.cgroups import CgroupDriver, CgroupV1
from corepin.enforcement.layout import KUBELET_PARENTS
from corepin.enforcement.shield.control import HOST_EXCLUDED, Shield
from corepin.state.model import HostState
from corepin.sysfs.procfs import process_table

log = logging.getLogger("corepin.agent.node")


class SystemShield:
    """The shield over the whole cpuset hierarchy, on the agent's container cgroups."""

    def __init__(self, settings: NodeSettings, cgroups: ContainerCgroups) -> None:
        self.settings = settings
        self.cgroups = cgroups
        self._shield: Shield | None = None
        self._pending = False

    def apply(self, state: HostState, before: HostState, *, resync: bool) -> HostState:
        """`state` with the system shield raised the first time, re-sized when the pools
        changed since `before`, repaired on a `resync` (see the module docstring)."""
        if not self.settings.shield_system and state.shield is None:
            return state
        changed = (state.shared_pool, state.reserved) != (before.shared_pool, before.reserved)
        if state.shield is not None and not (changed or resync or self._pending):
            return state
        shield = self._system_shield()
        try:
            table = process_table(self.settings.proc_root)
            if state.shield is None:
                result = shield.on(state, table, scope="", kthreads=False, irqs=False)
                log.info("event=shield_on notes=%d", len(result.notes))
            else:
                synced = shield.sync(state, table)
                assert synced is not None
                result = synced
        except CorepinError as exc:
            if not self._pending:
                log.warning("event=shield_failed error=%s", exc)
            self._pending = True
            return state
        self._pending = False
        for note in result.notes:
            if note.action in ("failed", "refused"):
                log.warning(
                    "event=shield_%s target=%s detail=%s", note.action, note.target, note.detail
                )
        return state.evolve(shield=result.record)

    def _system_shield(self) -> Shield:
        if self._shield is None:
            driver: CgroupDriver = self.cgroups.driver
            if isinstance(driver, CgroupV1):  # the cpuset hierarchy alone, not the cpu one
                driver = CgroupV1(driver.root, None, fake_tree=driver.fake_tree)
            root = self.cgroups.kubelet_root
            kube = tuple(f"{root}/{k}" if root else k for k in KUBELET_PARENTS)
            self._shield = Shield(
                cgroup_root=self.settings.cgroup_root,
                proc_root=self.settings.proc_root,
                cgroups="on",
                excluded=(*HOST_EXCLUDED, *kube),
                driver=driver,
            )
        return self._shield


__all__ = ["SystemShield"]
