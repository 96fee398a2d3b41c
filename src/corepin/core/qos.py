"""QoS classes: what a workload is to the node's QoS loop (one vocabulary for the state, the
Kubernetes models and the QoS loop; the policy is in `corepin.allocation.qos`).

- `LSE` latency-sensitive, exclusive: CPUs of its own (an exclusive or mixed assignment);
- `LSR` latency-sensitive, reserved: CPUs of its own that stay in the shared pool (`share`);
- `LS` latency-sensitive on the shared pool (Kubernetes Guaranteed or Burstable);
- `BE` best effort: the shared pool, squeezed when LS work needs it (Kubernetes BestEffort);
- `SYSTEM`: node daemons.

A class given explicitly (an annotation, `corepin run --qos-class`) wins; Koordinator's names
(`LSE`, `LSR`, `LS`, `BE`, `SYSTEM`, the same words) are read as aliases. Otherwise the class is
derived from the assignment's kind and the Kubernetes QoS class.
"""

from __future__ import annotations

from typing import Final

from corepin.core.errors import InputError

__all__ = [
    "CLASSES",
    "KOORDINATOR_CLASSES",
    "RESCTRL_GROUP_PREFIX",
    "check_class",
    "class_of",
    "resctrl_group",
]

CLASSES: Final = ("LSE", "LSR", "LS", "BE", "SYSTEM")
#: Koordinator's `koordinator.sh/qosClass` values, which mean the same as ours
KOORDINATOR_CLASSES: Final = frozenset(CLASSES)
#: the resctrl groups corepin makes are `corepin-<class>` (lower case); others are not ours
RESCTRL_GROUP_PREFIX: Final = "corepin-"


def check_class(value: object, where: str = "QoS class") -> str:
    """`value` as a class name (case-insensitive), else InputError naming it and `where`."""
    if isinstance(value, str):
        name = value.strip().upper()
        if name in CLASSES:
            return name
    raise InputError(
        f"{where}: {value!r} is not a QoS class (one of {', '.join(CLASSES)})",
        reason="bad_qos_class",
    )


def class_of(kind: str, kube_qos: str | None = None, given: str | None = None) -> str:
    """The class of a workload of assignment `kind` (exclusive, mixed, share, shared) with
    Kubernetes QoS `kube_qos` (guaranteed, burstable, besteffort; None in host mode) and an
    explicit class `given` (validated; it wins)."""
    if given:
        return check_class(given)
    if kind in ("exclusive", "mixed"):
        return "LSE"
    if kind == "share":
        return "LSR"
    if kube_qos is not None and kube_qos.lower() == "besteffort":
        return "BE"
    return "LS"


def resctrl_group(qos_class: str) -> str:
    """The name of `qos_class`'s resctrl group (validated): `corepin-<class>`, lower case."""
    return RESCTRL_GROUP_PREFIX + check_class(qos_class).lower()
