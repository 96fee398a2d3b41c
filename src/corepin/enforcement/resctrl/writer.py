"""`ResctrlWriter`: creates resctrl classes, writes their schemata and tasks, idempotently.

Every change to the filesystem goes through a `ResctrlFs` (write a file, make or remove a
group directory): `KernelFs` does plain file operations on the mounted filesystem; tests give a
fake kernel that validates writes the way resctrl does, since a plain directory cannot refuse
anything. Reads are plain file reads.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Protocol

from corepin.allocation.qos.policy import ClassPolicy
from corepin.core.ids import IdError, validate_component, validate_pid
from corepin.enforcement.note import Change
from corepin.enforcement.resctrl.model import (
    ResctrlError,
    ResctrlInfo,
    ResctrlValueError,
    check_cbm,
    format_line,
    parse_schemata,
    read_info,
    read_text,
)
from corepin.enforcement.resctrl.percent import class_schemata, read_cpu_vendor

__all__ = ["KernelFs", "ResctrlFs", "ResctrlWriter"]

_RESERVED: Final = frozenset({"info", "mon_groups", "mon_data"})


class ResctrlFs(Protocol):
    """The writes resctrl takes; each raises OSError with the kernel's errno on refusal."""

    def write(self, path: Path, text: str) -> None: ...

    def mkdir(self, path: Path) -> None: ...

    def rmdir(self, path: Path) -> None: ...


class KernelFs:
    """The mounted resctrl filesystem: one `write(2)` per call, plain mkdir/rmdir."""

    def write(self, path: Path, text: str) -> None:
        with open(path, "w", encoding="ascii") as handle:
            handle.write(text)

    def mkdir(self, path: Path) -> None:
        os.mkdir(path)

    def rmdir(self, path: Path) -> None:
        os.rmdir(path)


