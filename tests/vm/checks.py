"""Host-side checks of what a guest shows (shared by the per-shape guest test modules)."""

from __future__ import annotations

import json
import shlex
from collections import defaultdict
from typing import Any

from .guest import Guest
from .shapes import Shape, cpu_list

PROBE = "python tests/vm/probe.py"


def groups(rows: list[dict[str, Any]], key: str) -> set[frozenset[int]]:
    """The online CPUs of `rows` (topology JSON) grouped by `key`, as a set of sets."""
    by: dict[Any, set[int]] = defaultdict(set)
    for row in rows:
        if row["online"]:
            by[(row["socket"], row[key]) if key == "core" else row[key]].add(row["cpu"])
    return {frozenset(g) for g in by.values()}


def as_sets(lists: Any) -> set[frozenset[int]]:
    return {frozenset(g) for g in lists}


def topology_mismatches(shape: Shape, data: dict[str, Any]) -> list[str]:
    """How `corepin topology -o json` output `data` differs from what QEMU was asked for."""
    want = shape.expected()
    rows = data["cpus"]
    out: list[str] = []

    def same(what: str, got: object, expected: object) -> None:
        if got != expected:
            out.append(f"{what}: corepin shows {got}, QEMU was asked for {expected}")

    same("online CPUs", sorted(r["cpu"] for r in rows if r["online"]), want["online"])
    same("offline CPUs", sorted(r["cpu"] for r in rows if not r["online"]), want["offline"])
    same("isolated CPUs", sorted(r["cpu"] for r in rows if r.get("isolated")), want["isolated"])
    same("sockets", groups(rows, "socket"), as_sets(want["sockets"]))
    same("SMT siblings (cores)", groups(rows, "core"), as_sets(want["siblings"]))
    same("L3 groups", groups(rows, "l3"), as_sets(want["l3"]))
    nodes = {n["id"]: n for n in data["numa_nodes"]}
    expected_nodes: dict[int, list[int]] = want["nodes"]  # type: ignore[assignment]
    same(
        "NUMA nodes",
        {i: n["cpus"] for i, n in nodes.items()},
        {i: cpu_list(c) for i, c in expected_nodes.items()},
    )
    same(
        "NUMA distances",
        {i: {int(k): v for k, v in n["distances"].items()} for i, n in nodes.items()},
        want["distances"],
    )
    same(
        "NUMA node of each CPU",
        {r["cpu"]: r["numa"] for r in rows if r["online"]},
        {c: shape.node_of(c) for c in shape.online},
    )
    return out


def topology(guest: Guest) -> dict[str, Any]:
    result = guest.run("corepin topology -o json").check()
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def lines(text: str) -> list[dict[str, Any]]:
    """The JSON objects of the lines of `text` that hold one."""
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def probe_self(*args: str) -> str:
    """The shell words of the probe printing its own pinning (plus `args`)."""
    return f"{PROBE} self {' '.join(shlex.quote(a) for a in args)}"
