"""Typed owners of assignments: a process tree of host mode, or a container of a pod.

An assignment is owned by exactly one of:

- `ProcessOwner`: a `corepin run` (or `corepin pin`) workload. The process is identified by
  `pid` plus `start_time` (field 22 of /proc/PID/stat, clock ticks since boot), so a recycled
  pid never keeps a dead allocation alive nor gets pinned in its place. `runner_pid` /
  `runner_start_time` name the `corepin run` process that waits for it; `cgroup` is the run's
  own cpuset cgroup (relative to the cpuset hierarchy, always below corepin's parent);
  `session` is the session id when the run leads a session of its own (every process of that
  session belongs to the run); `members` are processes (pid, start time) that outlived the
  command and were recorded when it exited (lingering children); `name` and `command` are
  labels for reports.
- `ContainerOwner`: a container of a Kubernetes pod. Its identity is pod uid + container name,
  stable across container restarts; `container_id` (without the `containerd://` scheme) is an
  attribute that changes on every restart, like `cgroup` (relative to the cgroup hierarchy,
  always below the kubelet's `kubepods` parent). Entries imported from an old kubelet checkpoint
  may know only a container id (no pod uid or name) or only a pod uid (pod-level CPUs).

Owners are immutable values and validate themselves: identifiers and paths never contain control
characters; the labels `name` and `command` may, and every output escapes them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from corepin.core.errors import RequestError
from corepin.core.ids import QOS_CLASSES
from corepin.core.record import fields as record_fields
from corepin.core.record import record


def _check_text(
    where: str, name: str, value: object, *, limit: int = 1024, labels: bool = False
) -> None:
    """Strings of owners: bounded; identifiers and paths without control characters. Labels
    (`name`, `command`) may hold any text: every output escapes them (`corepin.core.text`)."""
    if not isinstance(value, str):
        raise RequestError(f"{where}: {name} must be a string, got {value!r}")
    if len(value) > limit:
        raise RequestError(f"{where}: {name} is longer than {limit} characters")
    if not labels and any(ord(ch) < 32 or ord(ch) == 127 for ch in value):
        raise RequestError(f"{where}: {name} {value!r} contains control characters")


def _check_int(where: str, name: str, value: object, *, optional: bool = True) -> None:
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise RequestError(f"{where}: {name} must be a non-negative integer, got {value!r}")


@record
class ProcessOwner:
    """A process tree started (or adopted) by corepin in host mode."""

    pid: int
    start_time: int | None = None
    runner_pid: int | None = None
    runner_start_time: int | None = None
    cgroup: str | None = None
    session: int | None = None
    members: tuple[tuple[int, int], ...] = ()
    name: str = ""
    command: str = ""

    type: ClassVar[str] = "process"

    def __post_init__(self) -> None:
        where = f"process owner {self.pid!r}"
        _check_int(where, "pid", self.pid, optional=False)
        if self.pid == 0:
            raise RequestError(f"{where}: pid 0 is not a process")
        for name in ("start_time", "runner_pid", "runner_start_time", "session"):
            _check_int(where, name, getattr(self, name))
        if self.cgroup is not None:
            _check_text(where, "cgroup", self.cgroup)
        _check_text(where, "name", self.name, limit=256, labels=True)
        _check_text(where, "command", self.command, limit=1024, labels=True)
        members = tuple(tuple(m) for m in self.members)
        for m in members:
            if len(m) != 2:
                raise RequestError(f"{where}: members must be (pid, start time) pairs")
            _check_int(where, "member pid", m[0], optional=False)
            _check_int(where, "member start time", m[1], optional=False)
        object.__setattr__(self, "members", tuple(sorted(set(members))))

    @property
    def label(self) -> str:
        return self.name or f"pid {self.pid}"

    def to_json(self) -> dict[str, Any]:
        return {
            "type": "process",
            "pid": self.pid,
            "start_time": self.start_time,
            "runner_pid": self.runner_pid,
            "runner_start_time": self.runner_start_time,
            "cgroup": self.cgroup,
            "session": self.session,
            "members": [list(m) for m in self.members],
            "name": self.name,
            "command": self.command,
        }


@record
class ContainerOwner:
    """A container of a Kubernetes pod (identity: pod uid + container name)."""

    pod_uid: str = ""
    container: str = ""
    namespace: str = ""
    pod: str = ""
    container_id: str = ""
    qos: str = ""
    runtime: str = ""
    cgroup: str | None = None

    type: ClassVar[str] = "container"

    def __post_init__(self) -> None:
        where = f"container owner {self.key!r}"
        for name in ("pod_uid", "container", "namespace", "pod", "container_id", "runtime"):
            _check_text(where, name, getattr(self, name), limit=253)
        if self.cgroup is not None:
            _check_text(where, "cgroup", self.cgroup)
        if self.qos and self.qos not in QOS_CLASSES:
            raise RequestError(
                f"{where}: QoS class must be one of {', '.join(QOS_CLASSES)}, got {self.qos!r}"
            )
        if not self.pod_uid and not self.container_id:
            raise RequestError(f"{where}: a container owner needs a pod uid or a container id")
        if self.container and not self.pod_uid:
            raise RequestError(f"{where}: container {self.container!r} has no pod uid")

    @property
    def key(self) -> str:
        """The stable identity: `<pod uid>/<container>` (or what an old import knows)."""
        if self.pod_uid:
            return f"{self.pod_uid}/{self.container}" if self.container else self.pod_uid
        return f"container/{self.container_id}"

    @property
    def label(self) -> str:
        if self.pod and self.container:
            return f"{self.namespace}/{self.pod}/{self.container}".lstrip("/")
        return self.key

    def to_json(self) -> dict[str, Any]:
        return {
            "type": "container",
            "pod_uid": self.pod_uid,
            "container": self.container,
            "namespace": self.namespace,
            "pod": self.pod,
            "container_id": self.container_id,
            "qos": self.qos,
            "runtime": self.runtime,
            "cgroup": self.cgroup,
        }


Owner = ProcessOwner | ContainerOwner


def owner_from_json(data: Mapping[str, Any]) -> Owner:
    """The owner of a checkpoint row (`to_json` form); RequestError naming what is wrong."""
    kind = data.get("type")
    cls: type[ProcessOwner] | type[ContainerOwner]
    if kind == "process":
        cls = ProcessOwner
    elif kind == "container":
        cls = ContainerOwner
    else:
        raise RequestError(f"owner type must be 'process' or 'container', got {kind!r}")
    given = {k: v for k, v in data.items() if k != "type"}
    known = {f.name for f in record_fields(cls)}
    for name in sorted(given):
        if name not in known:
            raise RequestError(f"{kind} owner: unknown field {name!r}")
    if cls is ProcessOwner:
        if "pid" not in given:
            raise RequestError("process owner: missing field 'pid'")
        members = given.get("members") or ()
        if not isinstance(members, (list, tuple)):
            raise RequestError(f"process owner: members must be a list, got {members!r}")
        given["members"] = tuple(
            tuple(m) if isinstance(m, (list, tuple)) else (m,) for m in members
        )
    return cls(**given)
