"""The admission decisions of `corepin webhook`: AdmissionReview v1 for pods.

Pure: a decoded AdmissionReview in, the AdmissionReview to answer with out; no I/O and no
clock (what the cluster's nodes can hold comes in as a `ClusterCapacity` snapshot, or None).

```python
answer = admit(review, "validate", config, capacity)   # or "mutate"
```

`admit` raises `ReviewError` (answer HTTP 400) when the body is not an AdmissionReview v1
with a request uid; anything else gets an AdmissionReview v1 response with that uid echoed:
`{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": {"uid",
"allowed", ["status"], ["patchType", "patch"], ["warnings"]}}`. A request that is not about a
pod (other resources, subresources, DELETE, CONNECT) is allowed untouched; a pod object that
cannot be read is refused with code 400 naming the field.

**Validate** (CREATE and UPDATE) refuses, with `status.code` 403 and a message naming the
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

**Mutate** (CREATE only; JSONPatch) patches only pods with a corepin annotation or alias:
- alias annotations are copied to their `corepin.io` keys (where those are absent);
- each eligible `exclusive`/`share` container gets `COREPIN_NUM_CPUS` (its CPU count) and a
  read-only mount of the agent's assignment directory (a hostPath volume) at `/etc/corepin`,
  plus `COREPIN_POD_NAME` (downward API) and `COREPIN_ASSIGNMENT_FILE`
  (`/etc/corepin/<namespace>.$(COREPIN_POD_NAME).<container>`, the agent's file for it);
- `spec.schedulerName` (when configured, and the pod names no other scheduler than
  `default-scheduler`), the configured node selector entries and tolerations.
Already present, identical pieces are left alone (mutating a mutated pod gives no patch); a
piece that clashes with what the pod has (another volume at `/etc/corepin`, another value for
a node selector key, another scheduler) is left as the pod has it, with a warning. JSON pointers
are escaped as RFC 6901 says (`corepin.io~1cpu-policy`); arrays and objects the pod lacks are
added whole.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, Final, Literal

from corepin.api.webhook.capacity import ClusterCapacity, Hold
from corepin.core.errors import InputError
from corepin.core.record import record
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
    aliases_to_copy,
    container_eligibility,
    parse_cpus_annotation,
    parse_pod_annotations,
)

REVIEW_API_VERSION: Final = "admission.k8s.io/v1"
REVIEW_KIND: Final = "AdmissionReview"
#: Where each exclusive/share container sees the agent's assignment directory.
MOUNT_PATH: Final = "/etc/corepin"
#: The agent's `--assignment-dir` on the host (deploy/agent mounts the same path).
DEFAULT_ASSIGNMENT_DIR: Final = "/run/corepin/assignments"
VOLUME_NAME: Final = "corepin-assignments"
ENV_NUM_CPUS: Final = "COREPIN_NUM_CPUS"
ENV_POD_NAME: Final = "COREPIN_POD_NAME"
ENV_ASSIGNMENT_FILE: Final = "COREPIN_ASSIGNMENT_FILE"
DEFAULT_SCHEDULER: Final = "default-scheduler"
TAINT_EFFECTS: Final = ("NoSchedule", "PreferNoSchedule", "NoExecute")
#: The most problems listed in one refusal (the rest are counted).
MAX_PROBLEMS: Final = 5
#: Kubernetes may truncate longer warnings.
WARNING_LIMIT: Final = 256

Endpoint = Literal["validate", "mutate"]
Obj = Mapping[str, Any]

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
_ALIAS_KEYS: Final = (CRANE_CPU_MANAGER, ACTIMANAGER_LEVEL, ACTIMANAGER_WORKLOAD)

_LABEL_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?\Z")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z")


class ReviewError(InputError, ValueError):
    """The body is not an AdmissionReview v1 this webhook can answer (HTTP 400)."""

    default_reason = "bad_review"


# ---------------------------------------------------------------------- configuration
@record
class Toleration:
    """A toleration added to patched pods: `KEY[=VALUE][:EFFECT]` (no value: `Exists`)."""

    key: str
    value: str = ""
    effect: str = ""

    def to_dict(self) -> dict[str, str]:
        out = {"key": self.key, "operator": "Equal" if self.value else "Exists"}
        if self.value:
            out["value"] = self.value
        if self.effect:
            out["effect"] = self.effect
        return out


@record
class WebhookConfig:
    """What `corepin webhook` was started with (flags of the same names). An empty
    `assignment_dir_host` mounts nothing (only `COREPIN_NUM_CPUS` is set)."""

    scheduler_name: str = ""
    assignment_dir_host: str = DEFAULT_ASSIGNMENT_DIR
    node_selector: tuple[tuple[str, str], ...] = ()
    tolerations: tuple[Toleration, ...] = ()

    def __post_init__(self) -> None:
        if self.assignment_dir_host and not self.assignment_dir_host.startswith("/"):
            raise InputError(
                f"--assignment-dir-host {self.assignment_dir_host!r} must be an absolute path "
                "('' for no mount)",
                reason="bad_assignment_dir",
            )


def _label_key(key: str, flag: str, text: str) -> str:
    prefix, slash, name = key.rpartition("/")
    if not _LABEL_NAME.match(name) or (
        slash and (not prefix or len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix))
    ):
        raise InputError(
            f"{flag} {text!r}: {key!r} is not a label key ([prefix/]name, the name 1-63 "
            "letters, digits, '-', '_' or '.')",
            reason="bad_flag",
        )
    return key


def _label_value(value: str, flag: str, text: str) -> str:
    if value and not _LABEL_NAME.match(value):
        raise InputError(
            f"{flag} {text!r}: {value!r} is not a label value (at most 63 letters, digits, '-', "
            "'_' or '.', beginning and ending with a letter or digit)",
            reason="bad_flag",
        )
    return value


def parse_node_selector(text: str) -> tuple[str, str]:
    """`--node-selector KEY=VALUE` -> (key, value); InputError naming the flag otherwise."""
    key, eq, value = text.partition("=")
    if not eq:
        raise InputError(f"--node-selector {text!r}: expected KEY=VALUE", reason="bad_flag")
    flag = "--node-selector"
    return _label_key(key, flag, text), _label_value(value, flag, text)


def parse_toleration(text: str) -> Toleration:
    """`--toleration KEY[=VALUE][:EFFECT]` (EFFECT one of NoSchedule, PreferNoSchedule,
    NoExecute; none: every effect) -> Toleration; InputError naming the flag otherwise."""
    flag = "--toleration"
    body, colon, effect = text.rpartition(":") if ":" in text else (text, "", "")
    if colon and effect not in TAINT_EFFECTS:
        raise InputError(
            f"{flag} {text!r}: the effect must be one of {', '.join(TAINT_EFFECTS)}",
            reason="bad_flag",
        )
    key, _, value = body.partition("=")
    return Toleration(_label_key(key, flag, text), _label_value(value, flag, text), effect)


# ---------------------------------------------------------------------- wire helpers
def decode_body(data: bytes) -> object:
    """The JSON document of a request body; ReviewError when it is not UTF-8 JSON."""
    try:
        return json.loads(data)
    except RecursionError:
        raise ReviewError("the body is JSON nested too deeply") from None
    except UnicodeDecodeError:
        raise ReviewError("the body is not UTF-8 text") from None
    except ValueError as exc:
        raise ReviewError(f"the body is not JSON: {exc}") from None


def encode(answer: Mapping[str, Any]) -> bytes:
    return json.dumps(answer, separators=(",", ":")).encode()


def pointer(*tokens: str | int) -> str:
    """An RFC 6901 JSON pointer: `pointer("metadata", "annotations", "corepin.io/x")` ->
    `/metadata/annotations/corepin.io~1x`."""
    return "".join("/" + str(t).replace("~", "~0").replace("/", "~1") for t in tokens)


@record
class Outcome:
    """What to answer one request with."""

    allowed: bool
    message: str = ""
    code: int = 0
    patch: tuple[Mapping[str, Any], ...] = ()
    warnings: tuple[str, ...] = ()


def response(uid: str, outcome: Outcome) -> dict[str, Any]:
    """The AdmissionReview v1 answer for `uid`."""
    body: dict[str, Any] = {"uid": uid, "allowed": outcome.allowed}
    if not outcome.allowed:
        code = outcome.code or 403
        body["status"] = {
            "status": "Failure",
            "message": outcome.message,
            "reason": "BadRequest" if code == 400 else "Forbidden",
            "code": code,
        }
    if outcome.patch:
        ops = json.dumps(list(outcome.patch), separators=(",", ":")).encode()
        body["patchType"] = "JSONPatch"
        body["patch"] = base64.b64encode(ops).decode("ascii")
    if outcome.warnings:
        body["warnings"] = [_clip(w, WARNING_LIMIT) for w in outcome.warnings]
    return {"apiVersion": REVIEW_API_VERSION, "kind": REVIEW_KIND, "response": body}


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


# ---------------------------------------------------------------------- the entry point
def admit(
    review: object,
    endpoint: Endpoint,
    config: WebhookConfig,
    capacity: ClusterCapacity | None = None,
) -> dict[str, Any]:
    """The AdmissionReview answer to `review` at `endpoint` (see the module docstring)."""
    uid, request = _request(review)
    try:
        if not _is_pod(request):
            outcome = Outcome(True)
        elif endpoint == "validate":
            outcome = validate_pod(request, capacity)
        elif endpoint == "mutate":
            outcome = mutate_pod(request, config)
        else:
            raise ValueError(f"unknown endpoint {endpoint!r}")
    except FieldError as exc:
        outcome = Outcome(False, f"corepin cannot read this pod: {exc.message}", 400)
    return response(uid, outcome)


def _request(review: object) -> tuple[str, Obj]:
    if not isinstance(review, Mapping):
        raise ReviewError("the body must be a JSON object (an AdmissionReview)")
    api_version, kind = review.get("apiVersion"), review.get("kind")
    if api_version != REVIEW_API_VERSION or kind != REVIEW_KIND:
        raise ReviewError(
            f"expected apiVersion {REVIEW_API_VERSION} kind {REVIEW_KIND}, got "
            f"{_clip(repr(api_version), 60)} {_clip(repr(kind), 60)} "
            "(admissionReviewVersions must be [v1])"
        )
    request = review.get("request")
    if not isinstance(request, Mapping):
        raise ReviewError("the AdmissionReview has no request object")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise ReviewError("the AdmissionReview request has no uid")
    return uid, request


def _is_pod(request: Obj) -> bool:
    if request.get("subResource") or request.get("operation") not in ("CREATE", "UPDATE"):
        return False
    resource, kind = request.get("resource"), request.get("kind")
    if isinstance(resource, Mapping) and resource.get("resource") == "pods":
        return not resource.get("group")
    return isinstance(kind, Mapping) and kind.get("kind") == "Pod" and not kind.get("group")


# ---------------------------------------------------------------------- reading the pod
def _obj(value: object, path: str) -> Obj:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise FieldError(path, value, "must be an object")
    return value


def _containers(spec: Obj, key: str = "containers") -> list[Obj]:
    value = spec.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise FieldError(f"spec.{key}", value, "must be a list")
    for i, c in enumerate(value):
        if not isinstance(c, Mapping):
            raise FieldError(f"spec.{key}[{i}]", c, "must be an object")
        if not isinstance(c.get("name"), str):
            raise FieldError(f"spec.{key}[{i}].name", c.get("name"), "must be a string")
    return value


def _list(value: object, path: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise FieldError(path, value, "must be a list")
    return value


@record
class _Pod:
    """The parts of a pod object the webhook reads."""

    meta: Obj
    spec: Obj
    annotations: Obj
    labels: Obj
    containers: tuple[Obj, ...]


def _pod(request: Obj, key: str = "object") -> _Pod:
    pod = request.get(key)
    if not isinstance(pod, Mapping):
        raise FieldError(f"request.{key}", pod, "must be a Pod object")
    meta = _obj(pod.get("metadata"), "metadata")
    spec = _obj(pod.get("spec"), "spec")
    return _Pod(
        meta=meta,
        spec=spec,
        annotations=_strings(meta.get("annotations"), "metadata.annotations"),
        labels=_strings(meta.get("labels"), "metadata.labels"),
        containers=tuple(_containers(spec)),
    )


def _strings(value: object, path: str) -> Obj:
    out = _obj(value, path)
    for key, item in out.items():
        if not isinstance(item, str):
            raise FieldError(f"{path}[{key!r}]", item, "must be a string")
    return out


def _request_keys(pod: _Pod) -> dict[str, object]:
    keys: dict[str, object] = {}
    for k, v in pod.annotations.items():
        if k in _REQUEST_ANNOTATIONS or (
            isinstance(k, str) and k.startswith(ANN_CPU_POLICY_PREFIX)
        ):
            keys[f"annotation {k}"] = v
    for k in _REQUEST_LABELS:
        if k in pod.labels:
            keys[f"label {k}"] = pod.labels[k]
    return keys


def _policy_source(name: str, wanted: PodCPUPolicy, annotations: Obj) -> str:
    if name in wanted.containers:
        return ANN_CPU_POLICY_PREFIX + name
    return ANN_CPU_POLICY if ANN_CPU_POLICY in annotations else CRANE_CPU_MANAGER


# ---------------------------------------------------------------------- validate
def validate_pod(request: Obj, capacity: ClusterCapacity | None) -> Outcome:
    pod = _pod(request)
    operation = request.get("operation")
    if operation == "UPDATE":
        try:
            old = _pod(request, "oldObject")
        except FieldError:
            old = None
        if old is not None and _request_keys(old) == _request_keys(pod):
            return Outcome(True)  # the update does not touch what the pod asks corepin for
    try:
        wanted = parse_pod_annotations(pod.annotations, pod.labels)
    except FieldError as exc:
        return Outcome(False, exc.message)  # names the key, the value and what is allowed
    problems: list[str] = []
    if operation == "CREATE" and ANN_CPUS in pod.annotations:
        try:
            parse_cpus_annotation(pod.annotations[ANN_CPUS])
        except FieldError as exc:
            problems.append(f"{exc.message} (the agent writes this one; leave it out)")
    warnings = _warnings(pod, wanted, operation == "CREATE")
    holds: list[Hold] = []
    for i, c in enumerate(pod.containers):
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
            source = _policy_source(name, wanted, pod.annotations)
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


def _warnings(pod: _Pod, wanted: PodCPUPolicy, creating: bool) -> list[str]:
    names = {c["name"] for c in pod.containers}
    inits = {c["name"] for c in _containers(pod.spec, "initContainers")}
    out: list[str] = []
    for name in wanted.containers:
        key = ANN_CPU_POLICY_PREFIX + name
        if name in inits and name not in names:
            out.append(f"{key}: init containers always run on the shared pool")
        elif name not in names:
            listed = ", ".join(sorted(names)) or "none"
            out.append(f"{key} names no container of this pod (containers: {listed})")
    if creating:
        for key in pod.annotations:
            if (
                isinstance(key, str)
                and key.startswith("corepin.io/")
                and key not in _KNOWN_COREPIN
                and not key.startswith(ANN_CPU_POLICY_PREFIX)
            ):
                out.append(
                    f"annotation {key} is not one corepin reads (it reads "
                    f"{', '.join(_KNOWN_COREPIN[:3])} and {ANN_CPU_POLICY_PREFIX}<container>)"
                )
    return out


# ---------------------------------------------------------------------- mutate
def mutate_pod(request: Obj, config: WebhookConfig) -> Outcome:
    if request.get("operation") != "CREATE":
        return Outcome(True)  # env and volume mounts are fixed once a pod exists
    pod = _pod(request)
    try:
        wanted = parse_pod_annotations(pod.annotations, pod.labels)
        aliases = aliases_to_copy(pod.annotations, pod.labels)
    except FieldError as exc:
        return Outcome(True, warnings=(f"corepin did not change this pod: {exc.message}",))
    if not wanted.explicit:
        return Outcome(True)
    if not isinstance(request["object"].get("spec"), Mapping):
        return Outcome(True, warnings=("corepin did not change this pod: it has no spec",))
    patch = _Patch()
    warnings: list[str] = []
    if aliases:
        patch.put_object(("metadata", "annotations"), pod.meta.get("annotations"), aliases)
    namespace = _namespace(request, pod)
    holders: list[tuple[int, Obj, int]] = []
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
            env: list[tuple[str, dict[str, Any]]] = [
                (ENV_NUM_CPUS, {"name": ENV_NUM_CPUS, "value": str(count)})
            ]
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


def _namespace(request: Obj, pod: _Pod) -> str:
    for value in (request.get("namespace"), pod.meta.get("namespace")):
        if isinstance(value, str) and value:
            return value
    return "default"


class _Patch:
    """JSONPatch operations, built so that they apply to the pod as it was sent: a missing
    array or object is added whole (with everything that goes into it), later items appended
    (`/-`) to it; an existing member is replaced in place."""

    def __init__(self) -> None:
        self.ops: list[dict[str, Any]] = []
        self._created: dict[str, Any] = {}

    def append(self, path: tuple[str | int, ...], existing: object, item: object) -> None:
        where = pointer(*path)
        if isinstance(existing, list):
            self.ops.append({"op": "add", "path": where + "/-", "value": item})
        elif where in self._created:
            self._created[where].append(item)
        else:
            value = [item]
            self._created[where] = value
            self.ops.append({"op": "add", "path": where, "value": value})

    def put_object(
        self, path: tuple[str | int, ...], existing: object, items: Mapping[str, Any]
    ) -> None:
        where = pointer(*path)
        if isinstance(existing, Mapping):
            for key, value in items.items():
                self.ops.append({"op": "add", "path": pointer(*path, key), "value": value})
        elif where in self._created:
            self._created[where].update(items)
        else:
            value = dict(items)
            self._created[where] = value
            self.ops.append({"op": "add", "path": where, "value": value})

    def replace(self, path: tuple[str | int, ...], value: object) -> None:
        self.ops.append({"op": "replace", "path": pointer(*path), "value": value})


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


def _volume(spec: Obj, host_path: str) -> _Volume:
    """The pod's hostPath volume of the assignment directory, or a new one with a free name."""
    volumes = _list(spec.get("volumes"), "spec.volumes")
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


