"""PCI device discovery (`corepin.sysfs.pci`, `discover`): the names every kind of device goes by,
NUMA nodes and local CPUs, missing files, symlinked and dangling entries, machines without PCI
sysfs, garbage in the files, and this host's own /sys.

Trees are written by `corepin.testing` (`with_devices`, `write_sysfs_tree`) and then edited the
way kernels, drivers and broken firmware differ.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corepin import CPUSet
from corepin.sysfs.files import SysfsFiles
from corepin.sysfs.pci import PciFunction, name_order, read_pci_devices
from corepin.testing import (
    accelerator,
    gpu,
    nic,
    nvme,
    with_devices,
    write_pci_devices,
    write_sysfs_tree,
)
from corepin.testing.machines import dual_socket_ht, single_socket_ht
from corepin.topology.devices import Device, find_device
from corepin.topology.discover import discover
from corepin.topology.model import Topology
from support.budget import examples

BUS = "sys/bus/pci/devices"
GPU = "0000:81:00.0"
NIC = "0000:01:00.0"


def put(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def by_address(functions: list[PciFunction]) -> dict[str, PciFunction]:
    return {f.address: f for f in functions}


def sysfs_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "corepin.sysfs"]


@pytest.fixture
def machine() -> Topology:
    """2 sockets, a GPU on node 1, a NIC and an NVMe drive on node 0, an accelerator without a
    node."""
    return with_devices(
        dual_socket_ht(),
        gpu(GPU, numa=1),
        nic(NIC, numa=0, ifname="enp1s0f0"),
        nvme("0000:02:00.0", numa=0, namespaces=2),
        accelerator("0000:c1:00.0"),
    )


@pytest.fixture
def tree(machine: Topology) -> Iterator[Path]:
    base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    root = Path(tempfile.mkdtemp(prefix="corepin-pci-", dir=base))
    try:
        write_sysfs_tree(machine, root)
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def device_dir(root: Path, address: str) -> Path:
    return (root / BUS / address).resolve()


# ---------------------------------------------------------------- what is read


def test_a_written_machine_with_devices_is_discovered_as_it_was_built(
    tree: Path, machine: Topology
) -> None:
    assert discover(tree) == machine
    devices = {d.address: d for d in discover(tree).devices}
    assert devices[GPU].kind == "gpu" and devices[GPU].numa == 1
    assert devices[GPU].local_cpus == CPUSet.parse("8-15,24-31")
    assert devices[NIC].numa == 0 and devices[NIC].names == ("enp1s0f0",)


def test_every_kind_of_name_is_found(tree: Path) -> None:
    found = by_address(read_pci_devices(tree))
    assert found[GPU].names == ("card0", "renderD128", "nvidia0")
    assert found[NIC].names == ("enp1s0f0",)
    assert found["0000:02:00.0"].names == ("nvme0", "nvme0n1", "nvme0n2")
    assert found["0000:c1:00.0"].names == ("accel0",)
    assert (found[GPU].pci_class, found[GPU].vendor, found[GPU].device) == (
        0x030200,
        0x10DE,
        0x2330,
    )


def test_block_devices_and_interfaces_behind_a_virtio_function_are_its_names(
    tmp_path: Path,
) -> None:
    write_pci_devices([Device("0000:00:02.0", pci_class=0x010000)], tmp_path)
    write_pci_devices([Device("0000:00:03.0", pci_class=0x020000)], tmp_path)
    put(tmp_path, "sys/devices/pci0000:00/0000:00:02.0/virtio1/block/vda/size", "8\n")
    put(tmp_path, "sys/devices/pci0000:00/0000:00:03.0/virtio2/net/eth0/ifindex", "2\n")
    put(tmp_path, "sys/devices/pci0000:00/0000:00:02.0/block/sdb/size", "8\n")
    found = by_address(read_pci_devices(tmp_path))
    assert found["0000:00:02.0"].names == ("sdb", "vda")
    assert found["0000:00:03.0"].names == ("eth0",)


def test_names_come_in_discovery_order_naturally_sorted() -> None:
    names = ["nvidia1", "renderD129", "card10", "card9", "eth10", "eth9", "accel0", "nvme3"]
    assert sorted(names, key=name_order) == [
        "eth9",
        "eth10",
        "nvme3",
        "card9",
        "card10",
        "renderD129",
        "accel0",
        "nvidia1",
    ]


def test_names_of_other_forms_in_drm_accel_or_nvme_are_ignored(tree: Path) -> None:
    gpu_dir = device_dir(tree, GPU)
    (gpu_dir / "drm" / "controlD64").mkdir()
    (gpu_dir / "accel" / "oddname").mkdir(parents=True)
    nvme_dir = device_dir(tree, "0000:02:00.0")
    (nvme_dir / "nvme" / "nvme0" / "power").mkdir()
    (nvme_dir / "nvme" / "hwmon1").mkdir()
    found = by_address(read_pci_devices(tree))
    assert found[GPU].names == ("card0", "renderD128", "nvidia0")
    assert found["0000:02:00.0"].names == ("nvme0", "nvme0n1", "nvme0n2")


def test_discovered_devices_are_found_by_every_name_and_address(tree: Path) -> None:
    devices = discover(tree).devices
    for name in ("nvidia0", "/dev/nvidia0", "/dev/dri/renderD128", "81:00.0", GPU):
        found = find_device(devices, name)
        assert found is not None and found.address == GPU, name
    nvme_dev = find_device(devices, "/dev/nvme0n2")
    assert nvme_dev is not None and nvme_dev.kind == "nvme"


# ---------------------------------------------------------------- NUMA node and local CPUs


def test_numa_node_minus_one_means_no_node(tree: Path) -> None:
    found = by_address(read_pci_devices(tree))
    assert found["0000:c1:00.0"].numa is None
    assert found["0000:c1:00.0"].local_cpus == CPUSet.parse("0-31")


def test_a_missing_numa_node_file_means_no_node_and_no_warning(
    tree: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (device_dir(tree, GPU) / "numa_node").unlink()
    with caplog.at_level(logging.WARNING, logger="corepin.sysfs"):
        found = by_address(read_pci_devices(tree))
    assert found[GPU].numa is None
    assert sysfs_warnings(caplog) == []


def test_local_cpus_come_from_the_mask_when_the_list_is_missing(tree: Path) -> None:
    (device_dir(tree, GPU) / "local_cpulist").unlink()
    found = by_address(read_pci_devices(tree))
    assert found[GPU].local_cpus == CPUSet.parse("8-15,24-31")


@pytest.mark.parametrize("empty", [True, False])
def test_local_cpus_are_empty_when_missing_or_empty(tree: Path, empty: bool) -> None:
    d = device_dir(tree, GPU)
    (d / "local_cpus").unlink()
    if empty:
        (d / "local_cpulist").write_text("\n")
    else:
        (d / "local_cpulist").unlink()
    found = by_address(read_pci_devices(tree))
    assert found[GPU].local_cpus == CPUSet()
    assert found[GPU].numa == 1


def test_missing_ids_read_as_zero(tree: Path) -> None:
    d = device_dir(tree, NIC)
    (d / "vendor").unlink()
    (d / "device").unlink()
    found = by_address(read_pci_devices(tree))
    assert (found[NIC].vendor, found[NIC].device) == (0, 0)
    assert found[NIC].names == ("enp1s0f0",)


# ---------------------------------------------------------------- the NVIDIA driver's minor


def test_without_the_nvidia_driver_a_gpu_has_no_nvidia_name(tree: Path) -> None:
    shutil.rmtree(tree / "proc")
    assert by_address(read_pci_devices(tree))[GPU].names == ("card0", "renderD128")


def test_the_nvidia_minor_is_read_from_the_drivers_information_file(tree: Path) -> None:
    put(
        tree,
        f"proc/driver/nvidia/gpus/{GPU}/information",
        "Model: \t\t NVIDIA H100 80GB HBM3\nDevice Minor: \t 3\nBus Type: \t PCIe\n",
    )
    assert by_address(read_pci_devices(tree))[GPU].names[-1] == "nvidia3"


def test_the_nvidia_file_is_looked_up_under_the_proc_root_given(tree: Path, tmp_path: Path) -> None:
    shutil.rmtree(tree / "proc")
    put(tmp_path, f"driver/nvidia/gpus/{GPU}/information", "Device Minor: 5\n")
    found = by_address(read_pci_devices(tree, proc_root=tmp_path))
    assert found[GPU].names[-1] == "nvidia5"


@pytest.mark.parametrize("text", ["Device Minor: none\n", "Model: x\n", "\xff\xfe"])
def test_an_information_file_without_a_minor_gives_no_nvidia_name(tree: Path, text: str) -> None:
    info = tree / f"proc/driver/nvidia/gpus/{GPU}/information"
    info.write_bytes(text.encode("latin-1"))
    assert "nvidia0" not in by_address(read_pci_devices(tree))[GPU].names


def test_only_an_nvidia_device_gets_an_nvidia_name(tree: Path) -> None:
    (device_dir(tree, GPU) / "vendor").write_text("0x1002\n")
    assert by_address(read_pci_devices(tree))[GPU].names == ("card0", "renderD128")


# ---------------------------------------------------------------- entries


def test_bus_entries_are_symlinks_into_sys_devices_and_are_followed(tree: Path) -> None:
    link = tree / BUS / GPU
    assert link.is_symlink()
    assert link.resolve() == tree / "sys/devices/pci0000:81" / GPU
    assert GPU in by_address(read_pci_devices(tree))


def test_a_dangling_entry_is_skipped_with_one_warning(
    tree: Path, caplog: pytest.LogCaptureFixture
) -> None:
    shutil.rmtree(device_dir(tree, GPU))
    with caplog.at_level(logging.WARNING, logger="corepin.sysfs"):
        found = by_address(read_pci_devices(tree))
    assert GPU not in found and NIC in found
    warnings = sysfs_warnings(caplog)
    assert len(warnings) == 1 and GPU in warnings[0] and "pci_device_unreadable" in warnings[0]


def test_an_entry_without_a_class_is_skipped(tree: Path, caplog: pytest.LogCaptureFixture) -> None:
    (device_dir(tree, NIC) / "class").unlink()
    with caplog.at_level(logging.WARNING, logger="corepin.sysfs"):
        found = by_address(read_pci_devices(tree))
    assert NIC not in found and GPU in found
    assert any("pci_class_missing" in w for w in sysfs_warnings(caplog))


@pytest.mark.parametrize("entry", ["not-an-address", "0000:zz:00.0", "0000:01:00.9"])
def test_entries_that_are_not_pci_addresses_are_skipped(tree: Path, entry: str) -> None:
    (tree / BUS / entry).mkdir()
    (tree / BUS / entry / "class").write_text("0x020000\n")
    found = read_pci_devices(tree)
    assert len(found) == 4
    assert all(f.address != entry for f in found)


def test_an_entry_that_is_a_file_is_skipped(tree: Path) -> None:
    (tree / BUS / "0000:09:00.0").write_text("0x020000\n")
    assert "0000:09:00.0" not in by_address(read_pci_devices(tree))


def test_upper_case_addresses_are_read_in_lower_case(tmp_path: Path) -> None:
    write_pci_devices([Device("0000:AB:00.0", pci_class=0x020000)], tmp_path)
    os.rename(tmp_path / BUS / "0000:ab:00.0", tmp_path / BUS / "0000:AB:00.0")
    assert [f.address for f in read_pci_devices(tmp_path)] == ["0000:ab:00.0"]


# ---------------------------------------------------------------- no PCI at all


def test_a_tree_without_pci_sysfs_has_no_devices_and_says_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write_sysfs_tree(single_socket_ht(), tmp_path)
    assert not (tmp_path / "sys/bus").exists()
    with caplog.at_level(logging.DEBUG, logger="corepin.sysfs"):
        assert read_pci_devices(tmp_path) == []
        topology = discover(tmp_path)
    assert topology.devices == ()
    assert topology == single_socket_ht()
    assert sysfs_warnings(caplog) == []


def test_an_empty_pci_bus_directory_has_no_devices(tmp_path: Path) -> None:
    (tmp_path / BUS).mkdir(parents=True)
    assert read_pci_devices(tmp_path) == []


def test_a_pci_devices_path_that_is_a_file_has_no_devices(tmp_path: Path) -> None:
    put(tmp_path, BUS, "nothing\n")
    assert read_pci_devices(tmp_path) == []


def test_the_readers_fallback_log_is_shared_when_given(tree: Path) -> None:
    (device_dir(tree, NIC) / "class").unlink()
    files = SysfsFiles(tree)
    read_pci_devices(tree, files=files)
    assert files.fallbacks.kinds == ["pci_class_missing"]


# ---------------------------------------------------------------- garbage


GARBAGE_FILES = ("class", "vendor", "device", "numa_node", "local_cpulist", "local_cpus")
garbage = st.one_of(
    st.binary(max_size=24),
    st.text(max_size=24).map(lambda t: t.encode("utf-8")),
    st.sampled_from(
        [b"0x", b"-2", b"-1", b"0xffffffff", b"99999999999999999999", b"1-", b"3-1", b"(null)"]
    ),
)


class Collect(logging.Handler):
    """Keeps the records (caplog is function-scoped, Hypothesis runs many examples per call)."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture(scope="module")
