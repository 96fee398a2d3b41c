"""`corepin nri` as a process: the node lock, the decisions, the runtime connection, the API.

- `NodeLock` (mode `nri`) first: a node agent that manages the node already makes the plugin
  refuse to start (exit 4, naming it); another `corepin nri` of the node is waited for.
- With the API (`ApiReporter`), the node's pods are watched before the runtime is asked, and
  every decision is published as the agent publishes it.
- `NriPolicy` answers the runtime's requests (`corepin.nri.plugin.NriPlugin` serves them on its
  dispatcher thread); each request is counted and timed by the plugin's observer (`NriMetrics`).
- Node QoS: each container's resctrl class goes to the runtime in its CreateContainer reply
  (`corepin.agent.node.nri.qos`).
- Every update of a container goes out in a reply to the runtime (`NriPolicy` says why it
  never calls the runtime's UpdateContainers on its own).
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable

from corepin.agent.node.lock import NodeLock
from corepin.agent.node.metrics import NriMetrics
from corepin.agent.node.nri.policy import EVENTS, NriPolicy
from corepin.agent.node.nri.qos import RdtClasses
from corepin.agent.node.nri.report import ApiReporter
from corepin.agent.node.nri.settings import NriSettings
from corepin.core.errors import EnvironmentProblem
from corepin.kube.client import KubeClient
from corepin.nri.plugin import NriPlugin
from corepin.state.model import HostState
from corepin.topology.model import Topology

log = logging.getLogger("corepin.agent.nri")


def event_label(method: str) -> str:
    """The `event` label of an NRI request: its method in snake case (`create_container`)."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", method).lower()


class NriAgent:
    """One node's NRI plugin process (see the module docstring)."""

    def __init__(
        self,
        settings: NriSettings,
        topology: Topology,
        *,
        metrics: NriMetrics | None = None,
        client: KubeClient | None = None,
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.lock = NodeLock(settings.state_dir, settings.node_name, mode="nri")
        self.reporter = None if client is None else ApiReporter(settings, client, topology)
        reporter = self.reporter
        self.rdt = RdtClasses(settings)
        self.policy = NriPolicy(
            settings,
            topology,
            reservation=None if reporter is None else reporter.reservation,
            on_state=self._committed,
            on_decided=(lambda d: None) if reporter is None else reporter.decided,
            on_forgotten=(lambda uid: None) if reporter is None else reporter.forgotten,
            rdt_group=self.rdt.group_of,
        )
        self.plugin = NriPlugin(
            self.policy,
            socket_path=settings.socket,
            name=settings.plugin_name,
            index=settings.plugin_index,
            events=EVENTS,
            observer=None if metrics is None else self._observed,
        )
        self.topology = topology
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    # ------------------------------------------------------------------ lifecycle
    def start(self, timeout: float = 10.0) -> None:
        """Take the node lock, connect and register with the runtime, and serve it from a
        thread. EnvironmentProblem (exit 4) when the node or the socket cannot be had."""
        if not self.lock.acquire(self._stop):
            raise EnvironmentProblem(
                "stopped while waiting for the node lock", reason="node_lock_wait_stopped"
            )
        try:
            if self.reporter is not None:  # the pods are known before the runtime asks
                self.reporter.start(self.policy.store, self.policy.refresh)
            self.plugin.connect_first(timeout)
        except BaseException:
            if self.reporter is not None:
                self.reporter.stop()
            self.lock.release()
            raise
        self._spawn(lambda: self.plugin.serve(self._stop), "nri-serve")

    def stop(self, timeout: float = 5.0) -> None:
        """Close the connection and stop within about `timeout` seconds."""
        self._stop.set()
        self.plugin.close()
        for thread in self._threads:
            thread.join(timeout / 2)
        if self.reporter is not None:
            self.reporter.stop(timeout / 2)
        self.lock.release()

    def ready(self) -> bool:
        """Synchronized with the runtime (and, with the API, every watch in contact)."""
        in_contact = self.reporter is None or self.reporter.in_contact()
        return self.policy.synced.is_set() and in_contact

    def wait_synced(self, timeout: float) -> bool:
        return self.policy.synced.wait(timeout)

    # ------------------------------------------------------------------ internals
    def _spawn(self, target: Callable[[], None], name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def _observed(self, method: str, seconds: float, code: int) -> None:
        """Every request the runtime made, counted and timed; a CreateContainer is also a
        container to pin, decided in the reply."""
        assert self.metrics is not None
        self.metrics.nri_request(event_label(method), seconds)
        if method == "CreateContainer":
            self.metrics.pinning_request()
            self.metrics.observe_decision(seconds)
            if code:
                self.metrics.pinning_error("nri_request_failed")

    def _committed(self, state: HostState) -> None:
        if self.metrics is not None:
            self.metrics.observe_state(state, self.topology)


__all__ = ["NriAgent", "event_label"]
