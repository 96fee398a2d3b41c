"""The controller's decisions about PodCPUBindings, as pure functions (no API, no clock: the
time is passed in). `corepin.agent.cluster.controller` documents the rules; this module is where
they are computed:

- `key_of`, `binding_pod`, `accounting`: readers of the objects as the informers
  hold them;
- `pod_facts`, `node_facts`: what the controller needs of a Pod and of a NodeCPUTopology;
- `check_binding`: one user-written binding on its own (spec, pod, containers, CPUs on the
  node) -> a `Verdict` (`Validated` here means "passes its own checks");
- `claim_of`: the CPUs a binding holds or asks for, and what its level withholds;
- `decide_node`: every user-written binding of one node, conflicts included;
- `next_status`: the status to write for a verdict (None when nothing changes).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Final

from corepin.allocation.levels import withheld_for
from corepin.core.cpuset import EMPTY, CPUSet
from corepin.core.errors import CPUSetParseError
from corepin.core.record import record
from corepin.kube.models import (
    VALIDATED,
    Condition,
    ContainerCPUSet,
    FieldError,
    NodeCPUTopology,
    ObjectView,
    PodCPUBinding,
    PodView,
    find_condition,
    set_condition,
)
from corepin.kube.podplan import container_sizes, size_refusal
from corepin.topology.model import Topology

# Verdict phases (the subset of PodCPUBinding phases the controller decides).
VALID: Final = "Validated"
FAILED: Final = "Failed"
PENDING: Final = "Pending"

# Verdict reasons (the `Validated` condition's reason; CamelCase as metav1.Condition wants).
R_VALID: Final = "Valid"
R_INVALID_SPEC: Final = "InvalidSpec"
R_POD_NOT_FOUND: Final = "PodNotFound"
R_UNKNOWN_CONTAINER: Final = "UnknownContainer"
R_OVERLAPPING_CONTAINERS: Final = "OverlappingContainers"
R_POD_NOT_SCHEDULED: Final = "PodNotScheduled"
R_TOPOLOGY_MISSING: Final = "NodeTopologyMissing"
R_TOPOLOGY_INVALID: Final = "NodeTopologyInvalid"
R_UNKNOWN_CPUS: Final = "UnknownCPUs"
R_OFFLINE_CPUS: Final = "OfflineCPUs"
R_RESERVED_CPUS: Final = "ReservedCPUs"
R_CONFLICT: Final = "Conflict"
R_DUPLICATE: Final = "DuplicateBinding"
R_INELIGIBLE: Final = "IneligibleContainer"

#: Phases in which a binding holds its CPUs (the agent acts on Validated, then sets Applied).
HOLDING_PHASES: Final = frozenset({"Validated", "Applied"})


@record
class Verdict:
    """What the controller concluded about one binding."""

    phase: str  # VALID | FAILED | PENDING
    reason: str
    message: str
    node: str | None = None

    @property
    def condition_status(self) -> str:
        return {VALID: "True", FAILED: "False"}.get(self.phase, "Unknown")


@record
class PodFacts:
    """The parts of a Pod the controller reads."""

    namespace: str
    name: str
    uid: str
    node: str | None
    containers: tuple[str, ...]
    init_containers: tuple[str, ...] = ()
    #: per app container: (whole CPUs, "") when eligible for CPUs of its own, else (0, why
    #: not) - `corepin.kube.podplan.container_sizes`, the agent's own reading of the limits
    sizes: tuple[tuple[str, tuple[int, str]], ...] = ()

    def size_of(self, container: str) -> tuple[int, str]:
        for name, size in self.sizes:
            if name == container:
                return size
        return 0, "it has no CPU limit"


#: one row of a node's published `status.allocations`: namespace, pod, pod uid, container, CPUs
Held = tuple[str, str, str, str, CPUSet]


@record
class NodeFacts:
    """A node's NodeCPUTopology as the controller uses it: the topology and the reserved CPUs,
    or why it cannot be read; `accounted`, the CPUs the agent's status reports (pools, free,
    reserved, isolated, held: a binding may only name these; None: not known, not checked);
    `held`, the allocations the agent published (what confirms the agent's own bindings)."""

    name: str
    topology: Topology | None
    reserved: CPUSet = EMPTY
    error: str = ""
    accounted: CPUSet | None = None
    held: frozenset[Held] = frozenset()

    def confirms(
        self, namespace: str, pod: str, uid: str | None, rows: Sequence[ContainerCPUSet]
    ) -> bool:
        """Whether the agent's published allocations hold exactly these container rows
        (`ContainerCPUSet`s) of pod `namespace/pod` with uid `uid`: the proof that a binding
        labelled as the agent's is the agent's record, not a tenant's forgery."""
        if not uid or not rows:
            return False
        return all((namespace, pod, uid, row.name, row.cpus) in self.held for row in rows)


@record
class Claim:
    """The CPUs a binding of pod `namespace/pod` holds (or asks for) on its node and what its
    level withholds."""

    namespace: str
    name: str
    pod: str
    level: str
    cpus: CPUSet
    withheld: CPUSet

    @property
    def label(self) -> str:
        return f"{self.namespace}/{self.name}"


@record
class Entry:
    """One binding of a node, as `decide_node` ranks it."""

    namespace: str
    name: str
    pod: str  # spec.podName
    created: str  # metadata.creationTimestamp (RFC 3339 in UTC: sorts as text)
    agent: bool  # written by the node agent: a record of what it holds
    holding: bool  # phase Validated or Applied (or an agent binding)
    # user bindings: `check_binding`; None for bindings that are not judged but hold their
    # CPUs (the agent's, and a holding binding whose pod is going away)
    own: Verdict | None
    claim: Claim | None

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)


