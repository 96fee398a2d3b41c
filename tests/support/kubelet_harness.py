"""The kubelet harness: a stand-in for the kubelet of one node, running real containers, for
end-to-end tests of corepin's node agent (a harness, not tests: the fixture `kubelet_harness` in
conftest.py gives a started one; its own tests are tests/e2e/test_kubelet_harness.py).

It watches, through the real API over HTTP (corepin's KubeClient and Informer), the pods bound
to its node (`spec.nodeName`), and for each one does what the kubelet with the cgroupfs driver
and the `none` CPU manager policy does on cgroup v1:

- computes the pod's QoS class (`podresources.qos_class`, Kubernetes' rules);
- creates the pod cgroup in every v1 hierarchy, below a scratch kubelet cgroup root
  (`corepin-test-<random>`, so never the host's real `kubepods`):
  `<root>/kubepods/pod<uid>` (Guaranteed), `<root>/kubepods/burstable/pod<uid>`,
  `<root>/kubepods/besteffort/pod<uid>`; its cpuset is its parent's (all CPUs), its cpu.shares
  and CFS quota are the kubelet's (`podresources.pod_cgroup_cpu`);
- starts one container per pod container in the session's private containerd with
  `ctr run --cgroup /<pod cgroup>/<id>` (a new 64-hex id each start; runc gives it its parent's
  cpuset and the shares and quota the kubelet asks the runtime for), running the container's
  command (`command` + `args`, default `sleep 3600`) in the busybox root filesystem;
- reports the pod's status through the status subresource as the kubelet does: phase, qosClass,
  conditions (PodReadyToStartContainers, Initialized, Ready, ContainersReady, PodScheduled),
  hostIP, startTime, and containerStatuses with containerID `containerd://<id>`, state,
  lastState, restartCount, ready, started, allocatedResources and resources;
- on a graceful deletion (`deletionTimestamp`) stops the containers (SIGTERM, then SIGKILL when
  the grace period, capped by `max_grace`, is over), reports the terminal status, removes the
  pod cgroup and deletes the pod with grace 0; a pod that disappears from the API is killed at
  once and its cgroups removed;
- applies in-place resizes (the pods/resize subresource changes the spec): writes the new
  shares and quota to the pod and container cgroups in the kernel's order (a growing pod quota
  before the containers, a shrinking one after them) and reports allocatedResources and
  resources;
- notices containers that exit on their own (`relist()`, also run every `pleg_period` seconds)
  and reports them terminated with their exit code; they are not restarted.

Operations for tests: `restart_container`, `stop_container`, `delete_pod`, `resize`; readers:
`container_view` / `pod_view` (cgroup path, cpuset.cpus/mems, quota, period, shares, every
task's Cpus_allowed_list and Mems_allowed_list from /proc), `wait_container`, `wait_running`,
`wait_status`, `wait_idle` (the kubelet has handled every change the API had).

Pointing corepin's node agent at it: `agent_args()` gives `--node-name`, `--kubeconfig`,
`--kubelet-cgroup-root /<scratch root>` and `--cgroup-driver cgroupfs`.

Not modelled: init containers are counted in the QoS class and the pod cgroup's values but are
not run; no automatic restarts (restartPolicy only decides the phase); no probes (a running
container is ready); memory limits are not written (memory counts only for the QoS class);
pod-level resources (`spec.resources`) and runtime-class overhead are ignored; resizes are
always admitted (never Deferred or Infeasible) and applied at once; no pod network (hostIP is
127.0.0.1, no podIP); the systemd cgroup driver; cgroup v2.

Cleanup (`stop`): stops the watch and the workers, kills and deletes every container it ever
created, and removes the scratch root in every cgroup hierarchy; it touches nothing else.
"""

from __future__ import annotations

import contextlib
import copy
import datetime as dt
import hashlib
import logging
import re
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from corepin.core.errors import ApiAlreadyExists, ApiConflict, ApiNotFound
from corepin.kube.client import KubeClient
from corepin.kube.config import load_config
from corepin.kube.informer import Informer
from corepin.kube.resources import NODES, PODS
from support.containerd_harness import (
    CGROUP,
    CPUSET,
    Containerd,
    remove_cgroup_trees,
    static_busybox,
)
from support.helpers import kill_and_remove_cgroup
from support.podresources import (
    CFS_PERIOD_US,
    MIN_SHARES,
    QOS_BEST_EFFORT,
    QOS_BURSTABLE,
    QOS_GUARANTEED,
    container_cgroup_cpu,
    container_requests,
    cpu_shares,
    defaulted_resources,
    pod_cgroup_cpu,
    pod_cpu_request,
    qos_class,
)

Obj = dict[str, Any]
log = logging.getLogger("kubelet_harness")

FIELD_MANAGER = "kubelet"
DEFAULT_COMMAND = ("sleep", "3600")
CONTAINER_PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
HOST_IP = "127.0.0.1"
TERMINAL_PHASES = ("Succeeded", "Failed")
#: the pod conditions the kubelet owns (others, e.g. readiness gates, are left as they are)
KUBELET_CONDITIONS = (
    "PodReadyToStartContainers",
    "Initialized",
    "Ready",
    "ContainersReady",
    "PodScheduled",
)
_EXIT_CODE = re.compile(r"exit with non-zero exit code (\d+)")
_SIGKILL_EXIT = 128 + 9


def now_text() -> str:
    """The current time as the API writes it (RFC 3339, seconds, UTC)."""
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# ---------------------------------------------------------------------- cgroup hierarchies
def v1_hierarchies(mounts: str = "/proc/mounts", cgroups: str = "/proc/cgroups") -> list[Path]:
    """The mount points of the cgroup v1 hierarchies below /sys/fs/cgroup (each once)."""
    known = {
        line.split()[0]
        for line in Path(cgroups).read_text().splitlines()
        if line and not line.startswith("#")
    }
    out: list[Path] = []
    for line in Path(mounts).read_text().splitlines():
        parts = line.split()
        if len(parts) < 4 or parts[2] != "cgroup":
            continue
        mount = Path(parts[1])
        options = parts[3].split(",")
        controls = any(o in known or o.startswith("name=") for o in options)
        if mount.parent == CGROUP and mount not in out and controls:
            out.append(mount)
    return out


