"""`corepin dev cluster` (what `make demo-k8s` runs) end to end on this machine: the stand-in
cluster as a real process, with real cgroups and real processes; the samples pinned where
corepin says, and nothing left behind once it stops (scratch cgroups, processes, temp files).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from corepin.cli.main import main
from corepin.core.cpuset import CPUSet
from corepin.core.errors import EnvironmentProblem
from corepin.kube.client import KubeClient
from corepin.kube.config import load_config
from corepin.kube.resources import NCPT
from corepin.testing.cluster import READY
from corepin.testing.cluster_kubelet import CGROUP, V1_HIERARCHIES, cgroup_version
from support.helpers import corepin_argv

F = TypeVar("F", bound=Callable[..., Any])


def _cgroups_usable() -> bool:
    try:
        cgroup_version()
    except EnvironmentProblem:
        return False
    return True


def realhost(test: F) -> F:
    """The marks of a test that runs the stand-in cluster (root, real cgroups)."""
    for mark in (
        pytest.mark.realhost,
        pytest.mark.skipif(os.geteuid() != 0, reason="the stand-in cluster makes cgroups: root"),
        pytest.mark.skipif(not _cgroups_usable(), reason="no cgroup v1 cpuset/cpu/cpuacct nor v2"),
    ):
        test = mark(test)
    return test


ROOT_LINE = re.compile(r"kubelet cgroup root /(\S+) \(cgroup v(\d)\)")
PID_LINE = re.compile(r"\(pid (\d+)\)|sleep pid (\d+) ")
KUBECONFIG_LINE = re.compile(r"kubeconfig (/\S+)")


def _landed(text: str) -> dict[str, tuple[str, str, str, str]]:
    """The table the cluster prints: pod -> (node, policy, CPUs, CPUs the kernel allows)."""
    block = text.split("where they landed")[1].split("[stand-in] try")[0]
    out = {}
    for line in block.splitlines():
        cells = re.split(r"\s{2,}", line.strip())
        if cells and cells[0].startswith("demo-"):
            out[cells[0]] = (cells[1], cells[2], cells[3], cells[4])
    return out


def _check_samples(landed: dict[str, tuple[str, str, str, str]]) -> None:
    assert set(landed) == {"demo-exclusive", "demo-memory-bound", "demo-share", "demo-ineligible"}
    taken: dict[str, set[int]] = {}
    for name in ("demo-exclusive", "demo-memory-bound"):
        node, policy, cpus, allowed = landed[name]
        assert policy == "exclusive", landed
        assert CPUSet.parse(allowed) == CPUSet.parse(cpus), landed  # the kernel agrees
        taken.setdefault(node, set()).update(CPUSet.parse(cpus))
    node, policy, cpus, allowed = landed["demo-share"]
    assert policy == "share" and CPUSet.parse(allowed) == CPUSet.parse(cpus), landed
    for name in ("demo-share", "demo-ineligible"):
        node, policy, _cpus, allowed = landed[name]
        assert policy != "exclusive", landed
        assert not set(CPUSet.parse(allowed)) & taken.get(node, set()), landed


def _check_nothing_left(text: str) -> None:
    roots = ROOT_LINE.findall(text)
    assert roots, text
    for root, version in roots:
        bases = [CGROUP] if version == "2" else [CGROUP / h for h in V1_HIERARCHIES]
        assert [b / root for b in bases if (b / root).exists()] == []
    pids = [int(a or b) for a, b in PID_LINE.findall(text)]
    assert len(pids) >= 5 + 4  # 2 agents, controller, scheduler, webhook; a sleep per sample
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or _not_ours(pid), pid
    kubeconfig = KUBECONFIG_LINE.search(text)
    assert kubeconfig is not None
    assert not Path(kubeconfig.group(1)).parent.exists()


def _not_ours(pid: int) -> bool:
    """A process id reused since by something else (neither corepin nor a sleep)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True
    return b"corepin" not in cmdline and b"sleep" not in cmdline


def test_without_root_it_says_so_and_exits_4(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert main(["dev", "cluster", "--once"]) == 4
    err = capsys.readouterr().err
    assert "needs root" in err
    assert "Traceback" not in err


@realhost
def test_once_pins_the_samples_and_leaves_nothing_behind() -> None:
    out = subprocess.run(
        corepin_argv("dev", "cluster", "--once", "--timeout", "120"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "stand-in" in out.stdout.splitlines()[0]
    assert READY in out.stdout
    _check_samples(_landed(out.stdout))
    assert "nothing left behind" in out.stdout
    _check_nothing_left(out.stdout)


@realhost
def test_it_serves_kubectl_and_corepin_clients_until_sigint() -> None:
    kubectl = shutil.which("kubectl")
    proc = subprocess.Popen(
        corepin_argv("dev", "cluster", "--timeout", "120"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    ready = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if READY in line:
                ready.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 400
        while not ready.wait(1):
            assert proc.poll() is None, "".join(lines)
            assert time.monotonic() < deadline, "".join(lines)
        text = "".join(lines)
        found = KUBECONFIG_LINE.search(text)
        assert found is not None
        kubeconfig = found.group(1)
        kube = KubeClient.from_config(load_config(kubeconfig, env={}), timeout=30)
        try:
            ncpts = kube.list(NCPT)["items"]
        finally:
            kube.close()
        held = {
            row["pod"]: row["policy"]
            for n in ncpts
            for row in (n.get("status") or {}).get("allocations") or []
        }
        assert held.get("demo-exclusive") == "exclusive", held
        assert held.get("demo-memory-bound") == "exclusive", held
        if kubectl is not None:
            got = subprocess.run(
                [kubectl, "get", "ncpt", "-o", "name"],
                env=dict(os.environ, KUBECONFIG=kubeconfig),
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert got.returncode == 0, got.stderr
            names = {n.split("/", 1)[1] for n in got.stdout.split()}
            assert names == {n["metadata"]["name"] for n in ncpts}
    finally:
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=120)
        reader.join(10)
        if proc.stdout is not None:
            proc.stdout.close()
    text = "".join(lines)
    assert code == 0, text
    assert "nothing left behind" in text
    _check_nothing_left(text)
    if kubectl is None:
        pytest.skip("kubectl is not installed: checked with corepin's client only")
