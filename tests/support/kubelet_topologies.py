"""CPU topology shapes of the kubelet CPU manager's unit tests, as corepin Topology objects.

Each is named after the kubelet's own fixture (`topo_dual_socket_ht` is `topoDualSocketHT`), and
`get(name)` takes the kubelet's spelling.

Each builder reproduces one fixture's facts (CPU -> core id, socket, NUMA node, uncore cache);
the `core` field holds the fixture's CoreID, which is not always the lowest CPU of the core
(allowed: ids only need to be unique and shared by siblings). Fixtures without uncore caches
get l3 = None for every CPU: the allocator reads it as 0 (Go's zero value, one uncore cache),
and the corepin model does not allow one L3 instance to span sockets. Where a fixture was only
visible through the expected results of the tests that use it, the docstring says "inferred".
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from corepin.topology.model import CPUInfo, Topology

Row = tuple[int, int, int, int, int | None]  # cpu, core, socket, numa, l3 (None: no uncore)


def build(name: str, rows: Iterable[Row]) -> Topology:
    return Topology(
        [CPUInfo(cpu=c, core=core, socket=s, die=s, numa=n, l3=u) for c, core, s, n, u in rows],
        name=name,
    )


def topo_single_socket_ht() -> Topology:
    """topoSingleSocketHT: 8 CPUs, 4 cores, core i = {i, i+4}."""
    return build("topoSingleSocketHT", ((c, c % 4, 0, 0, None) for c in range(8)))


def topo_dual_socket_ht() -> Topology:
    """topoDualSocketHT: 12 CPUs; even CPUs socket/NUMA 0, odd socket/NUMA 1; core i = {i, i+6}."""
    return build("topoDualSocketHT", ((c, c % 6, c % 2, c % 2, None) for c in range(12)))


def topo_dual_socket_no_ht() -> Topology:
    """topoDualSocketNoHT: 8 CPUs, one per core, socket/NUMA 0 = 0-3, 1 = 4-7."""
    return build("topoDualSocketNoHT", ((c, c, c // 4, c // 4, None) for c in range(8)))


def topo_triple_socket_ht() -> Topology:
    """topoTripleSocketHT: 18 CPUs, core = cpu // 2; CPUs 0-5 socket 1, 6-11 socket 0, 12-17
    socket 2 (NUMA node = socket)."""
    socket_of = {0: 1, 1: 0, 2: 2}
    return build(
        "topoTripleSocketHT",
        ((c, c // 2, socket_of[c // 6], socket_of[c // 6], None) for c in range(18)),
    )


# topoQuadSocketFourWayHT (KNL SNC4): socket -> [(core id, its 4 CPUs), ...]
_QUAD: dict[int, list[tuple[int, tuple[int, int, int, int]]]] = {
    0: [
        (0, (0, 169, 109, 229)), (1, (50, 170, 110, 230)), (64, (1, 25, 13, 38)),
        (65, (2, 26, 14, 39)), (72, (9, 33, 21, 46)), (73, (10, 34, 22, 47)),
        (8, (57, 177, 117, 237)), (9, (58, 178, 118, 238)), (24, (71, 191, 131, 251)),
        (25, (72, 192, 132, 252)), (32, (79, 199, 139, 259)), (33, (80, 200, 140, 260)),
        (40, (87, 207, 147, 267)), (41, (88, 208, 148, 268)), (48, (95, 215, 155, 275)),
        (49, (96, 216, 156, 276)), (56, (103, 223, 163, 283)), (57, (104, 224, 164, 284)),
    ],
    1: [
        (66, (3, 27, 15, 40)), (67, (4, 28, 16, 41)), (74, (11, 35, 23, 48)),
        (75, (12, 36, 24, 49)), (2, (51, 171, 111, 231)), (3, (52, 172, 112, 232)),
        (10, (59, 179, 119, 239)), (11, (60, 180, 120, 240)), (18, (65, 185, 125, 245)),
        (19, (66, 186, 126, 246)), (26, (73, 193, 133, 253)), (27, (74, 194, 134, 254)),
        (34, (81, 201, 141, 261)), (35, (82, 202, 142, 262)), (42, (89, 209, 149, 269)),
        (43, (90, 210, 150, 270)), (50, (97, 217, 157, 277)), (51, (98, 218, 158, 278)),
    ],
    2: [
        (68, (5, 29, 17, 42)), (69, (6, 30, 18, 43)), (4, (53, 173, 113, 233)),
        (5, (54, 174, 114, 234)), (12, (61, 181, 121, 241)), (13, (62, 182, 122, 242)),
        (20, (67, 187, 127, 247)), (21, (68, 188, 128, 248)), (28, (75, 195, 135, 255)),
        (29, (76, 196, 136, 256)), (36, (83, 203, 143, 263)), (37, (84, 204, 144, 264)),
        (44, (91, 211, 151, 271)), (45, (92, 212, 152, 272)), (52, (99, 219, 159, 279)),
        (53, (100, 220, 160, 280)), (60, (105, 225, 165, 285)), (61, (106, 226, 166, 286)),
    ],
    3: [
        (70, (7, 31, 19, 44)), (71, (8, 32, 20, 45)), (63, (37, 168, 108, 228)),
        (62, (107, 227, 167, 287)), (6, (55, 175, 115, 235)), (7, (56, 176, 116, 236)),
        (14, (63, 183, 123, 243)), (15, (64, 184, 124, 244)), (22, (69, 189, 129, 249)),
        (23, (70, 190, 130, 250)), (30, (77, 197, 137, 257)), (31, (78, 198, 138, 258)),
        (38, (85, 205, 145, 265)), (39, (86, 206, 146, 266)), (46, (93, 213, 153, 273)),
        (47, (94, 214, 154, 274)), (54, (101, 221, 161, 281)), (55, (102, 222, 162, 282)),
    ],
}  # fmt: skip


def topo_quad_socket_four_way_ht() -> Topology:
    """topoQuadSocketFourWayHT: 288 CPUs, 72 cores of 4 threads, 4 sockets (NUMA = socket);
    core ids are the fixture's (e.g. core 64 = CPUs 1,13,25,38)."""
    rows = [
        (cpu, core, s, s, None)
        for s, cores in _QUAD.items()
        for core, cpus in cores
        for cpu in cpus
    ]
    return build("topoQuadSocketFourWayHT", rows)