@dataclass
class ResctrlWriter:
    """Creates and updates resctrl classes under `root`."""

    root: Path = Path("/sys/fs/resctrl")
    vendor: str | None = None
    fs: ResctrlFs = field(default_factory=KernelFs)
    #: where `cpuinfo` is read for the vendor when `vendor` is not given (None: not read)
    proc_root: Path | None = None
    writes: int = field(default=0, init=False)
    _info: ResctrlInfo | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.root = Path(self.root)
        if self.vendor is None and self.proc_root is not None:
            self.vendor = read_cpu_vendor(Path(self.proc_root))
        if self.vendor is not None:
            self.vendor = self.vendor.lower()
            if self.vendor not in ("intel", "amd"):
                raise IdError("CPU vendor", self.vendor, "is not 'intel' or 'amd'")

    # ------------------------------------------------------------------ machine facts
    @property
    def info(self) -> ResctrlInfo:
        if self._info is None:
            self._info = read_info(self.root, self.vendor)
        return self._info

    # ------------------------------------------------------------------ values
    def _spread(
        self, what: str, value: int | Mapping[int, int], domains: tuple[int, ...]
    ) -> dict[int, int]:
        if not domains:
            raise ResctrlValueError(f"this machine exposes no {what} domains in resctrl")
        if isinstance(value, Mapping):
            unknown = sorted(set(value) - set(domains))
            if unknown:
                raise ResctrlValueError(
                    f"{what} domain id(s) {unknown} do not exist here; the domains are "
                    f"{', '.join(map(str, domains))}"
                )
            return dict(value)
        return dict.fromkeys(domains, value)

    def l3_values(self, l3: int | Mapping[int, int]) -> dict[int, str]:
        """Validated cache masks per L3 id, as the kernel takes them (hex)."""
        info = self.info
        masks = self._spread("L3", l3, info.l3_domains)
        return {d: f"{check_cbm(m, info, domain=d):x}" for d, m in masks.items()}

    def mb_values(self, mb: int | Mapping[int, int]) -> dict[int, str]:
        """Validated bandwidth per MB domain (percent rounded up to the granularity)."""
        info = self.info
        if info.mb_unit is None:
            raise ResctrlValueError("this machine has no memory bandwidth allocation (MB)")
        values = self._spread("MB", mb, info.mb_domains)
        out: dict[int, str] = {}
        for domain, bw in values.items():
            if info.mb_unit == "percent":
                if not info.min_bandwidth <= bw <= 100:
                    raise ResctrlValueError(
                        f"memory bandwidth {bw}% for domain {domain} is outside "
                        f"{info.min_bandwidth}..100 (info/MB/min_bandwidth)"
                    )
                gran = info.bandwidth_gran
                bw = -(-bw // gran) * gran
            elif not 0 < bw <= info.max_bandwidth:
                unit = "1/8 GB/s units" if self.vendor == "amd" else "absolute units"
                raise ResctrlValueError(
                    f"memory bandwidth {bw} for domain {domain} is outside "
                    f"1..{info.max_bandwidth} ({unit})"
                )
            out[domain] = str(bw)
        return out

    # ------------------------------------------------------------------ classes
    def _group(self, name: str) -> Path:
        validate_component(name, "resctrl class name")
        if name in _RESERVED:
            raise IdError("resctrl class name", name, "is reserved by resctrl")
        return self.root / name

    def classes(self) -> list[str]:
        with os.scandir(self.root) as entries:
            return sorted(
                e.name
                for e in entries
                if e.is_dir(follow_symlinks=False) and e.name not in _RESERVED
            )

    def read_schemata(self, name: str) -> dict[str, dict[int, str]]:
        path = self._group(name) / "schemata"
        try:
            return parse_schemata(read_text(path))
        except FileNotFoundError:
            raise ResctrlError(os.fspath(path), "no such class", reason="resctrl_missing") from None

    def _last_status(self) -> str:
        try:
            return read_text(self.root / "info" / "last_cmd_status")
        except OSError:
            return ""

    def _write(self, path: Path, value: str) -> None:
        try:
            self.fs.write(path, value + "\n")
        except OSError as err:
            status = self._last_status()
            detail = f" (kernel: {status})" if status and status != "ok" else ""
            reason = "resctrl_permission" if err.errno in (errno.EACCES, errno.EPERM) else None
            raise ResctrlError(
                os.fspath(path),
                f"writing {value!r} failed: {err.strerror or err}{detail}",
                reason=reason,
            ) from err
        self.writes += 1

    def _mkdir(self, name: str) -> None:
        """Create class `name` (ResctrlError naming the limit when no CLOSID is free)."""
        path = self._group(name)
        try:
            self.fs.mkdir(path)
        except OSError as err:
            if err.errno == errno.ENOSPC:
                raise ResctrlError(
                    os.fspath(path),
                    f"no free class of service: all {self.info.num_closids or '?'} CLOSIDs are "
                    "in use (info/L3/num_closids); remove unused classes",
                    reason="resctrl_no_closid",
                ) from err
            raise ResctrlError(os.fspath(path), f"cannot create: {err.strerror or err}") from err

    def ensure_class(
        self,
        name: str,
        *,
        l3: int | Mapping[int, int] | None = None,
        mb: int | Mapping[int, int] | None = None,
        dry_run: bool = False,
    ) -> list[Change]:
        """Create class `name` if needed and make its L3/MB lines hold these values.

        `l3`/`mb` are one value for every domain or a mapping domain id -> value; None leaves
        that resource alone. With CDP the mask goes to both L3CODE and L3DATA. Returns the
        changes (only the domains that differed are written).
        """
        want: dict[str, dict[int, str]] = {}
        if l3 is not None:
            masks = self.l3_values(l3)
            for resource in self.info.l3_resources:
                want[resource] = masks
        if mb is not None:
            want["MB"] = self.mb_values(mb)
        changes: list[Change] = []
        path = self._group(name)
        if not path.is_dir():
            if dry_run:
                current = parse_schemata(read_text(self.root / "schemata"))
            else:
                self._mkdir(name)
                current = self.read_schemata(name)
            changes.append(Change("mkdir", f"resctrl/{name}", "", name, "create"))
        else:
            current = self.read_schemata(name)
        lines: list[str] = []
        for resource, values in want.items():
            have = current.get(resource, {})
            differs = {d: v for d, v in values.items() if not _same(resource, have.get(d), v)}
            if not differs:
                continue
            lines.append(format_line(resource, differs))
            changes.append(
                Change(
                    "schemata",
                    f"resctrl/{name}",
                    format_line(resource, {d: _shown(resource, have.get(d, "")) for d in differs}),
                    format_line(resource, differs),
                )
            )
        if not dry_run:
            for line in lines:  # one line per write: the kernel reports errors per write
                self._write(path / "schemata", line)
        return changes

    def apply_policy(
        self, name: str, policy: ClassPolicy, *, dry_run: bool = False
    ) -> list[Change]:
        """Make class `name` hold what the percent interface `policy` asks on this machine."""
        masks, bandwidth = class_schemata(policy, self.info)
        return self.ensure_class(name, l3=masks, mb=bandwidth, dry_run=dry_run)

    def tasks(self, name: str) -> list[int]:
        path = self._group(name) / "tasks"
        try:
            return [int(x) for x in read_text(path).split()]
        except FileNotFoundError:
            raise ResctrlError(os.fspath(path), "no such class", reason="resctrl_missing") from None

    def assign_tasks(self, name: str, pids: Iterable[int]) -> list[Change]:
        """Move threads/processes (ids) into class `name`; ids already there are skipped.

        A task that exited in the meantime (ESRCH) is skipped, not an error.
        """
        path = self._group(name) / "tasks"
        return self._move(path, f"resctrl/{name}", set(self.tasks(name)), pids)

    def release_tasks(self, pids: Iterable[int]) -> list[Change]:
        """Move threads/processes (ids) back to the root (default) group, as the kernel does
        when their class is removed; ids already there are skipped, ESRCH is skipped."""
        path = self.root / "tasks"
        try:
            present = {int(x) for x in read_text(path).split()}
        except FileNotFoundError:
            raise ResctrlError(
                os.fspath(path), "no resctrl root group", reason="resctrl_missing"
            ) from None
        return self._move(path, "resctrl", present, pids)

    def _move(
        self, path: Path, target: str, present: set[int], pids: Iterable[int]
    ) -> list[Change]:
        changes: list[Change] = []
        for pid in pids:
            validate_pid(pid)
            if pid in present:
                continue
            try:
                self._write(path, str(pid))
            except ResctrlError as err:
                cause = err.__cause__
                if isinstance(cause, OSError) and cause.errno == errno.ESRCH:
                    continue
                raise
            present.add(pid)
            changes.append(Change("tasks", target, "", str(pid)))
        return changes

    def remove_class(self, name: str) -> None:
        """Remove class `name` (its tasks fall back to the default class)."""
        path = self._group(name)
        if not path.is_dir():
            return
        try:
            self.fs.rmdir(path)
        except OSError as err:
            raise ResctrlError(os.fspath(path), f"cannot remove: {err.strerror or err}") from err


def _shown(resource: str, value: str) -> str:
    """A value as corepin writes it (the kernel pads masks with zeros when it shows them)."""
    try:
        return f"{int(value, 16):x}" if resource.startswith("L3") else str(int(value))
    except ValueError:
        return value


def _same(resource: str, have: str | None, want: str) -> bool:
    if have is None:
        return False
    if resource.startswith("L3"):
        try:
            return int(have, 16) == int(want, 16)
        except ValueError:
            return False
    try:
        return int(have) == int(want)
    except ValueError:
        return have == want
