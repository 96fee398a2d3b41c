"""Host-side checks of what a guest shows (shared by the per-shape guest test modules)."""

from __future__ import annotations

import json
import shlex
from collections import defaultdict
from typing import Any

from .guest import REPO, Guest
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
    """The JSON objects in `text`, in order: each starts at the beginning of a line and may go
    on over several lines (corepin indents its JSON; the probe writes one line)."""
    decoder = json.JSONDecoder()
    out: list[dict[str, Any]] = []
    at = 0
    while True:
        start = text.find("{", at)
        if start < 0:
            return out
        if start > 0 and text[start - 1] != "\n":
            at = start + 1
            continue
        obj, at = decoder.raw_decode(text, start)
        out.append(obj)


def guest_check(guest: Guest, script: str, *args: str, timeout: float = 600.0) -> tuple[int, Any]:
    """Run a guest check (`tests/vm/SCRIPT --this-machine-is-mine ARGS...`) in the guest: its
    exit status and the JSON object it printed last (asserted to be there)."""
    result = guest.run(
        ["python", str(REPO / "tests" / "vm" / script), "--this-machine-is-mine", *args],
        timeout=timeout,
    )
    found = [line for line in result.stdout.splitlines() if line.startswith("{")]
    assert found, result.output
    return result.returncode, json.loads(found[-1])


def probe_self(*args: str) -> str:
    """The shell words of the probe printing its own pinning (plus `args`)."""
    return f"{PROBE} self {' '.join(shlex.quote(a) for a in args)}"


def cpus(text: str) -> set[int]:
    """The CPUs of a Linux list ("0-3,8")."""
    out: set[int] = set()
    for part in text.strip().split(","):
        if part:
            lo, _, hi = part.partition("-")
            out.update(range(int(lo), int(hi or lo) + 1))
    return out


#: shell: the guest's own NUMA nodes and L3 caches, as `NODE <cpus>` and `L3 <cpus>` lines
SYSFS_GROUPS = (
    "for f in /sys/devices/system/node/node*/cpulist; do echo NODE $(cat $f); done; "
    "cat /sys/devices/system/cpu/cpu*/cache/index3/shared_cpu_list 2> /dev/null | sort -u | "
    "sed 's/^/L3 /'"
)


def churn_script(trace: list[tuple[str, str, int]], policy: str, state: str) -> str:
    """Shell replaying `trace` - ("add", id, n) or ("remove", id, 0) - through `corepin run
    --exclusive n --policy POLICY`: every run holds a shell that records its own
    Cpus_allowed_list as `RUN <policy> <id> <n> <cpus>` and then blocks reading a FIFO until
    it is removed (no polling: the guest's CPUs are all emulated by one host thread)."""
    held = f"/tmp/churn-{policy}"
    out = [f"mkdir -p {held}; rm -rf {state}; mkdir -m 700 {state}"]
    for op, rid, n in trace:
        flag = f"{held}/{rid}"
        if op == "add":
            body = (
                f"mkfifo {flag}.done; echo RUN {policy} {rid} {n} $(sed -n "
                f"'s/^Cpus_allowed_list:\\s*//p' /proc/$$/status) > {flag}.tmp; "
                f"mv {flag}.tmp {flag}; read _ < {flag}.done"
            )
            out.append(
                f"corepin run --state-dir {state} --policy {policy} --exclusive {n} -- "
                f"sh -c {shlex.quote(body)} > {flag}.log 2>&1 & echo $! > {flag}.runner"
            )
            out.append(
                f"while [ ! -e {flag} ]; do kill -0 $(cat {flag}.runner) 2> /dev/null || "
                f"{{ cat {flag}.log >&2; exit 1; }}; sleep 0.1; done; cat {flag}"
            )
        else:
            out.append(f"echo > {flag}.done; wait $(cat {flag}.runner)")
    live = [rid for op, rid, _ in trace if op == "add"]
    live = [rid for rid in live if ("remove", rid, 0) not in trace]
    out.append(f"for r in {' '.join(live)}; do echo > {held}/$r.done; done; wait")
    return "\n".join(out)


def alignment(runs: list[tuple[int, set[int]]], units: list[set[int]]) -> float:
    """The share of `runs` (n, cpus) spanning the fewest of `units` (equal-sized groups of
    CPUs: NUMA nodes or L3 caches) that n CPUs could span."""
    size = max(len(u) for u in units)
    aligned = 0
    for n, got in runs:
        spans = sum(1 for u in units if u & got)
        aligned += spans == -(-n // size)
    return aligned / len(runs)


def placement(guest: Guest, trace: list[tuple[str, str, int]]) -> dict[str, Any]:
    """Replay `trace` under topology-aware and kubelet-static in the guest; per policy the
    NUMA and L3 alignment of what the runs' processes were allowed (from /proc), against the
    guest's sysfs. Also checks that runs held at the same time never shared a CPU."""
    policies = ("topology-aware", "kubelet-static")
    text = "\n".join(
        ["set -e", SYSFS_GROUPS]
        + [churn_script(trace, p, f"/tmp/churn-state-{p}") for p in policies]
    )
    result = guest.run(text, timeout=600).check()
    nodes = [cpus(line[5:]) for line in result.stdout.splitlines() if line.startswith("NODE ")]
    l3 = [cpus(line[3:]) for line in result.stdout.splitlines() if line.startswith("L3 ")]
    got: dict[str, dict[str, tuple[int, set[int]]]] = {p: {} for p in policies}
    for line in result.stdout.splitlines():
        if line.startswith("RUN "):
            _, policy, rid, n, allowed = line.split()
            got[policy][rid] = (int(n), cpus(allowed))
    report: dict[str, Any] = {"nodes": nodes, "l3": l3}
    for policy in policies:
        live: dict[str, set[int]] = {}
        for op, rid, _ in trace:
            if op == "add":
                n, mine = got[policy][rid]
                assert len(mine) == n, f"{policy} {rid}: {sorted(mine)} is not {n} CPUs"
                for other, theirs in live.items():
                    assert not mine & theirs, f"{policy}: {rid} and {other} share CPUs"
                live[rid] = mine
            else:
                live.pop(rid)
        runs = list(got[policy].values())
        report[policy] = {
            "numa": alignment(runs, nodes),
            "l3": alignment(runs, l3),
            "cpus": {rid: sorted(c) for rid, (_, c) in got[policy].items()},
        }
    return report
