"""`corepin agent` as a real process: it starts against the API, publishes its node, pins a pod,
stops on SIGTERM within 5 s, and exits 4 with one line when the API is unreachable."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from corepin.cli.agent_cmd import add_arguments, settings_from
from corepin.core.cpuset import CPUSet
from corepin.enforcement.faketree import make_fake_v1
from corepin.kube.client import KubeClient
from corepin.kube.resources import NCPT, NODES, PODS
from support.helpers import corepin_argv, reap, run_corepin, wait_for
from support.kube_helpers import install_crds


def agent_argv(kubeconfig: Path, tmp: Path, *extra: str) -> list[str]:
    return corepin_argv(
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
        "127.0.0.1:19464",
        "--assignment-dir",
        str(tmp / "assignments"),
        *extra,
    )


def prepare(kube: KubeClient, tmp: Path) -> None:
    online = CPUSet(os.sched_getaffinity(0))
    make_fake_v1(tmp / "cgroup", cpus=online, mems=CPUSet.of(0), separate_cpu_mount=False)
    install_crds(kube)
    kube.create(NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}})


def test_the_agent_publishes_its_node_and_stops_on_sigterm_within_5_s(
    kube: KubeClient, fake_kubeconfig: Path, tmp_path: Path
) -> None:
    prepare(kube, tmp_path)
    env = {**os.environ, "NODE_NAME": "n1"}
    proc = subprocess.Popen(
        agent_argv(fake_kubeconfig, tmp_path),
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:

        def published() -> Any:
            try:
                return "status" in kube.get(NCPT, "n1")
            except Exception:
                return False

        wait_for(published, timeout=30, what="the NodeCPUTopology of n1")
        topo = kube.get(NCPT, "n1")
        assert topo["status"]["conditions"][0]["type"] == "Ready"
        assert CPUSet.parse(topo["status"]["free"]) == CPUSet(os.sched_getaffinity(0))
        # the node gRPC API on its unix socket (mode 0600) and the metrics endpoint
        from corepin.api.grpc.client import AgentClient

        sock = tmp_path / "corepin.sock"
        wait_for(sock.exists, what="the gRPC socket")
        assert sock.stat().st_mode & 0o777 == 0o600
        with AgentClient(f"unix:{sock}") as client:
            name, served = client.topology()
            assert name == "n1" and served.online_cpus == CPUSet(os.sched_getaffinity(0))
            assert client.health() == "SERVING"
        body = urllib.request.urlopen("http://127.0.0.1:19464/metrics", timeout=5).read().decode()
        assert "corepin_shared_pool_cpus" in body and "corepin_watch_restarts_total" in body
        with urllib.request.urlopen("http://127.0.0.1:19464/healthz", timeout=5) as ready:
            assert ready.status == 200
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=10)
        assert time.monotonic() - started < 5.0, "stopped within 5 s"
        assert code == 0, proc.stderr.read() if proc.stderr else ""
    finally:
        reap(proc)
    assert kube.list(PODS)["items"] == []


def test_an_unreachable_api_exits_4_with_one_line(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:9"}}],
                "users": [{"name": "u", "user": {}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    online = CPUSet(os.sched_getaffinity(0))
    make_fake_v1(tmp_path / "cgroup", cpus=online, mems=CPUSet.of(0), separate_cpu_mount=False)
    out = run_corepin(*agent_argv(kubeconfig, tmp_path, "--node-name", "n1")[3:], timeout=60)
    assert out.returncode == 4, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "127.0.0.1:9" in out.stderr


def test_a_missing_node_name_is_refused_with_exit_2(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "NODE_NAME"}
    out = subprocess.run(
        corepin_argv("agent", "--kubeconfig", str(tmp_path / "k")),
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and "NODE_NAME" in out.stderr


def test_a_bad_qos_policy_file_or_period_is_refused_with_exit_2(tmp_path: Path) -> None:
    online = CPUSet(os.sched_getaffinity(0))
    make_fake_v1(tmp_path / "cgroup", cpus=online, mems=CPUSet.of(0), separate_cpu_mount=False)
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:9"}}],
                "users": [{"name": "u", "user": {}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    policy = tmp_path / "qos.yaml"
    policy.write_text("cpuBurst: {policy: turbo}\n")
    argv = agent_argv(kubeconfig, tmp_path, "--node-name", "n1")[3:]
    out = run_corepin(*argv, "--qos-config", str(policy), timeout=60)
    assert out.returncode == 2, out.stderr
    assert "cpuBurst.policy" in out.stderr and "turbo" in out.stderr
    out = run_corepin(*argv, "--qos-period", "-1", timeout=60)
    assert out.returncode == 2 and "--qos-period" in out.stderr


def test_the_agents_qos_settings_come_from_its_flags_and_namespace() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser, "agent")
    args = parser.parse_args(["--node-name", "n1", "--qos-config", "/etc/q.yaml"])
    settings = settings_from(args, {"POD_NAMESPACE": "corepin-system"})
    assert (settings.qos_config, settings.resctrl_root, settings.qos_period) == (
        "/etc/q.yaml",
        "/sys/fs/resctrl",
        1.0,
    )
    assert settings.namespace == "corepin-system"
    args = parser.parse_args(["--node-name", "n1", "--qos-period", "0", "--resctrl-root", "/r"])
    settings = settings_from(args, {})
    assert (settings.qos_config, settings.resctrl_root, settings.qos_period) == (None, "/r", 0.0)
    assert settings.namespace == ""
