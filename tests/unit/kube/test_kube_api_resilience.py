"""A real `corepin agent` process against the fake API server when the connection or the server
misbehaves: a proxy in front of the API that swallows every connection without closing it (the
agent notices within its idle bound, /healthz fails meanwhile, and it pins what it missed once
the proxy forwards again), 429s with Retry-After on its pod watch (it waits what it was told,
and pins the pod as soon as the server lets it), and an API server restored to an older state
(resource versions go backwards: the agent relists and pins pods created after the restore).
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from corepin.core.cpuset import CPUSet
from corepin.kube.client import KubeClient
from corepin.kube.models import ANN_CPUS
from corepin.kube.resources import NCPT, PODS
from corepin.testing.fakeapi import FakeApiServer
from corepin.testing.fakeapi.kubeconfig import write_kubeconfig
from corepin.topology.discover import discover
from support.blackhole import BlackholeProxy
from support.helpers import corepin_argv, wait_for
from support.node_harness import FakeNode
from support.pods import EXCLUSIVE, container
from support.ports import free_port

NODE = "n1"
IDLE = 6.0  # the agent's --api-idle-timeout in these tests

pytestmark = pytest.mark.skipif(
    len(os.sched_getaffinity(0)) < 2, reason="an exclusive CPU needs at least 2 CPUs"
)


def healthz(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return 0


def cpus_annotation(kube: KubeClient, name: str) -> str | None:
    pod = kube.get(PODS, name, "default")
    found = ((pod.get("metadata") or {}).get("annotations") or {}).get(ANN_CPUS)
    return None if found is None else str(found)


class Agent:
    """A `corepin agent` process for node n1 with a fake cgroup tree, stopped afterwards."""

    def __init__(self, kubeconfig: Path, tmp: Path) -> None:
        self.port = free_port()
        self.argv = corepin_argv(
            "agent",
            "--kubeconfig",
            str(kubeconfig),
            "--cgroup-root",
            str(tmp / "cgroup"),
            "--state-dir",
            str(tmp / "state"),
            "--kubelet-state",
            str(tmp / "none"),
            "--grpc-socket",
            str(tmp / "corepin.sock"),
            "--metrics-address",
            f"127.0.0.1:{self.port}",
            "--assignment-dir",
            str(tmp / "assignments"),
            "--api-idle-timeout",
            str(IDLE),
        )
        self.log = (tmp / "agent.log").open("w")
        self.proc = subprocess.Popen(
            self.argv, env={**os.environ, "NODE_NAME": NODE}, stderr=self.log, text=True
        )

    def healthy(self) -> bool:
        assert self.proc.poll() is None, f"the agent exited {self.proc.returncode}"
        return healthz(self.port) == 200

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


@pytest.fixture
def node(kube: KubeClient, tmp_path: Path) -> FakeNode:
    """The node: its Node object, the CRDs, a fake cgroup tree in the kubelet's layout and a
    stand-in kubelet that runs pods (cgroups plus a Running status)."""
    return FakeNode(kube, discover("/"), tmp_path, name=NODE)


def run_exclusive(node: FakeNode, name: str) -> None:
    node.run(node.pod(name, container("app", "1", memory="64Mi"), annotations=EXCLUSIVE))


@pytest.fixture
def agents() -> Iterator[list[Agent]]:
    started: list[Agent] = []
    yield started
    for agent in started:
        agent.stop()


def test_a_silently_dead_connection_is_noticed_healthz_fails_and_the_agent_recovers(
    node: FakeNode, kube: KubeClient, fake_api: FakeApiServer, tmp_path: Path, agents: list[Agent]
) -> None:
    with BlackholeProxy(fake_api.port) as proxy:
        agent = Agent(write_kubeconfig(tmp_path / "proxied", proxy.url), tmp_path)
        agents.append(agent)
        wait_for(agent.healthy, timeout=60, what="the agent's /healthz answering 200")
        assert proxy.blackhole() >= 3  # the agent's watches (pods, node, bindings) at least
        run_exclusive(node, "during")
        wait_for(
            lambda: not agent.healthy(),
            timeout=4 * IDLE,
            what="/healthz failing while the agent cannot see the API",
        )
        assert cpus_annotation(kube, "during") is None

        proxy.restore()
        wait_for(
            lambda: cpus_annotation(kube, "during"),
            timeout=8 * IDLE,
            what="the pod created behind the black hole pinned once the proxy forwards again",
        )
        wait_for(agent.healthy, timeout=4 * IDLE, what="/healthz back to 200")


def test_retry_after_on_the_pod_watch_is_honoured(
    node: FakeNode, kube: KubeClient, fake_api: FakeApiServer, tmp_path: Path, agents: list[Agent]
) -> None:
    agent = Agent(fake_api.write_kubeconfig(tmp_path / "kubeconfig"), tmp_path)
    agents.append(agent)
    wait_for(agent.healthy, timeout=60, what="the agent's /healthz answering 200")
    pods_path = "^/api/v1/pods$"
    fake_api.clear_requests()
    fake_api.inject(pods_path, status=429, times=3, query={"watch": "1"}, retry_after=2)
    fake_api.drop_watches()
    wait_for(
        lambda: len([r for r in fake_api.recorded(verb="watch") if r.path == "/api/v1/pods"]) >= 4,
        timeout=30,
        what="3 refused pod watches and one more",
    )
    run_exclusive(node, "late")
    wait_for(lambda: cpus_annotation(kube, "late"), timeout=30, what="the pod pinned")
    starts = [r.at for r in fake_api.recorded(verb="watch") if r.path == "/api/v1/pods"]
    gaps = [b - a for a, b in itertools.pairwise(starts[:4])]
    # every retry waited at least the 2 s it was told (a backoff of its own starts at 0.5 s)
    assert min(gaps) >= 1.95, gaps
    # and not much more: one incident's failures do not pile up into a long backoff
    assert max(gaps) < 2.2 + 1.5, gaps


def test_an_api_server_restored_to_an_older_state_is_relisted(
    node: FakeNode, kube: KubeClient, fake_api: FakeApiServer, tmp_path: Path, agents: list[Agent]
) -> None:
    agent = Agent(fake_api.write_kubeconfig(tmp_path / "kubeconfig"), tmp_path)
    agents.append(agent)
    wait_for(agent.healthy, timeout=60, what="the agent's /healthz answering 200")
    backup = fake_api.snapshot()
    # after the backup: a pod that takes the one exclusive CPU a 2-CPU node can give
    run_exclusive(node, "gone")
    wait_for(lambda: cpus_annotation(kube, "gone"), timeout=30, what="a pin before the restore")
    # a few more versions the agent's pod watch sees, so that what the restored server hands
    # out next lies well behind them however many writes the agent makes meanwhile
    for i in range(20):
        held = kube.patch(PODS, "gone", {"metadata": {"labels": {"bump": str(i)}}}, "default")
    held_rv = int(held["metadata"]["resourceVersion"])
    wait_for(
        lambda: kube.get(PODS, "gone", "default")["metadata"]["labels"].get("bump") == "19",
        what="the last bump stored",
    )
    time.sleep(1.0)  # the watch delivers the bumps (a test of relisting, not of the watch)
    restored = fake_api.restore(backup)
    assert restored < held_rv
    run_exclusive(node, "after")
    assert int(kube.get(PODS, "after", "default")["metadata"]["resourceVersion"]) < held_rv
    wait_for(
        lambda: cpus_annotation(kube, "after"),
        timeout=8 * IDLE,
        what="a pod created after the restore pinned",
    )
    # the pod the restore took away released its CPU (else "after" could not have had one)
    free_cpus = len(os.sched_getaffinity(0)) - 1

    def released() -> bool:
        status = kube.get(NCPT, NODE).get("status") or {}
        return len(CPUSet.parse(status.get("free", ""))) == free_cpus

    wait_for(released, timeout=8 * IDLE, what="the CPUs of the vanished pods released")
