"""What the node agent tells about pods: Kubernetes Events on the pod, each message once.

A `CPUPolicyIgnored`, `CPUPinFailed` or `QoSClassIgnored` event is not told again while its
message stays the same (a pod synced again and again says it once); a container pinned at
last (`CPUPinned`, `CPUMoved`) clears its `CPUPinFailed`, so a later shortage is told again.
The failure of a whole pod's sync, quota or events (`failed`) is told once per message too.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from corepin.agent.node.qosclass import CLASS_IGNORED
from corepin.agent.node.sync import PodEvent
from corepin.kube.events import EventRecorder
from corepin.kube.podplan import PodPlan


class Teller:
    """The Events of the node's pods, and what was last told (per pod uid, container, reason)."""

    def __init__(self, events: EventRecorder, on_pin_failed: Callable[[], None]) -> None:
        self.events = events
        self.on_pin_failed = on_pin_failed
        self._told: dict[tuple[str, str, str], str] = {}  # (uid, container, reason) -> message

    def tell(self, pod: Mapping[str, Any], plan: PodPlan, events: list[PodEvent]) -> None:
        for event in events:
            key = (plan.uid, event.container, event.reason)
            if (
                event.reason in ("CPUPolicyIgnored", "CPUPinFailed", CLASS_IGNORED)
                and self._told.get(key) == event.message
            ):
                continue
            self._told[key] = event.message
            self.events.event(pod, event.type, event.reason, event.message)
            if event.reason == "CPUPinFailed":
                self.on_pin_failed()
        pinned = {e.container for e in events if e.reason in ("CPUPinned", "CPUMoved")}
        for name in pinned:
            self._told.pop((plan.uid, name, "CPUPinFailed"), None)

    def failed(self, pod: Mapping[str, Any], uid: str, stage: str, message: str) -> None:
        """A Warning `CPUPinFailed` on the pod: its `stage` failed (unless just told so)."""
        key = (uid, "", f"failed-{stage}")
        if self._told.get(key) == message:
            return
        self._told[key] = message
        self.events.event(pod, "Warning", "CPUPinFailed", message)

    def waits_for_cpus(self, uid: str, container: str) -> bool:
        """Whether the container was told that its CPUs are not available."""
        return (uid, container, "CPUPinFailed") in self._told

    def forget(self, uid: str) -> None:
        """A pod that is gone."""
        for told in [k for k in self._told if k[0] == uid]:
            self._told.pop(told, None)


__all__ = ["Teller"]
