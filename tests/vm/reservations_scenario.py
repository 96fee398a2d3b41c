"""Guest side of reservations and rebalancing end to end on cgroup v2 (run by
tests/vm/test_vm_reservations.py in a guest with four NUMA nodes).

    python tests/vm/reservations_scenario.py WORKDIR

In the guest, as root: the fake API server (corepin.testing.fakeapi) with corepin's CRDs and a Node;
the stand-in kubelet of `agent_scenario.py` (pods in the API, their cgroups in the kubelet's
cgroupfs layout on the real v2 hierarchy, one `sleep` per container); the real `corepin agent`
(`--rebalance move --evict-on-reservation`) and the real `corepin controller`. Then:

1. rebalancing and its opt-out: four 3-CPU pods fill one NUMA node each, a 2-CPU pod annotated
   `corepin.io/rebalance: never` must straddle two nodes; the first pod goes; the opted-out pod
   stays where it is through several resyncs; once the annotation is removed it is moved live
   onto one node (its cgroup, its process, its memory nodes) with a `CPUMoved` Event;
2. a reservation consumed by its pod: a CPUReservation of 2 CPUs for the pod `db` becomes
   Available (the NodeCPUTopology lists it); `db` gets exactly those CPUs; the reservation goes
   Succeeded and the controller deletes it;
3. TTL expiry: a reservation nobody matches, with a 4 s TTL: Available, its CPUs leave the shared
   pod's CPUs, the controller marks it Expired, the agent drops it and the shared pod gets them
   back;
4. eviction refused by a PodDisruptionBudget: the node is filled so that the pod `victim` cannot
   move; a reservation of exactly its CPUs; the budget refuses the eviction (`CPUEvictionRefused`
   on the pod, the reservation waits); the budget is deleted; the retry evicts the pod and the
   reservation becomes Available with its CPUs.

Prints one JSON line with what the kernel and the API showed at each step (`error` when a step
did not happen) and cleans up (agent, controller, sleeps, cgroups) whatever happened.
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent_scenario import CGROUP, NODE, Kubelet, allowed, parse, start_agent, wait_until

from corepin.core.errors import ApiNotFound
from corepin.kube.client import KubeClient
from corepin.kube.config import load_config
from corepin.kube.resources import CPUR, EVENTS, NCPT, NODES, PDBS, PODS
from corepin.testing.fakeapi import FakeApiServer
from support.kube_helpers import install_crds


def numa_cpus() -> list[set[int]]:
    nodes = sorted(
        Path("/sys/devices/system/node").glob("node[0-9]*"), key=lambda p: int(p.name[4:])
    )
    return [set(parse((n / "cpulist").read_text().strip())) for n in nodes]


def cpus_of(group: str) -> set[int]:
    return set(parse((CGROUP / group / "cpuset.cpus").read_text().strip()))


def mems_of(group: str) -> str:
    return (CGROUP / group / "cpuset.mems").read_text().strip()


def nodes_spanned(cpus: set[int], nodes: list[set[int]]) -> int:
    return sum(1 for n in nodes if n & cpus)


class Cluster:
    """What the scenario reads from the API."""

    def __init__(self, client: KubeClient) -> None:
        self.client = client

    def events(self, reason: str, pod: str) -> list[str]:
        rows = self.client.list(EVENTS, "default").get("items", [])
        return [
            e.get("message", "")
            for e in rows
            if e.get("reason") == reason and e.get("involvedObject", {}).get("name") == pod
        ]

    def cpur(self, name: str) -> dict[str, Any] | None:
        try:
            return self.client.get(CPUR, name)
        except ApiNotFound:
            return None

    def phase(self, name: str) -> str | None:
        obj = self.cpur(name)
        return None if obj is None else (obj.get("status") or {}).get("phase")

    def held(self) -> dict[str, str]:
        """Reservations the node's NodeCPUTopology lists: name -> CPUs."""
        ncpt = self.client.get(NCPT, NODE)
        rows = (ncpt.get("status") or {}).get("reservations") or []
        return {r["name"]: r["cpus"] for r in rows}

    def free(self) -> set[int]:
        ncpt = self.client.get(NCPT, NODE)
        return set(parse((ncpt.get("status") or {}).get("free", "")))

    def reserve(self, name: str, owners: list[dict[str, Any]], **spec: Any) -> None:
        body = {
            "apiVersion": "corepin.io/v1alpha1",
            "kind": "CPUReservation",
            "metadata": {"name": name},
            "spec": {"nodeName": NODE, "owners": owners, **spec},
        }
        self.client.create(CPUR, body)


