"""The QoS class of each container of the node (LSE, LSR, LS, BE, SYSTEM), and what the QoS
period needs to know of it.

A pod names its class with `corepin.io/qos-class` (Koordinator's `koordinator.sh/qosClass`, a
label or an annotation, is read as an alias); every app container of the pod has it. Without
one, a container's class is derived from its assignment (`corepin.allocation.qos.class_of`:
exclusive -> LSE, share -> LSR, else LS, BE for Kubernetes BestEffort pods). A value that is no
class is never a reason to refuse a pod: the derived class is used, and the pod is told with a
Warning Event `QoSClassIgnored` that names the value (and the agent logs it).

`QosClasses` is the table the worker keeps up to date (one pod at a time, when it synced the
pod) and the publisher and the QoS period read: the class of each assignment, and the CFS quota
the kubelet gives a container with a CPU limit (the base the CPU burst works from).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any

from corepin.agent.node.sync import PodEvent
from corepin.allocation.qos import CLASSES, check_class
from corepin.core.errors import InputError
from corepin.core.record import record
from corepin.enforcement.cgroups import CpuQuota
from corepin.kube.models import FieldError, ObjectView, qos_class_request
from corepin.state.model import Assignment, HostState

log = logging.getLogger("corepin.agent.node")

#: the reason of the Warning Event told for a QoS class that is no class
CLASS_IGNORED = "QoSClassIgnored"


@record
class ClassRequest:
    """What a pod says of its class: the key it used and the raw value (both "" when it says
    nothing), the class when the value is one (else None), and why it was ignored."""

    key: str = ""
    value: str = ""
    qos_class: str | None = None
    problem: str = ""


def class_request(pod: Mapping[str, Any]) -> ClassRequest:
    """The QoS class a pod names (see the module docstring); never raises."""
    view = ObjectView(pod)
    try:
        found = qos_class_request(view.annotations, view.labels)
    except FieldError:  # (the views keep strings only: not reached)
        return ClassRequest()
    if found is None:
        return ClassRequest()
    key, value = found
    try:
        return ClassRequest(key, value, check_class(value, f"annotation {key}"))
    except InputError as err:
        return ClassRequest(key, value, None, err.message)


def class_events(request: ClassRequest) -> list[PodEvent]:
    """A Warning for a class that is no class (the derived ones are used)."""
    if not request.problem:
        return []
    message = (
        f"{request.problem}; every container of the pod gets the class derived from its CPU "
        f"policy and Kubernetes QoS class instead (valid: {', '.join(CLASSES)})"
    )
    return [PodEvent("Warning", CLASS_IGNORED, message)]


def assignment_class(a: Assignment, given: str | None = None) -> str:
    """The class of assignment `a`: `given` when it is one, else its own (`Assignment.qos_class`:
    the one recorded, else derived from its kind and its container's Kubernetes QoS class)."""
    return check_class(given) if given else a.qos_class


class QosClasses:
    """Class and base CFS quota per assignment id (the worker writes, others read)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._classes: dict[str, str] = {}
        self._quotas: dict[str, CpuQuota] = {}
        self._given: dict[str, str | None] = {}  # pod uid -> the valid class it names

    def update(
        self,
        state: HostState,
        uid: str,
        request: ClassRequest,
        limits: Mapping[str, float],
    ) -> bool:
        """The classes of the pod's assignments in `state` (its request, its containers' CPU
        `limits` by name); True when a class changed."""
        classes: dict[str, str] = {}
        quotas: dict[str, CpuQuota] = {}
        for a in state.pod_assignments(uid):
            owner = a.container
            if owner is None:
                continue
            classes[a.id] = assignment_class(a, request.qos_class)
            limit = limits.get(owner.container)
            if limit is not None and not a.exclusive:
                quotas[a.id] = CpuQuota.for_cpus(limit)
        prefix = f"pod/{uid}/"
        with self._lock:
            before = {k: v for k, v in self._classes.items() if k.startswith(prefix)}
            for gone in before.keys() - classes.keys():
                self._classes.pop(gone, None)
                self._quotas.pop(gone, None)
            self._classes.update(classes)
            for ident in classes:
                if ident in quotas:
                    self._quotas[ident] = quotas[ident]
                else:
                    self._quotas.pop(ident, None)
            self._given[uid] = request.qos_class
        for ident, name in sorted(classes.items()):
            if before.get(ident) != name:
                log.info("event=qos_class id=%s class=%s was=%s", ident, name, before.get(ident))
        return before != classes

    def forget(self, uid: str) -> None:
        """A pod that is gone."""
        prefix = f"pod/{uid}/"
        with self._lock:
            for ident in [k for k in self._classes if k.startswith(prefix)]:
                self._classes.pop(ident, None)
                self._quotas.pop(ident, None)
            self._given.pop(uid, None)

    def of(self, a: Assignment) -> str:
        """The class of `a` (derived when its pod was not synced yet)."""
        with self._lock:
            found = self._classes.get(a.id)
            given = self._given.get(a.container.pod_uid) if a.container is not None else None
        return found if found is not None else assignment_class(a, given)

    def base_quota(self, ident: str) -> CpuQuota | None:
        """The kubelet's CFS quota of a container with a CPU limit that the agent leaves (not
        exclusive); None otherwise."""
        with self._lock:
            return self._quotas.get(ident)


__all__ = [
    "CLASS_IGNORED",
    "ClassRequest",
    "QosClasses",
    "assignment_class",
    "class_events",
    "class_request",
]
