"""The mutating webhook's patch for a pod (pure).

Mutate (CREATE only; JSONPatch) patches only pods with a corepin annotation or alias:
- alias annotations are copied to their `corepin.io` keys (where those are absent);
- each eligible `exclusive`/`share` container gets `COREPIN_NUM_CPUS` (its CPU count) and a
  read-only mount of the agent's assignment directory (a hostPath volume) at `/etc/corepin`,
  plus `COREPIN_POD_NAME` (downward API) and `COREPIN_ASSIGNMENT_FILE`
  (`/etc/corepin/<namespace>.$(COREPIN_POD_NAME).<container>`, the agent's file for it);
- `spec.schedulerName` (when configured, and the pod names no other scheduler than
  `default-scheduler`), the configured node selector entries and tolerations.
Already present, identical pieces are left alone (mutating a mutated pod gives no patch); a
piece that clashes with what the pod has (another volume at `/etc/corepin`, another value for
a node selector key, another scheduler) is left as the pod has it, with a warning.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from corepin.api.webhook.config import WebhookConfig
from corepin.api.webhook.patch import JsonPatch
from corepin.api.webhook.review import Outcome
from corepin.core.record import record
from corepin.kube.models import (
    FieldError,
    PodView,
    aliases_to_copy,
    container_eligibility,
    parse_pod_annotations,
)
from corepin.kube.models.fields import list_or_empty, object_or_empty

#: Where each exclusive/share container sees the agent's assignment directory.
MOUNT_PATH: Final = "/etc/corepin"
VOLUME_NAME: Final = "corepin-assignments"
ENV_NUM_CPUS: Final = "COREPIN_NUM_CPUS"
ENV_POD_NAME: Final = "COREPIN_POD_NAME"
ENV_ASSIGNMENT_FILE: Final = "COREPIN_ASSIGNMENT_FILE"
DEFAULT_SCHEDULER: Final = "default-scheduler"

Env = list[tuple[str, dict[str, Any]]]


def mutate_pod(request: Mapping[str, Any], config: WebhookConfig) -> Outcome:
    """The patch for a CREATE of a pod (see the module docstring); FieldError when the pod
    cannot be read."""
    if request.get("operation") != "CREATE":
        return Outcome(True)  # env and volume mounts are fixed once a pod exists
    pod = PodView.checked(request.get("object"), "request.object")
    annotations, labels = pod.annotations, pod.labels
    try:
        wanted = parse_pod_annotations(annotations, labels)
        aliases = aliases_to_copy(annotations, labels)
    except FieldError as exc:
        return Outcome(True, warnings=(f"corepin did not change this pod: {exc.message}",))
    if not wanted.explicit:
        return Outcome(True)
    if not isinstance(pod.raw.get("spec"), Mapping):
        return Outcome(True, warnings=("corepin did not change this pod: it has no spec",))
    patch = JsonPatch()
    warnings: list[str] = []
    if aliases:
        patch.put_object(("metadata", "annotations"), pod.metadata.get("annotations"), aliases)
    namespace = _namespace(request, pod)
    holders: list[tuple[int, Mapping[str, Any], int]] = []
    for i, c in enumerate(pod.containers):
        if wanted.policy_for(c["name"]) == "none":
            continue
        try:
            eligible = container_eligibility(c, f"spec.containers[{i}]")
        except FieldError:
            continue  # the validating webhook refuses it, naming the field
        if eligible.eligible:
            holders.append((i, c, eligible.cpus))
    if holders:
        host_dir = config.assignment_dir_host
        volume = _volume(pod.spec, host_dir) if host_dir else None
        mounted = False
        for i, c, count in holders:
            has_mount = volume is not None and _mount(patch, i, c, volume.name, warnings)
            mounted |= has_mount
            env: Env = [(ENV_NUM_CPUS, {"name": ENV_NUM_CPUS, "value": str(count)})]
            if has_mount:
                env += [
                    (
                        ENV_POD_NAME,
                        {
                            "name": ENV_POD_NAME,
                            "valueFrom": {
                                "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}
                            },
                        },
                    ),
                    (
                        ENV_ASSIGNMENT_FILE,
                        {
                            "name": ENV_ASSIGNMENT_FILE,
                            "value": f"{MOUNT_PATH}/{namespace}.$({ENV_POD_NAME}).{c['name']}",
                        },
                    ),
                ]
            _env(patch, i, c, env)
        if mounted and volume is not None and volume.new:
            patch.append(("spec", "volumes"), pod.spec.get("volumes"), volume.to_dict())
    _scheduling(patch, pod.spec, config, warnings)
    return Outcome(True, patch=tuple(patch.ops), warnings=tuple(warnings))


def _namespace(request: Mapping[str, Any], pod: PodView) -> str:
    for value in (request.get("namespace"), pod.metadata.get("namespace")):
        if isinstance(value, str) and value:
            return value
    return "default"


@record
class _Volume:
    name: str
    host_path: str
    new: bool

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "hostPath": {"path": self.host_path, "type": "DirectoryOrCreate"},
        }


def _same_path(a: object, b: str) -> bool:
    return isinstance(a, str) and (a.rstrip("/") or "/") == (b.rstrip("/") or "/")


def _volume(spec: Mapping[str, Any], host_path: str) -> _Volume:
    """The pod's hostPath volume of the assignment directory, or a new one with a free name."""
    volumes = list_or_empty(spec.get("volumes"), "spec.volumes")
    names: set[str] = set()
    for v in volumes:
        if not isinstance(v, Mapping):
            continue
        name, hp = v.get("name"), v.get("hostPath")
        if not isinstance(name, str):
            continue
        if isinstance(hp, Mapping) and _same_path(hp.get("path"), host_path):
            return _Volume(name, host_path, False)
        names.add(name)
    name, n = VOLUME_NAME, 1
    while name in names:
        n += 1
        name = f"{VOLUME_NAME}-{n}"
    return _Volume(name, host_path, True)


