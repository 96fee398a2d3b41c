"""`corepin nri` against a real containerd 1.7 with NRI on (`support.cri_harness`, one private
containerd for the module), driven through the CRI as the kubelet drives it.

- an exclusive container's first instruction runs on its own CPU (its first command prints its
  Cpus_allowed_list), and a shared container started before it leaves that CPU;
- a CRI UpdateContainerResources asking for other CPUs leaves the pin as it was;
- removing the exclusive pod grows the shared container back;
- shared containers created at the same moment as an exclusive one all end on the shared pool
  (one still being started when the exclusive one's reply narrowed it is sent it again);
- an ineligible container (500m) marked exclusive runs on the shared pool, and is not refused;
- `kill -9` of the plugin and a new one keep every pin, with no overlap;
- a restart of containerd is survived (the plugin connects again and pins new containers);
- `corepin nri` and `corepin agent` refuse to manage one node together (exit 4);
- with a kubeconfig (a fake API server over real HTTP), it publishes what the agent publishes:
  the pod's `corepin.io/cpus` annotation, a PodCPUBinding, a `CPUPinned` Event and the node's
  NodeCPUTopology.

The plugin runs as its own process (`python -m corepin nri`); the bed's host has 2 CPUs, so an
exclusive container takes one and the shared pool keeps the other.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from corepin.agent.node.lock import NodeLock
from corepin.core.cpuset import CPUSet
from corepin.kube.client import KubeClient
from corepin.kube.resources import EVENTS, NCPT, NODES, PCB, PODS
from support import pods
from support.cri_client import report_then
from support.cri_harness import NEEDS_CRI_BED, CriBed
from support.helpers import corepin_argv, reap, wait_for
from support.kube_helpers import install_crds
from support.ports import free_port

pytestmark = NEEDS_CRI_BED

EXCLUSIVE = {"corepin.io/cpu-policy": "exclusive"}


class Plugin:
    """A `corepin nri` process connected to the bed's runtime."""

    def __init__(self, bed: CriBed, state_dir: Path, log: Path, *extra: str) -> None:
        self.bed = bed
        self.state_dir = state_dir
        self.port = free_port()
        self.log_path = log
        self.log = open(log, "ab")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            corepin_argv(
                "nri",
                "--socket",
                bed.nri_socket,
                "--state-dir",
                str(state_dir),
                "--node-name",
                "bed",
                "--metrics-address",
                f"127.0.0.1:{self.port}",
                "-v",
                *extra,
            ),
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        self.wait_ready()

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=1) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def wait_ready(self, timeout: float = 30) -> None:
        def ready() -> bool:
            assert self.process.poll() is None, f"corepin nri exited: {self.text()[-800:]}"
            return self.healthy()

        wait_for(ready, timeout, "corepin nri to synchronize with the runtime")

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=2) as r:
            return str(r.read().decode())

    def text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        reap(self.process)
        self.log.close()

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.terminate()
            reap(self.process)
        self.log.close()
        return int(self.process.returncode)


@pytest.fixture
def plugin(cri_bed: CriBed, tmp_path: Path) -> Iterator[Plugin]:
    state = tmp_path / "state"
    running = Plugin(cri_bed, state, tmp_path / "nri.log")
    try:
        yield running
    finally:
        running.stop()
        for pod_id in list(cri_bed.cri.pods):
            with contextlib.suppress(Exception):
                cri_bed.cri.remove_pod(pod_id)


def cpus(text: str) -> CPUSet:
    return CPUSet.parse(text)


def online() -> CPUSet:
    return cpus(Path("/sys/fs/cgroup/cpuset/cpuset.cpus").read_text())


def start(bed: CriBed, name: str, milli: int, annotations: dict[str, str] | None = None) -> str:
    """A pod of one container that prints its CPUs first, then sleeps; the container's id."""
    pod = bed.cri.run_pod(name, annotations=annotations or {})
    return bed.cri.create_and_start(
        pod, "app", report_then(), cpu_request_milli=milli, cpu_limit_milli=milli
    )


