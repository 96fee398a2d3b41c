"""Hypothesis strategies for the machine shapes whose sysfs attributes disagree (shared by the
discovery round trips and the allocator properties):

- `compute_unit_specs()`: AMD family 15h-like machines, single-thread cores sharing an L2 in
  compute units of 1-3 cores (written with `corepin.testing.compute_unit_files`);
- `cluster_specs()`: arm64 SoCs of clusters, numbered as packages or inside one package, with one
  L3 over every cluster, one per cluster or none, NUMA nodes over several clusters.
"""

from __future__ import annotations

from hypothesis import strategies as st

from corepin.testing.machines import ClusterSpec, SyntheticSpec


def _offline_isolated(draw: st.DrawFn, total: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    offline = draw(st.sets(st.integers(0, total - 1), max_size=min(total - 1, 4)))
    isolated = draw(st.sets(st.integers(0, total - 1), max_size=3))
    return tuple(sorted(offline)), tuple(sorted(isolated))


@st.composite
def compute_unit_specs(draw: st.DrawFn) -> SyntheticSpec:
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
    offline, isolated = _offline_isolated(draw, spec.cpu_count)
    return SyntheticSpec(
        **{
            **{f: getattr(spec, f) for f in spec.__dataclass_fields__},
            "offline": offline,
            "isolated": isolated,
        }
    )


@st.composite
def cluster_specs(draw: st.DrawFn) -> ClusterSpec:
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
    offline, isolated = _offline_isolated(draw, spec.cpu_count)
    return ClusterSpec(
        **{
            **{f: getattr(spec, f) for f in spec.__dataclass_fields__},
            "offline": offline,
            "isolated": isolated,
        }
    )