def topo_dual_socket_multi_numa_per_socket_ht() -> Topology:
    """topoDualSocketMultiNumaPerSocketHT (dual Xeon Gold 6230): 80 CPUs, core = cpu % 40,
    NUMA n = cores 10n..10n+9, sockets 0 = NUMA 0,1 and 1 = NUMA 2,3."""
    rows = ((c, c % 40, (c % 40) // 20, (c % 40) // 10, None) for c in range(80))
    return build("topoDualSocketMultiNumaPerSocketHT", rows)


def fake_topo_multi_socket_dual_socket_per_numa_ht() -> Topology:
    """fakeTopoMultiSocketDualSocketPerNumaHT: the 6230 with sockets and NUMA nodes swapped:
    4 sockets of 10 cores, NUMA 0 = sockets 0,1 and NUMA 1 = sockets 2,3."""
    rows = ((c, c % 40, (c % 40) // 10, (c % 40) // 20, None) for c in range(80))
    return build("fakeTopoMultiSocketDualSocketPerNumaHT", rows)


def topo_dual_socket_multi_numa_per_socket_ht_large() -> Topology:
    """topoDualSocketMultiNumaPerSocketHTLarge (dual EPYC 7742, NPS=4): 256 CPUs, core =
    cpu % 128, NUMA n = cores 16n..16n+15, socket = core // 64."""
    rows = ((c, c % 128, (c % 128) // 64, (c % 128) // 16, None) for c in range(256))
    return build("topoDualSocketMultiNumaPerSocketHTLarge", rows)


_GENOA_L3 = (0, 4, 8, 2, 6, 10, 3, 7, 11, 1, 5, 9)


def topo_dual_socket_single_numa_per_socket_ht_large_cache_groups() -> Topology:
    """topoDualSocketSingleNumaPerSocketHTLargeCacheGroups (dual EPYC 9654): 384 CPUs, core =
    cpu % 192, socket = NUMA = core // 96, 24 uncore caches of 8 cores with the fixture's
    interleaved ids (cores 0-7 -> 0, 8-15 -> 4, 16-23 -> 8, 24-31 -> 2, ...; socket 1 adds 16)."""
    rows = []
    for c in range(384):
        core = c % 192
        s = core // 96
        rows.append((c, core, s, s, _GENOA_L3[(core % 96) // 8] + 16 * s))
    return build("topoDualSocketSingleNumaPerSocketHTLargeCacheGroups", rows)


def topo_uncore_single_socket_no_smt() -> Topology:
    """topoUncoreSingleSocketNoSMT (inferred): 16 CPUs, no SMT, 4 uncore caches of 4 CPUs."""
    return build("topoUncoreSingleSocketNoSMT", ((c, c, 0, 0, c // 4) for c in range(16)))


def topo_uncore_dual_socket_no_smt() -> Topology:
    """topoUncoreDualSocketNoSMT (inferred): 16 CPUs, no SMT, sockets/NUMA 0-7 and 8-15,
    uncore caches of 4 CPUs."""
    return build("topoUncoreDualSocketNoSMT", ((c, c, c // 8, c // 8, c // 4) for c in range(16)))


def topo_uncore_single_socket_multi_numa() -> Topology:
    """topoUncoreSingleSocketMultiNuma (inferred): 16 CPUs, no SMT, one socket, NUMA 0-7 and
    8-15, uncore caches of 4 CPUs."""
    return build("topoUncoreSingleSocketMultiNuma", ((c, c, 0, c // 8, c // 4) for c in range(16)))


def topo_uncore_single_socket_smt() -> Topology:
    """topoUncoreSingleSocketSMT (inferred): 16 CPUs, core i = {i, i+8}, uncore caches of 4
    cores (0-3,8-11 and 4-7,12-15)."""
    return build("topoUncoreSingleSocketSMT", ((c, c % 8, 0, 0, (c % 8) // 4) for c in range(16)))


def topo_single_socket_single_numa_smt_small_uncore() -> Topology:
    """topoSingleSocketSingleNumaPerSocketSMTSmallUncore (inferred): 128 CPUs, core i =
    {i, i+64}, 16 uncore caches of 4 cores (8 CPUs)."""
    return build(
        "topoSingleSocketSingleNumaPerSocketSMTSmallUncore",
        ((c, c % 64, 0, 0, (c % 64) // 4) for c in range(128)),
    )


def topo_small_single_socket_no_smt_uncore() -> Topology:
    """topoSmallSingleSocketSingleNumaPerSocketNoSMTUncore (inferred): 32 CPUs, no SMT, 4 uncore
    caches of 8 CPUs."""
    return build(
        "topoSmallSingleSocketSingleNumaPerSocketNoSMTUncore",
        ((c, c, 0, 0, c // 8) for c in range(32)),
    )


def topo_large_single_socket_smt_uncore() -> Topology:
    """topoLargeSingleSocketSingleNumaPerSocketSMTUncore (inferred): 256 CPUs, core i =
    {i, i+128}, 16 uncore caches of 8 cores (16 CPUs)."""
    return build(
        "topoLargeSingleSocketSingleNumaPerSocketSMTUncore",
        ((c, c % 128, 0, 0, (c % 128) // 8) for c in range(256)),
    )


def topo_dual_socket_sub_numa_ht_monolithic_uncore() -> Topology:
    """topoDualSocketSubNumaPerSocketHTMonolithicUncore (inferred): 240 CPUs, core i =
    {i, i+120}, sockets of 60 cores, 2 NUMA nodes of 30 cores per socket, one uncore cache per
    socket."""
    rows = []
    for c in range(240):
        core = c % 120
        rows.append((c, core, core // 60, core // 30, core // 60))
    return build("topoDualSocketSubNumaPerSocketHTMonolithicUncore", rows)


ALL: dict[str, Callable[[], Topology]] = {
    "topoSingleSocketHT": topo_single_socket_ht,
    "topoDualSocketHT": topo_dual_socket_ht,
    "topoDualSocketNoHT": topo_dual_socket_no_ht,
    "topoTripleSocketHT": topo_triple_socket_ht,
    "topoQuadSocketFourWayHT": topo_quad_socket_four_way_ht,
    "topoDualSocketMultiNumaPerSocketHT": topo_dual_socket_multi_numa_per_socket_ht,
    "fakeTopoMultiSocketDualSocketPerNumaHT": fake_topo_multi_socket_dual_socket_per_numa_ht,
    "topoDualSocketMultiNumaPerSocketHTLarge": topo_dual_socket_multi_numa_per_socket_ht_large,
    "topoDualSocketSingleNumaPerSocketHTLargeCacheGroups": (
        topo_dual_socket_single_numa_per_socket_ht_large_cache_groups
    ),
    "topoUncoreSingleSocketNoSMT": topo_uncore_single_socket_no_smt,
    "topoUncoreDualSocketNoSMT": topo_uncore_dual_socket_no_smt,
    "topoUncoreSingleSocketMultiNuma": topo_uncore_single_socket_multi_numa,
    "topoUncoreSingleSocketSMT": topo_uncore_single_socket_smt,
    "topoSingleSocketSingleNumaPerSocketSMTSmallUncore": (
        topo_single_socket_single_numa_smt_small_uncore
    ),
    "topoSmallSingleSocketSingleNumaPerSocketNoSMTUncore": topo_small_single_socket_no_smt_uncore,
    "topoLargeSingleSocketSingleNumaPerSocketSMTUncore": topo_large_single_socket_smt_uncore,
    "topoDualSocketSubNumaPerSocketHTMonolithicUncore": (
        topo_dual_socket_sub_numa_ht_monolithic_uncore
    ),
}

_built: dict[str, Topology] = {}


def get(name: str) -> Topology:
    """The named fixture, built once."""
    topo = _built.get(name)
    if topo is None:
        topo = _built[name] = ALL[name]()
    return topo
