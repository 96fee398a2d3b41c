"""Reader of PCI devices: `<root>/sys/bus/pci/devices/*`, what a workload may want CPUs near.

Each entry of `sys/bus/pci/devices` is a symlink into `sys/devices/pci<domain>:<bus>/...`; it is
followed. Per function (Documentation/ABI/testing/sysfs-bus-pci):

| file / directory           | read as                         | when absent                   |
|----------------------------|---------------------------------|-------------------------------|
| `class`                    | 24-bit class code (`0x030200`)  | the entry is skipped (noted)  |
| `vendor`, `device`         | 16-bit ids (`0x10de`)           | 0                             |
| `numa_node`                | node id; `-1` means none        | no node (kernel without NUMA) |
| `local_cpulist`            | CPU list                        | `local_cpus` mask, else empty |
| `net/<ifname>`             | a network interface             |                               |
| `virtio*/net/<ifname>`     | the same behind a virtio device |                               |
| `nvme/<ctrl>`              | NVMe controller (`nvme0`)       |                               |
| `nvme/<ctrl>/<ctrl>nN`     | its namespaces' block devices   |                               |
| `block/<name>`, `virtio*/block/<name>` | block devices       |                               |
| `drm/card*`, `drm/renderD*`| DRM minors (`/dev/dri/...`)     |                               |
| `accel/accel*`             | compute accelerator minors      |                               |

An NVIDIA GPU (vendor 0x10de) is also `nvidiaN` (`/dev/nvidiaN`) when the driver's
`<proc-root>/driver/nvidia/gpus/<address>/information` says `Device Minor: N`.

A machine without PCI sysfs (no `sys/bus/pci/devices`: containers, non-PCI SoCs, fixture trees)
has no devices: no error, no warning. Devices matter less than CPUs, so a function whose files
cannot be used (garbage in `class`, `numa_node` or `local_cpulist`, text that is not ASCII, an
entry that is not a directory) never stops discovery: it is skipped, noted once per kind on the
`corepin.sysfs` logger (`pci_device_unreadable`, `pci_class_missing`). Missing or odd name
directories only cost the names.

Names come in `name_order`: network interfaces, NVMe controllers then their namespaces, block
devices, DRM minors, accelerator minors, `nvidiaN`; in natural order inside each kind.
"""

from __future__ import annotations

import os
import re
from typing import Final

from corepin.core.cpuset import CPUSet
from corepin.core.errors import SysfsError
from corepin.core.record import record
from corepin.sysfs.files import SysfsFiles

__all__ = ["PCI_DEVICES_DIR", "PciFunction", "name_order", "read_pci_devices"]

PCI_DEVICES_DIR: Final = "sys/bus/pci/devices"
NVIDIA_VENDOR: Final = 0x10DE

_ADDRESS = re.compile(r"^[0-9a-fA-F]{4,}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")
_NVME_CTRL = re.compile(r"^nvme\d+$")
_DRM = re.compile(r"^(card|renderD)\d+$")
_ACCEL = re.compile(r"^accel\d+$")
_MINOR = re.compile(r"^\s*Device Minor:\s*(\d+)\s*$", re.MULTILINE)
_join = os.path.join


@record
class PciFunction:
    """One PCI function as sysfs shows it (see the module docstring)."""

    address: str
    pci_class: int
    vendor: int
    device: int
    numa: int | None
    local_cpus: CPUSet
    names: tuple[str, ...]


def _natural(text: str) -> tuple[str | int, ...]:
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", text))


def _name_rank(name: str) -> int:
    if name.startswith("nvidia") and name[6:].isdigit():
        return 6
    if _ACCEL.match(name):
        return 5
    if _DRM.match(name):
        return 4
    if _NVME_CTRL.match(name):
        return 1
    if re.match(r"^nvme\d+n\d+$", name):
        return 2
    return 0


def name_order(name: str, kind_hint: str = "") -> tuple[int, tuple[str | int, ...]]:
    """Sort key of a device's names in the order discovery lists them. Network interfaces and
    block devices both rank first by name alone; `kind_hint="block"` puts a name with the
    block devices (after the NVMe namespaces)."""
    rank = _name_rank(name)
    if rank == 0 and kind_hint == "block":
        rank = 3
    return (rank, _natural(name))


