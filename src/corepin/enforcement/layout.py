"""Where the kubelet and the container runtimes put pod and container cgroups.

Two cgroup drivers of the kubelet (relative to the hierarchy root, default cgroup root `/`):

cgroupfs:  kubepods/pod<uid>/<ctr>                         (Guaranteed)
           kubepods/burstable/pod<uid>/<ctr>               (Burstable; besteffort alike)
systemd:   kubepods.slice/kubepods-pod<uid_>.slice/<ctr>   (Guaranteed)
           kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid_>.slice/<ctr>

In the systemd layout every name component has its `-` replaced by `_` (so the pod uid appears
with underscores) and the slice names spell out their ancestry joined by `-`.

The container directory `<ctr>` depends on the runtime:

| runtime    | cgroupfs      | systemd                      |
|------------|---------------|------------------------------|
| containerd | `<id>`        | `cri-containerd-<id>.scope`  |
| cri-o      | `crio-<id>`   | `crio-<id>.scope`            |
| docker     | `<id>`        | `docker-<id>.scope`          |
| podman     | `libpod-<id>` | `libpod-<id>.scope`          |
| generic    | `<id>`        | `<id>.scope`                 |

Docker outside Kubernetes uses `docker/<id>` (cgroupfs) and `system.slice/docker-<id>.scope`.
Every component passes `corepin.core.ids` validation before a path is returned.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Iterable, Sequence
from enum import StrEnum
from typing import Final

from corepin.core.ids import (
    IdError,
    split_cgroup_path,
    validate_component,
    validate_container_id,
    validate_pod_uid,
    validate_qos,
    validate_runtime,
)

__all__ = [
    "KUBELET_PARENTS",
    "KUBEPODS",
    "KUBEPODS_SLICE",
    "Layout",
    "container_cgroup_path",
    "container_dir_name",
    "docker_cgroup_path",
    "find_container_cgroup",
    "index_container_cgroups",
    "parse_container_dir",
    "pod_cgroup_path",
    "qos_cgroup_path",
]


#: The kubelet's parent group of every pod with the cgroupfs driver (QoS groups below it).
KUBEPODS: Final = "kubepods"
#: The same with the systemd driver.
KUBEPODS_SLICE: Final = "kubepods.slice"
#: Both: the first component of every pod's cgroup, whichever driver made it.
KUBELET_PARENTS: Final = (KUBEPODS, KUBEPODS_SLICE)


class Layout(StrEnum):
    """The kubelet's cgroup driver."""

    CGROUPFS = "cgroupfs"
    SYSTEMD = "systemd"

    @classmethod
    def parse(cls, value: object) -> Layout:
        if isinstance(value, Layout):
            return value
        try:
            return cls(str(value).lower())
        except ValueError:
            raise IdError("cgroup layout", value, "is not 'cgroupfs' or 'systemd'") from None


def _systemd_path(names: Sequence[str]) -> str:
    """Expand cgroup names [a, b, c] into `a.slice/a-b.slice/a-b-c.slice` (names escaped)."""
    out: list[str] = []
    prefix = ""
    for name in names:
        escaped = name.replace("-", "_")
        prefix = f"{prefix}-{escaped}" if prefix else escaped
        out.append(f"{prefix}.slice")
    return "/".join(out)


def _cgroup_root(cgroup_root: str) -> list[str]:
    return list(split_cgroup_path(cgroup_root))


def qos_cgroup_path(
    layout: Layout | str, qos: str, *, cgroup_root: str = "", kubepods: str = KUBEPODS
) -> str:
    """The QoS-level cgroup (`kubepods` itself for Guaranteed pods)."""
    kind = Layout.parse(layout)
    qos_name = validate_qos(qos)
    names = [*_cgroup_root(cgroup_root), validate_component(kubepods)]
    if qos_name != "guaranteed":
        names.append(qos_name)
    if kind is Layout.CGROUPFS:
        return "/".join(names)
    return _systemd_path(names)


@functools.lru_cache(maxsize=1024)  # pure; the agent asks for every pod on every resync
def pod_cgroup_path(
    layout: Layout | str,
    qos: str,
    pod_uid: str,
    *,
    cgroup_root: str = "",
    kubepods: str = KUBEPODS,
) -> str:
    """The pod-level cgroup of a pod, relative to the hierarchy root."""
    kind = Layout.parse(layout)
    qos_name = validate_qos(qos)
    uid = validate_pod_uid(pod_uid)
    names = [*_cgroup_root(cgroup_root), validate_component(kubepods)]
    if qos_name != "guaranteed":
        names.append(qos_name)
    names.append(f"pod{uid}")
    if kind is Layout.CGROUPFS:
        return "/".join(names)
    return _systemd_path(names)


_SYSTEMD_PREFIX: Final = {
    "containerd": "cri-containerd-",
    "cri-o": "crio-",
    "docker": "docker-",
    "podman": "libpod-",
    "generic": "",
}
_CGROUPFS_PREFIX: Final = {
    "containerd": "",
    "cri-o": "crio-",
    "docker": "",
    "podman": "libpod-",
    "generic": "",
}


