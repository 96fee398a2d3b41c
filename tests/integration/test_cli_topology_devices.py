"""`corepin topology` with PCI devices: every output format shows the GPUs, NICs, NVMe drives and
accelerators of a synthetic sysfs tree (or a topology file) where they belong, lists other
functions in JSON/YAML only, and leaves the output of a machine without such devices as it was."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml

from corepin import CPUSet, Topology
from corepin.cli.main import main
from corepin.cli.topology_cmd import render
from corepin.testing import accelerator, gpu, nic, nvme, with_devices, write_sysfs_tree
from corepin.testing.machines import SyntheticSpec, dual_socket_ht, synthetic
from corepin.topology.devices import Device

SVG_NS = "{http://www.w3.org/2000/svg}"
GPU = "0000:81:00.0"
NIC = "0000:01:00.0"
DISK = "0000:02:00.0"
ACCEL = "0000:c1:00.0"
BRIDGE = "0000:00:00.0"


def machine() -> Topology:
    """2 sockets, a GPU on node 1, a NIC and an NVMe drive on node 0, an accelerator without a
    node, and a host bridge (kind `other`)."""
    return with_devices(
        dual_socket_ht(),
        gpu(GPU, numa=1),
        nic(NIC, numa=0, ifname="ens1f0"),
        nvme(DISK, numa=0),
        accelerator(ACCEL),
        Device(BRIDGE, pci_class=0x060000, vendor=0x8086, device=0x09A2, numa=0),
    )


@pytest.fixture
def root(tmp_path: Path) -> str:
    return str(write_sysfs_tree(machine(), tmp_path / "machine"))


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert main(["topology", *argv]) == 0
    return capsys.readouterr().out


# ---------------------------------------------------------------- table


def test_table_has_a_row_group_of_devices(root: str, capsys: pytest.CaptureFixture[str]) -> None:
    lines = run(capsys, "--sysfs-root", root).splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("DEVICE"))
    assert lines[at].split() == ["DEVICE", "KIND", "NAMES", "NUMA", "LOCAL", "CPUS"]
    assert lines[at - 1] == ""
    rows = []
    for line in lines[at + 1 :]:
        if not line:
            break
        rows.append(line.split())
    assert rows == [
        [NIC, "nic", "ens1f0", "0", "0-7,16-23"],
        [DISK, "nvme", "nvme0,nvme0n1", "0", "0-7,16-23"],
        [GPU, "gpu", "card0,renderD128,nvidia0", "1", "8-15,24-31"],
        [ACCEL, "accelerator", "accel0", "-", "0-31"],
    ]


def test_a_device_without_names_shows_a_dash(tmp_path: Path) -> None:
    topo = with_devices(dual_socket_ht(), Device(NIC, pci_class=0x020000, numa=1))
    row = next(line for line in render(topo, "table").splitlines() if line.startswith(NIC))
    assert row.split() == [NIC, "nic", "-", "1", "8-15,24-31"]


# ---------------------------------------------------------------- tree


def test_tree_lists_each_device_under_its_numa_node(
    root: str, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = run(capsys, "--sysfs-root", root, "-o", "tree").splitlines()

    def owner(prefix: str) -> tuple[str, int]:
        """The nearest line above the device's line that is less indented, and the indent."""
        at = next(i for i, line in enumerate(lines) if line.strip().startswith(prefix))
        indent = len(lines[at]) - len(lines[at].lstrip())
        parent = next(
            lines[j]
            for j in range(at - 1, -1, -1)
            if len(lines[j]) - len(lines[j].lstrip()) < indent
        )
        return parent.strip(), indent

    assert owner(f"GPU {GPU}")[0].startswith("NUMA node 1:")
    assert owner(f"NIC {NIC}")[0].startswith("NUMA node 0:")
    assert owner(f"NVMe {DISK}")[0].startswith("NUMA node 0:")
    assert owner(f"accelerator {ACCEL}") == ("machine: CPUs 0-31 (32)", 2)
    gpu_line = next(line for line in lines if f"GPU {GPU}" in line)
    assert gpu_line.strip() == f"GPU {GPU} (card0, renderD128, nvidia0): local CPUs 8-15,24-31"
    assert BRIDGE not in "\n".join(lines)


def test_tree_puts_a_device_of_a_memory_only_node_under_it() -> None:
    cxl = synthetic(SyntheticSpec(sockets=1, cores_per_l3=2, memory_only_nodes=1))
    topo = with_devices(cxl, Device("0000:e0:00.0", pci_class=0x020000, numa=1, names=("eth9",)))
    lines = render(topo, "tree").splitlines()
    at = lines.index("  NUMA node 1: memory only")
    assert lines[at + 1].startswith("    NIC 0000:e0:00.0 (eth9): local CPUs")


# ---------------------------------------------------------------- json and yaml


def test_json_lists_every_device_other_kinds_too(
    root: str, capsys: pytest.CaptureFixture[str]
) -> None:
    data = json.loads(run(capsys, "--sysfs-root", root, "-o", "json"))
    assert data["devices"] == [d.to_json() for d in machine().devices]
    kinds = {row["address"]: row["kind"] for row in data["devices"]}
    assert kinds == {BRIDGE: "other", NIC: "nic", DISK: "nvme", GPU: "gpu", ACCEL: "accelerator"}
    gpu_row = next(row for row in data["devices"] if row["address"] == GPU)
    assert gpu_row["class"] == "0x030200" and gpu_row["numa"] == 1
    assert gpu_row["names"] == ["card0", "renderD128", "nvidia0"]