def pod_of(bed: CriBed, cid: str) -> str:
    """The pod sandbox of a container."""
    return str(next(c.pod_sandbox_id for c in bed.cri.list_containers() if c.id == cid))


def test_exclusive_pinned_before_its_first_instruction_and_kept(
    cri_bed: CriBed, plugin: Plugin
) -> None:
    shared = start(cri_bed, "shared", 500)
    assert cpus(cri_bed.cri.reported_cpus(shared)) == online()

    mine = start(cri_bed, "exclusive", 1000, EXCLUSIVE)
    first = cpus(cri_bed.cri.reported_cpus(mine))
    assert len(first) == 1, f"the exclusive container started on {first}"
    assert cpus(cri_bed.live_cpuset(mine)) == first
    # the shared container, started before, no longer runs there
    assert cpus(cri_bed.live_allowed_cpus(shared)) == online() - first
    assert cpus(cri_bed.live_cpuset(shared)) == online() - first

    # the kubelet's UpdateContainerResources asking for every CPU leaves the pin
    cri_bed.cri.update_resources(
        mine, cpuset_cpus=str(online()), cpu_quota=100000, cpu_period=100000, cpu_shares=1024
    )
    assert cpus(cri_bed.live_cpuset(mine)) == first
    assert cpus(cri_bed.live_allowed_cpus(mine)) == first

    # removing the exclusive pod grows the shared container back
    cri_bed.cri.remove_pod(pod_of(cri_bed, mine))
    wait_for(
        lambda: cpus(cri_bed.live_allowed_cpus(shared)) == online(),
        what="the shared container to grow back",
    )
    assert 'corepin_nri_requests_total{event="create_container"}' in plugin.metrics()


def test_containers_created_at_the_same_moment_all_end_on_their_pins(
    cri_bed: CriBed, plugin: Plugin
) -> None:
    # a shared container still being created when the exclusive one's reply narrows it misses
    # that update; the plugin repairs it once the runtime has created it
    names = [f"shared{i}" for i in range(8)]
    with ThreadPoolExecutor(4) as pool:
        shared = list(pool.map(lambda n: start(cri_bed, n, 500), names[:4]))
        mine_future = pool.submit(start, cri_bed, "exclusive", 1000, EXCLUSIVE)
        shared += list(pool.map(lambda n: start(cri_bed, n, 500), names[4:]))
        mine = mine_future.result()
    pinned = cpus(cri_bed.cri.reported_cpus(mine))
    assert len(pinned) == 1
    for cid in shared:
        wait_for(
            lambda cid=cid: cpus(cri_bed.live_allowed_cpus(cid)) == online() - pinned,
            what=f"shared container {cid[:12]} to leave the exclusive CPU",
        )


def test_ineligible_exclusive_container_runs_on_the_shared_pool(
    cri_bed: CriBed, plugin: Plugin
) -> None:
    cid = start(cri_bed, "half", 500, EXCLUSIVE)
    assert cpus(cri_bed.cri.reported_cpus(cid)) == online()
    assert "CPUPolicyIgnored" in plugin.text()


def test_kill_9_and_a_new_plugin_keep_every_pin(
    cri_bed: CriBed, plugin: Plugin, tmp_path: Path
) -> None:
    shared = start(cri_bed, "shared", 500)
    mine = start(cri_bed, "exclusive", 1000, EXCLUSIVE)
    pinned = cpus(cri_bed.cri.reported_cpus(mine))
    plugin.kill()
    again = Plugin(cri_bed, plugin.state_dir, tmp_path / "nri-again.log")
    try:
        assert cpus(cri_bed.live_cpuset(mine)) == pinned
        assert cpus(cri_bed.live_allowed_cpus(shared)) == online() - pinned
        # a second exclusive container does not get the pinned CPU (2 CPUs: the pool keeps
        # the other one, so it runs there)
        other = start(cri_bed, "exclusive2", 1000, EXCLUSIVE)
        assert not cpus(cri_bed.cri.reported_cpus(other)) & pinned
    finally:
        again.stop()