# ---------------------------------------------------------------------- objects
#: the NodeCPUTopology status fields the decisions read (not the heartbeat, not the conditions)
_ACCOUNTING: Final = (
    "reservedCPUs",
    "sharedPool",
    "free",
    "isolatedCPUs",
    "allocations",
)


def key_of(obj: Mapping[str, Any]) -> tuple[str, str]:
    """(namespace, name) of an object."""
    view = ObjectView(obj)
    return (view.namespace, view.name)


def binding_pod(obj: Mapping[str, Any]) -> tuple[str, str]:
    """(namespace, `spec.podName`) of a PodCPUBinding object."""
    view = ObjectView(obj)
    return (view.namespace, str(view.spec.get("podName") or ""))


def accounting(ncpt: Mapping[str, Any]) -> tuple[Any, ...]:
    """The status fields of a NodeCPUTopology that the decisions read."""
    status = ObjectView(ncpt).status
    return tuple(status.get(k) for k in _ACCOUNTING)


def label(namespace: str, name: str) -> str:
    """`namespace/name`, or `name` for a cluster-scoped object."""
    return f"{namespace}/{name}" if namespace else name


# ---------------------------------------------------------------------- facts
def _names(rows: object) -> tuple[str, ...]:
    if not isinstance(rows, list):
        return ()
    return tuple(str(r.get("name")) for r in rows if isinstance(r, dict) and r.get("name"))


def pod_facts(pod: Mapping[str, Any]) -> PodFacts:
    view = PodView(pod)
    spec = view.spec
    return PodFacts(
        namespace=view.namespace,
        name=view.name,
        uid=view.uid,
        node=view.node_name or None,
        containers=_names(spec.get("containers")),
        init_containers=_names(spec.get("initContainers")),
        sizes=tuple(sorted(container_sizes(pod).items())),
    )


def node_facts(ncpt: Mapping[str, Any]) -> NodeFacts:
    """A NodeCPUTopology object -> NodeFacts (`error` says what is wrong with a bad one).
    Reserved CPUs are the spec's and the status's (a count reservation is resolved there)."""
    name = ObjectView(ncpt).name
    try:
        model = NodeCPUTopology.from_dict(ncpt)
    except FieldError as exc:
        return NodeFacts(name, None, EMPTY, str(exc))
    reserved = model.spec.reserved_cpus
    status = model.status
    topology = model.spec.topology
    if status is None:
        return NodeFacts(name, topology, reserved, accounted=EMPTY)
    reserved = reserved | status.reserved_cpus
    # What the agent reports through the status subresource, which it rewrites on every
    # heartbeat from its own reading of the machine: a spec somebody else edited (a CPU 4000
    # added) does not make CPUs appear here, so a binding can never be validated on them.
    accounted = status.shared_pool | status.free | status.reserved_cpus | status.isolated_cpus
    held: set[Held] = set()
    for a in status.allocations:
        held.add((a.namespace, a.pod, a.pod_uid, a.container, a.cpus))
        accounted = (
            accounted | a.cpus | withheld_for(topology, a.level, a.cpus & topology.online_cpus)
        )
    return NodeFacts(name, topology, reserved, accounted=accounted, held=frozenset(held))


