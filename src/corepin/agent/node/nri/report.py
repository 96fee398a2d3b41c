"""What `corepin nri` publishes when it has the Kubernetes API: the node agent's records, fed
by the plugin's decisions instead of the agent's.

The runtime tells the plugin about pods; the API holds the pod objects the agent's records
belong to. `ApiReporter` watches the node's pods, the node and PodCPUBindings as the agent does
(`Watches`), and for every decided pod it hands the agent's publisher (`Publisher`) the pod's
`corepin.io/cpus` annotation and PodCPUBindings (`PodRecords`), tells its Events (`Teller`),
and keeps the node's NodeCPUTopology and NodeResourceTopology (`TopologyPublisher`) current,
with a heartbeat. A pod the informer does not show yet (the runtime can be faster than the
watch) is published as soon as it appears. The node's reservation annotation is read here too
(`NodeReservation`), and a change of it makes the plugin decide again (`on_node_changed`).
Assignment files are not written in NRI mode (`--assignment-dir` is the agent's).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Final

from corepin.agent.node.decide import PodWork
from corepin.agent.node.files import AssignmentFiles
from corepin.agent.node.nodetopology import TopologyPublisher
from corepin.agent.node.nri.policy import Decided
from corepin.agent.node.nri.settings import NriSettings
from corepin.agent.node.promises import Promises
from corepin.agent.node.publish import Publisher
from corepin.agent.node.records import PodRecords
from corepin.agent.node.reservation import NodeReservation
from corepin.agent.node.settings import NodeSettings
from corepin.agent.node.store import NodeStore
from corepin.agent.node.tell import Teller
from corepin.agent.node.watches import Watches, annotations_changed, pod_uid
from corepin.core.errors import EnvironmentProblem
from corepin.kube.client import KubeClient
from corepin.kube.events import EventRecorder
from corepin.topology.model import Topology

log = logging.getLogger("corepin.agent.nri")

#: seconds between two heartbeats of the NodeCPUTopology (as the agent's default)
HEARTBEAT: Final = 10.0


class ApiReporter:
    """The node's records in the API, from the NRI plugin's decisions."""

    def __init__(
        self,
        settings: NriSettings,
        client: KubeClient,
        topology: Topology,
        *,
        clock: Callable[[], float] = time.time,
        heartbeat: float = HEARTBEAT,
    ) -> None:
        self.client = client
        self.heartbeat = heartbeat
        self.watches = Watches(client, settings.node_name)
        self.events = EventRecorder(client, "corepin-nri", host=settings.node_name)
        self.teller = Teller(self.events, lambda: None)
        self.reservation = NodeReservation(
            settings.reserved_cpus, settings.options, self.watches.node, topology, self.events
        )
        self._agent_settings = NodeSettings(
            node_name=settings.node_name,
            state_dir=settings.state_dir,
            policy=settings.policy,
            options=settings.options,
            reserved_cpus=settings.reserved_cpus,
            assignment_dir="",
        )
        self._topology = topology
        self._clock = clock
        self.publisher: Publisher | None = None
        self._pending: dict[str, Decided] = {}  # pod uid -> decided, the pod not seen yet
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(
        self, store: NodeStore, on_node_changed: Callable[[], None], timeout: float = 30.0
    ) -> None:
        """Watch the node's pods, the node and the bindings, and start publishing the state of
        `store`. EnvironmentProblem (exit 4) when the API does not answer."""
        self.client.check()
        watches = self.watches
        watches.open()
        self.publisher = Publisher(
            store,
            watches,
            PodRecords(watches, self._clock),
            AssignmentFiles("", self._topology, watches),
            TopologyPublisher(
                self._agent_settings,
                watches,
                self._topology,
                Promises(watches, self._topology),
                self._clock,
            ),
        )
        watches.pods.add_handlers(
            on_add=self._pod_seen, on_update=lambda old, new: self._pod_seen(new)
        )

        def node_updated(old: Mapping[str, Any], new: Mapping[str, Any]) -> None:
            if annotations_changed(old, new):  # (the reservation may have changed)
                on_node_changed()

        watches.nodes.add_handlers(on_update=node_updated)
        self.events.start()
        for informer in watches.informers:
            informer.start()
        deadline = time.monotonic() + timeout
        for informer in watches.informers:
            if not informer.wait_for_sync(max(0.1, deadline - time.monotonic())):
                self.stop()
                raise EnvironmentProblem(
                    f"the API did not answer the {informer.name} list within {timeout:g} s",
                    reason="api_sync_timeout",
                )
        self._spawn(self.publisher.run, "nri-publisher")
        self._spawn(self._beat, "nri-heartbeat")
        self.publisher.later(("topology",), None)

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        if self.publisher is not None:
            self.publisher.stop()
        for informer in self.watches.informers:
            informer.stop(timeout / 2)
        for thread in self._threads:
            thread.join(timeout / 2)
        self.events.stop(timeout / 2)

    def in_contact(self) -> bool:
        """Whether every watch heard from the API lately."""
        return all(i.in_contact() for i in self.watches.informers)

    # ------------------------------------------------------------------ from the plugin
    def decided(self, decided: Decided) -> None:
        """A pod decided: its Events and records (now, or when its pod shows up)."""
        plan = decided.plan
        if plan.deleting or not plan.containers:
            return
        pod = self.watches.pod(plan.name, plan.namespace)
        if pod is None or pod_uid(pod) != plan.uid:
            with self._lock:
                self._pending[plan.uid] = decided
            return
        self._publish(pod, decided)

    def forgotten(self, uid: str) -> None:
        """A pod is gone from the runtime: its records go (the sweep removes the rest)."""
        with self._lock:
            self._pending.pop(uid, None)
        self.teller.forget(uid)
        if self.publisher is not None:
            self.publisher.later(("forget", uid), uid)
            self.publisher.later(("topology",), None)

    # ------------------------------------------------------------------ internals
    def _publish(self, pod: Mapping[str, Any], decided: Decided) -> None:
        events = list(decided.events)
        self.teller.tell(pod, decided.plan, events)
        if self.publisher is not None:
            self.publisher.later(("pod", decided.plan.uid), PodWork(pod, decided.plan, events))
            self.publisher.later(("topology",), None)

    def _pod_seen(self, pod: Mapping[str, Any]) -> None:
        with self._lock:
            decided = self._pending.pop(pod_uid(pod), None)
        if decided is not None:
            self._publish(pod, decided)

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat):
            if self.publisher is not None:
                self.publisher.later(("topology",), None)
                self.publisher.later(("sweep",), None)

    def _spawn(self, target: Callable[[], None], name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)


__all__ = ["HEARTBEAT", "ApiReporter"]
