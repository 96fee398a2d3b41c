"""Shared helpers of the benchmark scripts: topologies, baseline file, statistics, output."""

from __future__ import annotations

import json
import math
import os
import platform
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
BASELINE = HERE / "baseline.json"

sys.path.insert(0, str(REPO / "src"))  # run from a checkout without installing

from corepin.topology.model import Topology  # noqa: E402

#: Topologies the latency and throughput benchmarks use, by CPU count.
SIZED = {64: "large_64", 256: "large_256", 1024: "large_1024"}
#: Topologies the quality benchmark compares policies on.
QUALITY = ("dual-socket-ht", "epyc-like", "four-numa-per-socket", "sixteen-numa")

#: Benchmark machines that are not among corepin.testing.machines.NAMED, as spec arguments.
_SPECS: dict[str, dict[str, Any]] = {
    # 2 sockets, 1 NUMA node and 1 L3 each, 16 cores x 2 threads per socket (64 CPUs)
    "dual-socket-ht": {"sockets": 2, "cores_per_l3": 16},
    # 2 sockets x 4 NUMA nodes, 1 L3 per node, 8 cores x 2 threads per node (128 CPUs)
    "four-numa-per-socket": {"sockets": 2, "numa_per_socket": 4, "cores_per_l3": 8},
}
#: Benchmark names for machines of corepin.testing.machines.NAMED.
_ALIASES = {
    # EPYC-like NPS1: 2 sockets, 1 NUMA each, 8 L3 (CCX) of 4 cores x 2 threads (128 CPUs)
    "epyc-like": "multi_l3_per_numa",
    # 2 sockets x 4 dies x 2 NUMA nodes, 2 cores x 2 threads per node (64 CPUs)
    "sixteen-numa": "sixteen_numa",
}


def topology(name: str) -> Topology:
    """A synthetic benchmark machine by name (see _SPECS, _ALIASES and synthetic.NAMED)."""
    from corepin.testing import machines as synthetic

    spec = _SPECS.get(name)
    if spec is not None:
        return synthetic.synthetic(synthetic.SyntheticSpec(name=name, **spec))
    return synthetic.named(_ALIASES.get(name, name))


def describe(topo: Topology) -> str:
    return (
        f"{len(topo.socket_ids())} sockets, {len(topo.numa_node_ids())} NUMA, "
        f"{len(topo.l3_ids())} L3, {len(topo.core_ids())} cores, "
        f"{len(topo.online_cpus)} CPUs, SMT {topo.threads_per_core}"
    )


def percentile(sorted_values: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile of an ascending sequence."""
    if not sorted_values:
        return math.nan
    rank = max(1, math.ceil(pct / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


def median(sorted_values: Sequence[float]) -> float:
    n = len(sorted_values)
    if n == 0:
        return math.nan
    mid = n // 2
    return sorted_values[mid] if n % 2 else (sorted_values[mid - 1] + sorted_values[mid]) / 2


def environment() -> dict[str, Any]:
    return {
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
    }


def load_baseline() -> dict[str, Any]:
    try:
        data = json.loads(BASELINE.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    return data if isinstance(data, dict) else {}


def record_baseline(section: str, figures: dict[str, Any]) -> None:
    """Replace one section of baseline.json with `figures` (other sections kept)."""
    data = load_baseline()
    data[section] = {"environment": environment(), "figures": figures}
    BASELINE.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def record_if_asked(record: bool, quick: bool, section: str, figures: dict[str, Any]) -> None:
    """`--record`: write `figures` as the baseline's `section`, saying so (a `--quick` run is
    never recorded: its figures come from too few samples)."""
    if not record:
        return
    if quick:
        print("not recording a --quick run as the baseline")
        return
    record_baseline(section, figures)
    print(f"baseline.json updated ({section})")


def pct(value: float | None) -> str:
    """A share as a percentage with one decimal (`-` for none)."""
    return "-" if value is None else f"{100 * value:.1f}%"


def baseline_figures(section: str) -> dict[str, Any]:
    got = load_baseline().get(section, {})
    figures = got.get("figures", {}) if isinstance(got, dict) else {}
    return figures if isinstance(figures, dict) else {}


def change(now: float, then: float | None, *, higher_is_better: bool) -> str:
    """`+12%` style change against the baseline, with a mark when it got worse by over 20%."""
    if then is None or not then or math.isnan(now):
        return "n/a"
    delta = (now - then) / then
    worse = -delta if higher_is_better else delta
    mark = "  WORSE" if worse > 0.20 else ""
    return f"{100 * delta:+.0f}%{mark}"


def table(rows: list[Sequence[str]], right_from: int = 1) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = []
    for row in rows:
        cells = [
            c.rjust(w) if i >= right_from else c.ljust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ]
        out.append("  ".join(cells).rstrip())
    return "\n".join(out)
