"""A resctrl filesystem laid out as the kernel documents it, and a fake kernel that takes writes.

`make_resctrl_tree(root, ...)` builds the mount's files (the `info` directory per resource, the
root group's `schemata`, `tasks`, `cpus`, `mon_data`...) for an Intel or AMD machine, with or
without CDP, MBA and monitoring, and returns a `FakeResctrlKernel`: pass it as the writer's
`fs` and every write, mkdir and rmdir goes through checks that refuse what the kernel refuses
(EINVAL with a message in `info/last_cmd_status`, ENOSPC when no CLOSID is left, ESRCH for a
task that is gone), and a new group gets its own files, as the kernel makes them.
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["FakeResctrlKernel", "make_resctrl_tree"]

_COUNTERS = ("llc_occupancy", "mbm_total_bytes", "mbm_local_bytes")
_RESERVED = frozenset({"info", "mon_groups", "mon_data"})


def _refuse(code: int) -> OSError:
    return OSError(code, os.strerror(code))


@dataclass
class FakeResctrlKernel:
    """The checks resctrl makes on writes to its files, on a tree made by `make_resctrl_tree`."""

    root: Path
    vendor: str
    l3_ids: tuple[int, ...]
    mb_ids: tuple[int, ...]
    cbm_mask: int
    min_cbm_bits: int
    sparse_masks: bool
    cdp: bool
    mba: bool
    bandwidth_gran: int
    min_bandwidth: int
    num_closids: int
    mon: bool
    mba_mbps: bool = False
    #: task ids that no longer exist: writing one to `tasks` fails with ESRCH
    gone: set[int] = field(default_factory=set)
    #: (path relative to root, text) of every write that the kernel took
    written: list[tuple[str, str]] = field(default_factory=list)
    #: groups (paths relative to root) made and removed, in order
    made: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)

    # ------------------------------------------------------------------ layout
    @property
    def l3_names(self) -> tuple[str, ...]:
        return ("L3CODE", "L3DATA") if self.cdp else ("L3",)

    @property
    def mb_default(self) -> int:
        if self.mba_mbps:
            return 2**32 - 1  # mounted with mba_MBps: MB/s, unlimited by default
        return 2048 if self.vendor == "amd" else 100

    def default_schemata(self) -> dict[str, dict[int, int]]:
        out = {name: dict.fromkeys(self.l3_ids, self.cbm_mask) for name in self.l3_names}
        if self.mba:
            out["MB"] = dict.fromkeys(self.mb_ids, self.mb_default)
        return out

    def render(self, values: dict[str, dict[int, int]]) -> str:
        """As the kernel prints schemata: names right-aligned, masks zero-padded hex, MB
        values padded to three places."""
        width = max(len(name) for name in values)
        mask_width = (self.cbm_mask.bit_length() + 3) // 4
        lines = []
        for name, domains in values.items():
            if name == "MB":
                items = [f"{d}={v:>3d}" for d, v in sorted(domains.items())]
            else:
                items = [f"{d}={v:0{mask_width}x}" for d, v in sorted(domains.items())]
            lines.append(f"{name:>{width}}:" + ";".join(items))
        return "\n".join(lines) + "\n"

    def _parse_shown(self, group: Path) -> dict[str, dict[int, int]]:
        out: dict[str, dict[int, int]] = {}
        for line in (group / "schemata").read_text().splitlines():
            name, _, body = line.strip().partition(":")
            base = 10 if name == "MB" else 16
            out[name] = {
                int(d): int(v.strip(), base)
                for d, _, v in (i.partition("=") for i in body.split(";"))
            }
        return out

    def _make_mon_data(self, group: Path) -> None:
        if not self.mon:
            return
        for cache_id in self.l3_ids:
            folder = group / "mon_data" / f"mon_L3_{cache_id:02d}"
            folder.mkdir(parents=True)
            for counter in _COUNTERS:
                (folder / counter).write_text("0\n")

    def set_counter(
        self,
        group: str | None,
        cache_id: int,
        counter: str,
        value: int | str,
        *,
        mon_group: str | None = None,
    ) -> None:
        """Make a monitoring file read `value` (a number, or the kernel's Unavailable/Error)."""
        base = self.root if group is None else self.root / group
        if mon_group is not None:
            base = base / "mon_groups" / mon_group
        (base / "mon_data" / f"mon_L3_{cache_id:02d}" / counter).write_text(f"{value}\n")

    # ------------------------------------------------------------------ kernel behaviour
    def _status(self, message: str) -> None:
        (self.root / "info" / "last_cmd_status").write_text(message + "\n")

    def _invalid(self, message: str) -> OSError:
        self._status(message)
        return _refuse(errno.EINVAL)

    def _control_groups(self) -> list[Path]:
        return [p for p in self.root.iterdir() if p.is_dir() and p.name not in _RESERVED]

    def mkdir(self, path: Path) -> None:
        path = Path(path)
        parent = path.parent
        if parent.name == "mon_groups":
            path.mkdir()
            (path / "tasks").write_text("")
            self._make_mon_data(path)
            self._status("ok")
            self.made.append(os.fspath(path.relative_to(self.root)))
            return
        if parent != self.root:
            raise _refuse(errno.EPERM)
        if path.exists():
            raise _refuse(errno.EEXIST)
        if len(self._control_groups()) + 1 >= self.num_closids:  # the root group holds CLOSID 0
            self._status("Out of CLOSIDs")
            raise _refuse(errno.ENOSPC)
        path.mkdir()
        (path / "schemata").write_text(self.render(self.default_schemata()))
        for name in ("tasks", "cpus_list"):
            (path / name).write_text("\n" if name == "cpus_list" else "")
        (path / "cpus").write_text("0\n")
        (path / "mode").write_text("shareable\n")
        (path / "mon_groups").mkdir()
        self._make_mon_data(path)
        self._status("ok")
        self.made.append(path.name)

    def rmdir(self, path: Path) -> None:
        path = Path(path)
        if path == self.root or path.name in _RESERVED or not path.is_dir():
            raise _refuse(errno.EPERM if path.is_dir() else errno.ENOENT)
        moved = (path / "tasks").read_text().split()
        shutil.rmtree(path)
        if moved and path.parent == self.root:
            with open(self.root / "tasks", "a") as handle:
                handle.write("".join(f"{t}\n" for t in moved))
        self._status("ok")
        self.removed.append(os.fspath(path.relative_to(self.root)))

    def write(self, path: Path, text: str) -> None:
        path = Path(path)
        if path.name == "schemata":
            self._write_schemata(path.parent, text)
        elif path.name == "tasks":
            self._write_tasks(path.parent, text)
        else:
            path.write_text(text)
            self._status("ok")
        self.written.append((os.fspath(path.relative_to(self.root)), text))

    def _write_tasks(self, group: Path, text: str) -> None:
        try:
            pid = int(text.strip())
        except ValueError:
            raise _refuse(errno.EINVAL) from None
        if pid in self.gone:
            self._status(f"No task {pid}")
            raise _refuse(errno.ESRCH)
        for other in [self.root, *self._control_groups()]:
            tasks = other / "tasks"
            kept = [t for t in tasks.read_text().split() if int(t) != pid]
            tasks.write_text("".join(f"{t}\n" for t in kept))
        with open(group / "tasks", "a") as handle:
            handle.write(f"{pid}\n")
        self._status("ok")

    def _write_schemata(self, group: Path, text: str) -> None:
        if not text.endswith("\n"):
            raise self._invalid("schemata write must end with a newline")
        shown = self._parse_shown(group)
        for line in text.splitlines():
            line = line.strip()
            if not line:
                continue
            name, colon, body = line.partition(":")
            if not colon:
                raise self._invalid("Missing ':'")
            if name not in shown:
                raise self._invalid(f"Unknown or unsupported resource name '{name}'")
            for item in body.split(";"):
                ident, eq, value = item.strip().partition("=")
                if not eq or not ident.strip().isdigit():
                    raise self._invalid("Missing '=' or non-numeric domain")
                domain = int(ident)
                if domain not in shown[name]:
                    raise self._invalid(f"Unknown domain {domain} for resource {name}")
                shown[name][domain] = self._check(name, value.strip())
        (group / "schemata").write_text(self.render(shown))
        self._status("ok")

    def _check(self, name: str, value: str) -> int:
        if name == "MB":
            if not value.isdigit():
                raise self._invalid(f"Non-decimal digit in MB value {value}")
            bw = int(value)
            low, high = self.min_bandwidth, self.mb_default
            if bw < low or bw > high:
                raise self._invalid(f"MB value {bw} out of range [{low},{high}]")
            if self.vendor == "intel" and not self.mba_mbps:
                bw = -(-bw // self.bandwidth_gran) * self.bandwidth_gran
            return bw
        try:
            mask = int(value, 16)
        except ValueError:
            raise self._invalid(f"Non-hex character in the mask {value}") from None
        if mask == 0 or mask & ~self.cbm_mask:
            raise self._invalid("Mask out of range")
        low = mask & -mask
        if (mask + low) & mask and not self.sparse_masks:
            raise self._invalid(f"The mask {mask:x} has non-consecutive 1-bits")
        if mask.bit_count() < self.min_cbm_bits:
            raise self._invalid(f"Need at least {self.min_cbm_bits} bits in the mask")
        return mask


def make_resctrl_tree(
    root: Path,
    *,
    vendor: str = "intel",
    l3_ids: Iterable[int] = (0, 1),
    mb_ids: Iterable[int] | None = None,
    cbm_mask: str = "fffff",
    min_cbm_bits: int = 1,
    sparse_masks: bool = False,
    shareable_bits: str = "0",
    cdp: bool = False,
    mba: bool = True,
    bandwidth_gran: int = 10,
    min_bandwidth: int = 10,
    num_closids: int = 16,
    mon: bool = True,
    mba_mbps: bool = False,
    num_rmids: int = 176,
) -> FakeResctrlKernel:
    """Lay out a resctrl mount at `root` (which may exist, empty) and return its fake kernel."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    l3 = tuple(l3_ids)
    kernel = FakeResctrlKernel(
        root=root,
        vendor=vendor,
        l3_ids=l3,
        mb_ids=tuple(mb_ids) if mb_ids is not None else l3,
        cbm_mask=int(cbm_mask, 16),
        min_cbm_bits=min_cbm_bits,
        sparse_masks=sparse_masks,
        cdp=cdp,
        mba=mba,
        bandwidth_gran=bandwidth_gran if vendor == "intel" else 1,
        min_bandwidth=min_bandwidth if vendor == "intel" else 0,
        num_closids=num_closids,
        mon=mon,
        mba_mbps=mba_mbps,
    )
    info = root / "info"
    for name in kernel.l3_names:
        _files(
            info / name,
            cbm_mask=cbm_mask,
            min_cbm_bits=min_cbm_bits,
            num_closids=num_closids,
            shareable_bits=shareable_bits,
            sparse_masks=int(sparse_masks),
        )
    if mba:
        _files(
            info / "MB",
            bandwidth_gran=kernel.bandwidth_gran,
            min_bandwidth=kernel.min_bandwidth,
            num_closids=num_closids,
            delay_linear=1 if vendor == "intel" else 0,
        )
    if mon:
        (info / "L3_MON").mkdir(parents=True)
        (info / "L3_MON" / "mon_features").write_text("".join(f"{c}\n" for c in _COUNTERS))
        _files(info / "L3_MON", num_rmids=num_rmids, max_threshold_occupancy=1048576)
    (info / "last_cmd_status").write_text("ok\n")
    (root / "schemata").write_text(kernel.render(kernel.default_schemata()))
    (root / "tasks").write_text("")
    (root / "cpus").write_text("ff\n")
    (root / "cpus_list").write_text("0-7\n")
    (root / "mode").write_text("shareable\n")
    (root / "mon_groups").mkdir()
    kernel._make_mon_data(root)
    return kernel


def _files(folder: Path, **values: object) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, value in values.items():
        (folder / name).write_text(f"{value}\n")
