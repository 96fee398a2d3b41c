"""The pod and node annotations corepin reads and writes, in corepin's keys and the aliases it
reads for migration (Crane's `qos.gocrane.io/cpu-manager`, actimanager's
`cslab.ece.ntua.gr/*`; a corepin.io key wins over its alias).

- `parse_pod_annotations`: what a pod asks of corepin (`PodCPUPolicy`: policy, per-container
  policies, exclusiveness level, workload family, device alignment);
- `aliases_to_copy`: the corepin.io annotations the webhook adds for the aliases a pod carries;
- `parse_cpus_annotation` / `format_cpus_annotation`: `corepin.io/cpus`, the CPUs the node
  agent gave each container;
- `parse_node_reservation`: a node's reserved CPUs (`corepin.io/reservation`, else
  Koordinator's `node.koordinator.sh/reservation`);
- `qos_class_request`: the QoS class a pod names (`corepin.io/qos-class`, else Koordinator's
  `koordinator.sh/qosClass`, a label in Koordinator, read as a label or an annotation).

A malformed value raises `FieldError` naming the annotation key and the value.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from corepin.allocation.pools import (
    KOORDINATOR_RESERVATION,
    Reservation,
    parse_koordinator_reservation,
)
from corepin.allocation.types import LEVELS, WORKLOADS
from corepin.core.cpuset import CPUSet
from corepin.core.errors import CPUSetParseError, InputError
from corepin.kube.models.fields import FieldError, one_of, readonly, set_frozen, strings
from corepin.kube.models.levels import check_level, corepin_level

ANN_CPU_POLICY: Final = "corepin.io/cpu-policy"
ANN_CPU_POLICY_PREFIX: Final = "corepin.io/cpu-policy."
ANN_LEVEL: Final = "corepin.io/exclusiveness-level"
ANN_WORKLOAD: Final = "corepin.io/workload-type"
ANN_CPUS: Final = "corepin.io/cpus"
ANN_RESERVATION: Final = "corepin.io/reservation"
#: How an exclusive container's CPUs follow the NUMA nodes of the devices the kubelet gave it
#: (`preferred`, the default: tried first; `required`: only there; `none`: not at all).
ANN_DEVICE_ALIGNMENT: Final = "corepin.io/device-alignment"
DEVICE_ALIGNMENTS: Final = ("preferred", "required", "none")
#: The QoS class of every container of the pod (LSE, LSR, LS, BE, SYSTEM); when absent the
#: class is derived from the CPU policy and the Kubernetes QoS class
#: (`corepin.allocation.qos.class_of`).
ANN_QOS_CLASS: Final = "corepin.io/qos-class"
#: Koordinator's QoS class key (a pod label there; read as a label, then as an annotation).
KOORDINATOR_QOS_CLASS: Final = "koordinator.sh/qosClass"
#: Aliases read for migration; a corepin.io key wins over its alias.
CRANE_CPU_MANAGER: Final = "qos.gocrane.io/cpu-manager"
ACTIMANAGER_LEVEL: Final = "cslab.ece.ntua.gr/exclusiveness-level"
ACTIMANAGER_WORKLOAD: Final = "cslab.ece.ntua.gr/workload-type"
#: `corepin.io/cpu-policy` values.
CPU_POLICIES: Final = ("none", "share", "exclusive")

_WORKLOAD_KEYS: Final = {w.replace("-", ""): w for w in WORKLOADS}


def _annotation_error(key: str, value: object, problem: str) -> FieldError:
    return FieldError(f"annotation {key}", value, problem, reason="bad_annotation")


@dataclass(frozen=True, slots=True)
class PodCPUPolicy:
    """What a pod's annotations (and labels) ask of corepin.

    `explicit` is true when the pod carries any corepin or alias key: the webhook patches
    only such pods."""

    policy: str = "none"
    containers: Mapping[str, str] = field(default_factory=dict)
    level: str = "cpu"
    workload: str | None = None
    explicit: bool = False
    device_alignment: str = "preferred"

    def __post_init__(self) -> None:
        one_of(self.policy, ANN_CPU_POLICY, CPU_POLICIES)
        for name, value in self.containers.items():
            one_of(value, ANN_CPU_POLICY_PREFIX + name, CPU_POLICIES)
        check_level(self.level, ANN_LEVEL)
        if self.workload is not None:
            one_of(self.workload, ANN_WORKLOAD, WORKLOADS)
        one_of(self.device_alignment, ANN_DEVICE_ALIGNMENT, DEVICE_ALIGNMENTS)
        set_frozen(self, "containers", readonly(dict(sorted(self.containers.items()))))

    def policy_for(self, container: str) -> str:
        """The container's own policy, else the pod's."""
        return self.containers.get(container, self.policy)


def _strings(data: object, what: str) -> Mapping[str, str]:
    return strings(data, f"metadata.{what}", problem="must be an object of strings")


def _cpu_policy(key: str, value: str) -> str:
    if value not in CPU_POLICIES:
        raise _annotation_error(key, value, f"must be one of {', '.join(CPU_POLICIES)}")
    return value


def parse_level_annotation(key: str, value: str) -> str:
    """An exclusiveness level annotation value (any case; `None` = `cpu`) -> corepin spelling."""
    try:
        return corepin_level(value)
    except FieldError:
        raise _annotation_error(
            key, value, f"must be one of {', '.join(LEVELS)} or None (any case)"
        ) from None


def parse_workload(key: str, value: str) -> str:
    """A workload family: corepin's `memory-bound` or actimanager's `MemoryBound`, any case."""
    found = _WORKLOAD_KEYS.get(value.lower().replace("-", "").replace("_", ""))
    if found is None:
        raise _annotation_error(
            key,
            value,
            f"must be one of {', '.join(WORKLOADS)} (or MemoryBound, CPUBound, IOBound, "
            "BestEffort)",
        )
    return found


def _first(sources: Sequence[tuple[str, Mapping[str, str]]]) -> tuple[str, str] | None:
    for key, mapping in sources:
        if key in mapping:
            return key, mapping[key]
    return None


def parse_pod_annotations(
    annotations: Mapping[str, str] | None, labels: Mapping[str, str] | None = None
) -> PodCPUPolicy:
    """The pod's corepin request from its annotations and labels.

    Keys, most important first: `corepin.io/cpu-policy` then Crane's
    `qos.gocrane.io/cpu-manager`; `corepin.io/cpu-policy.<container>` per container;
    `corepin.io/exclusiveness-level` then actimanager's `cslab.ece.ntua.gr/exclusiveness-level`;
    `corepin.io/workload-type` (annotation, then label) then actimanager's
    `cslab.ece.ntua.gr/workload-type` (label, then annotation); `corepin.io/device-alignment`
    (default `preferred`). A malformed value raises
    `FieldError` naming the key and the value, even when a higher key hides it (the webhook
    refuses every malformed corepin or alias annotation)."""
    ann = _strings(annotations, "annotations")
    lab = _strings(labels, "labels")
    explicit = False
    policies: dict[str, str] = {}
    for key in (ANN_CPU_POLICY, CRANE_CPU_MANAGER):
        if key in ann:
            policies[key] = _cpu_policy(key, ann[key])
            explicit = True
    policy = policies.get(ANN_CPU_POLICY, policies.get(CRANE_CPU_MANAGER, "none"))
    containers: dict[str, str] = {}
    for key, value in ann.items():
        if key.startswith(ANN_CPU_POLICY_PREFIX):
            name = key[len(ANN_CPU_POLICY_PREFIX) :]
            if not name:
                raise _annotation_error(key, value, "names no container after the dot")
            containers[name] = _cpu_policy(key, value)
            explicit = True
    levels: dict[str, str] = {}
    for key in (ANN_LEVEL, ACTIMANAGER_LEVEL):
        if key in ann:
            levels[key] = parse_level_annotation(key, ann[key])
            explicit = True
    level = levels.get(ANN_LEVEL, levels.get(ACTIMANAGER_LEVEL, "cpu"))
    workloads: list[str] = []
    for key, mapping in (
        (ANN_WORKLOAD, ann),
        (ANN_WORKLOAD, lab),
        (ACTIMANAGER_WORKLOAD, lab),
        (ACTIMANAGER_WORKLOAD, ann),
    ):
        if key in mapping:
            workloads.append(parse_workload(key, mapping[key]))
            explicit = True
    alignment = ann.get(ANN_DEVICE_ALIGNMENT, "preferred")
    if alignment not in DEVICE_ALIGNMENTS:
        raise _annotation_error(
            ANN_DEVICE_ALIGNMENT, alignment, f"must be one of {', '.join(DEVICE_ALIGNMENTS)}"
        )
    return PodCPUPolicy(
        policy=policy,
        containers=containers,
        level=level,
        workload=workloads[0] if workloads else None,
        explicit=explicit,
        device_alignment=alignment,
    )


def aliases_to_copy(
    annotations: Mapping[str, str] | None, labels: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The corepin.io annotations the webhook adds for the aliases a pod carries (only where
    the corepin.io key is absent), in corepin's spelling. Raises FieldError on a bad value."""
    ann = _strings(annotations, "annotations")
    lab = _strings(labels, "labels")
    out: dict[str, str] = {}
    if ANN_CPU_POLICY not in ann and CRANE_CPU_MANAGER in ann:
        out[ANN_CPU_POLICY] = _cpu_policy(CRANE_CPU_MANAGER, ann[CRANE_CPU_MANAGER])
    if ANN_LEVEL not in ann and ACTIMANAGER_LEVEL in ann:
        out[ANN_LEVEL] = parse_level_annotation(ACTIMANAGER_LEVEL, ann[ACTIMANAGER_LEVEL])
    if ANN_WORKLOAD not in ann and ANN_WORKLOAD not in lab:
        found = _first([(ACTIMANAGER_WORKLOAD, lab), (ACTIMANAGER_WORKLOAD, ann)])
        if found is not None:
            out[ANN_WORKLOAD] = parse_workload(*found)
    return out


