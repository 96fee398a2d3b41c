"""A development stand-in cluster on this one machine: `corepin dev cluster`, or
`python -m corepin.testing.cluster`. It is a stand-in, not Kubernetes, and says so wherever it
prints.

It starts the fake API server (`corepin.testing.fakeapi`, plain http on loopback) with
corepin's CRDs and two Nodes whose machines are synthetic two-socket topologies on this host's
CPUs (`cluster_parts`), a stand-in kubelet that runs one real `sleep` per container of every
pod bound to those nodes in real scratch cgroups (`cluster_kubelet`), and, as processes of their
own, the real `corepin agent` of each node (its own state directory, `--node-name`,
`--sysfs-root`), `corepin controller`, `corepin scheduler` and `corepin webhook` (HTTPS with a
self-signed certificate; the fake API server does not call admission webhooks, so it serves but
nothing asks it). It writes a kubeconfig, applies the sample pods, waits until corepin pinned
them and shows where they landed, prints the kubectl commands to try, and runs until SIGINT or
SIGTERM (`once`: stops right away), when it stops every process it started and removes every
scratch cgroup and temporary directory. Needs root (cgroups): EnvironmentProblem otherwise.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from corepin.cli.main import main as cli_main
from corepin.core.errors import CorepinError, EnvironmentProblem
from corepin.kube.client import KubeClient
from corepin.kube.config import load_config
from corepin.kube.resources import CRDS, NCPT, NODES, PODS
from corepin.testing import fakeapi
from corepin.testing.cluster_kubelet import Cgroups, StandInKubelet, cgroup_version
from corepin.testing.cluster_parts import (
    crds,
    fitted_machine,
    host_cpus_and_mems,
    rows,
    sample_pods,
    settled,
    table,
)
from corepin.testing.fakeapi import FakeApiServer
from corepin.testing.sysfs_tree import write_sysfs_tree

BANNER = "corepin stand-in cluster (a development stand-in on this machine, not Kubernetes)"
PREFIX = "[stand-in] "
READY = "stand-in cluster ready"
NODE_NAMES = ("standin-node-a", "standin-node-b")
HEADER = ("POD", "NODE", "POLICY", "CPUS", "KERNEL ALLOWS", "MEMS")


@dataclass(frozen=True)
class Options:
    once: bool = False
    nodes: int = 2
    timeout: float = 180.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Stopped(Exception):
    """SIGINT or SIGTERM came while the stand-in cluster was starting."""


def _wait(check: Callable[[], Any], seconds: float, what: str, stop: threading.Event) -> Any:
    deadline = time.monotonic() + seconds
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise EnvironmentProblem(f"the stand-in cluster timed out waiting for {what}")
        if stop.wait(0.25):
            raise _Stopped


class StandInCluster:
    """Everything the stand-in cluster starts, and the one place that stops it."""

    def __init__(self, options: Options, out: TextIO, stopping: threading.Event) -> None:
        self.options = options
        self.stopping = stopping
        self.out = out
        self.tmp = Path(tempfile.mkdtemp(prefix="corepin-standin-"))
        self.tag = secrets.token_hex(3)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.api: FakeApiServer | None = None
        self.kube: KubeClient | None = None
        self.kubelet: StandInKubelet | None = None
        self.kubeconfig = self.tmp / "kubeconfig"
        self.nodes = NODE_NAMES[: max(1, min(options.nodes, len(NODE_NAMES)))]

    def say(self, line: str) -> None:
        print(PREFIX + line, file=self.out, flush=True)

    # ------------------------------------------------------------------ start
    def start(self) -> None:
        self.say(BANNER)
        version = cgroup_version()
        cgroups = Cgroups(version)
        self.api = FakeApiServer(bookmark_interval=1.0)
        self.api.start()
        self.api.write_kubeconfig(self.kubeconfig)
        self.say(f"fake API server (stand-in) at {self.api.url}; kubeconfig {self.kubeconfig}")
        self.kube = KubeClient.from_config(load_config(self.kubeconfig, env={}), timeout=30)
        for crd in crds():
            self.kube.create(CRDS, crd)
        self.say("corepin's CRDs installed (deploy/crd)")
        cpus, mems = host_cpus_and_mems(version)
        roots = {}
        for node in self.nodes:
            machine = fitted_machine(cpus, mems, name=f"{node} (synthetic)")
            write_sysfs_tree(machine, self.tmp / node / "sysfs")
            self.kube.create(NODES, _node_object(node, len(machine.online_cpus)))
            roots[node] = f"corepin-standin-{self.tag}-{node}"
            sockets = len({c.socket for c in machine.cpus})
            self.say(
                f"node {node}: synthetic {sockets}-socket machine on CPUs {machine.online_cpus}, "
                f"kubelet cgroup root /{roots[node]} (cgroup v{version})"
            )
        self.kubelet = StandInKubelet(self.kube, roots, cgroups, say=self.say)
        self.kubelet.start()
        self.say("stand-in kubelet started (one real `sleep` per container)")
        for node in self.nodes:
            self._spawn(f"agent {node}", _agent_argv(node, roots[node], self.tmp, self.kubeconfig))
        self._spawn("controller", self._corepin("controller", "--lease-namespace", "default"))
        self._spawn("scheduler", self._corepin("scheduler"))
        self._start_webhook()
        _wait(self._published, self.options.timeout, "the agents' NodeCPUTopologies", self.stopping)
        self.say("agents published their NodeCPUTopologies")

    def _corepin(self, command: str, *extra: str) -> list[str]:
        return [
            sys.executable,
            "-m",
            "corepin",
            command,
            "--kubeconfig",
            str(self.kubeconfig),
            "--metrics-address",
            f"127.0.0.1:{_free_port()}",
            *extra,
        ]

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = (self.tmp / f"{name.replace(' ', '-')}.log").open("wb")
        with log:
            self.procs[name] = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.say(f"started corepin {name} (pid {self.procs[name].pid})")

    def _start_webhook(self) -> None:
        try:
            make_tls = fakeapi.make_tls  # imported on first use: needs `cryptography`
        except ImportError:
            self.say("webhook not started: it needs the `cryptography` package (pip install)")
            return
        tls = make_tls(self.tmp / "tls")
        port = _free_port()
        argv = [
            sys.executable,
            "-m",
            "corepin",
            "webhook",
            "--address",
            f"127.0.0.1:{port}",
            "--tls-cert",
            str(tls.server.cert),
            "--tls-key",
            str(tls.server.key),
        ]
        self._spawn("webhook", argv)
        self.say(
            f"webhook serves https://127.0.0.1:{port} (the stand-in API server does not call "
            "admission webhooks: nothing sends it pods)"
        )

    def _published(self) -> bool:
        self._check_processes()
        assert self.kube is not None
        have = {n["metadata"]["name"] for n in self.kube.list(NCPT)["items"]}
        return set(self.nodes) <= have

    def _check_processes(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                log = self.tmp / f"{name.replace(' ', '-')}.log"
                tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
                raise EnvironmentProblem(
                    f"corepin {name} exited {proc.returncode} in the stand-in cluster:\n{tail}"
                )

    # ------------------------------------------------------------------ the samples
    def apply_samples(self) -> list[tuple[str, ...]]:
        assert self.kube is not None and self.kubelet is not None
        for pod in sample_pods():
            self.kube.create(PODS, pod, pod["metadata"]["namespace"])
            self.say(f"applied pod {pod['metadata']['name']}")
        kube, kubelet = self.kube, self.kubelet

        def landed() -> list[tuple[str, ...]] | None:
            self._check_processes()
            pods = [
                p
                for p in kube.list(PODS, "default")["items"]
                if p["metadata"]["name"].startswith("demo-")
            ]
            got = rows(pods, kube.list(NCPT)["items"], kubelet.pid_of)
            last[:] = got
            return list(got) if settled(got) else None

        last: list[tuple[str, ...]] = []
        try:
            got: list[tuple[str, ...]] = _wait(
                landed, self.options.timeout, "the samples pinned", self.stopping
            )
        except EnvironmentProblem as exc:
            raise EnvironmentProblem(
                f"{exc}; where they were (two 1-CPU exclusive samples need nodes with a spare "
                f"CPU each: on a small machine use two nodes):\n{table(last, HEADER)}"
            ) from None
        self.say("the samples are pinned; where they landed (NodeCPUTopologies, /proc):")
        print(table(got, HEADER), file=self.out, flush=True)
        return got

    def hints(self) -> None:
        bindir = Path(sys.executable).parent
        lines = [
            f"export KUBECONFIG={self.kubeconfig}",
            "kubectl get ncpt",
            "kubectl get pcb -A",
            "kubectl get cpur",
            "kubectl describe pod demo-exclusive",
            f"PATH={bindir}:$PATH kubectl corepin report {self.nodes[0]}",
        ]
        self.say("try (against the stand-in API server):")
        for line in lines:
            print(f"    {line}", file=self.out, flush=True)

    # ------------------------------------------------------------------ stop
    def stop(self) -> list[str]:
        """Stop everything started; what could not be cleaned up (empty: nothing left)."""
        left: list[str] = []
        for proc in reversed(list(self.procs.values())):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for name, proc in self.procs.items():
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                left.append(f"corepin {name} needed SIGKILL")
        if self.kubelet is not None:
            self.kubelet.close()
            for root in self.kubelet.nodes.values():
                left += [f"cgroup {p}" for p in self.kubelet.cgroups.leftovers(root)]
        if self.kube is not None:
            self.kube.close()
        if self.api is not None:
            self.api.stop()
        shutil.rmtree(self.tmp, ignore_errors=True)
        return left


def _node_object(name: str, cpus: int) -> dict[str, Any]:
    resources = {"cpu": str(cpus), "memory": "8Gi", "pods": "110"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def _agent_argv(node: str, root: str, tmp: Path, kubeconfig: Path) -> list[str]:
    home = tmp / node
    return [
        sys.executable,
        "-m",
        "corepin",
        "agent",
        "--node-name",
        node,
        "--kubeconfig",
        str(kubeconfig),
        "--sysfs-root",
        str(home / "sysfs"),
        "--kubelet-cgroup-root",
        "/" + root,
        "--cgroup-driver",
        "cgroupfs",
        "--state-dir",
        str(home / "state"),
        "--kubelet-state",
        str(home / "no-kubelet-state"),
        "--grpc-socket",
        str(home / "agent.sock"),
        "--metrics-address",
        f"127.0.0.1:{_free_port()}",
        "--assignment-dir",
        str(home / "assignments"),
        "--pod-resources-socket",
        "",
        "--resctrl-root",
        str(home / "no-resctrl"),
        "--qos-period",
        "0",
        "--resync-period",
        "5",
    ]


@contextlib.contextmanager
def _stop_signals() -> Iterator[threading.Event]:
    """An event set by SIGINT or SIGTERM while the block runs (the old handlers after)."""
    event = threading.Event()
    old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    for s in old:
        signal.signal(s, lambda _n, _f: event.set())
    try:
        yield event
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


def run(options: Options, out: TextIO = sys.stdout) -> int:
    """Run the stand-in cluster (see the module docstring); 0 once it stopped cleanly."""
    if os.geteuid() != 0:
        raise EnvironmentProblem(
            "the stand-in cluster makes real cgroups and needs root (run it with sudo)"
        )
    with _stop_signals() as stopping:
        cluster = StandInCluster(options, out, stopping)
        failed: CorepinError | None = None
        try:
            cluster.start()
            if not stopping.is_set():
                cluster.apply_samples()
                cluster.hints()
                cluster.say(
                    f"{READY}: KUBECONFIG={cluster.kubeconfig}"
                    + ("" if options.once else " (Ctrl-C stops it and cleans up)")
                )
            if not options.once:
                while not stopping.wait(1.0):
                    cluster._check_processes()
        except _Stopped:
            pass
        except CorepinError as exc:
            failed = exc
        finally:
            cluster.say("stopping: corepin processes, sleeps, scratch cgroups, temp files")
            left = cluster.stop()
        for line in left:
            cluster.say(f"left behind: {line}")
        if failed is not None:
            raise failed
        cluster.say("stopped; nothing left behind" if not left else "stopped")
        return 1 if left else 0


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m corepin.testing.cluster ARGS`: the same as `corepin dev cluster ARGS`."""
    return cli_main(["dev", "cluster", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    raise SystemExit(main())
