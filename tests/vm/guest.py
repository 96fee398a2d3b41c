"""One QEMU guest of a given shape: boot, run commands in it, tear it down.

    with Guest(SHAPES["numa4-smt2"], workdir) as guest:
        result = guest.run("corepin topology -o json")
        result.check()            # raises GuestCommandFailed with the output when rc != 0
        print(result.stdout)

The guest runs the host's own root file system (read-only over virtio-9p) and sees this
checkout (or the one given as `checkout`) and its venv at the same paths as the host, wherever it
lives: the guest mounts tmpfs on /tmp and /run, and binds the checkout back over them at its own
path; `guest.share` is a writable directory at the same path on both sides. Commands are shell
text run by /bin/sh in the checkout, with the venv's bin/ first on PATH. Everything is bounded in
time:

- the boot has `boot_timeout` seconds to reach READY; a guest that panics (the kernel runs with
  `panic=-1`, QEMU with `-no-reboot`, so QEMU exits), cannot mount 9p (its init prints why and
  powers off) or hangs raises `GuestBootError` with the console's tail;
- a command has `timeout` seconds inside the guest (then its session is SIGKILLed and
  `GuestTimeout` is raised, the guest stays usable); if the guest does not answer within a grace
  period after that, it is declared hung, killed, and `GuestDied` is raised with the tail;
- `stop()` (also on leaving the `with` block, and at interpreter exit for any guest still up)
  SIGTERMs and then SIGKILLs QEMU and removes the share's scratch files; QEMU also gets SIGKILL
  from the kernel if the process that started it dies (PR_SET_PDEATHSIG).

QEMU runs single-threaded TCG (`-accel tcg,thread=single`) with `mitigations=off`: /dev/kvm cannot
be relied on here, and multi-threaded TCG hung or aborted in about one boot out of six.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import time
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from .image import BootFiles, ImageError, prepare
from .shapes import Shape

REPO = Path(__file__).resolve().parents[2]
QEMU = "qemu-system-x86_64"
#: seconds a guest may take beyond a command's own limit before it counts as hung
GRACE = 30.0

_LIVE: weakref.WeakSet[Guest] = weakref.WeakSet()


class GuestError(RuntimeError):
    """A guest failed; `console` is the tail of its serial console."""

    def __init__(self, message: str, console: str = "") -> None:
        self.console = console
        text = message
        if console:
            text += "\n--- guest console (tail) ---\n" + console
        super().__init__(text)


class GuestBootError(GuestError):
    """The guest did not reach READY (panic, no 9p, hang, QEMU refused the options)."""


class GuestDied(GuestError):
    """The guest stopped answering or QEMU exited while a command ran."""


class GuestTimeout(GuestError):
    """A command ran past its time limit (its session was killed; the guest lives on)."""


class GuestCommandFailed(GuestError):
    """`Result.check()` on a non-zero exit code."""


# The guest's packages (qemu-system-x86, linux-image-amd64) are left out by
# `install-deps.sh --test --no-vm`, or were never installed.
GUEST_PACKAGES_ABSENT = (
    "the guest packages qemu-system-x86 and linux-image-amd64 are absent (skipped by "
    "`sh scripts/install-deps.sh --test --no-vm`, or not installed: "
    "sh scripts/install-deps.sh --test installs them)"
)


def skip_reason() -> str | None:
    """Why guests cannot run on this machine (None when they can)."""
    if os.environ.get("COREPIN_VM", "").lower() in ("0", "off", "no", "skip"):
        return "guest tests turned off (COREPIN_VM=off)"
    if shutil.which(QEMU) is None:
        return f"{GUEST_PACKAGES_ABSENT}: {QEMU} is not installed"
    if os.geteuid() != 0:
        return "guests export the host's root over 9p and need root to read all of it"
    try:
        from .image import find_kernel, static_busybox

        find_kernel()
    except ImageError as err:
        return f"{GUEST_PACKAGES_ABSENT}: {err}"
    try:
        static_busybox()
    except ImageError as err:
        return str(err)
    if not (REPO / ".venv" / "bin" / "python").exists():
        return f"no venv at {REPO / '.venv'} (make dev)"
    return None


@dataclass
class Result:
    """What one command in the guest did."""

    command: str
    returncode: int
    stdout: str
    stderr: str
    seconds: float

    def check(self) -> Result:
        if self.returncode != 0:
            raise GuestCommandFailed(
                f"guest command exited {self.returncode}: {self.command}\n"
                f"--- stdout ---\n{self.stdout[-4000:]}\n--- stderr ---\n{self.stderr[-4000:]}"
            )
        return self

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


class Guest:
    """A QEMU guest of `shape`; scratch files (boot files, console log, share) in `workdir`."""

    def __init__(
        self,
        shape: Shape,
        workdir: Path,
        *,
        boot_timeout: float = 120.0,
        boot_files: BootFiles | None = None,
        cmdline: Sequence[str] = (),
        pool: GuestPool | None = None,
        cgroup_v1: bool = False,
        checkout: str | os.PathLike[str] = REPO,
    ) -> None:
        self.shape = shape
        #: the checkout commands run in (and whose venv they use), at the same path as here
        self.checkout = Path(os.path.abspath(checkout))
        #: boot without `cgroup_no_v1=all`: controllers stay free for a v1 mount (cgroup v2 is
        #: still the hierarchy mounted; a controller enabled in one cannot be mounted in the other)
        self.cgroup_v1 = cgroup_v1
        self.workdir = Path(workdir)
        self.share = self.workdir / "share"
        self.console_log = self.workdir / "console.log"
        self.boot_timeout = boot_timeout
        self.boot_files = boot_files
        self.extra_cmdline = tuple(cmdline)
        self.pool = pool
        self.process: subprocess.Popen[bytes] | None = None
        self.boot_seconds: float | None = None
        self.release: str | None = None
        self._seq = 0
        self._broken: GuestError | None = None

    # ------------------------------------------------------------------ lifecycle
    @property
    def queue(self) -> Path:
        return self.share / ".vm"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def __enter__(self) -> Guest:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def kernel_cmdline(self) -> str:
        words = [
            "console=ttyS0",
            "panic=-1",
            # under emulation on a loaded host the kernel's check of the timer interrupt can
            # miss its window and panic ("IO-APIC + timer doesn't work"): skip the check, as
            # virtual machines commonly do
            "no_timer_check",
            "mitigations=off",
            *(() if self.cgroup_v1 else ("cgroup_no_v1=all",)),
            "loglevel=4",
            "rdinit=/init",
            f"corepin.share={self.share}",
            *self.shape.cmdline(),
            *self.extra_cmdline,
        ]
        if self.shape.offline:
            words.append(f"corepin.offline={','.join(map(str, self.shape.offline))}")
        return " ".join(words)

    def qemu_argv(self, files: BootFiles) -> list[str]:
        argv = [
            QEMU,
            "-machine",
            "pc",
            "-accel",
            "tcg,thread=single",
            "-nodefaults",
            "-no-user-config",
            "-display",
            "none",
            "-vga",
            "none",
            "-no-reboot",
            "-serial",
            f"file:{self.console_log}",
            "-monitor",
            "none",
            *self.shape.qemu_args(),
            "-kernel",
            str(files.kernel),
            "-initrd",
            str(files.initrd),
            "-append",
            self.kernel_cmdline(),
            "-fsdev",
            "local,id=hostroot,path=/,security_model=none,readonly=on,multidevs=remap",
            "-device",
            "virtio-9p-pci,fsdev=hostroot,mount_tag=hostroot",
            "-fsdev",
            f"local,id=share,path={self.share},security_model=none",
            "-device",
            "virtio-9p-pci,fsdev=share,mount_tag=share",
            *self.shape.device_args(),
        ]
        if self.shape.pci_nodes and files.bzimage is not None:
            # SeaBIOS numbers the expander bridges' buses (qboot leaves them without any)
            argv[argv.index("-kernel") + 1] = str(files.bzimage)
        elif files.bios:
            argv[1:1] = ["-bios", files.bios]
        return argv

    def start(self) -> None:
        """Boot the guest and wait for READY (GuestBootError with the console tail if not)."""
        if self.running:
            return
        if self.pool is not None:
            self.pool.activate(self)
        self.workdir.mkdir(parents=True, exist_ok=True)
        if self.share.exists():
            shutil.rmtree(self.share)
        self.share.mkdir()
        # the init binds this path back after it covers /tmp and /run with tmpfs
        self.queue.mkdir()
        (self.queue / "checkout").write_text(os.fspath(self.checkout))
        self.console_log.write_bytes(b"")
        files = self.boot_files
        if files is None:
            files = self.boot_files = prepare(self.workdir / "boot")
        self.release = files.release
        self._seq = 0
        self._broken = None
        began = time.monotonic()
        self.process = subprocess.Popen(
            self.qemu_argv(files),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        _LIVE.add(self)
        ready = self.queue / "ready"
        deadline = began + self.boot_timeout
        while not ready.exists():
            if self.process.poll() is not None:
                raise self._fail(
                    GuestBootError,
                    f"guest {self.shape.name} stopped before it was ready "
                    f"(QEMU exit code {self.process.returncode}){self._qemu_output()}",
                )
            if time.monotonic() > deadline:
                raise self._fail(
                    GuestBootError,
                    f"guest {self.shape.name} was not ready after {self.boot_timeout:.0f}s "
                    "(hung boot?)",
                )
            time.sleep(0.05)
        self.boot_seconds = time.monotonic() - began

    def stop(self) -> None:
        """Kill QEMU (SIGTERM, then SIGKILL) and remove the share's scratch files."""
        proc = self.process
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        if proc is not None and proc.stdout is not None:
            proc.stdout.close()
        self.process = None
        _LIVE.discard(self)
        if self.queue.exists():
            shutil.rmtree(self.queue, ignore_errors=True)

    def _qemu_output(self) -> str:
        proc = self.process
        if proc is None or proc.stdout is None or proc.poll() is None:
            return ""
        said = [
            line
            for line in proc.stdout.read().decode(errors="replace").splitlines()
            if line.strip() and "TCG doesn't support requested feature" not in line
        ]
        return "\nQEMU said: " + "\n".join(said[-20:]) if said else ""

    def console_tail(self, lines: int = 40) -> str:
        try:
            text = self.console_log.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def _fail(self, kind: type[GuestError], message: str) -> GuestError:
        """Stop the guest and build the error (with the console tail) to raise."""
        error = kind(message, self.console_tail())
        self.stop()
        self._broken = error
        return error

    # ------------------------------------------------------------------ commands
    def environment(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        env = {
            "PATH": f"{self.checkout / '.venv' / 'bin'}:/usr/local/sbin:/usr/local/bin:"
            "/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": "/root",
            "LANG": "C.UTF-8",
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONUNBUFFERED": "1",
            "TMPDIR": "/tmp",
            "COREPIN_GUEST": self.shape.name,
        }
        env.update(extra or {})
        return env

    def run(
        self,
        command: str | Sequence[str],
        *,
        timeout: float = 300.0,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
    ) -> Result:
        """Run `command` (shell text, or an argv that is quoted for the shell) in the guest."""
        if isinstance(self._broken, GuestBootError):
            raise GuestBootError(f"guest {self.shape.name} could not boot: {self._broken}")
        if not self.running:
            # first use, stopped for another shape, or dead after a failed command: boot
            self.start()
        text = command if isinstance(command, str) else shlex.join(command)
        n = self._seq
        self._seq += 1
        lines = ["set -e"]
        for key, value in self.environment(env).items():
            lines.append(f"export {key}={shlex.quote(value)}")
        lines.append(f"cd {shlex.quote(os.fspath(cwd or self.checkout))}")
        lines.append("set +e")
        lines.append(text)
        (self.queue / f"{n}.limit").write_text(f"{max(1, int(timeout))}\n")
        scratch = self.queue / f"{n}.cmd.tmp"
        scratch.write_text("\n".join(lines) + "\n")
        began = time.monotonic()
        scratch.rename(self.queue / f"{n}.cmd")
        rc_file = self.queue / f"{n}.rc"
        deadline = began + timeout + GRACE
        while not rc_file.exists():
            if not self.running:
                raise self._fail(GuestDied, f"guest {self.shape.name} died running: {text}")
            if time.monotonic() > deadline:
                raise self._fail(
                    GuestDied,
                    f"guest {self.shape.name} stopped answering running ({timeout:.0f}s limit "
                    f"+ {GRACE:.0f}s grace): {text}",
                )
            time.sleep(0.02)
        seconds = time.monotonic() - began
        result = Result(
            text,
            int(rc_file.read_text().strip() or "-1"),
            (self.queue / f"{n}.out").read_text(errors="replace"),
            (self.queue / f"{n}.err").read_text(errors="replace"),
            seconds,
        )
        for suffix in ("cmd", "limit", "out", "err", "rc"):
            with contextlib.suppress(FileNotFoundError):
                (self.queue / f"{n}.{suffix}").unlink()
        timed_out = self.queue / f"{n}.timedout"
        if timed_out.exists():
            timed_out.unlink()
            raise GuestTimeout(
                f"guest command ran past its {timeout:.0f}s limit and was killed: {text}\n"
                f"--- stdout ---\n{result.stdout[-3000:]}\n--- stderr ---\n{result.stderr[-3000:]}"
            )
        return result

    def python(self, code: str, *, timeout: float = 120.0) -> Result:
        """Run Python `code` with the venv's interpreter in the guest."""
        return self.run(["python", "-c", code], timeout=timeout)

    def pytest(self, *args: str, timeout: float = 600.0) -> Result:
        """Run a pytest selection of this checkout inside the guest (no cache writes)."""
        return self.run(
            ["python", "-m", "pytest", "-p", "no:cacheprovider", *args], timeout=timeout
        )


def _die_with_parent() -> None:
    """In the forked QEMU: SIGKILL when the process that started it dies, however it dies
    (a killed pytest must not leave guests running)."""
    import ctypes

    pr_set_pdeathsig = 1
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)