def read_pci_devices(
    root: str | os.PathLike[str] = "/",
    *,
    proc_root: str | os.PathLike[str] | None = None,
    files: SysfsFiles | None = None,
) -> list[PciFunction]:
    """Every readable PCI function under `root` (see the module docstring), by address.

    `proc_root` is where `driver/nvidia/...` is looked up (default `<root>/proc`, that is /proc
    on this host); `files` shares the caller's reader (and its fallback log)."""
    reader = files if files is not None else SysfsFiles(root)
    proc = os.fspath(proc_root) if proc_root is not None else reader.path("proc")
    base = reader.path(PCI_DEVICES_DIR)
    try:
        entries = os.listdir(base)
    except OSError:  # no PCI sysfs (or none we may read): a machine without devices
        return []
    out: list[PciFunction] = []
    for entry in sorted(entries):
        path = _join(base, entry)
        if not _ADDRESS.match(entry):
            reader.note("pci_device_unreadable", path, "skipped: not a PCI address")
            continue
        try:
            function = _read_function(reader, entry.lower(), path, proc)
        except SysfsError as exc:
            reader.note("pci_device_unreadable", exc.path, f"skipped the device: {exc.problem}")
            continue
        if function is not None:
            out.append(function)
    return out


def _read_function(reader: SysfsFiles, address: str, path: str, proc: str) -> PciFunction | None:
    if not os.path.isdir(path):
        if os.path.lexists(path) and not os.path.exists(path):
            reader.note("pci_device_unreadable", path, "skipped: a dangling link")
            return None
        raise SysfsError(path, "expected a directory (or a link to one)")
    class_path = _join(path, "class")
    pci_class = _hex(reader, class_path, 24)
    if pci_class is None:
        reader.note("pci_class_missing", class_path, "skipped the device")
        return None
    vendor = _hex(reader, _join(path, "vendor"), 16) or 0
    device = _hex(reader, _join(path, "device"), 16) or 0
    numa_path = _join(path, "numa_node")
    numa = reader.integer(numa_path, required=False)
    if numa is not None and numa < -1:
        raise SysfsError(numa_path, f"expected a node id or -1, got {numa}")
    local = reader.cpulist(_join(path, "local_cpulist"), required=False)
    if local is None:
        local = reader.cpumask(_join(path, "local_cpus"), required=False)
    names = _names(path)
    if vendor == NVIDIA_VENDOR:
        minor = _nvidia_minor(reader, _join(proc, "driver", "nvidia", "gpus", address))
        if minor is not None:
            names.append((name_order(f"nvidia{minor}"), f"nvidia{minor}"))
    return PciFunction(
        address=address,
        pci_class=pci_class,
        vendor=vendor,
        device=device,
        numa=None if numa is None or numa < 0 else numa,
        local_cpus=local if local is not None else CPUSet(),
        names=tuple(name for _, name in sorted(set(names))),
    )


def _hex(reader: SysfsFiles, path: str, bits: int) -> int | None:
    text = reader.text(path, required=False)
    if text is None:
        return None
    try:
        value = int(text, 16)
    except ValueError:
        raise SysfsError(path, f"expected a hex number, got {text[:40]!r}") from None
    if not 0 <= value < 1 << bits:
        raise SysfsError(path, f"expected a {bits}-bit hex number, got {text[:40]!r}")
    return value


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:  # absent, a file, unreadable: no names of this kind
        return []


def _names(path: str) -> list[tuple[tuple[int, tuple[str | int, ...]], str]]:
    found: list[tuple[tuple[int, tuple[str | int, ...]], str]] = []

    def add(name: str, hint: str = "") -> None:
        if name and name.isprintable() and "/" not in name:
            found.append((name_order(name, hint), name))

    holders = [path] + [
        _join(path, child) for child in _listdir(path) if re.match(r"^virtio\d+$", child)
    ]
    for holder in holders:
        for name in _listdir(_join(holder, "net")):
            add(name)
        for name in _listdir(_join(holder, "block")):
            add(name, "block")
    for ctrl in _listdir(_join(path, "nvme")):
        if not _NVME_CTRL.match(ctrl):
            continue
        add(ctrl)
        for child in _listdir(_join(path, "nvme", ctrl)):
            if re.match(rf"^{ctrl}n\d+$", child):
                add(child, "block")
    for name in _listdir(_join(path, "drm")):
        if _DRM.match(name):
            add(name)
    for name in _listdir(_join(path, "accel")):
        if _ACCEL.match(name):
            add(name)
    return found


def _nvidia_minor(reader: SysfsFiles, gpu_dir: str) -> int | None:
    """The minor of `/dev/nvidiaN` from the NVIDIA driver's information file, None when the
    driver does not say (not loaded, another driver, unreadable)."""
    try:
        text = reader.text(_join(gpu_dir, "information"), required=False)
    except SysfsError:
        return None
    if text is None:
        return None
    match = _MINOR.search(text)
    return int(match.group(1)) if match else None