def container_dir_name(layout: Layout | str, runtime: str, container_id: str) -> str:
    """The name of a container's own cgroup directory for this layout and runtime."""
    kind = Layout.parse(layout)
    name = validate_runtime(runtime)
    ident = validate_container_id(container_id, name)
    if kind is Layout.SYSTEMD:
        return validate_component(f"{_SYSTEMD_PREFIX[name]}{ident}.scope")
    return validate_component(f"{_CGROUPFS_PREFIX[name]}{ident}")


def container_cgroup_path(
    layout: Layout | str,
    qos: str,
    pod_uid: str,
    runtime: str,
    container_id: str,
    *,
    cgroup_root: str = "",
    kubepods: str = KUBEPODS,
) -> str:
    """A container's cgroup, relative to the hierarchy root; every component validated.

    >>> container_cgroup_path("cgroupfs", "burstable", "0f8c2a6e-3b1d-4c2e-9a57-1d2e3f4a5b6c",
    ...                       "containerd", "ab" * 32)[:55]
    'kubepods/burstable/pod0f8c2a6e-3b1d-4c2e-9a57-1d2e3f4a5b'
    """
    pod = pod_cgroup_path(layout, qos, pod_uid, cgroup_root=cgroup_root, kubepods=kubepods)
    return f"{pod}/{container_dir_name(layout, runtime, container_id)}"


def docker_cgroup_path(layout: Layout | str, container_id: str) -> str:
    """Where docker puts a container outside Kubernetes."""
    kind = Layout.parse(layout)
    ident = validate_container_id(container_id, "docker")
    if kind is Layout.SYSTEMD:
        return f"system.slice/docker-{ident}.scope"
    return f"docker/{ident}"


_DIR_PATTERNS: Final = (
    (re.compile(r"cri-containerd-([0-9a-f]{64})\.scope\Z"), "containerd"),
    (re.compile(r"crio-([0-9a-f]{64})(?:\.scope)?\Z"), "cri-o"),
    (re.compile(r"docker-([0-9a-f]{64})\.scope\Z"), "docker"),
    (re.compile(r"libpod-([0-9a-f]{64})(?:\.scope)?\Z"), "podman"),
    (re.compile(r"([0-9a-f]{64})\Z"), "containerd"),
)


def parse_container_dir(name: str) -> tuple[str, str] | None:
    """(runtime, id) when `name` is a container cgroup directory name of a known runtime.

    A bare 64-hex name is reported as containerd (docker's cgroupfs name is the same).
    `crio-conmon-<id>` (CRI-O's monitor process) is not a container.
    """
    for pattern, runtime in _DIR_PATTERNS:
        match = pattern.match(name)
        if match:
            return runtime, match.group(1)
    return None


def _candidate_names(container_id: str, runtime: str | None) -> set[str]:
    runtimes: Iterable[str]
    if runtime is not None:
        runtimes = (validate_runtime(runtime),)
    else:
        runtimes = ("containerd", "cri-o", "docker", "podman", "generic")
    names: set[str] = set()
    for name in runtimes:
        try:
            ident = validate_container_id(container_id, name)
        except IdError:
            continue
        for layout in Layout:
            names.add(container_dir_name(layout, name, ident))
    if not names:
        # re-raise the most specific complaint
        validate_container_id(container_id, runtime or "generic")
    return names


def _walk(root: str, rel: str, max_depth: int) -> Iterable[tuple[str, str]]:
    """(relative path, dir name) of every directory below root, breadth first."""
    level = [rel]
    for _ in range(max_depth):
        nxt: list[str] = []
        for current in level:
            base = os.path.join(root, current) if current else root
            try:
                with os.scandir(base) as entries:
                    for entry in entries:
                        if entry.is_dir(follow_symlinks=False):
                            child = f"{current}/{entry.name}" if current else entry.name
                            yield child, entry.name
                            nxt.append(child)
            except (FileNotFoundError, NotADirectoryError, PermissionError):
                continue
        level = nxt
        if not level:
            return


def find_container_cgroup(
    root: str | os.PathLike[str],
    container_id: str,
    *,
    runtime: str | None = None,
    under: Sequence[str] = (),
    max_depth: int = 8,
) -> str | None:
    """Find the cgroup of `container_id` by scanning the hierarchy at `root`.

    Looks for every directory name the known runtimes and layouts give that id (or only those of
    `runtime`), below each of `under` (relative paths; default the whole hierarchy), at most
    `max_depth` levels deep. Returns the relative path, or None when it is not there.
    """
    names = _candidate_names(container_id, runtime)
    base = os.fspath(root)
    starts = ["/".join(split_cgroup_path(u)) for u in under] or [""]
    for start in starts:
        for rel, name in _walk(base, start, max_depth):
            if name in names:
                return rel
    return None


def index_container_cgroups(
    root: str | os.PathLike[str], *, under: Sequence[str] = (), max_depth: int = 8
) -> dict[str, str]:
    """container id -> relative cgroup path for every container directory below `root`.

    One scan for many lookups (an agent resolving all containers of its node).
    """
    base = os.fspath(root)
    starts = ["/".join(split_cgroup_path(u)) for u in under] or [""]
    out: dict[str, str] = {}
    for start in starts:
        for rel, name in _walk(base, start, max_depth):
            parsed = parse_container_dir(name)
            if parsed is not None:
                out.setdefault(parsed[1], rel)
    return out
