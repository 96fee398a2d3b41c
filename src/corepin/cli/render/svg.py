"""`corepin topology -o svg`: a picture of the machine in the spirit of hwloc's lstopo.

Nested boxes (built in `corepin.cli.render.boxes`): machine > socket > die (when a socket has
several) > NUMA node > L3 > shared L2 or cluster (when several cores share one) > core > CPU
(hardware thread), in the order of `Topology.level_order()`: an L3 or NUMA node that holds
several packages (a DynamIQ SoC whose kernel numbers clusters as packages) or several NUMA nodes
is drawn around them, as lstopo does. Offline CPUs are hatched, isolated CPUs (isolcpus) have a
red dashed border, performance and efficiency cores of hybrid machines have different colours,
memory-only NUMA nodes get their own boxes, PCI devices (GPU, NIC, NVMe, accelerator) sit in
their NUMA node's box, and a legend explains it all. Boxes flow into
balanced rows, so the same code draws 2 CPUs and 1024.

`render_svg(topology, owners=...)` colours CPUs by owner instead (for `corepin report -o svg`):
`owners` maps a CPU id to an owner label; the well-known labels `reserved`, `shared`, `infra` and
`free` have fixed colours, every other label gets one from a palette, and the legend lists who
holds which CPUs.

Pure: Topology (and the mapping) in, SVG text out.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from corepin.cli.render._common import short_core_type, shown_devices, summary
from corepin.cli.render.boxes import OWNER_COLOURS, STYLES, Box, BoxBuilder, owner_colours
from corepin.core.cpuset import CPUSet
from corepin.topology.model import Topology

FONT = "DejaVu Sans, Verdana, Helvetica, Arial, sans-serif"
PU_W = 34.0
PU_H = 22.0


def _esc(text: str) -> str:
    return (
        text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")
    )


def _text_width(text: str, size: float, bold: bool = False) -> float:
    return len(text) * size * (0.70 if bold else 0.60)


# --------------------------------------------------------------------------- layout


def _header(box: Box) -> float:
    s = box.style
    return s.pad + s.font + 4 + len(box.lines) * (s.font + 2)


def _rows(widths: list[float], max_w: float, gap: float) -> list[list[int]]:
    """Indices of children per row: as few rows as fit in max_w, balanced in length."""

    def greedy(cap: int) -> list[list[int]]:
        rows: list[list[int]] = [[]]
        used = 0.0
        for i, w in enumerate(widths):
            row = rows[-1]
            need = w if not row else used + gap + w
            if row and (need > max_w or len(row) >= cap):
                rows.append([i])
                used = w
            else:
                row.append(i)
                used = need
        return rows

    rows = greedy(len(widths) or 1)
    if len(rows) > 1 and max(widths) <= 1.5 * min(widths):  # similar boxes: even rows
        rows = greedy(math.ceil(len(widths) / len(rows)))
    return rows


def _measure(box: Box, max_w: float) -> None:
    s = box.style
    if box.kind.startswith("pu"):
        box.w, box.h = PU_W, PU_H
        return
    label_w = _text_width(box.label, s.font, s.bold) + 2 * s.pad
    for line in box.lines:
        label_w = max(label_w, _text_width(line, s.font - 1) + 2 * s.pad)
    inner_max = max_w - 2 * s.pad
    if box.kind.startswith("core"):
        inner_max = min(inner_max, 4 * PU_W + 3 * s.gap)
    for child in box.children:
        _measure(child, inner_max)
    top = _header(box)
    if not box.children:
        box.w = max(label_w, 2 * PU_W)
        box.h = top + s.pad
        return
    rows = _rows([c.w for c in box.children], inner_max, s.gap)
    row_widths = [sum(box.children[i].w for i in row) + s.gap * (len(row) - 1) for row in rows]
    inner_w = max(row_widths)
    y = top
    box.offsets = [(0.0, 0.0)] * len(box.children)
    for row in rows:
        height = max(box.children[i].h for i in row)
        same_kind = len({box.children[i].kind for i in row}) == 1
        x = s.pad
        for i in row:
            child = box.children[i]
            box.offsets[i] = (x, y)
            if same_kind and not child.kind.startswith("pu"):
                child.h = height  # boxes of one kind in one row share their height
            x += child.w + s.gap
        y += height + s.gap
    box.rows = rows
    box.h = y - s.gap + s.pad
    _widen(box, max(inner_w + 2 * s.pad, label_w))


def _widen(box: Box, width: float) -> None:
    """Set the box's width; a child alone in its row widens with it (all the way down)."""
    box.w = width
    if box.kind.startswith("core"):
        return
    inner = width - 2 * box.style.pad
    for row in box.rows:
        if len(row) == 1 and not box.children[row[0]].kind.startswith("pu"):
            _widen(box.children[row[0]], inner)


