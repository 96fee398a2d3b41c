"""What a guest boots: the kernel of the Debian package `linux-image-amd64` and an initramfs
built on the spot from busybox-static and that kernel's 9p/virtio modules.

Nothing here is committed as a binary: `find_kernel` picks the newest /boot/vmlinuz-* whose
modules are installed, `extract_vmlinux` unpacks the ELF kernel inside the bzImage (booted
through its PVH entry point with qboot, it starts about twice as fast as the bzImage through
SeaBIOS), and `build_initramfs` writes a newc cpio archive holding busybox, the modules and the
`/init` below, which

1. loads the modules (in the order modules.dep gives),
2. mounts the host's root read-only over virtio-9p (tag `hostroot`) at /mnt/root, then proc,
   sysfs, devtmpfs, cgroup2 (the only cgroup hierarchy: the kernel runs with
   `cgroup_no_v1=all`) and tmpfs on /tmp and /run inside it, the writable share (tag
   `share`) at the same path it has on the host, and then the checkout (the path the host wrote
   to `<share>/.vm/checkout`) bound at its own path from the host root as it was before those
   mounts - so a checkout under /tmp or /run is not hidden by the guest's tmpfs,
3. brings up the loopback interface (the guest has no network device) and takes the shape's
   offline CPUs offline,
4. says READY on the console and in the share, then runs the commands the host drops into
   `<share>/.vm/` one at a time, chrooted into the host's root, each in its own session with a
   time limit (a command past its limit gets its session SIGKILLed and exit code 137).

Any failure before READY prints `corepin-vm: FAILED: ...` on the console and powers off, so
the host sees QEMU exit and reports the console's tail.
"""

from __future__ import annotations

import glob
import lzma
import os
import re
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path

#: the modules the guest needs (their dependencies are added from modules.dep)
MODULES = ("virtio_pci", "9pnet_virtio", "9p", "virtio_net")
BUSYBOX_CANDIDATES = ("/bin/busybox", "/usr/bin/busybox")
QBOOT = "/usr/share/qemu/qboot.rom"

INIT = r"""#!/bin/busybox sh
# corepin guest init (tests/vm/image.py writes it; see the module docstring)
/bin/busybox mkdir -p /proc /sys /dev /mnt/root /sbin /usr/bin /usr/sbin
/bin/busybox --install -s
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
exec < /dev/console > /dev/console 2>&1
say() { echo "corepin-vm: $*"; }
fail() { say "FAILED: $*"; sync; poweroff -f; sleep 5; echo o > /proc/sysrq-trigger; }
for m in $(cat /modules.order); do
    insmod "/modules/$m" || fail "insmod $m"
done
share=
offline=
for word in $(cat /proc/cmdline); do
    case "$word" in
        corepin.share=*) share="${word#corepin.share=}" ;;
        corepin.offline=*) offline="${word#corepin.offline=}" ;;
    esac
done
[ -n "$share" ] || fail "no corepin.share= on the kernel command line"
R=/mnt/root
opts=trans=virtio,version=9p2000.L,msize=512000
mount -t 9p -o "$opts,ro,cache=loose" hostroot $R ||
    fail "cannot mount the host root (9p tag hostroot)"
# the host root as it is, before tmpfs covers its /tmp and /run: the checkout is bound back
# from here at its own path below, wherever it lives
mkdir -p /mnt/host && mount --bind $R /mnt/host || fail "cannot bind the host root"
mount -t proc proc $R/proc || fail "mount proc in the host root"
mount -t sysfs sysfs $R/sys || fail "mount sysfs in the host root"
mount -t devtmpfs devtmpfs $R/dev || fail "mount devtmpfs in the host root"
mkdir -p $R/dev/shm $R/dev/pts
mount -t tmpfs tmpfs $R/dev/shm
mount -t devpts devpts $R/dev/pts
mount -t cgroup2 cgroup2 $R/sys/fs/cgroup || fail "mount cgroup2 (cgroup_no_v1=all)"
mount -t tmpfs tmpfs $R/tmp || fail "mount tmpfs on /tmp"
mount -t tmpfs tmpfs $R/run || fail "mount tmpfs on /run"
mkdir -p "$R$share"
mount -t 9p -o "$opts,cache=none" share "$R$share" || fail "cannot mount the share (9p tag share)"
q="$R$share/.vm"
mkdir -p "$q" || fail "the share is not writable"
if [ -s "$q/checkout" ]; then
    c=$(cat "$q/checkout")
    [ -d "/mnt/host$c" ] || fail "the checkout $c is not a directory of the host root"
    mkdir -p "$R$c" && mount --bind "/mnt/host$c" "$R$c" || fail "cannot bind the checkout $c"
fi
ip link set lo up || ifconfig lo 127.0.0.1 up || fail "cannot bring up the loopback interface"
for cpu in $(echo "$offline" | tr , ' '); do
    echo 0 > "/sys/devices/system/cpu/cpu$cpu/online" || fail "cannot take CPU $cpu offline"
done
# the wait between polls of the share is a shell builtin (a read with a time limit on a FIFO
# nobody writes): a forked sleep twenty times a second would cost the guest's only emulation
# thread a good share of its time
mkfifo /tick && exec 3<> /tick || fail "cannot make the poll FIFO"
uname -r > "$q/ready.tmp" && mv "$q/ready.tmp" "$q/ready" || fail "cannot write to the share"
say READY
n=0
while :; do
    if [ ! -e "$q/$n.cmd" ]; then
        read -t 0.05 _ <&3
        continue
    fi
    limit=$(cat "$q/$n.limit" 2>/dev/null || echo 600)
    setsid chroot $R /bin/sh "$share/.vm/$n.cmd" < /dev/null > "$q/$n.out" 2> "$q/$n.err" &
    pid=$!
    ( sleep "$limit"; echo "$limit" > "$q/$n.timedout"; kill -KILL -"$pid" ) &
    watchdog=$!
    wait "$pid"
    rc=$?
    kill "$watchdog" 2>/dev/null
    echo "$rc" > "$q/$n.rc.tmp"
    mv "$q/$n.rc.tmp" "$q/$n.rc"
    n=$((n + 1))
done
"""