def controller_mount(controller: str, mounts: str = "/proc/mounts") -> Path | None:
    """Where the v1 hierarchy holding `controller` is mounted (e.g. cpu: /sys/fs/cgroup/cpu or
    /sys/fs/cgroup/cpu,cpuacct), or None."""
    for line in Path(mounts).read_text().splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[2] == "cgroup" and controller in parts[3].split(","):
            return Path(parts[1])
    return None


def _read(path: Path) -> str:
    return path.read_text().strip()


def _count_cpus(text: str) -> int:
    count = 0
    for part in filter(None, text.strip().split(",")):
        low, _, high = part.partition("-")
        count += int(high or low) - int(low) + 1
    return count


# ---------------------------------------------------------------------- what tests read
@dataclass(frozen=True)
class TaskView:
    """One task (thread) of a cgroup as /proc shows it."""

    pid: int  # the thread group (process) id
    tid: int
    cpus_allowed: str  # Cpus_allowed_list
    mems_allowed: str  # Mems_allowed_list


@dataclass(frozen=True)
class CgroupView:
    """A cgroup's CPU settings, read from the cpuset and cpu hierarchies."""

    path: str  # relative to every hierarchy's root
    cpus: str  # cpuset.cpus
    mems: str  # cpuset.mems
    cfs_quota_us: int
    cfs_period_us: int
    cpu_shares: int
    tasks: tuple[TaskView, ...]

    @property
    def pids(self) -> list[int]:
        return sorted({t.pid for t in self.tasks})

    @property
    def allowed_cpus(self) -> set[str]:
        """The distinct Cpus_allowed_list values of the cgroup's tasks."""
        return {t.cpus_allowed for t in self.tasks}

    @property
    def allowed_mems(self) -> set[str]:
        return {t.mems_allowed for t in self.tasks}


@dataclass(frozen=True)
class ContainerView:
    """A running container as a test sees it: who it is and its cgroup."""

    namespace: str
    pod: str
    name: str
    pod_uid: str
    qos: str
    container_id: str  # 64 hex digits (the status says containerd://<id>)
    restart_count: int
    cgroup: CgroupView


# ---------------------------------------------------------------------- the kubelet's records
@dataclass
class _Container:
    name: str
    spec: Obj  # the container as last admitted (resources updated by resizes)
    id: str = ""
    state: str = "waiting"  # waiting | running | terminated
    started_at: str = ""
    started_mono: float = 0.0
    finished_at: str = ""
    exit_code: int = 0
    reason: str = ""
    message: str = ""
    restart_count: int = 0
    last_terminated: Obj | None = None

    def terminated(self) -> Obj:
        out: Obj = {
            "exitCode": self.exit_code,
            "reason": self.reason,
            "startedAt": self.started_at or None,
            "finishedAt": self.finished_at,
        }
        if self.id:
            out["containerID"] = f"containerd://{self.id}"
        return out


@dataclass
class _Pod:
    uid: str
    namespace: str
    name: str
    qos: str = ""
    cgroup: str = ""
    restart_policy: str = "Always"
    containers: dict[str, _Container] = field(default_factory=dict)
    start_time: str = ""
    phase: str = "Pending"
    pod_cpu: tuple[int, int] = (MIN_SHARES, -1)  # (shares, quota) written to the pod cgroup
    cpu_request: int = 0  # thousandths, for the burstable QoS cgroup's shares
    admitted: bool = False
    cgroup_removed: bool = False
    torn_down: bool = False
    since: dict[str, tuple[str, str]] = field(default_factory=dict)
    lock: threading.RLock = field(default_factory=threading.RLock)


class KubeletError(RuntimeError):
    """A kubelet harness operation could not be done (the message says why)."""