def status_cpus(binding: Mapping[str, Any]) -> CPUSet:
    """`status.cpus` of a binding object (empty when absent or unreadable)."""
    text = ObjectView(binding).status.get("cpus")
    if not isinstance(text, str):
        return EMPTY
    try:
        return CPUSet.parse(text)
    except CPUSetParseError:
        return EMPTY


def status_phase(binding: Mapping[str, Any]) -> str:
    return str(ObjectView(binding).status.get("phase") or "Pending")


def explicit_cpus(binding: PodCPUBinding) -> CPUSet:
    """Every CPU a binding's spec names (pod-wide and per container)."""
    out = binding.spec.cpus or EMPTY
    for row in binding.spec.containers:
        out = out | row.cpus
    return out


# ---------------------------------------------------------------------- one binding
def _cpus_text(cpus: CPUSet) -> str:
    return str(cpus) if cpus else "none"


def _cpu_fields(binding: PodCPUBinding) -> list[tuple[str, CPUSet]]:
    """(field path, CPUs) for every explicit CPU list of the spec, in spec order."""
    out: list[tuple[str, CPUSet]] = []
    if binding.spec.cpus:
        out.append(("spec.cpuSet", binding.spec.cpus))
    for i, row in enumerate(binding.spec.containers):
        out.append((f"spec.containers[{i}].cpuSet (container {row.name!r})", row.cpus))
    return out


def check_binding(
    binding: PodCPUBinding,
    pod: PodFacts | None,
    node: NodeFacts | None,
) -> Verdict:
    """The rules a user-written binding must pass on its own, in this order (the first that
    fails decides): the pod exists; each `spec.containers[].name` is a container of the pod;
    per-container CPU sets do not overlap each other, nor the pod-wide `cpuSet` when some
    container uses it; every app container given CPUs is eligible as for the annotations and
    is given exactly as many CPUs as its CPU limit; the pod is bound to a node (else Pending);
    the node has a readable NodeCPUTopology (else Pending); every CPU named exists on the
    node, is online, is among the CPUs the agent's status reports, and is not reserved.
    `node` must be the NodeFacts of the pod's node (or None when there is none)."""
    where = f"{binding.namespace}/{binding.spec.pod_name}"
    if pod is None:
        return Verdict(FAILED, R_POD_NOT_FOUND, f"pod {where} not found")
    known = pod.containers + pod.init_containers
    for i, row in enumerate(binding.spec.containers):
        if row.name not in known:
            has = ", ".join(repr(n) for n in known) or "none"
            return Verdict(
                FAILED,
                R_UNKNOWN_CONTAINER,
                f"spec.containers[{i}].name: pod {where} has no container {row.name!r} "
                f"(its containers: {has})",
            )
    groups: list[tuple[str, CPUSet]] = [
        (f"container {row.name!r}", row.cpus) for row in binding.spec.containers
    ]
    with_rows = {row.name for row in binding.spec.containers}
    if binding.spec.cpus and any(c not in with_rows for c in pod.containers):
        groups.append(("spec.cpuSet", binding.spec.cpus))
    for i, (a_name, a_cpus) in enumerate(groups):
        for b_name, b_cpus in groups[i + 1 :]:
            both = a_cpus & b_cpus
            if both:
                return Verdict(
                    FAILED,
                    R_OVERLAPPING_CONTAINERS,
                    f"{a_name} and {b_name} both list CPUs {both}: the CPUs of a binding's "
                    "containers must not overlap",
                )
    for name, cpus in _given(binding, pod):
        why = size_refusal(name, pod.size_of(name), cpus)
        if why:
            return Verdict(
                FAILED,
                R_INELIGIBLE,
                f"{why}: a binding needs a whole CPU limit >= 1 equal to the CPU request and "
                "exactly that many CPUs (the pod's limits, never more)",
                pod.node,
            )
    if pod.node is None:
        return Verdict(
            PENDING,
            R_POD_NOT_SCHEDULED,
            f"pod {where} is not bound to a node yet; its CPUs are checked once it is",
        )
    if node is None:
        return Verdict(
            PENDING,
            R_TOPOLOGY_MISSING,
            f"node {pod.node} has no NodeCPUTopology yet (is the corepin agent running there?)",
            pod.node,
        )
    if node.topology is None:
        return Verdict(
            PENDING,
            R_TOPOLOGY_INVALID,
            f"the NodeCPUTopology of node {pod.node} cannot be read: {node.error}",
            pod.node,
        )
    topology = node.topology
    for path, cpus in _cpu_fields(binding):
        missing = cpus - topology.present_cpus
        if missing:
            return Verdict(
                FAILED,
                R_UNKNOWN_CPUS,
                f"{path}: CPUs {missing} do not exist on node {pod.node} "
                f"(its CPUs: {_cpus_text(topology.present_cpus)})",
                pod.node,
            )
    for path, cpus in _cpu_fields(binding):
        offline = cpus - topology.online_cpus
        if offline:
            return Verdict(
                FAILED,
                R_OFFLINE_CPUS,
                f"{path}: CPUs {offline} are offline on node {pod.node} "
                f"(online: {_cpus_text(topology.online_cpus)})",
                pod.node,
            )
    if node.accounted is not None:
        for path, cpus in _cpu_fields(binding):
            unreported = cpus - node.accounted
            if unreported and not node.accounted:
                return Verdict(
                    PENDING,
                    R_TOPOLOGY_INVALID,
                    f"the corepin agent of node {pod.node} has not reported its CPUs yet "
                    "(NodeCPUTopology status)",
                    pod.node,
                )
            if unreported:
                return Verdict(
                    FAILED,
                    R_UNKNOWN_CPUS,
                    f"{path}: CPUs {unreported} are not among the CPUs the corepin agent of node "
                    f"{pod.node} reports ({node.accounted}); a NodeCPUTopology spec the agent "
                    "did not write is not trusted",
                    pod.node,
                )
    for path, cpus in _cpu_fields(binding):
        reserved = cpus & node.reserved
        if reserved:
            return Verdict(
                FAILED,
                R_RESERVED_CPUS,
                f"{path}: CPUs {reserved} are reserved for the system on node {pod.node} "
                f"(reserved: {node.reserved})",
                pod.node,
            )
    return Verdict(VALID, R_VALID, _valid_message(binding, pod.node), pod.node)