def test_a_runtime_restart_is_survived(cri_bed: CriBed, plugin: Plugin) -> None:
    shared = start(cri_bed, "shared", 500)
    cri_bed.restart()
    cri_bed.cri.reconnect()
    plugin.wait_ready(60)
    mine = start(cri_bed, "after-restart", 1000, EXCLUSIVE)
    first = cpus(cri_bed.cri.reported_cpus(mine))
    assert len(first) == 1
    wait_for(
        lambda: cpus(cri_bed.live_allowed_cpus(shared)) == online() - first,
        what="the shared container to leave the new exclusive CPU",
    )
    assert plugin.process.poll() is None


def test_agent_and_nri_refuse_to_manage_one_node_together(
    cri_bed: CriBed, plugin: Plugin, tmp_path: Path
) -> None:
    # the running plugin holds the node; an agent with the same state directory is refused
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: "
        "'http://127.0.0.1:1'}}]\ncontexts: [{name: c, context: {cluster: c, user: u}}]\n"
        "current-context: c\nusers: [{name: u, user: {}}]\n"
    )
    agent = subprocess.run(
        corepin_argv(
            "agent",
            "--node-name",
            "bed",
            "--kubeconfig",
            str(kubeconfig),
            "--state-dir",
            str(plugin.state_dir),
            "--metrics-address",
            f"127.0.0.1:{free_port()}",
            "--grpc-socket",
            str(tmp_path / "agent.sock"),
        ),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert agent.returncode == 4, agent.stderr
    assert "corepin nri" in agent.stderr
    # and an agent's lock makes `corepin nri` refuse at once
    held = NodeLock(str(tmp_path / "agent-state"), "bed", mode="agent")
    assert held.acquire()
    try:
        nri = subprocess.run(
            corepin_argv(
                "nri",
                "--socket",
                cri_bed.nri_socket,
                "--state-dir",
                str(tmp_path / "agent-state"),
                "--metrics-address",
                f"127.0.0.1:{free_port()}",
            ),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        held.release()
    assert nri.returncode == 4, nri.stderr
    assert "corepin agent" in nri.stderr and f"pid={os.getpid()}" in nri.stderr


def test_with_the_api_it_publishes_what_the_agent_publishes(
    cri_bed: CriBed, kube: KubeClient, fake_kubeconfig: Path, tmp_path: Path
) -> None:
    install_crds(kube)
    kube.create(NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "bed"}})
    created = kube.create(
        PODS, pods.pod("web", pods.container("app", cpu="1"), node="bed", annotations=EXCLUSIVE)
    )
    uid = created["metadata"]["uid"]
    plugin = Plugin(
        cri_bed, tmp_path / "state", tmp_path / "nri.log", "--kubeconfig", str(fake_kubeconfig)
    )
    try:
        sandbox = cri_bed.cri.run_pod("web", uid=uid, annotations=EXCLUSIVE)
        cid = cri_bed.cri.create_and_start(
            sandbox, "app", report_then(), cpu_request_milli=1000, cpu_limit_milli=1000
        )
        mine = cri_bed.cri.reported_cpus(cid)

        def annotated() -> bool:
            annotations = kube.get(PODS, "web", "default")["metadata"].get("annotations", {})
            return json.loads(annotations.get("corepin.io/cpus", "{}")) == {"app": mine}

        wait_for(annotated, what="the corepin.io/cpus annotation")
        (binding,) = kube.list(PCB, "default")["items"]
        assert binding["spec"]["podName"] == "web"
        assert binding["status"]["cpus"] == mine
        wait_for(
            lambda: any(
                e.get("reason") == "CPUPinned" for e in kube.list(EVENTS, "default")["items"]
            ),
            what="a CPUPinned Event",
        )
        wait_for(
            lambda: (
                [a["pod"] for a in kube.get(NCPT, "bed").get("status", {}).get("allocations", [])]
                == ["web"]
            ),
            what="the NodeCPUTopology's allocation",
        )
    finally:
        plugin.stop()
        for pod_id in list(cri_bed.cri.pods):
            with contextlib.suppress(Exception):
                cri_bed.cri.remove_pod(pod_id)
