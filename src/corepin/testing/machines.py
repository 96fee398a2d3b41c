"""Synthetic machines for tests and benchmarks (pure: a spec in, a `Topology` out).

A `SyntheticSpec` describes a regular machine: sockets x dies x NUMA nodes x L3 instances x
cores x threads, optionally hybrid (efficiency cores after the performance cores of each L3),
with offline and isolated CPUs and memory-only NUMA nodes, and cores that share an L2 in groups
(`cores_per_l2`: AMD family 15h compute units). A `ClusterSpec` describes an arm64 SoC of CPU
clusters (big.LITTLE, DynamIQ) whose kernel may number every cluster as a package while one L3
and one NUMA node span them all. `synthetic(spec)` / `clustered(spec)` build them with the same
identifier conventions discovery produces, so `discover(write_sysfs_tree(synthetic(s)))` gives
back an equal topology (see `corepin.testing.sysfs_tree`; compute units need the kernel's own
files, `compute_unit_files`):

- `core` = the lowest online CPU of the core; `l3`, `l2`: counters over the machine in core
  order (every instance unique); `numa`: 0.. in socket order, memory-only nodes after them;
  `die`: 0.. inside each socket; `socket`: `socket_ids` (default 0..sockets-1).
- NUMA distances: 10 local, 11 same die, 12 same socket, 21 other socket; memory-only node m is
  attached to socket `m % sockets` (14 from there, 24 from elsewhere, 30 between memory nodes).
- numbering `"interleaved"` (Linux x86 style): thread 0 of every core in machine order, then
  thread 1 of every core, ...; `"linear"`: the threads of a core are consecutive.
- Offline CPUs keep only `online=False` (and `isolated`); NUMA node CPU sets hold online CPUs.

Named machines: `NAMED` maps a name to a zero-argument builder, e.g.
`NAMED["dual_socket_ht"]()`; `named(name)` raises `TopologyError` for an unknown name. Two of
them are modelled on real sysfs dumps of machines whose attributes disagree:
`amd_compute_units` on a 4-socket Opteron 6276 (hwloc's test tree 64amd64-4s2n4ca2co: two
dies per package, each its own NUMA node and L3, 4 compute units of 2 cores per die, core_id
0-7 per die, no die_id or cache ids, L2 lists that name the CPU alone while the maps name the
unit), and `arm_dynamiq` on the phones in pytorch/cpuinfo's mock trees (Kirin 980: packages
0-3, 4-5, 6-7 with core_id restarting per package; Snapdragon 845: one L3 "0-7" over packages
0-3 and 4-7, private L2s, no cache ids), the same 4+2+2 shape as a Rockchip RK3588.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from corepin.core.cpuset import CPUSet
from corepin.core.errors import TopologyError
from corepin.topology.model import EFFICIENCY, PERFORMANCE, CPUInfo, NUMANode, Topology

__all__ = [
    "EFFICIENCY",
    "NAMED",
    "PERFORMANCE",
    "ClusterSpec",
    "SyntheticSpec",
    "amd_compute_units",
    "arm_dynamiq",
    "clustered",
    "dual_socket_ht",
    "hybrid",
    "large_64",
    "large_256",
    "large_1024",
    "multi_l3_per_numa",
    "multi_numa_per_socket",
    "named",
    "offline_cpus",
    "single_socket_ht",
    "sixteen_numa",
    "synthetic",
]

Numbering = Literal["interleaved", "linear"]


@dataclass(frozen=True)
class SyntheticSpec:
    """A regular machine. Counts are per parent unit; CPU ids follow `numbering`."""

    sockets: int = 1
    dies_per_socket: int = 1
    numa_per_socket: int = 1
    #: when set, overrides numa_per_socket with dies_per_socket * numa_per_die
    numa_per_die: int | None = None
    l3_per_numa: int = 1
    cores_per_l3: int = 4
    threads_per_core: int = 2
    numbering: Numbering = "interleaved"
    offline: tuple[int, ...] = ()
    isolated: tuple[int, ...] = ()
    #: hybrid: single-thread efficiency cores after the performance cores of each L3
    e_cores_per_l3: int = 0
    #: how many efficiency cores share one L2 (performance cores have a private L2)
    e_cores_per_l2: int = 4
    #: how many (performance) cores share one L2: 2 for AMD family 15h compute units
    cores_per_l2: int = 1
    memory_only_nodes: int = 0
    memory_kb_per_node: int | None = None
    socket_ids: tuple[int, ...] | None = None
    name: str = ""

    @property
    def numa_nodes_per_socket(self) -> int:
        if self.numa_per_die is not None:
            return self.numa_per_die * self.dies_per_socket
        return self.numa_per_socket

    @property
    def cpu_count(self) -> int:
        per_l3 = self.cores_per_l3 * self.threads_per_core + self.e_cores_per_l3
        return self.sockets * self.numa_nodes_per_socket * self.l3_per_numa * per_l3

    def validate(self) -> None:
        counts = {
            "sockets": self.sockets,
            "dies_per_socket": self.dies_per_socket,
            "numa_per_socket": self.numa_nodes_per_socket,
            "l3_per_numa": self.l3_per_numa,
            "threads_per_core": self.threads_per_core,
            "e_cores_per_l2": self.e_cores_per_l2,
            "cores_per_l2": self.cores_per_l2,
        }
        for key, value in counts.items():
            if value < 1:
                raise TopologyError(f"synthetic spec: {key} must be at least 1, got {value}")
        if self.cores_per_l3 < 0 or self.e_cores_per_l3 < 0 or self.memory_only_nodes < 0:
            raise TopologyError("synthetic spec: core and node counts cannot be negative")
        if self.cores_per_l3 + self.e_cores_per_l3 < 1:
            raise TopologyError("synthetic spec: every L3 needs at least one core")
        if self.numa_nodes_per_socket % self.dies_per_socket:
            raise TopologyError(
                f"synthetic spec: {self.numa_nodes_per_socket} NUMA nodes per socket cannot be "
                f"split evenly over {self.dies_per_socket} dies"
            )
        if self.numbering not in ("interleaved", "linear"):
            raise TopologyError(
                f"synthetic spec: numbering must be 'interleaved' or 'linear', "
                f"got {self.numbering!r}"
            )
        if self.socket_ids is not None and (
            len(self.socket_ids) != self.sockets
            or len(set(self.socket_ids)) != self.sockets
            or min(self.socket_ids) < 0
        ):
            raise TopologyError(
                f"synthetic spec: socket_ids {self.socket_ids} must be {self.sockets} distinct "
                "non-negative ids"
            )
        total = self.cpu_count
        for what, ids in (("offline", self.offline), ("isolated", self.isolated)):
            bad = [c for c in ids if not 0 <= c < total]
            if bad:
                raise TopologyError(f"synthetic spec: {what} CPUs {bad} are outside 0-{total - 1}")
        if len(set(self.offline)) >= total:
            raise TopologyError("synthetic spec: at least one CPU must stay online")


@dataclass
class _Core:
    socket: int
    die: int
    numa: int
    l3: int
    l2: int
    kind: str | None
    threads: int
    cpus: list[int] = field(default_factory=list)


def synthetic(spec: SyntheticSpec) -> Topology:
    """Build the topology a `SyntheticSpec` describes."""
    spec.validate()
    socket_ids = spec.socket_ids or tuple(range(spec.sockets))
    nodes_per_die = spec.numa_nodes_per_socket // spec.dies_per_socket
    hybrid = spec.e_cores_per_l3 > 0
    cores: list[_Core] = []
    node_place: dict[int, tuple[int, int]] = {}  # node -> (socket index, die)
    node = l3 = l2 = 0
    for s in range(spec.sockets):
        for d in range(spec.dies_per_socket):
            for _ in range(nodes_per_die):
                node_place[node] = (s, d)
                for _ in range(spec.l3_per_numa):
                    for c in range(spec.cores_per_l3):
                        kind = PERFORMANCE if hybrid else None
                        cores.append(
                            _Core(socket_ids[s], d, node, l3, l2, kind, spec.threads_per_core)
                        )
                        if (c + 1) % spec.cores_per_l2 == 0 or c + 1 == spec.cores_per_l3:
                            l2 += 1
                    for e in range(spec.e_cores_per_l3):
                        if e and e % spec.e_cores_per_l2 == 0:
                            l2 += 1
                        cores.append(_Core(socket_ids[s], d, node, l3, l2, EFFICIENCY, 1))
                    if spec.e_cores_per_l3:
                        l2 += 1
                    l3 += 1
                node += 1

    next_id = 0
    if spec.numbering == "linear":
        for core in cores:
            core.cpus = list(range(next_id, next_id + core.threads))
            next_id += core.threads
    else:
        for thread in range(max(c.threads for c in cores)):
            for core in cores:
                if thread < core.threads:
                    core.cpus.append(next_id)
                    next_id += 1

    offline = set(spec.offline)
    isolated = set(spec.isolated)
    table: list[CPUInfo] = []
    node_cpus: dict[int, int] = {}
    for core in cores:
        alive = [c for c in core.cpus if c not in offline]
        for cpu in core.cpus:
            if cpu in offline:
                table.append(CPUInfo.offline(cpu, isolated=cpu in isolated))
                continue
            node_cpus[core.numa] = node_cpus.get(core.numa, 0) | (1 << cpu)
            table.append(
                CPUInfo(
                    cpu,
                    socket=core.socket,
                    die=core.die,
                    numa=core.numa,
                    l3=core.l3,
                    l2=core.l2,
                    core=min(alive),
                    isolated=cpu in isolated,
                    core_type=core.kind,
                )
            )

    cpu_nodes = len(node_place)
    all_nodes = cpu_nodes + spec.memory_only_nodes

    def place(n: int) -> tuple[int, int | None]:
        if n < cpu_nodes:
            return node_place[n]
        return ((n - cpu_nodes) % spec.sockets, None)

    def distance(a: int, b: int) -> int:
        if a == b:
            return 10
        (sa, da), (sb, db) = place(a), place(b)
        if da is None and db is None:
            return 30
        if da is None or db is None:
            return 14 if sa == sb else 24
        if sa != sb:
            return 21
        return 11 if da == db else 12

    numa_nodes = [
        NUMANode(
            n,
            CPUSet.from_bits(node_cpus.get(n, 0)),
            {m: distance(n, m) for m in range(all_nodes)},
            spec.memory_kb_per_node,
        )
        for n in range(all_nodes)
    ]
    return Topology(table, numa_nodes, name=spec.name)


@dataclass(frozen=True)
class ClusterSpec:
    """An arm64 SoC of CPU clusters, CPUs numbered cluster by cluster (threads of a core
    consecutive). On kernels before 6.2 with a devicetree `cpu-map`, every cluster is its own
    package (`package_per_cluster`, cluster_id -1); later ones put the clusters in package 0
    and number them with cluster_id. Arm64 has no dies (`die` None)."""

    #: cores per cluster
    clusters: tuple[int, ...] = (4, 4)
    #: `cpu_capacity` per cluster (the highest are performance cores, the rest efficiency)
    capacities: tuple[int, ...] | None = None
    threads_per_core: int = 1
    #: one L2 per cluster (older Cortex-A53 clusters) instead of one per core
    shared_l2: bool = False
    #: "shared": one L3 over every cluster (DynamIQ); "cluster": one per cluster; "none"
    l3: Literal["shared", "cluster", "none"] = "shared"
    package_per_cluster: bool = True
    #: NUMA nodes, each over consecutive clusters (one node spans them all by default)
    numa_nodes: int = 1
    offline: tuple[int, ...] = ()
    isolated: tuple[int, ...] = ()
    name: str = ""

    @property
    def cpu_count(self) -> int:
        return sum(self.clusters) * self.threads_per_core

    def validate(self) -> None:
        if not self.clusters or min(self.clusters) < 1:
            raise TopologyError("cluster spec: every cluster needs at least one core")
        if self.threads_per_core < 1:
            raise TopologyError("cluster spec: threads_per_core must be at least 1")
        if self.capacities is not None and (
            len(self.capacities) != len(self.clusters) or min(self.capacities) < 1
        ):
            raise TopologyError(
                f"cluster spec: capacities {self.capacities} must be one positive value per cluster"
            )
        if self.l3 not in ("shared", "cluster", "none"):
            raise TopologyError(f"cluster spec: l3 must be shared, cluster or none: {self.l3!r}")
        if not 1 <= self.numa_nodes <= len(self.clusters):
            raise TopologyError(
                f"cluster spec: {self.numa_nodes} NUMA nodes for {len(self.clusters)} clusters"
            )
        total = self.cpu_count
        for what, ids in (("offline", self.offline), ("isolated", self.isolated)):
            bad = [c for c in ids if not 0 <= c < total]
            if bad:
                raise TopologyError(f"cluster spec: {what} CPUs {bad} are outside 0-{total - 1}")
        if len(set(self.offline)) >= total:
            raise TopologyError("cluster spec: at least one CPU must stay online")


def clustered(spec: ClusterSpec) -> Topology:
    """Build the topology a `ClusterSpec` describes. Core types follow the capacities of the
    online CPUs, as discovery derives them: the highest are performance cores, the others
    efficiency cores, none when they are all equal."""
    spec.validate()
    offline = set(spec.offline)
    isolated = set(spec.isolated)
    caps = spec.capacities
    spans: list[range] = []
    for cores in spec.clusters:
        start = spans[-1].stop if spans else 0
        spans.append(range(start, start + cores * spec.threads_per_core))
    online_caps = set()
    if caps is not None:
        online_caps = {caps[k] for k, r in enumerate(spans) if any(t not in offline for t in r)}
    top = max(online_caps, default=0)
    count = len(spec.clusters)
    table: list[CPUInfo] = []
    node_cpus: dict[int, int] = {}
    cpu = l2 = 0
    for k, cores in enumerate(spec.clusters):
        node = k * spec.numa_nodes // count
        l3 = {"shared": 0, "cluster": k, "none": None}[spec.l3]
        capacity = caps[k] if caps is not None else None
        kind = None
        if capacity is not None and len(online_caps) > 1:
            kind = PERFORMANCE if capacity == top else EFFICIENCY
        for _ in range(cores):
            threads = list(range(cpu, cpu + spec.threads_per_core))
            cpu += spec.threads_per_core
            alive = [t for t in threads if t not in offline]
            for t in threads:
                if t in offline:
                    table.append(CPUInfo.offline(t, isolated=t in isolated))
                    continue
                node_cpus[node] = node_cpus.get(node, 0) | (1 << t)
                table.append(
                    CPUInfo(
                        t,
                        socket=k if spec.package_per_cluster else 0,
                        die=None,
                        numa=node,
                        l3=l3,
                        l2=l2,
                        core=min(alive),
                        cluster=None if spec.package_per_cluster else k,
                        isolated=t in isolated,
                        core_type=kind,
                        capacity=capacity,
                    )
                )
            if not spec.shared_l2:
                l2 += 1
        if spec.shared_l2:
            l2 += 1
    nodes = [
        NUMANode(
            n,
            CPUSet.from_bits(node_cpus.get(n, 0)),
            {m: 10 if m == n else 20 for m in range(spec.numa_nodes)},
        )
        for n in range(spec.numa_nodes)
    ]
    return Topology(table, nodes, name=spec.name)


# ---------------------------------------------------------------------- named machines


def single_socket_ht() -> Topology:
    """1 socket, 1 NUMA node, 1 L3, 8 cores x 2 threads (16 CPUs, interleaved)."""
    return synthetic(SyntheticSpec(cores_per_l3=8, name="single_socket_ht"))


def dual_socket_ht() -> Topology:
    """2 sockets, one NUMA node and one L3 each, 8 cores x 2 threads per socket (32 CPUs)."""
    return synthetic(SyntheticSpec(sockets=2, cores_per_l3=8, name="dual_socket_ht"))


def multi_numa_per_socket() -> Topology:
    """2 sockets x 2 NUMA nodes (sub-NUMA clustering), 1 L3 per node, 6 cores x 2 (48 CPUs)."""
    return synthetic(
        SyntheticSpec(sockets=2, numa_per_socket=2, cores_per_l3=6, name="multi_numa_per_socket")
    )


def multi_l3_per_numa() -> Topology:
    """EPYC-like (NPS1): 2 sockets, 1 NUMA node each, 8 L3 (CCX) of 4 cores x 2 (128 CPUs)."""
    return synthetic(
        SyntheticSpec(sockets=2, l3_per_numa=8, cores_per_l3=4, name="multi_l3_per_numa")
    )


def sixteen_numa() -> Topology:
    """2 sockets x 4 dies x 2 NUMA nodes per die, 2 cores x 2 threads per node (64 CPUs)."""
    return synthetic(
        SyntheticSpec(
            sockets=2, dies_per_socket=4, numa_per_die=2, cores_per_l3=2, name="sixteen_numa"
        )
    )


def hybrid() -> Topology:
    """Alder Lake-like: 4 performance cores x 2 threads (CPUs 0-7) and 8 efficiency cores in
    two L2 clusters of 4 (CPUs 8-15), one L3, linear numbering (16 CPUs)."""
    return synthetic(
        SyntheticSpec(
            cores_per_l3=4, e_cores_per_l3=8, e_cores_per_l2=4, numbering="linear", name="hybrid"
        )
    )


def offline_cpus() -> Topology:
    """dual_socket_ht shrunk to 4 cores per socket (16 CPUs) with CPU 0, both threads of core
    3 (CPUs 3, 11) and CPU 13 offline, and CPUs 6, 14 isolated."""
    return synthetic(
        SyntheticSpec(
            sockets=2,
            cores_per_l3=4,
            offline=(0, 3, 11, 13),
            isolated=(6, 14),
            name="offline_cpus",
        )
    )


def amd_compute_units() -> Topology:
    """Opteron 6200/6300-like (AMD family 15h): 2 sockets x 2 dies, each die its own NUMA node
    and L3, 8 single-thread cores per die in 4 compute units of 2 cores sharing an L2, linear
    numbering (32 CPUs). The kernel lists a unit's two cores as SMT siblings: write its tree
    with `corepin.testing.compute_unit_files`."""
    return synthetic(
        SyntheticSpec(
            sockets=2,
            numa_per_socket=2,
            cores_per_l3=8,
            threads_per_core=1,
            cores_per_l2=2,
            numbering="linear",
            name="amd_compute_units",
        )
    )


def arm_dynamiq() -> Topology:
    """A DynamIQ phone SoC as kernels before 6.2 number it: 4 efficiency cores (package 0,
    CPUs 0-3), two clusters of 2 performance cores (packages 1 and 2, CPUs 4-5 and 6-7),
    private L2s, one L3 and one NUMA node over all three packages (8 CPUs; capacities
    illustrative: 414 and 1024)."""
    return clustered(
        ClusterSpec(clusters=(4, 2, 2), capacities=(414, 1024, 1024), name="arm_dynamiq")
    )


def large_64() -> Topology:
    """2 sockets x 2 NUMA x 2 L3 x 4 cores x 2 threads = 64 CPUs (benchmarks)."""
    return synthetic(
        SyntheticSpec(sockets=2, numa_per_socket=2, l3_per_numa=2, cores_per_l3=4, name="large_64")
    )


def large_256() -> Topology:
    """2 sockets x 4 NUMA x 4 L3 x 4 cores x 2 threads = 256 CPUs, 8 NUMA nodes (benchmarks)."""
    return synthetic(
        SyntheticSpec(sockets=2, numa_per_socket=4, l3_per_numa=4, cores_per_l3=4, name="large_256")
    )


def large_1024() -> Topology:
    """4 sockets x 4 NUMA x 4 L3 x 8 cores x 2 threads = 1024 CPUs, 16 NUMA (benchmarks)."""
    return synthetic(
        SyntheticSpec(
            sockets=4, numa_per_socket=4, l3_per_numa=4, cores_per_l3=8, name="large_1024"
        )
    )


NAMED: dict[str, Callable[[], Topology]] = {
    "single_socket_ht": single_socket_ht,
    "dual_socket_ht": dual_socket_ht,
    "multi_numa_per_socket": multi_numa_per_socket,
    "multi_l3_per_numa": multi_l3_per_numa,
    "sixteen_numa": sixteen_numa,
    "hybrid": hybrid,
    "offline_cpus": offline_cpus,
    "amd_compute_units": amd_compute_units,
    "arm_dynamiq": arm_dynamiq,
    "large_64": large_64,
    "large_256": large_256,
    "large_1024": large_1024,
}


def named(name: str) -> Topology:
    """The named synthetic machine `name` (a key of `NAMED`)."""
    try:
        return NAMED[name]()
    except KeyError:
        raise TopologyError(
            f"unknown synthetic topology {name!r}; known: {', '.join(sorted(NAMED))}",
            reason="unknown_topology",
        ) from None
