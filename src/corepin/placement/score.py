"""How good a fitting node is for a pod: 0-100 (pure, deterministic).

The base is the node's CPU utilization once the pod is placed there (held CPUs over online
less reserved, the pod's withheld units included):

- profile `MaximumUtilization` (pack): base = 100 x utilization, so pods fill busy nodes first
  and whole nodes stay free for big requests;
- profile `Balanced` (spread): base = 100 x (1 - utilization).

A pod with a workload family (`corepin.io/workload-type`, as actimanager's WorkloadAware
plugin sorts them) weighs a family score twice as much as the base:

- `memory-bound`: 100 x (1 - the busiest share of memory-bound CPUs on the sockets its CPUs
  land on), so memory-bound pods keep off sockets whose memory bandwidth other memory-bound
  pods already use;
- `cpu-bound`: 100 x the share of its CPUs that land on whole idle cores (every thread free
  before the pod came);
- `io-bound` and `best-effort`: 100 x the node's utilization before the pod, when its shared
  pool has CPUs: such pods go to the shared pool of busy nodes and leave idle nodes for
  pinned work.

A pod that asks for devices (extended resources such as `nvidia.com/gpu` in its containers'
limits) and CPUs of its own, with `corepin.io/device-alignment` other than `none`, weighs a
device score twice as much as the rest: 100 when one NUMA node of the node has both the
devices (allocatable, as the node's agent published them from the kubelet) and the free CPUs
the pod asks for, 50 when the devices are there but on no NUMA node with enough free CPUs,
0 when the node published no such devices. It never refuses a node: the kubelet and the
default scheduler count the devices themselves.

`extender_score` maps 0-100 to the extender API's 0-10 (`MaxExtenderPriority`).
"""

from __future__ import annotations

from typing import Final

from corepin.allocation.pools import NodePools
from corepin.core.errors import InputError
from corepin.placement.fit import Fit
from corepin.placement.node import NodeView
from corepin.placement.request import PodRequest

MAXIMUM_UTILIZATION: Final = "MaximumUtilization"
BALANCED: Final = "Balanced"
PROFILES: Final = (MAXIMUM_UTILIZATION, BALANCED)
MAX_SCORE: Final = 100
MAX_EXTENDER_SCORE: Final = 10


def check_profile(name: str) -> str:
    """`name` when it is a profile; InputError naming the choices otherwise."""
    if name not in PROFILES:
        raise InputError(
            f"unknown scoring profile {name!r} (choose from {', '.join(PROFILES)})",
            reason="bad_profile",
        )
    return name


def utilization(view: NodeView, pools: NodePools) -> float:
    """Held CPUs over the CPUs that can be handed out (0 on a node with none)."""
    capacity = view.capacity
    if capacity <= 0:
        return 1.0
    free = (pools.free_bits & ~pools.reserved).bit_count()
    return max(0.0, min(1.0, (capacity - free) / capacity))


def _memory_bound(view: NodeView, result: Fit, assumed: dict[int, int] | None) -> float:
    topology = view.topology
    sockets: set[int] = set()
    for p in result.placed:
        sockets.update(topology.sockets_in(p.cpus))
    if not sockets:
        sockets = set(topology.socket_ids())
    busiest = 0.0
    for socket in sockets:
        size = len(topology.cpus_in_sockets(socket) & topology.online_cpus)
        if size:
            held = view.memory_bound.get(socket, 0) + (assumed or {}).get(socket, 0)
            busiest = max(busiest, min(1.0, held / size))
    return 100.0 * (1.0 - busiest)


def _cpu_bound(view: NodeView, before: NodePools, result: Fit) -> float:
    topology = view.topology
    free = before.free_bits
    cpus = [c for p in result.placed for c in p.cpus]
    if not cpus:  # on the shared pool: how many whole cores are idle
        cores = topology.core_ids()
        idle = sum(1 for core in cores if topology.cpus_in_cores(core).bits & ~free == 0)
        return 100.0 * idle / len(cores) if cores else 0.0
    whole = sum(1 for c in cpus if topology.siblings_of(c).bits & ~free == 0)
    return 100.0 * whole / len(cpus)


def device_alignment(view: NodeView, request: PodRequest, before: NodePools) -> float | None:
    """The device score of the module docstring (None: the pod's devices play no part)."""
    wanted, alignment = request.device_key
    if alignment == "none" or not request.cpus:
        return None
    topology = view.topology
    nodes: set[int] | None = None
    for resource, count in wanted:
        here = {
            d.numa_node
            for d in view.devices
            if d.resource == resource and d.numa_node is not None and d.allocatable >= count
        }
        nodes = here if nodes is None else nodes & here
    if not nodes:
        return 0.0
    for node in sorted(nodes):
        free = before.free_bits & topology.cpus_in_numa_nodes(node).bits
        if free.bit_count() >= request.cpus:
            return 100.0
    return 50.0


def score(
    view: NodeView,
    request: PodRequest,
    result: Fit,
    profile: str,
    *,
    before: NodePools | None = None,
    assumed_memory_bound: dict[int, int] | None = None,
) -> int:
    """0-100 for a node `result` fits (see the module docstring). `before`: the pools the fit
    was decided on (default: the view's); `assumed_memory_bound`: CPUs of in-flight
    memory-bound placements per socket."""
    start = view.pools if before is None else before
    after = result.pools if result.pools is not None else start
    used = utilization(view, after)
    base = 100.0 * used if profile == MAXIMUM_UTILIZATION else 100.0 * (1.0 - used)
    family = request.workload
    if family == "memory-bound":
        value = (base + 2 * _memory_bound(view, result, assumed_memory_bound)) / 3
    elif family == "cpu-bound":
        value = (base + 2 * _cpu_bound(view, start, result)) / 3
    elif family in ("io-bound", "best-effort"):
        busy = 100.0 * utilization(view, start) if start.shared_bits else 0.0
        value = (base + 2 * busy) / 3
    else:
        value = base
    devices = device_alignment(view, request, start)
    if devices is not None:
        value = (value + 2 * devices) / 3
    return max(0, min(MAX_SCORE, round(value)))


def extender_score(value: int) -> int:
    """0-100 -> 0-10, rounding half up."""
    return max(
        0, min(MAX_EXTENDER_SCORE, (value * MAX_EXTENDER_SCORE + MAX_SCORE // 2) // MAX_SCORE)
    )


__all__ = [
    "BALANCED",
    "MAXIMUM_UTILIZATION",
    "PROFILES",
    "check_profile",
    "device_alignment",
    "extender_score",
    "score",
    "utilization",
]
