"""The node checks a scheduler makes besides CPUs (pure): a cordoned node, taints the pod does
not tolerate (`NoSchedule`, `NoExecute`), a `nodeSelector` the node's labels do not match.
Each refusal is a sentence naming the node and what to change; `failure_message` folds the
refusals of every node into one message, as kube-scheduler's `FailedScheduling` does."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from corepin.kube.models import ObjectView, PodView
from corepin.kube.models.fields import loose_list

UNSCHEDULABLE_TAINT: Final = "node.kubernetes.io/unschedulable"
#: longest event / condition message (kube-scheduler's are short; the API takes more)
MESSAGE_LIMIT: Final = 1024
#: nodes named one by one in a failure message before the rest are counted
NAMED: Final = 6

#: short words per machine-readable reason, for the counted part of a failure message
SUMMARY: Final = {
    "no_topology": "have no corepin agent (no NodeCPUTopology)",
    "not_ready": "have a corepin agent that is not ready",
    "stale": "have a corepin agent that stopped reporting",
    "unusable": "have an unreadable NodeCPUTopology",
    "no_fit": "cannot give the CPUs the pod asks for",
    "cordoned": "are cordoned",
    "taint": "have taints the pod does not tolerate",
    "selector": "do not match the pod's nodeSelector",
}


def _tolerates(tolerations: list[Any], taint: Mapping[str, Any]) -> bool:
    key, value, effect = taint.get("key"), taint.get("value") or "", taint.get("effect")
    for t in tolerations:
        if not isinstance(t, Mapping):
            continue
        if t.get("effect") and t.get("effect") != effect:
            continue
        operator = t.get("operator") or "Equal"
        if operator == "Exists":
            if not t.get("key") or t.get("key") == key:
                return True
        elif t.get("key") == key and (t.get("value") or "") == value:
            return True
    return False


def node_refusal(node: Mapping[str, Any], pod: Mapping[str, Any]) -> tuple[str, str] | None:
    """(reason code, sentence) when the pod may not go to the node; None when it may."""
    node_view = ObjectView(node)
    name, spec = node_view.name, node_view.spec
    pod_spec = PodView(pod).spec
    tolerations = loose_list(pod_spec.get("tolerations"))
    if spec.get("unschedulable") and not _tolerates(
        tolerations, {"key": UNSCHEDULABLE_TAINT, "effect": "NoSchedule"}
    ):
        return "cordoned", f"node {name}: it is cordoned (spec.unschedulable); uncordon it"
    for taint in loose_list(spec.get("taints")):
        if not isinstance(taint, Mapping):
            continue
        if taint.get("effect") not in ("NoSchedule", "NoExecute"):
            continue
        if not _tolerates(tolerations, taint):
            value = f"={taint['value']}" if taint.get("value") else ""
            return (
                "taint",
                f"node {name}: it has the taint {taint.get('key')}{value}:{taint.get('effect')}, "
                "which the pod does not tolerate; add a toleration or remove the taint",
            )
    selector = pod_spec.get("nodeSelector") or {}
    if isinstance(selector, Mapping) and selector:
        labels = node_view.labels
        missing = sorted(k for k, v in selector.items() if labels.get(k) != v)
        if missing:
            wanted = ", ".join(f"{k}={selector[k]}" for k in missing)
            return (
                "selector",
                f"node {name}: its labels do not match the pod's nodeSelector ({wanted})",
            )
    return None


def failure_message(total: int, failures: Mapping[str, tuple[str, str]]) -> str:
    """`0/N nodes are available: 2 have ..., 1 ... . node-a: why; node-b: why; ...` - counted
    by reason as kube-scheduler does, then why for each node (the first few by name)."""
    if total == 0:
        return "0/0 nodes are available: the cluster has no nodes"
    counts: dict[str, int] = {}
    for code, _ in failures.values():
        counts[code] = counts.get(code, 0) + 1
    counted = ", ".join(
        f"{n} node(s) {SUMMARY.get(code, code)}" for code, n in sorted(counts.items())
    )
    names = sorted(failures)
    detail = "; ".join(failures[n][1].removeprefix("node ") for n in names[:NAMED])
    more = f"; and {len(names) - NAMED} more node(s)" if len(names) > NAMED else ""
    text = f"0/{total} nodes are available: {counted}. {detail}{more}."
    if len(text) > MESSAGE_LIMIT:
        text = text[: MESSAGE_LIMIT - 3] + "..."
    return text


__all__ = ["failure_message", "node_refusal"]