def start_controller(workdir: Path, kubeconfig: Path) -> subprocess.Popen[bytes]:
    log = (workdir / "controller.log").open("wb")
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "corepin",
            "controller",
            "--kubeconfig",
            str(kubeconfig),
            "--metrics-address",
            "127.0.0.1:19465",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )


def settled(kubelet: Kubelet, pods: dict[str, tuple[Any, int, str]]) -> Callable[[], Any]:
    """A check: every pod's cgroup written and its process allowed exactly that."""

    def check() -> dict[str, set[int]] | None:
        out: dict[str, set[int]] = {}
        for name, (_pod, pid, group) in pods.items():
            mine = cpus_of(group)
            if not mine or set(parse(allowed(pid))) != mine:
                return None
            out[name] = mine
        return out

    return check


def scenario(
    client: KubeClient, kubelet: Kubelet, out: dict[str, Any], alive: Callable[[], None]
) -> None:
    api = Cluster(client)
    nodes = numa_cpus()
    out["numa"] = [sorted(n) for n in nodes]

    def wait(check: Callable[[], Any], seconds: float, what: str) -> Any:
        def guarded() -> Any:
            alive()
            return check()

        return wait_until(guarded, seconds, what)

    # --- 1. rebalancing, with the opt-out first
    pods = {f"fill{i}": kubelet.pod(f"fill{i}", "3") for i in range(len(nodes))}
    pods["shared"] = kubelet.pod("shared", None)
    wait(settled(kubelet, pods), 240, "the fill pods to be pinned")
    pods["moving"] = kubelet.pod("moving", "2", annotations={"corepin.io/rebalance": "never"})
    first = wait(settled(kubelet, pods), 120, "the 2-CPU pod to be pinned")
    moving_group = pods["moving"][2]
    out["straddling"] = sorted(first["moving"])
    if nodes_spanned(first["moving"], nodes) < 2:
        raise SystemExit(f"the 2-CPU pod did not straddle nodes: {sorted(first['moving'])}")
    client.delete(PODS, "fill0", "default")
    del pods["fill0"]
    time.sleep(8)  # four resyncs: a move would have happened
    out["opted_out"] = sorted(cpus_of(moving_group))
    out["opted_out_moved_events"] = api.events("CPUMoved", "moving")
    client.patch(
        PODS, "moving", {"metadata": {"annotations": {"corepin.io/rebalance": None}}}, "default"
    )

    def moved() -> dict[str, Any] | None:
        mine = cpus_of(moving_group)
        pid = pods["moving"][1]
        if nodes_spanned(mine, nodes) != 1 or set(parse(allowed(pid))) != mine:
            return None
        events = api.events("CPUMoved", "moving")
        if not events:
            return None
        return {"cpus": sorted(mine), "mems": mems_of(moving_group), "events": events}

    out["moved"] = wait(moved, 120, "the pod to be moved onto one NUMA node")

    # --- 2. a reservation consumed by its pod
    api.reserve("db-cpus", [{"namespace": "default", "name": "db"}], cpus=2, ttl=600)

    def available(name: str) -> Callable[[], Any]:
        def check() -> dict[str, Any] | None:
            obj = api.cpur(name)
            status = (obj or {}).get("status") or {}
            if status.get("phase") != "Available" or name not in api.held():
                return None
            return {"cpus": status.get("cpus"), "held": api.held()[name]}

        return check

    out["db_available"] = wait(available("db-cpus"), 120, "db-cpus to become Available")
    pods["db"] = kubelet.pod("db", "2")
    got = wait(settled(kubelet, pods), 120, "db to be pinned")
    out["db_cpus"] = sorted(got["db"])
    out["db_reserved"] = sorted(parse(out["db_available"]["cpus"]))
    wait(lambda: api.cpur("db-cpus") is None, 120, "the consumed reservation to be deleted")
    out["db_consumed"] = True

    # --- 3. TTL expiry
    api.reserve("short", [{"namespace": "nobody"}], cpus=2, ttl=4)
    short = wait(available("short"), 60, "short to become Available")
    out["short_available"] = short
    held = set(parse(short["cpus"]))
    shared_pid = pods["shared"][1]
    out["shared_without"] = wait(
        lambda: allowed(shared_pid) if not set(parse(allowed(shared_pid))) & held else None,
        60,
        "the shared pod to leave the reserved CPUs",
    )
    out["short_expired"] = wait(
        lambda: api.phase("short") == "Expired", 60, "short to be marked Expired"
    )
    out["shared_back"] = wait(
        lambda: allowed(shared_pid) if held <= set(parse(allowed(shared_pid))) else None,
        60,
        "the shared pod to get the expired reservation's CPUs back",
    )
    out["short_dropped"] = wait(lambda: "short" not in api.held(), 60, "short to leave the NCPT")

    # --- 4. eviction refused by a PodDisruptionBudget, then allowed
    pods["victim"] = kubelet.pod("victim", "2", labels={"app": "victim"})
    got = wait(settled(kubelet, pods), 120, "victim to be pinned")
    victim = got["victim"]
    free = api.free()
    spare = len(free) - 1  # leaves one CPU for the shared pool, none for a moved victim
    if spare > 0:
        pods["filler"] = kubelet.pod("filler", str(spare))
        wait(settled(kubelet, pods), 120, "the filler to be pinned")
    budget = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "keep-victim"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "victim"}}},
    }
    client.create(PDBS, budget, "default")
    cpu_set = ",".join(str(c) for c in sorted(victim))
    api.reserve("next", [{"name": "next"}], cpuSet=cpu_set)
    out["refused"] = wait(
        lambda: api.events("CPUEvictionRefused", "victim"), 120, "the eviction to be refused"
    )
    out["victim_kept"] = client.get(PODS, "victim", "default")["metadata"]["name"]
    out["next_waiting"] = api.phase("next")
    client.delete(PDBS, "keep-victim", "default")

    def evicted() -> bool:
        try:
            client.get(PODS, "victim", "default")
        except ApiNotFound:
            return True
        return False

    out["evicted"] = wait(evicted, 120, "the victim to be evicted once the budget is gone")
    out["next_available"] = wait(available("next"), 120, "next to become Available")


