"""`corepin topology -o svg`: a picture of the machine in the spirit of hwloc's lstopo.

Nested boxes: machine > socket > die (when a socket has several) > NUMA node > L3 > shared L2 or
cluster (when several cores share one) > core > CPU (hardware thread), in the order of
`Topology.level_order()`: an L3 or NUMA node that holds several packages (a DynamIQ SoC whose
kernel numbers clusters as packages) or several NUMA nodes is drawn around them, as lstopo
does. Offline CPUs are hatched, isolated CPUs (isolcpus) have a red dashed border, performance
and efficiency cores of hybrid machines have different colours, memory-only NUMA nodes get their
own boxes, and a legend explains it all. Boxes flow into balanced rows, so the same code draws
2 CPUs and 1024.

`render_svg(topology, owners=...)` colours CPUs by owner instead (for `corepin report -o svg`):
`owners` maps a CPU id to an owner label; the well-known labels `reserved`, `shared`, `infra` and
`free` have fixed colours, every other label gets one from a palette, and the legend lists who
holds which CPUs.

Pure: Topology (and the mapping) in, SVG text out.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from corepin.cli.render._common import short_core_type, summary
from corepin.core.cpuset import CPUSet
from corepin.topology.model import CPUInfo, Topology

FONT = "DejaVu Sans, Verdana, Helvetica, Arial, sans-serif"
PU_W = 34.0
PU_H = 22.0

#: Fixed colours of well-known owner labels (`corepin report -o svg`).
OWNER_COLOURS: dict[str, str] = {
    "free": "#ffffff",
    "shared": "#a8d5a2",
    "reserved": "#6b6b6b",
    "infra": "#c9b3d9",
}
#: Colours handed to other owners in sorted order (readable with black text, colour-blind aware).
PALETTE = (
    "#f4a259",
    "#5fa8d3",
    "#e9c46a",
    "#f28482",
    "#84a59d",
    "#cdb4db",
    "#ffafcc",
    "#90be6d",
    "#f9c74f",
    "#4d908e",
    "#f8961e",
    "#bde0fe",
)


@dataclass(frozen=True)
class _Style:
    fill: str
    stroke: str = "#555555"
    pad: float = 6.0
    gap: float = 6.0
    font: float = 12.0
    bold: bool = True
    dash: bool = False
    radius: float = 3.0


_STYLES: dict[str, _Style] = {
    "machine": _Style("#fbfbfb", "#333333", pad=8, gap=10, font=13),
    "socket": _Style("#e6e6e6", "#4d4d4d", pad=7, gap=8),
    "die": _Style("#d9d9d9", "#666666", pad=6, gap=6),
    "numa": _Style("#f6e7c1", "#a0833a", pad=6, gap=6),
    "memnuma": _Style("#f6e7c1", "#a0833a", pad=6, gap=6, dash=True),
    "l3": _Style("#dce8f6", "#5a7ca6", pad=5, gap=5, font=11),
    "group": _Style("#e5f1dc", "#6b8f5a", pad=4, gap=4, font=10),
    "core": _Style("#c4c4c4", "#5c5c5c", pad=4, gap=3, font=10),
    "core-P": _Style("#9dbde3", "#3e6390", pad=4, gap=3, font=10),
    "core-E": _Style("#b3d9a5", "#4f7f3f", pad=4, gap=3, font=10),
    "core-other": _Style("#e3c6e8", "#7a4f82", pad=4, gap=3, font=10),
    "offline-group": _Style("#f4f4f4", "#8c8c8c", pad=6, gap=4, font=11, dash=True),
    "pu": _Style("#ffffff", "#4d4d4d", font=11, bold=False, radius=2),
    "pu-isolated": _Style("#fff1a8", "#c0392b", font=11, bold=False, dash=True, radius=2),
    "pu-offline": _Style("url(#hatch)", "#8c8c8c", font=11, bold=False, radius=2),
}

_CORE_LABELS = {"P": "P-core", "E": "E-core"}


def _esc(text: str) -> str:
    return (
        text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")
    )


def _text_width(text: str, size: float, bold: bool = False) -> float:
    return len(text) * size * (0.70 if bold else 0.60)


@dataclass(eq=False)
class _Box:
    kind: str
    label: str
    children: list[_Box] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    tip: str = ""
    fill: str | None = None
    text_fill: str = "#1a1a1a"
    w: float = 0.0
    h: float = 0.0
    offsets: list[tuple[float, float]] = field(default_factory=list)
    rows: list[list[int]] = field(default_factory=list)

    @property
    def style(self) -> _Style:
        return _STYLES[self.kind]


# --------------------------------------------------------------------------- tree of boxes


def _group(infos: Iterable[CPUInfo], attr: str) -> dict[int | None, list[CPUInfo]]:
    out: dict[int | None, list[CPUInfo]] = {}
    for info in infos:
        out.setdefault(getattr(info, attr), []).append(info)
    return dict(sorted(out.items(), key=lambda kv: -1 if kv[0] is None else kv[0]))


def _cpuset(infos: Iterable[CPUInfo]) -> CPUSet:
    return CPUSet(i.cpu for i in infos)


class _Builder:
    def __init__(
        self,
        topology: Topology,
        owners: Mapping[int, str] | None,
        colours: Mapping[str, str] | None = None,
    ) -> None:
        self.t = topology
        self.owners = owners
        self.colours = _owner_colours(owners, colours) if owners is not None else {}
        self.offline_by_core: dict[int, list[CPUInfo]] = {}
        for info in topology.cpus:
            if not info.online and info.core is not None:
                self.offline_by_core.setdefault(info.core, []).append(info)

    # every present CPU, placed once: online ones in the tree, offline ones in their core when
    # the kernel still says which core, else in the "Offline CPUs" strip
    def machine(self) -> _Box:
        online = [c for c in self.t.cpus if c.online]
        makers: dict[str, Callable[[int, list[CPUInfo]], _Box]] = {
            "socket": self.socket_box,
            "die": self.die_box,
            "numa": self.numa_box,
            "l3": self.l3_box,
        }
        levels = [(kind, makers[kind]) for kind in self.t.level_order() if kind in makers]
        children = self.level(online, levels)
        for node in self.t.numa_nodes:
            if node.memory_only:
                lines = ["memory only"]
                if node.memory_kb is not None:
                    lines.append(_size(node.memory_kb))
                children.append(
                    _Box(
                        "memnuma",
                        f"NUMA node {node.id}",
                        lines=lines,
                        tip=f"NUMA node {node.id}: memory without CPUs",
                    )
                )
        placed = {c.cpu for cs in self.offline_by_core.values() for c in cs}
        placed_cores = set(self.t.core_ids())
        loose = [
            c
            for c in self.t.cpus
            if not c.online and (c.cpu not in placed or c.core not in placed_cores)
        ]
        if loose:
            strip = _Box(
                "offline-group",
                "Offline CPUs",
                tip=f"offline CPUs {_cpuset(loose)}: the kernel hides their topology",
            )
            strip.children = [self.pu(c) for c in loose]
            children.append(strip)
        return _Box("machine", "Machine", children=children, tip=summary(self.t))

    def level(
        self, infos: list[CPUInfo], levels: list[tuple[str, Callable[[int, list[CPUInfo]], _Box]]]
    ) -> list[_Box]:
        """Boxes of the first level (in `Topology.level_order()`: a cache or NUMA node that
        spans several packages, as on DynamIQ SoCs, is drawn around them), the rest inside.
        A die box is drawn only where there are several dies side by side."""
        if not levels:
            return self.groups_and_cores(infos)
        (attr, make), rest = levels[0], levels[1:]
        groups = _group(infos, attr)
        if attr == "die" and len(groups) == 1:
            return self.level(infos, rest)
        out: list[_Box] = []
        for key, members in groups.items():
            if key is None:  # the kernel does not say: no box at this level for them
                out.extend(self.level(members, rest))
                continue
            box = make(key, members)
            box.children = self.level(members, rest)
            out.append(box)
        return out

    def socket_box(self, socket: int, members: list[CPUInfo]) -> _Box:
        label = f"Socket {socket}"
        return _Box("socket", label, tip=f"{label}: CPUs {self.t.cpus_in_sockets(socket)}")

    def die_box(self, die: int, members: list[CPUInfo]) -> _Box:
        socket = members[0].socket
        label = f"Die {die}"
        whole = self.t.cpus_in_dies((socket, die)) if socket is not None else _cpuset(members)
        return _Box("die", label, tip=f"Socket {socket} {label}: CPUs {whole}")

    def numa_box(self, node: int, members: list[CPUInfo]) -> _Box:
        part = _cpuset(members)
        whole = self.t.cpus_in_numa_nodes(node)
        label = f"NUMA node {node}" + ("" if part == whole else " (part)")
        try:
            memory = self.t.numa_node(node).memory_kb
        except ValueError:
            memory = None
        if memory is not None:
            label += f" ({_size(memory)})"
        return _Box("numa", label, tip=f"NUMA node {node}: CPUs {whole}")

    def l3_box(self, l3: int, members: list[CPUInfo]) -> _Box:
        part = _cpuset(members)
        whole = self.t.cpus_in_l3s(l3)
        label = f"L3 #{l3}" + ("" if part == whole else " (part)")
        return _Box("l3", label, tip=f"L3 cache #{l3}: shared by CPUs {whole}")

    def groups_and_cores(self, infos: list[CPUInfo]) -> list[_Box]:
        """Cores, inside boxes for L2 caches or clusters that several cores share."""
        for attr, name in (("l2", "L2 #"), ("cluster", "Cluster ")):
            groups = _group(infos, attr)
            if None in groups:
                continue
            multi = [g for g in groups.values() if len({c.core for c in g}) > 1]
            if multi:
                out = []
                for key, members in groups.items():
                    if len({c.core for c in members}) == 1:  # a private L2: no box for it
                        out.extend(self.cores(members))
                        continue
                    what = "L2 cache" if attr == "l2" else "cluster"
                    box = _Box(
                        "group",
                        f"{name}{key}",
                        tip=f"{what} {key}: CPUs {_cpuset(members)}",
                    )
                    box.children = self.cores(members)
                    out.append(box)
                return out
        return self.cores(infos)

    def cores(self, infos: list[CPUInfo]) -> list[_Box]:
        out = []
        for core, members in _group(infos, "core").items():
            hidden = self.offline_by_core.get(core, []) if core is not None else []
            every = sorted(members + hidden, key=lambda c: c.cpu)
            kind = short_core_type(members[0].core_type)
            style = "core"
            if kind in ("P", "E"):
                style = f"core-{kind}"
            elif kind:
                style = "core-other"
            name = _CORE_LABELS.get(kind, "Core")
            label = f"{name} {core if core is not None else '?'}"
            tip = f"{label}: threads {_cpuset(every)}"
            if kind and kind not in ("P", "E"):
                tip += f" (type {kind})"
            box = _Box(style, label, tip=tip)
            box.children = [self.pu(c) for c in every]
            out.append(box)
        return out

    def pu(self, info: CPUInfo) -> _Box:
        kind = "pu"
        state = []
        if not info.online:
            kind = "pu-offline"
            state.append("offline")
        elif info.isolated:
            kind = "pu-isolated"
            state.append("isolated")
        box = _Box(kind, str(info.cpu))
        tip = f"CPU {info.cpu}"
        if self.owners is not None and info.online:
            owner = self.owners.get(info.cpu)
            if owner is not None:
                box.fill = self.colours[owner]
                box.text_fill = _text_on(box.fill)
                tip += f": {owner}"
        if not info.online:
            box.text_fill = "#222222"
        if state:
            tip += f" ({', '.join(state)})"
        box.tip = tip
        return box


def _owner_colours(
    owners: Mapping[int, str], chosen: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Owner label -> fill: `chosen` first, then the fixed pool colours, then the palette."""
    chosen = chosen or {}
    colours: dict[str, str] = {}
    others = sorted({o for o in owners.values() if o not in OWNER_COLOURS and o not in chosen})
    for i, name in enumerate(others):
        colours[name] = PALETTE[i % len(PALETTE)]
    for name in owners.values():
        if name in chosen:
            colours[name] = chosen[name]
        elif name in OWNER_COLOURS:
            colours[name] = OWNER_COLOURS[name]
    return colours


