"""`corepin report` of this host: the state's report (`corepin.state.report.report_data`) with
what /proc says of each allocation's processes now (`live`).

`corepin report --agent SOCKET` shows a running agent's state with the live figures of this
host too (the agent's socket is on this host: its processes are in this /proc).

Reservations (`corepin reserve`): a `reservations` list, one row per reservation
(`reserve.reservation_row`: `name`, `cpus`, `expires` as RFC 3339 UTC or null, `consumed_by`
the run on it or null, and `withheld`, `level`, `reusable`); an expired one is never listed.

Node QoS: with resctrl a `qos_classes` list,
one entry per class with a resctrl group (`ResctrlClasses.describe()`: L3 ways per cache id,
memory bandwidth, occupancy); without resctrl nothing more.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from corepin.agent.host.agent import HostAgent
from corepin.agent.host.reserve import reservation_row
from corepin.core.cpuset import CPUSet
from corepin.core.errors import CorepinError
from corepin.state.report import report_data
from corepin.sysfs.procfs import ProcessGone, ProcessGroup, cpus_allowed_list, process_table

if TYPE_CHECKING:
    from corepin.state.model import HostState


def report(
    host: HostAgent,
    state: HostState,
    *,
    sample: float = 0.0,
    statuses: Mapping[str, str | None] | None = None,
    resctrl: Callable[[], list[dict[str, Any]]] | None = None,
) -> dict[str, Any]:
    """What `corepin report -o json` prints (`corepin.state.report.report_data`), with each
    allocation's QoS class and live processes (see `live`), and the resctrl classes
    `resctrl()` gives (`corepin.agent.host.qos.describe_resctrl`) when there are any.
    `statuses`: what the state's source says of its allocations (default: this host's
    liveness)."""
    if statuses is None:
        statuses = host.liveness.statuses(state)
    data = report_data(state, statuses)
    rows = live(host, state, sample=sample)
    for row in data["allocations"]:
        row.update(rows.get(row["id"], {}))
        a = state.get(row["id"])
        if a is not None:
            row["reservation"] = a.reservation
            row["rebalance"] = a.rebalance
    data["reservations"] = [reservation_row(r) for r in state.reservations.values()]
    classes = resctrl() if resctrl is not None else []
    if classes:
        data["qos_classes"] = classes
    return data


def live(host: HostAgent, state: HostState, *, sample: float = 0.0) -> dict[str, dict[str, Any]]:
    """Assignment id -> what /proc says of its processes now: `processes` (how many),
    `live_cpus` (the union of their allowed CPUs), `cpu_seconds` (utime + stime) and
    `cpu_percent` of one CPU, over `sample` seconds when given, else since the run's
    oldest process started (`cpu_percent_over` says which)."""
    proc_root = host.settings.proc_root
    table = host.liveness.table()
    tick = float(os.sysconf("SC_CLK_TCK"))
    groups: dict[str, list[int]] = {}
    for a in state:
        pids: set[int] = set()
        process = a.process
        if process is not None:
            group = ProcessGroup(process.pid, process.start_time, process.session, process.members)
            pids.update(group.pids(table))
        pids.update(p for p in host.pinner.cgroup_pids(a) or () if p in table)
        groups[a.id] = sorted(p for p in pids if table[p].alive)
    later = None
    if sample > 0 and any(groups.values()):
        time.sleep(sample)
        later = process_table(proc_root)
    uptime = _uptime(proc_root)
    out: dict[str, dict[str, Any]] = {}
    for ident, members in groups.items():
        row: dict[str, Any] = {
            "processes": len(members),
            "live_cpus": None,
            "cpu_seconds": None,
            "cpu_percent": None,
            "cpu_percent_over": None,
        }
        out[ident] = row
        if not members:
            continue
        allowed = CPUSet()
        for pid in members:
            try:
                allowed |= cpus_allowed_list(pid, proc_root)
            except (ProcessGone, CorepinError):
                continue
        ticks = sum(table[p].utime + table[p].stime for p in members)
        row["live_cpus"] = str(allowed)
        row["cpu_seconds"] = round(ticks / tick, 2)
        if later is not None:
            after = sum(
                later[p].utime + later[p].stime
                for p in members
                if p in later and later[p].start_time == table[p].start_time
            )
            before = sum(
                table[p].utime + table[p].stime
                for p in members
                if p in later and later[p].start_time == table[p].start_time
            )
            row["cpu_percent"] = round(100.0 * (after - before) / tick / sample, 1)
            row["cpu_percent_over"] = f"{sample:g} s"
        elif uptime is not None:
            started = min(table[p].start_time for p in members) / tick
            elapsed = uptime - started
            if elapsed > 0:
                row["cpu_percent"] = round(100.0 * ticks / tick / elapsed, 1)
                row["cpu_percent_over"] = "since start"
    return out


def _uptime(proc_root: str) -> float | None:
    """Seconds since boot (<proc>/uptime), None when unreadable."""
    try:
        with open(os.path.join(proc_root, "uptime"), encoding="ascii") as handle:
            return float(handle.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
