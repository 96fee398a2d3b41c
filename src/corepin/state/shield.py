"""What the state records about a shield (`corepin shield on`), so that `off` can undo it.

A shield keeps every task that corepin does not manage off the CPUs it hands out exclusively.
The record says where (`scope`: a cgroup path relative to the cpuset hierarchy, "" for the
whole hierarchy), how (`mode`: `cpuset` - a system cpuset group under the scope - or
`affinity` - the tasks' CPU affinity, where no cpuset controller is usable) and everything it
changed, each with the value to put back:

- `moved`: tasks moved into the shield's groups, with the group each came from (pid and start
  time: a recycled pid is never moved back);
- `restricted`: other cgroups below the scope whose `cpuset.cpus` the shield narrowed in place,
  with their original text (`""` is a cgroup v2 group inheriting its parent's CPUs);
- `tasks`: in affinity mode, the original affinity of each task it pinned;
- `kernel_threads`: the original affinity of each unbound kernel thread it pinned (`--kthreads`);
- `irqs`: the original affinity of each IRQ it moved (`--irqs`; `default` is
  /proc/irq/default_smp_affinity);
- `enabled`: cgroup v2 groups in whose `cgroup.subtree_control` the shield enabled `cpuset`.

The CPUs themselves are not recorded: the system set is derived from the pools every time
(`corepin.enforcement.shield.control.system_cpus`), so it follows every allocation change.

Values are immutable and validate themselves; `to_json` / `from_json` are the checkpoint form
(lists of small arrays, so a shield over a thousand tasks stays a small file).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

from corepin.core.cpuset import CPUSet
from corepin.core.errors import CPUSetParseError, RequestError
from corepin.core.record import record, replace

#: How the shield keeps tasks off exclusive CPUs.
MODES: Final = ("cpuset", "affinity")
#: Name of the shield's group for the tasks it moves (below the scope).
SYSTEM_GROUP: Final = "corepin.system"
#: Name of the shield's group for managed processes that had to leave a narrowed group.
MANAGED_GROUP: Final = "corepin.managed"


def _check_path(where: str, value: object) -> str:
    if not isinstance(value, str) or len(value) > 4096:
        raise RequestError(f"{where}: expected a cgroup path, got {value!r}")
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in value):
        raise RequestError(f"{where}: cgroup path {value!r} contains control characters")
    return value


def _check_int(where: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise RequestError(f"{where}: expected a non-negative integer, got {value!r}")
    return value


def _cpus(where: str, value: object) -> CPUSet:
    if isinstance(value, CPUSet):
        return value
    if not isinstance(value, str):
        raise RequestError(f"{where}: expected a CPU list, got {value!r}")
    try:
        return CPUSet.parse(value)
    except CPUSetParseError as exc:
        raise RequestError(f"{where}: {exc.problem}") from None


@record
class MovedTask:
    """A task the shield moved: pid, start time, and the cgroup it came from."""

    pid: int
    start_time: int
    origin: str

    def __post_init__(self) -> None:
        _check_int("moved task pid", self.pid)
        _check_int(f"moved task {self.pid} start time", self.start_time)
        _check_path(f"moved task {self.pid} origin", self.origin)


@record
class SavedAffinity:
    """The affinity a task (or kernel thread) had before the shield pinned it."""

    pid: int
    start_time: int
    cpus: CPUSet

    def __post_init__(self) -> None:
        _check_int("pinned task pid", self.pid)
        _check_int(f"pinned task {self.pid} start time", self.start_time)
        object.__setattr__(self, "cpus", _cpus(f"pinned task {self.pid} cpus", self.cpus))


@record
class RestrictedGroup:
    """A cgroup below the scope narrowed in place, with its original `cpuset.cpus` text."""

    path: str
    cpus: str

    def __post_init__(self) -> None:
        _check_path("restricted group", self.path)
        _cpus(f"restricted group {self.path!r} cpus", self.cpus)


@record
class SavedIrq:
    """An IRQ (its number, or `default`) with the affinity it had before the shield."""

    irq: str
    cpus: CPUSet

    def __post_init__(self) -> None:
        if not isinstance(self.irq, str) or not (self.irq.isdigit() or self.irq == "default"):
            raise RequestError(f"IRQ must be a number or 'default', got {self.irq!r}")
        object.__setattr__(self, "cpus", _cpus(f"IRQ {self.irq} cpus", self.cpus))


@record
class ShieldRecord:
    """An active shield (see the module docstring)."""

    scope: str = ""
    mode: str = "cpuset"
    cgroup_version: int = 0
    kthreads: bool = False
    irqs: bool = False
    since: float = 0.0
    excluded: tuple[str, ...] = ()
    enabled: tuple[str, ...] = ()
    moved: tuple[MovedTask, ...] = ()
    restricted: tuple[RestrictedGroup, ...] = ()
    tasks: tuple[SavedAffinity, ...] = ()
    kernel_threads: tuple[SavedAffinity, ...] = ()
    irq_affinity: tuple[SavedIrq, ...] = ()

    def __post_init__(self) -> None:
        _check_path("shield scope", self.scope)
        if self.mode not in MODES:
            raise RequestError(f"shield mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.cgroup_version not in (0, 1, 2):
            raise RequestError(f"shield cgroup version must be 0, 1 or 2: {self.cgroup_version!r}")
        if (self.mode == "cpuset") != (self.cgroup_version in (1, 2)):
            raise RequestError("a cpuset shield names cgroup version 1 or 2, an affinity one 0")
        for flag in ("kthreads", "irqs"):
            if not isinstance(getattr(self, flag), bool):
                raise RequestError(f"shield {flag} must be true or false")
        for name in ("excluded", "enabled"):
            items = tuple(getattr(self, name))
            for item in items:
                _check_path(f"shield {name}", item)
            object.__setattr__(self, name, items)
        for name, kind in (
            ("moved", MovedTask),
            ("restricted", RestrictedGroup),
            ("tasks", SavedAffinity),
            ("kernel_threads", SavedAffinity),
            ("irq_affinity", SavedIrq),
        ):
            items = tuple(getattr(self, name))
            if any(not isinstance(i, kind) for i in items):
                raise RequestError(f"shield {name} must hold {kind.__name__} values")
            object.__setattr__(self, name, items)

    # ------------------------------------------------------------------ groups
    def group(self, name: str) -> str:
        """The path of one of the shield's groups (`SYSTEM_GROUP`, `MANAGED_GROUP`)."""
        return f"{self.scope}/{name}" if self.scope else name

    @property
    def system_group(self) -> str:
        return self.group(SYSTEM_GROUP)

    @property
    def managed_group(self) -> str:
        return self.group(MANAGED_GROUP)

    def origin_of(self, pid: int, start_time: int) -> str | None:
        """The group a moved task came from (None: not moved by the shield)."""
        for task in self.moved:
            if task.pid == pid and task.start_time == start_time:
                return task.origin
        return None

    def evolve(self, **changes: object) -> ShieldRecord:
        return replace(self, **changes)

    # ------------------------------------------------------------------ checkpoint form
    def to_json(self) -> dict[str, Any]:
        return {
            "scope": self.scope,
            "mode": self.mode,
            "cgroup_version": self.cgroup_version,
            "kthreads": self.kthreads,
            "irqs": self.irqs,
            "since": self.since,
            "excluded": list(self.excluded),
            "enabled": list(self.enabled),
            "moved": [[t.pid, t.start_time, t.origin] for t in self.moved],
            "restricted": [[g.path, g.cpus] for g in self.restricted],
            "tasks": [[t.pid, t.start_time, str(t.cpus)] for t in self.tasks],
            "kernel_threads": [[t.pid, t.start_time, str(t.cpus)] for t in self.kernel_threads],
            "irq_affinity": [[i.irq, str(i.cpus)] for i in self.irq_affinity],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ShieldRecord:
        """The record from its checkpoint form; RequestError naming the bad part."""
        if not isinstance(data, Mapping):
            raise RequestError(f"shield: expected an object, got {type(data).__name__}")

        def rows(key: str, width: int) -> list[list[Any]]:
            value = data.get(key, [])
            if not isinstance(value, list) or any(
                not isinstance(r, list) or len(r) != width for r in value
            ):
                raise RequestError(f"shield.{key}: expected a list of {width}-element lists")
            return value

        def texts(key: str) -> tuple[str, ...]:
            value = data.get(key, [])
            if not isinstance(value, list) or any(not isinstance(v, str) for v in value):
                raise RequestError(f"shield.{key}: expected a list of strings")
            return tuple(value)

        since = data.get("since", 0.0)
        if isinstance(since, bool) or not isinstance(since, (int, float)):
            raise RequestError(f"shield.since: expected a number, got {since!r}")
        return cls(
            scope=data.get("scope", ""),
            mode=data.get("mode", ""),
            cgroup_version=data.get("cgroup_version", -1),
            kthreads=data.get("kthreads", False),
            irqs=data.get("irqs", False),
            since=float(since),
            excluded=texts("excluded"),
            enabled=texts("enabled"),
            moved=tuple(MovedTask(*r) for r in rows("moved", 3)),
            restricted=tuple(RestrictedGroup(*r) for r in rows("restricted", 2)),
            tasks=tuple(SavedAffinity(*r) for r in rows("tasks", 3)),
            kernel_threads=tuple(SavedAffinity(*r) for r in rows("kernel_threads", 3)),
            irq_affinity=tuple(SavedIrq(*r) for r in rows("irq_affinity", 2)),
        )


def merge_moved(old: Iterable[MovedTask], new: Iterable[MovedTask]) -> tuple[MovedTask, ...]:
    """`old` plus `new` (one entry per (pid, start time); the first origin recorded wins)."""
    out: dict[tuple[int, int], MovedTask] = {}
    for task in (*old, *new):
        out.setdefault((task.pid, task.start_time), task)
    return tuple(sorted(out.values(), key=lambda t: (t.pid, t.start_time)))


def merge_saved(
    old: Iterable[SavedAffinity], new: Iterable[SavedAffinity]
) -> tuple[SavedAffinity, ...]:
    """`old` plus `new` (one entry per (pid, start time); the first affinity recorded wins)."""
    out: dict[tuple[int, int], SavedAffinity] = {}
    for task in (*old, *new):
        out.setdefault((task.pid, task.start_time), task)
    return tuple(sorted(out.values(), key=lambda t: (t.pid, t.start_time)))