class ImageError(RuntimeError):
    """The pieces of a guest are not available on this machine (a reason to skip)."""


@dataclass(frozen=True)
class Kernel:
    """An installed kernel: its bzImage and its modules directory."""

    release: str
    vmlinuz: Path
    modules: Path


def _release_key(release: str) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", release))


def find_kernel(boot: str = "/boot", modules_root: str = "/lib/modules") -> Kernel:
    """The newest /boot/vmlinuz-RELEASE whose /lib/modules/RELEASE has the 9p modules."""
    found: list[Kernel] = []
    for path in glob.glob(os.path.join(boot, "vmlinuz-*")):
        release = os.path.basename(path)[len("vmlinuz-") :]
        mods = Path(modules_root, release)
        if (mods / "modules.dep").is_file() and os.access(path, os.R_OK):
            found.append(Kernel(release, Path(path), mods))
    if not found:
        raise ImageError(
            f"no kernel with modules in {boot} and {modules_root} "
            "(apt-get install --no-install-recommends linux-image-amd64)"
        )
    return max(found, key=lambda k: _release_key(k.release))


def static_busybox() -> Path:
    """A statically linked busybox (the initramfs has no C library)."""
    for candidate in BUSYBOX_CANDIDATES:
        try:
            with open(candidate, "rb") as handle:
                head = handle.read(4096)
        except OSError:
            continue
        if head.startswith(b"\x7fELF") and b"ld-linux" not in head and b"/ld-" not in head:
            return Path(candidate)
    raise ImageError("no static busybox (apt-get install busybox-static)")


def extract_vmlinux(vmlinuz: Path, out: Path) -> Path:
    """Write the ELF kernel that `vmlinuz` (an xz-compressed bzImage) carries to `out`."""
    data = vmlinuz.read_bytes()
    start = data.find(b"\xfd7zXZ\x00")
    if start < 0:
        raise ImageError(f"{vmlinuz}: no xz payload (only xz-compressed kernels are unpacked)")
    try:
        elf = lzma.LZMADecompressor(format=lzma.FORMAT_XZ).decompress(data[start:])
    except lzma.LZMAError as err:
        raise ImageError(f"{vmlinuz}: cannot unpack its xz payload: {err}") from err
    if not elf.startswith(b"\x7fELF"):
        raise ImageError(f"{vmlinuz}: the payload is not an ELF kernel")
    out.write_bytes(elf)
    return out