def _mount(
    patch: JsonPatch, index: int, c: Mapping[str, Any], volume: str, warnings: list[str]
) -> bool:
    """Mount `volume` read-only at /etc/corepin in container `index`; False when another
    volume is mounted there already (a warning says so)."""
    mounts = list_or_empty(c.get("volumeMounts"), f"spec.containers[{index}].volumeMounts")
    for m in mounts:
        if isinstance(m, Mapping) and _same_path(m.get("mountPath"), MOUNT_PATH):
            if m.get("name") == volume:
                return True
            warnings.append(
                f"container {c['name']!r}: {MOUNT_PATH} is taken by volume {m.get('name')!r}; "
                "corepin did not mount its assignment directory there"
            )
            return False
    item = {"name": volume, "mountPath": MOUNT_PATH, "readOnly": True}
    patch.append(("spec", "containers", index, "volumeMounts"), c.get("volumeMounts"), item)
    return True


def _same_env(have: Mapping[str, Any], want: Mapping[str, Any]) -> bool:
    if "value" in want:
        return have.get("value") == want["value"] and "valueFrom" not in have
    source = have.get("valueFrom")
    if not isinstance(source, Mapping) or len(source) != 1:
        return False
    field = source.get("fieldRef")
    wanted = want["valueFrom"]["fieldRef"]
    return (
        isinstance(field, Mapping)
        and field.get("fieldPath") == wanted["fieldPath"]
        and field.get("apiVersion", "v1") == wanted["apiVersion"]
        and "value" not in have
    )


def _env(
    patch: JsonPatch, index: int, c: Mapping[str, Any], wanted: Sequence[tuple[str, dict[str, Any]]]
) -> None:
    env = list_or_empty(c.get("env"), f"spec.containers[{index}].env")
    at = {e.get("name"): i for i, e in enumerate(env) if isinstance(e, Mapping)}
    for name, entry in wanted:
        i = at.get(name)
        if i is None:
            patch.append(("spec", "containers", index, "env"), c.get("env"), entry)
        elif not _same_env(env[i], entry):
            patch.replace(("spec", "containers", index, "env", i), entry)


def _scheduling(
    patch: JsonPatch, spec: Mapping[str, Any], config: WebhookConfig, warnings: list[str]
) -> None:
    if config.scheduler_name:
        current = spec.get("schedulerName")
        if current in (None, "", DEFAULT_SCHEDULER):
            patch.add(("spec", "schedulerName"), config.scheduler_name)
        elif current != config.scheduler_name:
            warnings.append(
                f"spec.schedulerName is {current!r}: corepin left it (it would send pods that "
                f"ask for CPUs to {config.scheduler_name!r})"
            )
    if config.node_selector:
        selector = object_or_empty(spec.get("nodeSelector"), "spec.nodeSelector")
        add: dict[str, str] = {}
        for key, value in config.node_selector:
            if key not in selector:
                add[key] = value
            elif selector[key] != value:
                warnings.append(
                    f"spec.nodeSelector[{key!r}] is {selector[key]!r}: corepin left it (corepin "
                    f"nodes have {key}={value})"
                )
        if add:
            patch.put_object(("spec", "nodeSelector"), spec.get("nodeSelector"), add)
    if config.tolerations:
        have = list_or_empty(spec.get("tolerations"), "spec.tolerations")
        present = [_toleration_key(t) for t in have if isinstance(t, Mapping)]
        for toleration in config.tolerations:
            item = toleration.to_dict()
            if _toleration_key(item) not in present:
                patch.append(("spec", "tolerations"), spec.get("tolerations"), item)


def _toleration_key(t: Mapping[str, Any]) -> tuple[object, ...]:
    operator = t.get("operator") or "Equal"
    return (
        t.get("key") or "",
        operator,
        (t.get("value") or "") if operator == "Equal" else "",
        t.get("effect") or "",
        t.get("tolerationSeconds"),
    )