def parse_cpus_annotation(value: object) -> dict[str, CPUSet]:
    """`corepin.io/cpus`: a JSON object from container name to CPU list, e.g. `{"app": "2-3"}`."""
    if not isinstance(value, str):
        raise _annotation_error(ANN_CPUS, value, "must be a JSON text")
    try:
        data = json.loads(value)
    except (json.JSONDecodeError, RecursionError) as exc:
        problem = exc.msg if isinstance(exc, json.JSONDecodeError) else "nested too deeply"
        raise _annotation_error(ANN_CPUS, value, f"is not valid JSON: {problem}") from None
    if not isinstance(data, dict):
        raise _annotation_error(ANN_CPUS, value, "must be a JSON object of container: CPU list")
    out: dict[str, CPUSet] = {}
    for name, text in data.items():
        if not name:
            raise _annotation_error(ANN_CPUS, value, "has an empty container name")
        if not isinstance(text, str):
            raise _annotation_error(ANN_CPUS, value, f"container {name!r}: CPUs must be a string")
        try:
            out[name] = CPUSet.parse(text)
        except CPUSetParseError as exc:
            raise _annotation_error(ANN_CPUS, value, f"container {name!r}: {exc.problem}") from None
    return out


def format_cpus_annotation(cpus: Mapping[str, CPUSet]) -> str:
    """The `corepin.io/cpus` text for container -> CPUs (sorted keys, compact)."""
    return json.dumps({k: str(v) for k, v in sorted(cpus.items())}, separators=(",", ":"))


