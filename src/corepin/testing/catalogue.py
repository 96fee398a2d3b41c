"""The catalogue of named machine shapes behind `corepin topology|allocate|simulate --machine NAME`.

Examples in the documentation, and anyone trying corepin on a laptop, want the shape of a real
server: `MACHINES` maps a short kebab-case name to a builder of a synthetic `Topology` of that
shape (two-socket Intel with SMT, AMD EPYC with four L3 caches per NUMA node, a hybrid Alder
Lake, an arm64 SoC of clusters, a server with four NUMA nodes per socket, a GPU server with its
devices next to NUMA nodes, ...). `machine(name)` builds one; an unknown name is an InputError
(exit 2) naming it and listing the choices.

The topologies are exactly what discovery returns for such a machine's sysfs (the builders of
`corepin.testing.machines` and `corepin.testing.devices` guarantee `discover(write_sysfs_tree(t))
== t`), so every command sees them as it would see the real one.

Why here, in `corepin.testing`, and not in `corepin.topology`: the shapes are made with the
synthetic builders of the tests (`corepin.testing.machines`, `corepin.testing.devices`), which
sit outside the layers of the product. A module of `corepin.topology` importing them would make
the topology layer depend on test support (which reaches down into `corepin.sysfs` and writes
files) and close an import cycle (`corepin.testing.machines` imports `corepin.topology.model`).
Only the command line (the top layer, `corepin.cli`) reads this catalogue, and only when
`--machine` is given; the import-linter contract "Only the command line uses the synthetic
machines" keeps every other part of the product away from `corepin.testing`.
"""

from __future__ import annotations

from collections.abc import Callable

from corepin.core.errors import InputError
from corepin.testing.devices import gpu, nic, nvme, with_devices
from corepin.testing.machines import ClusterSpec, SyntheticSpec, clustered, synthetic
from corepin.topology.model import Topology

__all__ = ["MACHINES", "describe", "machine", "names"]

#: 64 GiB of memory per NUMA node, in kB (as `nodeN/meminfo` says it)
_GIB = 1024 * 1024


def intel_2s_ht() -> Topology:
    """Two-socket Intel Xeon with Hyper-Threading: 2 sockets, one NUMA node and one L3 each,
    16 cores x 2 threads per socket, Linux x86 numbering (64 CPUs; CPU n and n+32 are
    siblings)."""
    return synthetic(
        SyntheticSpec(sockets=2, cores_per_l3=16, memory_kb_per_node=128 * _GIB, name="intel-2s-ht")
    )


def intel_2s_snc4() -> Topology:
    """Two-socket Intel Xeon in sub-NUMA clustering mode SNC4: 4 NUMA nodes per socket, each
    with its own L3 slice, 8 cores x 2 threads per node (128 CPUs, 8 NUMA nodes)."""
    return synthetic(
        SyntheticSpec(
            sockets=2,
            numa_per_socket=4,
            cores_per_l3=8,
            memory_kb_per_node=64 * _GIB,
            name="intel-2s-snc4",
        )
    )


def epyc_4l3() -> Topology:
    """AMD EPYC (NPS1): 2 sockets, one NUMA node each, 4 L3 caches (CCX) of 8 cores x 2 threads
    per node (128 CPUs)."""
    return synthetic(
        SyntheticSpec(
            sockets=2,
            l3_per_numa=4,
            cores_per_l3=8,
            memory_kb_per_node=256 * _GIB,
            name="epyc-4l3",
        )
    )


def alderlake() -> Topology:
    """Hybrid Intel Alder Lake (Core i9-12900K): 8 performance cores x 2 threads (CPUs 0-15)
    and 8 efficiency cores in two L2 clusters of 4 (CPUs 16-23), one L3 (24 CPUs)."""
    return synthetic(
        SyntheticSpec(
            cores_per_l3=8,
            e_cores_per_l3=8,
            e_cores_per_l2=4,
            numbering="linear",
            memory_kb_per_node=32 * _GIB,
            name="alderlake",
        )
    )


def arm_clusters() -> Topology:
    """An arm64 DynamIQ SoC (RK3588-like) as older kernels number it: 4 efficiency cores
    (package 0, CPUs 0-3) and two clusters of 2 performance cores (packages 1 and 2, CPUs 4-5
    and 6-7), private L2s, one L3 and one NUMA node over all of them (8 CPUs)."""
    return clustered(
        ClusterSpec(clusters=(4, 2, 2), capacities=(414, 1024, 1024), name="arm-clusters")
    )


def arm_server() -> Topology:
    """An arm64 server (Ampere Altra-like): 1 socket, one NUMA node, 80 single-thread cores
    sharing one L3 (80 CPUs)."""
    return synthetic(
        SyntheticSpec(
            cores_per_l3=80, threads_per_core=1, memory_kb_per_node=256 * _GIB, name="arm-server"
        )
    )


def gpu_server() -> Topology:
    """A GPU server: two-socket Intel with Hyper-Threading (2 x 16 cores x 2 threads, 64 CPUs),
    four NVIDIA GPUs (two on each NUMA node), a 100G NIC and an NVMe drive on node 0, a second
    NIC on node 1."""
    base = synthetic(
        SyntheticSpec(sockets=2, cores_per_l3=16, memory_kb_per_node=512 * _GIB, name="gpu-server")
    )
    return with_devices(
        base,
        gpu("0000:17:00.0", numa=0, index=0),
        gpu("0000:31:00.0", numa=0, index=1),
        gpu("0000:b1:00.0", numa=1, index=2),
        gpu("0000:ca:00.0", numa=1, index=3),
        nic("0000:4b:00.0", numa=0, ifname="ens1f0"),
        nic("0000:98:00.0", numa=1, ifname="ens2f0"),
        nvme("0000:65:00.0", numa=0, index=0),
    )


def laptop() -> Topology:
    """A laptop or small VM: 1 socket, 4 cores x 2 threads, one L3 (8 CPUs)."""
    return synthetic(SyntheticSpec(cores_per_l3=4, memory_kb_per_node=16 * _GIB, name="laptop"))


#: name -> builder, in the order `--machine list` prints them
MACHINES: dict[str, Callable[[], Topology]] = {
    "intel-2s-ht": intel_2s_ht,
    "intel-2s-snc4": intel_2s_snc4,
    "epyc-4l3": epyc_4l3,
    "alderlake": alderlake,
    "arm-clusters": arm_clusters,
    "arm-server": arm_server,
    "gpu-server": gpu_server,
    "laptop": laptop,
}


def names() -> list[str]:
    """The machine names, in catalogue order."""
    return list(MACHINES)


def describe(name: str) -> str:
    """The first sentence of the machine's description (what `--help` could show)."""
    doc = MACHINES[name].__doc__ or ""
    return " ".join(doc.split()).split(": ")[0]


def machine(name: str) -> Topology:
    """The machine `name` of the catalogue; InputError (exit 2) naming an unknown one and
    listing the choices."""
    try:
        build = MACHINES[name]
    except KeyError:
        raise InputError(
            f"--machine {name!r} is not a machine of the catalogue; choose from: "
            f"{', '.join(MACHINES)} (`--machine list` prints them)",
            reason="unknown_machine",
        ) from None
    return build()
