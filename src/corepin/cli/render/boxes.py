"""The tree of boxes `render_svg` draws: machine > socket > die (when a socket has several) >
NUMA node > L3 > shared L2 or cluster (when several cores share one) > core > CPU (hardware
thread), in the order of `Topology.level_order()`, each box with its style, and for a report each
CPU filled with its owner's colour. PCI devices (GPU, NIC, NVMe, accelerator) get a box inside
their NUMA node's box after its CPUs, as lstopo draws them; one without a NUMA node (or whose
node has no box) sits in the machine's box.

Every present CPU is placed once: online ones in the tree, offline ones in their core when the
kernel still says which core, else in an "Offline CPUs" strip; memory-only NUMA nodes get boxes
of their own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from corepin.cli.render._common import KIND_LABELS, short_core_type, shown_devices, summary
from corepin.core.cpuset import CPUSet
from corepin.topology.devices import Device
from corepin.topology.model import CPUInfo, Topology

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
class Style:
    fill: str
    stroke: str = "#555555"
    pad: float = 6.0
    gap: float = 6.0
    font: float = 12.0
    bold: bool = True
    dash: bool = False
    radius: float = 3.0


STYLES: dict[str, Style] = {
    "machine": Style("#fbfbfb", "#333333", pad=8, gap=10, font=13),
    "socket": Style("#e6e6e6", "#4d4d4d", pad=7, gap=8),
    "die": Style("#d9d9d9", "#666666", pad=6, gap=6),
    "numa": Style("#f6e7c1", "#a0833a", pad=6, gap=6),
    "memnuma": Style("#f6e7c1", "#a0833a", pad=6, gap=6, dash=True),
    "l3": Style("#dce8f6", "#5a7ca6", pad=5, gap=5, font=11),
    "group": Style("#e5f1dc", "#6b8f5a", pad=4, gap=4, font=10),
    "core": Style("#c4c4c4", "#5c5c5c", pad=4, gap=3, font=10),
    "core-P": Style("#9dbde3", "#3e6390", pad=4, gap=3, font=10),
    "core-E": Style("#b3d9a5", "#4f7f3f", pad=4, gap=3, font=10),
    "core-other": Style("#e3c6e8", "#7a4f82", pad=4, gap=3, font=10),
    "offline-group": Style("#f4f4f4", "#8c8c8c", pad=6, gap=4, font=11, dash=True),
    "device": Style("#e2f0d9", "#55804a", pad=5, gap=4, font=11, radius=2),
    "pu": Style("#ffffff", "#4d4d4d", font=11, bold=False, radius=2),
    "pu-isolated": Style("#fff1a8", "#c0392b", font=11, bold=False, dash=True, radius=2),
    "pu-offline": Style("url(#hatch)", "#8c8c8c", font=11, bold=False, radius=2),
}

_CORE_LABELS = {"P": "P-core", "E": "E-core"}


@dataclass(eq=False)
class Box:
    kind: str
    label: str
    children: list[Box] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    tip: str = ""
    fill: str | None = None
    text_fill: str = "#1a1a1a"
    w: float = 0.0
    h: float = 0.0
    offsets: list[tuple[float, float]] = field(default_factory=list)
    rows: list[list[int]] = field(default_factory=list)

    @property
    def style(self) -> Style:
        return STYLES[self.kind]


# --------------------------------------------------------------------------- tree of boxes


def _group(infos: Iterable[CPUInfo], attr: str) -> dict[int | None, list[CPUInfo]]:
    out: dict[int | None, list[CPUInfo]] = {}
    for info in infos:
        out.setdefault(getattr(info, attr), []).append(info)
    return dict(sorted(out.items(), key=lambda kv: -1 if kv[0] is None else kv[0]))


def _cpuset(infos: Iterable[CPUInfo]) -> CPUSet:
    return CPUSet(i.cpu for i in infos)


class BoxBuilder:
    def __init__(
        self,
        topology: Topology,
        owners: Mapping[int, str] | None,
        colours: Mapping[str, str] | None = None,
    ) -> None:
        self.t = topology
        self.owners = owners
        self.colours = owner_colours(owners, colours) if owners is not None else {}
        self.offline_by_core: dict[int, list[CPUInfo]] = {}
        for info in topology.cpus:
            if not info.online and info.core is not None:
                self.offline_by_core.setdefault(info.core, []).append(info)
        #: devices not drawn yet, by NUMA node (None: no node)
        self.devices: dict[int | None, list[Device]] = {}
        for device in shown_devices(topology):
            self.devices.setdefault(device.numa, []).append(device)

    # every present CPU, placed once: online ones in the tree, offline ones in their core when
    # the kernel still says which core, else in the "Offline CPUs" strip
    def machine(self) -> Box:
        online = [c for c in self.t.cpus if c.online]
        makers: dict[str, Callable[[int, list[CPUInfo]], Box]] = {
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
                    Box(
                        "memnuma",
                        f"NUMA node {node.id}",
                        children=self.device_boxes(node.id),
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
            strip = Box(
                "offline-group",
                "Offline CPUs",
                tip=f"offline CPUs {_cpuset(loose)}: the kernel hides their topology",
            )
            strip.children = [self.pu(c) for c in loose]
            children.append(strip)
        for left in sorted(self.devices, key=lambda n: -1 if n is None else n):
            children.extend(self.device_boxes(left))  # no NUMA node, or none drawn
        return Box("machine", "Machine", children=children, tip=summary(self.t))

    def level(
        self, infos: list[CPUInfo], levels: list[tuple[str, Callable[[int, list[CPUInfo]], Box]]]
    ) -> list[Box]:
        """Boxes of the first level (in `Topology.level_order()`: a cache or NUMA node that
        spans several packages, as on DynamIQ SoCs, is drawn around them), the rest inside.
        A die box is drawn only where there are several dies side by side."""
        if not levels:
            return self.groups_and_cores(infos)
        (attr, make), rest = levels[0], levels[1:]
        groups = _group(infos, attr)
        if attr == "die" and len(groups) == 1:
            return self.level(infos, rest)
        out: list[Box] = []
        for key, members in groups.items():
            if key is None:  # the kernel does not say: no box at this level for them
                out.extend(self.level(members, rest))
                continue
            box = make(key, members)
            box.children = self.level(members, rest)
            if attr == "numa":
                box.children.extend(self.device_boxes(key))
            out.append(box)
        return out

    def device_boxes(self, node: int | None) -> list[Box]:
        """Boxes of the devices of NUMA node `node` not drawn yet (each is drawn once)."""
        out = []
        for device in self.devices.pop(node, []):
            where = "no NUMA node" if device.numa is None else f"NUMA node {device.numa}"
            tip = (
                f"{KIND_LABELS[device.kind]} {device.address}: {where}, local CPUs "
                f"{device.local_cpus}, class 0x{device.pci_class:06x}, "
                f"id {device.vendor:04x}:{device.device:04x}"
            )
            if device.names:
                tip += f", names {', '.join(device.names)}"
            label = f"{KIND_LABELS[device.kind]} {device.address.removeprefix('0000:')}"
            lines = [", ".join(device.names)] if device.names else []
            out.append(Box("device", label, lines=lines, tip=tip))
        return out

    def socket_box(self, socket: int, members: list[CPUInfo]) -> Box:
        label = f"Socket {socket}"
        return Box("socket", label, tip=f"{label}: CPUs {self.t.cpus_in_sockets(socket)}")

    def die_box(self, die: int, members: list[CPUInfo]) -> Box:
        socket = members[0].socket
        label = f"Die {die}"
        whole = self.t.cpus_in_dies((socket, die)) if socket is not None else _cpuset(members)
        return Box("die", label, tip=f"Socket {socket} {label}: CPUs {whole}")

    def numa_box(self, node: int, members: list[CPUInfo]) -> Box:
        part = _cpuset(members)
        whole = self.t.cpus_in_numa_nodes(node)
        label = f"NUMA node {node}" + ("" if part == whole else " (part)")
        try:
            memory = self.t.numa_node(node).memory_kb
        except ValueError:
            memory = None
        if memory is not None:
            label += f" ({_size(memory)})"
        return Box("numa", label, tip=f"NUMA node {node}: CPUs {whole}")

    def l3_box(self, l3: int, members: list[CPUInfo]) -> Box:
        part = _cpuset(members)
        whole = self.t.cpus_in_l3s(l3)
        label = f"L3 #{l3}" + ("" if part == whole else " (part)")
        return Box("l3", label, tip=f"L3 cache #{l3}: shared by CPUs {whole}")

    def groups_and_cores(self, infos: list[CPUInfo]) -> list[Box]:
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
                    box = Box(
                        "group",
                        f"{name}{key}",
                        tip=f"{what} {key}: CPUs {_cpuset(members)}",
                    )
                    box.children = self.cores(members)
                    out.append(box)
                return out
        return self.cores(infos)

    def cores(self, infos: list[CPUInfo]) -> list[Box]:
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
            box = Box(style, label, tip=tip)
            box.children = [self.pu(c) for c in every]
            out.append(box)
        return out

    def pu(self, info: CPUInfo) -> Box:
        kind = "pu"
        state = []
        if not info.online:
            kind = "pu-offline"
            state.append("offline")
        elif info.isolated:
            kind = "pu-isolated"
            state.append("isolated")
        box = Box(kind, str(info.cpu))
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


def owner_colours(
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