# --------------------------------------------------------------------------- drawing


def _draw(box: Box, x: float, y: float, out: list[str]) -> None:
    s = box.style
    fill = box.fill or s.fill
    dash = ' stroke-dasharray="4 2"' if s.dash else ""
    out.append(
        f"<g><title>{_esc(box.tip or box.label)}</title>"
        f'<rect x="{x:.1f}" y="{y:.1f}" width="{box.w:.1f}" height="{box.h:.1f}" '
        f'rx="{s.radius}" fill="{fill}" stroke="{s.stroke}" '
        f'stroke-width="{1.6 if dash else 1}"{dash}/>'
    )
    weight = ' font-weight="bold"' if s.bold else ""
    if box.kind.startswith("pu"):
        out.append(
            f'<text x="{x + box.w / 2:.1f}" y="{y + box.h / 2 + s.font * 0.36:.1f}" '
            f'font-size="{s.font}" text-anchor="middle" fill="{box.text_fill}">'
            f"{_esc(box.label)}</text></g>"
        )
        return
    ty = y + s.pad + s.font * 0.85
    out.append(
        f'<text x="{x + s.pad:.1f}" y="{ty:.1f}" font-size="{s.font}"{weight} '
        f'fill="{box.text_fill}">{_esc(box.label)}</text>'
    )
    for line in box.lines:
        ty += s.font + 2
        out.append(
            f'<text x="{x + s.pad:.1f}" y="{ty:.1f}" font-size="{s.font - 1}" '
            f'fill="#333333">{_esc(line)}</text>'
        )
    out.append("</g>")
    for child, (dx, dy) in zip(box.children, box.offsets, strict=True):
        _draw(child, x + dx, y + dy, out)


def _legend_items(
    topology: Topology, owners: Mapping[int, str] | None, colours: Mapping[str, str]
) -> list[tuple[str, str, str, bool, str]]:
    """(fill, stroke, text, dashed, text inside swatch) per legend entry."""
    items: list[tuple[str, str, str, bool, str]] = []
    if owners is not None:
        by_owner: dict[str, list[int]] = {}
        for cpu, owner in owners.items():
            by_owner.setdefault(owner, []).append(cpu)
        fixed = [o for o in ("reserved", "infra", "shared") if o in by_owner]
        rest = sorted(o for o in by_owner if o not in OWNER_COLOURS)
        order = fixed + rest + (["free"] if "free" in by_owner else [])
        for owner in order:
            cpus = CPUSet(c for c in by_owner[owner] if c >= 0)
            items.append((colours[owner], "#4d4d4d", f"{owner}: CPUs {cpus}", False, ""))
    else:
        items.append((STYLES["pu"].fill, STYLES["pu"].stroke, "CPU (hardware thread)", False, "n"))
    present_kinds = {short_core_type(c.core_type) for c in topology.cpus if c.online}
    if "P" in present_kinds:
        items.append((STYLES["core-P"].fill, STYLES["core-P"].stroke, "P-core", False, ""))
    if "E" in present_kinds:
        items.append((STYLES["core-E"].fill, STYLES["core-E"].stroke, "E-core", False, ""))
    if present_kinds - {"P", "E", ""}:
        other = ", ".join(sorted(present_kinds - {"P", "E", ""}))
        st = STYLES["core-other"]
        items.append((st.fill, st.stroke, f"core type {other}", False, ""))
    if present_kinds <= {""} or "" in present_kinds:
        items.append((STYLES["core"].fill, STYLES["core"].stroke, "physical core", False, ""))
    if topology.l3_ids():
        items.append((STYLES["l3"].fill, STYLES["l3"].stroke, "L3 cache", False, ""))
    items.append((STYLES["numa"].fill, STYLES["numa"].stroke, "NUMA node", False, ""))
    if any(n.memory_only for n in topology.numa_nodes):
        st = STYLES["memnuma"]
        items.append((st.fill, st.stroke, "memory-only NUMA node", True, ""))
    if shown_devices(topology):
        st = STYLES["device"]
        items.append((st.fill, st.stroke, "PCI device", False, ""))
    if topology.isolated_cpus:
        st = STYLES["pu-isolated"]
        items.append((st.fill, st.stroke, f"isolated CPU {topology.isolated_cpus}", True, ""))
    if topology.offline_cpus:
        st = STYLES["pu-offline"]
        items.append((st.fill, st.stroke, f"offline CPU {topology.offline_cpus}", False, ""))
    return items


