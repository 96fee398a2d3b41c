"""What a pod asks of corepin, read from the pod object (pure: dicts in, records out).

The node agent pins by it, and the placement core (`corepin.placement`: the scheduler and the
extender) decides fit by the same plan, so both read a pod the same way.

`plan_pod(pod, binding=None)` turns a pod (and the user's PodCPUBinding for it, if any) into a
`PodPlan`: per app container the effective policy (`none`, `share`, `exclusive`), CPU count,
exclusiveness level, workload family, the reason when a request was ignored, and the container's
live state from `status.containerStatuses` (runtime and id without the scheme, running or
terminated).

Rules (CONTRACTS.md 7.3):
- policy from `corepin.io/cpu-policy[.<container>]` and the Crane/actimanager aliases
  (`corepin.kube.models.parse_pod_annotations`); malformed annotations make every container
  `none` with the parse error as the reason (the webhook refuses such pods up front);
- `share` and `exclusive` need a whole CPU limit >= 1 equal to the request; otherwise `none`
  with the reason (the agent emits `CPUPolicyIgnored`);
- a PodCPUBinding naming explicit CPUs for a container makes it `exclusive` on exactly those
  CPUs (its level from the binding);
- init containers always run in the shared pool (they finish before the app containers);
- a container id must be a runtime id of hex digits; anything else (path characters, ...) is
  treated as not running, with the reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from corepin.core.cpuset import CPUSet
from corepin.core.errors import CorepinError
from corepin.core.record import record

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


def _meta(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = pod.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _strings(value: object) -> dict[str, str]:
    if not isinstance(value, Mapping):
        return {}
    return {str(k): v for k, v in value.items() if isinstance(v, str)}


def qos_class(pod: Mapping[str, Any]) -> str:
    """The pod's QoS class as the kubelet's cgroup layout names it: `status.qosClass` when the
    API server set it, else computed from requests and limits as Kubernetes does."""
    status = pod.get("status")
    if isinstance(status, Mapping):
        given = status.get("qosClass")
        if isinstance(given, str) and given in QOS:
            return QOS[given]
    spec = pod.get("spec")
    containers: list[Any] = []
    if isinstance(spec, Mapping):
        for key in ("initContainers", "containers"):
            value = spec.get(key)
            if isinstance(value, list):
                containers.extend(value)
    any_set = False
    guaranteed = bool(containers)
    for c in containers:
        resources = c.get("resources") if isinstance(c, Mapping) else None
        resources = resources if isinstance(resources, Mapping) else {}
        limits = resources.get("limits") if isinstance(resources.get("limits"), Mapping) else {}
        requests = (
            resources.get("requests") if isinstance(resources.get("requests"), Mapping) else {}
        )
        assert isinstance(limits, Mapping) and isinstance(requests, Mapping)
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


def _statuses(pod: Mapping[str, Any], key: str) -> dict[str, Mapping[str, Any]]:
    status = pod.get("status")
    rows = status.get(key) if isinstance(status, Mapping) else None
    out: dict[str, Mapping[str, Any]] = {}
    if isinstance(rows, list):
        for row in rows:
            if isinstance(row, Mapping) and isinstance(row.get("name"), str):
                out[row["name"]] = row
    return out


def _live_state(row: Mapping[str, Any] | None) -> tuple[str, str, bool, bool, str]:
    """(runtime, container id, running, terminated, problem) of one container status."""
    if row is None:
        return "", "", False, False, ""
    state = row.get("state")
    state = state if isinstance(state, Mapping) else {}
    running = isinstance(state.get("running"), Mapping)
    terminated = isinstance(state.get("terminated"), Mapping)
    raw = row.get("containerID")
    if not isinstance(raw, str) or not raw:
        return "", "", False, terminated, ""
    scheme, sep, ident = raw.partition("://")
    runtime = RUNTIMES.get(scheme) if sep else None
    if runtime is None:
        return "", "", False, terminated, f"container id {raw!r} names no known runtime"
    from corepin.core.ids import validate_container_id

    try:
        ident = validate_container_id(ident, runtime)
    except CorepinError as exc:
        return "", "", False, terminated, exc.message
    return runtime, ident, running, terminated, ""


def plan_pod(pod: Mapping[str, Any], binding: Mapping[str, Any] | None = None) -> PodPlan:
    """The plan of one pod (see the module docstring). Never raises for a malformed pod: what
    cannot be read becomes `none` with the reason."""
    from corepin.kube.models import container_eligibility, corepin_level, parse_pod_annotations

    meta = _meta(pod)
    namespace = str(meta.get("namespace") or "default")
    name = str(meta.get("name") or "")
    uid = str(meta.get("uid") or "")
    spec = pod.get("spec") if isinstance(pod.get("spec"), Mapping) else {}
    assert isinstance(spec, Mapping)
    deleting = bool(meta.get("deletionTimestamp"))
    problem = ""
    try:
        wanted = parse_pod_annotations(
            _strings(meta.get("annotations")), _strings(meta.get("labels"))
        )
    except CorepinError as exc:
        problem = exc.message
        wanted = parse_pod_annotations({})
    explicit: dict[str, CPUSet] = {}
    binding_level = None
    if binding is not None:
        bspec = binding.get("spec") if isinstance(binding.get("spec"), Mapping) else {}
        assert isinstance(bspec, Mapping)
        try:
            binding_level = corepin_level(bspec.get("exclusivenessLevel", "cpu"))
        except CorepinError:
            binding_level = None
        explicit = binding_cpus(bspec)
    statuses = _statuses(pod, "containerStatuses")
    plans: list[ContainerPlan] = []
    containers = spec.get("containers") if isinstance(spec.get("containers"), list) else []
    assert isinstance(containers, list)
    for i, c in enumerate(containers):
        if not isinstance(c, Mapping) or not isinstance(c.get("name"), str):
            continue
        cname = c["name"]
        runtime, ident, running, terminated, id_problem = _live_state(statuses.get(cname))
        asked = wanted.policy_for(cname)
        policy, count, why = asked, 0, problem
        cpus = explicit.get(cname, explicit.get("") if len(containers) == 1 else None)
        if cpus is not None:
            asked = policy = "exclusive"
        row = statuses.get(cname)
        applied = row.get("resources") if row is not None else None
        # an in-place resize counts once the kubelet reports it applied (status resources)
        sized: Mapping[str, Any] = {"resources": applied} if isinstance(applied, Mapping) else c
        where = f"status.containerStatuses[{cname}]" if sized is not c else f"spec.containers[{i}]"
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
                problem=why if policy != asked or problem else "",
                bad_id=id_problem,
                cpus=cpus,
                runtime=runtime,
                container_id=ident,
                running=running,
                terminated=terminated,
            )
        )
    inits: list[ContainerPlan] = []
    init_statuses = _statuses(pod, "initContainerStatuses")
    init_specs = spec.get("initContainers") if isinstance(spec.get("initContainers"), list) else []
    assert isinstance(init_specs, list)
    for c in init_specs:
        if isinstance(c, Mapping) and isinstance(c.get("name"), str):
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
        namespace=namespace,
        name=name,
        uid=uid,
        qos=qos_class(pod),
        containers=tuple(plans),
        init_containers=tuple(inits),
        problem=problem,
        deleting=deleting,
    )


def binding_cpus(spec: Mapping[str, Any]) -> dict[str, CPUSet]:
    """Explicit CPUs per container of a binding ("" for the pod-wide set)."""
    from corepin.kube.models import PodCPUBindingSpec

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
