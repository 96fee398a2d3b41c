"""End to end with a real container runtime: containerd + runc, kubelet cgroupfs layout.

A private containerd (own root, state and socket in tmp; no CRI plugin, no network, no registry)
runs a container from a busybox rootfs built on the spot, in the cgroup the kubelet's cgroupfs
driver would give a Burstable pod's container: `/kubepods/burstable/pod<uid>/<container id>`.
The agent then finds that cgroup by the container id and pins it; the container's processes,
and a process exec'ed into it afterwards, must run only on the assigned CPUs.

Needs root, a cgroup v1 cpuset hierarchy, and the Debian packages `containerd`, `runc` and
`busybox-static`; skipped with the reason otherwise. Everything it starts is removed at the end.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from corepin.agent.host import HostAgent
from corepin.agent.settings import HostSettings
from corepin.core.cpuset import CPUSet

pytestmark = pytest.mark.realhost

CPUSET = Path("/sys/fs/cgroup/cpuset")
NAMESPACE = "corepin-e2e"
TOOLS = ("containerd", "ctr", "runc")


def _missing() -> str | None:
    if os.geteuid() != 0:
        return "needs root to run containers"
    if not (CPUSET / "cpuset.cpus").exists():
        return f"needs a cgroup v1 cpuset hierarchy at {CPUSET}"
    absent = [t for t in TOOLS if shutil.which(t) is None]
    if absent:
        return f"{', '.join(absent)} not installed (apt-get install containerd runc)"
    if not _busybox():
        return "busybox (static) not installed (apt-get install busybox-static)"
    return None


def _busybox() -> str | None:
    """A statically linked busybox (it must run in a rootfs without a C library)."""
    for candidate in ("/bin/busybox", "/usr/bin/busybox"):
        try:
            with open(candidate, "rb") as handle:
                head = handle.read(4096)
        except OSError:
            continue
        if head.startswith(b"\x7fELF") and b"ld-linux" not in head and b"/ld-" not in head:
            return candidate
    return None


@dataclass
class Containerd:
    base: Path
    address: str
    process: subprocess.Popen[bytes]

    def ctr(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["ctr", "--address", self.address, "-n", NAMESPACE, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
        )


@pytest.fixture(scope="module")
def containerd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Containerd]:
    reason = _missing()
    if reason:
        pytest.skip(reason)
    base = tmp_path_factory.mktemp("containerd")
    address = str(base / "containerd.sock")
    config = base / "config.toml"
    config.write_text(
        "version = 2\n"
        f'root = "{base}/root"\n'
        f'state = "{base}/state"\n'
        'disabled_plugins = ["io.containerd.grpc.v1.cri"]\n'
        "[grpc]\n"
        f'  address = "{address}"\n'
        '[plugins."io.containerd.runtime.v2.task"]\n'
        '  platforms = ["linux/amd64", "linux/arm64"]\n'
    )
    log = open(base / "containerd.log", "wb")  # noqa: SIM115 - closed below
    process = subprocess.Popen(
        ["containerd", "--config", str(config), "--address", address],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    daemon = Containerd(base, address, process)
    try:
        deadline = time.monotonic() + 30
        while True:
            if process.poll() is not None:
                pytest.skip(
                    "containerd could not start: "
                    + (base / "containerd.log").read_text()[-400:].replace("\n", " ")
                )
            if daemon.ctr("version", timeout=10).returncode == 0:
                break
            if time.monotonic() > deadline:
                pytest.skip("containerd did not answer within 30 s")
            time.sleep(0.2)
        yield daemon
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()
        subprocess.run(["umount", "-R", str(base / "state")], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def rootfs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    reason = _missing()
    if reason:
        pytest.skip(reason)
    busybox = _busybox()
    assert busybox is not None
    root = tmp_path_factory.mktemp("rootfs")
    for d in ("bin", "proc", "sys", "dev", "tmp", "etc"):
        (root / d).mkdir()
    shutil.copy2(busybox, root / "bin" / "busybox")
    for applet in ("sh", "sleep", "cat", "grep", "true"):
        (root / "bin" / applet).symlink_to("busybox")
    return root


@dataclass
class Container:
    id: str
    pod_uid: str
    cgroup: str


def _remove_cgroup_tree(rel: str, created: list[str]) -> None:
    """rmdir the container's cgroups in every v1 hierarchy, then the parents we created."""
    for hierarchy in Path("/sys/fs/cgroup").iterdir():
        for path in (rel, *created):
            target = hierarchy / path
            if target.is_dir():
                with contextlib.suppress(OSError):
                    target.rmdir()


