"""The node agent's QoS period: a thread that every `--qos-period` seconds hands the node's
containers to the QoS engine (`corepin.enforcement.qos.engine.QosEngine.period`): best-effort
suppression, CPU burst, resctrl classes.

What a period reads is what the agent already holds - the committed state (the containers and
their cgroups), the class table (`qosclass.QosClasses`: classes and the kubelet's CFS quota of
containers with a CPU limit), the policy in force (`qospolicy.QosPolicySource`) - so a period
never asks the API anything; the engine reads the cgroups' accounting and writes only what
differs (a steady state writes nothing).

Members: every container assignment with a cgroup (relative to the hierarchy), its class, and
its base quota when the agent leaves the kubelet's quota in place (not exclusive). The node:
online and reserved CPUs, the CPUs of LSE and of LSR assignments, the shared pool, and the
kubelet's BestEffort QoS cgroup (`kubepods/besteffort`, or the systemd slice) as the BE group.

One owner per file: with policy cpuset the engine owns the BE group's cpuset and everything
below it, and the agent writes BE containers the engine's set (`be_cpus`) instead of the shared
pool (`corepin.enforcement.wanted`), so the two never undo each other; when the set changes
the agent's worker is told (`on_be_cpus`), for BE containers outside the BE group. With burst
policies that raise the quota, the engine owns the quota of LS containers with a base quota
(`owns_quota`) and the agent leaves it.

Every change is logged (one line per note, `event=qos_change`), every problem too (once per
text); the figures go to the hooks (`qos_period`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping

from corepin.agent.node.enforce import ContainerCgroups
from corepin.agent.node.hooks import Hooks
from corepin.agent.node.qosclass import QosClasses
from corepin.agent.node.qospolicy import QosPolicySource
from corepin.agent.node.settings import QOS_CONFIGMAP, NodeSettings
from corepin.agent.node.store import NodeStore
from corepin.agent.node.watches import Watches
from corepin.core.cpuset import CPUSet
from corepin.core.errors import CorepinError
from corepin.enforcement.cgroups import CpuQuota
from corepin.enforcement.qos.cpu import CpuControl
from corepin.enforcement.qos.engine import QosEngine, QosMember, QosNode, QosReport
from corepin.kube.events import EventRecorder
from corepin.state.model import Assignment, HostState

log = logging.getLogger("corepin.agent.node")


def log_no_resctrl(note: str | None) -> None:
    """Say once, at start-up, why cache and memory bandwidth classes are off."""
    log.info("event=no_resctrl note=%s", note)


def qos_members(state: HostState, classes: QosClasses) -> list[QosMember]:
    """The engine's members: every container assignment with a cgroup."""
    out = []
    for a in state:
        if a.container is None or a.cgroup is None:
            continue
        out.append(QosMember(a.id, classes.of(a), a.cgroup, base_quota=classes.base_quota(a.id)))
    return out


def qos_node(state: HostState, classes: QosClasses, be_group: str | None) -> QosNode:
    """The engine's view of the node (see the module docstring)."""
    exclusive = state.exclusive_cpus
    lsr = CPUSet()
    for a in state:
        if not a.holds:
            continue
        name = classes.of(a)
        if name == "LSE" or a.exclusive:
            exclusive |= a.withheld
        elif name == "LSR" or a.kind == "share":
            lsr |= a.cpus
    return QosNode(
        online=state.online,
        reserved=state.reserved,
        exclusive=exclusive,
        lsr=lsr - exclusive,
        shared_pool=state.shared_pool,
        be_group=be_group,
    )


def is_best_effort(a: Assignment, classes: QosClasses) -> bool:
    """Whether the agent writes `a` the BE set: class BE, or a container of the BestEffort QoS
    cgroup (the engine writes everything below it)."""
    owner = a.container
    return owner is not None and (owner.qos == "besteffort" or classes.of(a) == "BE")


