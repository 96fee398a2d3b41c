"""The stand-in kubelet of the development stand-in cluster (`corepin.testing.cluster`): for
every pod bound to one of its nodes it makes the pod's and its containers' cgroups in the
kubelet's cgroupfs layout under a scratch kubelet cgroup root of that node, starts one real
process (`sleep`) per container inside its container cgroup, and reports the containers running
in the pod's status, as a kubelet would; a pod deleted from the API has its processes killed and
its cgroups removed. Pods that name no node and no scheduler of their own are bound to a node
in turn (the default scheduler's part).

Real cgroups: cgroup v1 (the cpuset, cpu and cpuacct hierarchies under /sys/fs/cgroup) or v2
(the unified hierarchy, when it offers the cpuset and cpu controllers). The scratch roots are
named `corepin-standin-<random>-<node>` and removed, with everything under them, by `close()`.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from corepin.core.errors import EnvironmentProblem
from corepin.enforcement.layout import container_cgroup_path, pod_cgroup_path
from corepin.kube.client import KubeClient
from corepin.kube.resources import PODS
from corepin.testing.fakeapi.quantity import QuantityError, qos_class

Obj = dict[str, Any]
CGROUP = Path("/sys/fs/cgroup")
V1_HIERARCHIES = ("cpuset", "cpu", "cpuacct")
STARTED_AT = "2026-01-01T00:00:00Z"


def cgroup_version(base: Path = CGROUP) -> int:
    """2 when the unified hierarchy at `base` offers cpuset and cpu, 1 when the v1 cpuset, cpu
    and cpuacct hierarchies are mounted there; EnvironmentProblem otherwise."""
    controllers = base / "cgroup.controllers"
    if controllers.exists() and {"cpuset", "cpu"} <= set(controllers.read_text().split()):
        return 2
    if all((base / h / "cgroup.procs").exists() for h in V1_HIERARCHIES):
        return 1
    raise EnvironmentProblem(
        f"no usable cgroups under {base}: neither cgroup v2 with the cpuset and cpu controllers "
        "nor the cgroup v1 cpuset, cpu and cpuacct hierarchies"
    )


@dataclass
class _Pod:
    uid: str
    groups: list[str] = field(default_factory=list)  # relative to a hierarchy, made in order
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)  # container -> sleep


class Cgroups:
    """Directories made (and removed) in every hierarchy the stand-in uses."""

    def __init__(self, version: int, base: Path = CGROUP) -> None:
        self.version = version
        self.base = base
        self.roots = [base] if version == 2 else [base / h for h in V1_HIERARCHIES]

    def make(self, rel: str) -> None:
        """Make `rel` (and the parents the stand-in owns) ready to hold processes."""
        for root in self.roots:
            path = root / rel
            path.mkdir(exist_ok=True)
            if self.version == 2:
                with contextlib.suppress(OSError):
                    (path / "cgroup.subtree_control").write_text("+cpuset +cpu")
            elif root.name == "cpuset":
                # a v1 cpuset takes tasks only once its CPUs and memory nodes are set
                for name in ("cpuset.cpus", "cpuset.mems"):
                    if not (path / name).read_text().strip():
                        (path / name).write_text((path.parent / name).read_text().strip())

    def enter(self, rel: str, pid: int) -> None:
        for root in self.roots:
            (root / rel / "cgroup.procs").write_text(str(pid))

    def remove(self, rel: str) -> None:
        """Remove `rel` in every hierarchy (retried while the kernel still counts tasks)."""
        for root in self.roots:
            path = root / rel
            for _ in range(50):
                try:
                    path.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)

    def remove_tree(self, rel: str) -> None:
        """Remove `rel` and every cgroup under it, deepest first."""
        for root in self.roots:
            top = root / rel
            if not top.exists():
                continue
            dirs = sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts))
            for d in [*dirs, top]:
                self.remove(str(d.relative_to(root)))

    def leftovers(self, rel: str) -> list[Path]:
        return [root / rel for root in self.roots if (root / rel).exists()]


class StandInKubelet:
    """The kubelets of `nodes` (node name -> kubelet cgroup root, relative, e.g.
    `corepin-standin-ab12-node-a`), polling the API server every `period` seconds."""

    def __init__(
        self,
        kube: KubeClient,
        nodes: dict[str, str],
        cgroups: Cgroups,
        *,
        period: float = 0.2,
        say: Callable[[str], None] = lambda _line: None,
    ) -> None:
        self.kube = kube
        self.nodes = nodes
        self.cgroups = cgroups
        self.period = period
        self.say = say
        self.pods: dict[str, _Pod] = {}  # uid -> what runs for it
        self.errors: list[str] = []
        self._turn = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="standin-kubelet", daemon=True)
        for root in nodes.values():
            for rel in (root, f"{root}/kubepods", *(f"{root}/kubepods/{q}" for q in QOS_DIRS)):
                self.cgroups.make(rel)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        """Stop, kill every process started, remove every cgroup made (the scratch roots too)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10)
        for uid in list(self.pods):
            self._stop_pod(uid)
        for root in self.nodes.values():
            self.cgroups.remove_tree(root)

    def pids(self) -> list[int]:
        return [p.pid for pod in self.pods.values() for p in pod.procs.values()]

    def pid_of(self, uid: str, container: str) -> int | None:
        pod = self.pods.get(uid)
        proc = pod.procs.get(container) if pod else None
        return proc.pid if proc else None

    # ------------------------------------------------------------------ the loop
    def _loop(self) -> None:
        while not self._stop.wait(self.period):
            try:
                self.step()
            except Exception as exc:  # keep going: a kubelet does not stop at one bad pod
                message = f"stand-in kubelet: {type(exc).__name__}: {exc}"
                if message not in self.errors:
                    self.errors.append(message)
                    self.say(message)

    def step(self) -> None:
        items = self.kube.list(PODS)["items"]
        seen: set[str] = set()
        for pod in sorted(items, key=lambda p: int(p["metadata"]["resourceVersion"])):
            meta, spec = pod["metadata"], pod["spec"]
            node = spec.get("nodeName")
            if not node and spec.get("schedulerName", "default-scheduler") == "default-scheduler":
                self._bind(pod)
                continue
            if node not in self.nodes:
                continue
            seen.add(meta["uid"])
            if meta.get("deletionTimestamp"):
                self._finish_deletion(pod)
            elif meta["uid"] not in self.pods:
                self._run(pod, node)
        for uid in set(self.pods) - seen:
            self._stop_pod(uid)

    def _bind(self, pod: Obj) -> None:
        names = sorted(self.nodes)
        node = names[self._turn % len(names)]
        self._turn += 1
        meta = pod["metadata"]
        self.kube.bind(meta["namespace"], meta["name"], node, uid=meta["uid"])

    def _run(self, pod: Obj, node: str) -> None:
        meta = pod["metadata"]
        uid = meta["uid"]
        try:
            qos = qos_class(pod)
        except QuantityError:
            qos = "Burstable"
        root = self.nodes[node]
        record = _Pod(uid)
        self.pods[uid] = record
        pod_rel = pod_cgroup_path("cgroupfs", qos.lower(), uid, cgroup_root=root).strip("/")
        self.cgroups.make(pod_rel)
        record.groups.append(pod_rel)
        statuses = []
        for container in pod["spec"]["containers"]:
            cid = secrets.token_hex(32)
            rel = container_cgroup_path(
                "cgroupfs", qos.lower(), uid, "containerd", cid, cgroup_root=root
            ).strip("/")
            self.cgroups.make(rel)
            record.groups.append(rel)
            proc = subprocess.Popen(["sleep", "86400"], start_new_session=True)
            record.procs[container["name"]] = proc
            self.cgroups.enter(rel, proc.pid)
            self.say(
                f"stand-in kubelet: {meta['namespace']}/{meta['name']} container "
                f"{container['name']}: sleep pid {proc.pid} in /{rel}"
            )
            statuses.append(
                {
                    "name": container["name"],
                    "containerID": f"containerd://{cid}",
                    "state": {"running": {"startedAt": STARTED_AT}},
                    "ready": True,
                    "started": True,
                    "restartCount": 0,
                    "image": container.get("image", "busybox"),
                    "imageID": container.get("image", "busybox"),
                }
            )
        status = {
            "phase": "Running",
            "qosClass": qos,
            "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": statuses,
        }
        self.kube.patch_status(PODS, meta["name"], {"status": status}, meta["namespace"])

    def _finish_deletion(self, pod: Obj) -> None:
        """A graceful deletion: stop the containers, then tell the API server they are gone."""
        meta = pod["metadata"]
        self._stop_pod(meta["uid"])
        with contextlib.suppress(Exception):
            self.kube.delete(PODS, meta["name"], meta["namespace"], grace_period_seconds=0)

    def _stop_pod(self, uid: str) -> None:
        record = self.pods.pop(uid, None)
        if record is None:
            return
        for proc in record.procs.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
        for rel in reversed(record.groups):
            self.cgroups.remove(rel)


QOS_DIRS = ("burstable", "besteffort")


def allowed_cpus(pid: int) -> str:
    """The CPUs the kernel lets process `pid` run on (`Cpus_allowed_list`), '' once gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Cpus_allowed_list:"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""
