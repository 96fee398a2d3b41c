"""Hypothesis strategies that several test modules draw from.

- CPU sets: `cpu_id_sets(...)` (plain frozensets of ids, for tests that use Python's sets as the
  model), `cpusets(...)` (the same as `CPUSet`), `cpu_subsets(cpus)` (any subset of the given
  CPUs, each one in or out by a coin: "what is still available" on a machine).
- Machines: `build_shapes(threads)` (the arguments of `alloc_topologies.build`: sockets, NUMA
  nodes per socket, L3s per node, cores per L3, threads), `synthetic_specs()` (any
  `SyntheticSpec`, hybrid and memory-only nodes included), and the machines whose sysfs
  attributes disagree: `compute_unit_specs()` (AMD family 15h-like: single-thread cores sharing
  an L2 in compute units of 1-3 cores, written with `corepin.testing.compute_unit_files`) and
  `cluster_specs()` (arm64 SoCs of clusters, numbered as packages or inside one package, with
  one L3 over every cluster, one per cluster or none, NUMA nodes over several clusters).
- JSON: `json_values(...)`, any JSON document (for the readers of wire formats fed garbage).

Each takes the sizes its callers need as arguments, so that a test draws what it drew before.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hypothesis import strategies as st

from corepin.core.cpuset import CPUSet
from corepin.testing.machines import ClusterSpec, SyntheticSpec


# ---------------------------------------------------------------------- CPU sets
def cpu_id_sets(
    ids: st.SearchStrategy[int] | None = None, *, min_size: int = 0, max_size: int = 24
) -> st.SearchStrategy[frozenset[int]]:
    """Sets of CPU ids drawn from `ids` (default: 0-511)."""
    return st.frozensets(
        st.integers(0, 511) if ids is None else ids, min_size=min_size, max_size=max_size
    )


def cpusets(
    ids: st.SearchStrategy[int] | None = None, *, min_size: int = 0, max_size: int = 24
) -> st.SearchStrategy[CPUSet]:
    """`cpu_id_sets(...)` as CPUSets."""
    return cpu_id_sets(ids, min_size=min_size, max_size=max_size).map(CPUSet)


def cpu_subsets(cpus: Sequence[int]) -> st.SearchStrategy[CPUSet]:
    """Any subset of `cpus`: each one kept or left out by a coin."""
    ordered = list(cpus)
    return st.lists(st.booleans(), min_size=len(ordered), max_size=len(ordered)).map(
        lambda keep: CPUSet(c for c, k in zip(ordered, keep, strict=True) if k)
    )


# ---------------------------------------------------------------------- machines
def build_shapes(
    threads: st.SearchStrategy[int] | None = None,
) -> st.SearchStrategy[tuple[int, int, int, int, int]]:
    """(sockets 1-2, NUMA nodes per socket 1-2, L3s per node 1-3, cores per L3 1-4, threads)
    for `alloc_topologies.build`; `threads` default: 1 or 2."""
    return st.tuples(
        st.integers(1, 2),
        st.integers(1, 2),
        st.integers(1, 3),
        st.integers(1, 4),
        st.sampled_from([1, 2]) if threads is None else threads,
    )


def _with_offline_and_isolated(spec: Any, offline: set[int], isolated: set[int]) -> Any:
    fields = {f: getattr(spec, f) for f in spec.__dataclass_fields__}
    return type(spec)(
        **{**fields, "offline": tuple(sorted(offline)), "isolated": tuple(sorted(isolated))}
    )


def _few_offline_and_isolated(draw: st.DrawFn, total: int) -> tuple[set[int], set[int]]:
    offline = draw(st.sets(st.integers(0, total - 1), max_size=min(total - 1, 4)))
    isolated = draw(st.sets(st.integers(0, total - 1), max_size=3))
    return offline, isolated


@st.composite
def synthetic_specs(draw: st.DrawFn) -> SyntheticSpec:
    """Any regular machine: 1-2 sockets of 1-2 dies, hybrid or not, SMT 1, 2 or 4, shared L2s,
    memory-only nodes, socket ids of its own; any CPUs offline (one stays online) or isolated."""
    cores = draw(st.integers(0, 3))
    e_cores = draw(st.integers(0 if cores else 1, 3))
    sockets = draw(st.integers(1, 2))
    dies = draw(st.integers(1, 2))
    spec = SyntheticSpec(
        sockets=sockets,
        dies_per_socket=dies,
        numa_per_die=draw(st.integers(1, 2)),
        l3_per_numa=draw(st.integers(1, 2)),
        cores_per_l3=cores,
        threads_per_core=draw(st.sampled_from([1, 2, 2, 4])),
        numbering=draw(st.sampled_from(["interleaved", "linear"])),
        e_cores_per_l3=e_cores,
        e_cores_per_l2=draw(st.integers(1, 4)),
        cores_per_l2=draw(st.integers(1, 3)),
        memory_only_nodes=draw(st.integers(0, 2)),
        memory_kb_per_node=draw(st.none() | st.integers(0, 1 << 30)),
        socket_ids=draw(
            st.none()
            | st.lists(st.integers(0, 9000), min_size=sockets, max_size=sockets, unique=True).map(
                tuple
            )
        ),
    )
    total = spec.cpu_count
    offline = draw(st.sets(st.integers(0, total - 1), max_size=total - 1))
    isolated = draw(st.sets(st.integers(0, total - 1)))
    result: SyntheticSpec = _with_offline_and_isolated(spec, offline, isolated)
    return result


@st.composite
def compute_unit_specs(draw: st.DrawFn) -> SyntheticSpec:
    """AMD family 15h-like machines: single-thread cores sharing an L2 in compute units."""
    sockets = draw(st.integers(1, 2))
    spec = SyntheticSpec(
        sockets=sockets,
        dies_per_socket=draw(st.integers(1, 2)),
        numa_per_die=draw(st.integers(1, 2)),
        l3_per_numa=draw(st.integers(1, 2)),
        cores_per_l3=draw(st.integers(1, 6)),
        threads_per_core=1,
        cores_per_l2=draw(st.sampled_from([2, 2, 3, 1])),
        numbering=draw(st.sampled_from(["linear", "interleaved"])),
        socket_ids=draw(
            st.none()
            | st.lists(st.integers(0, 300), min_size=sockets, max_size=sockets, unique=True).map(
                tuple
            )
        ),
    )
    result: SyntheticSpec = _with_offline_and_isolated(
        spec, *_few_offline_and_isolated(draw, spec.cpu_count)
    )
    return result


@st.composite
def cluster_specs(draw: st.DrawFn) -> ClusterSpec:
    """arm64 SoCs of CPU clusters (see the module docstring)."""
    clusters = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=4)))
    capacities = draw(
        st.none()
        | st.lists(
            st.sampled_from([160, 414, 512, 1024]),
            min_size=len(clusters),
            max_size=len(clusters),
        ).map(tuple)
    )
    spec = ClusterSpec(
        clusters=clusters,
        capacities=capacities,
        threads_per_core=draw(st.sampled_from([1, 1, 2])),
        shared_l2=draw(st.booleans()),
        l3=draw(st.sampled_from(["shared", "shared", "cluster", "none"])),
        package_per_cluster=draw(st.booleans()),
        numa_nodes=draw(st.integers(1, len(clusters))),
    )
    result: ClusterSpec = _with_offline_and_isolated(
        spec, *_few_offline_and_isolated(draw, spec.cpu_count)
    )
    return result


# ---------------------------------------------------------------------- JSON
def json_values(
    *, max_text: int = 12, max_key: int | None = None, max_leaves: int = 20
) -> st.SearchStrategy[Any]:
    """Any JSON value: null, booleans, numbers, strings of up to `max_text` characters, lists
    and objects (keys of up to `max_key` characters, default `max_text`) nested up to
    `max_leaves` leaves."""
    return st.recursive(
        st.none()
        | st.booleans()
        | st.integers()
        | st.floats(allow_nan=False)
        | st.text(max_size=max_text),
        lambda inner: (
            st.lists(inner, max_size=4)
            | st.dictionaries(st.text(max_size=max_key or max_text), inner, max_size=4)
        ),
        max_leaves=max_leaves,
    )
