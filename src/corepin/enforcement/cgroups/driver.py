"""What both cgroup drivers share: `CgroupDriver` (paths, raw reads and writes, the cpuset files,
groups and their tasks), `CpuQuota` (CFS bandwidth), and the mapping of the kernel's errnos to
`CgroupError` reasons (see the package docstring).

A fake tree (`fake_tree`: a plain directory standing in for cgroupfs) makes writes create files
and the drivers check what the kernel would refuse; `corepin.enforcement.faketree` builds one.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterable, Mapping
from typing import Final

from corepin.core.cpuset import CPUSet
from corepin.core.errors import CgroupError, CPUSetParseError
from corepin.core.ids import split_cgroup_path, validate_pid
from corepin.core.record import field, record

__all__ = [
    "DEFAULT_PERIOD_US",
    "UNPARSEABLE",
    "CgroupDriver",
    "CpuQuota",
    "fake_leave",
    "processes_of",
    "read_text",
    "write_error",
]

DEFAULT_PERIOD_US: Final = 100_000
#: the reason of a CgroupError for a file that holds no number where one belongs
UNPARSEABLE: Final = "cgroup_unparseable"

WRITE_ERRORS: Final[Mapping[int, tuple[str, str]]] = {
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


def write_error(path: str, value: str, err: OSError, *, at_open: bool) -> CgroupError:
    if at_open and err.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return CgroupError(
            path,
            f"cannot open for writing ({err.strerror}): corepin needs root or a writable, "
            "delegated cgroup hierarchy",
            reason="cgroup_permission",
        )
    if at_open and err.errno == errno.ENOENT:
        return CgroupError(path, "does not exist (cgroup removed?)", reason="cgroup_missing")
    reason, text = WRITE_ERRORS.get(
        err.errno or 0, ("cgroup_write_failed", f"write failed: {err.strerror or err}")
    )
    return CgroupError(path, f"writing {value!r}: {text}", reason=reason)


def fake_leave(root: str, name: str, pid: str) -> None:
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


def processes_of(tids: Iterable[str], proc_root: str = "/proc") -> list[int]:
    """The distinct processes (thread group ids) of thread ids `tids`, in order; threads that
    are gone are left out."""
    out: dict[int, None] = {}
    for tid in tids:
        try:
            status = read_text(os.path.join(proc_root, tid, "status"))
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("Tgid:"):
                out.setdefault(int(line.split()[1]), None)
                break
    return list(out)


def read_text(path: str) -> str:
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
            return read_text(file).strip()
        except FileNotFoundError:
            raise CgroupError(file, "does not exist", reason="cgroup_missing") from None
        except OSError as err:
            raise CgroupError(file, f"cannot read: {err.strerror or err}") from err

    def write_file(self, path: str, name: str, value: str, root: str | None = None) -> None:
        file = os.path.join(self.dir(path, root), name)
        if self.fake_tree:
            problem = self._fake_kernel_check(path, name, value)
            if problem is not None:
                raise write_error(
                    file, value, OSError(problem, os.strerror(problem)), at_open=False
                )
            if name in ("cgroup.procs", "tasks"):
                # a task is in exactly one group of a hierarchy: joining one leaves the other
                fake_leave(os.fspath(root or self.root), name, value.strip())
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
            raise write_error(file, value, err, at_open=True) from err
        try:
            os.write(fd, value.encode("ascii"))
        except OSError as err:
            raise write_error(file, value, err, at_open=False) from err
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
                os.path.exists(procs) and read_text(procs).split()
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
