"""The best-effort group's cpuset: one CPU set written to the BE group and every group below it.

cgroup v1 refuses a cpuset outside its parent's (EACCES) and a parent dropping CPUs a child
uses (EBUSY), so a change is made in two passes: CPUs are added top-down (the group, then its
children), removed bottom-up (the children, then the group); a change that both adds and removes
CPUs takes a write in each pass. cgroup v2 takes any order (a child's CPUs outside its parent's
are masked), so each group is written once, top-down.

A child whose `cpuset.cpus` is empty is left alone: on v2 it inherits its parent's CPUs (and so
follows the BE group), on v1 it can hold no task. `cpuset.mems` is never touched. Every write
is one `Note`; a group that vanished between the walk and the write is a problem line.
"""

from __future__ import annotations

from collections.abc import Mapping

from corepin.core.cpuset import CPUSet
from corepin.core.errors import CgroupError, CPUSetParseError
from corepin.enforcement.cgroups import CgroupDriver
from corepin.enforcement.note import Note

__all__ = ["TreeWrite", "read_tree", "write_tree"]


class TreeWrite:
    """What one pass over the tree did: the writes (`notes`) and the `problems`."""

    __slots__ = ("notes", "problems")

    def __init__(self) -> None:
        self.notes: list[Note] = []
        self.problems: list[str] = []


def _subtree(driver: CgroupDriver, group: str) -> list[str]:
    """`group` and every group below it, parents before children."""
    out = [group]
    index = 0
    while index < len(out):
        out[index + 1 : index + 1] = driver.child_groups(out[index])
        index += 1
    return out


def read_tree(driver: CgroupDriver, group: str) -> dict[str, CPUSet] | None:
    """group -> its cpuset.cpus for `group` (always, even empty) and every group below it
    whose cpuset.cpus is not empty, parents before children. None when `group` is not there."""
    out: dict[str, CPUSet] = {}
    for path in _subtree(driver, group):
        try:
            text = driver.read_cpus_text(path)
            cpus = CPUSet.parse(text)
        except CgroupError:
            if path == group:
                return None
            continue  # (a child that vanished while we walked)
        except CPUSetParseError:
            continue
        if cpus or path == group:
            out[path] = cpus
    return out


def _write(
    driver: CgroupDriver,
    path: str,
    old: CPUSet,
    new: CPUSet,
    action: str,
    why: str,
    out: TreeWrite,
    fallback: CPUSet | None = None,
) -> bool:
    try:
        driver.write_cpus(path, new)
    except CgroupError as err:
        if not new and fallback and err.reason == "cgroup_empty_cpuset":
            # v2 keeps a group with tasks in it or below it from going empty (ENOSPC)
            return _write(driver, path, old, fallback, action, f"{why}; it has tasks", out)
        gone = err.reason == "cgroup_missing"
        out.problems.append(
            f"{path}: the group vanished before its cpuset could be written"
            if gone
            else f"{path}: cpuset.cpus {new or '(empty)'} not written: {err.message}"
        )
        return False
    out.notes.append(
        Note(action, path, f"cpuset.cpus {old or '(empty)'} -> {new or '(empty)'} ({why})")
    )
    return True


def write_tree(
    driver: CgroupDriver,
    current: Mapping[str, CPUSet],
    wanted: Mapping[str, CPUSet],
    *,
    action: str,
    why: str,
    fallback: Mapping[str, CPUSet] | None = None,
) -> TreeWrite:
    """Write `wanted[path]` to every group of `current` (as `read_tree` gave it, parents first)
    that holds something else, in the order the hierarchy's version needs. An empty value
    (v2: inherit the parent's) that the kernel refuses because the group holds tasks is
    replaced by `fallback[path]` when there is one."""
    out = TreeWrite()
    now = dict(current)
    order = [p for p in current if p in wanted]
    if driver.version == 1:
        for path in order:  # add CPUs top-down
            grown = now[path] | wanted[path]
            if grown != now[path] and _write(driver, path, now[path], grown, action, why, out):
                now[path] = grown
        for path in reversed(order):  # then drop CPUs bottom-up
            if now[path] != wanted[path]:
                _write(driver, path, now[path], wanted[path], action, why, out)
        return out
    for path in order:
        if now[path] != wanted[path]:
            spare = fallback.get(path) if fallback is not None else None
            _write(driver, path, now[path], wanted[path], action, why, out, spare)
    return out
