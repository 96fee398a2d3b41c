"""Node QoS in host mode: the policy a state directory keeps, and the QoS period of
`corepin reconcile`.

- The policy (`corepin.agent.host.qos_policy`): the one given with `--qos-config`, else the
  one the state directory keeps, else the default. Both are read again when they change, so a
  running `reconcile --interval` applies an edited `--qos-config` file (or a policy another
  command kept) at its next pass; an edit with a bad value is refused by a note naming the
  field, and the policy in force stays.
- The period (`HostQos.period`): every pass of `corepin reconcile` builds one `QosMember` per
  assignment (its trusted cgroup, its live processes, its class) and the `QosNode` (online,
  reserved, the CPUs of exclusive runs, of LSR runs, the shared pool, the BE group) and runs one
  `QosEngine.period`: best-effort suppression on the BE group, CPU burst, resctrl classes and
  their tasks. The engine lives as long as the `HostQos` (the reconcile loop keeps it), so CPU
  use is measured between passes. The BE group is the state directory's own (empty cpuset.cpus,
  no quota, cpu.idle 0 when made), so a pass whose policy no longer narrows it puts those back
  even after an earlier process did the narrowing (`QosEngine.adopt_be_group`).
- resctrl (`--resctrl-root`, default /sys/fs/resctrl): not mounted is one note, no error. A
  new run joins its class's group itself before CMD execs
  (`corepin.agent.host.besteffort.resctrl_tasks_file`); the period catches new threads.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from corepin.agent.host.agent import HostAgent
from corepin.agent.host.besteffort import DEFAULT_RESCTRL_ROOT, make_be_group
from corepin.agent.host.qos_policy import POLICY_FILE, store_policy, stored_policy
from corepin.agent.qos_file import PolicyFile
from corepin.allocation.qos import QosPolicy
from corepin.core.cpuset import CPUSet
from corepin.core.errors import InputError
from corepin.enforcement.note import Note
from corepin.enforcement.qos.cpu import CpuControl
from corepin.enforcement.qos.engine import QosEngine, QosMember, QosNode
from corepin.enforcement.resctrl.classes import ResctrlClasses, open_resctrl
from corepin.sysfs.procfs import ProcessGroup

if TYPE_CHECKING:
    from corepin.state.model import HostState

__all__ = ["DEFAULT_RESCTRL_ROOT", "HostQos", "describe_resctrl"]


# ---------------------------------------------------------------------- the period
class HostQos:
    """The node QoS loop of one host's state directory (kept across reconcile passes).

    `policy`: the policy given on the command line (kept in the state directory by the first
    pass), else the kept one, else the default; `config`: the file it came from (read again
    when it changes); `resctrl_root`: where resctrl is mounted when
    given (not there: one note, no error); None: the default, and no note without it."""

    def __init__(
        self,
        host: HostAgent,
        *,
        policy: QosPolicy | None = None,
        config: str | None = None,
        resctrl_root: str | None = None,
    ) -> None:
        self.host = host
        self.given = policy
        self.config = PolicyFile(config) if config is not None else None
        self.resctrl_root = resctrl_root
        self._engine: QosEngine | None = None
        self._opened = False
        self._said: set[str] = set()
        #: QoS periods run so far (the first one only measures: it has nothing to compare)
        self.periods = 0

    def policy(self) -> QosPolicy:
        """The policy in force: the one given, else the kept one, else the default."""
        if self.given is not None:
            return self.given
        return stored_policy(self.host.settings.state_dir) or QosPolicy()

    def reread(self) -> list[Note]:
        """Read the `--qos-config` file again when it changed since it was last read: a good
        policy replaces the one given (and is kept by `keep_policy`), a bad one is a note
        naming the field and changes nothing."""
        if self.config is None or not self.config.changed():
            return []
        try:
            policy = self.config.read()
        except InputError as err:
            return [Note("refused", "qos", f"{err}; the QoS policy in force stays")]
        if policy == self.given:
            return []
        self.given = policy
        return [Note("qos", "policy", f"read the changed QoS policy in {self.config.path}")]

    def keep_policy(self) -> list[Note]:
        """Keep the policy given in the state directory (under the state lock)."""
        if self.given is None:
            return []
        if store_policy(self.host.settings.state_dir, self.given):
            path = os.path.join(self.host.settings.state_dir, POLICY_FILE)
            return [Note("qos", "policy", f"kept the QoS policy given in {path}")]
        return []

    @property
    def be_cpus(self) -> CPUSet | None:
        """The BE set in force (None before the first period, or when the engine has none)."""
        return self._engine.be_cpus if self._engine is not None else None

    def _once(self, key: str, note: Note) -> list[Note]:
        if key in self._said:
            return []
        self._said.add(key)
        return [note]

    def _open(self) -> tuple[QosEngine | None, list[Note]]:
        if self._opened:
            return self._engine, []
        self._opened = True
        notes: list[Note] = []
        pinner = self.host.pinner
        driver = pinner.driver or pinner.inspector
        if driver is None:
            notes.append(
                Note(
                    "qos",
                    "host",
                    "no cgroup hierarchy to measure or confine runs with: the QoS period "
                    "is off (use --cgroups auto or on)",
                )
            )
            return None, notes
        resctrl, said = self._open_resctrl()
        notes.extend(said)
        self._engine = QosEngine(
            CpuControl(driver, cpuacct_root=pinner.cpuacct_root),
            pinner.driver,
            resctrl=resctrl,
            proc_root=self.host.settings.proc_root,
        )
        return self._engine, notes

    def _open_resctrl(self) -> tuple[ResctrlClasses | None, list[Note]]:
        root = self.resctrl_root or DEFAULT_RESCTRL_ROOT
        classes, note = open_resctrl(root, self.host.settings.proc_root)
        if note is None or self.resctrl_root is None:
            return classes, []
        return classes, [Note("qos", "resctrl", note)]

    def members(self, state: HostState) -> list[QosMember]:
        """One member per assignment: its trusted cgroup, live processes and class."""
        pinner = self.host.pinner
        table = self.host.liveness.table()
        out: list[QosMember] = []
        for a in state:
            pids: set[int] = set()
            process = a.process
            if process is not None:
                group = ProcessGroup(
                    process.pid, process.start_time, process.session, process.members
                )
                pids.update(group.pids(table))
            pids.update(p for p in pinner.cgroup_pids(a) or () if p in table)
            cgroup = pinner.trusted_cgroup(a) if pinner.driver is not None else None
            alive = tuple(sorted(p for p in pids if table[p].alive))
            out.append(QosMember(a.id, a.qos_class, cgroup, alive))
        return out

    def node(self, state: HostState) -> QosNode:
        """The node as the QoS loop sees it (see the module docstring)."""
        exclusive = CPUSet()
        lsr = CPUSet()
        for a in state:
            if a.exclusive:
                exclusive |= a.withheld
            elif a.kind == "share":
                lsr |= a.cpus
        pinner = self.host.pinner
        return QosNode(
            online=state.online,
            reserved=state.reserved,
            exclusive=exclusive,
            lsr=lsr,
            shared_pool=state.shared_pool,
            be_group=pinner.be_group if pinner.driver is not None else None,
        )

    def wants_sample(self, state: HostState) -> bool:
        """Whether a single pass (`reconcile --once`) should measure first and wait a sample
        before its period: no period has measured yet and best-effort work is there to be
        squeezed (a first period only measures)."""
        return self.periods == 0 and any(a.best_effort for a in state)

    def period(self, state: HostState) -> list[Note]:
        """One QoS period over `state`: what changed, and what went wrong, as notes."""
        engine, notes = self._open()
        if engine is None:
            return [n for n in notes if self._once(n.detail, n)]
        pinner = self.host.pinner
        if pinner.driver is not None:
            pinner.writes += make_be_group(pinner.driver, pinner.be_group)
        node = self.node(state)
        if self.periods == 0 and node.be_group is not None:
            # the BE group is this state directory's own: what a policy no longer in force
            # puts back is known even when an earlier pass (`--once`) narrowed it
            engine.adopt_be_group(node.be_group, node.shared_pool)
        report = engine.period(self.members(state), node, self.policy())
        self.periods += 1
        notes.extend(report.changes)
        notes.extend(Note("failed", "qos", problem) for problem in report.problems)
        return notes


def describe_resctrl(root: str, proc_root: str) -> list[dict[str, Any]]:
    """The per-class resctrl view of `corepin report` (`ResctrlClasses.describe()` as plain
    data); [] without resctrl."""
    classes, _note = open_resctrl(root, proc_root)
    if classes is None:
        return []
    return [view.to_json() for view in classes.describe()]