def test_yaml_holds_the_devices_too(root: str, capsys: pytest.CaptureFixture[str]) -> None:
    data = yaml.safe_load(run(capsys, "--sysfs-root", root, "-o", "yaml"))
    assert data["devices"] == [d.to_json() for d in machine().devices]


@pytest.mark.parametrize("fmt", ["table", "tree", "svg"])
def test_a_topology_file_brings_its_devices_to_every_picture(
    root: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], fmt: str
) -> None:
    saved = tmp_path / "topology.json"
    saved.write_text(run(capsys, "--sysfs-root", root, "-o", "json"), encoding="utf-8")
    from_file = run(capsys, "--topology", str(saved), "-o", fmt)
    from_tree = run(capsys, "--sysfs-root", root, "-o", fmt)
    if fmt == "svg":  # the heading names the tree's directory; a file has no name
        from_file, from_tree = (
            re.sub(r"corepin topology[^<]*", "", t) for t in (from_file, from_tree)
        )
    assert from_file == from_tree
    assert GPU in from_tree or "81:00.0" in from_tree


# ---------------------------------------------------------------- svg


Rect = tuple[float, float, float, float]


def boxes(text: str) -> dict[str, Rect]:
    """Title -> (x, y, w, h) of every box of the picture."""
    out: dict[str, Rect] = {}
    for group in ET.fromstring(text.encode("utf-8")).iter(f"{SVG_NS}g"):
        title, rect = group.find(f"{SVG_NS}title"), group.find(f"{SVG_NS}rect")
        if title is None or rect is None or title.text is None:
            continue
        out[title.text] = tuple(float(rect.get(k, "0")) for k in ("x", "y", "width", "height"))  # type: ignore[assignment]
    return out


def find(found: dict[str, Rect], prefix: str) -> Rect:
    (match,) = [rect for title, rect in found.items() if title.startswith(prefix)]
    return match


def inside(inner: Rect, outer: Rect) -> bool:
    x, y, w, h = inner
    ox, oy, ow, oh = outer
    return ox <= x and oy <= y and x + w <= ox + ow and y + h <= oy + oh


def test_svg_draws_a_box_per_device_inside_its_numa_nodes_box(
    root: str, capsys: pytest.CaptureFixture[str]
) -> None:
    text = run(capsys, "--sysfs-root", root, "-o", "svg")
    found = boxes(text)
    node0, node1 = find(found, "NUMA node 0:"), find(found, "NUMA node 1:")
    gpu_box = find(found, f"GPU {GPU}:")
    assert inside(gpu_box, node1) and not inside(gpu_box, node0)
    for prefix in (f"NIC {NIC}:", f"NVMe {DISK}:"):
        assert inside(find(found, prefix), node0) and not inside(find(found, prefix), node1)
    accel_box = find(found, f"accelerator {ACCEL}:")
    assert inside(accel_box, find(found, "2 sockets"))  # the machine's box
    assert not inside(accel_box, node0) and not inside(accel_box, node1)
    for cpu_title, rect in found.items():  # no device box overlaps a CPU's
        if re.match(r"CPU \d+", cpu_title):
            assert not inside(rect, gpu_box)
    assert "card0, renderD128, nvidia0" in text
    assert "PCI device" in text  # in the legend
    assert not [t for t in found if t.startswith(BRIDGE) or "00:00.0" in t]


def test_svg_tip_of_a_device_says_everything_about_it() -> None:
    found = boxes(render(machine(), "svg"))
    (tip,) = [t for t in found if t.startswith(f"GPU {GPU}")]
    assert tip == (
        f"GPU {GPU}: NUMA node 1, local CPUs 8-15,24-31, class 0x030200, id 10de:2330, "
        "names card0, renderD128, nvidia0"
    )


def test_svg_draws_a_device_of_a_memory_only_node_inside_that_nodes_box() -> None:
    cxl = synthetic(SyntheticSpec(sockets=1, cores_per_l3=2, memory_only_nodes=1))
    topo = with_devices(cxl, Device("0000:e0:00.0", pci_class=0x120000, numa=1))
    found = boxes(render(topo, "svg"))
    assert inside(find(found, "accelerator 0000:e0:00.0:"), find(found, "NUMA node 1: memory"))


# ---------------------------------------------------------------- without devices


@pytest.mark.parametrize("fmt", ["table", "tree", "svg"])
def test_only_other_devices_leave_the_pictures_as_without_devices(fmt: str) -> None:
    plain = dual_socket_ht()
    bridges = with_devices(plain, Device(BRIDGE, pci_class=0x060000, numa=0))
    assert render(bridges, fmt) == render(plain, fmt)
    assert render(machine(), fmt) != render(plain, fmt)


def test_a_device_with_local_cpus_of_its_own_keeps_them() -> None:
    topo = with_devices(dual_socket_ht(), nic(NIC, numa=0, local_cpus=CPUSet.parse("0-3")))
    assert topo.devices[0].local_cpus == CPUSet.parse("0-3")
    row = next(line for line in render(topo, "table").splitlines() if line.startswith(NIC))
    assert row.split()[-1] == "0-3"


def test_the_docs_tree_example_with_devices_is_what_the_tree_prints() -> None:
    page = (Path(__file__).resolve().parents[2] / "docs" / "topology.md").read_text(
        encoding="utf-8"
    )
    shown = [line for line in page.splitlines() if line.lstrip().startswith(("NIC 0", "GPU 0"))]
    assert len(shown) == 2
    tree = render(machine(), "tree").splitlines()
    for line in shown:
        assert line in tree
