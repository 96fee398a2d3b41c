"""resctrl: L3 cache allocation (CAT) and memory bandwidth allocation (MBA) classes.

A class is a directory in the resctrl filesystem (root parameter, normally /sys/fs/resctrl) with
a `schemata` file and a `tasks` file. Lines of `schemata` look like

    L3:0=fffff;1=fffff        cache bit masks per L3 cache id (hex)
    MB:0=100;1=100            memory bandwidth per domain

Memory bandwidth comes in two units:
- percent (Intel MBA): `info/MB/min_bandwidth` .. 100 in steps of `info/MB/bandwidth_gran`; the
  kernel rounds a value up to the granularity, so corepin writes the rounded value;
- absolute (AMD, and Intel mounted with `mba_MBps`): AMD counts in 1/8 GB/s units up to the
  root group's default (2048 on current parts); `mba_MBps` in MB/s.
The unit comes from `vendor` ("intel"/"amd") when given, else from the root group's default MB
values (anything above 100 is absolute).

Domain ids are whatever the machine exposes (0,2,4 on some parts); they are read from the root
group's schemata and never assumed contiguous. A bit mask must be non-zero, within
`info/L3/cbm_mask`, have at least `info/L3/min_cbm_bits` bits, and be contiguous unless
`info/L3/sparse_masks` is 1.

Idempotent like the cgroup drivers: read the class's schemata, write only the domains that
differ; tasks already in the class are not written again. Every write is reported as a
`corepin.enforcement.note.Change` (`mkdir`, `schemata`, `tasks`), as the reconcile engine
reports its own.

Reached only from its tests for now: it is kept because node QoS (cache and memory-bandwidth
classes per QoS class, on a host and on a node) builds on it; what nothing was going to use
(an L2 comparison for lines it never writes, an unused return value) is gone.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from corepin.core.errors import EnvironmentProblem, InputError
from corepin.core.ids import IdError, validate_component, validate_pid
from corepin.enforcement.note import Change

__all__ = [
    "ResctrlError",
    "ResctrlInfo",
    "ResctrlValueError",
    "ResctrlWriter",
    "check_cbm",
]

_RESERVED: Final = frozenset({"info", "mon_groups", "mon_data"})


class ResctrlError(EnvironmentProblem):
    """A resctrl operation failed (names the path; the kernel's last_cmd_status when known)."""

    default_reason = "resctrl"

    def __init__(self, path: str, problem: str, *, reason: str | None = None) -> None:
        self.path = path
        self.problem = problem
        super().__init__(f"{path}: {problem}", reason=reason)


class ResctrlValueError(InputError, ValueError):
    """A schemata value this machine cannot take (bad mask, bandwidth out of range, no domain)."""

    default_reason = "bad_resctrl_value"


@dataclass(frozen=True, slots=True)
class ResctrlInfo:
    """What the resctrl `info` directory and the root group say about this machine."""

    l3_domains: tuple[int, ...] = ()
    cbm_mask: int | None = None
    min_cbm_bits: int = 1
    sparse_masks: bool = False
    num_closids: int | None = None
    mb_domains: tuple[int, ...] = ()
    mb_unit: str | None = None  # "percent" | "absolute" | None (no MBA)
    bandwidth_gran: int = 1
    min_bandwidth: int = 0
    max_bandwidth: int = 100
    l3_resource: str = "L3"  # "L3", or "L3CODE"/"L3DATA" pairs with CDP (only L3 is managed)


def check_cbm(mask: int, info: ResctrlInfo, *, domain: int | None = None) -> int:
    """Validate a cache bit mask for this machine; return it."""
    where = f" for cache id {domain}" if domain is not None else ""
    if mask <= 0:
        raise ResctrlValueError(f"cache mask {mask:#x}{where} must have at least one bit")
    if info.cbm_mask is not None and mask & ~info.cbm_mask:
        raise ResctrlValueError(
            f"cache mask {mask:x}{where} has bits outside info/L3/cbm_mask {info.cbm_mask:x}"
        )
    if mask.bit_count() < info.min_cbm_bits:
        raise ResctrlValueError(
            f"cache mask {mask:x}{where} has {mask.bit_count()} bits; this machine needs at "
            f"least {info.min_cbm_bits} (info/L3/min_cbm_bits)"
        )
    low = mask & -mask
    contiguous = (mask + low) & mask == 0
    if not contiguous and not info.sparse_masks:
        raise ResctrlValueError(
            f"cache mask {mask:x}{where} is not contiguous; this machine needs one run of set "
            "bits (no info/L3/sparse_masks)"
        )
    return mask


def _read(path: Path) -> str:
    return path.read_text(encoding="ascii", errors="replace").strip()


def _read_int(path: Path, default: int | None, base: int = 10) -> int | None:
    try:
        return int(_read(path), base)
    except (OSError, ValueError):
        return default


def parse_schemata(text: str) -> dict[str, dict[int, str]]:
    """`L3:0=ff;1=ff` lines -> {"L3": {0: "ff", 1: "ff"}} (values kept as text)."""
    out: dict[str, dict[int, str]] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or ":" not in line:
            continue
        resource, _, body = line.partition(":")
        domains: dict[int, str] = {}
        for item in body.split(";"):
            item = item.strip()
            if not item:
                continue
            ident, sep, value = item.partition("=")
            if not sep:
                raise ResctrlError("schemata", f"malformed entry {item!r} in line {line!r}")
            domains[int(ident)] = value.strip()
        out[resource.strip()] = domains
    return out


def format_line(resource: str, values: Mapping[int, str]) -> str:
    return f"{resource}:" + ";".join(f"{d}={v}" for d, v in sorted(values.items()))


@dataclass
class ResctrlWriter:
    """Creates and updates resctrl classes under `root`."""

    root: Path = Path("/sys/fs/resctrl")
    vendor: str | None = None
    fake_tree: bool = False
    writes: int = field(default=0, init=False)
    _info: ResctrlInfo | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.root = Path(self.root)
        if self.vendor is not None:
            self.vendor = self.vendor.lower()
            if self.vendor not in ("intel", "amd"):
                raise IdError("CPU vendor", self.vendor, "is not 'intel' or 'amd'")

    # ------------------------------------------------------------------ machine facts
    @property
    def info(self) -> ResctrlInfo:
        if self._info is None:
            self._info = self._read_info()
        return self._info

    def _read_info(self) -> ResctrlInfo:
        schemata_file = self.root / "schemata"
        try:
            root = parse_schemata(_read(schemata_file))
        except FileNotFoundError:
            raise ResctrlError(
                os.fspath(self.root),
                "no resctrl filesystem here (mount -t resctrl resctrl /sys/fs/resctrl; needs "
                "RDT/PQoS support in CPU and kernel)",
                reason="resctrl_unavailable",
            ) from None
        except (OSError, ValueError) as err:
            raise ResctrlError(os.fspath(schemata_file), f"unreadable: {err}") from err
        info_l3 = self.root / "info" / "L3"
        info_mb = self.root / "info" / "MB"
        l3_resource = "L3" if "L3" in root else ("L3CODE" if "L3CODE" in root else "L3")
        if l3_resource != "L3" and not info_l3.exists():
            info_l3 = self.root / "info" / "L3CODE"
        mb = root.get("MB", {})
        unit: str | None = None
        max_bw = 100
        if mb:
            defaults = [int(v) for v in mb.values() if v.isdigit()]
            if self.vendor == "amd" or (self.vendor is None and any(v > 100 for v in defaults)):
                unit = "absolute"
                max_bw = max(defaults, default=2048)
            else:
                unit = "percent"
        sparse = _read_int(info_l3 / "sparse_masks", 0)
        return ResctrlInfo(
            l3_domains=tuple(sorted(root.get(l3_resource, {}))),
            cbm_mask=_read_int(info_l3 / "cbm_mask", None, 16),
            min_cbm_bits=_read_int(info_l3 / "min_cbm_bits", 1) or 1,
            sparse_masks=bool(sparse),
            num_closids=_read_int(info_l3 / "num_closids", None),
            mb_domains=tuple(sorted(mb)),
            mb_unit=unit,
            bandwidth_gran=_read_int(info_mb / "bandwidth_gran", 1) or 1,
            min_bandwidth=_read_int(info_mb / "min_bandwidth", 0) or 0,
            max_bandwidth=max_bw,
            l3_resource=l3_resource,
        )

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
        """Validated cache masks per L3 id, as the kernel prints them (hex)."""
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
            return parse_schemata(_read(path))
        except FileNotFoundError:
            raise ResctrlError(os.fspath(path), "no such class", reason="resctrl_missing") from None

    def _last_status(self) -> str:
        try:
            return _read(self.root / "info" / "last_cmd_status")
        except OSError:
            return ""

    def _write(self, path: Path, value: str) -> None:
        try:
            mode = "a" if self.fake_tree and path.name == "tasks" else "w"
            with open(path, mode, encoding="ascii") as handle:
                handle.write(value + "\n")
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
        info = self.info
        try:
            if self.fake_tree and info.num_closids and len(self.classes()) + 1 >= info.num_closids:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # the default uses one
            os.mkdir(path)
        except OSError as err:
            if err.errno == errno.ENOSPC:
                raise ResctrlError(
                    os.fspath(path),
                    f"no free class of service: all {info.num_closids or '?'} CLOSIDs are in "
                    "use (info/L3/num_closids); remove unused classes",
                    reason="resctrl_no_closid",
                ) from err
            raise ResctrlError(os.fspath(path), f"cannot create: {err.strerror or err}") from err
        if self.fake_tree:
            # the kernel gives a new group the default (root) schemata and an empty task list
            (path / "schemata").write_text(_read(self.root / "schemata") + "\n")
            (path / "tasks").write_text("")

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
        that resource alone. Returns the changes (only the domains that differed are written).
        """
        want: dict[str, dict[int, str]] = {}
        if l3 is not None:
            want[self.info.l3_resource] = self.l3_values(l3)
        if mb is not None:
            want["MB"] = self.mb_values(mb)
        changes: list[Change] = []
        path = self._group(name)
        if not path.is_dir():
            if dry_run:
                current = parse_schemata(_read(self.root / "schemata"))
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
                    format_line(resource, {d: have.get(d, "") for d in differs}),
                    format_line(resource, differs),
                )
            )
        if lines and not dry_run:
            target = path / "schemata"
            if self.fake_tree:
                merged = {r: dict(v) for r, v in current.items()}
                for resource, values in want.items():
                    merged.setdefault(resource, {}).update(values)
                self._write(target, "\n".join(format_line(r, v) for r, v in merged.items()))
            else:
                for line in lines:  # one line per write: the kernel reports errors per write
                    self._write(target, line)
        return changes

    def tasks(self, name: str) -> list[int]:
        path = self._group(name) / "tasks"
        try:
            return [int(x) for x in _read(path).split()]
        except FileNotFoundError:
            raise ResctrlError(os.fspath(path), "no such class", reason="resctrl_missing") from None

    def assign_tasks(self, name: str, pids: Iterable[int]) -> list[Change]:
        """Move threads/processes (ids) into class `name`; ids already there are skipped.

        A task that exited in the meantime (ESRCH) is skipped, not an error.
        """
        present = set(self.tasks(name))
        changes: list[Change] = []
        path = self._group(name) / "tasks"
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
            changes.append(Change("tasks", f"resctrl/{name}", "", str(pid)))
        return changes

    def remove_class(self, name: str) -> None:
        """Remove class `name` (its tasks fall back to the default class)."""
        path = self._group(name)
        if not path.is_dir():
            return
        if self.fake_tree:
            with os.scandir(path) as entries:
                files = [entry.path for entry in entries if entry.is_file()]
            for name in files:
                os.unlink(name)
        try:
            os.rmdir(path)
        except OSError as err:
            raise ResctrlError(os.fspath(path), f"cannot remove: {err.strerror or err}") from err


def _same(resource: str, have: str | None, want: str) -> bool:
    if have is None:
        return False
    if resource.startswith("L3"):
        try:
            return int(have, 16) == int(want, 16)
        except ValueError:
            return False
    return have == want