def _legend(
    items: list[tuple[str, str, str, bool, str]], x0: float, y0: float, width: float
) -> tuple[list[str], float]:
    out: list[str] = []
    size = 12.0
    x, y = x0, y0
    row_h = PU_H + 6
    for fill, stroke, text, dashed, inner in items:
        w = PU_W + 6 + _text_width(text, size) + 18
        if x > x0 and x + w > x0 + width:
            x, y = x0, y + row_h
        dash = ' stroke-dasharray="4 2" stroke-width="1.6"' if dashed else ""
        out.append(
            f'<rect x="{x:.1f}" y="{y:.1f}" width="{PU_W}" height="{PU_H}" rx="2" '
            f'fill="{fill}" stroke="{stroke}"{dash}/>'
        )
        if inner:
            out.append(
                f'<text x="{x + PU_W / 2:.1f}" y="{y + PU_H / 2 + 4:.1f}" font-size="11" '
                f'text-anchor="middle">{_esc(inner)}</text>'
            )
        out.append(
            f'<text x="{x + PU_W + 6:.1f}" y="{y + PU_H / 2 + 4:.1f}" font-size="{size}">'
            f"{_esc(text)}</text>"
        )
        x += w
    return out, y + row_h - y0


def _layout(
    topology: Topology,
    owners: Mapping[int, str] | None,
    colours: Mapping[str, str] | None = None,
) -> Box:
    """Lay the machine out at the width that gives the most screen-like picture."""
    best: tuple[float, Box] | None = None
    for width in range(480, 3201, 160):
        box = BoxBuilder(topology, owners, colours).machine()
        _measure(box, float(width))
        ratio = box.w / max(box.h, 1.0)
        score = abs(math.log(ratio / 1.6)) + 2.0 * max(0.0, (box.w - 1800.0) / 1000.0)
        if best is None or score < best[0] - 1e-9:
            best = (score, box)
    assert best is not None
    return best[1]


def render_svg(
    topology: Topology,
    owners: Mapping[int, str] | None = None,
    *,
    title: str | None = None,
    legend: bool = True,
    colours: Mapping[str, str] | None = None,
) -> str:
    """The machine as an SVG picture.

    owners: optional CPU id -> owner label; online CPUs are then filled with their owner's
    colour and the legend lists every owner with its CPUs (CPUs missing from the mapping stay
    white; offline CPUs stay hatched). `reserved`, `infra`, `shared` and `free` have fixed
    colours (OWNER_COLOURS); other owners get PALETTE colours in sorted order.
    colours: optional owner label -> SVG colour, overriding both.
    title: first line above the picture (default: "corepin topology" plus the machine's name).
    legend: draw the legend under the picture.
    """
    machine = _layout(topology, owners, colours)
    colours = owner_colours(owners, colours) if owners is not None else {}
    margin = 14.0
    heading = (
        title
        if title is not None
        else "corepin topology" + (f": {topology.name}" if topology.name else "")
    )
    body: list[str] = []
    top = margin
    body.append(
        f'<text x="{margin}" y="{top + 15:.1f}" font-size="16" font-weight="bold">'
        f"{_esc(heading)}</text>"
    )
    body.append(
        f'<text x="{margin}" y="{top + 33:.1f}" font-size="12" fill="#333333">'
        f"{_esc(summary(topology))}</text>"
    )
    top += 44
    _draw(machine, margin, top, body)
    width = (
        max(machine.w, _text_width(summary(topology), 12) + 10, _text_width(heading, 16, True))
        + 2 * margin
    )
    height = top + machine.h + margin
    if legend:
        items = _legend_items(topology, owners, colours)
        lines, used = _legend(items, margin, height, width - 2 * margin)
        body.extend(lines)
        height += used + margin / 2
    head = [
        '<?xml version="1.0" encoding="UTF-8"?>',
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
        f'viewBox="0 0 {width:.0f} {height:.0f}" font-family="{FONT}">',
        "<defs>",
        '<pattern id="hatch" patternUnits="userSpaceOnUse" width="6" height="6" '
        'patternTransform="rotate(45)">',
        '<rect width="6" height="6" fill="#ececec"/>',
        '<line x1="0" y1="0" x2="0" y2="6" stroke="#b4b4b4" stroke-width="2"/>',
        "</pattern>",
        "</defs>",
        f'<rect width="{width:.0f}" height="{height:.0f}" fill="#ffffff"/>',
    ]
    return "\n".join([*head, *body, "</svg>"]) + "\n"
