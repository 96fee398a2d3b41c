"""A private containerd + runc for the container end-to-end tests (one per test session).

`tests/conftest.py` turns these into the session fixtures `containerd` and `busybox_rootfs`;
the tests that use them skip with `skip_reason()` when the host cannot run containers.
The kubelet harness (`kubelet_harness.py`, fixture `kubelet_harness`) builds a kubelet on them
that runs the pods of a fake API server's node as real containers.

- The daemon has its own root, state and sockets in a temp dir (CRI plugin off, no network, no
  registry): nothing is pulled and the host's containerd, if any, is not touched.
- The root filesystem is built on the spot from a statically linked busybox (it must run in a
  rootfs without a C library), with applet links for the commands the tests run.
- Cleanup kills every task of the namespace, deletes tasks and containers, stops the daemon,
  unmounts its state and removes the temp dir; `remove_cgroup_trees` removes the scratch
  cgroups a test created, in every v1 hierarchy, killing what is left in them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from support.helpers import kill_and_remove_cgroup

CGROUP = Path("/sys/fs/cgroup")
CPUSET = CGROUP / "cpuset"
NAMESPACE = "corepin-e2e"
TOOLS = ("containerd", "ctr", "runc")
#: busybox applets linked into the rootfs (the commands the tests run inside containers)
APPLETS = ("sh", "sleep", "cat", "grep", "true")


def static_busybox() -> str | None:
    """A statically linked busybox (no ELF interpreter named in its first page), or None."""
    for candidate in ("/bin/busybox", "/usr/bin/busybox"):
        try:
            with open(candidate, "rb") as handle:
                head = handle.read(4096)
        except OSError:
            continue
        if head.startswith(b"\x7fELF") and b"ld-linux" not in head and b"/ld-" not in head:
            return candidate
    return None


def skip_reason() -> str | None:
    """Why containers cannot run here (None when they can)."""
    if os.geteuid() != 0:
        return "needs root to run containers"
    if not (CPUSET / "cpuset.cpus").exists():
        return f"needs a cgroup v1 cpuset hierarchy at {CPUSET}"
    if not os.access(CPUSET, os.W_OK):
        return f"the cgroup v1 cpuset hierarchy at {CPUSET} is not writable"
    absent = [t for t in TOOLS if shutil.which(t) is None]
    if absent:
        return f"{', '.join(absent)} not installed (apt-get install containerd runc)"
    if static_busybox() is None:
        return "a static busybox is not installed (apt-get install busybox-static)"
    return None


#: marks of a test module that runs containers: real host, skipped with `skip_reason()`
NEEDS_CONTAINERS = [
    pytest.mark.realhost,
    pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or ""),
]


@dataclass
class Containerd:
    """A running private containerd; `ctr` talks to it in the test namespace."""

    base: Path
    address: str
    process: subprocess.Popen[bytes]

    def ctr(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run `ctr ARGS` against this daemon; the completed process, whatever its exit code."""
        return subprocess.run(
            ["ctr", "--address", self.address, "-n", NAMESPACE, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def check(self, *args: str, timeout: float = 60) -> str:
        """Run `ctr ARGS`; its standard output, or AssertionError with its stderr."""
        done = self.ctr(*args, timeout=timeout)
        if done.returncode != 0:
            raise AssertionError(f"ctr {' '.join(args)} failed: {done.stderr.strip()}")
        return done.stdout

    def stop_task(self, cid: str, *, attempts: int = 100) -> None:
        """SIGKILL the container's task and delete it (retried while it is still exiting)."""
        self.ctr("task", "kill", "-s", "SIGKILL", cid, timeout=10)
        for _ in range(attempts):
            done = self.ctr("task", "delete", cid, timeout=10)
            if done.returncode == 0 or "not found" in done.stderr:
                break
            time.sleep(0.1)

    def remove_container(self, cid: str) -> None:
        """Stop the container's task (if any) and delete the container."""
        self.stop_task(cid)
        self.ctr("container", "delete", cid, timeout=10)

    def remove_all(self) -> None:
        """Kill and delete every task and container of the namespace."""
        for cid in self.ctr("task", "ls", "-q", timeout=10).stdout.split():
            self.ctr("task", "kill", "-s", "SIGKILL", cid, timeout=10)
        for cid in self.ctr("container", "ls", "-q", timeout=10).stdout.split():
            self.remove_container(cid)


def _config(base: Path, address: str) -> str:
    return (
        "version = 2\n"
        f'root = "{base}/root"\n'
        f'state = "{base}/state"\n'
        'disabled_plugins = ["io.containerd.grpc.v1.cri"]\n'
        f'[grpc]\n  address = "{address}"\n'
        f'[ttrpc]\n  address = "{address}.ttrpc"\n'
        '[plugins."io.containerd.runtime.v2.task"]\n'
        '  platforms = ["linux/amd64", "linux/arm64"]\n'
    )


class DaemonDidNotStart(RuntimeError):
    """The private containerd exited or did not answer in time (the message says which)."""


@contextlib.contextmanager
def private_containerd(base: Path, *, start_timeout: float = 30) -> Iterator[Containerd]:
    """Start containerd with everything below `base`; stop it and remove `base` afterwards.

    DaemonDidNotStart (with the end of its log) when it exits or does not answer in time."""
    address = str(base / "containerd.sock")
    config = base / "config.toml"
    config.write_text(_config(base, address))
    log_path = base / "containerd.log"
    log = open(log_path, "wb")  # noqa: SIM115 - closed in finally
    process = subprocess.Popen(
        ["containerd", "--config", str(config), "--address", address],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    daemon = Containerd(base, address, process)
    try:
        deadline = time.monotonic() + start_timeout
        while True:
            if process.poll() is not None:
                tail = log_path.read_text(errors="replace")[-400:].replace("\n", " ")
                raise DaemonDidNotStart(f"containerd could not start: {tail}")
            with contextlib.suppress(subprocess.TimeoutExpired):
                if daemon.ctr("version", timeout=10).returncode == 0:
                    break
            if time.monotonic() > deadline:
                raise DaemonDidNotStart(f"containerd did not answer within {start_timeout:g} s")
            time.sleep(0.2)
        yield daemon
    finally:
        if process.poll() is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                daemon.remove_all()
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()
        subprocess.run(["umount", "-R", str(base / "state")], capture_output=True, check=False)
        shutil.rmtree(base, ignore_errors=True)


def build_busybox_rootfs(root: Path) -> Path:
    """A minimal root filesystem in `root`: the static busybox as /bin/busybox plus APPLETS."""
    busybox = static_busybox()
    if busybox is None:
        raise RuntimeError("no static busybox on this host (apt-get install busybox-static)")
    for d in ("bin", "proc", "sys", "dev", "tmp", "etc"):
        (root / d).mkdir(parents=True, exist_ok=True)
    shutil.copy2(busybox, root / "bin" / "busybox")
    for applet in APPLETS:
        (root / "bin" / applet).symlink_to("busybox")
    return root


def remove_cgroup_trees(paths: Iterable[str]) -> None:
    """Remove each cgroup path (relative to a hierarchy) with everything below it, in every v1
    hierarchy, in the order given (see `helpers.kill_and_remove_cgroup`)."""
    for rel in paths:
        for hierarchy in CGROUP.iterdir():
            kill_and_remove_cgroup(hierarchy / rel, attempts=50, pause=0.1)


def cgroup_procs(rel: str) -> list[int]:
    """The processes of the cpuset cgroup `rel`."""
    return [int(p) for p in (CPUSET / rel / "cgroup.procs").read_text().split()]


def wait_for_procs(rel: str, at_least: int, timeout: float = 10) -> list[int]:
    """The processes of cgroup `rel` once there are `at_least` of them (or when time is up)."""
    deadline = time.monotonic() + timeout
    while len(cgroup_procs(rel)) < at_least and time.monotonic() < deadline:
        time.sleep(0.05)
    return cgroup_procs(rel)
