"""Readers of /proc: process identity, threads, process trees, affinity and cgroup membership.

Every reader takes `proc_root` (default `/proc`) so tests can point it at a fake tree. A process
that disappears while we read it raises `ProcessGone` (a `LookupError` as well), because a race
with an exiting process is normal, not a host problem; other unreadable files raise `SysfsError`
naming the file.

A process is identified by (pid, start time): the start time is field 22 of /proc/PID/stat, in
clock ticks since boot. `comm` (field 2) may contain spaces and parentheses, so the fields after
it are found from the LAST `)` of the line.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator

from corepin.core.cpuset import CPUSet
from corepin.core.errors import CPUSetParseError, EnvironmentProblem, SysfsError
from corepin.core.record import record

__all__ = [
    "CgroupEntry",
    "MountInfo",
    "ProcStat",
    "ProcessGone",
    "cgroup_of",
    "children",
    "cpus_allowed_list",
    "descendants",
    "iter_tree_threads",
    "list_pids",
    "list_threads",
    "lock_holders",
    "mems_allowed_list",
    "parent_map",
    "parse_cgroup",
    "parse_lock_holders",
    "parse_mountinfo",
    "parse_stat",
    "process_alive",
    "process_start_time",
    "read_cgroup",
    "read_mountinfo",
    "read_stat",
    "read_status",
]


class ProcessGone(EnvironmentProblem, LookupError):
    """The process (or thread) exited, or never existed, while we were reading it."""

    default_reason = "process_gone"

    def __init__(self, pid: int, path: str) -> None:
        self.pid = pid
        self.path = path
        super().__init__(f"process {pid} does not exist (no {path})")


#: `flags` bits (field 9 of /proc/PID/stat, include/linux/sched.h): a kernel thread, and a
#: thread whose affinity userspace may not change (per-CPU kernel threads).
PF_KTHREAD = 0x00200000
PF_NO_SETAFFINITY = 0x04000000


@record
class ProcStat:
    """The fields of /proc/PID/stat that corepin uses."""

    pid: int
    comm: str
    state: str
    ppid: int
    start_time: int  # field 22, clock ticks after boot
    pgrp: int = 0  # field 5
    session: int = 0  # field 6
    flags: int = 0  # field 9 (PF_* bits)
    utime: int = 0  # field 14, clock ticks spent in user mode
    stime: int = 0  # field 15, clock ticks spent in the kernel

    @property
    def alive(self) -> bool:
        """Not a zombie (nor dead): it can still run and hold CPUs."""
        return self.state not in ("Z", "X")

    @property
    def stopped(self) -> bool:
        """Stopped by a signal (SIGSTOP, Ctrl-Z) or by a tracer: it runs no code until resumed."""
        return self.state in ("T", "t")

    @property
    def kernel_thread(self) -> bool:
        """A kernel thread (kthreadd and its children)."""
        return bool(self.flags & PF_KTHREAD)

    @property
    def fixed_affinity(self) -> bool:
        """The kernel refuses affinity changes (a per-CPU kernel thread)."""
        return bool(self.flags & PF_NO_SETAFFINITY)


@record
class CgroupEntry:
    """One line of /proc/PID/cgroup: `hierarchy-id:controllers:path`.

    cgroup v2 has hierarchy id 0 and no controllers (`0::/path`). A v1 named hierarchy such as
    `name=systemd` keeps that text in `controllers`.
    """

    hierarchy: int
    controllers: tuple[str, ...]
    path: str

    @property
    def unified(self) -> bool:
        return self.hierarchy == 0 and not self.controllers


@record
class MountInfo:
    """One line of /proc/PID/mountinfo (the fields corepin needs)."""

    mount_id: int
    root: str  # the path inside the filesystem that is mounted here
    mount_point: str
    fstype: str
    source: str
    super_options: tuple[str, ...]

    @property
    def cgroup_controllers(self) -> tuple[str, ...]:
        """For a v1 cgroup mount, the controllers it carries (`cpu`, `cpuacct`, `name=...`)."""
        if self.fstype != "cgroup":
            return ()
        known = {
            "cpuset",
            "cpu",
            "cpuacct",
            "memory",
            "devices",
            "freezer",
            "net_cls",
            "blkio",
            "perf_event",
            "net_prio",
            "hugetlb",
            "pids",
            "rdma",
            "misc",
        }
        return tuple(o for o in self.super_options if o in known or o.startswith("name="))


def _pid_dir(proc_root: str | os.PathLike[str], pid: int) -> str:
    return os.path.join(os.fspath(proc_root), str(pid))


def _read(path: str, pid: int) -> str:
    try:
        with open(path, encoding="utf-8", errors="surrogateescape") as handle:
            return handle.read()
    except (FileNotFoundError, ProcessLookupError):
        raise ProcessGone(pid, path) from None
    except OSError as err:
        # ESRCH shows up when a thread exits between open and read.
        if err.errno == 3:
            raise ProcessGone(pid, path) from None
        raise SysfsError(path, f"cannot read: {err.strerror or err}") from err


def parse_stat(text: str, path: str = "stat") -> ProcStat:
    """Parse the text of /proc/PID/stat (or /proc/PID/task/TID/stat)."""
    open_paren = text.find("(")
    close_paren = text.rfind(")")
    if open_paren < 0 or close_paren < open_paren:
        raise SysfsError(path, f"no '(comm)' in {text[:80]!r}")
    try:
        pid = int(text[:open_paren].strip())
    except ValueError:
        raise SysfsError(path, f"bad pid field in {text[:80]!r}") from None
    comm = text[open_paren + 1 : close_paren]
    rest = text[close_paren + 1 :].split()
    # rest[0] is field 3 (state); field n is rest[n - 3].
    if len(rest) < 20:
        raise SysfsError(path, f"has {len(rest) + 2} fields, expected at least 22")
    try:
        ppid = int(rest[1])
        pgrp = int(rest[2])
        session = int(rest[3])
        flags = int(rest[6])
        utime = int(rest[11])
        stime = int(rest[12])
        start_time = int(rest[19])
    except ValueError:
        raise SysfsError(
            path,
            "fields 4 (ppid), 5 (pgrp), 6 (session), 9 (flags), 14 (utime), 15 (stime) or 22 "
            "(starttime) are not integers",
        ) from None
    return ProcStat(pid, comm, rest[0], ppid, start_time, pgrp, session, flags, utime, stime)


def read_stat(pid: int, proc_root: str | os.PathLike[str] = "/proc") -> ProcStat:
    path = os.path.join(_pid_dir(proc_root, pid), "stat")
    return parse_stat(_read(path, pid), path)


def process_start_time(pid: int, proc_root: str | os.PathLike[str] = "/proc") -> int:
    """Field 22 of /proc/PID/stat: when the process started, in clock ticks after boot."""
    return read_stat(pid, proc_root).start_time


def process_alive(
    pid: int, start_time: int | None = None, proc_root: str | os.PathLike[str] = "/proc"
) -> bool:
    """True when `pid` exists (and, if given, started at `start_time`) and is not a zombie."""
    try:
        stat = read_stat(pid, proc_root)
    except ProcessGone:
        return False
    if stat.state in ("Z", "X"):
        return False
    return start_time is None or stat.start_time == start_time


def list_pids(proc_root: str | os.PathLike[str] = "/proc") -> list[int]:
    """Every process id under proc_root, ascending."""
    root = os.fspath(proc_root)
    try:
        names = os.listdir(root)
    except OSError as err:
        raise SysfsError(root, f"cannot list: {err.strerror or err}") from err
    return sorted(int(n) for n in names if n.isdigit())


def list_threads(pid: int, proc_root: str | os.PathLike[str] = "/proc") -> list[int]:
    """Thread ids of `pid` (from /proc/PID/task), ascending; the main thread is `pid` itself."""
    path = os.path.join(_pid_dir(proc_root, pid), "task")
    try:
        names = os.listdir(path)
    except (FileNotFoundError, ProcessLookupError):
        raise ProcessGone(pid, path) from None
    except OSError as err:
        raise SysfsError(path, f"cannot list: {err.strerror or err}") from err
    return sorted(int(n) for n in names if n.isdigit())


def process_table(proc_root: str | os.PathLike[str] = "/proc") -> dict[int, ProcStat]:
    """pid -> ProcStat for every process that is still there when its stat file is read.

    One open, read and close per process and nothing more (no file object): a host runs
    hundreds or thousands of processes, and `corepin run` scans them all when it releases its
    CPUs. A stat file that cannot be read or parsed is left out, as a process that is gone."""
    root = os.fspath(proc_root)
    flags = os.O_RDONLY | os.O_CLOEXEC
    out: dict[int, ProcStat] = {}
    for pid in list_pids(root):
        path = f"{root}/{pid}/stat"
        try:
            fd = os.open(path, flags)
        except OSError:
            continue
        try:
            data = os.read(fd, 4096)
            while len(data) % 4096 == 0 and data:  # a stat file never is this long, but
                more = os.read(fd, 4096)  # read on to the end all the same
                if not more:
                    break
                data += more
        except OSError:
            continue
        finally:
            os.close(fd)
        try:
            out[pid] = parse_stat(data.decode("utf-8", "surrogateescape"), path)
        except SysfsError:
            continue
    return out


def parent_map(proc_root: str | os.PathLike[str] = "/proc") -> dict[int, int]:
    """pid -> ppid for every process that is still there when its stat file is read."""
    return {pid: st.ppid for pid, st in process_table(proc_root).items()}


@record
class ProcessGroup:
    """The processes of one workload, robust against pid reuse.

    - `pid` + `start_time`: the root process (when `start_time` is given, a process with that
      pid but another start time is not the root: the pid was recycled);
    - `session`: every process of this session id that started no earlier than the root
      belongs to the group (the kernel never reuses a pid still in use as a session id);
    - `members`: more (pid, start time) pairs that belong to the group (processes that
      outlived the root and were recorded);
    - descendants of every process above belong to the group too.
    """

    pid: int
    start_time: int | None = None
    session: int | None = None
    members: tuple[tuple[int, int], ...] = ()

    def pids(self, table: dict[int, ProcStat]) -> list[int]:
        """The live (non-zombie) processes of the group in `table` (from `process_table`),
        ascending."""
        roots: list[int] = []
        root = table.get(self.pid)
        if root is not None and (self.start_time is None or root.start_time == self.start_time):
            roots.append(self.pid)
        for pid, start in self.members:
            st = table.get(pid)
            if st is not None and st.start_time == start:
                roots.append(pid)
        if self.session is not None:
            floor = self.start_time or 0
            roots.extend(
                pid
                for pid, st in table.items()
                if st.session == self.session and st.start_time >= floor
            )
        if not roots:
            return []
        kids: dict[int, list[int]] = {}
        for pid, st in table.items():
            kids.setdefault(st.ppid, []).append(pid)
        seen: set[int] = set()
        stack = list(roots)
        while stack:
            current = stack.pop()
            if current in seen:
                continue
            seen.add(current)
            stack.extend(kids.get(current, ()))
        return sorted(pid for pid in seen if table[pid].alive)


def children(pid: int, proc_root: str | os.PathLike[str] = "/proc") -> list[int]:
    """Direct children of `pid`, ascending (one scan of /proc)."""
    return sorted(child for child, parent in parent_map(proc_root).items() if parent == pid)


def descendants(
    pid: int,
    proc_root: str | os.PathLike[str] = "/proc",
    *,
    parents: dict[int, int] | None = None,
) -> list[int]:
    """Every descendant of `pid` (children, grandchildren, ...), not `pid` itself, ascending.

    `parents` (from `parent_map`) lets a caller reuse one scan of /proc for many roots.
    """
    table = parent_map(proc_root) if parents is None else parents
    kids: dict[int, list[int]] = {}
    for child, parent in table.items():
        kids.setdefault(parent, []).append(child)
    out: list[int] = []
    stack = list(kids.get(pid, ()))
    seen = {pid}
    while stack:
        current = stack.pop()
        if current in seen:
            continue
        seen.add(current)
        out.append(current)
        stack.extend(kids.get(current, ()))
    return sorted(out)


def read_status(
    pid: int, proc_root: str | os.PathLike[str] = "/proc", *, tid: int | None = None
) -> dict[str, str]:
    """The `Key:\\tvalue` lines of /proc/PID/status (or of thread `tid`) as a dict."""
    base = _pid_dir(proc_root, pid)
    path = os.path.join(base, "task", str(tid), "status") if tid else os.path.join(base, "status")
    out: dict[str, str] = {}
    for line in _read(path, pid).splitlines():
        key, sep, value = line.partition(":")
        if sep:
            out[key] = value.strip()
    return out


def _status_set(pid: int, key: str, proc_root: str | os.PathLike[str], tid: int | None) -> CPUSet:
    status = read_status(pid, proc_root, tid=tid)
    base = _pid_dir(proc_root, pid)
    where = os.path.join(base, "task", str(tid), "status") if tid else os.path.join(base, "status")
    if key not in status:
        raise SysfsError(where, f"has no {key} line")
    try:
        return CPUSet.parse(status[key])
    except CPUSetParseError as err:
        raise SysfsError(where, f"{key}: {err.problem}") from err


def cpus_allowed_list(
    pid: int, proc_root: str | os.PathLike[str] = "/proc", *, tid: int | None = None
) -> CPUSet:
    """`Cpus_allowed_list` of the process (or one of its threads): its CPU affinity."""
    return _status_set(pid, "Cpus_allowed_list", proc_root, tid)


def mems_allowed_list(
    pid: int, proc_root: str | os.PathLike[str] = "/proc", *, tid: int | None = None
) -> CPUSet:
    """`Mems_allowed_list`: the NUMA nodes the process may allocate memory on."""
    return _status_set(pid, "Mems_allowed_list", proc_root, tid)


def parse_cgroup(text: str, path: str = "cgroup") -> list[CgroupEntry]:
    """Parse /proc/PID/cgroup text (v1 lines, the v2 `0::` line, or both in hybrid mode)."""
    out: list[CgroupEntry] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        hier, sep1, rest = line.partition(":")
        controllers, sep2, cg_path = rest.partition(":")
        if not (sep1 and sep2):
            raise SysfsError(path, f"line {line!r} is not 'id:controllers:path'")
        try:
            hierarchy = int(hier)
        except ValueError:
            raise SysfsError(path, f"line {line!r} has a non-numeric hierarchy id") from None
        names = tuple(c for c in controllers.split(",") if c)
        out.append(CgroupEntry(hierarchy, names, cg_path))
    return out


def read_cgroup(pid: int, proc_root: str | os.PathLike[str] = "/proc") -> list[CgroupEntry]:
    """The cgroup membership of `pid`, one entry per hierarchy."""
    path = os.path.join(_pid_dir(proc_root, pid), "cgroup")
    return parse_cgroup(_read(path, pid), path)


def cgroup_of(entries: Iterable[CgroupEntry], controller: str | None) -> str | None:
    """The path of the hierarchy carrying `controller` (v1), or the unified path for None."""
    for entry in entries:
        if controller is None and entry.unified:
            return entry.path
        if controller is not None and controller in entry.controllers:
            return entry.path
    return None


#: Patterns compiled on first use (through `re`'s cache): compiling costs more than most
#: commands spend using them.
_OCTAL_ESCAPE = r"\\([0-7]{3})"


def _unescape(field: str) -> str:
    if "\\" not in field:
        return field
    return re.sub(_OCTAL_ESCAPE, lambda m: chr(int(m.group(1), 8)), field)


def parse_mountinfo(
    text: str, path: str = "mountinfo", *, fstypes: Iterable[str] | None = None
) -> list[MountInfo]:
    """Parse mountinfo text (see proc(5)); fields after the optional ones follow a lone `-`.

    With `fstypes`, only mounts of those file system types (a host with containers has
    hundreds of mounts; cgroup detection wants a handful)."""
    wanted = None if fstypes is None else frozenset(fstypes)
    marks = None if wanted is None else tuple(f" - {t} " for t in wanted)
    out: list[MountInfo] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        if marks is not None and not any(m in line for m in marks):
            continue
        fields = line.split(" ")
        try:
            sep = fields.index("-", 6)
            if wanted is not None and fields[sep + 1] not in wanted:
                continue
            out.append(
                MountInfo(
                    mount_id=int(fields[0]),
                    root=_unescape(fields[3]),
                    mount_point=_unescape(fields[4]),
                    fstype=fields[sep + 1],
                    source=_unescape(fields[sep + 2]),
                    super_options=tuple(fields[sep + 3].split(","))
                    if len(fields) > sep + 3
                    else (),
                )
            )
        except (ValueError, IndexError):
            raise SysfsError(path, f"malformed line {line!r}") from None
    return out


def read_mountinfo(
    path: str | os.PathLike[str] = "/proc/self/mountinfo", *, fstypes: Iterable[str] | None = None
) -> list[MountInfo]:
    text_path = os.fspath(path)
    try:
        with open(text_path, encoding="utf-8", errors="surrogateescape") as handle:
            text = handle.read()
    except OSError as err:
        raise SysfsError(text_path, f"cannot read: {err.strerror or err}") from err
    return parse_mountinfo(text, text_path, fstypes=fstypes)


def iter_tree_threads(
    pid: int, proc_root: str | os.PathLike[str] = "/proc", *, include_descendants: bool = True
) -> Iterator[tuple[int, int]]:
    """(pid, tid) for every thread of `pid` and, optionally, of its descendants.

    Processes that exit during the walk are skipped.
    """
    pids = [pid]
    if include_descendants:
        pids += descendants(pid, proc_root)
    for p in pids:
        try:
            tids = list_threads(p, proc_root)
        except ProcessGone:
            continue
        for tid in tids:
            yield p, tid


_LOCK_FILE_ID = r"^([0-9a-f]+):([0-9a-f]+):(\d+)$"


def parse_lock_holders(text: str, device: int, inode: int) -> list[int]:
    """The pids that hold a lock on the file (`device`, `inode`) in the text of /proc/locks.

    A line reads `1: FLOCK  ADVISORY  WRITE 4242 08:01:1234567 0 EOF` (the device as hex
    major:minor, the inode in decimal); lines with `->` are waiters, not holders, and are
    skipped, as are holders the kernel cannot name from this PID namespace (pid -1 or 0)."""
    major, minor = os.major(device), os.minor(device)
    pids: list[int] = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 2 or fields[1] == "->":
            continue
        for i, token in enumerate(fields):
            match = re.match(_LOCK_FILE_ID, token)
            if match is None or i == 0:
                continue
            if (int(match[1], 16), int(match[2], 16), int(match[3])) != (major, minor, inode):
                break
            try:
                pid = int(fields[i - 1])
            except ValueError:
                break
            if pid > 0 and pid not in pids:
                pids.append(pid)
            break
    return pids


def lock_holders(device: int, inode: int, proc_root: str | os.PathLike[str] = "/proc") -> list[int]:
    """The pids holding a lock (flock, POSIX or OFD) on the file (`device`, `inode`), from
    `<proc_root>/locks`; an empty list when it cannot be read."""
    try:
        with open(os.path.join(os.fspath(proc_root), "locks"), encoding="ascii") as handle:
            text = handle.read()
    except (OSError, UnicodeDecodeError):
        return []
    return parse_lock_holders(text, device, inode)
