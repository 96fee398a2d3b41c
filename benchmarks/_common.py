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
SIZED = {64: "synthetic-64", 256: "synthetic-256", 1024: "synthetic-1024"}
#: Topologies the quality benchmark compares policies on.
QUALITY = ("dual-socket-ht", "epyc-like", "four-numa-per-socket", "sixteen-numa")


def topology(name: str) -> Topology:
    """A named synthetic topology from corepin.topology.synthetic."""
    from corepin.topology import synthetic

    return synthetic.named(name)


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