@pytest.fixture
def container(containerd: Containerd, rootfs: Path) -> Iterator[Container]:
    pod_uid = str(uuid.uuid4())
    cid = uuid.uuid4().hex + uuid.uuid4().hex  # 64 hex digits, like a CRI container id
    cgroup = f"kubepods/burstable/pod{pod_uid}/{cid}"
    created = [
        p
        for p in (f"kubepods/burstable/pod{pod_uid}", "kubepods/burstable", "kubepods")
        if not (CPUSET / p).exists()
    ]
    out = containerd.ctr(
        "run",
        "-d",
        "--rootfs",
        "--cgroup",
        "/" + cgroup,
        str(rootfs),
        cid,
        "/bin/sh",
        "-c",
        "sleep 600 & sleep 600 & wait",
    )
    if out.returncode != 0:
        _remove_cgroup_tree(cgroup, created)
        pytest.skip(f"ctr run failed: {out.stderr.strip()[-300:]}")
    try:
        yield Container(cid, pod_uid, cgroup)
    finally:
        containerd.ctr("task", "kill", "-s", "SIGKILL", cid)
        for _ in range(50):
            if containerd.ctr("task", "delete", cid).returncode == 0:
                break
            time.sleep(0.1)
        containerd.ctr("container", "delete", cid)
        _remove_cgroup_tree(cgroup, created)


def _procs(cgroup: str) -> list[int]:
    return [int(p) for p in (CPUSET / cgroup / "cgroup.procs").read_text().split()]


def _allowed(pid: int) -> str:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return line.split(":", 1)[1].strip()
    raise AssertionError(pid)


def test_a_container_in_the_kubelet_cgroupfs_layout_is_found_pinned_and_freed(
    containerd: Containerd, container: Container, tmp_path: Path
) -> None:
    deadline = time.monotonic() + 10
    while len(_procs(container.cgroup)) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    before = _procs(container.cgroup)
    assert len(before) >= 3, "sh and two sleeps run in the container"
    online = CPUSet(os.sched_getaffinity(0))

    agent = HostAgent(HostSettings(state_dir=str(tmp_path / "state"), cgroups="on"))
    assignment = agent.pin_container(container.id, exclusive=1, runtime="containerd")

    assert assignment.cgroup == container.cgroup
    assert len(assignment.cpus) == 1 and assignment.cpus <= online
    want = str(assignment.cpus)
    assert (CPUSet.parse((CPUSET / container.cgroup / "cpuset.cpus").read_text().strip())) == (
        assignment.cpus
    )
    assert (CPUSET / container.cgroup / "cpuset.mems").read_text().strip() == str(assignment.mems)
    for pid in _procs(container.cgroup):
        assert _allowed(pid) == want, f"container process {pid} runs outside {want}"

    exec_out = containerd.ctr(
        "task",
        "exec",
        "--exec-id",
        "probe",
        container.id,
        "/bin/grep",
        "Cpus_allowed_list",
        "/proc/self/status",
    )
    assert exec_out.returncode == 0, exec_out.stderr
    assert exec_out.stdout.split(":", 1)[1].strip() == want, "a new process in it inherits"

    state = agent.read_state()
    assert state.get(assignment.id) is not None
    assert assignment.cpus.isdisjoint(state.shared_pool)

    # nothing drifted: a reconcile pass changes nothing
    assert agent.reconcile_once() == []

    # drift: someone rewrote the container's cpuset; reconcile puts it back
    (CPUSET / container.cgroup / "cpuset.cpus").write_text(str(online))
    changes = agent.reconcile_once()
    assert [c.action for c in changes] == ["repinned"]
    for pid in _procs(container.cgroup):
        assert _allowed(pid) == want

    # the container ends and its cgroup goes away: reconcile frees the CPUs
    containerd.ctr("task", "kill", "-s", "SIGKILL", container.id)
    for _ in range(100):
        if containerd.ctr("task", "delete", container.id).returncode == 0:
            break
        time.sleep(0.1)
    deadline = time.monotonic() + 10
    while (CPUSET / container.cgroup).exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    if (CPUSET / container.cgroup).exists():
        (CPUSET / container.cgroup).rmdir()
    freed = agent.reconcile_once()
    assert [c.action for c in freed] == ["freed"]
    assert agent.read_state().get(assignment.id) is None
