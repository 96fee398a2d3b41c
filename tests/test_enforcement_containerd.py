"""End to end with containerd + runc: a real container in the kubelet's cgroupfs layout is found
by its id and pinned, and its processes run only on the assigned CPUs.

A private containerd (own root, state and socket in a temp dir, CRI plugin off) is started for
the module, so nothing is pulled and the host's containerd (if any) is not touched. The
container's root filesystem is an empty directory with the host's /usr bind-mounted read-only.
Skipped with a reason where not root, without containerd/ctr/runc, or without a writable v1
cpuset hierarchy.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from corepin.core.cpuset import CPUSet
from corepin.enforcement.cgroups import CgroupV1, CpuQuota
from corepin.enforcement.layout import (
    container_cgroup_path,
    find_container_cgroup,
    index_container_cgroups,
)
from corepin.enforcement.reconcile import CgroupTarget, reconcile
from corepin.sysfs.procfs import cgroup_of, cpus_allowed_list, list_threads, read_cgroup

CGROUP = Path("/sys/fs/cgroup")
CPUSET = CGROUP / "cpuset"
CPU = CGROUP / "cpu"


def _skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root to run containers"
    for tool in ("containerd", "ctr", "runc"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (the Debian packages containerd and runc)"
    if not (CPUSET / "cpuset.cpus").exists() or not os.access(CPUSET, os.W_OK):
        return f"no writable cgroup v1 cpuset hierarchy at {CPUSET}"
    return None


_REASON = _skip_reason()
pytestmark = [
    pytest.mark.realhost,
    pytest.mark.skipif(_REASON is not None, reason=_REASON or ""),
]


@dataclass
class Containerd:
    address: str
    workdir: Path
    rootfs: Path
    top: str  # scratch cgroup parent used as the kubelet's --cgroup-root

    def ctr(self, *args: str, timeout: float = 30) -> str:
        done = subprocess.run(
            ["ctr", "--address", self.address, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if done.returncode != 0:
            raise AssertionError(f"ctr {' '.join(args)} failed: {done.stderr.strip()}")
        return done.stdout


def _remove_cgroups(top: str) -> None:
    for hierarchy in CGROUP.iterdir():
        base = hierarchy / top
        if not base.is_dir():
            continue
        for _ in range(50):
            for d, _s, _f in os.walk(base):
                procs = Path(d, "cgroup.procs")
                if procs.exists():
                    for pid in procs.read_text().split():
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(int(pid), signal.SIGKILL)
            try:
                for d in sorted((d for d, _s, _f in os.walk(base)), key=lambda x: -x.count("/")):
                    os.rmdir(d)
                break
            except OSError:
                time.sleep(0.1)


@pytest.fixture(scope="module")
def containerd() -> Iterator[Containerd]:
    workdir = Path(tempfile.mkdtemp(prefix="corepin-ctrd-"))
    address = str(workdir / "c.sock")
    (workdir / "config.toml").write_text(
        "version = 2\n"
        f'root = "{workdir}/root"\n'
        f'state = "{workdir}/state"\n'
        f'[grpc]\n  address = "{address}"\n'
        f'[ttrpc]\n  address = "{address}.ttrpc"\n'
        '[plugins."io.containerd.grpc.v1.cri"]\n  disable = true\n'
    )
    rootfs = workdir / "rootfs"
    for d in ("proc", "dev", "sys", "tmp", "etc", "usr"):
        (rootfs / d).mkdir(parents=True)
    for link, target in (("bin", "usr/bin"), ("lib", "usr/lib"), ("lib64", "usr/lib64")):
        (rootfs / link).symlink_to(target)
    log = open(workdir / "containerd.log", "wb")  # noqa: SIM115 - closed in finally
    daemon = subprocess.Popen(
        ["containerd", "--config", str(workdir / "config.toml")], stdout=log, stderr=log
    )
    env = Containerd(address, workdir, rootfs, f"corepin-e2e-{uuid.uuid4().hex[:8]}")
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                env.ctr("version", timeout=5)
                break
            except (AssertionError, subprocess.TimeoutExpired):
                if time.monotonic() > deadline or daemon.poll() is not None:
                    pytest.skip(f"private containerd did not start: see {workdir}/containerd.log")
                time.sleep(0.2)
        yield env
    finally:
        try:
            for line in env.ctr("task", "ls", "-q", timeout=10).split():
                subprocess.run(
                    ["ctr", "--address", address, "task", "kill", "-s", "SIGKILL", line],
                    capture_output=True,
                    timeout=10,
                    check=False,
                )
            time.sleep(0.3)
            for line in env.ctr("container", "ls", "-q", timeout=10).split():
                subprocess.run(
                    ["ctr", "--address", address, "task", "delete", "-f", line],
                    capture_output=True,
                    timeout=10,
                    check=False,
                )
                subprocess.run(
                    ["ctr", "--address", address, "container", "delete", line],
                    capture_output=True,
                    timeout=10,
                    check=False,
                )
        except (AssertionError, subprocess.TimeoutExpired):
            pass
        daemon.terminate()
        try:
            daemon.wait(timeout=10)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()
        log.close()
        _remove_cgroups(env.top)
        subprocess.run(["umount", "-R", str(workdir / "state")], capture_output=True, check=False)
        shutil.rmtree(workdir, ignore_errors=True)


def _container_pids(path: str) -> list[int]:
    return [int(p) for p in (CPUSET / path / "cgroup.procs").read_text().split()]


def test_a_real_container_is_found_by_id_and_pinned(containerd: Containerd) -> None:
    uid = str(uuid.uuid4())
    cid = uuid.uuid4().hex * 2
    path = container_cgroup_path(
        "cgroupfs", "burstable", uid, "containerd", cid, cgroup_root=containerd.top
    )
    containerd.ctr(
        "run", "-d",
        "--cgroup", "/" + path,
        "--mount", "type=bind,src=/usr,dst=/usr,options=rbind:ro",
        "--rootfs", str(containerd.rootfs),
        cid,
        "/usr/bin/sh", "-c", "sleep 300 & sleep 300 & wait",
    )  # fmt: skip
    deadline = time.monotonic() + 10
    while len(_container_pids(path)) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    pids = _container_pids(path)
    assert len(pids) >= 3, "sh and two sleeps run in the container's cgroup"

    # found by scanning for the id, in the kubelet's cgroupfs layout
    assert find_container_cgroup(CPUSET, cid, under=[containerd.top]) == path
    assert index_container_cgroups(CPUSET, under=[containerd.top]) == {cid: path}
    assert cgroup_of(read_cgroup(pids[0]), "cpuset") == "/" + path

    online = CPUSet.parse((CPUSET / "cpuset.cpus").read_text())
    want = CPUSet.of(online.last())
    cpu_root = CPU if (CPU / path).is_dir() else None
    drv = CgroupV1(CPUSET, cpu_root)
    if cpu_root is not None:  # a kubelet CPU limit on the container, removed when pinned
        drv.write_quota(path, CpuQuota(50000, 100000))
    report = reconcile(
        [
            CgroupTarget(
                path,
                cpus=want,
                mems=CPUSet.parse((CPUSET / "cpuset.mems").read_text()),
                quota=CpuQuota.unlimited() if cpu_root is not None else None,
            )
        ],
        cgroups=drv,
    )
    assert report.ok, report.errors
    assert any(c.what == "cpuset.cpus" and c.new == str(want) for c in report.changes)
    for pid in _container_pids(path):
        for tid in list_threads(pid):
            assert cpus_allowed_list(pid, tid=tid) == want, f"thread {tid} of container pid {pid}"
    if cpu_root is not None:
        assert (cpu_root / path / "cpu.cfs_quota_us").read_text().strip() == "-1"

    # a process started in the container afterwards lands on the same CPUs
    containerd.ctr("task", "exec", "-d", "--exec-id", "late", cid, "/usr/bin/sleep", "300")
    deadline = time.monotonic() + 10
    while len(_container_pids(path)) <= len(pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    late = sorted(set(_container_pids(path)) - set(pids))
    assert late, "the exec'd process joined the container's cgroup"
    assert all(cpus_allowed_list(p) == want for p in late)

    # steady state: nothing to write
    again = reconcile(
        [CgroupTarget(path, cpus=want, quota=CpuQuota.unlimited() if cpu_root else None)],
        cgroups=drv,
    )
    assert again.writes == 0 and again.changes == []