def _text_on(fill: str) -> str:
    """Black text on light fills, white on dark ones (#rrggbb; anything else gets black)."""
    if len(fill) == 7 and fill[0] == "#":
        try:
            r, g, b = (int(fill[i : i + 2], 16) / 255 for i in (1, 3, 5))
        except ValueError:
            return "#1a1a1a"
        if 0.299 * r + 0.587 * g + 0.114 * b < 0.5:
            return "#ffffff"
    return "#1a1a1a"


def _size(kb: int) -> str:
    if kb >= 1024 * 1024:
        return f"{kb / (1024 * 1024):.0f} GiB"
    return f"{kb / 1024:.0f} MiB"


# --------------------------------------------------------------------------- layout


def _header(box: _Box) -> float:
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


def _measure(box: _Box, max_w: float) -> None:
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


def _widen(box: _Box, width: float) -> None:
    """Set the box's width; a child alone in its row widens with it (all the way down)."""
    box.w = width
    if box.kind.startswith("core"):
        return
    inner = width - 2 * box.style.pad
    for row in box.rows:
        if len(row) == 1 and not box.children[row[0]].kind.startswith("pu"):
            _widen(box.children[row[0]], inner)


# --------------------------------------------------------------------------- drawing


def _draw(box: _Box, x: float, y: float, out: list[str]) -> None:
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
        items.append(
            (_STYLES["pu"].fill, _STYLES["pu"].stroke, "CPU (hardware thread)", False, "n")
        )
    present_kinds = {short_core_type(c.core_type) for c in topology.cpus if c.online}
    if "P" in present_kinds:
        items.append((_STYLES["core-P"].fill, _STYLES["core-P"].stroke, "P-core", False, ""))
    if "E" in present_kinds:
        items.append((_STYLES["core-E"].fill, _STYLES["core-E"].stroke, "E-core", False, ""))
    if present_kinds - {"P", "E", ""}:
        other = ", ".join(sorted(present_kinds - {"P", "E", ""}))
        st = _STYLES["core-other"]
        items.append((st.fill, st.stroke, f"core type {other}", False, ""))
    if present_kinds <= {""} or "" in present_kinds:
        items.append((_STYLES["core"].fill, _STYLES["core"].stroke, "physical core", False, ""))
    if topology.l3_ids():
        items.append((_STYLES["l3"].fill, _STYLES["l3"].stroke, "L3 cache", False, ""))
    items.append((_STYLES["numa"].fill, _STYLES["numa"].stroke, "NUMA node", False, ""))
    if any(n.memory_only for n in topology.numa_nodes):
        st = _STYLES["memnuma"]
        items.append((st.fill, st.stroke, "memory-only NUMA node", True, ""))
    if topology.isolated_cpus:
        st = _STYLES["pu-isolated"]
        items.append((st.fill, st.stroke, f"isolated CPU {topology.isolated_cpus}", True, ""))
    if topology.offline_cpus:
        st = _STYLES["pu-offline"]
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
) -> _Box:
    """Lay the machine out at the width that gives the most screen-like picture."""
    best: tuple[float, _Box] | None = None
    for width in range(480, 3201, 160):
        box = _Builder(topology, owners, colours).machine()
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
    colours = _owner_colours(owners, colours) if owners is not None else {}
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