class GuestPool:
    """Guests of several shapes, at most one running at a time (a guest of another shape is
    stopped before one boots), the boot files built once. `get(name)` boots a shape's guest on
    first use and keeps it up until another shape is asked for; a boot that fails is tried once
    more (a second failure raises GuestBootError). `boots` records (shape, seconds) of every
    boot, for the timing report."""

    def __init__(self, workdir: Path, shapes: Mapping[str, Shape] | None = None) -> None:
        from .shapes import SHAPES

        self.workdir = Path(workdir)
        self.shapes = dict(shapes or SHAPES)
        self.guests: dict[str, Guest] = {}
        self.boots: list[tuple[str, float]] = []
        self._files: BootFiles | None = None

    def boot_files(self) -> BootFiles:
        if self._files is None:
            self._files = prepare(self.workdir / "boot")
        return self._files

    def activate(self, guest: Guest) -> None:
        """Stop every other guest of the pool (called by a guest about to boot)."""
        for other in self.guests.values():
            if other is not guest and other.running:
                other.stop()

    def get(self, name: str, shape: Shape | None = None) -> Guest:
        """The booted guest of shape `name` (one of `shapes`, or `shape` given here)."""
        if shape is not None:
            self.shapes.setdefault(name, shape)
        guest = self.guests.get(name)
        if guest is None:
            guest = Guest(
                self.shapes[name], self.workdir / name, boot_files=self.boot_files(), pool=self
            )
            self.guests[name] = guest
        if not guest.running:
            try:
                guest.start()
            except GuestBootError:
                guest.start()
            assert guest.boot_seconds is not None
            self.boots.append((name, guest.boot_seconds))
        return guest

    def close(self) -> None:
        """Stop every guest and remove the pool's scratch files (boot files, shares, logs)."""
        for guest in self.guests.values():
            guest.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)


@atexit.register
def _stop_all() -> None:
    for guest in list(_LIVE):
        guest.stop()