def module_order(kernel: Kernel, wanted: tuple[str, ...] = MODULES) -> list[str]:
    """Relative paths (as in modules.dep) of `wanted` and their dependencies, dependencies
    first."""
    deps: dict[str, list[str]] = {}
    by_name: dict[str, str] = {}
    for line in (kernel.modules / "modules.dep").read_text().splitlines():
        target, _, rest = line.partition(":")
        deps[target] = rest.split()
        name = os.path.basename(target).split(".ko")[0].replace("-", "_")
        by_name[name] = target
    order: list[str] = []

    def visit(path: str) -> None:
        if path in order:
            return
        for dep in deps.get(path, []):
            visit(dep)
        order.append(path)

    for name in wanted:
        path = by_name.get(name.replace("-", "_"))
        if path is None:
            # built into the kernel, or missing: the guest's mount says which
            if not _builtin(kernel, name):
                raise ImageError(f"kernel {kernel.release} has no module {name}")
            continue
        visit(path)
    return order


def _builtin(kernel: Kernel, name: str) -> bool:
    listing = kernel.modules / "modules.builtin"
    if not listing.is_file():
        return False
    wanted = name.replace("-", "_")
    return any(
        os.path.basename(line).split(".ko")[0].replace("-", "_") == wanted
        for line in listing.read_text().splitlines()
    )


def _module_bytes(path: Path) -> bytes:
    data = path.read_bytes()
    if path.name.endswith(".ko.xz"):
        return lzma.decompress(data)
    if path.name.endswith(".ko"):
        return data
    raise ImageError(f"{path}: compressed in a format busybox insmod cannot load here")


class _Cpio:
    """A newc ("070701") cpio archive, the format the kernel unpacks as an initramfs."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.ino = 1

    def _entry(self, name: str, mode: int, data: bytes = b"") -> None:
        encoded = name.encode() + b"\x00"
        fields = (self.ino, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(encoded), 0)
        header = b"070701" + b"".join(b"%08X" % f for f in fields)
        self.ino += 1
        self.parts.append(header + encoded + b"\x00" * (-(110 + len(encoded)) % 4))
        self.parts.append(data + b"\x00" * (-len(data) % 4))

    def directory(self, name: str) -> None:
        self._entry(name, stat.S_IFDIR | 0o755)

    def file(self, name: str, data: bytes, mode: int = 0o644) -> None:
        self._entry(name, stat.S_IFREG | mode, data)

    def finish(self) -> bytes:
        self._entry("TRAILER!!!", 0)
        blob = b"".join(self.parts)
        return blob + b"\x00" * (-len(blob) % 512)


def build_initramfs(kernel: Kernel, out: Path, *, modules: tuple[str, ...] = MODULES) -> Path:
    """Write the guest's initramfs (busybox, `modules`, /init) to `out`."""
    busybox = static_busybox()
    archive = _Cpio()
    for d in ("bin", "dev", "proc", "sys", "mnt", "mnt/root", "modules", "tmp"):
        archive.directory(d)
    archive.file("bin/busybox", busybox.read_bytes(), 0o755)
    names: list[str] = []
    for rel in module_order(kernel, modules):
        name = os.path.basename(rel).removesuffix(".xz")
        archive.file(f"modules/{name}", _module_bytes(kernel.modules / rel))
        names.append(name)
    archive.file("modules.order", ("\n".join(names) + "\n").encode())
    archive.file("init", INIT.encode(), 0o755)
    out.write_bytes(archive.finish())
    return out


@dataclass(frozen=True)
class BootFiles:
    """A kernel and initramfs ready for `-kernel`/`-initrd`, and the firmware to boot them."""

    kernel: Path
    initrd: Path
    bios: str | None
    release: str
    #: the kernel as a bzImage, for QEMU's default firmware (SeaBIOS): a guest with PCI
    #: expander bridges needs it, since qboot does not give their buses numbers
    bzimage: Path | None = None


def prepare(workdir: Path, *, modules: tuple[str, ...] = MODULES) -> BootFiles:
    """Build the boot files in `workdir`: the ELF kernel with qboot when both are available
    (the fast path), else the bzImage with QEMU's default firmware."""
    kernel = find_kernel()
    workdir.mkdir(parents=True, exist_ok=True)
    initrd = build_initramfs(kernel, workdir / "initramfs.cpio", modules=modules)
    if os.path.isfile(QBOOT):
        try:
            elf = extract_vmlinux(kernel.vmlinuz, workdir / "vmlinux")
            return BootFiles(elf, initrd, QBOOT, kernel.release, kernel.vmlinuz)
        except ImageError:
            pass
    copy = workdir / "vmlinuz"
    shutil.copyfile(kernel.vmlinuz, copy)
    return BootFiles(copy, initrd, None, kernel.release, copy)