def _given(binding: PodCPUBinding, pod: PodFacts) -> list[tuple[str, CPUSet]]:
    """(app container, CPUs) for every app container the binding gives CPUs to, as the agent
    reads it: a row of its own, else the pod-wide `spec.cpuSet` when the pod has one container.
    (Rows of init containers give nothing: they run on the shared pool.)"""
    rows = {row.name: row.cpus for row in binding.spec.containers}
    pod_wide = binding.spec.cpus if len(pod.containers) == 1 else None
    out: list[tuple[str, CPUSet]] = []
    for name in pod.containers:
        cpus = rows.get(name, pod_wide)
        if cpus is not None:
            out.append((name, cpus))
    return out


def _valid_message(binding: PodCPUBinding, node: str) -> str:
    cpus = explicit_cpus(binding)
    if not cpus:
        return f"valid on node {node}: the agent chooses the CPUs at level {binding.spec.level}"
    return f"valid on node {node}: CPUs {cpus} at level {binding.spec.level}"


def invalid_spec(error: FieldError) -> Verdict:
    """The verdict on a binding whose spec cannot be read (the message names field and value)."""
    return Verdict(FAILED, R_INVALID_SPEC, str(error))


def claim_of(
    namespace: str,
    name: str,
    pod: str,
    level: str,
    cpus: CPUSet,
    topology: Topology,
) -> Claim:
    """What a binding of `pod` at `level` on `cpus` withholds on `topology` (CPUs the node
    does not have online are left out: they cannot be withheld)."""
    online = cpus & topology.online_cpus
    return Claim(namespace, name, pod, level, online, withheld_for(topology, level, online))


# ---------------------------------------------------------------------- one node
def _rank(entry: Entry) -> tuple[int, int, str, str, str]:
    """Bindings that are not judged first (the agent's records: what the node holds), then
    bindings already holding (Validated or Applied: a newcomer never unseats them), then the
    oldest, then by name."""
    return (
        0 if entry.own is None else 1,
        0 if entry.holding else 1,
        entry.created,
        entry.namespace,
        entry.name,
    )


