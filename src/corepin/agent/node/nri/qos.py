"""Node QoS in NRI mode: each container's resctrl class, handed to the runtime before it runs.

The runtime takes an RDT class in its CreateContainer reply (NRI's `rdt_class`; containerd
makes it the OCI `linux.intelRdt.closID`, and runc writes the container's first process into
that resctrl group before it runs, so every thread it makes is in the class from the start).
At start the plugin makes one group per QoS class whose share of the cache or of memory
bandwidth is not the whole machine (`corepin.enforcement.resctrl.ResctrlClasses`, from the
`--qos-config` policy or the default one) and names it in the reply of each container of that
class. Classes at the default, and a node without resctrl, name none (the runtime then leaves
the container in the root group).

Best-effort suppression and CPU burst need the node's cgroups, which the plugin does not write:
they are the node agent's (`corepin agent`).
"""

from __future__ import annotations

import logging
import os

from corepin.agent.node.nri.settings import NriSettings
from corepin.agent.qos_file import read_policy_file
from corepin.allocation.qos import QosPolicy
from corepin.core.errors import CorepinError
from corepin.enforcement.resctrl import ResctrlClasses, ResctrlFs, open_resctrl

log = logging.getLogger("corepin.agent.nri")

__all__ = ["RdtClasses"]


class RdtClasses:
    """The resctrl groups of the QoS classes, as RDT class names for the runtime."""

    def __init__(self, settings: NriSettings, *, fs: ResctrlFs | None = None) -> None:
        """Read the policy (InputError naming the file and the field: exit 2) and make the
        class groups (through `fs`: the mounted filesystem by default); a node without
        resctrl, or a resctrl that refuses them, is logged and leaves every container in the
        root group."""
        policy = read_policy_file(settings.qos_config) if settings.qos_config else QosPolicy()
        self.classes: ResctrlClasses | None = None
        classes, note = open_resctrl(settings.resctrl_root, settings.proc_root, fs=fs)
        if classes is None:
            log.info("event=no_resctrl root=%s: %s", settings.resctrl_root, note)
            return
        try:
            for change in classes.apply(policy.classes):
                log.info("event=resctrl_class %s", change)
        except CorepinError as err:
            log.warning("event=resctrl_refused: %s; containers stay in the root group", err)
            return
        self.classes = classes

    def group_of(self, qos_class: str) -> str | None:
        """The RDT class (resctrl group) of `qos_class`, None when it has none."""
        if self.classes is None:
            return None
        group = self.classes.group_of(qos_class)
        if group is None or not os.path.isdir(os.path.join(self.classes.root, group)):
            return None
        return group
