"""Guest side of the node agent end to end on cgroup v2 (run by tests/vm/test_vm_numa4_smt2.py).

    python tests/vm/agent_scenario.py WORKDIR

In the guest, as root, on the real cgroup v2 hierarchy:
1. the fake API server (corepin.testing.fakeapi) on the guest's loopback, corepin's CRDs and a Node;
2. a stand-in kubelet: pods in the API, their cgroups in the kubelet's cgroupfs layout under a
   scratch kubelet cgroup root (`/sys/fs/cgroup/corepin-e2e/kubepods/...`, +cpuset +cpu in each
   parent's subtree_control), one `sleep` process per container moved into its container's
   cgroup.procs, and a Running pod status naming the containers;
3. the real `corepin agent` process (default --cgroup-root: it finds the v2 hierarchy itself);
4. waits until the kernel shows every process pinned (/proc/PID/status), deletes the exclusive
   pods, waits for the burstable one to get the whole machine back;
5. prints one JSON line with what the kernel showed at each step, and cleans up (agent, sleeps,
   cgroups) whatever happened.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS))


from corepin.enforcement.layout import container_cgroup_path, pod_cgroup_path  # noqa: E402
from corepin.kube.client import KubeClient  # noqa: E402
from corepin.kube.config import load_config  # noqa: E402
from corepin.kube.resources import NODES, PODS  # noqa: E402
from corepin.testing.fakeapi import FakeApiServer  # noqa: E402
from support import pods  # noqa: E402
from support.kube_helpers import install_crds  # noqa: E402
from support.node_harness import qos_of  # noqa: E402

CGROUP = Path("/sys/fs/cgroup")
KUBELET_ROOT = "corepin-e2e"
NODE = "vm-node"


def allowed(pid: int) -> str:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return line.split(":", 1)[1].strip()
    return ""


def parse(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        if part:
            lo, _, hi = part.partition("-")
            out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def enable(group: Path) -> None:
    (group / "cgroup.subtree_control").write_text("+cpuset +cpu")


class Kubelet:
    """Pods in the API and in the cgroup tree, with one sleeping process per container."""

    def __init__(self, client: KubeClient) -> None:
        self.client = client
        self.procs: list[subprocess.Popen[bytes]] = []
        self.groups: list[Path] = []
        enable(CGROUP)
        for rel in (KUBELET_ROOT, f"{KUBELET_ROOT}/kubepods", f"{KUBELET_ROOT}/kubepods/burstable"):
            self.mkdir(CGROUP / rel)
            enable(CGROUP / rel)

    def mkdir(self, path: Path) -> None:
        path.mkdir(exist_ok=True)
        self.groups.append(path)

    def pod(
        self,
        name: str,
        cpu: str | None,
        *,
        annotations: dict[str, str] | None = None,
        labels: dict[str, str] | None = None,
    ) -> tuple[dict[str, Any], int, str]:
        app = pods.container  # (without a CPU: burstable, a request without a limit)
        spec = app("app", cpu, memory="64Mi") if cpu else app("app", request="100m")
        # corepin pins a Guaranteed pod's containers exclusively when the pod asks
        notes = {**(pods.EXCLUSIVE if cpu else {}), **(annotations or {})}
        body = pods.pod(name, spec, annotations=notes, labels=labels, node=NODE)
        pod = self.client.create(PODS, body, "default")
        qos = qos_of(pod["spec"]["containers"]).lower()
        uid = pod["metadata"]["uid"]
        pod_dir = CGROUP / pod_cgroup_path("cgroupfs", qos, uid, cgroup_root=KUBELET_ROOT)
        self.mkdir(pod_dir)
        enable(pod_dir)
        cid = secrets.token_hex(32)
        ctr = CGROUP / container_cgroup_path(
            "cgroupfs", qos, uid, "containerd", cid, cgroup_root=KUBELET_ROOT
        )
        self.mkdir(ctr)
        proc = subprocess.Popen(["sleep", "600"])
        self.procs.append(proc)
        (ctr / "cgroup.procs").write_text(str(proc.pid))
        status = {
            "phase": "Running",
            "qosClass": qos_of(pod["spec"]["containers"]),
            "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [pods.running_container("app", cid)],
        }
        self.client.patch_status(PODS, name, {"status": status}, "default")
        return pod, proc.pid, str(ctr.relative_to(CGROUP))

    def close(self) -> None:
        for proc in self.procs:
            proc.kill()
            proc.wait()
        for group in reversed(self.groups):
            for _ in range(50):
                try:
                    group.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)


def wait_until(check: Any, seconds: float, what: str) -> Any:
    deadline = time.monotonic() + seconds
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out after {seconds:.0f}s waiting for {what}")
        time.sleep(0.2)


def start_agent(
    workdir: Path, kubeconfig: Path, *, metrics_port: int, extra: tuple[str, ...] = ()
) -> subprocess.Popen[bytes]:
    """The real `corepin agent` of NODE on the scratch kubelet root, its files under `workdir`
    (log in agent.log), resyncing every 5 s (2 s with `extra` flags given)."""
    log = (workdir / "agent.log").open("wb")
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "corepin",
            "agent",
            "--node-name",
            NODE,
            "--kubeconfig",
            str(kubeconfig),
            "--kubelet-cgroup-root",
            "/" + KUBELET_ROOT,
            "--cgroup-driver",
            "cgroupfs",
            "--state-dir",
            str(workdir / "state"),
            "--kubelet-state",
            str(workdir / "no-kubelet-state"),
            "--grpc-socket",
            str(workdir / "agent.sock"),
            "--metrics-address",
            f"127.0.0.1:{metrics_port}",
            "--assignment-dir",
            str(workdir / "assignments"),
            "--resync-period",
            "2" if extra else "5",
            *extra,
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )


def main(workdir: Path) -> int:
    workdir.mkdir(parents=True, exist_ok=True)
    online = Path("/sys/devices/system/cpu/online").read_text().strip()
    out: dict[str, Any] = {"online": online}
    with FakeApiServer(bookmark_interval=0.5) as api:
        kubeconfig = api.write_kubeconfig(workdir / "kubeconfig")
        client = KubeClient.from_config(load_config(kubeconfig, env={}), timeout=30)
        install_crds(client)
        client.create(NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
        kubelet = Kubelet(client)
        agent: subprocess.Popen[bytes] | None = None
        try:
            pods = {
                "big": kubelet.pod("big", "4"),
                "small": kubelet.pod("small", "2"),
                "shared": kubelet.pod("shared", None),
            }
            agent = start_agent(workdir, kubeconfig, metrics_port=19464)

            def pinned() -> dict[str, Any] | None:
                seen = {}
                for name, (_pod, pid, group) in pods.items():
                    seen[name] = {
                        "allowed": allowed(pid),
                        "cpus": (CGROUP / group / "cpuset.cpus").read_text().strip(),
                        "mems": (CGROUP / group / "cpuset.mems").read_text().strip(),
                    }
                # settled: every group written, the shared one off the exclusive CPUs, and
                # each process allowed what its group says (read one after the other, so an
                # agent write between the two reads is looked at again; a process outside its
                # group never settles)
                mine = [set(parse(seen[n]["cpus"])) for n in ("big", "small", "shared")]
                agree = all(
                    set(parse(v["allowed"])) == set(parse(v["cpus"])) for v in seen.values()
                )
                if all(mine) and not (mine[0] | mine[1]) & mine[2] and agree:
                    return seen
                if agent is not None and agent.poll() is not None:
                    raise SystemExit(f"the agent exited {agent.returncode}")
                return None

            out["pinned"] = wait_until(pinned, 240, "the agent to pin the three pods")
            for name in ("big", "small"):
                client.delete(PODS, name, "default")

            def grown() -> dict[str, Any] | None:
                pid = pods["shared"][1]
                got = allowed(pid)
                return {"allowed": got} if got == online else None

            out["after_delete"] = wait_until(grown, 240, "the shared pool to grow back")
        except SystemExit as exc:
            out["error"] = str(exc.code)
        finally:
            if agent is not None:
                agent.send_signal(signal.SIGTERM)
                try:
                    out["agent_exit"] = agent.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    agent.kill()
                    out["agent_exit"] = agent.wait()
            kubelet.close()
            with contextlib.suppress(OSError):
                out["agent_log_tail"] = (workdir / "agent.log").read_text()[-3000:]
            client.close()
    print(json.dumps(out))
    return 1 if "error" in out else 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/agent-e2e")))
