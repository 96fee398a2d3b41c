"""The parts of the development stand-in cluster (`corepin.testing.cluster`) that are not the
kubelet: the nodes' synthetic machines, corepin's CRDs from the checkout, the sample pods and
the table of where they landed.

A node's machine is synthetic (a sysfs tree written by `corepin.testing.sysfs_tree`, read by
the agent through `--sysfs-root`), but its CPU and memory-node ids are this host's: the agent
writes them into real cpusets, and the kernel accepts only CPUs and memory nodes that exist. So
the host's CPUs are split into two sockets (each its own L3; two threads per core when a socket
has four CPUs or more); with one memory node on the host both sockets share it, as a two-socket
machine with node interleaving does. Every node of the stand-in cluster is such a machine,
each in its own scratch cgroup subtree.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

import corepin
from corepin.core.cpuset import CPUSet
from corepin.core.errors import EnvironmentProblem
from corepin.testing.cluster_kubelet import CGROUP, allowed_cpus
from corepin.topology.model import CPUInfo, NUMANode, Topology

Obj = dict[str, Any]
NAMESPACE = "default"
SCHEDULER = "corepin-scheduler"


# ---------------------------------------------------------------------- machines
def host_cpus_and_mems(version: int, base: Path = CGROUP) -> tuple[CPUSet, CPUSet]:
    """The CPUs and memory nodes a scratch cgroup can be given on this host."""
    if version == 2:
        cpus = (base / "cpuset.cpus.effective").read_text()
        mems = (base / "cpuset.mems.effective").read_text()
    else:
        cpus = (base / "cpuset" / "cpuset.cpus").read_text()
        mems = (base / "cpuset" / "cpuset.mems").read_text()
    return CPUSet.parse(cpus.strip()), CPUSet.parse(mems.strip())


def fitted_machine(cpus: CPUSet, mems: CPUSet, name: str) -> Topology:
    """A two-socket machine on exactly `cpus` and `mems` (see the module docstring)."""
    ids, nodes = sorted(cpus), sorted(mems) or [0]
    sockets = 2 if len(ids) >= 2 else 1
    per_socket = len(ids) // sockets
    infos: list[CPUInfo] = []
    numa_cpus: dict[int, list[int]] = {}
    core_counter = 0
    for socket in range(sockets):
        end = (socket + 1) * per_socket if socket + 1 < sockets else len(ids)
        mine = ids[socket * per_socket : end]
        numa = nodes[socket] if len(nodes) >= sockets else nodes[0]
        threads = 2 if len(mine) >= 4 and len(mine) % 2 == 0 else 1
        for start in range(0, len(mine), threads):
            core_cpus = mine[start : start + threads]
            for cpu in core_cpus:
                infos.append(
                    CPUInfo(
                        cpu,
                        socket=socket,
                        die=0,
                        numa=numa,
                        l3=socket,
                        l2=core_counter,
                        core=core_cpus[0],
                    )
                )
                numa_cpus.setdefault(numa, []).append(cpu)
            core_counter += 1
    numa_nodes = [
        NUMANode(
            n,
            cpus=CPUSet(numa_cpus.get(n, [])),
            distances={m: 10 if m == n else 21 for m in numa_cpus},
        )
        for n in sorted(numa_cpus)
    ]
    return Topology(infos, numa_nodes, name=name)


# ---------------------------------------------------------------------- CRDs
def crd_directory() -> Path:
    """deploy/crd of the checkout corepin runs from (an editable install or the source tree)."""
    checkout = Path(corepin.__file__).resolve().parents[2]
    found = checkout / "deploy" / "crd"
    if not (found / "nodecputopologies.yaml").exists():
        raise EnvironmentProblem(
            f"corepin's CRDs are not at {found}: the stand-in cluster runs from a corepin "
            "checkout (make venv, or pip install -e .)"
        )
    return found


def crds() -> list[Obj]:
    """corepin's CustomResourceDefinitions as deploy/crd ships them."""
    out = []
    for path in sorted(crd_directory().glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and doc.get("kind") == "CustomResourceDefinition":
                out.append(doc)
    return out


# ---------------------------------------------------------------------- sample pods
def _pod(name: str, cpu: str, limit: str, annotations: Mapping[str, str], note: str) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "labels": {"app.kubernetes.io/part-of": "corepin-standin-demo"},
            "annotations": {**annotations, "corepin-standin/what": note},
        },
        "spec": {
            "schedulerName": SCHEDULER,
            "containers": [
                {
                    "name": "app",
                    "image": "busybox",
                    "command": ["sleep", "86400"],
                    "resources": {
                        "requests": {"cpu": cpu, "memory": "64Mi"},
                        "limits": {"cpu": limit, "memory": "64Mi"},
                    },
                }
            ],
        },
    }