def _mount(patch: _Patch, index: int, c: Obj, volume: str, warnings: list[str]) -> bool:
    """Mount `volume` read-only at /etc/corepin in container `index`; False when another
    volume is mounted there already (a warning says so)."""
    mounts = _list(c.get("volumeMounts"), f"spec.containers[{index}].volumeMounts")
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


def _env(patch: _Patch, index: int, c: Obj, wanted: Sequence[tuple[str, dict[str, Any]]]) -> None:
    env = _list(c.get("env"), f"spec.containers[{index}].env")
    at = {e.get("name"): i for i, e in enumerate(env) if isinstance(e, Mapping)}
    for name, entry in wanted:
        i = at.get(name)
        if i is None:
            patch.append(("spec", "containers", index, "env"), c.get("env"), entry)
        elif not _same_env(env[i], entry):
            patch.replace(("spec", "containers", index, "env", i), entry)


def _scheduling(patch: _Patch, spec: Obj, config: WebhookConfig, warnings: list[str]) -> None:
    if config.scheduler_name:
        current = spec.get("schedulerName")
        if current in (None, "", DEFAULT_SCHEDULER):
            patch.ops.append(
                {"op": "add", "path": "/spec/schedulerName", "value": config.scheduler_name}
            )
        elif current != config.scheduler_name:
            warnings.append(
                f"spec.schedulerName is {current!r}: corepin left it (it would send pods that "
                f"ask for CPUs to {config.scheduler_name!r})"
            )
    if config.node_selector:
        selector = _obj(spec.get("nodeSelector"), "spec.nodeSelector")
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
        have = _list(spec.get("tolerations"), "spec.tolerations")
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
