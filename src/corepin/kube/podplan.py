"""What a pod asks of corepin, read from the pod object (pure: dicts in, records out).

The node agent pins by it, and the placement core (`corepin.placement`: the scheduler and the
extender) decides fit by the same plan, so both read a pod the same way.

`plan_pod(pod, binding=None)` turns a pod (and the user's PodCPUBinding for it, if any) into a
`PodPlan`: per app container the effective policy (`none`, `share`, `exclusive`), CPU count,
exclusiveness level, workload family, the reason when a request was ignored, and the container's
live state from `status.containerStatuses` (runtime and id without the scheme, running or
terminated), and how an exclusive container's CPUs follow the NUMA nodes of its devices
(`corepin.io/device-alignment`; the devices themselves come from the kubelet, not the pod).

Rules:
- policy from `corepin.io/cpu-policy[.<container>]` and the Crane/actimanager aliases
  (`corepin.kube.models.parse_pod_annotations`); malformed annotations make every container
  `none` with the parse error as the reason (the webhook refuses such pods up front);
- `share` and `exclusive` need a whole CPU limit >= 1 equal to the request; otherwise `none`
  with the reason (the agent emits `CPUPolicyIgnored`);
- a PodCPUBinding naming explicit CPUs for a container makes it `exclusive` on exactly those
  CPUs (its level from the binding), when the container is eligible as above and the binding
  names exactly as many CPUs as its limit (`binding_refusal`); otherwise the binding is ignored
  for that container (with the reason) and its annotations decide;
- init containers always run in the shared pool (they finish before the app containers);
- a container id must be a runtime id of hex digits; anything else (path characters, ...) is
  treated as not running, with the reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from corepin.core.cpuset import CPUSet
from corepin.core.errors import CorepinError
from corepin.core.ids import validate_container_id
from corepin.core.record import record
from corepin.kube.models import (
    ObjectView,
    PodCPUBindingSpec,
    PodView,
    container_eligibility,
    corepin_level,
    parse_pod_annotations,
)
from corepin.kube.models.fields import loose_list, loose_object

#: container runtimes by the scheme of `containerID`
RUNTIMES: Final = {"containerd": "containerd", "cri-o": "cri-o", "docker": "docker"}
#: Kubernetes QoS classes as the kubelet's cgroup layout names them
QOS: Final = {"Guaranteed": "guaranteed", "Burstable": "burstable", "BestEffort": "besteffort"}


@record
class ContainerPlan:
    """One app container: what it gets and what state it is in."""

    name: str
    policy: str = "none"  # effective: none | share | exclusive
    asked: str = "none"  # what the annotations (or a binding) asked
    count: int = 0  # CPUs for share / exclusive
    level: str = "cpu"
    workload: str | None = None
    #: how its CPUs follow its devices' NUMA nodes: preferred | required | none
    device_alignment: str = "preferred"
    problem: str = ""  # why the request was ignored ("" when it was not)
    bad_id: str = ""  # why the reported container id cannot be used ("" when it can)
    cpus: CPUSet | None = None  # explicit CPUs from a PodCPUBinding
    runtime: str = ""
    container_id: str = ""  # without the scheme; "" until the container runs
    running: bool = False
    terminated: bool = False

    @property
    def holds(self) -> bool:
        return self.policy in ("share", "exclusive")


@record
class PodPlan:
    """One pod of the node."""

    namespace: str
    name: str
    uid: str
    qos: str  # guaranteed | burstable | besteffort
    containers: tuple[ContainerPlan, ...] = ()
    init_containers: tuple[ContainerPlan, ...] = ()
    problem: str = ""  # malformed annotations
    deleting: bool = False

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def container(self, name: str) -> ContainerPlan | None:
        for c in self.containers:
            if c.name == name:
                return c
        return None


def qos_class(pod: Mapping[str, Any]) -> str:
    """The pod's QoS class as the kubelet's cgroup layout names it: `status.qosClass` when the
    API server set it, else computed from requests and limits as Kubernetes does."""
    view = PodView(pod)
    given = view.status.get("qosClass")
    if isinstance(given, str) and given in QOS:
        return QOS[given]
    containers = [
        *loose_list(view.spec.get("initContainers")),
        *loose_list(view.spec.get("containers")),
    ]
    any_set = False
    guaranteed = bool(containers)
    for c in containers:
        resources = loose_object(c.get("resources") if isinstance(c, Mapping) else None)
        limits = loose_object(resources.get("limits"))
        requests = loose_object(resources.get("requests"))
        for res in ("cpu", "memory"):
            if res in limits or res in requests:
                any_set = True
            limit = limits.get(res)
            request = requests.get(res, limit)
            if limit is None or str(limit) != str(request):
                guaranteed = False
    if not any_set:
        return "besteffort"
    return "guaranteed" if guaranteed else "burstable"


def _live_state(row: Mapping[str, Any] | None) -> tuple[str, str, bool, bool, str]:
    """(runtime, container id, running, terminated, problem) of one container status."""
    if row is None:
        return "", "", False, False, ""
    state = loose_object(row.get("state"))
    running = isinstance(state.get("running"), Mapping)
    terminated = isinstance(state.get("terminated"), Mapping)
    raw = row.get("containerID")
    if not isinstance(raw, str) or not raw:
        return "", "", False, terminated, ""
    scheme, sep, ident = raw.partition("://")
    runtime = RUNTIMES.get(scheme) if sep else None
    if runtime is None:
        return "", "", False, terminated, f"container id {raw!r} names no known runtime"
    try:
        ident = validate_container_id(ident, runtime)
    except CorepinError as exc:
        return "", "", False, terminated, exc.message
    return runtime, ident, running, terminated, ""


def plan_pod(pod: Mapping[str, Any], binding: Mapping[str, Any] | None = None) -> PodPlan:
    """The plan of one pod (see the module docstring). Never raises for a malformed pod: what
    cannot be read becomes `none` with the reason."""
    view = PodView(pod)
    problem = ""
    try:
        wanted = parse_pod_annotations(view.annotations, view.labels)
    except CorepinError as exc:
        problem = exc.message
        wanted = parse_pod_annotations({})
    explicit: dict[str, CPUSet] = {}
    binding_level = None
    if binding is not None:
        bspec = ObjectView(binding).spec
        try:
            binding_level = corepin_level(bspec.get("exclusivenessLevel", "cpu"))
        except CorepinError:
            binding_level = None
        explicit = binding_cpus(bspec)
    statuses = view.container_statuses
    plans: list[ContainerPlan] = []
    containers = view.containers
    for i, c in enumerate(containers):
        cname = c["name"]
        runtime, ident, running, terminated, id_problem = _live_state(statuses.get(cname))
        asked = wanted.policy_for(cname)
        policy, count, why = asked, 0, problem
        cpus = explicit.get(cname, explicit.get("") if len(containers) == 1 else None)
        sized, where = _sized(c, statuses.get(cname), i)
        refused = "" if cpus is None or problem else binding_refusal(sized, where, cname, cpus)
        if refused:
            cpus = None  # never applied: the container gets what its annotations ask
            why = refused = f"{refused}; its PodCPUBinding is ignored"
        if cpus is not None:
            asked = policy = "exclusive"
        if problem:
            policy = "none"
        elif policy != "none":
            try:
                eligible = container_eligibility(sized, where)
            except CorepinError as exc:
                eligible = None
                why = exc.message
            if eligible is None:
                policy = "none"
            elif cpus is not None:
                count = len(cpus)
            elif eligible.eligible:
                count = eligible.cpus
            else:
                policy, why = "none", f"container {cname!r}: {eligible.reason}"
        plans.append(
            ContainerPlan(
                name=cname,
                policy=policy,
                asked=asked,
                count=count,
                level=binding_level if cpus is not None and binding_level else wanted.level,
                workload=wanted.workload,
                device_alignment=wanted.device_alignment,
                problem=why if policy != asked or problem or refused else "",
                bad_id=id_problem,
                cpus=cpus,
                runtime=runtime,
                container_id=ident,
                running=running,
                terminated=terminated,
            )
        )
    inits: list[ContainerPlan] = []
    init_statuses = view.init_container_statuses
    for c in view.init_containers:
        runtime, ident, running, terminated, _ = _live_state(init_statuses.get(c["name"]))
        inits.append(
            ContainerPlan(
                name=c["name"],
                runtime=runtime,
                container_id=ident,
                running=running,
                terminated=terminated,
            )
        )
    return PodPlan(
        namespace=view.namespace or "default",
        name=view.name,
        uid=view.uid,
        qos=qos_class(pod),
        containers=tuple(plans),
        init_containers=tuple(inits),
        problem=problem,
        deleting=view.deleting,
    )


def _sized(
    c: Mapping[str, Any], row: Mapping[str, Any] | None, index: int
) -> tuple[Mapping[str, Any], str]:
    """The container as its CPUs are sized, and where that is read: an in-place resize counts
    once the kubelet reports it applied (the status's resources), else the spec."""
    applied = row.get("resources") if row is not None else None
    if isinstance(applied, Mapping):
        return {"resources": applied}, f"status.containerStatuses[{c.get('name')}]"
    return c, f"spec.containers[{index}]"


#: resources of a container's limits that are not devices
_NOT_DEVICES: Final = frozenset({"cpu", "memory", "ephemeral-storage", "storage", "pods"})


def device_requests(pod: Mapping[str, Any]) -> dict[str, int]:
    """The devices a pod's app containers ask for: extended resources in their limits (a name
    with a domain, such as `nvidia.com/gpu`, outside `kubernetes.io`; hugepages are memory),
    summed over the containers, by name. A count that is not a whole number is left out (the
    API server refuses such pods)."""
    out: dict[str, int] = {}
    for c in PodView(pod).containers:
        limits = loose_object(loose_object(c.get("resources")).get("limits"))
        for name, value in limits.items():
            if not isinstance(name, str) or name in _NOT_DEVICES or "/" not in name:
                continue
            domain = name.split("/", 1)[0]
            if domain == "kubernetes.io" or domain.endswith(".kubernetes.io"):
                continue
            text = str(value).strip()
            if isinstance(value, bool) or not text.isdigit() or int(text) <= 0:
                continue
            out[name] = out.get(name, 0) + int(text)
    return dict(sorted(out.items()))


def container_size(sized: Mapping[str, Any], where: str) -> tuple[int, str]:
    """(whole CPUs, "") of a container eligible for CPUs of its own (a whole CPU limit >= 1
    equal to the request), else (0, why not)."""
    try:
        eligible = container_eligibility(sized, where)
    except CorepinError as exc:
        return 0, exc.message
    return (eligible.cpus, "") if eligible.eligible else (0, eligible.reason)


def container_sizes(pod: Mapping[str, Any]) -> dict[str, tuple[int, str]]:
    """`container_size` of every app container of `pod`, by name."""
    view = PodView(pod)
    statuses = view.container_statuses
    out: dict[str, tuple[int, str]] = {}
    for i, c in enumerate(view.containers):
        out[c["name"]] = container_size(*_sized(c, statuses.get(c["name"]), i))
    return out


def size_refusal(name: str, size: tuple[int, str], cpus: CPUSet) -> str:
    """Why a PodCPUBinding may not give container `name` (of `size`, as `container_size`
    reads it) the explicit CPUs `cpus`, or "" when it may.

    A binding is held to the same eligibility as the annotations - a whole CPU limit >= 1
    equal to the CPU request - and must name exactly as many CPUs as that limit: the agent
    removes the CFS quota of an exclusive container, which is only the same as the limit when
    the container has that many CPUs of its own. Without this rule a binding would turn a
    `100m` container into an unthrottled one on every CPU it names."""
    count, why = size
    if why:
        return f"container {name!r}: {why}"
    if count != len(cpus):
        return (
            f"container {name!r}: the binding names {len(cpus)} CPU(s) ({cpus}) but its CPU "
            f"limit is {count}"
        )
    return ""


def binding_refusal(sized: Mapping[str, Any], where: str, name: str, cpus: CPUSet) -> str:
    """`size_refusal` of a container as `_sized` reads it."""
    return size_refusal(name, container_size(sized, where), cpus)


def binding_refusals(pod: Mapping[str, Any], spec: Mapping[str, Any]) -> dict[str, str]:
    """Container name -> why the binding `spec` may not give it its CPUs, for every app
    container of `pod` the binding gives CPUs to (a row of its own; the pod-wide set for a
    pod of one container) and may not. Empty when the binding fits the pod's limits."""
    explicit = binding_cpus(spec)
    sizes = container_sizes(pod)
    out: dict[str, str] = {}
    for name, size in sizes.items():
        cpus = explicit.get(name, explicit.get("") if len(sizes) == 1 else None)
        why = "" if cpus is None else size_refusal(name, size, cpus)
        if why:
            out[name] = why
    return out


def binding_cpus(spec: Mapping[str, Any]) -> dict[str, CPUSet]:
    """Explicit CPUs per container of a binding ("" for the pod-wide set)."""
    try:
        parsed = PodCPUBindingSpec.from_dict(spec)
    except CorepinError:
        return {}
    out: dict[str, CPUSet] = {}
    if parsed.cpus:
        out[""] = parsed.cpus  # the pod-wide set: applies to a pod of one container
    for c in parsed.containers:
        out[c.name] = c.cpus
    return out
