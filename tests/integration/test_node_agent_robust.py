"""The node agent attacked: real `corepin agent` processes (and in-process agents where a test
reads the agent's own tables) against the fake API server, acting as the kubelet on a synthetic
32-CPU machine (its sysfs tree written out) with a cgroup v1 tree laid out like the host's
/sys/fs/cgroup, and on the real cgroup v1 hierarchy reached through a scratch bind mount.

- the CFS quota contract under the DaemonSet's `--cgroup-root=/host/sys/fs/cgroup`;
- one bad pod (an absurd CPU limit, a 250-character name) never stops the others;
- no leak: per-pod tables, assignment files and agent bindings go with their pods;
- a per-node lock, a forged NodeCPUTopology spec repaired, a Warning for an annotation naming
  no container.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import json
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from corepin.core.cpuset import CPUSet
from corepin.enforcement.cgroups import CgroupV1, CpuQuota
from corepin.enforcement.layout import container_cgroup_path, pod_cgroup_path
from corepin.kube.client import KubeClient
from corepin.kube.resources import EVENTS, NCPT, PCB, PODS
from corepin.testing import machines as synthetic
from corepin.testing.sysfs_tree import write_sysfs_tree
from support.helpers import corepin_argv, wait_for
from support.node_harness import NODE, FakeNode, fake_node
from support.paths import REPO
from support.pods import EXCLUSIVE, container, running_container

TOPO = synthetic.named("dual_socket_ht")  # 32 CPUs


# ---------------------------------------------------------------------- harness


class AgentProcess:
    """`corepin agent` as a child process for the fake node; its log in a file."""

    def __init__(self, node: FakeNode, kubeconfig: Path, cgroup_root: Path, tag: str) -> None:
        self.log = node.tmp / f"agent-{tag}.log"
        sysfs = node.tmp / "sysfs"
        if not sysfs.exists():
            write_sysfs_tree(node.topology, sysfs)
        self.argv = corepin_argv(
            "agent",
            "--kubeconfig",
            str(kubeconfig),
            "--node-name",
            node.name,
            "--sysfs-root",
            str(sysfs),
            "--cgroup-root",
            str(cgroup_root),
            "--state-dir",
            str(node.state_dir),
            "--kubelet-state",
            str(node.tmp / "no-kubelet-state"),
            "--grpc-socket",
            str(node.tmp / f"corepin-{tag}.sock"),
            "--metrics-address",
            "127.0.0.1:0",
            "--assignment-dir",
            str(node.tmp / "assignments"),
            "--resync-period",
            "1",
        )
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, *extra: str) -> AgentProcess:
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen([*self.argv, *extra], stdout=out, stderr=out)
        return self

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=15)


@pytest.fixture
def node(kube: KubeClient, fake_api: Any, tmp_path: Path) -> Iterator[FakeNode]:
    with fake_node(kube, TOPO, tmp_path) as n:
        n.api = fake_api
        yield n


@pytest.fixture
def agents(node: FakeNode, fake_kubeconfig: Path) -> Iterator[list[AgentProcess]]:
    started: list[AgentProcess] = []
    yield started
    for agent in started:
        agent.stop()


def host_layout(node: FakeNode) -> Path:
    """The fake tree as a DaemonSet sees the host's /sys/fs/cgroup: `cpuset/`, the combined
    `cpu,cpuacct/` with `cpu` and `cpuacct` symlinks to it, reached through another path
    (`<tmp>/host/sys/fs/cgroup`, a symlink to the tree)."""
    base = node.tmp / "cgroup"
    for name in ("cpu", "cpuacct"):
        (base / name).symlink_to("cpu,cpuacct")
    host = node.tmp / "host" / "sys" / "fs"
    host.mkdir(parents=True)
    (host / "cgroup").symlink_to(base)
    return host / "cgroup"


def spawn(
    agents: list[AgentProcess], node: FakeNode, kubeconfig: Path, root: Path | None = None
) -> AgentProcess:
    agent = AgentProcess(node, kubeconfig, root or node.tmp / "cgroup", str(len(agents)))
    agents.append(agent)
    return agent.start()


def ncpt(node: FakeNode) -> dict[str, Any] | None:
    with contextlib.suppress(Exception):
        return node.client.get(NCPT, node.name)
    return None


def events(node: FakeNode, pod: dict[str, Any], reason: str) -> list[dict[str, Any]]:
    items = node.client.list(EVENTS, pod["metadata"]["namespace"])["items"]
    return [
        e
        for e in items
        if e["reason"] == reason and e["involvedObject"].get("name") == pod["metadata"]["name"]
    ]


def cpus_or_none(node: FakeNode, pod: dict[str, Any], name: str = "app") -> CPUSet | None:
    with contextlib.suppress(Exception):
        return node.cpus(pod, name)
    return None


def set_kubelet_quota(node: FakeNode, pod: dict[str, Any], cpus: int) -> None:
    """What the kubelet writes for a pod with a CPU limit: limit x period on the pod and its
    container cgroup (the pod's first: v1 keeps a child's ratio within its parent's)."""
    pod = node.get(pod)
    quota = CpuQuota(cpus * 100_000, 100_000)
    uid = pod["metadata"]["uid"]
    node.driver.write_quota(pod_cgroup_path("cgroupfs", node.qos(pod), uid), quota)
    node.driver.write_quota(node.container_path(pod, node.cid(pod, "app")), quota)


# ---------------------------------------------------------------------- 8: quota contract


def test_quota_is_removed_under_the_daemonsets_cgroup_root(
    node: FakeNode, agents: list[AgentProcess], fake_kubeconfig: Path
) -> None:
    """deploy/agent passes --cgroup-root=/host/sys/fs/cgroup: the cpu controller is found
    there (the combined cpu,cpuacct hierarchy behind a `cpu` symlink), the exclusive
    container's quota goes, and the log never says the cpu controller is missing."""
    daemonset = yaml.safe_load((REPO / "deploy" / "agent" / "daemonset.yaml").read_text())
    args = daemonset["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--cgroup-root=/host/sys/fs/cgroup" in args
    pod = node.pod("db", container("app", "2", memory="64Mi"), annotations=EXCLUSIVE)
    node.run(pod)
    set_kubelet_quota(node, pod, 2)
    agent = spawn(agents, node, fake_kubeconfig, host_layout(node))
    wait_for(lambda: node.annotation(pod) is not None, timeout=30, what="db pinned")
    wait_for(lambda: node.quota(pod, "app") is None, timeout=15, what="the quota removed")
    wait_for(lambda: node.quota(pod) is None, timeout=15, what="the pod's quota removed")
    assert len(node.cpus(pod, "app")) == 2
    assert "no cpu controller" not in agent.text()


def _real_v1() -> tuple[str, str] | None:
    cpuset, cpu = "/sys/fs/cgroup/cpuset", "/sys/fs/cgroup/cpu"
    if os.geteuid() != 0 or not all(
        os.path.isfile(os.path.join(d, f))
        for d, f in ((cpuset, "cpuset.cpus"), (cpu, "cpu.cfs_quota_us"))
    ):
        return None
    return cpuset, cpu


@pytest.fixture
def bind_mount(tmp_path: Path) -> Iterator[Path]:
    """The host's /sys/fs/cgroup bind-mounted (recursively, as a hostPath volume is) at a
    scratch path, unmounted afterwards."""
    if _real_v1() is None:
        pytest.skip("needs root and the cgroup v1 cpuset and cpu hierarchies")
    target = tmp_path / "host-cgroup"
    target.mkdir()
    done = subprocess.run(
        ["mount", "--rbind", "/sys/fs/cgroup", str(target)], capture_output=True, check=False
    )
    if done.returncode != 0:
        pytest.skip(f"cannot bind-mount /sys/fs/cgroup: {done.stderr.decode().strip()}")
    try:
        yield target
    finally:
        subprocess.run(["umount", "-R", str(target)], check=True)


@pytest.mark.realhost
def test_quota_is_removed_on_the_real_hierarchy_through_a_bind_mount(
    bind_mount: Path, kube: KubeClient, fake_api: Any, fake_kubeconfig: Path, tmp_path: Path
) -> None:
    """The real cgroup v1 hierarchy reached through another path: the exclusive container's
    cpu.cfs_quota_us (100000, as the kubelet set it) becomes -1 in the real cpu hierarchy."""
    roots = _real_v1()
    assert roots is not None
    online = CPUSet(os.sched_getaffinity(0))
    if len(online) < 2:
        pytest.skip("needs 2 CPUs")
    real = CgroupV1(*roots)
    scratch = f"corepin-test-agent-{uuid.uuid4().hex[:8]}"
    made: list[str] = []
    with fake_node(kube, TOPO, tmp_path) as n:  # (API objects only: its fake tree is unused)
        try:
            pod = n.pod("db", container("app", "1", memory="64Mi"), annotations=EXCLUSIVE)
            uid, cid = pod["metadata"]["uid"], "f" * 64
            pod_path = pod_cgroup_path("cgroupfs", "guaranteed", uid, cgroup_root=scratch)
            path = container_cgroup_path(
                "cgroupfs", "guaranteed", uid, "containerd", cid, cgroup_root=scratch
            )
            made = real.create(path)
            real.write_quota(pod_path, CpuQuota(100_000, 100_000))
            real.write_quota(path, CpuQuota(100_000, 100_000))
            status = {
                "phase": "Running",
                "qosClass": "Guaranteed",
                "containerStatuses": [running_container("app", cid)],
            }
            kube.patch_status(PODS, "db", {"status": status}, "default")
            log = tmp_path / "agent.log"
            argv = corepin_argv(
                "agent",
                "--kubeconfig",
                str(fake_kubeconfig),
                "--node-name",
                n.name,
                "--cgroup-root",
                str(bind_mount),
                "--kubelet-cgroup-root",
                f"/{scratch}",
                "--state-dir",
                str(tmp_path / "real-state"),
                "--kubelet-state",
                str(tmp_path / "none"),
                "--grpc-socket",
                str(tmp_path / "real.sock"),
                "--metrics-address",
                "127.0.0.1:0",
                "--assignment-dir",
                str(tmp_path / "real-assignments"),
                "--resync-period",
                "1",
            )
            with open(log, "ab") as out:
                proc = subprocess.Popen(argv, stdout=out, stderr=out)
            try:
                wait_for(
                    lambda: real.read_quota(path).quota_us is None,
                    timeout=40,
                    what="the real container's quota removed",
                )
                assert real.read_quota(pod_path).quota_us is None
                assert len(real.read_cpus(path)) == 1
            finally:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=15)
            assert "no cpu controller" not in log.read_text(errors="replace")
        finally:
            for group in reversed(made):
                real.remove(group)
            with contextlib.suppress(Exception):
                real.remove(scratch)


# ---------------------------------------------------------------------- 9: one bad pod


def test_a_pod_with_an_absurd_cpu_limit_stops_nobody(
    node: FakeNode, agents: list[AgentProcess], fake_kubeconfig: Path
) -> None:
    """A CPU limit of the JSON number 1e308 gets a Warning naming it; the three pods synced in
    the same batch are pinned to what the published topology says they hold."""
    bad = container("app", "1", memory="64Mi")
    bad["resources"] = {"limits": {"cpu": 1e308}, "requests": {"cpu": 1e308}}
    absurd = node.pod("absurd", bad, annotations=EXCLUSIVE)
    good = [
        node.pod(f"good-{i}", container("app", str(n), memory="64Mi"), annotations=EXCLUSIVE)
        for i, n in enumerate((3, 19, 4))
    ]
    for p in (absurd, *good):
        node.run(p)  # all running before the agent starts: one batch
    spawn(agents, node, fake_kubeconfig)
    for p, n in zip(good, (3, 19, 4), strict=True):
        wait_for(
            lambda p=p, n=n: len(cpus_or_none(node, p) or ()) == n,  # type: ignore[misc]
            timeout=30,
            what=f"{p['metadata']['name']} on {n} CPUs",
        )
    wait_for(lambda: events(node, absurd, "CPUPolicyIgnored"), timeout=15, what="the Warning")
    [warning] = events(node, absurd, "CPUPolicyIgnored")
    assert "1e+308" in warning["message"] and "out of range" in warning["message"]
    wait_for(
        lambda: (
            node.cpus(absurd, "app")
            == TOPO.online_cpus - CPUSet().union(*(node.cpus(p, "app") for p in good))
        ),
        timeout=15,
        what="the absurd pod on the shared pool",
    )

    def published() -> dict[str, CPUSet]:
        status = (ncpt(node) or {}).get("status") or {}
        return {a["pod"]: CPUSet.parse(a["cpus"]) for a in status.get("allocations", [])}

    wait_for(
        lambda: published() == {p["metadata"]["name"]: node.cpus(p, "app") for p in good},
        timeout=30,
        what="the published allocations agree with the cgroups",
    )


def documented_file_name(namespace: str, pod: str, container_name: str) -> str:
    """The assignment file name as README/deploy docs describe it (written out again here)."""
    name = f"{namespace}.{pod}.{container_name}"
    if len(name) <= 255:
        return name
    return f"{name[:200]}_{hashlib.sha256(name.encode()).hexdigest()[:40]}"


def test_a_250_character_pod_name_gets_a_hashed_file_and_stops_nobody(
    node: FakeNode, agents: list[AgentProcess], fake_kubeconfig: Path
) -> None:
    """The long name's file is the documented hashed name; the shared-pool refresh goes on to
    the pods after it (their COREPIN_CPUS_SHARED follows the pool)."""
    long_name = "l" + "o" * 248 + "g"
    shared = [
        node.pod(n, container("app", "500m", memory="64Mi"))
        for n in (long_name, "m-later", "z-later")
    ]
    for p in shared:
        node.run(p)
    spawn(agents, node, fake_kubeconfig)
    files = node.tmp / "assignments"
    names = [documented_file_name("default", p["metadata"]["name"], "app") for p in shared]
    wait_for(lambda: all((files / n).exists() for n in names), timeout=30, what="three files")
    db = node.pod("db", container("app", "4", memory="64Mi"), annotations=EXCLUSIVE)
    node.run(db)
    wait_for(lambda: node.annotation(db) is not None, timeout=30, what="db pinned")
    pool = TOPO.online_cpus - node.cpus(db, "app")

    def refreshed() -> bool:
        return all(
            f"COREPIN_CPUS_SHARED={pool}" in (files / n).read_text().splitlines() for n in names
        )

    wait_for(refreshed, timeout=15, what="every shared file refreshed")
    assert len(names[0]) == 241 and names[0].endswith(
        hashlib.sha256(f"default.{long_name}.app".encode()).hexdigest()[:40]
    )
    assert node.cpus(shared[0], "app") == pool


# ---------------------------------------------------------------------- 10: leaks


def per_pod_tables(agent: Any) -> dict[str, int]:
    """Sizes of every table the agent (and its cgroup driver) keeps in an attribute."""
    out = {}
    for owner, prefix in (
        (agent, ""),
        (agent.cgroups, "cgroups."),
        (agent.cgroups.driver, "driver."),
    ):
        for key, value in vars(owner).items():
            if isinstance(value, dict | set | list):
                out[prefix + key] = len(value)
    return out


def test_200_create_delete_cycles_leave_no_table_file_or_binding_behind(node: FakeNode) -> None:
    """After 200 pods came and went (exclusive, shared, failed pins, never-started), the agent's
    tables are as big as with the 5 pods still there, and there are 5 pods' files."""
    agent = node.agent()
    live = [
        node.pod(f"live-{i}", container("app", "1", memory="64Mi"), annotations=EXCLUSIVE)
        for i in range(5)
    ]
    for p in live:
        node.run(p)
    wait_for(lambda: all(node.annotation(p) for p in live), what="5 live pods")
    for a in node.agents:
        assert a.wait_idle(20)

    def cycle(i: int) -> None:
        kind = i % 4
        if kind == 0:
            p = node.pod(f"c{i}", container("app", "2", memory="64Mi"), annotations=EXCLUSIVE)
        elif kind == 1:
            p = node.pod(f"c{i}", container("app", "1", memory="64Mi"))
        elif kind == 2:  # more than the node has: a failed pin
            p = node.pod(f"c{i}", container("app", "40", memory="64Mi"), annotations=EXCLUSIVE)
        else:  # never started
            p = node.pod(f"c{i}", container("app", "1", memory="64Mi"), annotations=EXCLUSIVE)
        if kind != 3:
            node.run(p)
        assert agent.wait_idle(20)
        node.delete(p)
        assert agent.wait_idle(20)

    for i in range(8):  # warm-up: every code path once
        cycle(i)
    gc.collect()
    assert agent.wait_idle(20)  # (a heartbeat may have queued meanwhile: measured at rest)
    before = per_pod_tables(agent)
    for i in range(8, 208):
        cycle(i)
    gc.collect()
    assert agent.wait_idle(20)
    after = per_pod_tables(agent)
    grown = {k: (before.get(k, 0), v) for k, v in after.items() if v > before.get(k, 0)}
    assert not grown, f"tables grew over 200 pods: {grown}"
    files = sorted(os.listdir(node.tmp / "assignments"))
    assert files == sorted(f"default.live-{i}.app" for i in range(5))
    agent_bindings = node.client.list(PCB)["items"]
    assert sorted(b["spec"]["podName"] for b in agent_bindings) == [f"live-{i}" for i in range(5)]


def test_stale_files_are_removed_at_start_up_and_a_reused_name_never_reads_old_cpus(
    node: FakeNode, agents: list[AgentProcess], fake_kubeconfig: Path
) -> None:
    first = spawn(agents, node, fake_kubeconfig)
    web = node.pod("web-0", container("app", "2", memory="64Mi"), annotations=EXCLUSIVE)
    gone = node.pod("gone", container("app", "1", memory="64Mi"), annotations=EXCLUSIVE)
    for p in (web, gone):
        node.run(p)
    files = node.tmp / "assignments"
    wait_for(
        lambda: (files / "default.web-0.app").exists() and (files / "default.gone.app").exists(),
        timeout=30,
        what="two files",
    )
    first.stop(signal.SIGKILL)
    node.delete(web)
    node.delete(gone)
    (files / "default.left-over.app").write_text("COREPIN_CPUS=0-3\nCOREPIN_POD_UID=x\n")
    web = node.pod(
        "web-0", container("app", "2", memory="64Mi"), annotations=EXCLUSIVE
    )  # not started yet
    spawn(agents, node, fake_kubeconfig)
    wait_for(lambda: not os.listdir(files), timeout=30, what="every stale file removed")
    node.run(web)
    wait_for(lambda: (files / "default.web-0.app").exists(), timeout=30, what="web-0's new file")
    text = (files / "default.web-0.app").read_text()
    assert f"COREPIN_POD_UID={web['metadata']['uid']}" in text
    assert f"COREPIN_CPUS={node.cpus(web, 'app')}" in text


def test_an_agent_binding_of_a_gone_pod_is_deleted_and_never_written(
    node: FakeNode, agents: list[AgentProcess], fake_kubeconfig: Path
) -> None:
    """A binding the agent wrote for a pod that is gone (its CPUs handed out since) is deleted
    at start-up; a pod deleted while the agent is still telling the API about it leaves no
    binding behind."""
    first = spawn(agents, node, fake_kubeconfig)
    db = node.pod("db", container("app", "2", memory="64Mi"), annotations=EXCLUSIVE)
    node.run(db)
    wait_for(lambda: node.annotation(db) is not None, timeout=30, what="db pinned")
    first.stop()
    ghost = str(uuid.uuid4())
    body = {
        "apiVersion": "corepin.io/v1alpha1",
        "kind": "PodCPUBinding",
        "metadata": {
            "name": "ghost-app",
            "namespace": "default",
            "labels": {
                "app.kubernetes.io/managed-by": "corepin-agent",
                "corepin.io/node": NODE,
                "corepin.io/pod-uid": ghost,
                "corepin.io/container": "app",
            },
            "annotations": {"corepin.io/cpu-policy": "exclusive"},
        },
        "spec": {"podName": "ghost", "exclusivenessLevel": "CPU"},
    }
    node.client.create(PCB, body, "default")
    node.client.patch_status(
        PCB,
        "ghost-app",
        {"status": {"phase": "Applied", "cpus": str(node.cpus(db, "app"))}},
        "default",
    )
    spawn(agents, node, fake_kubeconfig)

    def names() -> set[str]:
        return {b["metadata"]["name"] for b in node.client.list(PCB)["items"]}

    wait_for(lambda: names() == {"db-app"}, timeout=30, what="the ghost's binding deleted")
    # the race: the pod goes while the publisher is still annotating it (a slow API)
    node.api.inject(r"/pods/late$", method="PATCH", status=None, delay=2.0, times=1)
    late = node.pod("late", container("app", "1", memory="64Mi"), annotations=EXCLUSIVE)
    node.run(late)
    time.sleep(0.7)  # pinned; the publisher waits on the slow annotation patch
    node.delete(late)
    time.sleep(3.5)  # the patch answered, the rest of the publishing done, resyncs passed
    assert names() == {"db-app"}


# ---------------------------------------------------------------------- 12: smaller


def test_a_second_agent_of_the_node_waits_for_the_first_and_takes_over(
    node: FakeNode, agents: list[AgentProcess], fake_kubeconfig: Path
) -> None:
    first = spawn(agents, node, fake_kubeconfig)
    db = node.pod("db", container("app", "2", memory="64Mi"), annotations=EXCLUSIVE)
    node.run(db)
    wait_for(lambda: node.annotation(db) is not None, timeout=30, what="db pinned")
    mine = node.cpus(db, "app")
    assert first.proc is not None
    first.proc.send_signal(signal.SIGSTOP)  # alive, holding the lock, doing nothing
    try:
        path = node.container_path(node.get(db), node.cid(db, "app"))
        node.driver.write_cpus(path, TOPO.online_cpus)  # drift only a syncing agent repairs
        second = spawn(agents, node, fake_kubeconfig)
        wait_for(lambda: "node_lock_busy" in second.text(), timeout=30, what="the wait")
        time.sleep(3)  # (three resync periods of a second agent that would sync)
        assert node.cpus(db, "app") == TOPO.online_cpus, "the waiting agent wrote a cgroup"
    finally:
        first.proc.send_signal(signal.SIGKILL)
        first.proc.send_signal(signal.SIGCONT)
        first.proc.wait(timeout=10)
    wait_for(lambda: node.cpus(db, "app") == mine, timeout=30, what="the second takes over")


def test_a_forged_topology_spec_is_rewritten(node: FakeNode) -> None:
    agent = node.agent(heartbeat_period=0.3)
    wait_for(lambda: (ncpt(node) or {}).get("status"), what="the NodeCPUTopology")
    good = ncpt(node)
    assert good is not None
    forged = [
        {"op": "replace", "path": "/spec/reservedCPUs", "value": "0-7"},
        {"op": "add", "path": "/spec/options/forged", "value": "yes"},
        {"op": "replace", "path": "/spec/policy", "value": "forged"},
    ]
    node.client.patch(NCPT, node.name, forged, patch_type="json")
    wait_for(
        lambda: (ncpt(node) or {}).get("spec") == good["spec"], timeout=15, what="spec repaired"
    )
    assert agent.errors == 0


def test_an_annotation_naming_no_container_gets_a_warning(node: FakeNode) -> None:
    node.agent()
    pod = node.pod(
        "typo",
        container("app", "1", memory="64Mi"),
        annotations={"corepin.io/cpu-policy.ap": "exclusive"},
    )
    node.run(pod)
    wait_for(lambda: events(node, pod, "CPUPolicyIgnored"), what="the Warning")
    [event] = events(node, pod, "CPUPolicyIgnored")
    assert event["type"] == "Warning"
    assert "corepin.io/cpu-policy.ap" in event["message"]
    assert "its containers: app" in event["message"]
    assert json.loads(node.annotation(pod) or "null") is None, "nothing pinned for the typo"
