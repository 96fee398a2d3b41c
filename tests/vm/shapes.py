"""Guest shapes: the CPU and memory topology a QEMU guest is asked for, and what its kernel
should then show.

QEMU numbers the vCPUs socket-major: cpu = ((socket * dies + die) * cores + core) * threads +
thread, and lists them in that order in the ACPI tables, so the guest's logical CPU n is vCPU n.
With `l3-cache=on` (an Intel CPU model) QEMU describes one L3 per die; `dies=2` therefore gives
two L3 caches per socket. NUMA nodes take whole cores in order: node i holds the CPUs
`cpus_of_node(i)`, and `-numa cpu,...` pins every vCPU to its node explicitly (no deprecated
`cpus=` ranges).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field


def cpu_list(cpus: Sequence[int]) -> str:
    """Linux list text of `cpus` ("0-3,8"); "" when empty."""
    out: list[str] = []
    ordered = sorted(set(cpus))
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        out.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(out)


@dataclass(frozen=True)
class Shape:
    """A guest machine: `sockets` x `dies` x `cores` (per die) x `threads`, split into `nodes`
    NUMA nodes of equal size with `mem_mb` MiB each.

    `distances` is the full node distance matrix (default: 10 local, 20 remote). `offline` are
    CPUs the guest takes offline before any command runs; `isolcpus` is passed as the kernel's
    `isolcpus=` (domain isolation).
    """

    name: str
    sockets: int = 1
    dies: int = 1
    cores: int = 2
    threads: int = 1
    nodes: int = 1
    mem_mb: int = 256
    distances: tuple[tuple[int, ...], ...] | None = None
    offline: tuple[int, ...] = ()
    isolcpus: tuple[int, ...] = ()
    extra_cmdline: tuple[str, ...] = field(default=())
    #: NUMA nodes that get a PCI expander bridge (QEMU `pxb` with `numa_node=`) with one
    #: virtio-net NIC behind it: the guest kernel then reports that NIC's `numa_node` and
    #: `local_cpulist` as the node's (the NIC has no network: it is there to be found)
    pci_nodes: tuple[int, ...] = field(default=())

    def __post_init__(self) -> None:
        if min(self.sockets, self.dies, self.cores, self.threads, self.nodes) < 1:
            raise ValueError(f"shape {self.name}: every count must be at least 1")
        cores_total = self.sockets * self.dies * self.cores
        if cores_total % self.nodes:
            raise ValueError(
                f"shape {self.name}: {cores_total} cores do not split into {self.nodes} nodes"
            )
        if self.distances is not None and (
            len(self.distances) != self.nodes
            or any(len(row) != self.nodes for row in self.distances)
        ):
            raise ValueError(f"shape {self.name}: distances must be {self.nodes}x{self.nodes}")
        if 0 in self.offline:
            raise ValueError(f"shape {self.name}: CPU 0 cannot go offline")
        bad = [c for c in (*self.offline, *self.isolcpus) if not 0 <= c < self.cpus]
        if bad:
            raise ValueError(f"shape {self.name}: CPUs {bad} do not exist")

    # ------------------------------------------------------------------ counts and maps
    @property
    def cpus(self) -> int:
        return self.sockets * self.dies * self.cores * self.threads

    def place(self, cpu: int) -> tuple[int, int, int, int]:
        """(socket, die, core within the die, thread) of logical CPU `cpu`."""
        thread = cpu % self.threads
        core = cpu // self.threads % self.cores
        die = cpu // (self.threads * self.cores) % self.dies
        socket = cpu // (self.threads * self.cores * self.dies)
        return socket, die, core, thread

    def core_index(self, cpu: int) -> int:
        """The machine-wide index of `cpu`'s physical core."""
        return cpu // self.threads

    def node_of(self, cpu: int) -> int:
        cores_per_node = self.sockets * self.dies * self.cores // self.nodes
        return self.core_index(cpu) // cores_per_node

    def cpus_of_node(self, node: int) -> list[int]:
        return [c for c in range(self.cpus) if self.node_of(c) == node]

    def distance(self, a: int, b: int) -> int:
        if self.distances is not None:
            return self.distances[a][b]
        return 10 if a == b else 20

    # ------------------------------------------------------------------ what the guest shows
    @property
    def online(self) -> list[int]:
        return [c for c in range(self.cpus) if c not in self.offline]

    def siblings(self) -> list[list[int]]:
        """The SMT sibling groups (one per physical core) of the whole machine."""
        return [
            list(range(core * self.threads, (core + 1) * self.threads))
            for core in range(self.cpus // self.threads)
        ]

    def l3_groups(self) -> list[list[int]]:
        """The CPUs sharing each L3 (one per die)."""
        per_die = self.cores * self.threads
        return [
            list(range(d * per_die, (d + 1) * per_die)) for d in range(self.sockets * self.dies)
        ]

    def expected(self) -> dict[str, object]:
        """The shape as plain data (online CPUs only in the groups, as sysfs shows them)."""
        online = set(self.online)

        def keep(groups: list[list[int]]) -> list[list[int]]:
            return [[c for c in g if c in online] for g in groups if online & set(g)]

        return {
            "cpus": self.cpus,
            "online": self.online,
            "offline": list(self.offline),
            "isolated": sorted(self.isolcpus),
            "sockets": [
                [c for c in self.online if self.place(c)[0] == s] for s in range(self.sockets)
            ],
            "nodes": {
                n: [c for c in self.cpus_of_node(n) if c in online] for n in range(self.nodes)
            },
            "distances": {
                n: {m: self.distance(n, m) for m in range(self.nodes)} for n in range(self.nodes)
            },
            "siblings": keep(self.siblings()),
            "l3": keep(self.l3_groups()),
        }

    # ------------------------------------------------------------------ QEMU and kernel
    def qemu_args(self) -> list[str]:
        """The -smp, -m, -object, -numa and -cpu options of this shape."""
        total = self.mem_mb * self.nodes
        args = [
            "-smp",
            f"{self.cpus},sockets={self.sockets},dies={self.dies},cores={self.cores},"
            f"threads={self.threads}",
            "-m",
            f"{total}M",
            "-cpu",
            "Skylake-Server-v4,l3-cache=on",
        ]
        for node in range(self.nodes):
            args += [
                "-object",
                f"memory-backend-ram,id=mem{node},size={self.mem_mb}M",
                "-numa",
                f"node,nodeid={node},memdev=mem{node}",
            ]
        for cpu in range(self.cpus):
            socket, die, core, thread = self.place(cpu)
            # QEMU takes die-id only when the machine has dies
            die_id = f"die-id={die}," if self.dies > 1 else ""
            args += [
                "-numa",
                f"cpu,node-id={self.node_of(cpu)},socket-id={socket},{die_id}"
                f"core-id={core},thread-id={thread}",
            ]
        for a in range(self.nodes):
            for b in range(self.nodes):
                if a != b:
                    args += ["-numa", f"dist,src={a},dst={b},val={self.distance(a, b)}"]
        return args

    def device_args(self) -> list[str]:
        """The -device options of the shape's PCI expander bridges and NICs (they go last on
        QEMU's command line: a device without `bus=` after a bridge would be put behind it)."""
        args: list[str] = []
        for i, node in enumerate(self.pci_nodes):
            args += [
                "-device",
                f"pxb,id=pxb{i},bus_nr={32 + 32 * i},numa_node={node},bus=pci.0",
                "-device",
                f"virtio-net-pci,bus=pxb{i},addr=0x1,mac=52:54:00:12:34:{0x10 + i:02x}",
            ]
        return args

    def nic_address(self, index: int) -> str:
        """The PCI address of the NIC behind the `index`-th expander bridge: QEMU puts a
        PCI-PCI bridge on the expander's bus (`bus_nr`), the NIC in slot 1 of the bus behind
        it."""
        return f"0000:{32 + 32 * index + 1:02x}:01.0"

    def cmdline(self) -> list[str]:
        """Kernel command line words of this shape."""
        words = list(self.extra_cmdline)
        if self.isolcpus:
            words.append(f"isolcpus={cpu_list(self.isolcpus)}")
        return words

    def describe(self) -> str:
        parts = [f"{self.sockets} socket(s)"]
        if self.dies > 1:
            parts.append(f"{self.dies} dies/L3 per socket")
        parts.append(f"{self.cores} cores per die")
        parts.append(f"SMT{self.threads}" if self.threads > 1 else "no SMT")
        parts.append(f"{self.nodes} NUMA node(s) of {self.mem_mb} MiB")
        if self.offline:
            parts.append(f"offline {cpu_list(self.offline)}")
        if self.isolcpus:
            parts.append(f"isolcpus={cpu_list(self.isolcpus)}")
        return f"{self.name}: {self.cpus} CPUs, " + ", ".join(parts)


#: the shapes the guest tests use (see the README's testing section)
SHAPES: Mapping[str, Shape] = {
    s.name: s
    for s in (
        # 2 sockets x 2 NUMA nodes (one die, so one L3, per node) x 2 cores x SMT2 = 16 CPUs
        Shape(
            "numa4-smt2",
            sockets=2,
            dies=2,
            cores=2,
            threads=2,
            nodes=4,
            mem_mb=256,
            distances=((10, 12, 20, 20), (12, 10, 20, 20), (20, 20, 10, 12), (20, 20, 12, 10)),
        ),
        # 1 socket, one NUMA node, two L3 caches (dies) of 3 cores x SMT2 = 12 CPUs
        Shape("l3x2", sockets=1, dies=2, cores=3, threads=2, nodes=1, mem_mb=512),
        # 4 NUMA nodes of 2 cores without SMT over 2 sockets (one L3 per socket spans 2 nodes)
        Shape(
            "numa4-nosmt",
            sockets=2,
            cores=4,
            threads=1,
            nodes=4,
            mem_mb=256,
            distances=((10, 11, 21, 21), (11, 10, 21, 21), (21, 21, 10, 11), (21, 21, 11, 10)),
        ),
        # 2 sockets of 2 cores, a NUMA node each, a NIC behind a PCI bridge on node 1
        Shape("numa2-nic", sockets=2, cores=2, threads=1, nodes=2, mem_mb=256, pci_nodes=(1,)),
        # numa4-nosmt with a NIC behind a PCI bridge on node 3
        Shape(
            "numa4-nic",
            sockets=2,
            cores=4,
            threads=1,
            nodes=4,
            mem_mb=256,
            distances=((10, 11, 21, 21), (11, 10, 21, 21), (21, 21, 10, 11), (21, 21, 11, 10)),
            pci_nodes=(3,),
        ),
        # 1 socket of 4 cores x SMT2 with CPUs 6 and 7 (a whole core) offline, 2-3 isolated
        Shape(
            "offline-isol",
            sockets=1,
            cores=4,
            threads=2,
            nodes=1,
            mem_mb=512,
            offline=(6, 7),
            isolcpus=(2, 3),
        ),
    )
}
