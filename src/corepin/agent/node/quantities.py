"""CPU quantities the node agent refuses to act on: negative ones, and more than
`MAX_CPU_QUANTITY` CPUs - far above any machine (the kernel counts at most 8192 CPUs) and below
what a CFS quota can hold. A container asking such a quantity is told so (a Warning Event) and
left on the shared pool with the CFS quota the kubelet set; the other containers go on.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from corepin.core.errors import CorepinError
from corepin.core.quantity import parse_quantity
from corepin.core.record import replace
from corepin.kube.models import PodView
from corepin.kube.models.fields import loose_list
from corepin.kube.podplan import PodPlan

#: the largest CPU quantity (limit or request) the agent acts on
MAX_CPU_QUANTITY: Final = 1 << 20


def absurd_cpu(raw: object) -> bool:
    """Whether a CPU quantity is beyond anything a node can give: negative, or more than
    `MAX_CPU_QUANTITY` CPUs (unparseable ones are the eligibility check's business)."""
    try:
        value = parse_quantity(raw)
    except CorepinError:
        return False
    return value < 0 or value > MAX_CPU_QUANTITY


def _cpu_quantities(pod: Mapping[str, Any]) -> dict[str, list[tuple[str, object]]]:
    """container name -> [(where, raw CPU quantity)] from its spec and its applied resources."""
    out: dict[str, list[tuple[str, object]]] = {}
    view = PodView(pod)
    # every row, in order (`PodView.container_statuses` keeps one per name)
    rows = [*view.containers, *loose_list(view.status.get("containerStatuses"))]
    for row in rows:
        if not isinstance(row, Mapping) or not isinstance(row.get("name"), str):
            continue
        resources = row.get("resources") or {}
        if not isinstance(resources, Mapping):
            continue
        for kind in ("limits", "requests"):
            values = resources.get(kind) or {}
            if isinstance(values, Mapping) and "cpu" in values:
                out.setdefault(row["name"], []).append((f"{kind[:-1]}", values["cpu"]))
    return out


def refuse_absurd(pod: Mapping[str, Any], plan: PodPlan) -> PodPlan:
    """The plan with every container whose CPU limit or request is absurd (`absurd_cpu`) on
    the shared pool, its problem saying which quantity and why (a Warning Event)."""
    bad: dict[str, str] = {}
    for name, quantities in _cpu_quantities(pod).items():
        for where, raw in quantities:
            if name not in bad and absurd_cpu(raw):
                bad[name] = (
                    f"container {name!r}: CPU {where} {raw!r} is out of range (a CPU quantity "
                    f"must lie between 0 and {MAX_CPU_QUANTITY} CPUs); it runs on the shared "
                    "pool and its CFS quota is left as the kubelet set it"
                )
    if not bad:
        return plan
    containers = tuple(
        replace(c, policy="none", count=0, cpus=None, problem=bad[c.name]) if c.name in bad else c
        for c in plan.containers
    )
    return replace(plan, containers=containers)


__all__ = ["MAX_CPU_QUANTITY", "absurd_cpu", "refuse_absurd"]
