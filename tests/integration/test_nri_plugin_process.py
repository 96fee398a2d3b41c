"""`corepin nri` as a process against a runtime peer that speaks NRI over a real unix socket
(`support.nri_runtime.FakeRuntime`: no containerd needed, so these run on every machine; the
same scenarios against a real containerd are in tests/e2e/test_nri_e2e.py).

- it registers as corepin (index 10), subscribes to the container and pod events it needs, and
  is ready (/healthz 200) once synchronized;
- an exclusive container gets its CPUs in the CreateContainer reply, and the shared container
  started before it is updated in the same reply;
- UpdateContainer is answered with the pin; a stopped container's CPUs come back in the
  StopContainer reply, and the plugin never calls the runtime's UpdateContainers itself;
- SIGKILL and a new process keep the pins (the runtime synchronizes it with what it applied);
- a runtime restart is survived: the plugin registers again and pins new containers;
- SIGTERM stops it within 5 s.
"""

from __future__ import annotations

import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from corepin.core.cpuset import CPUSet
from corepin.nri.gen import api_pb2
from corepin.testing.machines import SyntheticSpec, synthetic
from corepin.testing.sysfs_tree import write_sysfs_tree
from support import nri_runtime as rt
from support.helpers import corepin_argv, reap, wait_for
from support.ports import free_port

EXCLUSIVE = {"corepin.io/cpu-policy": "exclusive"}


class Process:
    def __init__(self, socket: Path, state: Path, sysfs: Path, log: Path) -> None:
        self.port = free_port()
        self.log_path = log
        self.log = open(log, "ab")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            corepin_argv(
                "nri", "--socket", str(socket), "--state-dir", str(state),
                "--sysfs-root", str(sysfs), "--node-name", "n1",
                "--metrics-address", f"127.0.0.1:{self.port}", "-v",
            ),
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=1) as r:
                return r.status, r.read().decode()
        except OSError:
            return 0, ""

    def wait_ready(self) -> None:
        def ready() -> bool:
            assert self.process.poll() is None, self.log_path.read_text()[-800:]
            return self.get("/healthz")[0] == 200

        wait_for(ready, 20, "corepin nri to be ready")

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(10)
            finally:
                reap(self.process)
        self.log.close()
        return int(self.process.returncode)


@pytest.fixture
def sysfs(tmp_path: Path) -> Path:
    """A machine of 8 CPUs (4 cores x 2 threads, one NUMA node) as sysfs shows it."""
    return write_sysfs_tree(
        synthetic(SyntheticSpec(cores_per_l3=4, threads_per_core=2)), tmp_path / "sysfs"
    )


@pytest.fixture
def runtime(tmp_path: Path) -> Iterator[rt.FakeRuntime]:
    with rt.FakeRuntime(tmp_path / "nri.sock") as fake:
        yield fake


def cpus_of(cpu: api_pb2.LinuxCPU) -> CPUSet:
    return CPUSet.parse(cpu.cpus)


def test_pins_in_the_reply_and_keeps_them_across_kill_9_and_a_runtime_restart(
    runtime: rt.FakeRuntime, sysfs: Path, tmp_path: Path
) -> None:
    plugin = Process(runtime.path or tmp_path, tmp_path / "state", sysfs, tmp_path / "a.log")
    try:
        plugin.wait_ready()
        session = runtime.wait_session()
        assert session.registration is not None
        assert (session.registration.plugin_name, session.registration.plugin_idx) == (
            "corepin",
            "10",
        )
        for event in (api_pb2.CREATE_CONTAINER, api_pb2.UPDATE_CONTAINER, api_pb2.STOP_CONTAINER,
                      api_pb2.REMOVE_POD_SANDBOX):  # fmt: skip
            assert session.subscribed(event), api_pb2.Event.Name(event)

        web = rt.pod("web")
        shared = rt.container(web, "app", cpu_request=0.5, cpu_limit=1)
        runtime.run_pod(web)
        first = runtime.create_container(web, shared)
        assert first is not None
        assert cpus_of(first.adjust.linux.resources.cpu) == CPUSet.parse("0-7")
        runtime.start_container(shared)

        db = rt.pod("db", annotations=EXCLUSIVE)
        pinned = rt.container(db, "app", cpu_request=2, cpu_limit=2)
        runtime.run_pod(db)
        reply = runtime.create_container(db, pinned)
        assert reply is not None
        mine = cpus_of(reply.adjust.linux.resources.cpu)
        assert len(mine) == 2 and reply.adjust.linux.resources.cpu.quota.value == -1
        runtime.start_container(pinned)
        (update,) = reply.update
        assert update.container_id == shared.id
        assert cpus_of(update.linux.resources.cpu) == CPUSet.parse("0-7") - mine

        asked = api_pb2.LinuxResources()
        asked.cpu.cpus = "0-7"
        again = runtime.update_container(pinned, asked)
        assert again is not None
        assert [cpus_of(u.linux.resources.cpu) for u in again.update] == [mine]

        # SIGKILL: a new process synchronizes with what the runtime applied and keeps it
        plugin.process.send_signal(signal.SIGKILL)
        reap(plugin.process)
        plugin.log.close()
        plugin = Process(runtime.path or tmp_path, tmp_path / "state", sysfs, tmp_path / "b.log")
        plugin.wait_ready()
        assert not runtime.wait_session().sync_updates, "nothing drifted: nothing to update"
        assert cpus_of(runtime.containers[pinned.id].linux.resources.cpu) == mine

        # a runtime restart: registered again; a new exclusive container avoids the pinned CPUs
        runtime.restart()
        runtime.wait_session(3)
        plugin.wait_ready()
        cache = rt.pod("cache", annotations=EXCLUSIVE)
        other = rt.container(cache, "app", cpu_request=2, cpu_limit=2)
        runtime.run_pod(cache)
        reply = runtime.create_container(cache, other)
        assert reply is not None and not cpus_of(reply.adjust.linux.resources.cpu) & mine

        # the exclusive container stops: its CPUs come back in the StopContainer reply
        stopped = runtime.stop_container(pinned)
        assert stopped is not None
        grown = {u.container_id: cpus_of(u.linux.resources.cpu) for u in stopped.update}
        assert mine <= grown[shared.id]
        assert not runtime.update_requests, "corepin never calls UpdateContainers on its own"
        _, metrics = plugin.get("/metrics")
        assert 'corepin_nri_requests_total{event="create_container"}' in metrics
        started = time.monotonic()
        assert plugin.stop() == 0
        assert time.monotonic() - started < 5
    finally:
        plugin.stop()
