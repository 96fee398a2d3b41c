"""The node QoS policy in force on this node, and where it comes from.

Sources, most important first:
1. the ConfigMap `corepin-qos` in the agent's namespace, key `qos.yaml` (watched by an informer,
   applied live): while it exists it wins;
2. the file `--qos-config` (read at start-up, and again whenever its modification time or size
   changes: the QoS loop asks `check_file` every period);
3. the default policy (`corepin.allocation.qos.QosPolicy()`).

A policy that does not parse is refused by field (`parse_policy_text` names it): a Warning Event
`QoSPolicyRejected` (on the ConfigMap for the ConfigMap's, on the Node for the file's) and a log
line say so, and the policy in force stays. Every change of the policy in force is a Normal
Event `QoSPolicyApplied` on the Node, a log line and a count (`on_change`). A bad file at
start-up refuses the start (InputError, exit 2): nothing was in force yet to keep.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any, Final

from corepin.agent.node.settings import QOS_CONFIGMAP, QOS_CONFIGMAP_KEY
from corepin.agent.qos_file import PolicyFile, read_policy_file
from corepin.allocation.qos import QosPolicy, parse_policy_text
from corepin.core.errors import InputError
from corepin.kube.events import EventRecorder
from corepin.kube.models import ObjectView

log = logging.getLogger("corepin.agent.node")

APPLIED: Final = "QoSPolicyApplied"
REJECTED: Final = "QoSPolicyRejected"


class QosPolicySource:
    """The policy in force (`policy`), from the ConfigMap, the file or the default."""

    def __init__(
        self,
        path: str | None,
        namespace: str,
        events: EventRecorder,
        node: Callable[[], Mapping[str, Any] | None],
        on_change: Callable[[QosPolicy], None] | None = None,
    ) -> None:
        self.path = path
        self.namespace = namespace
        self.events = events
        self.node = node
        self.on_change = on_change
        self._lock = threading.Lock()
        self._file_policy = QosPolicy()
        self._file = PolicyFile(path) if path else None
        self._map_policy: QosPolicy | None = None
        self._map_text: str | None = None
        self._policy = QosPolicy()
        self._origin = "the default policy"
        if self._file is not None:
            self._file_policy = self._file.read()
            self._policy, self._origin = self._file_policy, self._file.path
        log.info("event=qos_policy source=%r policy=%s", self._origin, self._policy.to_json())

    @property
    def policy(self) -> QosPolicy:
        with self._lock:
            return self._policy

    @property
    def origin(self) -> str:
        """Where the policy in force comes from (the ConfigMap, the file, the default)."""
        with self._lock:
            return self._origin

    @property
    def map_name(self) -> str:
        return f"ConfigMap {self.namespace}/{QOS_CONFIGMAP}"

    # ------------------------------------------------------------------ the file
    def check_file(self) -> None:
        """Read the file again when it changed (a bad one is refused, the policy stays)."""
        if self._file is None or not self._file.changed():
            return
        try:
            policy = read_policy_file(self._file.path)
        except InputError as err:
            self._reject(err.message, self.node())
            return
        with self._lock:
            self._file_policy = policy
            if self._map_policy is not None:
                log.info("event=qos_policy_file_read path=%s in_force=%r", self.path, self._origin)
                return
        self._apply(policy, self._file.path)

    # ------------------------------------------------------------------ the ConfigMap
    def map_changed(self, obj: Mapping[str, Any]) -> None:
        """The ConfigMap was added or changed (informer handler)."""
        data = ObjectView(obj).raw.get("data")
        text = data.get(QOS_CONFIGMAP_KEY) if isinstance(data, Mapping) else None
        with self._lock:
            if text is not None and text == self._map_text:
                return  # (a relist, or another key changed)
        if not isinstance(text, str):
            self._reject(
                f"{self.map_name}: data.{QOS_CONFIGMAP_KEY}: missing (the policy is the text "
                f"of that key, YAML or JSON)",
                obj,
            )
            return
        try:
            policy = parse_policy_text(text, self.map_name)
        except InputError as err:
            self._reject(err.message, obj)
            return
        with self._lock:
            self._map_policy, self._map_text = policy, text
        self._apply(policy, self.map_name)

    def map_deleted(self, obj: Mapping[str, Any]) -> None:
        """The ConfigMap is gone: the file's policy (or the default) again."""
        with self._lock:
            had = self._map_policy is not None
            self._map_policy, self._map_text = None, None
            policy = self._file_policy
        if had or self.origin == self.map_name:
            self._apply(policy, self.path or "the default policy", why=f"{self.map_name} deleted")

    # ------------------------------------------------------------------ both
    def _apply(self, policy: QosPolicy, origin: str, *, why: str = "") -> None:
        with self._lock:
            same = policy == self._policy
            self._policy, self._origin = policy, origin
        if same:
            log.info("event=qos_policy_unchanged source=%r", origin)
            return
        said = f"{why}: " if why else ""
        log.info("event=qos_policy_applied source=%r policy=%s", origin, policy.to_json())
        node = self.node()
        if node is not None:
            self.events.event(node, "Normal", APPLIED, f"{said}node QoS policy of {origin} applied")
        if self.on_change is not None:
            self.on_change(policy)

    def _reject(self, message: str, involved: Mapping[str, Any] | None) -> None:
        kept = self.origin
        log.warning("event=qos_policy_rejected error=%s kept=%r", message, kept)
        if involved is not None:
            self.events.event(
                involved, "Warning", REJECTED, f"{message}; the policy of {kept} stays in force"
            )


__all__ = ["APPLIED", "REJECTED", "QosPolicySource"]
