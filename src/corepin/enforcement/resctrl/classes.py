"""resctrl classes of the node QoS policy: one group per QoS class, its tasks, what it holds.

`ResctrlClasses` turns the per-class percent policy (`ClassPolicy`: L3 ways as a percent range,
memory bandwidth as a percent) into resctrl groups named `corepin-<class>` (lower case:
`corepin-be`). A class whose policy is the whole machine (L3 0-100 % or none, MBA 100 % or
none) has no group: its tasks stay in the root group, as everything does that nobody placed.
A resource the machine does not offer (no `info/L3*`, no `MB` line) is left out of a class's
policy, with a note; a class left with nothing to restrict has no group either.

- `apply(policies)` makes and updates the groups (the schemata per cache id and MBA domain come
  from `ResctrlWriter.apply_policy`, which writes only what differs) and removes the groups of
  classes back at the default (their tasks fall back to the root group, as the kernel does).
  Groups corepin did not make (names not starting `corepin-`) are never touched, nor
  `corepin-*` groups that are not a class's. The same policies applied twice write nothing.
- `assign(cls, tids)` writes tasks to the class's group (only those not there yet); a task of a
  class at the default that sits in one of corepin's groups is written back to the root group.
- `threads_of(pids, proc_root)` / `cgroup_threads(path)`: the thread ids to assign.
- `describe()` / `samples()`: each class group's cache ways, bandwidth values and monitoring
  counters, read from the filesystem (so another process, `corepin report`, sees the same).

`open_resctrl(root, ...)` gives None and a one-line note when resctrl is not mounted at `root`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Final, NamedTuple

from corepin.allocation.qos.policy import ClassPolicy
from corepin.core.ids import validate_pid
from corepin.core.qos import CLASSES, RESCTRL_GROUP_PREFIX, check_class, resctrl_group
from corepin.core.record import record
from corepin.enforcement.note import Change, Note
from corepin.enforcement.resctrl.model import ResctrlError, parse_schemata, read_text
from corepin.enforcement.resctrl.monitor import MonSample, read_monitoring
from corepin.enforcement.resctrl.writer import ResctrlFs, ResctrlWriter

__all__ = [
    "GROUP_PREFIX",
    "ClassView",
    "ResctrlClasses",
    "ResctrlSamples",
    "cgroup_threads",
    "group_name",
    "is_default",
    "open_resctrl",
    "threads_of",
]

GROUP_PREFIX: Final = RESCTRL_GROUP_PREFIX
_FULL_L3: Final = (0, 100)
_FULL_MBA: Final = 100
#: how many task ids a note names before it only counts them
_NAMED: Final = 8


def group_name(qos_class: str) -> str:
    """The resctrl group of `qos_class` (validated): `corepin-<class>`, lower case
    (`corepin.core.qos.resctrl_group`)."""
    return resctrl_group(qos_class)


def is_default(policy: ClassPolicy) -> bool:
    """Whether `policy` is the whole machine: L3 0-100 % (or not set) and MBA 100 % (or not
    set). Such a class has no group of its own."""
    return policy.l3_percent in (None, _FULL_L3) and policy.mba_percent in (None, _FULL_MBA)


def threads_of(pids: Iterable[int], proc_root: str | os.PathLike[str] = "/proc") -> list[int]:
    """Every thread id of the processes `pids` (`<proc_root>/<pid>/task/*`), in the order of
    `pids`, each once; processes that are gone are skipped."""
    out: list[int] = []
    seen: set[int] = set()
    for pid in pids:
        folder = Path(proc_root) / str(validate_pid(pid)) / "task"
        try:
            names = os.listdir(folder)
        except (FileNotFoundError, ProcessLookupError, NotADirectoryError):
            continue
        except OSError as err:
            raise ResctrlError(os.fspath(folder), f"unreadable: {err.strerror or err}") from err
        for tid in sorted(int(n) for n in names if n.isdigit()):
            if tid not in seen:
                seen.add(tid)
                out.append(tid)
    return out


def cgroup_threads(path: str | os.PathLike[str]) -> list[int]:
    """Every thread id in cgroup directory `path` and the cgroups below it (v2
    `cgroup.threads`, v1 `tasks`), each once; a cgroup removed meanwhile is skipped."""
    out: list[int] = []
    seen: set[int] = set()
    for folder, dirs, files in os.walk(path):
        dirs.sort()
        name = "cgroup.threads" if "cgroup.threads" in files else "tasks"
        try:
            text = read_text(Path(folder) / name)
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError as err:
            raise ResctrlError(os.path.join(folder, name), f"unreadable: {err}") from err
        for item in text.split():
            tid = int(item)
            if tid not in seen:
                seen.add(tid)
                out.append(tid)
    return out


@record
class ClassView:
    """One class group as the filesystem shows it: the cache mask and its number of ways per
    cache id, the MB value per domain (`mb_unit`: percent or absolute), and the monitoring
    counters per cache id (empty when the machine has no monitoring)."""

    qos_class: str
    group: str
    l3_masks: Mapping[int, str]
    l3_ways: Mapping[int, int]
    mb: Mapping[int, int]
    mb_unit: str | None
    monitoring: Mapping[int, MonSample]

    def to_json(self) -> dict[str, Any]:
        return {
            "class": self.qos_class,
            "group": self.group,
            "l3": {str(d): {"mask": m, "ways": self.l3_ways[d]} for d, m in self.l3_masks.items()},
            "mb": {str(d): v for d, v in self.mb.items()},
            "mbUnit": self.mb_unit,
            "monitoring": {
                str(d): {
                    "llcOccupancyBytes": s.llc_occupancy,
                    "mbmTotalBytes": s.mbm_total_bytes,
                    "mbmLocalBytes": s.mbm_local_bytes,
                }
                for d, s in self.monitoring.items()
            },
        }


class ResctrlSamples(NamedTuple):
    """Metric samples, label values in the metrics' label order, the value last:
    `occupancy` for `corepin_resctrl_llc_occupancy_bytes{class,cache_id}`, `bandwidth` for
    `corepin_resctrl_memory_bandwidth_bytes_total{class,domain,scope}` (scope total|local).
    Counters the kernel does not give (Unavailable, Error, not offered) are left out."""

    occupancy: list[tuple[str, str, int]]
    bandwidth: list[tuple[str, str, str, int]]


class ResctrlClasses:
    """The QoS classes' resctrl groups on the filesystem of `writer`."""

    def __init__(self, writer: ResctrlWriter, proc_root: str | os.PathLike[str] = "/proc"):
        self.writer = writer
        self.proc_root = proc_root
        self._groups: dict[str, str] | None = None  # class -> group, once known
        self._dir_ops = 0

    @property
    def root(self) -> Path:
        return self.writer.root

    @property
    def writes(self) -> int:
        """Writes made so far: schemata and tasks lines, groups made and removed."""
        return self.writer.writes + self._dir_ops

    # ------------------------------------------------------------------ groups
    def _on_disk(self) -> dict[str, str]:
        """class -> group for the `corepin-<class>` groups that exist now."""
        present = set(self.writer.classes())
        return {c: group_name(c) for c in CLASSES if group_name(c) in present}

    def _known(self) -> dict[str, str]:
        if self._groups is None:
            self._groups = self._on_disk()
        return self._groups

    def _effective(self, qos_class: str, policy: ClassPolicy) -> tuple[ClassPolicy, list[Note]]:
        """`policy` without what the machine cannot do (with a note for each)."""
        info = self.writer.info
        notes: list[Note] = []
        l3, mba = policy.l3_percent, policy.mba_percent
        target = f"resctrl/{group_name(qos_class)}"
        if l3 not in (None, _FULL_L3) and info.cbm_mask is None:
            notes.append(Note("left", target, f"{qos_class} l3Percent: no L3 cache allocation"))
            l3 = None
        if mba not in (None, _FULL_MBA) and info.mb_unit is None:
            notes.append(
                Note("left", target, f"{qos_class} mbaPercent: no memory bandwidth allocation")
            )
            mba = None
        return ClassPolicy(l3, mba), notes

    def apply(self, policies: Mapping[str, ClassPolicy]) -> list[Note]:
        """Make the groups hold `policies` (class -> policy; a class not named is at the
        default). Groups of classes at the default are removed first (freeing their CLOSIDs),
        then the others are made or updated. A refused write raises ResctrlError; a group made
        by this call whose schemata the kernel refused is removed again."""
        info = self.writer.info
        wanted: dict[str, ClassPolicy] = {}
        notes: list[Note] = []
        for key, policy in policies.items():
            name = check_class(key, "resctrl class")
            effective, left = self._effective(name, policy)
            notes.extend(left)
            if is_default(effective):
                continue
            # what is not set is the whole machine: a group narrowed before is widened again
            l3 = effective.l3_percent or _FULL_L3
            mba = effective.mba_percent or _FULL_MBA
            wanted[name] = ClassPolicy(
                l3 if info.cbm_mask is not None else None,
                mba if info.mb_unit is not None else None,
            )
        groups = self._on_disk()
        self._groups = groups
        for qos_class, group in list(groups.items()):
            if qos_class in wanted:
                continue
            self.writer.remove_class(group)
            self._dir_ops += 1
            del groups[qos_class]
            notes.append(
                Note(
                    "removed",
                    f"resctrl/{group}",
                    f"{qos_class} is back at the whole machine; "
                    "its tasks fall back to the root group",
                )
            )
        for qos_class in CLASSES:
            if qos_class in wanted:
                notes.extend(self._apply_one(qos_class, wanted[qos_class], groups))
        return notes

    def _apply_one(self, qos_class: str, policy: ClassPolicy, groups: dict[str, str]) -> list[Note]:
        group = group_name(qos_class)
        made = qos_class not in groups
        try:
            changes = self.writer.apply_policy(group, policy)
        except ResctrlError:
            if made and (self.root / group).is_dir():
                self.writer.remove_class(group)
            raise
        groups[qos_class] = group
        notes: list[Note] = []
        for change in changes:
            if change.what == "mkdir":
                self._dir_ops += 1
                notes.append(Note("created", f"resctrl/{group}", f"group of class {qos_class}"))
            else:
                notes.append(_schemata_note(change))
        return notes

    def group_of(self, qos_class: str) -> str | None:
        """The group of `qos_class`; None when the class is at the default (its tasks stay in
        the root group)."""
        return self._known().get(check_class(qos_class))

    # ------------------------------------------------------------------ tasks
    def assign(self, qos_class: str, tids: Iterable[int]) -> list[Note]:
        """Put the tasks `tids` in `qos_class`'s group (only those not there yet; tasks that
        are gone are skipped). A task moves from another class's group by this write, as the
        kernel does. For a class at the default, tasks found in one of corepin's groups go back
        to the root group; others are left where they are (nothing written)."""
        name = check_class(qos_class)
        groups = self._known()
        group = groups.get(name)
        if group is not None:
            changes = self.writer.assign_tasks(group, tids)
            target = f"resctrl/{group}"
        else:
            wanted = list(tids)
            ours: set[int] = set()
            for other in groups.values():
                ours.update(self.writer.tasks(other))
            changes = self.writer.release_tasks(t for t in wanted if t in ours)
            target = "resctrl (root group)"
        if not changes:
            return []
        ids = [c.new for c in changes]
        named = ", ".join(ids[:_NAMED]) + (
            f" and {len(ids) - _NAMED} more" if len(ids) > _NAMED else ""
        )
        return [Note("moved", target, f"{len(ids)} task(s) of class {name}: {named}")]

    def threads_of(
        self, pids: Iterable[int], proc_root: str | os.PathLike[str] | None = None
    ) -> list[int]:
        """Every thread of the processes `pids` (see the module function)."""
        return threads_of(pids, self.proc_root if proc_root is None else proc_root)

    def cgroup_threads(self, path: str | os.PathLike[str]) -> list[int]:
        return cgroup_threads(path)

    # ------------------------------------------------------------------ what is there
    def describe(self) -> list[ClassView]:
        """Each class group on the filesystem now, in class order."""
        info = self.writer.info
        views: list[ClassView] = []
        for qos_class, group in self._on_disk().items():
            shown = parse_schemata(read_text(self.root / group / "schemata"))
            masks = {d: f"{int(v, 16):x}" for d, v in shown.get(info.l3_resources[0], {}).items()}
            try:
                monitoring = read_monitoring(self.root, group)
            except ResctrlError:
                monitoring = {}
            views.append(
                ClassView(
                    qos_class=qos_class,
                    group=group,
                    l3_masks=masks,
                    l3_ways={d: int(m, 16).bit_count() for d, m in masks.items()},
                    mb={d: int(v) for d, v in shown.get("MB", {}).items()},
                    mb_unit=info.mb_unit,
                    monitoring=monitoring,
                )
            )
        return views

    def samples(self) -> ResctrlSamples:
        """The metric samples of every class group (see `ResctrlSamples`)."""
        occupancy: list[tuple[str, str, int]] = []
        bandwidth: list[tuple[str, str, str, int]] = []
        for view in self.describe():
            for cache_id, sample in view.monitoring.items():
                where = str(cache_id)
                if sample.llc_occupancy is not None:
                    occupancy.append((view.qos_class, where, sample.llc_occupancy))
                if sample.mbm_total_bytes is not None:
                    bandwidth.append((view.qos_class, where, "total", sample.mbm_total_bytes))
                if sample.mbm_local_bytes is not None:
                    bandwidth.append((view.qos_class, where, "local", sample.mbm_local_bytes))
        return ResctrlSamples(occupancy, bandwidth)


def _schemata_note(change: Change) -> Note:
    return Note("resized", change.path, f"{change.new} (was {change.old})")


def open_resctrl(
    root: str | os.PathLike[str],
    proc_root: str | os.PathLike[str] = "/proc",
    vendor: str | None = None,
    fs: ResctrlFs | None = None,
) -> tuple[ResctrlClasses | None, str | None]:
    """The classes on the resctrl filesystem mounted at `root`, or (None, a one-line note)
    when there is none there. The CPU vendor comes from `<proc_root>/cpuinfo` unless given."""
    path = Path(root)
    if not (path / "schemata").is_file() or not (path / "info").is_dir():
        return None, (
            f"no resctrl filesystem at {path} (mount -t resctrl resctrl {path}; needs RDT/PQoS "
            "in CPU and kernel): cache and memory bandwidth classes are off"
        )
    if fs is None:
        writer = ResctrlWriter(path, vendor=vendor, proc_root=Path(proc_root))
    else:
        writer = ResctrlWriter(path, vendor=vendor, fs=fs, proc_root=Path(proc_root))
    writer.info  # noqa: B018  - read the machine facts now: an unreadable tree fails here
    return ResctrlClasses(writer, proc_root), None
