"""Could any node of the cluster ever hold a pod's CPUs? (issue 9 item 6: "levels or counts no
node in the cluster could ever satisfy").

The answer comes from the `NodeCPUTopology` objects the agents publish and from the placement
core, which decides as the node agent's own allocator does: a pod fits a node when
`corepin.placement.fit` places each of its containers in turn on that node's *empty* pools
(`corepin.placement.node.empty_view`: online CPUs, less its reserved CPUs, the shared pool
kept non-empty, the node's policy). So "64 exclusive CPUs" is refused when the biggest node has
32 online, and "20 CPUs at level socket" when withholding the sockets they need would leave
nothing for the shared pool on every node. Current occupancy does not matter: CPUs free up,
topology does not.

- `NodeShape`: one node, parsed once from its NodeCPUTopology.
- `ClusterCapacity`: an immutable snapshot of every known node; `check(holds, level, workload)`
  is None when some node could hold them all, else a message a user can act on (what was
  asked, what the most capable node could give, why). Nodes with the same shape are decided
  once, and answers are remembered per snapshot.
- `Catalog`: thread-safe bookkeeping fed by an informer's handlers (add, update, delete of
  NodeCPUTopology dicts); `snapshot()` is the current `ClusterCapacity`, or None while no
  node is known (then the rule is skipped: the webhook never refuses pods for want of data).

No I/O and no clock: the informer that feeds the catalog lives in the command.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from corepin.allocation.levels import units_of
from corepin.core.cpuset import CPUSet
from corepin.core.errors import CorepinError
from corepin.core.record import record
from corepin.kube.models import NodeCPUTopology, ObjectView
from corepin.placement.fit import fit
from corepin.placement.node import NodeView, empty_view
from corepin.placement.request import ContainerAsk, PodRequest

log = logging.getLogger("corepin.api.webhook.capacity")

#: Answers remembered per snapshot.
ANSWER_CACHE: Final = 1024

_UNIT_NAMES: Final = {"core": "core", "l3": "L3 cache", "numa": "NUMA node", "socket": "socket"}


@record
class Hold:
    """One exclusive or share container of a pod: its name, kind and CPU count."""

    container: str
    kind: str
    count: int


#: What decides an answer: the holds (container, kind, count), the level, the workload.
AnswerKey = tuple[tuple[tuple[str, str, int], ...], str, str | None]


class NodeShape:
    """One node as the capacity rule sees it: its empty view (read-only)."""

    __slots__ = ("name", "online", "reserved", "shape", "topology", "view")

    def __init__(self, view: NodeView, shape: str = "") -> None:
        self.view = view
        self.name = view.name
        self.topology = view.topology
        self.reserved = CPUSet.from_bits(view.pools.reserved)
        self.online = len(view.topology.online_cpus)
        self.shape = shape  # equal shapes decide alike

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> NodeShape:
        """From a NodeCPUTopology dict; FieldError (or RequestError for an unknown policy)
        when it cannot be read."""
        view = empty_view(NodeCPUTopology.from_dict(obj))
        shape = json.dumps(
            [obj.get("spec"), str(CPUSet.from_bits(view.pools.reserved))],
            sort_keys=True,
            separators=(",", ":"),
        )
        return cls(view, shape)

    def fits(self, holds: Sequence[Hold], level: str, workload: str | None) -> bool:
        """Whether the placement core gives every hold its CPUs, one after the other, on
        this node when nothing else runs there."""
        asks = tuple(ContainerAsk(h.container, h.kind, h.count, level, workload) for h in holds)
        return fit(self.view, PodRequest("", "", "", asks)).ok

    def most(self, kind: str, level: str, workload: str | None) -> int:
        """The largest count (searched by halving, each answer verified by the allocator) that
        one container of `kind` at `level` gets on this node when empty; 0 when none."""
        low, high = 0, self.online
        while low < high:
            mid = (low + high + 1) // 2
            if self.fits((Hold("", kind, mid),), level, workload):
                low = mid
            else:
                high = mid - 1
        return low

    def describe(self, level: str) -> str:
        """`node-a: 32 online CPUs, 2 reserved, 2 sockets of 16 CPUs`."""
        parts = [f"{self.online} online CPUs"]
        if self.reserved:
            parts.append(f"{len(self.reserved)} reserved")
        if level != "cpu":
            units = units_of(self.topology, level)
            sizes = sorted({len(u) for u in units})
            size = str(sizes[0]) if len(sizes) == 1 else f"{sizes[0]}-{sizes[-1]}"
            plural = "s" if len(units) != 1 else ""
            parts.append(f"{len(units)} {_UNIT_NAMES[level]}{plural} of {size} CPUs")
        return f"{self.name}: {', '.join(parts)}"


class ClusterCapacity:
    """Every known node at one moment (see the module docstring). Thread-safe."""

    def __init__(self, nodes: Iterable[NodeShape]) -> None:
        self.nodes: tuple[NodeShape, ...] = tuple(sorted(nodes, key=lambda n: n.name))
        shapes: dict[str, NodeShape] = {}
        for node in self.nodes:
            shapes.setdefault(node.shape or node.name, node)
        #: one node per distinct shape, the biggest first (the likeliest to fit)
        self.distinct: tuple[NodeShape, ...] = tuple(
            sorted(shapes.values(), key=lambda n: (-n.online, n.name))
        )
        self._answers: OrderedDict[AnswerKey, str | None] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.nodes)

    def check(self, holds: Sequence[Hold], level: str, workload: str | None = None) -> str | None:
        """None when some node could hold every one of `holds` at `level` at once; otherwise
        why not, naming the containers, what they ask and what the best node could give."""
        holds = tuple(h for h in holds if h.count > 0)
        if not holds or not self.distinct or workload == "best-effort":
            # a best-effort workload runs on the shared pool whatever its policy says
            return None
        key: AnswerKey = (tuple((h.container, h.kind, h.count) for h in holds), level, workload)
        with self._lock:
            if key in self._answers:
                self._answers.move_to_end(key)
                return self._answers[key]
        answer = self._decide(holds, level, workload)
        with self._lock:
            self._answers[key] = answer
            while len(self._answers) > ANSWER_CACHE:
                self._answers.popitem(last=False)
        return answer

    def _decide(self, holds: tuple[Hold, ...], level: str, workload: str | None) -> str | None:
        if any(node.fits(holds, level, workload) for node in self.distinct):
            return None
        # Why not: first a container that fits nowhere on its own, else the sum.
        for hold in holds:
            best, node = self._most(hold.kind, level, workload)
            if hold.count <= best:
                continue
            asked = (
                f"container {hold.container!r} asks for {hold.count} {hold.kind} CPUs at "
                f"exclusiveness level {level}"
            )
            if best == 0:
                return (
                    f"{asked}, and no corepin node can give any {hold.kind} CPUs at that level "
                    f"(the biggest is {node.describe(level)}{_keep_note(hold.kind)}); "
                    "use a narrower corepin.io/exclusiveness-level"
                )
            return (
                f"{asked}, more than any corepin node can ever give: the most is {best} "
                f"({node.describe(level)}{_keep_note(hold.kind)}); ask for at most {best}"
                f"{_narrower(level)}"
            )
        names = ", ".join(repr(h.container) for h in holds)
        total = sum(h.count for h in holds)
        kinds = "/".join(sorted({h.kind for h in holds}))
        biggest = self.distinct[0]
        return (
            f"containers {names} ask for {total} {kinds} CPUs together at exclusiveness level "
            f"{level}, and no corepin node can ever hold them all at once (the biggest is "
            f"{biggest.describe(level)}{_keep_note('exclusive')}); ask for fewer CPUs"
            f"{_narrower(level)}"
        )

    def _most(self, kind: str, level: str, workload: str | None) -> tuple[int, NodeShape]:
        best, where = -1, self.distinct[0]
        for node in self.distinct:
            count = node.most(kind, level, workload)
            if count > best:
                best, where = count, node
        return max(best, 0), where


def _keep_note(kind: str) -> str:
    return "; one CPU always stays in the shared pool" if kind == "exclusive" else ""


def _narrower(level: str) -> str:
    return "" if level == "cpu" else " or a narrower corepin.io/exclusiveness-level"


class Catalog:
    """The nodes known from NodeCPUTopology events (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._specs: dict[str, tuple[object, str]] = {}
        self._nodes: dict[str, NodeShape] = {}
        self._snapshot: ClusterCapacity | None = None
        self._dirty = True
        #: names of objects that could not be read, with why (for logs and tests)
        self.unreadable: dict[str, str] = {}

    # ------------------------------------------------------------------ informer handlers
    def on_add(self, obj: Mapping[str, Any]) -> None:
        self._put(obj)

    def on_update(self, _old: Mapping[str, Any], new: Mapping[str, Any]) -> None:
        self._put(new)

    def on_delete(self, obj: Mapping[str, Any]) -> None:
        name = _name(ObjectView(obj))
        with self._lock:
            self._specs.pop(name, None)
            self.unreadable.pop(name, None)
            if self._nodes.pop(name, None) is not None:
                self._dirty = True

    def _put(self, obj: Mapping[str, Any]) -> None:
        view = ObjectView(obj)
        name = _name(view)
        key = (obj.get("spec"), str(view.status.get("reservedCPUs")))
        with self._lock:
            if self._specs.get(name) == key:
                return  # a heartbeat or a change of free CPUs: the node's shape is the same
        try:
            node: NodeShape | None = NodeShape.from_object(obj)
            problem = ""
        except (CorepinError, ValueError, TypeError) as exc:
            node, problem = None, str(exc)
            log.warning("event=ncpt_unreadable name=%s error=%s", name, problem)
        with self._lock:
            self._specs[name] = key
            if node is None:
                self.unreadable[name] = problem
                self._dirty |= self._nodes.pop(name, None) is not None
            else:
                self.unreadable.pop(name, None)
                self._nodes[name] = node
                self._dirty = True

    # ------------------------------------------------------------------ reads
    def snapshot(self) -> ClusterCapacity | None:
        """The current nodes (the same object until a node's shape changes); None when no
        node is known."""
        with self._lock:
            if self._dirty:
                self._snapshot = ClusterCapacity(self._nodes.values()) if self._nodes else None
                self._dirty = False
            return self._snapshot

    def __len__(self) -> int:
        with self._lock:
            return len(self._nodes)


def _name(view: ObjectView) -> str:
    name = view.metadata.get("name")
    return name if isinstance(name, str) else ""