class QosLoop:
    """The QoS period of one agent (see the module docstring)."""

    def __init__(
        self,
        engine: QosEngine,
        store: NodeStore,
        cgroups: ContainerCgroups,
        classes: QosClasses,
        source: QosPolicySource,
        hooks: Hooks,
        *,
        period: float = 1.0,
        on_be_cpus: Callable[[], None] | None = None,
    ) -> None:
        self.engine = engine
        self.store = store
        self.cgroups = cgroups
        self.classes = classes
        self.source = source
        self.hooks = hooks
        self.seconds = period
        self.on_be_cpus = on_be_cpus
        self.periods = 0
        self.last: QosReport | None = None
        self._lock = threading.Lock()  # one period at a time (the thread, a test's call)
        self._said: set[str] = set()

    @property
    def be_cpus(self) -> CPUSet | None:
        """The CPUs BE work may use now (policy cpuset), None when it is not held to a set."""
        return self.engine.be_cpus

    def owns_quota(self, a: Assignment) -> bool:
        """Whether the engine owns the CFS quota of `a` (burst raising an LS container's quota
        above its limit): the agent then leaves that quota alone."""
        return (
            self.source.policy.cpu_burst.quota_on
            and self.classes.base_quota(a.id) is not None
            and self.classes.of(a) == "LS"
        )

    def run(self, stop: threading.Event) -> None:
        """The thread: a period every `seconds` until `stop` is set (a failing period is logged
        and the next one comes all the same)."""
        while not stop.wait(self.seconds):
            try:
                self.period()
            except CorepinError as err:
                log.warning("event=qos_period_failed error=%s", err)
            except Exception:  # a bug: the loop goes on, the log says what happened
                log.exception("event=qos_period_crashed")

    def period(self) -> QosReport | None:
        """One period now (None before the state is known)."""
        with self._lock:
            self.source.check_file()
            state = self.store.state
            if state is None:
                return None
            started = time.thread_time()
            before = self.engine.be_cpus
            report = self.engine.period(
                qos_members(state, self.classes),
                qos_node(state, self.classes, self.cgroups.be_group),
                self.source.policy,
            )
            self.periods += 1
            self.last = report
            for note in report.changes:
                log.info(
                    "event=qos_change action=%s target=%s detail=%s",
                    note.action,
                    note.target,
                    note.detail,
                )
            for problem in report.problems:
                if problem not in self._said:
                    self._said.add(problem)
                    log.warning("event=qos_problem problem=%s", problem)
            self.hooks.qos_period(report, time.thread_time() - started)
            if self.engine.be_cpus != before:
                log.info("event=be_cpus cpus=%s was=%s", self.engine.be_cpus, before)
                if self.on_be_cpus is not None:
                    self.on_be_cpus()
            return report


class NodeQos:
    """Node QoS in the agent: the class table, the policy source (and the ConfigMap's
    informer), the QoS loop and its thread."""

    def __init__(
        self,
        settings: NodeSettings,
        watches: Watches,
        store: NodeStore,
        cgroups: ContainerCgroups,
        events: EventRecorder,
        hooks: Hooks,
        *,
        engine: QosEngine | None = None,
        wake: Callable[[], None] | None = None,
    ) -> None:
        self.settings = settings
        self.watches = watches
        self.classes = QosClasses()
        self.source = QosPolicySource(
            settings.qos_config, settings.namespace, events, watches.node, hooks.qos_policy
        )
        self.loop: QosLoop | None = None
        if settings.qos_period > 0:
            if engine is None:
                driver = cgroups.driver
                engine = QosEngine(CpuControl(driver), driver, proc_root=settings.proc_root)
            self.loop = QosLoop(
                engine,
                store,
                cgroups,
                self.classes,
                self.source,
                hooks,
                period=settings.qos_period,
                on_be_cpus=wake,
            )

    def open(self) -> None:
        """The ConfigMap's informer, when the agent knows its namespace (not started)."""
        if not self.settings.namespace:
            log.info("event=qos_configmap_unwatched reason=no_namespace")
            return
        informer = self.watches.open_qos(self.settings.namespace)
        informer.add_handlers(
            on_add=self.source.map_changed,
            on_update=lambda old, new: self.source.map_changed(new),
            on_delete=self.source.map_deleted,
        )

    def start(
        self,
        spawn: Callable[[Callable[[], None], str], None],
        stop: threading.Event,
        timeout: float,
    ) -> None:
        """Start the ConfigMap's informer (waiting at most `timeout` for its list: the agent
        works without it, with the file's policy) and the loop's thread."""
        informer = self.watches.qos_config
        if informer is not None:
            informer.start()
            if not informer.wait_for_sync(timeout):
                log.warning(
                    "event=qos_configmap_not_synced namespace=%s: the policy of %s holds until "
                    "the API lists ConfigMap %s (may the agent get, list and watch configmaps "
                    "in its namespace?)",
                    self.settings.namespace,
                    self.source.origin,
                    QOS_CONFIGMAP,
                )
        if self.loop is not None:
            loop = self.loop
            spawn(lambda: loop.run(stop), "agent-qos")

    def stop(self, timeout: float) -> None:
        if self.watches.qos_config is not None:
            self.watches.qos_config.stop(timeout)

    # ------------------------------------------------------------------ for the worker
    @property
    def be_cpus(self) -> CPUSet | None:
        return self.loop.be_cpus if self.loop is not None else None

    def is_be(self, a: Assignment) -> bool:
        return is_best_effort(a, self.classes)

    def be_containers(self, state: HostState) -> list[Assignment]:
        """The containers the agent writes the BE set (after it changed)."""
        return [a for a in state if a.kind == "shared" and a.cgroup and self.is_be(a)]

    def left_quotas(
        self, state: HostState, quotas: Mapping[str, CpuQuota | None]
    ) -> dict[str, CpuQuota | None]:
        """`quotas` without those the QoS loop owns (CPU burst raising the quota)."""
        if self.loop is None:
            return dict(quotas)
        owned = {a.cgroup for a in state if a.cgroup and self.loop.owns_quota(a)}
        return {path: q for path, q in quotas.items() if path not in owned}


__all__ = ["NodeQos", "QosLoop", "is_best_effort", "log_no_resctrl", "qos_members", "qos_node"]
