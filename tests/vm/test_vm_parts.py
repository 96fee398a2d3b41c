"""The pieces of the guest harness that need no QEMU: shapes (vCPU numbering, NUMA split, the
QEMU options), module order from modules.dep, the newc archive, the ELF kernel unpacked from
an xz bzImage."""

from __future__ import annotations

import lzma
import shutil
import subprocess
from pathlib import Path

import pytest

from vm.image import ImageError, Kernel, _Cpio, extract_vmlinux, module_order
from vm.shapes import SHAPES, Shape, cpu_list


def test_vcpus_are_numbered_socket_die_core_thread_major() -> None:
    shape = SHAPES["numa4-smt2"]
    assert [shape.place(c) for c in (0, 1, 2, 4, 8, 15)] == [
        (0, 0, 0, 0),
        (0, 0, 0, 1),
        (0, 0, 1, 0),
        (0, 1, 0, 0),
        (1, 0, 0, 0),
        (1, 1, 1, 1),
    ]
    assert shape.l3_groups() == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]
    assert [shape.cpus_of_node(n) for n in range(4)] == shape.l3_groups()


def test_nodes_take_whole_cores_in_order_and_the_qemu_options_say_so() -> None:
    shape = Shape("t", sockets=2, cores=2, threads=2, nodes=2, mem_mb=128)
    args = shape.qemu_args()
    assert args[:2] == ["-smp", "8,sockets=2,dies=1,cores=2,threads=2"]
    assert "memory-backend-ram,id=mem1,size=128M" in args
    cpu_opts = [a for a in args if a.startswith("cpu,")]
    assert cpu_opts[5] == "cpu,node-id=1,socket-id=1,core-id=0,thread-id=1"
    assert "dist,src=0,dst=1,val=20" in args
    assert shape.expected()["siblings"] == [[0, 1], [2, 3], [4, 5], [6, 7]]


def test_offline_cpus_leave_the_expected_groups_and_isolcpus_reach_the_kernel() -> None:
    shape = SHAPES["offline-isol"]
    want = shape.expected()
    assert want["online"] == [0, 1, 2, 3, 4, 5] and want["offline"] == [6, 7]
    assert want["siblings"] == [[0, 1], [2, 3], [4, 5]]
    assert shape.cmdline() == ["isolcpus=2-3"]


@pytest.mark.parametrize(
    ("kw", "problem"),
    [
        ({"cores": 3, "nodes": 2}, "do not split"),
        ({"offline": (0,)}, "CPU 0 cannot go offline"),
        ({"isolcpus": (9,)}, "do not exist"),
        ({"nodes": 2, "cores": 2, "distances": ((10,),)}, "2x2"),
    ],
    ids=["uneven nodes", "cpu 0 offline", "unknown cpu", "distance matrix of the wrong size"],
)
def test_impossible_shapes_are_refused(kw: dict[str, object], problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        Shape("bad", **kw)  # type: ignore[arg-type]


def test_cpu_lists_are_linux_list_text() -> None:
    assert cpu_list([3, 0, 1, 2, 8, 10, 11]) == "0-3,8,10-11"
    assert cpu_list([]) == ""


def test_modules_come_after_their_dependencies(tmp_path: Path) -> None:
    (tmp_path / "modules.dep").write_text(
        "kernel/fs/9p/9p.ko: kernel/net/9p/9pnet.ko kernel/fs/netfs/netfs.ko\n"
        "kernel/net/9p/9pnet.ko:\n"
        "kernel/fs/netfs/netfs.ko:\n"
        "kernel/net/9p/9pnet_virtio.ko: kernel/net/9p/9pnet.ko kernel/drivers/virtio/virtio.ko\n"
        "kernel/drivers/virtio/virtio.ko:\n"
    )
    (tmp_path / "modules.builtin").write_text("kernel/drivers/virtio/virtio_pci.ko\n")
    kernel = Kernel("x", tmp_path / "vmlinuz", tmp_path)
    order = module_order(kernel, ("virtio_pci", "9pnet_virtio", "9p"))
    assert order == [
        "kernel/net/9p/9pnet.ko",
        "kernel/drivers/virtio/virtio.ko",
        "kernel/net/9p/9pnet_virtio.ko",
        "kernel/fs/netfs/netfs.ko",
        "kernel/fs/9p/9p.ko",
    ]
    with pytest.raises(ImageError, match="has no module virtio_blk"):
        module_order(kernel, ("virtio_blk",))


@pytest.mark.skipif(shutil.which("cpio") is None, reason="cpio is not installed")
def test_the_initramfs_archive_is_newc_that_cpio_lists(tmp_path: Path) -> None:
    archive = _Cpio()
    archive.directory("bin")
    archive.file("bin/tool", b"#!/bin/sh\n", 0o755)
    archive.file("data", b"x" * 5)
    blob = archive.finish()
    assert len(blob) % 512 == 0
    listing = subprocess.run(
        ["cpio", "-itv"], input=blob, capture_output=True, check=True
    ).stdout.decode()
    names = [line.split()[-1] for line in listing.splitlines()]
    assert names == ["bin", "bin/tool", "data"]
    assert listing.splitlines()[1].startswith("-rwxr-xr-x")


def test_the_elf_kernel_is_unpacked_from_the_xz_payload(tmp_path: Path) -> None:
    elf = b"\x7fELF" + b"kernel" * 100
    (tmp_path / "vmlinuz").write_bytes(b"MZ setup code" + lzma.compress(elf))
    assert extract_vmlinux(tmp_path / "vmlinuz", tmp_path / "vmlinux").read_bytes() == elf
    (tmp_path / "gz").write_bytes(b"MZ\x1f\x8b not xz")
    with pytest.raises(ImageError, match="no xz payload"):
        extract_vmlinux(tmp_path / "gz", tmp_path / "out")