def garbage_tree() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="corepin-pci-garbage-"))
    try:
        write_sysfs_tree(with_devices(dual_socket_ht(), gpu(GPU, numa=1), nic(NIC, numa=0)), root)
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


@settings(
    max_examples=examples(150),
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(which=st.sampled_from(GARBAGE_FILES), data=garbage)
def test_garbage_in_a_file_never_stops_discovery_the_device_is_read_or_skipped_with_a_warning(
    garbage_tree: Path, which: str, data: bytes
) -> None:
    path = device_dir(garbage_tree, GPU) / which
    before = path.read_bytes()
    path.write_bytes(data)
    handler = Collect()
    records = handler.records
    logger = logging.getLogger("corepin.sysfs")
    logger.addHandler(handler)
    try:
        found = by_address(read_pci_devices(garbage_tree))
        topology = discover(garbage_tree)
    finally:
        logger.removeHandler(handler)
        path.write_bytes(before)
    assert NIC in found  # the other device is untouched
    assert {d.address for d in topology.devices} == set(found)
    if GPU in found:
        device = found[GPU]
        assert 0 <= device.pci_class < 1 << 24 and 0 <= device.vendor < 1 << 16
        assert device.numa is None or device.numa >= 0
        assert isinstance(device.local_cpus, CPUSet)
    else:  # skipped: said so, naming the file
        named = str(garbage_tree / BUS / GPU / which)
        assert any(named in r.getMessage() for r in records), which


def test_a_sysfs_error_from_a_device_file_names_the_file(tree: Path) -> None:
    """What a skipped device's warning carries: the reader's own error for the file."""
    (device_dir(tree, GPU) / "numa_node").write_text("-7\n")
    path = tree / BUS / GPU / "numa_node"  # named by the bus entry, as the kernel lists it
    files = SysfsFiles(tree)
    read_pci_devices(tree, files=files)
    first_path, action, _ = files.fallbacks.seen["pci_device_unreadable"]
    assert first_path == str(path) and "-7" in action
    assert GPU not in by_address(read_pci_devices(tree))


def test_a_class_that_is_not_hex_skips_the_device_naming_the_file(tree: Path) -> None:
    (device_dir(tree, GPU) / "class").write_text("display\n")
    path = tree / BUS / GPU / "class"
    files = SysfsFiles(tree)
    assert GPU not in by_address(read_pci_devices(tree, files=files))
    first_path, action, _ = files.fallbacks.seen["pci_device_unreadable"]
    assert first_path == str(path) and "'display'" in action


# ---------------------------------------------------------------- this host


def test_discovery_on_this_hosts_sys_does_not_fail() -> None:
    functions = read_pci_devices("/")
    assert isinstance(functions, list)
    assert all(isinstance(f, PciFunction) for f in functions)
    topology = discover("/")
    assert isinstance(topology.devices, tuple)
    assert len(topology.devices) == len(functions)
