"""cgroup drivers for v1 (one mount per controller) and v2 (the unified hierarchy).

A driver reads and writes the cpuset and CPU-bandwidth files of cgroups given by a path RELATIVE
to the hierarchy root (`kubepods/burstable/pod<uid>/<id>`). Every relative path is split and
validated by `corepin.core.ids.split_cgroup_path` before any file is touched, so a path holding
`..`, NUL or characters outside the expected alphabet is rejected, never written to.

The mount roots are parameters (`CgroupV1(cpuset_root, cpu_root)`, `CgroupV2(root)`), so the same
code drives a fake tree in a temp dir and the real `/sys/fs/cgroup/cpuset`. `detect_mounts` reads
them from a mountinfo file and `open_cgroups` picks the hierarchy that carries the cpuset
controller.

Kernel errors of writes are mapped to `CgroupError` with a `reason`:

- EBUSY -> cgroup_busy: a child cpuset uses CPUs/nodes the new value drops (shrink children
  first), or rmdir of a group that still has tasks or children.
- ENOSPC -> cgroup_empty_cpuset: tasks cannot join a cpuset whose cpus or mems are empty, or the
  value would leave its tasks without any.
- ERANGE -> cgroup_out_of_range: a CPU or node number beyond what the kernel supports.
- EINVAL -> cgroup_invalid_value: CPUs/nodes not present or online, a malformed value, a quota out
  of range (v1: above the parent's quota).
- EACCES at write -> cgroup_not_within_parent: a v1 cpuset must lie within its parent's.
- EACCES/EPERM/EROFS at open, EPERM at write -> cgroup_permission.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterable, Mapping
from typing import Final

from corepin.core.cpuset import CPUSet
from corepin.core.errors import CgroupError, CorepinError, CPUSetParseError
from corepin.core.ids import split_cgroup_path, validate_pid
from corepin.core.record import field, record
from corepin.sysfs.procfs import read_mountinfo

__all__ = [
    "CgroupDriver",
    "CgroupMounts",
    "CgroupV1",
    "CgroupV2",
    "CpuQuota",
    "PartitionState",
    "detect_mounts",
    "open_cgroups",
]

DEFAULT_PERIOD_US: Final = 100_000
#: the reason of a CgroupError for a file that holds no number where one belongs
UNPARSEABLE: Final = "cgroup_unparseable"

_WRITE_ERRORS: Final[Mapping[int, tuple[str, str]]] = {
    errno.EBUSY: (
        "cgroup_busy",
        "the kernel refused with EBUSY: a child cgroup still uses CPUs or memory nodes this "
        "value removes (shrink children first), or the group still has tasks",
    ),
    errno.ENOSPC: (
        "cgroup_empty_cpuset",
        "the kernel refused with ENOSPC: the cpuset has no CPUs or no memory nodes (a v1 cpuset "
        "needs cpuset.cpus and cpuset.mems set before tasks can join), or the value would leave "
        "its tasks with none",
    ),
    errno.ERANGE: (
        "cgroup_out_of_range",
        "the kernel refused with ERANGE: a CPU or memory node number is beyond what this kernel "
        "supports",
    ),
    errno.EINVAL: (
        "cgroup_invalid_value",
        "the kernel refused with EINVAL: CPUs or memory nodes that are not present or online, a "
        "malformed value, or a CPU quota out of range (v1: above the parent's quota)",
    ),
    errno.EACCES: (
        "cgroup_not_within_parent",
        "the kernel refused with EACCES: a v1 cpuset must stay within its parent's cpuset "
        "(widen the parent first)",
    ),
    errno.EPERM: (
        "cgroup_permission",
        "the kernel refused with EPERM: not permitted (corepin needs root or a delegated cgroup)",
    ),
    errno.ENODEV: (
        "cgroup_no_controller",
        "the kernel refused with ENODEV: the controller is not enabled for this group",
    ),
    errno.ESRCH: ("process_gone", "the process exited before it could be moved"),
    errno.EOPNOTSUPP: (
        "cgroup_invalid_domain",
        "the kernel refused with EOPNOTSUPP: the group cannot hold processes or controllers in "
        "its state (v2: a domain group inside a threaded subtree is invalid until made threaded)",
    ),
    errno.ENOENT: (
        "cgroup_no_controller",
        "the kernel refused with ENOENT: the controller is not offered here (the parent does not "
        "enable it in its cgroup.subtree_control)",
    ),
}


def _write_error(path: str, value: str, err: OSError, *, at_open: bool) -> CgroupError:
    if at_open and err.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return CgroupError(
            path,
            f"cannot open for writing ({err.strerror}): corepin needs root or a writable, "
            "delegated cgroup hierarchy",
            reason="cgroup_permission",
        )
    if at_open and err.errno == errno.ENOENT:
        return CgroupError(path, "does not exist (cgroup removed?)", reason="cgroup_missing")
    reason, text = _WRITE_ERRORS.get(
        err.errno or 0, ("cgroup_write_failed", f"write failed: {err.strerror or err}")
    )
    return CgroupError(path, f"writing {value!r}: {text}", reason=reason)


def _fake_leave(root: str, name: str, pid: str) -> None:
    """In a fake tree, take `pid` out of the `name` file (cgroup.procs, tasks) of every group
    below `root` that lists it."""
    for directory, _dirs, files in os.walk(root):
        if name not in files:
            continue
        file = os.path.join(directory, name)
        try:
            with open(file, encoding="ascii") as handle:
                listed = handle.read().split()
        except OSError:
            continue
        if pid in listed:
            rest = [p for p in listed if p != pid]
            with open(file, "w", encoding="ascii") as handle:
                handle.write("".join(f"{p}\n" for p in rest))


@record
class CpuQuota:
    """CFS bandwidth: `quota_us` per `period_us`; quota None means unlimited.

    `period_us` None means "leave the period as it is" (it is irrelevant when unlimited).
    """

    quota_us: int | None
    period_us: int | None = None

    def __post_init__(self) -> None:
        if self.quota_us is not None and self.quota_us < 1000:
            raise ValueError(f"CPU quota {self.quota_us}us is below the kernel's 1000us minimum")
        if self.period_us is not None and not 1000 <= self.period_us <= 1_000_000:
            raise ValueError(f"CPU period {self.period_us}us is outside 1000..1000000")

    @classmethod
    def unlimited(cls) -> CpuQuota:
        return cls(None, None)

    @classmethod
    def for_cpus(cls, count: float, period_us: int = DEFAULT_PERIOD_US) -> CpuQuota:
        """A quota worth `count` CPUs at `period_us` (what the kubelet writes for a limit)."""
        return cls(max(1000, round(count * period_us)), period_us)

    @property
    def is_unlimited(self) -> bool:
        return self.quota_us is None

    def satisfied_by(self, current: CpuQuota) -> bool:
        """True when `current` already is this quota (period only compared when set here)."""
        if current.quota_us != self.quota_us:
            return False
        return self.period_us is None or current.period_us == self.period_us

    def at_least(self, other: CpuQuota) -> bool:
        """True when this quota gives at least as much CPU time per second as `other`."""
        if self.quota_us is None:
            return True
        if other.quota_us is None:
            return False
        mine = self.quota_us / (self.period_us or DEFAULT_PERIOD_US)
        theirs = other.quota_us / (other.period_us or DEFAULT_PERIOD_US)
        return mine >= theirs

    def __str__(self) -> str:
        quota = "max" if self.quota_us is None else str(self.quota_us)
        return quota if self.period_us is None else f"{quota} {self.period_us}"


def _processes_of(tids: Iterable[str], proc_root: str = "/proc") -> list[int]:
    """The distinct processes (thread group ids) of thread ids `tids`, in order; threads that
    are gone are left out."""
    out: dict[int, None] = {}
    for tid in tids:
        try:
            status = _read_text(os.path.join(proc_root, tid, "status"))
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("Tgid:"):
                out.setdefault(int(line.split()[1]), None)
                break
    return list(out)


def _read_text(path: str) -> str:
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.read(fd, 65536).decode("ascii", "replace")
    finally:
        os.close(fd)


@record(frozen=False, slots=False)
class CgroupDriver:
    """Common part of the v1 and v2 drivers. Subclasses set the file names and the roots."""

    root: str
    #: number of successful writes since creation (steady-state reconcile must keep it at 0)
    writes: int = field(default=0, init=False)
    #: every write as (absolute file path, value), in order, when `record` is True
    journal: list[tuple[str, str]] = field(default_factory=list, init=False)
    record: bool = field(default=False, init=False)
    #: a plain directory tree standing in for cgroupfs (tests, benchmarks): writes create files
    fake_tree: bool = field(default=False, kw_only=True)
    _dirs: dict[tuple[str, str | None], str] = field(default_factory=dict, init=False, repr=False)
    _files: dict[tuple[str, str, str | None], str] = field(
        default_factory=dict, init=False, repr=False
    )

    version: int = field(default=0, init=False)
    cpus_file: str = field(default="cpuset.cpus", init=False)
    mems_file: str = field(default="cpuset.mems", init=False)

    # ------------------------------------------------------------------ paths
    def rel(self, path: str) -> str:
        """Canonical form of a relative cgroup path (validated)."""
        return "/".join(split_cgroup_path(path))

    def dir(self, path: str, root: str | None = None) -> str:
        """Absolute directory of the group `path` (validated once, then cached)."""
        key = (path, root)
        got = self._dirs.get(key)
        if got is None:
            parts = split_cgroup_path(path)
            got = os.path.join(os.fspath(root or self.root), *parts)
            if len(self._dirs) > 100_000:
                self._dirs.clear()
            self._dirs[key] = got
        return got

    def _file(self, path: str, name: str, root: str | None) -> str:
        key = (path, name, root)
        got = self._files.get(key)
        if got is None:
            got = os.path.join(self.dir(path, root), name)
            if len(self._files) > 100_000:
                self._files.clear()
            self._files[key] = got
        return got

    def exists(self, path: str) -> bool:
        return os.path.isdir(self.dir(path))

    def forget(self, path: str) -> None:
        """Drop the cached file names of the group `path` and of every group below it (it is
        gone: a node agent's pod), so the caches stay as big as the live groups."""
        below = path.rstrip("/") + "/"
        for dir_key in [k for k in self._dirs if k[0] == path or k[0].startswith(below)]:
            self._dirs.pop(dir_key, None)
        for file_key in [k for k in self._files if k[0] == path or k[0].startswith(below)]:
            self._files.pop(file_key, None)

    @staticmethod
    def parent(path: str) -> str | None:
        """The parent's relative path, None for the root."""
        parts = split_cgroup_path(path)
        if not parts:
            return None
        return "/".join(parts[:-1])

    def child_groups(self, path: str) -> list[str]:
        """Relative paths of the direct child cgroups of `path`."""
        base = self.dir(path)
        prefix = self.rel(path)
        try:
            with os.scandir(base) as entries:
                names = sorted(e.name for e in entries if e.is_dir(follow_symlinks=False))
        except FileNotFoundError:
            return []
        return [f"{prefix}/{n}" if prefix else n for n in names]

    # ------------------------------------------------------------------ raw io
    def read_file(self, path: str, name: str, root: str | None = None) -> str:
        file = self._file(path, name, root)
        try:
            return _read_text(file).strip()
        except FileNotFoundError:
            raise CgroupError(file, "does not exist", reason="cgroup_missing") from None
        except OSError as err:
            raise CgroupError(file, f"cannot read: {err.strerror or err}") from err

    def write_file(self, path: str, name: str, value: str, root: str | None = None) -> None:
        file = os.path.join(self.dir(path, root), name)
        if self.fake_tree:
            problem = self._fake_kernel_check(path, name, value)
            if problem is not None:
                raise _write_error(
                    file, value, OSError(problem, os.strerror(problem)), at_open=False
                )
            if name in ("cgroup.procs", "tasks"):
                # a task is in exactly one group of a hierarchy: joining one leaves the other
                _fake_leave(os.fspath(root or self.root), name, value.strip())
                old = self.read_file(path, name, root) if os.path.exists(file) else ""
                value = "\n".join([*old.split(), value]) + "\n"
        try:
            flags = os.O_WRONLY | os.O_TRUNC | (os.O_CREAT if self.fake_tree else 0)
            fd = os.open(file, flags, 0o644)
        except FileNotFoundError:
            if not os.path.isdir(os.path.dirname(file)):
                raise CgroupError(
                    file, "does not exist (cgroup removed?)", reason="cgroup_missing"
                ) from None
            raise CgroupError(
                file, "does not exist: is the controller enabled here?", reason="cgroup_missing"
            ) from None
        except OSError as err:
            raise _write_error(file, value, err, at_open=True) from err
        try:
            os.write(fd, value.encode("ascii"))
        except OSError as err:
            raise _write_error(file, value, err, at_open=False) from err
        finally:
            os.close(fd)
        self.writes += 1
        if self.record:
            self.journal.append((file, value))

    def _fake_kernel_check(self, path: str, name: str, value: str) -> int | None:
        """In a fake tree, the errno the kernel would give for this write (None: accepted)."""
        return None

    def _fake_seed(self, path: str) -> None:
        """In a fake tree, create the files the kernel would create in a new group."""

    def _read_set(self, path: str, name: str) -> CPUSet:
        text = self.read_file(path, name)
        try:
            return CPUSet.parse(text)
        except CPUSetParseError as err:
            raise CgroupError(
                os.path.join(self.dir(path), name), f"unparseable value: {err.problem}"
            ) from err

    # ------------------------------------------------------------------ cpuset
    def read_cpus(self, path: str) -> CPUSet:
        return self._read_set(path, self.cpus_file)

    def read_mems(self, path: str) -> CPUSet:
        return self._read_set(path, self.mems_file)

    def read_cpus_text(self, path: str) -> str:
        """The raw (stripped) cpuset.cpus text: the fast path of idempotency checks."""
        return self.read_file(path, self.cpus_file)

    def read_mems_text(self, path: str) -> str:
        return self.read_file(path, self.mems_file)

    def write_cpus(self, path: str, cpus: CPUSet) -> None:
        self.write_file(path, self.cpus_file, str(cpus) or "\n")

    def write_mems(self, path: str, mems: CPUSet) -> None:
        self.write_file(path, self.mems_file, str(mems) or "\n")

    def effective_cpus(self, path: str) -> CPUSet:
        raise NotImplementedError

    def effective_mems(self, path: str) -> CPUSet:
        raise NotImplementedError

    # ------------------------------------------------------------------ quota
    def has_cpu_controller(self) -> bool:
        raise NotImplementedError

    def read_quota(self, path: str) -> CpuQuota:
        raise NotImplementedError

    def read_quota_fast(self, path: str, want: CpuQuota) -> CpuQuota | None:
        """Read only what comparing against `want` needs (the period only when `want` sets it);
        None when a file holds no number (a group someone is still setting up): not what
        `want` says, so it gets written."""
        raise NotImplementedError

    def write_quota(self, path: str, quota: CpuQuota) -> None:
        raise NotImplementedError

    # ------------------------------------------------------------------ groups and tasks
    def create(self, path: str) -> list[str]:
        """Create `path` and any missing ancestors; return the relative paths created."""
        raise NotImplementedError

    def remove(self, path: str) -> None:
        """Remove the (empty) group `path`."""
        raise NotImplementedError

    def procs(self, path: str) -> list[int]:
        text = self.read_file(path, "cgroup.procs")
        return [int(x) for x in text.split()]

    def add_process(self, path: str, pid: int) -> None:
        """Move process `pid` (all its threads) into the group."""
        self.write_file(path, "cgroup.procs", str(validate_pid(pid)))

    def _mkdir(self, path: str, root: str | None) -> bool:
        target = self.dir(path, root)
        try:
            os.mkdir(target)
        except FileExistsError:
            return False
        except OSError as err:
            reason = "cgroup_permission" if err.errno in (errno.EACCES, errno.EPERM) else None
            raise CgroupError(
                target, f"cannot create the group: {err.strerror or err}", reason=reason
            ) from err
        return True

    def _rmdir(self, path: str, root: str | None) -> None:
        target = self.dir(path, root)
        if self.fake_tree and os.path.isdir(target):
            # a kernel group "is empty" without children and tasks, whatever files it shows
            with os.scandir(target) as entries:
                items = list(entries)
            procs = os.path.join(target, "cgroup.procs")
            busy = any(e.is_dir() for e in items) or (
                os.path.exists(procs) and _read_text(procs).split()
            )
            if not busy:
                for e in items:
                    os.unlink(e.path)
        try:
            os.rmdir(target)
        except FileNotFoundError:
            return
        except OSError as err:
            if err.errno == errno.EBUSY or err.errno == errno.ENOTEMPTY:
                raise CgroupError(
                    target,
                    "cannot remove: the group still has processes or child groups",
                    reason="cgroup_busy",
                ) from err
            raise CgroupError(target, f"cannot remove: {err.strerror or err}") from err


@record(frozen=False, slots=False)
class CgroupV1(CgroupDriver):
    """cgroup v1: the cpuset controller at `root`, the cpu controller (quota) at `cpu_root`.

    `cpu_root` may be the same mount as `root` (co-mounted controllers) or None when CFS quota is
    not managed. File names follow the mount: `cpuset.cpus`, or `cpus` with `noprefix`.
    """

    cpu_root: str | None = None

    def __post_init__(self) -> None:
        self.version = 1
        self.root = os.fspath(self.root)
        if self.cpu_root is not None:
            self.cpu_root = os.fspath(self.cpu_root)
        if not os.path.exists(os.path.join(self.root, "cpuset.cpus")) and os.path.exists(
            os.path.join(self.root, "cpus")
        ):
            self.cpus_file, self.mems_file = "cpus", "mems"

    def effective_cpus(self, path: str) -> CPUSet:
        return self._read_set(path, "cpuset.effective_cpus")

    def effective_mems(self, path: str) -> CPUSet:
        return self._read_set(path, "cpuset.effective_mems")

    def has_cpu_controller(self) -> bool:
        return self.cpu_root is not None

    def _cpu_root(self, path: str) -> str:
        if self.cpu_root is None:
            raise CgroupError(
                self.dir(path), "no cpu controller mount is configured", reason="no_cpu_controller"
            )
        return self.cpu_root

    def read_quota(self, path: str) -> CpuQuota:
        quota = self._read_int(path, "cpu.cfs_quota_us")
        period = self._read_int(path, "cpu.cfs_period_us")
        return CpuQuota(None if quota < 0 else quota, period)

    def read_quota_fast(self, path: str, want: CpuQuota) -> CpuQuota | None:
        try:
            quota = self._read_int(path, "cpu.cfs_quota_us")
            period = None
            if want.period_us is not None:
                period = self._read_int(path, "cpu.cfs_period_us")
        except CgroupError as err:
            if err.reason == UNPARSEABLE:
                return None
            raise
        return CpuQuota(None if quota < 0 else quota, period)

    def _read_int(self, path: str, name: str) -> int:
        root = self._cpu_root(path)
        text = self.read_file(path, name, root)
        try:
            return int(text)
        except ValueError as err:
            raise CgroupError(
                os.path.join(self.dir(path, root), name),
                f"unparseable value {text!r}",
                reason=UNPARSEABLE,
            ) from err

    def write_quota(self, path: str, quota: CpuQuota) -> None:
        root = self._cpu_root(path)
        if quota.quota_us is None:
            self.write_file(path, "cpu.cfs_quota_us", "-1", root)
            if quota.period_us is not None:
                self.write_file(path, "cpu.cfs_period_us", str(quota.period_us), root)
            return
        if quota.period_us is not None:
            # The quota must stay >= 1ms for either period: write the period first.
            self.write_file(path, "cpu.cfs_period_us", str(quota.period_us), root)
        self.write_file(path, "cpu.cfs_quota_us", str(quota.quota_us), root)

    def create(self, path: str) -> list[str]:
        """mkdir `path` (and missing ancestors) in the cpuset and cpu hierarchies.

        A new v1 cpuset starts with empty cpus and mems (unless cgroup.clone_children is set):
        tasks could not join, so each new group gets its parent's values, mems first.
        """
        parts = split_cgroup_path(path)
        created: list[str] = []
        for depth in range(1, len(parts) + 1):
            rel = "/".join(parts[:depth])
            if self.cpu_root is not None and self.cpu_root != self.root:
                self._mkdir(rel, self.cpu_root)
            if self._mkdir(rel, self.root):
                created.append(rel)
                if self.fake_tree:
                    self._fake_seed(rel)
                parent = "/".join(parts[: depth - 1])
                for name in (self.mems_file, self.cpus_file):
                    current = self.read_file(rel, name) if self._has(rel, name) else ""
                    if not current:
                        self.write_file(rel, name, self.read_file(parent, name) or "\n")
        return created

    def add_process(self, path: str, pid: int) -> None:
        """Move `pid` into the group in the cpuset hierarchy (and the cpu one when separate)."""
        self.write_file(path, "cgroup.procs", str(validate_pid(pid)))
        cpu_root = self.cpu_root
        if (
            cpu_root is not None
            and cpu_root != self.root
            and os.path.isdir(self.dir(path, cpu_root))
        ):
            self.write_file(path, "cgroup.procs", str(pid), cpu_root)

    def _fake_seed(self, path: str) -> None:
        for name in (self.cpus_file, self.mems_file, "cgroup.procs", "tasks"):
            file = os.path.join(self.dir(path), name)
            if not os.path.exists(file):
                with open(file, "w", encoding="ascii") as handle:
                    handle.write("\n")
        if self.cpu_root is not None:
            base = self.dir(path, self.cpu_root)
            for name, value in (("cpu.cfs_quota_us", "-1"), ("cpu.cfs_period_us", "100000")):
                file = os.path.join(base, name)
                if not os.path.exists(file):
                    with open(file, "w", encoding="ascii") as handle:
                        handle.write(value + "\n")

    def _fake_kernel_check(self, path: str, name: str, value: str) -> int | None:
        """The v1 cpuset rules, so a fake tree refuses what the kernel refuses."""
        parts = split_cgroup_path(path)
        if name == "cpu.cfs_quota_us":
            return self._fake_quota_check(path, int(value))
        if name in ("cgroup.procs", "tasks"):
            if not self.read_file(path, self.cpus_file) or not self.read_file(path, self.mems_file):
                return errno.ENOSPC
            return None
        if name not in (self.cpus_file, self.mems_file):
            return None
        try:
            new = CPUSet.parse(value)
        except CPUSetParseError:
            return errno.EINVAL
        if not parts:
            return None
        top = CPUSet.parse(self.read_file("", name))
        if not new <= top:
            return errno.EINVAL
        parent = CPUSet.parse(self.read_file("/".join(parts[:-1]), name))
        for child in self.child_groups(path):
            if not CPUSet.parse(self.read_file(child, name)) <= new:
                return errno.EBUSY
        if not new <= parent:
            return errno.EACCES
        if not new and self.procs(path):
            return errno.ENOSPC
        return None

    def _fake_quota_check(self, path: str, quota: int) -> int | None:
        """v1 refuses a finite quota above an ancestor's, or below a child's (as a ratio)."""
        if quota == -1 or self.cpu_root is None:
            return None
        root = self.cpu_root
        period = int(self.read_file(path, "cpu.cfs_period_us", root))
        mine = quota / period
        parts = split_cgroup_path(path)
        for depth in range(len(parts) - 1, -1, -1):
            above = "/".join(parts[:depth])
            theirs = int(self.read_file(above, "cpu.cfs_quota_us", root))
            if theirs >= 0:
                if mine > theirs / int(self.read_file(above, "cpu.cfs_period_us", root)):
                    return errno.EINVAL
                break
        for child in os.scandir(self.dir(path, root)):
            if child.is_dir():
                rel = "/".join((*parts, child.name))
                theirs = int(self.read_file(rel, "cpu.cfs_quota_us", root))
                if (
                    theirs >= 0
                    and theirs / int(self.read_file(rel, "cpu.cfs_period_us", root)) > mine
                ):
                    return errno.EINVAL
        return None

    def _has(self, path: str, name: str) -> bool:
        return os.path.exists(os.path.join(self.dir(path), name))

    def remove(self, path: str) -> None:
        if not split_cgroup_path(path):
            raise CgroupError(os.fspath(self.root), "refusing to remove the hierarchy root")
        self._rmdir(path, self.root)
        if self.cpu_root is not None and self.cpu_root != self.root:
            self._rmdir(path, self.cpu_root)


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
            text = _read_text(file)
        except OSError as err:
            if err.errno != errno.EOPNOTSUPP:
                return CgroupDriver.procs(self, path)  # raises the CgroupError for it
            return _processes_of(self.read_file(path, "cgroup.threads").split())
        return [int(x) for x in text.split()]

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


# ---------------------------------------------------------------------- detection


@record
class CgroupMounts:
    """Where the cgroup hierarchies are mounted: v1 controller -> mount point, and v2."""

    v1: Mapping[str, str]
    unified: str | None
    unified_controllers: frozenset[str] = frozenset()

    @property
    def cpuset_version(self) -> int | None:
        """Which hierarchy carries the cpuset controller (v1 wins: a controller is in one)."""
        if "cpuset" in self.v1:
            return 1
        if self.unified is not None and "cpuset" in self.unified_controllers:
            return 2
        return None


def detect_mounts(mountinfo: str | os.PathLike[str] = "/proc/self/mountinfo") -> CgroupMounts:
    """Find the cgroup mounts listed in a mountinfo file (first mount of each controller)."""
    v1: dict[str, str] = {}
    unified: str | None = None
    for mount in read_mountinfo(mountinfo, fstypes=("cgroup", "cgroup2")):
        if mount.fstype == "cgroup2" and unified is None:
            unified = mount.mount_point
        elif mount.fstype == "cgroup":
            for controller in mount.cgroup_controllers:
                v1.setdefault(controller, mount.mount_point)
    controllers: frozenset[str] = frozenset()
    if unified is not None:
        try:
            controllers = frozenset(_read_text(os.path.join(unified, "cgroup.controllers")).split())
        except OSError:
            controllers = frozenset()
    return CgroupMounts(v1, unified, controllers)


def open_cgroups(
    mounts: CgroupMounts | None = None,
    *,
    mountinfo: str | os.PathLike[str] = "/proc/self/mountinfo",
    version: int | None = None,
) -> CgroupDriver:
    """The driver for the hierarchy that carries the cpuset controller (or `version`)."""
    found = mounts if mounts is not None else detect_mounts(mountinfo)
    want = version or found.cpuset_version
    if want == 1 and "cpuset" in found.v1:
        return CgroupV1(found.v1["cpuset"], found.v1.get("cpu"))
    if want == 2 and found.unified is not None:
        return CgroupV2(found.unified)
    raise CgroupError(
        os.fspath(mountinfo),
        "no cgroup hierarchy with the cpuset controller is mounted"
        + (f" (asked for cgroup v{version})" if version else "")
        + ": mount cgroup v1 cpuset or enable cpuset in cgroup v2",
        reason="no_cpuset_hierarchy",
    )


#: Where cgroup hierarchies are mounted unless told otherwise.
DEFAULT_CGROUP_ROOT = "/sys/fs/cgroup"


def is_cgroup_mount(path: str | os.PathLike[str], mountinfo: str = "/proc/self/mountinfo") -> bool:
    """Whether `path` is itself the mount point of a cgroup (v1 or v2) file system."""
    target = os.path.realpath(path)
    try:
        mounts = read_mountinfo(mountinfo)
    except CorepinError:
        return False
    return any(m.mount_point == target and m.fstype in ("cgroup", "cgroup2") for m in mounts)


def _v1_controller_dirs(root: str, mountinfo: str) -> dict[str, str]:
    """v1 controller -> its hierarchy's directory below `root` (symlinks resolved): the cgroup
    mounts mountinfo lists right below `root` as reached from here (a bind mount of the host's
    /sys/fs/cgroup lists its own copies of them), then the directories (and symlinks such as
    `cpu -> cpu,cpuacct`) right below `root`, named after the controllers they carry."""
    found: dict[str, str] = {}
    real = os.path.realpath(root)
    try:
        mounts = read_mountinfo(mountinfo)
    except CorepinError:
        mounts = []
    for mount in mounts:
        if mount.fstype == "cgroup" and os.path.dirname(mount.mount_point) == real:
            for controller in mount.cgroup_controllers:
                found.setdefault(controller, mount.mount_point)
    try:
        entries = sorted(os.listdir(root))
    except OSError:
        entries = []
    for entry in entries:
        target = os.path.realpath(os.path.join(root, entry))
        if not os.path.isdir(target):
            continue
        for controller in (*entry.split(","), *os.path.basename(target).split(",")):
            if controller:
                found.setdefault(controller, target)
    return found


def open_cpuset_hierarchy(
    cgroup_root: str | os.PathLike[str] = DEFAULT_CGROUP_ROOT,
    *,
    mountinfo: str = "/proc/self/mountinfo",
) -> CgroupDriver:
    """The driver of the cpuset hierarchy below `cgroup_root` (`--cgroup-root`):
    at the default root the mounted hierarchy found in /proc/self/mountinfo (v1 or v2); else,
    when there is no `cpuset` below it but a `cgroup.controllers` file in it, `cgroup_root`
    itself as cgroup v2 (a cgroup2 mount, or a tree standing in for one); else cgroup v1 with
    each controller found below the root, however the root is reached (a bind mount such as a
    DaemonSet's /host/sys/fs/cgroup, a symlink): `<root>/cpuset` for cpusets, and for CFS quota
    the hierarchy carrying `cpu` - `<root>/cpu`, the combined `cpu,cpuacct` mount, or a symlink
    to it - that holds `cpu.cfs_quota_us`. A plain directory tree standing in for cgroupfs
    (tests, dry runs) is driven with `fake_tree`, so the kernel's rules still apply."""
    root = os.fspath(cgroup_root).rstrip("/") or "/"
    if root == DEFAULT_CGROUP_ROOT:
        return open_cgroups()
    cpuset = os.path.join(root, "cpuset")
    if not os.path.isdir(cpuset) and os.path.isfile(os.path.join(root, "cgroup.controllers")):
        # a cgroup v2 root: a cgroup2 mount, or a directory tree standing in for one
        return CgroupV2(root, fake_tree=not is_cgroup_mount(root, mountinfo))
    dirs = _v1_controller_dirs(root, mountinfo)
    if not os.path.isdir(cpuset) and "cpuset" in dirs:
        cpuset = dirs["cpuset"]
    cpu = dirs.get("cpu")
    if cpu is not None and not os.path.isfile(os.path.join(cpu, "cpu.cfs_quota_us")):
        cpu = None  # (a kernel without CFS bandwidth control: quota is not managed)
    if (cpu is None and os.path.isfile(os.path.join(cpuset, "cpu.cfs_quota_us"))) or (
        cpu is not None and os.path.realpath(cpu) == os.path.realpath(cpuset)
    ):
        cpu = cpuset  # co-mounted with cpuset
    fake = os.path.isdir(cpuset) and not is_cgroup_mount(cpuset, mountinfo)
    return CgroupV1(cpuset, cpu, fake_tree=fake)
