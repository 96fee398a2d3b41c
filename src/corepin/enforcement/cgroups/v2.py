"""cgroup v2: the unified hierarchy (cpuset.cpus, cpuset.mems and cpu.max in one tree), with
what only v2 has: controllers handed down through `cgroup.subtree_control`, threaded subtrees,
and cpuset partitions (`PartitionState`).
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterable
from typing import Final

from corepin.core.cpuset import CPUSet
from corepin.core.errors import CgroupError
from corepin.core.ids import split_cgroup_path
from corepin.core.record import field, record
from corepin.enforcement.cgroups.driver import (
    DEFAULT_PERIOD_US,
    UNPARSEABLE,
    CgroupDriver,
    CpuQuota,
    processes_of,
    read_text,
)

__all__ = ["PARTITION_MODES", "CgroupV2", "PartitionState"]


@record(frozen=False, slots=False)
class CgroupV2(CgroupDriver):
    """cgroup v2 (unified): cpuset.cpus, cpuset.mems and cpu.max in one tree at `root`.

    An empty cpuset.cpus in v2 means "inherit the parent's"; the effective set is in
    cpuset.cpus.effective.
    """

    #: the controllers `create` enables for the children of each parent it walks through
    controllers: tuple[str, ...] = field(default=("cpuset", "cpu"), kw_only=True)
    #: refuse to enable controllers in a (non-root, domain) group that holds processes (host
    #: mode sets it: see `enable_controllers`)
    guard_processes: bool = field(default=False, kw_only=True)

    def __post_init__(self) -> None:
        self.version = 2
        self.root = os.fspath(self.root)

    def effective_cpus(self, path: str) -> CPUSet:
        return self._read_set(path, "cpuset.cpus.effective")

    def effective_mems(self, path: str) -> CPUSet:
        return self._read_set(path, "cpuset.mems.effective")

    def has_cpu_controller(self) -> bool:
        return True

    def read_quota(self, path: str) -> CpuQuota:
        text = self.read_file(path, "cpu.max")
        quota, _, period = text.partition(" ")
        try:
            return CpuQuota(
                None if quota == "max" else int(quota),
                int(period) if period else DEFAULT_PERIOD_US,
            )
        except ValueError as err:
            raise CgroupError(
                os.path.join(self.dir(path), "cpu.max"),
                f"unparseable value {text!r}",
                reason=UNPARSEABLE,
            ) from err

    def read_quota_fast(self, path: str, want: CpuQuota) -> CpuQuota | None:
        try:
            got = self.read_quota(path)
        except CgroupError as err:
            if err.reason == UNPARSEABLE:
                return None
            raise
        return got if want.period_us is not None else CpuQuota(got.quota_us, None)

    def write_quota(self, path: str, quota: CpuQuota) -> None:
        self.write_file(path, "cpu.max", str(quota))

    def enable_controllers(self, path: str, controllers: Iterable[str]) -> None:
        """Make `controllers` available to the children of `path` (cgroup.subtree_control).

        `cpuset` is required; any other controller is enabled only when `path` offers it
        (its cgroup.controllers), so a host without, say, the cpu controller still gets
        cpuset groups.

        With `guard_processes`, a plain (domain) group below the root that holds processes is
        refused with a CgroupError (cgroup_has_processes), nothing written: v2 lets such a group
        enable
        cpuset or cpu, but then silently makes it the root of a threaded subtree
        (`domain threaded`), and every domain child it has or gets becomes `domain invalid`,
        unable to hold processes - someone else's group would change type by our write."""
        try:
            text = self.read_file(path, "cgroup.subtree_control")
            current = {c.lstrip("+") for c in text.split()}
        except CgroupError:
            current = set()
        wanted = [c for c in controllers if c not in current]
        if not wanted:
            return
        try:
            offered: set[str] | None = set(self.read_file(path, "cgroup.controllers").split())
        except CgroupError:
            offered = None
        missing = [c for c in wanted if c == "cpuset" or offered is None or c in offered]
        if not missing:
            return
        if self.guard_processes and split_cgroup_path(path) and self.group_type(path) == "domain":
            try:
                pids = self.procs(path)
            except CgroupError as err:
                if err.reason != "cgroup_missing":
                    raise
                pids = []  # a tree standing in for cgroupfs, made without the file
            if pids:
                shown = " ".join(map(str, pids[:5])) + (" ..." if len(pids) > 5 else "")
                raise CgroupError(
                    os.path.join(self.dir(path), "cgroup.subtree_control"),
                    f"not enabling {' '.join(missing)}: the group holds processes ({shown}); "
                    "cgroup v2 hands controllers to child groups only from a group without "
                    "processes of its own (enabling them here would turn it into a threaded "
                    "subtree root): move those processes out, or use --cgroups off",
                    reason="cgroup_has_processes",
                )
        self.write_file(path, "cgroup.subtree_control", " ".join(f"+{c}" for c in missing))

    def group_type(self, path: str) -> str:
        """The group's `cgroup.type`: `domain`, `domain threaded` (root of a threaded subtree),
        `threaded` or `domain invalid`; the hierarchy root (which has no such file) and a tree
        standing in for cgroupfs without one are `domain`."""
        if not split_cgroup_path(path):
            return "domain"
        try:
            return self.read_file(path, "cgroup.type")
        except CgroupError as err:
            if err.reason == "cgroup_missing" and self.exists(path):
                return "domain"
            raise

    def create(self, path: str) -> list[str]:
        """mkdir `path` (and missing ancestors), enabling `controllers` in the
        cgroup.subtree_control of every group on the way down where they are not yet (groups
        that are already there included: one made by someone else may not hand cpuset down).
        A new group whose parent is `threaded` or `domain threaded` is made `threaded` itself:
        a domain group there is invalid (it can hold no processes). A new v2 group starts with
        empty cpuset.cpus and cpuset.mems: it uses its parent's effective sets until they are
        written."""
        parts = split_cgroup_path(path)
        created: list[str] = []
        for depth in range(1, len(parts) + 1):
            parent = "/".join(parts[: depth - 1])
            rel = "/".join(parts[:depth])
            self.enable_controllers(parent, self.controllers)
            if self._mkdir(rel, self.root):
                created.append(rel)
                if self.fake_tree:
                    self._fake_seed(rel)
                if parent and self.group_type(parent) in ("threaded", "domain threaded"):
                    self.write_file(rel, "cgroup.type", "threaded")
        return created

    def procs(self, path: str) -> list[int]:
        """The processes in the group. A threaded group's cgroup.procs cannot be read
        (EOPNOTSUPP): there the processes are those of its threads (cgroup.threads)."""
        file = os.path.join(self.dir(path), "cgroup.procs")
        try:
            text = read_text(file)
        except OSError as err:
            if err.errno != errno.EOPNOTSUPP:
                return CgroupDriver.procs(self, path)  # raises the CgroupError for it
            return processes_of(self.read_file(path, "cgroup.threads").split())
        return [int(x) for x in text.split()]

    def _fake_kernel_check(self, path: str, name: str, value: str) -> int | None:
        """v2 refuses a burst (cpu.max.burst) above a finite quota (cpu.max)."""
        if name not in ("cpu.max", "cpu.max.burst") or not os.path.exists(
            os.path.join(self.dir(path), "cpu.max.burst")
        ):
            return None
        try:
            word = (value if name == "cpu.max" else self.read_file(path, "cpu.max")).split()[0]
            quota = None if word == "max" else int(word)
            burst = int(value if name == "cpu.max.burst" else self.read_file(path, "cpu.max.burst"))
        except (IndexError, ValueError):
            return errno.EINVAL
        if burst < 0 or (quota is not None and burst > quota):
            return errno.EINVAL
        return None

    def _fake_seed(self, path: str) -> None:
        for name, value in (
            ("cpuset.cpus", ""),
            ("cpuset.mems", ""),
            ("cpu.max", "max 100000"),
            ("cgroup.procs", ""),
            ("cgroup.subtree_control", ""),
            ("cgroup.controllers", "cpuset cpu"),
            ("cpuset.cpus.partition", "member"),
        ):
            file = os.path.join(self.dir(path), name)
            if not os.path.exists(file):
                with open(file, "w", encoding="ascii") as handle:
                    handle.write(value + "\n")

    def remove(self, path: str) -> None:
        if not split_cgroup_path(path):
            raise CgroupError(os.fspath(self.root), "refusing to remove the hierarchy root")
        self._rmdir(path, self.root)

    # ------------------------------------------------------------------ partitions
    def read_partition(self, path: str) -> PartitionState:
        """The group's `cpuset.cpus.partition` (kernels before 5.2 have none: member)."""
        try:
            text = self.read_file(path, "cpuset.cpus.partition")
        except CgroupError as err:
            if err.reason == "cgroup_missing" and self.exists(path):
                return PartitionState("member")
            raise
        return PartitionState.parse(text)

    def set_partition(self, path: str, mode: str) -> PartitionState:
        """Write `mode` (member, root, isolated) to the group's `cpuset.cpus.partition` and
        read back what the kernel made of it: a partition the kernel cannot honour is left
        `root invalid (<why>)` by some kernels and refused with EINVAL by others; both come
        back as an invalid PartitionState (a refused write gives the errno's text as the
        reason), never as an exception. Other failures (no such group, no permission) raise
        CgroupError."""
        if mode not in PARTITION_MODES:
            raise ValueError(f"unknown partition mode {mode!r} (one of {PARTITION_MODES})")
        try:
            self.write_file(path, "cpuset.cpus.partition", mode)
        except CgroupError as err:
            if err.reason != "cgroup_invalid_value":
                raise
            return PartitionState(mode, valid=False, reason="the kernel refused it (EINVAL)")
        return self.read_partition(path)