def parse_node_reservation(annotations: Mapping[str, str] | None) -> Reservation | None:
    """The node's CPU reservation from `corepin.io/reservation`, else Koordinator's
    `node.koordinator.sh/reservation` (same JSON); None when neither is there."""
    ann = _strings(annotations, "annotations")
    found = _first([(ANN_RESERVATION, ann), (KOORDINATOR_RESERVATION, ann)])
    if found is None:
        return None
    key, text = found
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        raise _annotation_error(
            key, text, 'is not valid JSON (e.g. {"resources": {"cpu": "2"}})'
        ) from None
    if not isinstance(data, dict):
        raise _annotation_error(key, text, "must be a JSON object")
    try:
        return parse_koordinator_reservation(data)
    except InputError as exc:
        raise _annotation_error(key, text, exc.message) from None


def qos_class_request(
    annotations: Mapping[str, str] | None, labels: Mapping[str, str] | None = None
) -> tuple[str, str] | None:
    """(key, value) of the QoS class a pod names, unchecked: `corepin.io/qos-class`
    (annotation), else Koordinator's `koordinator.sh/qosClass` (label, then annotation); None
    when it names none. The caller checks the value (`corepin.allocation.qos.check_class`): a
    bad one falls back to the derived class, it never refuses the pod."""
    ann = _strings(annotations, "annotations")
    lab = _strings(labels, "labels")
    return _first(
        [(ANN_QOS_CLASS, ann), (KOORDINATOR_QOS_CLASS, lab), (KOORDINATOR_QOS_CLASS, ann)]
    )