def decide_node(node: str, entries: Sequence[Entry]) -> dict[tuple[str, str], Verdict]:
    """Verdicts for the user-written bindings of one node.

    A binding that fails its own checks keeps that verdict. The others are taken in rank order
    (`_rank`): a second valid user-written binding of a pod that already has one is Failed
    (`DuplicateBinding`); otherwise a binding is Validated when what its level withholds
    overlaps nothing withheld by the bindings of *other* pods taken before it (the bindings
    that are not judged, then those validated in this pass), else Failed (`Conflict`, naming
    the other binding and the CPUs). The bindings of one pod never conflict with each other:
    the agent records each container it pins for a user-written binding in a binding of its
    own, on the same CPUs. So two validated bindings of different pods of a node never
    withhold a common CPU, and a pod has at most one validated user-written binding."""
    out: dict[tuple[str, str], Verdict] = {}
    taken: list[Claim] = []
    validated: dict[tuple[str, str], str] = {}  # pod -> its validated binding
    for entry in sorted(entries, key=_rank):
        own = entry.own
        if own is None:
            if entry.claim is not None and entry.claim.withheld:
                taken.append(entry.claim)
            continue
        if own.phase != VALID:
            out[entry.key] = own
            continue
        pod = (entry.namespace, entry.pod)
        first = validated.get(pod)
        if first is not None:
            out[entry.key] = Verdict(
                FAILED,
                R_DUPLICATE,
                f"pod {entry.namespace}/{entry.pod} already has the validated binding "
                f"{entry.namespace}/{first}: one user-written binding per pod",
                node,
            )
            continue
        mine = entry.claim
        clash = None
        if mine is not None and mine.withheld:
            clash = next(
                (c for c in taken if (c.namespace, c.pod) != pod and c.withheld & mine.withheld),
                None,
            )
        if clash is None or mine is None:
            if mine is not None:
                taken.append(mine)
            validated[pod] = entry.name
            out[entry.key] = own
            continue
        overlap = clash.withheld & mine.withheld
        out[entry.key] = Verdict(
            FAILED,
            R_CONFLICT,
            f"CPUs {overlap} on node {node} are taken: this binding (CPUs {mine.cpus}, level "
            f"{mine.level}) withholds {mine.withheld}, and binding {clash.label} (CPUs "
            f"{clash.cpus}, level {clash.level}) withholds {clash.withheld}",
            node,
        )
    return out


# ---------------------------------------------------------------------- status
def read_conditions(status: Mapping[str, Any]) -> tuple[Condition, ...]:
    """The conditions of a status, leaving out rows that cannot be read (they are rewritten)."""
    rows = status.get("conditions")
    out: list[Condition] = []
    if isinstance(rows, list):
        for i, row in enumerate(rows):
            try:
                found = Condition.from_dict(row, f"status.conditions[{i}]")
            except FieldError:
                continue
            if all(c.type != found.type for c in out):
                out.append(found)
    return tuple(out)


def next_status(
    status: Mapping[str, Any] | None, verdict: Verdict, now: datetime
) -> dict[str, Any] | None:
    """The status to write for `verdict` (the other fields kept), or None when it would not
    change. The controller owns the `Validated` condition; `phase` and `message` follow the
    verdict except that:
    - a valid binding the agent has `Applied`, or has marked `Failed` after the controller
      validated it (its `Validated` condition True), keeps the agent's phase and message;
    - a binding that cannot be decided now (Pending verdict: pod not scheduled, topology
      missing) keeps the phase `Validated` or `Applied` it has (only its condition says
      Unknown): the agent may be holding its CPUs."""
    current = dict(status or {})
    phase = str(current.get("phase") or "Pending")
    conditions = read_conditions(current)
    mine = find_condition(conditions, VALIDATED)
    new_phase, message = verdict.phase, verdict.message
    if verdict.phase == VALID:
        agent_failed = phase == FAILED and mine is not None and mine.status == "True"
        if phase == "Applied" or agent_failed:
            new_phase, message = phase, str(current.get("message") or "")
    elif verdict.phase == PENDING and phase in HOLDING_PHASES:
        new_phase, message = phase, str(current.get("message") or "")
    condition = Condition(VALIDATED, verdict.condition_status, now, verdict.reason, verdict.message)
    wanted = dict(current)
    wanted["phase"] = new_phase
    wanted["message"] = message
    if verdict.node is not None:
        wanted["nodeName"] = verdict.node
    unchanged = (
        phase == new_phase
        and current.get("message") == message
        and current.get("nodeName") == wanted.get("nodeName")
        and mine is not None
        and (mine.status, mine.reason, mine.message)
        == (condition.status, condition.reason, condition.message)
        and len(conditions) == len(current.get("conditions") or [])
    )
    if unchanged:
        return None
    wanted["conditions"] = [c.to_dict() for c in set_condition(conditions, condition)]
    return wanted