class KubeletHarness:
    """The kubelet harness: the kubelet of one node for end-to-end tests (see the module
    docstring)."""

    def __init__(
        self,
        containerd: Containerd,
        rootfs: Path,
        kubeconfig: Path,
        *,
        workdir: Path,
        node_name: str | None = None,
        cgroup_root: str | None = None,
        workers: int = 8,
        pleg_period: float = 1.0,
        max_grace: float = 2.0,
    ) -> None:
        self.containerd = containerd
        self.rootfs = rootfs
        self.kubeconfig = kubeconfig
        self.node_name = node_name or f"kubelet-{secrets.token_hex(3)}"
        #: the scratch kubelet cgroup root, relative (the agent's --kubelet-cgroup-root is
        #: `kubelet_cgroup_root`, with a leading slash)
        self.cgroup_root = cgroup_root or f"corepin-test-{secrets.token_hex(4)}"
        self.log_dir = workdir / "logs"
        self.pleg_period = pleg_period
        self.max_grace = max_grace
        #: exceptions raised inside the kubelet's workers (a test kubelet bug): tests and the
        #: fixture assert it stays empty
        self.errors: list[str] = []
        self.hierarchies = v1_hierarchies()
        cpu = controller_mount("cpu")
        if cpu is None:
            raise KubeletError("no cgroup v1 hierarchy has the cpu controller")
        self.cpu_mount = cpu
        self.cpuset_mount = CPUSET
        self.client = KubeClient.from_config(
            load_config(kubeconfig, env={}),
            timeout=10,
            user_agent="corepin-test-kubelet",
            field_manager=FIELD_MANAGER,
        )
        self._informer = Informer(
            self.client,
            PODS,
            field_selector=f"spec.nodeName={self.node_name}",
            watch_timeout=300,
            backoff_initial=0.05,
            backoff_max=1.0,
            name=f"test-kubelet-{self.node_name}",
        )
        self._informer.add_handlers(
            on_add=self._on_event,
            on_update=lambda _old, new: self._on_event(new),
            on_delete=self._on_event,
        )
        self._executor = ThreadPoolExecutor(workers, thread_name_prefix="test-kubelet")
        self._lock = threading.Lock()
        self._pods: dict[str, _Pod] = {}
        self._names: dict[tuple[str, str], str] = {}
        self._work: dict[str, str] = {}
        self._cids: set[str] = set()
        self._stop = threading.Event()
        self._pleg: threading.Thread | None = None
        self._image_digest = ""
        self._capacity_cpus = 0
        self._started = False

    # ------------------------------------------------------------------ lifecycle
    @property
    def kubelet_cgroup_root(self) -> str:
        """The value of the agent's `--kubelet-cgroup-root`."""
        return "/" + self.cgroup_root

    def agent_args(self) -> list[str]:
        """The `corepin agent` options that point it at this node."""
        return [
            "--node-name",
            self.node_name,
            "--kubeconfig",
            str(self.kubeconfig),
            "--cgroup-root",
            str(CGROUP),
            "--kubelet-cgroup-root",
            self.kubelet_cgroup_root,
            "--cgroup-driver",
            "cgroupfs",
        ]

    def start(self, timeout: float = 15.0) -> KubeletHarness:
        """Create the scratch cgroup root and the QoS cgroups, register the Node, start watching
        pods. Raises KubeletError when the watch does not sync within `timeout`."""
        if self._started:
            raise KubeletError("the test kubelet is already started")
        self._started = True
        self.log_dir.mkdir(parents=True, exist_ok=True)
        busybox = static_busybox()
        if busybox is not None:
            self._image_digest = hashlib.sha256(Path(busybox).read_bytes()).hexdigest()
        self._create_qos_cgroups()
        self._register_node()
        self._informer.start()
        if not self._informer.wait_for_sync(timeout):
            raise KubeletError(f"the pod watch did not sync within {timeout:g} s")
        if self.pleg_period > 0:
            self._pleg = threading.Thread(
                target=self._pleg_loop, name="test-kubelet-pleg", daemon=True
            )
            self._pleg.start()
        return self

    def stop(self) -> list[str]:
        """Stop watching, kill and delete every container this kubelet created, remove the
        scratch cgroup root in every hierarchy. Returns what could not be removed (empty when
        everything is gone). Stopping again only reports."""
        if self._stop.is_set():
            return self.leftovers()
        self._stop.set()
        self._informer.stop()
        if self._pleg is not None:
            self._pleg.join(timeout=30)
        self._executor.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            cids = sorted(self._cids)
        if cids:
            with ThreadPoolExecutor(8) as pool:
                list(pool.map(self.containerd.remove_container, cids))
        remove_cgroup_trees([self.cgroup_root])
        self.client.close()
        return self.leftovers(cids)

    def leftovers(self, cids: Iterable[str] = ()) -> list[str]:
        """Scratch cgroups still present in any hierarchy, and containers of `cids` containerd
        still knows."""
        left = [
            str(h / self.cgroup_root) for h in CGROUP.iterdir() if (h / self.cgroup_root).exists()
        ]
        wanted = set(cids)
        if wanted:
            known = set(self.containerd.ctr("container", "ls", "-q", timeout=10).stdout.split())
            left += [f"container {c}" for c in sorted(wanted & known)]
        return left

    # ------------------------------------------------------------------ cgroup layout
    def qos_cgroup_path(self, qos: str) -> str:
        """The QoS-level cgroup, relative to a hierarchy root."""
        base = f"{self.cgroup_root}/kubepods"
        if qos == QOS_GUARANTEED:
            return base
        if qos == QOS_BURSTABLE:
            return f"{base}/burstable"
        if qos == QOS_BEST_EFFORT:
            return f"{base}/besteffort"
        raise KubeletError(f"unknown QoS class {qos!r}")

    def pod_cgroup_path(self, qos: str, uid: str) -> str:
        """The pod cgroup (kubelet cgroupfs driver), relative to a hierarchy root."""
        return f"{self.qos_cgroup_path(qos)}/pod{uid}"

    def _mkdir(self, rel: str) -> None:
        """Create the cgroup `rel` in every v1 hierarchy, its cpuset copied from its parent."""
        for hierarchy in self.hierarchies:
            path = hierarchy / rel
            if path.is_dir():
                continue
            path.mkdir()
            if hierarchy == self.cpuset_mount:
                for name in ("cpuset.cpus", "cpuset.mems"):
                    (path / name).write_text(_read(path.parent / name))

    def _write_cpu(self, rel: str, *, shares: int | None = None, quota: int | None = None) -> None:
        base = self.cpu_mount / rel
        if shares is not None:
            (base / "cpu.shares").write_text(str(shares))
        if quota is not None:
            (base / "cpu.cfs_period_us").write_text(str(CFS_PERIOD_US))
            (base / "cpu.cfs_quota_us").write_text(str(quota))

    def _create_qos_cgroups(self) -> None:
        self._capacity_cpus = _count_cpus(_read(self.cpuset_mount / "cpuset.cpus"))
        self._mkdir(self.cgroup_root)
        for qos in (QOS_GUARANTEED, QOS_BURSTABLE, QOS_BEST_EFFORT):
            self._mkdir(self.qos_cgroup_path(qos))
        self._write_cpu(
            self.qos_cgroup_path(QOS_GUARANTEED), shares=cpu_shares(self._capacity_cpus * 1000)
        )
        self._write_cpu(self.qos_cgroup_path(QOS_BEST_EFFORT), shares=MIN_SHARES)
        self._write_cpu(self.qos_cgroup_path(QOS_BURSTABLE), shares=MIN_SHARES)

    def _update_burstable_shares(self) -> None:
        """The burstable QoS cgroup's shares: the sum of its pods' CPU requests."""
        with self._lock:
            total = sum(
                p.cpu_request
                for p in self._pods.values()
                if p.qos == QOS_BURSTABLE and p.admitted and not p.cgroup_removed
            )
        with contextlib.suppress(OSError):
            self._write_cpu(self.qos_cgroup_path(QOS_BURSTABLE), shares=cpu_shares(total))

    # ------------------------------------------------------------------ node
    def _register_node(self) -> None:
        memory_kib = 0
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                memory_kib = int(line.split()[1])
        resources = {
            "cpu": str(self._capacity_cpus),
            "memory": f"{memory_kib}Ki",
            "pods": "110",
        }
        status: Obj = {
            "capacity": resources,
            "allocatable": dict(resources),
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "kubelet is posting ready status",
                    "lastHeartbeatTime": now_text(),
                    "lastTransitionTime": now_text(),
                }
            ],
            "addresses": [
                {"type": "InternalIP", "address": HOST_IP},
                {"type": "Hostname", "address": self.node_name},
            ],
            "nodeInfo": {
                "operatingSystem": "linux",
                "kubeletVersion": "v1.34.0-corepin-test",
                "containerRuntimeVersion": "containerd://test",
            },
        }
        node: Obj = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": self.node_name,
                "labels": {"kubernetes.io/hostname": self.node_name, "kubernetes.io/os": "linux"},
            },
            "status": status,
        }
        try:
            self.client.create(NODES, node)
        except ApiAlreadyExists:
            self.client.patch_status(NODES, self.node_name, {"status": status})

    # ------------------------------------------------------------------ pod workers
    def _on_event(self, obj: Obj) -> None:
        meta = obj.get("metadata") or {}
        uid = str(meta.get("uid") or "")
        if not uid:
            return
        with self._lock:
            if uid not in self._pods:
                self._pods[uid] = _Pod(uid, str(meta.get("namespace") or ""), str(meta["name"]))
                self._names[(self._pods[uid].namespace, self._pods[uid].name)] = uid
        self._schedule(uid)

    def _schedule(self, uid: str) -> None:
        """Sync the pod on a worker; one sync of a pod at a time, a sync asked for while one
        runs runs again after it."""
        with self._lock:
            if self._stop.is_set():
                return
            state = self._work.get(uid)
            if state is not None:
                self._work[uid] = "again"
                return
            self._work[uid] = "running"
        try:
            self._executor.submit(self._worker, uid)
        except RuntimeError:  # shut down meanwhile
            with self._lock:
                self._work.pop(uid, None)

    def _worker(self, uid: str) -> None:
        while True:
            try:
                if not self._stop.is_set():
                    self._sync(uid)
            except Exception as exc:
                log.exception("test kubelet: sync of pod %s failed", uid)
                self.errors.append(f"sync of pod {uid}: {exc!r}")
            with self._lock:
                if self._work.get(uid) == "again" and not self._stop.is_set():
                    self._work[uid] = "running"
                    continue
                self._work.pop(uid, None)
                return

    def _current(self, pod: _Pod) -> Obj | None:
        """The pod's latest object from the watch, or None when it is gone (or replaced)."""
        obj = self._informer.cache.get(pod.name, pod.namespace)
        if obj is None or (obj.get("metadata") or {}).get("uid") != pod.uid:
            return None
        return obj

    def _sync(self, uid: str) -> None:
        with self._lock:
            pod = self._pods.get(uid)
        if pod is None:
            return
        with pod.lock:
            if pod.torn_down:
                return
            obj = self._current(pod)
            if obj is None:
                self._teardown(pod, grace=0.0, obj=None)
                return
            meta = obj.get("metadata") or {}
            if meta.get("deletionTimestamp"):
                grace = float(meta.get("deletionGracePeriodSeconds") or 0)
                self._teardown(pod, grace=min(grace, self.max_grace), obj=obj)
                with contextlib.suppress(ApiNotFound, ApiConflict):
                    self.client.delete(
                        PODS, pod.name, pod.namespace, grace_period_seconds=0, uid=uid
                    )
                return
            if not pod.admitted:
                if (obj.get("status") or {}).get("phase") in TERMINAL_PHASES:
                    return
                self._admit(pod, obj)
            else:
                self._resize_if_needed(pod, obj)
            self._write_status(pod, obj)

    # ------------------------------------------------------------------ admission
    def _admit(self, pod: _Pod, obj: Obj) -> None:
        spec = obj.get("spec") or {}
        pod.qos = qos_class(obj)
        pod.cgroup = self.pod_cgroup_path(pod.qos, pod.uid)
        pod.restart_policy = str(spec.get("restartPolicy") or "Always")
        pod.start_time = now_text()
        pod.pod_cpu = pod_cgroup_cpu(obj)
        pod.cpu_request = pod_cpu_request(obj)
        self._mkdir(pod.cgroup)
        shares, quota = pod.pod_cpu
        self._write_cpu(pod.cgroup, shares=shares, quota=quota)
        pod.admitted = True
        self._update_burstable_shares()
        for container in spec.get("containers") or []:
            record = _Container(str(container["name"]), copy.deepcopy(container))
            pod.containers[record.name] = record
        records = list(pod.containers.values())
        with ThreadPoolExecutor(max(1, len(records))) as pool:  # containers start together
            list(pool.map(lambda r: self._start_container(pod, r), records))

    def _argv(self, container: Obj) -> list[str]:
        command = [str(a) for a in container.get("command") or []]
        args = [str(a) for a in container.get("args") or []]
        return command + args if command else args or list(DEFAULT_COMMAND)

    def _start_container(self, pod: _Pod, record: _Container) -> None:
        """`ctr run` the container with a new id in the pod cgroup (runc gives it the pod's
        cpuset and the shares and quota asked for)."""
        cid = secrets.token_hex(32)
        with self._lock:
            self._cids.add(cid)
        shares, quota = container_cgroup_cpu(record.spec)
        args = [
            "run",
            "-d",
            "--rootfs",
            "--cgroup",
            f"/{pod.cgroup}/{cid}",
            "--cpu-shares",
            str(shares),
            "--cpu-period",
            str(CFS_PERIOD_US),
            "--log-uri",
            f"file://{self.log_dir / cid}.log",
            "--env",
            CONTAINER_PATH,
            "--label",
            f"io.kubernetes.pod.uid={pod.uid}",
            "--label",
            f"io.kubernetes.pod.name={pod.name}",
            "--label",
            f"io.kubernetes.pod.namespace={pod.namespace}",
            "--label",
            f"io.kubernetes.container.name={record.name}",
        ]
        if quota > 0:
            args += ["--cpu-quota", str(quota)]
        for var in record.spec.get("env") or []:
            if isinstance(var, dict) and "value" in var:
                args += ["--env", f"{var['name']}={var['value']}"]
        args += [str(self.rootfs), cid, *self._argv(record.spec)]
        done = self.containerd.ctr(*args, timeout=60)
        if done.returncode != 0:
            self.containerd.remove_container(cid)
            with self._lock:
                self._cids.discard(cid)
            record.id = ""
            record.state = "waiting"
            record.reason = "RunContainerError"
            record.message = done.stderr.strip()[-400:]
            return
        record.id = cid
        record.state = "running"
        record.started_at = now_text()
        record.started_mono = time.monotonic()
        record.reason = record.message = ""
        record.finished_at = ""

    # ------------------------------------------------------------------ stopping containers
    def _delete_task(self, cid: str, deadline: float) -> int | None:
        """Delete the container's stopped task; its exit code (None when there was no task or
        it did not stop before `deadline`)."""
        while True:
            done = self.containerd.ctr("task", "delete", cid, timeout=10)
            if done.returncode == 0:
                found = _EXIT_CODE.search(done.stderr)
                return int(found.group(1)) if found else 0
            if "not found" in done.stderr:
                return None
            if time.monotonic() > deadline:
                return None
            time.sleep(0.02)

    def _kill_container(self, record: _Container, *, signal: str, grace: float) -> None:
        """Stop a running container (`signal`, then SIGKILL once `grace` seconds have passed),
        delete it from containerd and record it terminated."""
        if record.state != "running":
            return
        cid = record.id
        code: int | None = None
        if signal != "SIGKILL":
            self.containerd.ctr("task", "kill", "-s", signal, cid, timeout=10)
            code = self._delete_task(cid, time.monotonic() + grace)
        if code is None:
            self.containerd.ctr("task", "kill", "-s", "SIGKILL", cid, timeout=10)
            code = self._delete_task(cid, time.monotonic() + 30)
        self._forget_container(record, _SIGKILL_EXIT if code is None else code)

    def _forget_container(self, record: _Container, exit_code: int) -> None:
        if self.containerd.ctr("container", "delete", record.id, timeout=10).returncode == 0:
            with self._lock:
                self._cids.discard(record.id)
        record.state = "terminated"
        record.exit_code = exit_code
        record.reason = "Completed" if exit_code == 0 else "Error"
        record.finished_at = now_text()

    def _teardown(self, pod: _Pod, *, grace: float, obj: Obj | None) -> None:
        """Stop every container, report the terminal status (when the pod is still in the API)
        and remove the pod cgroup."""
        signal = "SIGTERM" if grace > 0 else "SIGKILL"
        running = [c for c in pod.containers.values() if c.state == "running"]
        with ThreadPoolExecutor(max(1, len(running))) as pool:
            list(pool.map(lambda c: self._kill_container(c, signal=signal, grace=grace), running))
        if obj is not None and pod.admitted:
            pod.phase = self._terminal_phase(pod)
            self._write_status(pod, obj, terminating=True)
        self._remove_pod_cgroup(pod)
        pod.torn_down = True
        with self._lock:
            if self._names.get((pod.namespace, pod.name)) == pod.uid:
                del self._names[(pod.namespace, pod.name)]

    def _remove_pod_cgroup(self, pod: _Pod) -> None:
        if pod.cgroup and not pod.cgroup_removed:
            for hierarchy in CGROUP.iterdir():
                if not kill_and_remove_cgroup(hierarchy / pod.cgroup, attempts=100, pause=0.02):
                    raise KubeletError(f"could not remove {hierarchy / pod.cgroup}")
            pod.cgroup_removed = True
            self._update_burstable_shares()

    # ------------------------------------------------------------------ resize
    def _resize_if_needed(self, pod: _Pod, obj: Obj) -> None:
        """Apply a resize: the spec's resources differ from what was admitted."""
        changed: list[tuple[_Container, Obj]] = []
        for container in (obj.get("spec") or {}).get("containers") or []:
            record = pod.containers.get(str(container.get("name")))
            if record is None:
                continue
            if defaulted_resources(container) != defaulted_resources(record.spec):
                changed.append((record, container))
        if not changed:
            return
        old_quota = pod.pod_cpu[1]
        shares, quota = pod_cgroup_cpu(obj)

        # cgroup v1 refuses a child quota above its parent's: a growing pod quota is written
        # before the containers', a shrinking one after them; shrinking containers go first
        grows = _quota_order(quota) >= _quota_order(old_quota)
        if grows:
            self._write_cpu(pod.cgroup, shares=shares, quota=quota)
        changed.sort(
            key=lambda pair: (
                _quota_order(container_cgroup_cpu(pair[1])[1])
                >= _quota_order(container_cgroup_cpu(pair[0].spec)[1])
            )
        )
        for record, container in changed:
            if record.state == "running":
                new_shares, new_quota = container_cgroup_cpu(container)
                self._write_cpu(f"{pod.cgroup}/{record.id}", shares=new_shares, quota=new_quota)
            record.spec["resources"] = copy.deepcopy(container.get("resources") or {})
        if not grows:
            self._write_cpu(pod.cgroup, shares=shares, quota=quota)
        pod.pod_cpu = (shares, quota)
        pod.cpu_request = pod_cpu_request(obj)
        self._update_burstable_shares()

    # ------------------------------------------------------------------ status
    def _terminal_phase(self, pod: _Pod) -> str:
        codes = [c.exit_code for c in pod.containers.values() if c.state == "terminated"]
        return "Succeeded" if codes and all(code == 0 for code in codes) else "Failed"

    def _phase(self, pod: _Pod) -> str:
        """`getPhase` of the kubelet, for a pod that is not being deleted."""
        if pod.phase in TERMINAL_PHASES:
            return pod.phase
        states = [c.state for c in pod.containers.values()]
        if not states or "waiting" in states:
            return "Pending"
        if "running" in states:
            return "Running"
        if pod.restart_policy == "Always":
            return "Running"
        if all(c.exit_code == 0 for c in pod.containers.values()):
            return "Succeeded"
        if pod.restart_policy == "Never":
            return "Failed"
        return "Running"

    def _condition(
        self, pod: _Pod, kind: str, ok: bool, reason: str = "", message: str = ""
    ) -> Obj:
        status = "True" if ok else "False"
        since = pod.since.get(kind)
        if since is None or since[0] != status:
            since = (status, now_text())
            pod.since[kind] = since
        out: Obj = {
            "type": kind,
            "status": status,
            "lastProbeTime": None,
            "lastTransitionTime": since[1],
        }
        if reason:
            out["reason"] = reason
        if message:
            out["message"] = message
        return out

    def _container_status(self, record: _Container, image: str) -> Obj:
        running = record.state == "running"
        state: Obj
        if running:
            state = {"running": {"startedAt": record.started_at}}
        elif record.state == "terminated":
            state = {"terminated": record.terminated()}
        else:
            waiting: Obj = {"reason": record.reason or "ContainerCreating"}
            if record.message:
                waiting["message"] = record.message
            state = {"waiting": waiting}
        out: Obj = {
            "name": record.name,
            "image": image,
            "imageID": f"{_repository(image)}@sha256:{self._image_digest}",
            "ready": running,
            "started": running,
            "restartCount": record.restart_count,
            "state": state,
            "lastState": {"terminated": record.last_terminated} if record.last_terminated else {},
        }
        if record.id:
            out["containerID"] = f"containerd://{record.id}"
        requests = container_requests(record.spec)
        if requests:
            out["allocatedResources"] = requests
        resources = defaulted_resources(record.spec)
        if resources:
            out["resources"] = resources
        return out

    def _status(self, pod: _Pod, obj: Obj, *, terminating: bool) -> Obj:
        pod.phase = pod.phase if terminating else self._phase(pod)
        images = {
            str(c.get("name")): str(c.get("image") or "")
            for c in (obj.get("spec") or {}).get("containers") or []
        }
        statuses = [
            self._container_status(record, images.get(name, ""))
            for name, record in pod.containers.items()
        ]
        unready = [r.name for r in pod.containers.values() if r.state != "running"]
        terminal = pod.phase in TERMINAL_PHASES
        if terminal:
            ready_reason, ready_message = "PodCompleted", ""
        elif unready:
            ready_reason = "ContainersNotReady"
            ready_message = f"containers with unready status: [{' '.join(unready)}]"
        else:
            ready_reason = ready_message = ""
        ok = not unready and not terminal
        mine = [
            self._condition(pod, "PodReadyToStartContainers", not terminating and not terminal),
            self._condition(pod, "Initialized", True),
            self._condition(pod, "Ready", ok, ready_reason, ready_message),
            self._condition(pod, "ContainersReady", ok, ready_reason, ready_message),
            self._condition(pod, "PodScheduled", True),
        ]
        current = (obj.get("status") or {}).get("conditions") or []
        for condition in current:
            if condition.get("type") == "PodScheduled" and condition.get("status") == "True":
                mine[-1]["lastTransitionTime"] = condition.get("lastTransitionTime")
        others = [c for c in current if c.get("type") not in KUBELET_CONDITIONS]
        status: Obj = {
            "phase": pod.phase,
            "qosClass": pod.qos,
            "conditions": others + mine,
            "hostIP": HOST_IP,
            "hostIPs": [{"ip": HOST_IP}],
            "startTime": pod.start_time,
            "containerStatuses": statuses,
        }
        generation = (obj.get("metadata") or {}).get("generation")
        if generation is not None:
            status["observedGeneration"] = generation
        return status

    def _write_status(self, pod: _Pod, obj: Obj, *, terminating: bool = False) -> None:
        """Patch the pod's status when it differs from what the API has."""
        status = self._status(pod, obj, terminating=terminating)
        current = obj.get("status") or {}
        if any(current.get(k) != v for k, v in status.items()):
            with contextlib.suppress(ApiNotFound):
                self.client.patch_status(PODS, pod.name, {"status": status}, pod.namespace)
        if pod.phase in TERMINAL_PHASES and not terminating:
            # a finished pod's cgroup goes (its containers have all exited)
            self._remove_pod_cgroup(pod)

    # ------------------------------------------------------------------ PLEG
    def _pleg_loop(self) -> None:
        while not self._stop.wait(self.pleg_period):
            try:
                self.relist()
            except Exception as exc:
                log.exception("test kubelet: relist failed")
                self.errors.append(f"relist: {exc!r}")

    def relist(self) -> int:
        """Find containers that exited on their own (one `ctr task ls`), record them
        terminated with their exit code and report it. Returns how many were found."""
        began = time.monotonic()
        listing = self.containerd.ctr("task", "ls", timeout=10)
        if listing.returncode != 0:
            return 0
        running = {
            parts[0]
            for parts in (line.split() for line in listing.stdout.splitlines()[1:])
            if len(parts) >= 3 and parts[2] == "RUNNING"
        }
        found = 0
        with self._lock:
            pods = list(self._pods.values())
        for pod in pods:
            with pod.lock:
                if pod.torn_down or self._stop.is_set():
                    continue
                exited = [
                    c
                    for c in pod.containers.values()
                    if c.state == "running" and c.started_mono < began and c.id not in running
                ]
                for record in exited:
                    code = self._delete_task(record.id, time.monotonic() + 10)
                    self._forget_container(record, _SIGKILL_EXIT if code is None else code)
                found += len(exited)
                obj = self._current(pod)
                if exited and obj is not None:
                    self._write_status(pod, obj)
        return found

    # ------------------------------------------------------------------ lookups
    def _pod(self, namespace: str, name: str) -> _Pod:
        with self._lock:
            uid = self._names.get((namespace, name))
            pod = self._pods.get(uid) if uid else None
        if pod is None or not pod.admitted:
            raise KubeletError(f"pod {namespace}/{name} is not running on {self.node_name}")
        return pod

    def _container(self, namespace: str, name: str, container: str) -> tuple[_Pod, _Container]:
        pod = self._pod(namespace, name)
        record = pod.containers.get(container)
        if record is None:
            raise KubeletError(f"pod {namespace}/{name} has no container {container!r}")
        return pod, record

    def pod_uid(self, namespace: str, name: str) -> str:
        return self._pod(namespace, name).uid

    def container_id(self, namespace: str, name: str, container: str) -> str:
        """The current container id (64 hex digits; "" when it is not running)."""
        return self._container(namespace, name, container)[1].id

    def pod_cgroup(self, namespace: str, name: str) -> str:
        """The pod cgroup, relative to every hierarchy root."""
        return self._pod(namespace, name).cgroup

    def container_cgroup(self, namespace: str, name: str, container: str) -> str:
        """The container's cgroup, relative to every hierarchy root."""
        pod, record = self._container(namespace, name, container)
        if not record.id:
            raise KubeletError(f"container {container!r} of {namespace}/{name} is not running")
        return f"{pod.cgroup}/{record.id}"

    def log(self, namespace: str, name: str, container: str) -> str:
        """What the current container wrote to stdout and stderr."""
        cid = self.container_id(namespace, name, container)
        path = self.log_dir / f"{cid}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    # ------------------------------------------------------------------ readers
    def tasks(self, rel: str) -> tuple[TaskView, ...]:
        """Every task of the cpuset cgroup `rel` with its allowed CPUs and memory nodes."""
        out: list[TaskView] = []
        for text in _read(self.cpuset_mount / rel / "tasks").split():
            tid = int(text)
            fields: dict[str, str] = {}
            try:
                for line in Path(f"/proc/{tid}/status").read_text().splitlines():
                    key, _, value = line.partition(":")
                    fields[key] = value.strip()
            except (FileNotFoundError, ProcessLookupError):
                continue  # exited meanwhile
            out.append(
                TaskView(
                    int(fields.get("Tgid") or tid),
                    tid,
                    fields.get("Cpus_allowed_list", ""),
                    fields.get("Mems_allowed_list", ""),
                )
            )
        return tuple(out)

    def cgroup_view(self, rel: str) -> CgroupView:
        cpuset = self.cpuset_mount / rel
        cpu = self.cpu_mount / rel
        return CgroupView(
            rel,
            _read(cpuset / "cpuset.cpus"),
            _read(cpuset / "cpuset.mems"),
            int(_read(cpu / "cpu.cfs_quota_us")),
            int(_read(cpu / "cpu.cfs_period_us")),
            int(_read(cpu / "cpu.shares")),
            self.tasks(rel),
        )

    def pod_view(self, namespace: str, name: str) -> CgroupView:
        """The pod cgroup now."""
        return self.cgroup_view(self.pod_cgroup(namespace, name))

    def container_view(self, namespace: str, name: str, container: str) -> ContainerView:
        """The container and its cgroup now."""
        pod, record = self._container(namespace, name, container)
        with pod.lock:
            rel = self.container_cgroup(namespace, name, container)
            return ContainerView(
                namespace,
                name,
                container,
                pod.uid,
                pod.qos,
                record.id,
                record.restart_count,
                self.cgroup_view(rel),
            )

    def wait_container(
        self,
        namespace: str,
        name: str,
        container: str,
        predicate: Callable[[ContainerView], bool],
        *,
        timeout: float = 15.0,
        what: str = "",
    ) -> ContainerView:
        """Poll the container until `predicate(view)` holds; the view. AssertionError naming
        `what` and the last view on timeout."""
        deadline = time.monotonic() + timeout
        view: ContainerView | None = None
        while True:
            with contextlib.suppress(KubeletError, FileNotFoundError):
                view = self.container_view(namespace, name, container)
                if predicate(view):
                    return view
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what or 'the container'}: {view}")
            time.sleep(0.02)

    # ------------------------------------------------------------------ the API side
    def create_pod(self, manifest: Mapping[str, Any]) -> Obj:
        """Create the pod through the API, bound to this node unless it names one."""
        pod = copy.deepcopy(dict(manifest))
        pod.setdefault("spec", {}).setdefault("nodeName", self.node_name)
        return self.client.create(PODS, pod)

    def get_pod(self, namespace: str, name: str) -> Obj | None:
        """The pod as the API has it now (None when it is gone)."""
        try:
            return self.client.get(PODS, name, namespace)
        except ApiNotFound:
            return None

    def wait_running(self, namespace: str, name: str, *, timeout: float = 30.0) -> Obj:
        """Poll the API until the pod is Running with every container running and ready; the
        pod. AssertionError with the last status on timeout."""
        deadline = time.monotonic() + timeout
        last: Obj | None = None
        while True:
            last = self.get_pod(namespace, name)
            if last is not None and _running(last):
                return last
            if time.monotonic() > deadline:
                status = None if last is None else last.get("status")
                raise AssertionError(f"pod {namespace}/{name} not running: {status}")
            time.sleep(0.02)

    def wait_status(
        self,
        namespace: str,
        name: str,
        predicate: Callable[[Obj], bool],
        *,
        timeout: float = 15.0,
        what: str = "",
    ) -> Obj:
        """Poll the API until `predicate(pod)` holds; the pod."""
        deadline = time.monotonic() + timeout
        last: Obj | None = None
        while True:
            last = self.get_pod(namespace, name)
            if last is not None and predicate(last):
                return last
            if time.monotonic() > deadline:
                status = None if last is None else last.get("status")
                raise AssertionError(f"timed out waiting for {what or 'the pod'}: {status}")
            time.sleep(0.02)

    def wait_idle(self, *, timeout: float = 15.0) -> None:
        """Wait until the kubelet has seen every pod change the API had when this was called
        and has handled them all (its watch reached that resource version and no pod sync is
        running or queued). AssertionError on timeout."""
        target = int(self.client.list(PODS, limit=1)["metadata"]["resourceVersion"])
        deadline = time.monotonic() + timeout
        while True:
            seen = int(self._informer.last_resource_version or 0)
            with self._lock:
                busy = bool(self._work)
            if seen >= target and not busy:
                return
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"the test kubelet is not idle: watch at {seen} of {target}, busy {busy}"
                )
            time.sleep(0.02)

    # ------------------------------------------------------------------ operations
    def restart_container(self, namespace: str, name: str, container: str) -> str:
        """Kill the container and start it again with a new id (restartCount + 1, lastState
        terminated), report it; the new id."""
        pod, record = self._container(namespace, name, container)
        with pod.lock:
            if pod.torn_down or pod.phase in TERMINAL_PHASES:
                raise KubeletError(f"pod {namespace}/{name} has finished")
            if record.state == "running":
                self._kill_container(record, signal="SIGKILL", grace=0)
            if record.state == "terminated":
                record.last_terminated = record.terminated()
            record.restart_count += 1
            self._start_container(pod, record)
            if record.state != "running":
                raise KubeletError(f"restarting {container!r} failed: {record.message}")
            obj = self._current(pod)
            if obj is not None:
                self._write_status(pod, obj)
            return record.id

    def stop_container(
        self,
        namespace: str,
        name: str,
        container: str,
        *,
        signal: str = "SIGKILL",
        grace: float = 10.0,
    ) -> int:
        """Stop the container (`signal`, SIGKILL after `grace` seconds), report it terminated;
        its exit code. It is not restarted."""
        pod, record = self._container(namespace, name, container)
        with pod.lock:
            if record.state != "running":
                raise KubeletError(f"container {container!r} of {namespace}/{name} is not running")
            self._kill_container(record, signal=signal, grace=grace)
            obj = self._current(pod)
            if obj is not None:
                self._write_status(pod, obj)
            return record.exit_code

    def delete_pod(
        self,
        namespace: str,
        name: str,
        *,
        grace_seconds: int | None = None,
        timeout: float = 30.0,
    ) -> None:
        """Delete the pod through the API and wait until the kubelet has stopped its containers,
        removed its cgroups and the pod is gone from the API."""
        pod = self._pod(namespace, name)
        self.client.delete(PODS, name, namespace, grace_period_seconds=grace_seconds)
        deadline = time.monotonic() + timeout
        while True:
            obj = self.get_pod(namespace, name)
            gone = obj is None or (obj.get("metadata") or {}).get("uid") != pod.uid
            if gone and pod.torn_down and not self.cgroup_exists(pod.cgroup):
                return
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"pod {namespace}/{name} not deleted in {timeout:g} s: in the API "
                    f"{not gone}, torn down {pod.torn_down}"
                )
            time.sleep(0.02)

    def cgroup_exists(self, rel: str) -> bool:
        """Whether the cgroup `rel` exists in any hierarchy."""
        return any((h / rel).exists() for h in CGROUP.iterdir())

    def resize(
        self,
        namespace: str,
        name: str,
        container: str,
        *,
        requests: Mapping[str, str] | None = None,
        limits: Mapping[str, str] | None = None,
        timeout: float = 15.0,
    ) -> Obj:
        """Ask for an in-place resize through the pods/resize subresource and wait until the
        kubelet reports it applied; the pod. ApiError when the API refuses it."""
        resources: Obj = {}
        if requests is not None:
            resources["requests"] = dict(requests)
        if limits is not None:
            resources["limits"] = dict(limits)
        patch = {"spec": {"containers": [{"name": container, "resources": resources}]}}
        resized = self.client.patch(
            PODS, name, patch, namespace, patch_type="strategic", subresource="resize"
        )
        wanted = next(
            defaulted_resources(c)
            for c in resized["spec"]["containers"]
            if c.get("name") == container
        )

        def applied(obj: Obj) -> bool:
            for status in (obj.get("status") or {}).get("containerStatuses") or []:
                if status.get("name") == container:
                    return bool(status.get("resources") == wanted)
            return False

        return self.wait_status(
            namespace, name, applied, timeout=timeout, what=f"resize of {container} applied"
        )


def _repository(image: str) -> str:
    """An image without its tag or digest: `reg:5000/busybox:1.36` -> `reg:5000/busybox`."""
    name = image.split("@", 1)[0]
    head, _, last = name.rpartition("/")
    return f"{head}/{last.split(':', 1)[0]}" if head else last.split(":", 1)[0]


def _quota_order(quota: int) -> float:
    """A CFS quota as a size: no quota (-1) is the largest."""
    return float("inf") if quota < 0 else float(quota)


def _running(pod: Obj) -> bool:
    status = pod.get("status") or {}
    containers = (pod.get("spec") or {}).get("containers") or []
    statuses = status.get("containerStatuses") or []
    return (
        status.get("phase") == "Running"
        and len(statuses) == len(containers)
        and all(s.get("ready") and "running" in (s.get("state") or {}) for s in statuses)
    )


def container_status(pod: Obj, container: str) -> Obj:
    """The status of one container of the pod (KeyError when it has none)."""
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == container:
            return dict(status)
    raise KeyError(container)


def condition(pod: Obj, kind: str) -> Obj | None:
    """The pod condition of that type, or None."""
    for item in (pod.get("status") or {}).get("conditions") or []:
        if item.get("type") == kind:
            return dict(item)
    return None
