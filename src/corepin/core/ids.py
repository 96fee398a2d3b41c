"""Validation of the identifiers that end up inside filesystem paths.

Every cgroup path corepin writes to is built from pieces that passed through this module: a
container id, a pod uid, a QoS class, a runtime name or a plain cgroup path component. A value
containing `/`, `..`, NUL or anything outside the expected alphabet is rejected with
`IdError` (an `InputError`, exit 2) naming the value; nothing is ever written for it.

Alphabets:
- container ids of containerd (CRI), docker, podman and CRI-O: 64 lowercase hex digits;
- runtime `generic` (for example `ctr run` names): containerd's identifier grammar, alphanumeric
  words joined by single `.`, `_` or `-`, at most 76 characters;
- pod uids: a canonical UUID `8-4-4-4-12` in lowercase hex (the systemd layout writes it with `_`
  instead of `-`), or 32 hex digits (the kubelet's hash-based uid of static pods);
- cgroup path components: `[A-Za-z0-9_.:@+-]`, 1..255 characters, never `.` or `..`.
"""

from __future__ import annotations

import re
from typing import Final

from corepin.core.errors import InputError


class IdError(InputError, ValueError):
    """An identifier that is not safe or not valid for its kind; names the value."""

    default_reason = "bad_id"

    def __init__(self, kind: str, value: object, problem: str) -> None:
        self.kind = kind
        self.value = value
        self.problem = problem
        super().__init__(f"invalid {kind} {value!r}: {problem}")


# Container and pod id patterns, compiled on first use through `re`'s cache (compiling them
# all at import costs a third of a millisecond on every `corepin run`, which checks none).
_HEX64: Final = r"[0-9a-f]{64}\Z"
_HEX32: Final = r"[0-9a-f]{32}\Z"
_UUID: Final = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\Z"
_UUID_SYSTEMD: Final = r"[0-9a-f]{8}_[0-9a-f]{4}_[0-9a-f]{4}_[0-9a-f]{4}_[0-9a-f]{12}\Z"
_CONTAINERD_NAME: Final = r"[A-Za-z0-9]+(?:[._-][A-Za-z0-9]+)*\Z"
_COMPONENT: Final = re.compile(r"[A-Za-z0-9_.:@+-]{1,255}\Z")

#: Runtimes whose container ids are 64 lowercase hex digits.
HEX_RUNTIMES: Final = frozenset({"containerd", "docker", "cri-o", "podman"})
#: Every runtime name accepted by `validate_runtime`.
RUNTIMES: Final = frozenset({*HEX_RUNTIMES, "generic"})
QOS_CLASSES: Final = ("guaranteed", "burstable", "besteffort")

_RUNTIME_ALIASES: Final = {"crio": "cri-o", "cri_o": "cri-o", "moby": "docker"}


def _check_str(kind: str, value: object) -> str:
    if not isinstance(value, str):
        raise IdError(kind, value, f"must be a string, not {type(value).__name__}")
    if not value:
        raise IdError(kind, value, "is empty")
    if "\x00" in value:
        raise IdError(kind, value, "contains a NUL byte")
    if "/" in value:
        raise IdError(kind, value, "contains '/'")
    if value in (".", ".."):
        raise IdError(kind, value, "is a relative directory reference")
    if ".." in value:
        raise IdError(kind, value, "contains '..'")
    if not value.isascii():
        raise IdError(kind, value, "contains non-ASCII characters")
    return value


def validate_runtime(runtime: object) -> str:
    """The canonical runtime name (`containerd`, `docker`, `cri-o`, `podman`, `generic`)."""
    text = _check_str("container runtime", runtime).lower()
    text = _RUNTIME_ALIASES.get(text, text)
    if text not in RUNTIMES:
        raise IdError("container runtime", runtime, f"is not one of {', '.join(sorted(RUNTIMES))}")
    return text


def validate_container_id(value: object, runtime: str = "containerd") -> str:
    """Return `value` when it is a valid container id for `runtime`, else raise IdError.

    containerd/docker/cri-o/podman ids are 64 lowercase hex digits; `generic` accepts containerd's
    identifier grammar (alphanumeric words joined by `.`, `_` or `-`, at most 76 characters).
    """
    name = validate_runtime(runtime)
    text = _check_str("container id", value)
    if name in HEX_RUNTIMES:
        if not re.match(_HEX64, text):
            raise IdError(
                "container id",
                value,
                f"a {name} container id is exactly 64 lowercase hex digits (got {len(text)} "
                "characters)",
            )
        return text
    if len(text) > 76:
        raise IdError("container id", value, "is longer than 76 characters")
    if not re.match(_CONTAINERD_NAME, text):
        raise IdError(
            "container id",
            value,
            "must be alphanumeric words joined by single '.', '_' or '-'",
        )
    return text


def validate_pod_uid(value: object) -> str:
    """Return the pod uid in its canonical (dashed, lowercase) form, else raise IdError.

    Accepts a UUID with dashes, the systemd-escaped form with underscores (converted back to
    dashes), and the 32-hex-digit uid the kubelet derives for static pods.
    """
    text = _check_str("pod uid", value)
    if re.match(_UUID, text) or re.match(_HEX32, text):
        return text
    if re.match(_UUID_SYSTEMD, text):
        return text.replace("_", "-")
    raise IdError(
        "pod uid",
        value,
        "expected a lowercase UUID like 0f8c2a6e-3b1d-4c2e-9a57-1d2e3f4a5b6c or 32 hex digits",
    )


def validate_qos(value: object) -> str:
    """A Kubernetes QoS class in lowercase: guaranteed, burstable or besteffort."""
    text = _check_str("QoS class", value).lower().replace("-", "")
    if text not in QOS_CLASSES:
        raise IdError("QoS class", value, f"is not one of {', '.join(QOS_CLASSES)}")
    return text


def validate_component(value: object, kind: str = "cgroup path component") -> str:
    """One path component of a cgroup path: `[A-Za-z0-9_.:@+-]{1,255}`, never `.` or `..`."""
    text = _check_str(kind, value)
    if not _COMPONENT.match(text):
        bad = sorted({ch for ch in text if not re.match(r"[A-Za-z0-9_.:@+-]", ch)})
        if bad:
            raise IdError(kind, value, f"contains characters outside [A-Za-z0-9_.:@+-]: {bad}")
        raise IdError(kind, value, "is longer than 255 characters")
    return text


def split_cgroup_path(path: object) -> tuple[str, ...]:
    """Validate a relative cgroup path (`a/b/c`, leading/trailing `/` allowed) into components.

    The empty path (or `/`) is the hierarchy root and gives `()`. Empty components (`a//b`) are
    rejected, as is every component that `validate_component` rejects.
    """
    if not isinstance(path, str):
        raise IdError("cgroup path", path, f"must be a string, not {type(path).__name__}")
    if "\x00" in path:
        raise IdError("cgroup path", path, "contains a NUL byte")
    body = path.strip("/")
    if not body:
        return ()
    parts = body.split("/")
    for part in parts:
        if not part:
            raise IdError("cgroup path", path, "has an empty component ('//')")
        validate_component(part)
    return tuple(parts)


def validate_pid(value: object) -> int:
    """A process id: a positive int (bool excluded)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise IdError("pid", value, f"must be an int, not {type(value).__name__}")
    if value <= 0 or value > 2**22:
        raise IdError("pid", value, "is outside 1..4194304")
    return value
