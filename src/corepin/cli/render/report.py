"""The report of `corepin report` (`corepin.state.report.report_data`) as a table, JSON, YAML or
an SVG of the machine with each CPU's holder. The table has a NEAR column (the devices a run's
CPUs were chosen near) only when some run has one, and a section of reservations when there
are any."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from corepin.cli.common import render_output
from corepin.cli.render.svg import render_svg
from corepin.core.text import printable, utc_text

if TYPE_CHECKING:
    from corepin.state.model import HostState
    from corepin.topology.model import Topology


def render_report(
    fmt: str, data: Mapping[str, Any], state: HostState, topology: Callable[[], Topology]
) -> str:
    """The report in `fmt` (table, json, yaml or svg; the SVG needs the topology). In JSON and
    YAML an allocation's `created` is RFC 3339 UTC text (`plain_data`)."""
    if fmt == "svg":
        return report_svg(topology(), state, data)
    return render_output(fmt, plain_data(data), lambda: report_table(data))


def plain_data(data: Mapping[str, Any]) -> dict[str, Any]:
    """The report as JSON and YAML give it: each allocation's `created` (seconds since the
    epoch in the data) as RFC 3339 UTC text, `2026-01-02T03:04:05Z`."""
    out = dict(data)
    out["allocations"] = [
        {**a, "created": utc_text(a["created"])} if isinstance(a.get("created"), float | int) else a
        for a in data["allocations"]
    ]
    return out


def report_table(data: Mapping[str, Any]) -> str:
    live = any("live_cpus" in a for a in data["allocations"])
    near = any(a.get("near") for a in data["allocations"])
    header: tuple[str, ...] = ("ID", "NAME", "PID", "KIND", "QOS", "CPUS")
    if live:
        header += ("LIVE", "CPU%")
    header += ("MEMS",)
    if near:
        header += ("NEAR",)
    header += ("STATUS", "COMMAND")
    rows: list[tuple[str, ...]] = [header]
    for a in data["allocations"]:
        cells = [a["id"], a["name"], str(a["pid"] or "-"), a["kind"], a.get("qos_class") or "-"]
        cells.append(a["cpus"] or "-")
        if live:
            percent = a.get("cpu_percent")
            cells += [a.get("live_cpus") or "-", "-" if percent is None else f"{percent:.1f}"]
        cells.append(a["mems"] or "-")
        if near:
            cells.append(",".join(a.get("near") or ()) or "-")
        cells += [a["status"] or "-", a["command"]]  # the last column: never cut
        rows.append(tuple(printable(cell) for cell in cells))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    if len(rows) == 1:
        lines.append("(no allocations)")
    lines.append("")
    lines.append(f"shared pool: {data['shared_pool'] or '(empty)'}")
    lines.append(f"free:        {data['free'] or '(none)'}")
    if data["reserved"]:
        lines.append(f"reserved:    {data['reserved']}")
    marked = [a for a in data["allocations"] if a["status"] in ("dead", "lingering")]
    if marked:
        lines.append(
            "dead: nothing of the run is left (freed by the next run or `corepin reconcile`); "
            "lingering: CMD exited, processes it left behind still hold the CPUs "
            "(`corepin release ID [--kill]`)"
        )
    if live:
        over = {a.get("cpu_percent_over") for a in data["allocations"]} - {None}
        if over:
            lines.append(f"CPU%: of one CPU, {', '.join(sorted(over))}")
    lines.extend(reservation_lines(data.get("reservations") or []))
    lines.extend(qos_class_lines(data.get("qos_classes") or []))
    return "\n".join(lines) + "\n"


def reservation_lines(rows: Sequence[Mapping[str, Any]], *, title: bool = True) -> list[str]:
    """Reservations (`reserve.reservation_row`) as a table: name, CPUs, withheld CPUs,
    level, reusable, expiry (UTC) and the run on it; with `title`, under a heading (nothing
    at all when there are none)."""
    if not rows:
        return []
    table: list[tuple[str, ...]] = [
        ("RESERVATION", "CPUS", "WITHHELD", "LEVEL", "REUSABLE", "EXPIRES", "USED BY")
    ]
    for r in rows:
        cells = (
            str(r.get("name")),
            str(r.get("cpus") or "-"),
            str(r.get("withheld") or r.get("cpus") or "-"),
            str(r.get("level") or "cpu"),
            "yes" if r.get("reusable") else "no",
            str(r.get("expires") or "never"),
            str(r.get("consumed_by") or "-"),
        )
        table.append(tuple(printable(cell) for cell in cells))
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    out = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in table]
    return ["", "Reservations:", *out] if title else out


def qos_class_lines(classes: list[Mapping[str, Any]]) -> list[str]:
    """The resctrl classes of a report (`ClassView.to_json()`) as a table: class, group, L3
    ways per cache id, memory bandwidth per domain, LLC occupancy per cache id."""
    if not classes:
        return []
    rows: list[tuple[str, ...]] = [("CLASS", "GROUP", "L3 WAYS", "MB", "LLC OCCUPANCY")]
    for c in classes:
        l3 = {d: v.get("ways") for d, v in _items(c.get("l3")) if isinstance(v, Mapping)}
        unit = "%" if c.get("mbUnit") == "percent" else ""
        mb = {d: f"{v}{unit}" for d, v in _items(c.get("mb"))}
        occupancy = {
            d: _bytes(v.get("llcOccupancyBytes"))
            for d, v in _items(c.get("monitoring"))
            if isinstance(v, Mapping)
        }
        cells = (str(c.get("class")), str(c.get("group")), _joined(l3), _joined(mb))
        rows.append(tuple(printable(cell) for cell in (*cells, _joined(occupancy))))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    table = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    return ["", "QoS classes (resctrl):", *table]


def _items(value: object) -> list[tuple[str, Any]]:
    """A per-domain mapping's items, by domain id."""
    if not isinstance(value, Mapping):
        return []
    return sorted(((str(k), v) for k, v in value.items()), key=lambda kv: (len(kv[0]), kv[0]))


def _joined(per_domain: Mapping[str, object]) -> str:
    """`{id: value}` as `id=value;...` ("-" for nothing)."""
    return ";".join(f"{k}={v}" for k, v in per_domain.items()) or "-"


def _bytes(value: object) -> str:
    if isinstance(value, bool) or not isinstance(value, int):
        return "-"
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if value >= size:
            return f"{value / size:.1f}{unit}"
    return f"{value}B"


def report_svg(topology: Topology, state: HostState, data: Mapping[str, Any]) -> str:
    owners: dict[int, str] = {}
    for cpu in topology.online_cpus:
        owners[cpu] = "free"
    for cpu in state.shared_pool:
        owners[cpu] = "shared"
    for cpu in state.reserved:
        owners[cpu] = "reserved"
    statuses = {row["id"]: row.get("status") for row in data["allocations"]}
    for a in state:
        label = printable(f"{a.label} (pid {a.pid})" if a.pid else a.label)
        if statuses.get(a.id) in ("dead", "lingering"):
            label += f" [{statuses[a.id]}]"
        for cpu in a.withheld:
            owners[cpu] = label
    shared_users = [a for a in state if a.kind == "shared"]
    title = (
        f"corepin report: {len(data['allocations'])} allocation(s), shared pool CPUs "
        f"{data['shared_pool'] or '(empty)'} used by {len(shared_users)} shared run(s)"
    )
    return render_svg(topology, owners, title=title)
