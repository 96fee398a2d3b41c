"""Exclusiveness levels on the wire.

corepin holds levels in its own spelling (`cpu|core|l3|numa|socket`, as `corepin.allocation`
names them) and writes the CRD spelling (`CPU|Core|L3|NUMA|Socket`) where the CRD asks for it;
annotations and `PodCPUBinding.spec.exclusivenessLevel` accept either, in any case, and
actimanager's `None`, which means `cpu`.
"""

from __future__ import annotations

from typing import Final

from corepin.allocation.types import LEVELS
from corepin.kube.models.fields import FieldError

#: Exclusiveness levels in the CRD spelling (actimanager's, plus L3); `None` means `cpu`.
CRD_LEVELS: Final = ("None", "CPU", "Core", "L3", "NUMA", "Socket")
#: Every spelling `spec.exclusivenessLevel` accepts: the CRD's and the annotation/CLI one.
ACCEPTED_CRD_LEVELS: Final = CRD_LEVELS + LEVELS

_TO_CRD_LEVEL: Final = {
    "cpu": "CPU",
    "core": "Core",
    "l3": "L3",
    "numa": "NUMA",
    "socket": "Socket",
}


def crd_level(level: str) -> str:
    """corepin's level spelling -> the CRD's (`cpu` -> `CPU`, ...); any accepted spelling in."""
    return _TO_CRD_LEVEL[corepin_level(level)]


def corepin_level(text: object, path: str = "exclusiveness level") -> str:
    """Any spelling of an exclusiveness level, in any case (`None`, `CPU`, `core`, `NUMA`...)
    -> corepin's (`cpu|core|l3|numa|socket`); `None` means `cpu`."""
    if not isinstance(text, str):
        raise FieldError(path, text, "must be a string")
    low = text.lower()
    if low == "none":
        return "cpu"
    if low not in LEVELS:
        raise FieldError(path, text, f"must be one of {', '.join(CRD_LEVELS)} (any case)")
    return low


def check_level(level: str, path: str) -> None:
    """Refuse a level that is not in corepin's spelling."""
    if level not in LEVELS:
        raise FieldError(path, level, f"must be one of {', '.join(LEVELS)}")
