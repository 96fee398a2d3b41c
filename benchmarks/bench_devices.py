"""Placement quality near devices: the share of GPU pods whose CPUs sit on their GPU's NUMA node.

The machine: 2 sockets, one NUMA node and L3 each, 16 cores x 2 threads per socket (64 CPUs), a
GPU on each node. The trace (seeded, one node, no cluster): pods ask for one of the two GPUs
(alternating) and 4-16 exclusive CPUs; while the pods alive ask for more than `--load` of the
machine's CPUs, random ones leave (churn), so the machine stays busy and fragments. Every
policy replays the same trace through the node's pool model and the decision host mode and the
node agent make (`corepin.allocation.decide`):

- `topology-aware + near`: corepin's default policy told the GPU's CPUs (`Request.near`,
  preferred, as `corepin run --near nvidiaN` asks);
- `topology-aware`: the same policy without device knowledge;
- `kubelet-static`: the kubelet's static CPU manager (no device knowledge either).

A pod counts as aligned when all its CPUs are on its GPU's NUMA node; the share is over the
admitted pods. Target (issue 18): >= 0.95 for `topology-aware + near`.

    python benchmarks/bench_devices.py [--pods N] [--seeds N] [--load F] [--quick]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from dataclasses import dataclass

import _common
from corepin.allocation.decide import decide
from corepin.allocation.near import device_cpus
from corepin.allocation.policies import get_policy
from corepin.allocation.pools import NodePools
from corepin.allocation.types import Request
from corepin.core.cpuset import CPUSet
from corepin.core.errors import AllocationError
from corepin.testing.devices import gpu, with_devices
from corepin.testing.machines import SyntheticSpec, synthetic
from corepin.topology.model import Topology

TARGET = 0.95
#: (label, policy, whether the request carries the GPU's CPUs)
CONTENDERS = (
    ("topology-aware + near", "topology-aware", True),
    ("topology-aware", "topology-aware", False),
    ("kubelet-static", "kubelet-static", False),
)


def machine() -> Topology:
    base = synthetic(SyntheticSpec(sockets=2, cores_per_l3=16))
    return with_devices(base, gpu("0000:17:00.0", numa=0, index=0), gpu("0000:b1:00.0", numa=1))


@dataclass(frozen=True)
class Add:
    pod: str
    gpu: int | None  # None: a pod without a GPU
    cpus: int


@dataclass(frozen=True)
class Remove:
    pod: str


def trace(
    topology: Topology, pods: int, seed: int, load: float, cpu_only: float
) -> list[Add | Remove]:
    """`pods` adds of 4-16 CPUs: GPU pods alternate between the GPUs, a share `cpu_only` of
    the pods has no GPU. Churn: before each add, random live pods leave while the add would
    take the CPUs the live pods ask for over `load` of the machine, or those its GPU's pods ask
    for over `load` of the GPU's NUMA node (as a device plugin sized to the node would)."""
    rng = random.Random(seed)
    total = len(topology.online_cpus) * load
    per_gpu = total / 2
    live: dict[str, Add] = {}
    events: list[Add | Remove] = []
    turn = 0
    for i in range(pods):
        want = rng.randint(4, 16)
        card: int | None = None
        if rng.random() >= cpu_only:
            card, turn = turn, 1 - turn

        while live and _over(live, want, card, total, per_gpu):
            gone = rng.choice(sorted(live))
            del live[gone]
            events.append(Remove(gone))
        add = Add(f"pod-{i}", card, want)
        live[add.pod] = add
        events.append(add)
    return events


def _over(live: dict[str, Add], want: int, card: int | None, total: float, per_gpu: float) -> bool:
    """Whether adding `want` CPUs for GPU `card` takes the live pods over their limits."""
    if sum(a.cpus for a in live.values()) + want > total:
        return True
    mine = sum(a.cpus for a in live.values() if card is not None and a.gpu == card)
    return card is not None and mine + want > per_gpu


@dataclass
class Score:
    admitted: int = 0
    rejected: int = 0
    aligned: int = 0

    @property
    def share(self) -> float:
        return self.aligned / self.admitted if self.admitted else 0.0


def replay(topology: Topology, events: list[Add | Remove], policy_name: str, near: bool) -> Score:
    policy = get_policy(policy_name)
    gpus = [d for d in topology.devices if d.kind == "gpu"]
    near_of = [device_cpus(topology, d) for d in gpus]
    node_of = [topology.cpus_in_numa_nodes(d.numa) for d in gpus if d.numa is not None]
    pools = NodePools.for_topology(topology)
    held: dict[str, CPUSet] = {}
    score = Score()
    for event in events:
        if isinstance(event, Remove):
            freed = held.pop(event.pod, None)
            if freed is not None:
                pools = pools.release("exclusive", freed)
            continue
        card = event.gpu
        request = Request(event.cpus, near=near_of[card] if near and card is not None else None)
        try:
            d = decide(pools, topology, request, policy, kind="exclusive")
        except AllocationError:
            score.rejected += card is not None
            continue
        pools = pools.hold("exclusive", d.withheld)
        held[event.pod] = d.withheld
        if card is None:
            continue
        score.admitted += 1
        score.aligned += d.cpus <= node_of[card]
    return score


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pods", type=int, default=2000, help="pods per trace (default 2000)")
    parser.add_argument("--seeds", type=int, default=5, help="traces (default 5)")
    parser.add_argument(
        "--load",
        type=float,
        default=0.9,
        help="share of the CPUs (and of each GPU's node) the live pods ask for at most "
        "(default 0.9)",
    )
    parser.add_argument(
        "--cpu-only",
        type=float,
        default=0.25,
        help="share of pods without a GPU in the second scenario (default 0.25)",
    )
    parser.add_argument("--quick", action="store_true", help="CI smoke run: 200 pods, 1 trace")
    args = parser.parse_args(argv)
    pods, seeds = (200, 1) if args.quick else (args.pods, args.seeds)
    topo = machine()
    print(
        f"machine: {len(topo.online_cpus)} CPUs, 2 sockets / NUMA nodes, GPUs "
        + ", ".join(f"{d.address} on node {d.numa}" for d in topo.devices)
    )
    print(
        f"trace: {pods} pods x {seeds} seed(s), 4-16 exclusive CPUs each, GPU 0/1 alternating, "
        f"live demand <= {args.load:.0%} of the CPUs"
    )
    began = time.perf_counter()
    ours = 0.0
    for title, cpu_only in (
        ("GPU pods only", 0.0),
        (f"{args.cpu_only:.0%} of pods without a GPU", args.cpu_only),
    ):
        totals = {label: Score() for label, _, _ in CONTENDERS}
        for seed in range(seeds):
            events = trace(topo, pods, seed, args.load, cpu_only)
            for label, policy, near in CONTENDERS:
                s = replay(topo, events, policy, near)
                t = totals[label]
                t.admitted += s.admitted
                t.rejected += s.rejected
                t.aligned += s.aligned
        rows = [("policy", "GPU pods admitted", "rejected", "on the GPU's node", "share")]
        for label, _, _ in CONTENDERS:
            t = totals[label]
            rows.append((label, str(t.admitted), str(t.rejected), str(t.aligned), f"{t.share:.3f}"))
        print(f"\n{title}:")
        print(_common.table(rows))
        if cpu_only == 0.0:
            ours = totals[CONTENDERS[0][0]].share
    print(f"\n({time.perf_counter() - began:.1f} s)")
    verdict = "met" if ours >= TARGET else "MISSED"
    print(
        f"target: topology-aware + near, GPU pods on their GPU's node >= {TARGET}: {ours:.3f} "
        f"({verdict})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
