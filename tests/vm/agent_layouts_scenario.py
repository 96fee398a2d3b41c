"""Guest side of the node agent on cgroup v2 in layouts beside the kubelet's plain one (run by
tests/vm/test_vm_agent_v2_layouts.py).

    python tests/vm/agent_layouts_scenario.py WORKDIR

Like agent_scenario.py (the fake API server, a stand-in kubelet with pods in the cgroupfs
layout under a scratch kubelet root, the real `corepin agent`), but the containers' cgroups are
laid out the ways v2 allows below a pod:

- `big` (exclusive, 4 CPUs): a threaded subtree below its container group - the container's
  process keeps its main thread in the container group and moves a worker thread into a
  threaded child `worker` with a `cpuset.cpus` of its own (every CPU);
- `shared` (burstable): the container group is an inner group - its process sits in a child
  `init.scope` (cpuset handed down, the child's own `cpuset.cpus` empty, inheriting), as with
  an init system inside the container;
- `small` (exclusive, 2 CPUs): plain, but once pinned someone gives its pod group (empty,
  inheriting) CPUs of its own that leave the container's out; the kernel then gives the
  container its pod group's CPUs, and the agent's next resync must take it back.

Prints one JSON line with what the kernel showed at each step (every thread's
Cpus_allowed_list, the groups' files) and cleans up whatever happened.
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from agent_scenario import (
    CGROUP,
    NODE,
    Kubelet,
    allowed,
    parse,
    start_agent,
    wait_until,
)

from corepin.kube.client import KubeClient
from corepin.kube.config import load_config
from corepin.kube.resources import NODES, PODS
from corepin.testing.fakeapi import FakeApiServer
from support.kube_helpers import install_crds

#: a process with a second thread that writes its thread id to argv[1] and sleeps
TWO_THREADS = (
    "import sys, threading, time\n"
    "def work():\n"
    "    open(sys.argv[1] + '.tmp', 'w').write(str(threading.get_native_id()))\n"
    "    __import__('os').rename(sys.argv[1] + '.tmp', sys.argv[1])\n"
    "    time.sleep(600)\n"
    "threading.Thread(target=work, daemon=True).start()\n"
    "time.sleep(600)\n"
)


def thread_allowed(pid: int, tid: int) -> str:
    for line in Path(f"/proc/{pid}/task/{tid}/status").read_text().splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return line.split(":", 1)[1].strip()
    return ""


def read(group: Path, name: str) -> str:
    try:
        return (group / name).read_text().strip()
    except OSError as err:
        return f"error: {err.strerror}"


class Layouts:
    """Rearranges the stand-in kubelet's container groups into the layouts above."""

    def __init__(self, kubelet: Kubelet, workdir: Path) -> None:
        self.kubelet = kubelet
        self.workdir = workdir
        self.extra: list[subprocess.Popen[bytes]] = []

    def threaded_worker(self, ctr: Path, old_pid: int) -> tuple[int, int, Path]:
        """Replace the container's process by a two-thread one; its worker thread goes into a
        threaded child `worker` with every CPU in its own cpuset.cpus."""
        tid_file = self.workdir / "worker.tid"
        proc = subprocess.Popen([sys.executable, "-c", TWO_THREADS, str(tid_file)])
        self.extra.append(proc)
        (ctr / "cgroup.procs").write_text(str(proc.pid))
        tid = int(wait_until(lambda: tid_file.exists() and tid_file.read_text(), 60, "a tid"))
        subprocess.run(["kill", str(old_pid)], check=False)
        worker = ctr / "worker"
        self.kubelet.mkdir(worker)
        (worker / "cgroup.type").write_text("threaded")
        (ctr / "cgroup.subtree_control").write_text("+cpuset")
        (worker / "cpuset.cpus").write_text(Path("/sys/devices/system/cpu/online").read_text())
        (worker / "cgroup.threads").write_text(str(tid))
        return proc.pid, tid, worker

    def inner(self, ctr: Path, pid: int) -> Path:
        """Move the container's process into a child `init.scope`; cpuset handed down."""
        scope = ctr / "init.scope"
        self.kubelet.mkdir(scope)
        (scope / "cgroup.procs").write_text(str(pid))
        (ctr / "cgroup.subtree_control").write_text("+cpuset")
        return scope

    def close(self) -> None:
        for proc in self.extra:
            proc.kill()
            proc.wait()


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
        layouts = Layouts(kubelet, workdir)
        agent: subprocess.Popen[bytes] | None = None
        try:
            _big_pod, big_old, big_group = kubelet.pod("big", "4")
            _small_pod, small_pid, small_group = kubelet.pod("small", "2")
            _shared_pod, shared_pid, shared_group = kubelet.pod("shared", None)
            big_ctr, small_ctr, shared_ctr = (
                CGROUP / g for g in (big_group, small_group, shared_group)
            )
            big_pid, worker_tid, worker = layouts.threaded_worker(big_ctr, big_old)
            scope = layouts.inner(shared_ctr, shared_pid)
            out["layout"] = {
                "big": read(big_ctr, "cgroup.type"),
                "worker": read(worker, "cgroup.type"),
                "shared": read(shared_ctr, "cgroup.type"),
                "scope": read(scope, "cgroup.type"),
                "scope_cpus": read(scope, "cpuset.cpus"),
            }
            agent = start_agent(workdir, kubeconfig, metrics_port=19465)

            def snapshot() -> dict[str, Any]:
                return {
                    "big": read(big_ctr, "cpuset.cpus"),
                    "big_main": thread_allowed(big_pid, big_pid),
                    "big_worker": thread_allowed(big_pid, worker_tid),
                    "worker_cpus": read(worker, "cpuset.cpus"),
                    "small": read(small_ctr, "cpuset.cpus"),
                    "small_proc": allowed(small_pid),
                    "shared": read(shared_ctr, "cpuset.cpus"),
                    "shared_proc": allowed(shared_pid),
                    "shared_in": read(Path(f"/proc/{shared_pid}"), "cgroup"),
                }

            def settled() -> dict[str, Any] | None:
                seen = snapshot()
                if any(seen[k].startswith("error") for k in ("big", "small", "shared")):
                    return None
                big, small, shared = (set(parse(seen[k])) for k in ("big", "small", "shared"))
                pinned = len(big) == 4 and len(small) == 2 and shared and not (big | small) & shared
                # every thread allowed what its group says (the worker: within big's CPUs)
                follow = (
                    set(parse(seen["big_main"])) == big
                    and set(parse(seen["big_worker"])) <= big
                    and set(parse(seen["small_proc"])) == small
                    and set(parse(seen["shared_proc"])) == shared
                )
                if pinned and follow:
                    return seen
                if agent is not None and agent.poll() is not None:
                    raise SystemExit(f"the agent exited {agent.returncode}")
                return None

            out["pinned"] = wait_until(settled, 240, "the agent to pin the three pods")
            # someone narrows small's (inheriting) pod group to CPUs that leave its own out
            small_cpus = set(parse(out["pinned"]["small"]))
            elsewhere = sorted(set(parse(online)) - small_cpus - set(parse(out["pinned"]["big"])))
            pod_group = small_ctr.parent
            out["pod_group_before"] = read(pod_group, "cpuset.cpus")
            (pod_group / "cpuset.cpus").write_text(str(elsewhere[0]))
            time.sleep(0.2)
            out["narrowed"] = {
                "small": read(small_ctr, "cpuset.cpus"),
                "effective": read(small_ctr, "cpuset.cpus.effective"),
                "small_proc": allowed(small_pid),
            }

            def back() -> dict[str, Any] | None:
                got = allowed(small_pid)
                if set(parse(got)) == small_cpus:
                    return {"small_proc": got, "pod_group": read(pod_group, "cpuset.cpus")}
                return None

            out["repaired"] = wait_until(back, 120, "the agent to take small back to its CPUs")
            for name in ("big", "small"):
                client.delete(PODS, name, "default")

            def grown() -> dict[str, Any] | None:
                got = allowed(shared_pid)
                return {"shared_proc": got} if got == online else None

            out["after_delete"] = wait_until(grown, 240, "the shared pool to grow back")
        except SystemExit as exc:
            out["error"] = str(exc.code)
            with contextlib.suppress(Exception):
                out["last"] = snapshot()
        finally:
            if agent is not None:
                agent.send_signal(signal.SIGTERM)
                try:
                    out["agent_exit"] = agent.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    agent.kill()
                    out["agent_exit"] = agent.wait()
            layouts.close()
            kubelet.close()
            with contextlib.suppress(OSError):
                log_text = (workdir / "agent.log").read_text()
                out["agent_log_tail"] = log_text[-3000:]
                out["tracebacks"] = log_text.count("Traceback")
            client.close()
    print(json.dumps(out))
    return 1 if "error" in out else 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/agent-layouts")))
