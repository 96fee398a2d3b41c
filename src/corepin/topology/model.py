"""The machine model: a flat per-CPU table plus precomputed CPU sets per topology unit.

Identifiers:
- `socket`: the kernel's physical package id.
- `die`: the kernel's die id (unique only inside its package; queries key dies by (socket, die)).
- `numa`: the kernel's NUMA node id (may be sparse).
- `core`: unique machine-wide; by convention the lowest logical CPU id among the core's SMT
  siblings (the same convention the kubelet uses), so two CPUs share `core` exactly when they
  are SMT siblings.
- `l3` / `l2`: one cache instance, unique machine-wide (`None` when the machine exposes none).

Every query answers from dicts of bitmask CPUSets built once in the constructor, so the
allocator never rescans the table.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from corepin.core.cpuset import MAX_CPUS, CPUSet
from corepin.core.errors import TopologyError
from corepin.core.record import field, record
from corepin.topology.devices import Device

_EMPTY = CPUSet()

#: `core_type` values of hybrid machines (Intel P-cores and E-cores).
PERFORMANCE = "performance"
EFFICIENCY = "efficiency"


@record
class CPUInfo:
    """One logical CPU. Topology fields are None when the kernel does not expose them (offline)."""

    cpu: int
    online: bool = True
    socket: int | None = 0
    die: int | None = 0
    numa: int | None = 0
    l3: int | None = None
    l2: int | None = None
    core: int | None = None
    cluster: int | None = None
    isolated: bool = False
    core_type: str | None = None
    capacity: int | None = None

    @classmethod
    def offline(cls, cpu: int, *, isolated: bool = False) -> CPUInfo:
        """An offline CPU: the kernel exposes no topology for it, only whether it is isolated."""
        return cls(cpu, online=False, socket=None, die=None, numa=None, isolated=isolated)

    def to_json(self) -> dict[str, Any]:
        return {
            "cpu": self.cpu,
            "online": self.online,
            "socket": self.socket,
            "die": self.die,
            "numa": self.numa,
            "l3": self.l3,
            "l2": self.l2,
            "core": self.core,
            "isolated": self.isolated,
            "core_type": self.core_type,
            "cluster": self.cluster,
            "capacity": self.capacity,
        }


@record
class NUMANode:
    """A NUMA node: its CPUs (empty for a memory-only node) and distances to other nodes."""

    id: int
    cpus: CPUSet = _EMPTY
    distances: Mapping[int, int] = field(default_factory=dict)
    memory_kb: int | None = None

    @property
    def memory_only(self) -> bool:
        return not self.cpus

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id,
            "cpus": str(self.cpus),
            "distances": {str(k): v for k, v in sorted(self.distances.items())},
        }
        if self.memory_kb is not None:
            out["memory_kb"] = self.memory_kb
        return out


@record
class PoolNode:
    """One node of the pool tree: socket -> die -> numa -> l3 -> core -> thread (the order of
    `Topology.level_order()`)."""

    kind: str
    id: int | None
    cpus: CPUSet
    children: tuple[PoolNode, ...] = ()

    def walk(self) -> Iterable[PoolNode]:
        yield self
        for child in self.children:
            yield from child.walk()


def _group(cpus: Iterable[CPUInfo], key: str) -> dict[Any, CPUSet]:
    masks: dict[Any, int] = {}
    for info in cpus:
        value = getattr(info, key)
        if value is not None:
            masks[value] = masks.get(value, 0) | (1 << info.cpu)
    return {k: CPUSet.from_bits(m) for k, m in sorted(masks.items())}


class Topology:
    """Immutable machine model. Build it with `Topology(cpus, numa_nodes)`, `discover()`,
    `Topology.from_json()` or the synthetic builders."""

    __slots__ = (
        "_by_core",
        "_by_die",
        "_by_l2",
        "_by_l3",
        "_by_numa",
        "_by_socket",
        "_cpus",
        "_index",
        "_isolated",
        "_numa_nodes",
        "_online",
        "_present",
        "devices",
        "name",
    )

    def __init__(
        self,
        cpus: Iterable[CPUInfo],
        numa_nodes: Iterable[NUMANode] = (),
        *,
        name: str = "",
        devices: Iterable[Device] = (),
    ) -> None:
        table = sorted(cpus, key=lambda c: c.cpu)
        index: dict[int, CPUInfo] = {}
        for info in table:
            if info.cpu in index:
                raise TopologyError(f"CPU {info.cpu} is listed twice", reason="duplicate_cpu")
            if info.cpu < 0:
                raise TopologyError(f"CPU id {info.cpu} is negative", reason="bad_cpu_id")
            index[info.cpu] = info
        self._cpus: tuple[CPUInfo, ...] = tuple(table)
        self._index = index
        self.name = name
        #: the PCI devices (`corepin.topology.devices`), by address
        self.devices: tuple[Device, ...] = tuple(sorted(devices, key=lambda d: d.address))
        self._present = CPUSet(index)
        self._online = CPUSet(c.cpu for c in table if c.online)
        self._isolated = CPUSet(c.cpu for c in table if c.isolated)
        online = [c for c in table if c.online]
        self._by_socket = _group(online, "socket")
        self._by_numa = _group(online, "numa")
        self._by_l3 = _group(online, "l3")
        self._by_l2 = _group(online, "l2")
        self._by_core = _group(online, "core")
        dies: dict[tuple[int, int], int] = {}
        for c in online:
            if c.socket is not None and c.die is not None:
                key = (c.socket, c.die)
                dies[key] = dies.get(key, 0) | (1 << c.cpu)
        self._by_die = {k: CPUSet.from_bits(m) for k, m in sorted(dies.items())}
        self._check_consistency(online)
        nodes = {n.id: n for n in numa_nodes}
        for node_id, node_cpus in self._by_numa.items():
            given = nodes.get(node_id)
            if given is None:
                nodes[node_id] = NUMANode(node_id, node_cpus)
            elif not node_cpus.issubset(given.cpus):
                raise TopologyError(
                    f"NUMA node {node_id} lists CPUs {given.cpus} but CPUs {node_cpus} say they "
                    "belong to it",
                    reason="numa_mismatch",
                )
        seen = 0
        for node in nodes.values():
            if node.cpus.bits & seen:
                raise TopologyError(
                    f"CPUs {CPUSet.from_bits(node.cpus.bits & seen)} are in two NUMA nodes",
                    reason="numa_overlap",
                )
            seen |= node.cpus.bits
        self._numa_nodes = tuple(nodes[k] for k in sorted(nodes))

    def _check_consistency(self, online: list[CPUInfo]) -> None:
        """A core lives in one socket, die, NUMA node and cache; every online CPU has a core.

        Caches and NUMA nodes may span sockets: a DynamIQ SoC whose kernel numbers every
        cluster as a package has one L3 (and one NUMA node) over all of them."""
        owner: dict[int, CPUInfo] = {}
        for c in online:
            if c.core is None:
                raise TopologyError(f"online CPU {c.cpu} has no core", reason="missing_core")
            first = owner.setdefault(c.core, c)
            for attr in ("socket", "die", "numa", "l2", "l3"):
                if getattr(first, attr) != getattr(c, attr):
                    raise TopologyError(
                        f"core {c.core} holds CPUs {first.cpu} and {c.cpu} with different "
                        f"{attr} ({getattr(first, attr)} vs {getattr(c, attr)}): a CPU cannot be "
                        "in two cores",
                        reason="inconsistent_core",
                    )

    # ------------------------------------------------------------------ table
    @property
    def cpus(self) -> tuple[CPUInfo, ...]:
        """Every present CPU, ascending."""
        return self._cpus

    def cpu(self, cpu: int) -> CPUInfo:
        try:
            return self._index[cpu]
        except KeyError:
            raise TopologyError(
                f"CPU {cpu} is not in this topology", reason="unknown_cpu"
            ) from None

    @property
    def numa_nodes(self) -> tuple[NUMANode, ...]:
        return self._numa_nodes

    def numa_node(self, node: int) -> NUMANode:
        for n in self._numa_nodes:
            if n.id == node:
                return n
        raise TopologyError(f"NUMA node {node} is not in this topology", reason="unknown_numa")

    @property
    def present_cpus(self) -> CPUSet:
        return self._present

    @property
    def online_cpus(self) -> CPUSet:
        return self._online

    @property
    def offline_cpus(self) -> CPUSet:
        return self._present - self._online

    @property
    def isolated_cpus(self) -> CPUSet:
        return self._isolated

    @property
    def threads_per_core(self) -> int:
        """Largest number of SMT siblings of any core (1 without SMT)."""
        return max((len(c) for c in self._by_core.values()), default=1)

    # ------------------------------------------------------------------ id lists
    def socket_ids(self) -> list[int]:
        return list(self._by_socket)

    def die_ids(self) -> list[tuple[int, int]]:
        return list(self._by_die)

    def numa_node_ids(self) -> list[int]:
        """NUMA nodes that have online CPUs (see `numa_nodes` for memory-only ones too)."""
        return list(self._by_numa)

    def l3_ids(self) -> list[int]:
        return list(self._by_l3)

    def l2_ids(self) -> list[int]:
        return list(self._by_l2)

    def core_ids(self) -> list[int]:
        return list(self._by_core)

    # ------------------------------------------------------------------ unit -> CPUs
    @staticmethod
    def _union(groups: Mapping[Any, CPUSet], ids: Iterable[Any]) -> CPUSet:
        mask = 0
        for i in ids:
            got = groups.get(i)
            if got is not None:
                mask |= got.bits
        return CPUSet.from_bits(mask)

    def cpus_in_sockets(self, *ids: int) -> CPUSet:
        return self._union(self._by_socket, ids)

    def cpus_in_dies(self, *ids: tuple[int, int]) -> CPUSet:
        return self._union(self._by_die, ids)

    def cpus_in_numa_nodes(self, *ids: int) -> CPUSet:
        return self._union(self._by_numa, ids)

    def cpus_in_l3s(self, *ids: int) -> CPUSet:
        return self._union(self._by_l3, ids)

    def cpus_in_l2s(self, *ids: int) -> CPUSet:
        return self._union(self._by_l2, ids)

    def cpus_in_cores(self, *ids: int) -> CPUSet:
        return self._union(self._by_core, ids)

    # ------------------------------------------------------------------ unit -> units
    def _ids_within(self, groups: Mapping[Any, CPUSet], within: CPUSet) -> list[Any]:
        return [k for k, v in groups.items() if v.bits & within.bits]

    def cores_in(self, cpus: CPUSet) -> list[int]:
        """Cores with at least one CPU in `cpus`."""
        return self._ids_within(self._by_core, cpus)

    def cores_in_socket(self, socket: int) -> list[int]:
        return self.cores_in(self.cpus_in_sockets(socket))

    def cores_in_l3(self, l3: int) -> list[int]:
        return self.cores_in(self.cpus_in_l3s(l3))

    def numa_nodes_in(self, cpus: CPUSet) -> list[int]:
        return self._ids_within(self._by_numa, cpus)

    def numa_nodes_in_socket(self, socket: int) -> list[int]:
        return self.numa_nodes_in(self.cpus_in_sockets(socket))

    def l3s_in(self, cpus: CPUSet) -> list[int]:
        return self._ids_within(self._by_l3, cpus)

    def sockets_in(self, cpus: CPUSet) -> list[int]:
        return self._ids_within(self._by_socket, cpus)

    # ------------------------------------------------------------------ CPU -> unit
    def socket_of(self, cpu: int) -> int | None:
        return self.cpu(cpu).socket

    def numa_of(self, cpu: int) -> int | None:
        return self.cpu(cpu).numa

    def l3_of(self, cpu: int) -> int | None:
        return self.cpu(cpu).l3

    def l2_of(self, cpu: int) -> int | None:
        return self.cpu(cpu).l2

    def core_of(self, cpu: int) -> int | None:
        return self.cpu(cpu).core

    def siblings_of(self, cpu: int) -> CPUSet:
        """The SMT siblings of `cpu`, itself included (empty if offline)."""
        core = self.cpu(cpu).core
        return self._by_core.get(core, _EMPTY) if core is not None else _EMPTY

    def mems_of(self, cpus: CPUSet) -> CPUSet:
        """NUMA node ids holding `cpus`, as a set of node ids (for cpuset.mems)."""
        return CPUSet(self.numa_nodes_in(cpus))

    # ------------------------------------------------------------------ pool tree
    def _kind_groups(self) -> list[tuple[str, Mapping[Any, CPUSet]]]:
        return [
            ("socket", self._by_socket),
            ("die", self._by_die),
            ("numa", self._by_numa),
            ("l3", self._by_l3),
            ("core", self._by_core),
        ]

    def level_order(self) -> tuple[str, ...]:
        """The levels of the pool tree from the top: socket, die, numa, l3, core - except that
        a kind whose every unit holds whole units of a kind above it, and some hold several,
        moves above that kind (as hwloc puts a cache above the packages it spans): one L3 over
        several NUMA nodes (sub-NUMA clustering) comes before them, one L3 and one NUMA node
        over every cluster of a DynamIQ SoC numbered as packages come before the packages."""
        kinds = self._kind_groups()
        owner: dict[str, dict[int, Any]] = {}
        for kind, groups in kinds:
            table: dict[int, Any] = {}
            for key, cpus in groups.items():
                for cpu in cpus:
                    table[cpu] = key
            owner[kind] = table

        def refines(groups: Mapping[Any, CPUSet], other: str) -> bool:
            """Every unit of `groups` lies inside one unit of kind `other` (where it says)."""
            table = owner[other]
            return all(len({table[c] for c in cpus if c in table}) <= 1 for cpus in groups.values())

        order: list[tuple[str, Mapping[Any, CPUSet]]] = []
        for kind, groups in kinds:
            at = len(order)
            for i, (placed, placed_groups) in enumerate(order):
                if refines(placed_groups, kind) and not refines(groups, placed):
                    at = i
                    break
            order.insert(at, (kind, groups))
        return tuple(kind for kind, _ in order)

    def pool_tree(self) -> PoolNode:
        """The tree socket -> die -> numa -> l3 -> core -> thread over the online CPUs, in the
        order of `level_order()`.

        Where a cache or NUMA node straddles the level above it without holding its units
        whole, each parent gets the part of it that lies inside the parent; CPUs that a level
        does not cover (no NUMA node online for them, no L3) go straight to the next level.
        So every online CPU appears exactly once among the leaves."""
        groups_of = dict(self._kind_groups())

        def level(kinds: list[str], within: CPUSet) -> tuple[PoolNode, ...]:
            if not kinds:
                return tuple(PoolNode("thread", cpu, CPUSet.of(cpu)) for cpu in within)
            kind, rest = kinds[0], kinds[1:]
            out = []
            covered = 0
            for key, cpus in groups_of[kind].items():
                part = cpus & within
                if part:
                    covered |= part.bits
                    ident = key[1] if kind == "die" else key
                    out.append(PoolNode(kind, ident, part, level(rest, part)))
            if not out:  # the machine exposes no such unit here: skip the level
                return level(rest, within)
            loose = within.bits & ~covered
            if loose:
                out.extend(level(rest, CPUSet.from_bits(loose)))
            return tuple(out)

        return PoolNode(
            "machine", None, self._online, level(list(self.level_order()), self._online)
        )

    # ------------------------------------------------------------------ JSON
    def to_json(self) -> dict[str, Any]:
        return {
            "cpus": [c.to_json() for c in self._cpus],
            "numa_nodes": [n.to_json() for n in self._numa_nodes],
            "devices": [d.to_json() for d in self.devices],
        }

    @classmethod
    def from_json(cls, data: object) -> Topology:
        """Build from the JSON of `corepin topology -o json`, parsed (a dict) or as its text
        (`str` or UTF-8 `bytes`); unknown fields are ignored."""
        if isinstance(data, (str, bytes, bytearray)):
            data = _parse_json_text(data)
        if not isinstance(data, Mapping):
            raise TopologyError('topology JSON must be an object with a "cpus" list')
        rows = data.get("cpus")
        if not isinstance(rows, list) or not rows:
            raise TopologyError('topology JSON needs a non-empty "cpus" list')
        cpus = [_cpu_from_json(i, row) for i, row in enumerate(rows)]
        nodes = []
        raw_nodes = data.get("numa_nodes", [])
        if not isinstance(raw_nodes, list):
            raise TopologyError('"numa_nodes" must be a list')
        for i, row in enumerate(raw_nodes):
            nodes.append(_node_from_json(i, row))
        raw_devices = data.get("devices") or []
        if not isinstance(raw_devices, list):
            raise TopologyError('"devices" must be a list')
        devices = [Device.from_json(f"devices[{i}]", row) for i, row in enumerate(raw_devices)]
        return cls(cpus, nodes, devices=devices)

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Topology)
            and self._cpus == other._cpus
            and self._numa_nodes == other._numa_nodes
            and self.devices == other.devices
        )

    def __hash__(self) -> int:
        return hash(self._cpus)

    def __repr__(self) -> str:
        return (
            f"Topology({self.name or 'unnamed'}: {len(self._by_socket)} sockets, "
            f"{len(self._by_numa)} NUMA nodes, {len(self._by_l3)} L3, {len(self._by_core)} cores, "
            f"{len(self._online)}/{len(self._present)} CPUs online)"
        )


def _int_field(where: str, row: Mapping[str, Any], key: str, *, optional: bool) -> int | None:
    value = row.get(key)
    if value is None:
        if optional:
            return None
        raise TopologyError(f"{where}: field {key!r} is required")
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise TopologyError(f"{where}: field {key!r} must be a non-negative integer, got {value!r}")
    return value


def _cpu_from_json(i: int, row: object) -> CPUInfo:
    where = f"cpus[{i}]"
    if not isinstance(row, Mapping):
        raise TopologyError(f"{where} must be an object, got {row!r}")
    cpu = _int_field(where, row, "cpu", optional=False)
    assert cpu is not None
    if cpu >= MAX_CPUS:
        raise TopologyError(f"{where}: CPU id {cpu} is beyond the limit of {MAX_CPUS - 1}")
    where = f"cpus[{i}] (CPU {cpu})"
    online = row.get("online", True)
    isolated = row.get("isolated", False)
    if not isinstance(online, bool) or not isinstance(isolated, bool):
        raise TopologyError(f'{where}: "online" and "isolated" must be true or false')
    core_type = row.get("core_type")
    if core_type is not None and not isinstance(core_type, str):
        raise TopologyError(f'{where}: "core_type" must be a string or null, got {core_type!r}')
    core = _int_field(where, row, "core", optional=True)
    if core is None and online:
        core = cpu  # a CPU without core information is its own core
    return CPUInfo(
        cpu=cpu,
        online=online,
        socket=_int_field(where, row, "socket", optional=not online),
        die=_int_field(where, row, "die", optional=True),
        numa=_int_field(where, row, "numa", optional=True),
        l3=_int_field(where, row, "l3", optional=True),
        l2=_int_field(where, row, "l2", optional=True),
        core=core,
        cluster=_int_field(where, row, "cluster", optional=True),
        isolated=isolated,
        core_type=core_type,
        capacity=_int_field(where, row, "capacity", optional=True),
    )


def _node_from_json(i: int, row: object) -> NUMANode:
    where = f"numa_nodes[{i}]"
    if not isinstance(row, Mapping):
        raise TopologyError(f"{where} must be an object, got {row!r}")
    node = _int_field(where, row, "id", optional=False)
    assert node is not None
    text = row.get("cpus", "")
    if not isinstance(text, str):
        raise TopologyError(f'{where}: "cpus" must be a CPU list string, got {text!r}')
    try:
        cpus = CPUSet.parse(text)
    except ValueError as exc:
        raise TopologyError(f"{where}: {exc}") from exc
    raw = row.get("distances") or {}
    if not isinstance(raw, Mapping):
        raise TopologyError(f'{where}: "distances" must be an object')
    distances: dict[int, int] = {}
    for key, value in raw.items():
        try:
            other = int(key)
        except (TypeError, ValueError):
            raise TopologyError(f"{where}: distance key {key!r} is not a node id") from None
        if isinstance(value, bool) or not isinstance(value, int):
            raise TopologyError(f"{where}: distance to {key} must be an integer, got {value!r}")
        distances[other] = value
    memory = row.get("memory_kb")
    if memory is not None and (isinstance(memory, bool) or not isinstance(memory, int)):
        raise TopologyError(f'{where}: "memory_kb" must be an integer')
    return NUMANode(node, cpus, distances, memory)


def _parse_json_text(text: str | bytes | bytearray) -> object:
    """The value of a JSON text; TopologyError saying where it is not JSON."""
    try:
        return json.loads(text)
    except UnicodeDecodeError as exc:
        raise TopologyError(f"topology JSON text is not UTF-8: {exc}", reason="bad_json") from None
    except json.JSONDecodeError as exc:
        raise TopologyError(
            f"topology JSON text is not valid JSON: {exc.msg} at line {exc.lineno} column "
            f"{exc.colno}",
            reason="bad_json",
        ) from None
