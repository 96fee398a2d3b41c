"""PCI devices in the machine model: kinds from class codes, names users type, JSON both ways."""

from __future__ import annotations

import pytest

from corepin.core.cpuset import CPUSet
from corepin.core.errors import TopologyError
from corepin.testing.machines import SyntheticSpec, synthetic
from corepin.topology.devices import Device, find_device, kind_of
from corepin.topology.model import Topology

GPU = Device("3b:00.0", 0x030200, 0x10DE, 0x2330, 1, CPUSet.parse("8-15"), ("nvidia0",))
NIC = Device("0000:5e:00.1", 0x020000, 0x15B3, 0x101D, 0, CPUSet.parse("0-7"), ("ens1f1",))
NVME = Device("0000:af:00.0", 0x010802, 0x144D, 0xA80A, None, CPUSet(), ("nvme0", "nvme0n1"))


@pytest.mark.parametrize(
    ("pci_class", "kind"),
    [
        (0x030000, "gpu"),
        (0x030200, "gpu"),
        (0x020000, "nic"),
        (0x020700, "nic"),
        (0x010802, "nvme"),
        (0x010601, "other"),
        (0x120000, "accelerator"),
        (0x060400, "other"),
    ],
)
def test_the_kind_comes_from_the_class_code(pci_class: int, kind: str) -> None:
    assert kind_of(pci_class) == kind


@pytest.mark.parametrize(
    ("name", "want"),
    [
        ("0000:3b:00.0", GPU),
        ("3b:00.0", GPU),
        ("3B:00.0", GPU),
        ("nvidia0", GPU),
        ("/dev/nvidia0", GPU),
        ("ens1f1", NIC),
        ("/dev/nvme0n1", NVME),
        ("nvme0", NVME),
        ("eth9", None),
        ("", None),
        ("0000:00:00.0", None),
    ],
)
def test_a_device_is_found_by_address_name_or_device_node(name: str, want: Device | None) -> None:
    assert find_device((GPU, NIC, NVME), name) == want


def test_devices_travel_in_the_topology_json() -> None:
    base = synthetic(SyntheticSpec(sockets=2))
    topo = Topology(base.cpus, base.numa_nodes, devices=(NVME, GPU, NIC))
    assert [d.address for d in topo.devices] == sorted(d.address for d in (GPU, NIC, NVME))
    data = topo.to_json()
    assert data["devices"][0]["kind"] == "gpu" and data["devices"][0]["class"] == "0x030200"
    back = Topology.from_json(data)
    assert back == topo and back.devices == topo.devices
    assert Topology.from_json({k: v for k, v in data.items() if k != "devices"}).devices == ()


@pytest.mark.parametrize(
    ("row", "field"),
    [
        ({"address": ""}, "address"),
        ({"address": "0000:3b:00.0", "numa": -1}, "numa"),
        ({"address": "0000:3b:00.0", "names": "eth0"}, "names"),
        ({"address": "0000:3b:00.0", "class": "gpu"}, "class"),
        ({"address": "0000:3b:00.0", "local_cpus": "x"}, "local_cpus"),
    ],
)
def test_a_bad_device_row_is_named(row: dict[str, object], field: str) -> None:
    with pytest.raises(TopologyError, match=rf"devices\[0\].*{field}"):
        Device.from_json("devices[0]", row)


def test_devices_do_not_change_the_states_topology_fingerprint() -> None:
    from corepin.state.model import fingerprint

    base = synthetic(SyntheticSpec(sockets=2))
    with_gpu = Topology(base.cpus, base.numa_nodes, devices=(GPU,))
    assert fingerprint(with_gpu) == fingerprint(base)
