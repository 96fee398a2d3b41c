"""Small helpers shared by several test modules: running the real `corepin` command, reaping a
child process, reading a process's allowed CPUs from /proc, polling for a condition, removing
scratch cgroups, the published kubelet checkpoint vectors."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from support.paths import PEER_FIXTURES


def corepin_argv(*args: str) -> list[str]:
    """The command line of `corepin ARGS` run by this interpreter (`python -m corepin`)."""
    return [sys.executable, "-m", "corepin", *args]


def run_corepin(
    *args: str, env: Mapping[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """`corepin ARGS` in a child process, its output captured as text."""
    return subprocess.run(
        corepin_argv(*args),
        capture_output=True,
        text=True,
        timeout=timeout,
        env=None if env is None else dict(env),
        check=False,
    )


def reap(proc: subprocess.Popen[Any], timeout: float | None = 10) -> None:
    """End a child the test started if it still runs (SIGKILL), wait for it and close its
    pipes."""
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout)
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()


def allowed_cpus(pid: int) -> str:
    """The `Cpus_allowed_list` of a process as the kernel prints it in /proc/PID/status."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return line.split(":", 1)[1].strip()
    raise AssertionError(f"no Cpus_allowed_list for {pid}")


def wait_for(
    predicate: Callable[[], object], timeout: float = 15.0, what: str = "condition"
) -> None:
    """Poll `predicate` every 50 ms until it is true; AssertionError naming `what` on timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def kill_and_remove_cgroup(base: Path, *, attempts: int = 100, pause: float = 0.05) -> bool:
    """Remove the cgroup directory `base` with everything below it: processes still in it are
    SIGKILLed, directories removed bottom-up, retried while the kernel still counts exiting
    tasks. True when it is gone (or was never there)."""
    for _ in range(attempts):
        if not base.exists():
            return True
        for d, _s, _f in os.walk(base):
            with contextlib.suppress(OSError):
                for pid in Path(d, "cgroup.procs").read_text().split():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(pid), signal.SIGKILL)
        try:
            for d in sorted((d for d, _s, _f in os.walk(base)), key=lambda x: -x.count("/")):
                os.rmdir(d)
            return True
        except OSError:
            time.sleep(pause)
    return not base.exists()


KUBELET_VECTORS_FILE = PEER_FIXTURES / "kubelet_cpu_manager_state" / "vectors.json"


def load_kubelet_vectors() -> list[dict[str, Any]]:
    """The published cpu_manager_state vectors (values from the kubelet's own tests); empty
    when the fixtures are absent."""
    if not KUBELET_VECTORS_FILE.exists():
        return []
    vectors: list[dict[str, Any]] = json.loads(KUBELET_VECTORS_FILE.read_text())["vectors"]
    return vectors


def kubelet_vector_file(v: dict[str, Any]) -> str:
    """The checkpoint file the kubelet would have written for a vector."""
    if v["format"] == "v4-data":
        return json.dumps({"data": v["data"], "checksum": v["dataChecksum"]})
    doc: dict[str, Any] = {"policyName": v["policyName"], "defaultCpuSet": v["defaultCpuSet"]}
    if v["entries"]:
        doc["entries"] = v["entries"]
    doc["checksum"] = v["checksum"]
    return json.dumps(doc)


#: the v1 hierarchies host mode makes a state directory's groups in
HOST_HIERARCHIES = ("cpuset", "cpu", "cpuacct")


def remove_state_cgroups(state_dir: Path | str, cgroup_root: Path = Path("/sys/fs/cgroup")) -> None:
    """Remove what host mode left of state directory `state_dir` below the cgroup root: its
    group `corepin/<state dir key>` in every hierarchy, deepest first (empty groups only: a
    group that still holds a process is the test's bug, and stays for it to see)."""
    from corepin.agent.settings import state_dir_key

    key = state_dir_key(str(state_dir))
    for hierarchy in HOST_HIERARCHIES:
        top = cgroup_root / hierarchy / "corepin" / key
        if not top.is_dir():
            continue
        for folder in sorted((p for p in top.rglob("*") if p.is_dir()), reverse=True):
            with contextlib.suppress(OSError):
                folder.rmdir()
        with contextlib.suppress(OSError):
            top.rmdir()
