"""PCI devices of the machine model: what a workload may want its CPUs near.

A `Device` is one PCI function as the kernel shows it under `/sys/bus/pci/devices/<address>`:
its class code, vendor and device ids, the NUMA node it hangs off (`numa_node`, None when the
firmware says -1), the CPUs local to it (`local_cpulist`) and the names it goes by (a network
interface, an NVMe controller and its block devices, DRM and accelerator minors, `nvidiaN`).

`kind` sorts devices the way users ask for them, from the PCI class code (base class, subclass):
display controllers (0x03) are `gpu`, network controllers (0x02) `nic`, NVMe (0x0108) `nvme`,
processing accelerators (0x12) `accelerator`, anything else `other`.

`find_device` resolves what a user types (`--near`): a PCI address (with or without the
`0000:` domain), a name (`eth0`, `nvme0n1`, `renderD128`), or a device node (`/dev/nvidia0`,
`/dev/nvme0n1`, `/dev/dri/card0`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

from corepin.core.cpuset import CPUSet
from corepin.core.errors import TopologyError
from corepin.core.record import record

__all__ = ["DEVICE_KINDS", "Device", "find_device", "kind_of"]

DEVICE_KINDS: Final = ("gpu", "nic", "nvme", "accelerator", "other")


def kind_of(pci_class: int) -> str:
    """The kind of a device with 24-bit PCI class code `pci_class` (see the module docstring)."""
    base, sub = pci_class >> 16 & 0xFF, pci_class >> 8 & 0xFF
    if base == 0x03:
        return "gpu"
    if base == 0x02:
        return "nic"
    if base == 0x01 and sub == 0x08:
        return "nvme"
    if base == 0x12:
        return "accelerator"
    return "other"


def _full_address(address: str) -> str:
    """`3b:00.0` -> `0000:3b:00.0` (lower case); a full address as it is."""
    text = address.strip().lower()
    return text if text.count(":") >= 2 else f"0000:{text}"


@record
class Device:
    """One PCI function (see the module docstring)."""

    address: str
    pci_class: int = 0
    vendor: int = 0
    device: int = 0
    numa: int | None = None
    local_cpus: CPUSet = CPUSet()
    names: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "address", _full_address(self.address))

    @property
    def kind(self) -> str:
        return kind_of(self.pci_class)

    def to_json(self) -> dict[str, Any]:
        return {
            "address": self.address,
            "class": f"0x{self.pci_class:06x}",
            "vendor": f"0x{self.vendor:04x}",
            "device": f"0x{self.device:04x}",
            "kind": self.kind,
            "names": list(self.names),
            "numa": self.numa,
            "local_cpus": str(self.local_cpus),
        }

    @classmethod
    def from_json(cls, where: str, row: object) -> Device:
        """A device from its JSON (`to_json`); TopologyError naming `where` and the field."""
        if not isinstance(row, Mapping):
            raise TopologyError(f"{where} must be an object, got {row!r}")
        address = row.get("address")
        if not isinstance(address, str) or not address:
            raise TopologyError(f'{where}: "address" must be a PCI address string')
        numa = row.get("numa")
        if numa is not None and (isinstance(numa, bool) or not isinstance(numa, int) or numa < 0):
            raise TopologyError(f'{where}: "numa" must be a node id or null, got {numa!r}')
        names = row.get("names", [])
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise TopologyError(f'{where}: "names" must be a list of strings')
        local = row.get("local_cpus", "")
        if not isinstance(local, str):
            raise TopologyError(f'{where}: "local_cpus" must be a CPU list string')
        try:
            cpus = CPUSet.parse(local)
        except ValueError as exc:
            raise TopologyError(f"{where}: local_cpus: {exc}") from exc
        return cls(
            address=address,
            pci_class=_hex(where, row, "class"),
            vendor=_hex(where, row, "vendor"),
            device=_hex(where, row, "device"),
            numa=numa,
            local_cpus=cpus,
            names=tuple(names),
        )


def _hex(where: str, row: Mapping[str, Any], key: str) -> int:
    value = row.get(key, 0)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, str):
        try:
            return int(value, 16)
        except ValueError:
            pass
    raise TopologyError(f'{where}: "{key}" must be a hex string such as "0x0302", got {value!r}')


def find_device(devices: Iterable[Device], name: str) -> Device | None:
    """The device `name` means (see the module docstring), None when none does."""
    text = name.strip()
    if not text:
        return None
    base = text.rsplit("/", 1)[-1] if text.startswith("/dev/") else text
    address = _full_address(text) if ":" in text else None
    for device in devices:
        if address is not None and device.address == address:
            return device
        if base in device.names:
            return device
    return None