def main(workdir: Path) -> int:
    workdir.mkdir(parents=True, exist_ok=True)
    out: dict[str, Any] = {}
    with FakeApiServer(bookmark_interval=0.5) as api:
        kubeconfig = api.write_kubeconfig(workdir / "kubeconfig")
        client = KubeClient.from_config(load_config(kubeconfig, env={}), timeout=30)
        install_crds(client)
        client.create(NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
        kubelet = Kubelet(client)
        agent = start_agent(
            workdir,
            kubeconfig,
            metrics_port=19464,
            extra=("--rebalance", "move", "--rebalance-rate", "60", "--evict-on-reservation"),
        )
        controller = start_controller(workdir, kubeconfig)

        def alive() -> None:
            for name, proc in (("agent", agent), ("controller", controller)):
                if proc.poll() is not None:
                    raise SystemExit(f"the {name} exited {proc.returncode}")

        try:
            scenario(client, kubelet, out, alive)
        except SystemExit as exc:
            out["error"] = str(exc.code)
        finally:
            for name, proc in (("agent", agent), ("controller", controller)):
                proc.send_signal(signal.SIGTERM)
                try:
                    out[f"{name}_exit"] = proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    out[f"{name}_exit"] = proc.wait()
            kubelet.close()
            for name in ("agent", "controller"):
                with contextlib.suppress(OSError):
                    text = (workdir / f"{name}.log").read_text()
                    out[f"{name}_tracebacks"] = text.count("Traceback")
                    out[f"{name}_log_tail"] = text[-3000:]
            client.close()
    print(json.dumps(out))
    return 1 if "error" in out else 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/reservations-e2e")))