def sample_pods() -> list[Obj]:
    """The sample pods: what corepin does with each is in its `corepin-standin/what` note."""
    exclusive = {"corepin.io/cpu-policy": "exclusive"}
    return [
        _pod("demo-exclusive", "1", "1", exclusive, "exclusive: whole CPUs of its own"),
        _pod(
            "demo-memory-bound",
            "1",
            "1",
            {**exclusive, "corepin.io/workload-type": "memory-bound"},
            "exclusive, workload-aware: kept off sockets busy with memory-bound work",
        ),
        _pod(
            "demo-share",
            "1",
            "1",
            {"corepin.io/cpu-policy": "share"},
            "share: a CPU of its own that stays in the shared pool for others",
        ),
        _pod(
            "demo-ineligible",
            "250m",
            "500m",
            exclusive,
            "asks for exclusive CPUs but its limit is not its request: shared pool",
        ),
    ]


EXCLUSIVE_SAMPLES = ("demo-exclusive", "demo-memory-bound")
#: pinned to CPUs of their own that others may share
SHARE_SAMPLES = ("demo-share",)


# ---------------------------------------------------------------------- where they landed
def rows(
    pods: list[Obj], ncpts: list[Obj], pid_of: Any
) -> list[tuple[str, str, str, str, str, str]]:
    """(pod, node, policy, CPUs corepin gave, CPUs the kernel allows its process, mems) per
    sample container; `pid_of(uid, container)` is the stand-in kubelet's process id."""
    held: dict[tuple[str, str], Obj] = {}
    for ncpt in ncpts:
        for row in (ncpt.get("status") or {}).get("allocations") or []:
            held[(row.get("podUID", ""), row.get("container", ""))] = row
    out = []
    for pod in sorted(pods, key=lambda p: p["metadata"]["name"]):
        uid = pod["metadata"]["uid"]
        node = pod["spec"].get("nodeName") or "(pending)"
        for container in pod["spec"]["containers"]:
            row = held.get((uid, container["name"]))
            pid = pid_of(uid, container["name"])
            out.append(
                (
                    pod["metadata"]["name"],
                    node,
                    str(row["policy"]) if row else "shared pool",
                    str(row.get("cpus", "")) if row else "-",
                    allowed_cpus(pid) if pid else "-",
                    str(row.get("mems", "")) if row else "-",
                )
            )
    return out


def table(lines: list[tuple[str, ...]], header: tuple[str, ...]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *lines, strict=False)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join(fmt.format(*r).rstrip() for r in [header, *lines])


def settled(landed: list[tuple[str, str, str, str, str, str]]) -> bool:
    """Every sample placed and running, the exclusive ones pinned where corepin says (the
    kernel agrees), the others in a shared pool off those CPUs."""
    if not landed or any(r[1] == "(pending)" or r[4] in ("", "-") for r in landed):
        return False
    exclusive_cpus: dict[str, set[int]] = {}
    for name, node, policy, cpus, allowed, _mems in landed:
        if name in EXCLUSIVE_SAMPLES:
            if policy != "exclusive" or CPUSet.parse(allowed) != CPUSet.parse(cpus):
                return False
            exclusive_cpus.setdefault(node, set()).update(CPUSet.parse(cpus))
    for name, node, policy, cpus, allowed, _mems in landed:
        if name in SHARE_SAMPLES and (
            policy != "share" or CPUSet.parse(allowed) != CPUSet.parse(cpus)
        ):
            return False
        if name not in EXCLUSIVE_SAMPLES and set(CPUSet.parse(allowed)) & exclusive_cpus.get(
            node, set()
        ):
            return False
    return True