#: the values of cgroup v2 `cpuset.cpus.partition`
PARTITION_MODES: Final = ("member", "root", "isolated")


@record
class PartitionState:
    """What `cpuset.cpus.partition` says: `mode` (member, root, isolated), whether the kernel
    holds it `valid`, and the kernel's `reason` when not (`root invalid (Cpu list in
    cpuset.cpus not exclusive)`; older kernels give no reason)."""

    mode: str
    valid: bool = True
    reason: str | None = None

    @classmethod
    def parse(cls, text: str) -> PartitionState:
        words = text.strip()
        mode, _, rest = words.partition(" ")
        rest = rest.strip()
        if not rest:
            return cls(mode or "member")
        if rest.startswith("invalid"):
            reason = rest[len("invalid") :].strip()
            if reason.startswith("(") and reason.endswith(")"):
                reason = reason[1:-1]
            return cls(mode, valid=False, reason=reason or None)
        return cls(mode, valid=False, reason=rest)

    @property
    def exclusive(self) -> bool:
        """True for a valid root or isolated partition (its CPUs serve nobody else)."""
        return self.valid and self.mode in ("root", "isolated")

    def __str__(self) -> str:
        if self.valid:
            return self.mode
        return f"{self.mode} invalid" + (f" ({self.reason})" if self.reason else "")
