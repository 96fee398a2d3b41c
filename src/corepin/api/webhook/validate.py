"""The validating webhook's decision on a pod (pure).

Validate (CREATE and UPDATE) refuses, with `status.code` 403 and a message naming the
container or annotation and the rule:
- malformed corepin or alias annotations (`corepin.io/cpu-policy[.<container>]`,
  `corepin.io/exclusiveness-level`, `corepin.io/workload-type`, `corepin.io/cpus`, Crane's
  `qos.gocrane.io/cpu-manager`, actimanager's `cslab.ece.ntua.gr/*`), as
  `corepin.kube.models` parses them;
- `exclusive` or `share` containers that are not eligible (CPU limit a whole number >= 1 equal
  to the request);
- requests no node of the cluster could ever hold (`capacity.ClusterCapacity.check`), when the
  webhook knows the cluster's NodeCPUTopologies.
An UPDATE is judged only when it changes the request (those annotations, or the workload-type
labels): the agent's own `corepin.io/cpus` write, finalizer removal or a label edit of a pod
admitted while the webhook was down must never be refused. Warnings (not refusals) name a
per-container annotation for a container the pod does not have and unknown `corepin.io/` keys.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from corepin.api.webhook.capacity import ClusterCapacity, Hold
from corepin.api.webhook.review import Outcome
from corepin.kube.models import (
    ACTIMANAGER_LEVEL,
    ACTIMANAGER_WORKLOAD,
    ANN_CPU_POLICY,
    ANN_CPU_POLICY_PREFIX,
    ANN_CPUS,
    ANN_LEVEL,
    ANN_WORKLOAD,
    CRANE_CPU_MANAGER,
    FieldError,
    PodCPUPolicy,
    PodView,
    container_eligibility,
    parse_cpus_annotation,
    parse_pod_annotations,
)

#: The most problems listed in one refusal (the rest are counted).
MAX_PROBLEMS: Final = 5

#: Annotations whose change is a change of what the pod asks corepin for.
_REQUEST_ANNOTATIONS: Final = (
    ANN_CPU_POLICY,
    ANN_LEVEL,
    ANN_WORKLOAD,
    CRANE_CPU_MANAGER,
    ACTIMANAGER_LEVEL,
    ACTIMANAGER_WORKLOAD,
)
_REQUEST_LABELS: Final = (ANN_WORKLOAD, ACTIMANAGER_WORKLOAD)
_KNOWN_COREPIN: Final = (ANN_CPU_POLICY, ANN_LEVEL, ANN_WORKLOAD, ANN_CPUS)


def _request_keys(pod: PodView) -> dict[str, object]:
    """What the pod asks corepin for: its request annotations and labels."""
    keys: dict[str, object] = {}
    labels = pod.labels
    for k, v in pod.annotations.items():
        if k in _REQUEST_ANNOTATIONS or k.startswith(ANN_CPU_POLICY_PREFIX):
            keys[f"annotation {k}"] = v
    for k in _REQUEST_LABELS:
        if k in labels:
            keys[f"label {k}"] = labels[k]
    return keys


def _policy_source(name: str, wanted: PodCPUPolicy, annotations: Mapping[str, str]) -> str:
    if name in wanted.containers:
        return ANN_CPU_POLICY_PREFIX + name
    return ANN_CPU_POLICY if ANN_CPU_POLICY in annotations else CRANE_CPU_MANAGER


def validate_pod(request: Mapping[str, Any], capacity: ClusterCapacity | None) -> Outcome:
    """The answer to a CREATE or UPDATE of a pod (see the module docstring); FieldError when
    the pod cannot be read."""
    pod = PodView.checked(request.get("object"), "request.object")
    operation = request.get("operation")
    if operation == "UPDATE":
        try:
            old: PodView | None = PodView.checked(request.get("oldObject"), "request.oldObject")
        except FieldError:
            old = None
        if old is not None and _request_keys(old) == _request_keys(pod):
            return Outcome(True)  # the update does not touch what the pod asks corepin for
    annotations, containers = pod.annotations, pod.containers
    try:
        wanted = parse_pod_annotations(annotations, pod.labels)
    except FieldError as exc:
        return Outcome(False, exc.message)  # names the key, the value and what is allowed
    problems: list[str] = []
    if operation == "CREATE" and ANN_CPUS in annotations:
        try:
            parse_cpus_annotation(annotations[ANN_CPUS])
        except FieldError as exc:
            problems.append(f"{exc.message} (the agent writes this one; leave it out)")
    warnings = _warnings(pod, containers, annotations, wanted, operation == "CREATE")
    holds: list[Hold] = []
    for i, c in enumerate(containers):
        name = c["name"]
        policy = wanted.policy_for(name)
        if policy == "none":
            continue
        try:
            eligible = container_eligibility(c, f"spec.containers[{i}]")
        except FieldError as exc:
            problems.append(f"container {name!r}: {exc.message}")
            continue
        if not eligible.eligible:
            source = _policy_source(name, wanted, annotations)
            problems.append(
                f"container {name!r}: {source} asks for {policy} CPUs, but {eligible.reason}; "
                f"{policy} CPUs need a CPU limit that is a whole number >= 1 and a CPU request "
                f"equal to it (set both, or annotate {ANN_CPU_POLICY_PREFIX}{name}: none)"
            )
            continue
        holds.append(Hold(name, policy, eligible.cpus))
    if not problems and capacity is not None:
        verdict = capacity.check(holds, wanted.level, wanted.workload)
        if verdict is not None:
            problems.append(verdict)
    if problems:
        shown = problems[:MAX_PROBLEMS]
        more = len(problems) - len(shown)
        message = "; ".join(shown) + (f"; and {more} more" if more else "")
        return Outcome(False, message, warnings=tuple(warnings))
    return Outcome(True, warnings=tuple(warnings))


def _warnings(
    pod: PodView,
    containers: tuple[Mapping[str, Any], ...],
    annotations: Mapping[str, str],
    wanted: PodCPUPolicy,
    creating: bool,
) -> list[str]:
    names = {c["name"] for c in containers}
    inits = {c["name"] for c in pod.checked_containers("initContainers")}
    out: list[str] = []
    for name in wanted.containers:
        key = ANN_CPU_POLICY_PREFIX + name
        if name in inits and name not in names:
            out.append(f"{key}: init containers always run on the shared pool")
        elif name not in names:
            listed = ", ".join(sorted(names)) or "none"
            out.append(f"{key} names no container of this pod (containers: {listed})")
    if creating:
        for key in annotations:
            if (
                key.startswith("corepin.io/")
                and key not in _KNOWN_COREPIN
                and not key.startswith(ANN_CPU_POLICY_PREFIX)
            ):
                out.append(
                    f"annotation {key} is not one corepin reads (it reads "
                    f"{', '.join(_KNOWN_COREPIN[:3])} and {ANN_CPU_POLICY_PREFIX}<container>)"
                )
    return out
