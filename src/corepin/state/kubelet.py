"""Import of the kubelet's `cpu_manager_state` checkpoint (migration from the static policy).

Formats (file `/var/lib/kubelet/cpu_manager_state`):
- v1 (kubelet <= 1.17): `{"policyName", "defaultCpuSet", "entries": {containerID: cpus},
  "checksum"}`;
- v2: `{"policyName", "defaultCpuSet", "entries": {podUID: {container: cpus}}, "checksum"}`;
- v3 (pod-level resource managers): v2 plus `"podEntries": {podUID: {"cpuSet": cpus}}`;
- v4: `{"data": "<v3 JSON as a string>", "checksum"}` (also `dataChecksum`).
Keys are matched case-insensitively, as Go's encoding/json does (`defaultCPUSet` loads too).

Checksums (uint32, FNV-1a 32 bit), reproduced exactly:
- v1/v2/v3: the kubelet hashes the output of a go-spew printer (`%#v`, SortKeys, DisableMethods,
  SpewKeys) of a pointer to the checkpoint struct with its Checksum field set to 0, with the
  struct's type name normalised to `CPUManagerCheckpoint` for v1. The printed form is

      (*state.CPUManagerCheckpoint){PolicyName:(string)static DefaultCPUSet:(string)1-3 \
Entries:(map[string]map[string]string)map[pod:map[c1:4-6 c2:7-9]] Checksum:(checksum.Checksum)0}

  (map keys sorted; map entries `key:value` separated by spaces; strings unquoted). The
  newest kubelet hashes its v3 struct for v2 files too: type `state.CPUManagerCheckpointV3`
  with a field `PodEntries:(state.PodCPUAssignments)map[...]` before Checksum, each pod entry
  printed as `{CPUSet:(cpuset.CPUSet){elems:(map[int]struct {})map[7:{} 8:{} 9:{}]}}`.
  A v1/v2/v3 checksum of 0 means "no checksum" and is accepted (old file backend).
- v4: FNV-1a 32 of `(string)` + the data string (the printer's form of a Go string).

Conversion to corepin: every container entry becomes an exclusive assignment with id
`pod/<podUID>/<container>` (v1: `container/<containerID>` unless a container map is given),
pod-level entries become `pod/<podUID>`, and the default CPU set becomes the shared pool: the
online CPUs in neither the default set nor an entry become reserved CPUs with the option
`strict-cpu-reservation` (what the kubelet does with that option). `convert` does this for the
live topology, for `corepin migrate` and the node agent's `--kubelet-compat` alike: a checkpoint
of the `none` policy holds no pinning and converts to an empty state, one of another policy than
`static` is refused.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from corepin.core.cpuset import CPUSet
from corepin.core.errors import CorepinError, InputError, StateFormatError
from corepin.state.model import STRICT_RESERVATION, Assignment, HostState, fingerprint
from corepin.state.owners import ContainerOwner

if TYPE_CHECKING:
    from corepin.topology.model import Topology

FNV32_OFFSET: Final = 0x811C9DC5
FNV32_PRIME: Final = 0x01000193
#: the policy recorded on assignments imported from the kubelet's checkpoint
KUBELET_POLICY: Final = "kubelet-static"
#: policies whose checkpoints can be converted
STATIC_POLICY: Final = "static"
NONE_POLICY: Final = "none"


def fnv32a(data: bytes) -> int:
    """FNV-1a, 32 bit (Go's hash/fnv New32a)."""
    h = FNV32_OFFSET
    for byte in data:
        h = ((h ^ byte) * FNV32_PRIME) & 0xFFFFFFFF
    return h


def _spew_str_map(m: Mapping[str, str]) -> str:
    return "map[" + " ".join(f"{k}:{m[k]}" for k in sorted(m)) + "]"


def _spew_entries(entries: Mapping[str, Mapping[str, str]]) -> str:
    return "map[" + " ".join(f"{k}:{_spew_str_map(entries[k])}" for k in sorted(entries)) + "]"


def _spew_cpuset(cpus: CPUSet) -> str:
    return (
        "(cpuset.CPUSet){elems:(map[int]struct {})map[" + " ".join(f"{c}:{{}}" for c in cpus) + "]}"
    )


def _spew_pod_entries(pod_entries: Mapping[str, CPUSet]) -> str:
    return (
        "map["
        + " ".join(f"{k}:{{CPUSet:{_spew_cpuset(pod_entries[k])}}}" for k in sorted(pod_entries))
        + "]"
    )


def spew_v1(policy: str, default: str, entries: Mapping[str, str]) -> str:
    """The printed v1 struct the kubelet hashes (type name already normalised)."""
    return (
        f"(*state.CPUManagerCheckpoint){{PolicyName:(string){policy} "
        f"DefaultCPUSet:(string){default} "
        f"Entries:(map[string]string){_spew_str_map(entries)} Checksum:(checksum.Checksum)0}}"
    )


def spew_v2(policy: str, default: str, entries: Mapping[str, Mapping[str, str]]) -> str:
    return (
        f"(*state.CPUManagerCheckpoint){{PolicyName:(string){policy} "
        f"DefaultCPUSet:(string){default} "
        f"Entries:(map[string]map[string]string){_spew_entries(entries)} "
        "Checksum:(checksum.Checksum)0}"
    )


def spew_v3(
    policy: str,
    default: str,
    entries: Mapping[str, Mapping[str, str]],
    pod_entries: Mapping[str, CPUSet],
) -> str:
    return (
        f"(*state.CPUManagerCheckpointV3){{PolicyName:(string){policy} "
        f"DefaultCPUSet:(string){default} "
        f"Entries:(map[string]map[string]string){_spew_entries(entries)} "
        f"PodEntries:(state.PodCPUAssignments){_spew_pod_entries(pod_entries)} "
        "Checksum:(checksum.Checksum)0}"
    )


def checksum_v1(policy: str, default: str, entries: Mapping[str, str]) -> int:
    return fnv32a(spew_v1(policy, default, entries).encode("utf-8"))


def checksum_v2(policy: str, default: str, entries: Mapping[str, Mapping[str, str]]) -> int:
    return fnv32a(spew_v2(policy, default, entries).encode("utf-8"))


def checksum_v3(
    policy: str,
    default: str,
    entries: Mapping[str, Mapping[str, str]],
    pod_entries: Mapping[str, CPUSet],
) -> int:
    return fnv32a(spew_v3(policy, default, entries, pod_entries).encode("utf-8"))


def checksum_v4(data: str) -> int:
    return fnv32a(("(string)" + data).encode("utf-8"))


@dataclass(frozen=True, slots=True)
class KubeletCheckpoint:
    """A parsed and verified cpu_manager_state."""

    source: str
    format: str  # "v1" | "v2" | "v3" | "v4"
    policy_name: str
    default_cpuset: CPUSet
    entries: Mapping[str, Mapping[str, CPUSet]] = field(default_factory=dict)  # pod->ctr->cpus
    container_entries: Mapping[str, CPUSet] = field(default_factory=dict)  # v1: containerID
    pod_entries: Mapping[str, CPUSet] = field(default_factory=dict)  # v3/v4 pod-level
    checksum: int = 0
    verified: bool = False  # False only when the checksum was 0 ("none")


def _lower_keys(obj: Mapping[str, Any]) -> dict[str, Any]:
    """Go encoding/json: an exact key match wins, else a case-insensitive one."""
    out: dict[str, Any] = {}
    for key, value in obj.items():
        out.setdefault(key.lower(), value)
    for key, value in obj.items():
        if key in ("policyName", "defaultCpuSet", "entries", "podEntries", "checksum", "data"):
            out[key.lower()] = value
    return out


class _Parser:
    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, problem: str, reason: str = "bad_kubelet_state") -> StateFormatError:
        return StateFormatError(f"{self.source}: {problem}", reason=reason)

    def cpus(self, text: str, what: str) -> CPUSet:
        try:
            return CPUSet.parse(text)
        except ValueError as exc:
            raise self.fail(f"could not parse {what}: {exc}") from None

    def text(self, value: object, what: str) -> str:
        if value is None:
            return ""
        if not isinstance(value, str):
            raise self.fail(f"{what} must be a string, got {value!r}")
        return value

    def checksum(self, value: object) -> int:
        if value is None:
            return 0
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**64:
            raise self.fail(f"checksum must be an unsigned integer, got {value!r}")
        return value


def parse_kubelet_state(
    data: bytes | str, source: str = "cpu_manager_state", *, expected_policy: str | None = None
) -> KubeletCheckpoint:
    """Parse and verify a kubelet cpu_manager_state. StateFormatError names `source` and says
    what is wrong (bad JSON, checksum mismatch = "checkpoint is corrupted", unparsable CPU
    list, policy differing from `expected_policy`)."""
    p = _Parser(source)
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
        doc = json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise p.fail(f"not valid JSON: {exc}", "bad_json") from None
    if not isinstance(doc, dict):
        raise p.fail("expected a JSON object")
    top = _lower_keys(doc)
    if "data" in top:
        return _parse_v4(p, top, expected_policy)
    policy = p.text(top.get("policyname"), "policyName")
    default_text = p.text(top.get("defaultcpuset"), "defaultCpuSet")
    raw_entries = top.get("entries")
    if raw_entries is None:
        raw_entries = {}
    if not isinstance(raw_entries, dict):
        raise p.fail(f"entries must be an object, got {raw_entries!r}")
    checksum = p.checksum(top.get("checksum"))
    values = list(raw_entries.values())
    is_v1 = bool(values) and all(isinstance(v, str) for v in values)
    has_pods = "podentries" in top and top["podentries"] is not None
    pod_texts = _pod_entry_texts(p, top.get("podentries") or {})

    candidates: list[tuple[str, int]] = []
    if is_v1:
        v1_entries = {k: v for k, v in raw_entries.items()}
        fmt = "v1"
        candidates.append(("v1", checksum_v1(policy, default_text, v1_entries)))
    else:
        v2_entries: dict[str, dict[str, str]] = {}
        for pod, containers in raw_entries.items():
            if not isinstance(containers, dict) or not all(
                isinstance(v, str) for v in containers.values()
            ):
                raise p.fail(f"entries[{pod!r}] must map container names to CPU lists")
            v2_entries[pod] = dict(containers)
        fmt = "v3" if has_pods else "v2"
        pods_for_hash = {k: _quiet_parse(v) for k, v in pod_texts.items()}
        if not has_pods:
            candidates.append(("v2", checksum_v2(policy, default_text, v2_entries)))
        if all(v is not None for v in pods_for_hash.values()):
            clean = {k: v for k, v in pods_for_hash.items() if v is not None}
            candidates.append(("v3", checksum_v3(policy, default_text, v2_entries, clean)))
        if not values:  # empty entries: a v1 file cannot be told apart
            candidates.append(("v1", checksum_v1(policy, default_text, {})))
    matched = [name for name, value in candidates if value == checksum]
    if checksum != 0 and not matched:
        raise p.fail(
            f"checkpoint is corrupted: checksum {checksum} does not match the content "
            f"(computed {candidates[0][1]})",
            "checksum_mismatch",
        )
    if matched == ["v1"]:
        fmt = "v1"
    _check_policy(p, policy, expected_policy)
    default = p.cpus(default_text, f'default cpu set "{default_text}"')
    if fmt == "v1":
        container_entries = {
            cid: p.cpus(v, f'cpuset "{v}" for container ID "{cid}"')
            for cid, v in raw_entries.items()
        }
        return KubeletCheckpoint(
            source, fmt, policy, default, {}, container_entries, {}, checksum, checksum != 0
        )
    entries = {
        pod: {
            name: p.cpus(v, f'cpuset "{v}" for container "{name}" in pod "{pod}"')
            for name, v in containers.items()
        }
        for pod, containers in raw_entries.items()
    }
    pods = {pod: p.cpus(v, f'cpuset "{v}" for pod "{pod}"') for pod, v in pod_texts.items()}
    return KubeletCheckpoint(
        source, fmt, policy, default, entries, {}, pods, checksum, checksum != 0
    )


def _quiet_parse(text: str) -> CPUSet | None:
    try:
        return CPUSet.parse(text)
    except ValueError:
        return None


def _pod_entry_texts(p: _Parser, raw: object) -> dict[str, str]:
    if not isinstance(raw, dict):
        raise p.fail(f"podEntries must be an object, got {raw!r}")
    out = {}
    for pod, entry in raw.items():
        if not isinstance(entry, dict):
            raise p.fail(f"podEntries[{pod!r}] must be an object with a cpuSet")
        low = {k.lower(): v for k, v in entry.items()}
        out[pod] = p.text(low.get("cpuset"), f"podEntries[{pod!r}].cpuSet")
    return out


def _check_policy(p: _Parser, policy: str, expected: str | None) -> None:
    if expected is not None and policy != expected:
        raise p.fail(
            f'configured policy "{expected}" differs from state checkpoint policy "{policy}"',
            "policy_mismatch",
        )


def _parse_v4(p: _Parser, top: Mapping[str, Any], expected_policy: str | None) -> KubeletCheckpoint:
    data = top["data"]
    if not isinstance(data, str):
        raise p.fail(f"data must be a string holding JSON, got {data!r}")
    raw_sum = top.get("checksum", top.get("datachecksum"))
    if raw_sum is None:
        raise p.fail("checkpoint is corrupted: the data section has no checksum", "no_checksum")
    checksum = p.checksum(raw_sum)
    computed = checksum_v4(data)
    if checksum != computed:
        raise p.fail(
            f"checkpoint is corrupted: checksum {checksum} does not match the data "
            f"(computed {computed})",
            "checksum_mismatch",
        )
    try:
        inner = json.loads(data)
    except json.JSONDecodeError as exc:
        raise p.fail(f"data section is not valid JSON: {exc}", "bad_json") from None
    if not isinstance(inner, dict):
        raise p.fail("data section must be a JSON object")
    low = _lower_keys(inner)
    policy = p.text(low.get("policyname"), "policyName")
    _check_policy(p, policy, expected_policy)
    default_text = p.text(low.get("defaultcpuset"), "defaultCPUSet")
    default = p.cpus(default_text, f'default cpu set "{default_text}"')
    raw_entries = low.get("entries")
    if raw_entries is None:
        raw_entries = {}
    if not isinstance(raw_entries, dict):
        raise p.fail("entries must be an object")
    entries: dict[str, dict[str, CPUSet]] = {}
    for pod, containers in raw_entries.items():
        if not isinstance(containers, dict):
            raise p.fail(f"entries[{pod!r}] must map container names to CPU lists")
        entries[pod] = {
            name: p.cpus(
                p.text(v, f"entries[{pod!r}][{name!r}]"),
                f'cpuset "{v}" for container "{name}" in pod "{pod}"',
            )
            for name, v in containers.items()
        }
    pods = {
        pod: p.cpus(v, f'cpuset "{v}" for pod "{pod}"')
        for pod, v in _pod_entry_texts(p, low.get("podentries") or {}).items()
    }
    return KubeletCheckpoint(p.source, "v4", policy, default, entries, {}, pods, checksum, True)


def read_kubelet_state(path: str, *, expected_policy: str | None = None) -> KubeletCheckpoint:
    """Read and parse the kubelet checkpoint at `path`."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise StateFormatError(
            f"{path}: cannot read: {exc.strerror}", reason="unreadable"
        ) from None
    return parse_kubelet_state(data, path, expected_policy=expected_policy)


def read_for_import(path: str) -> KubeletCheckpoint:
    """The verified kubelet checkpoint at `path` (StateFormatError, exit 2, when it is not),
    a checksum mismatch told as what it means for an import."""
    try:
        return read_kubelet_state(path)
    except StateFormatError as exc:
        if exc.reason == "checksum_mismatch":
            raise StateFormatError(
                f"{exc.message}; the file changed after the kubelet wrote it and the kubelet "
                "itself would refuse it. corepin imports only verified checkpoints: restore the "
                "file from a backup, or drain the node and start corepin with an empty state",
                reason=exc.reason,
            ) from None
        raise


def _owner_of(ident: str) -> ContainerOwner:
    """The container owner of an imported entry: `pod/<uid>/<name>` (a container),
    `pod/<uid>` (pod-level CPUs) or `container/<id>` (a v1 entry of unknown pod)."""
    kind, _, rest = ident.partition("/")
    if kind == "container":
        return ContainerOwner(container_id=rest)
    pod_uid, _, name = rest.partition("/")
    return ContainerOwner(pod_uid=pod_uid, container=name)


def kubelet_to_host_state(
    checkpoint: KubeletCheckpoint,
    *,
    online: CPUSet | None = None,
    topology_fingerprint: str = "",
    container_map: Mapping[str, tuple[str, str]] | None = None,
    created: float = 0.0,
    mems_of: Callable[[CPUSet], CPUSet] | None = None,
) -> tuple[HostState, list[str]]:
    """Convert a kubelet checkpoint into a HostState; returns it with notes on what was done.

    `online` defaults to the default set plus every entry. `container_map` (containerID ->
    (podUID, container name)) turns v1 entries into pod/container ids as the kubelet's own
    migration does. `mems_of`, when given (e.g. `topology.mems_of`), fills in NUMA mems.
    Containers of one pod whose CPUs lie entirely inside another container of the same pod
    (the kubelet reuses init-container CPUs) are folded into it. Any other overlap, or an
    entry inside the default set, raises StateFormatError: the checkpoint is inconsistent.
    """
    src = checkpoint.source
    notes: list[str] = []
    raw: list[tuple[str, CPUSet]] = []
    pods: dict[str, list[tuple[str, CPUSet]]] = {}
    for pod, containers in checkpoint.entries.items():
        for name, cpus in containers.items():
            pods.setdefault(pod, []).append((name, cpus))
    for cid, cpus in checkpoint.container_entries.items():
        if container_map and cid in container_map:
            pod, name = container_map[cid]
            pods.setdefault(pod, []).append((name, cpus))
        else:
            raw.append((f"container/{cid}", cpus))
    for pod, members in sorted(pods.items()):
        for name, cpus in sorted(members):
            if not cpus:
                notes.append(f"event=skipped id=pod/{pod}/{name} cause=no_cpus")
                continue
            # an init container's CPUs reused by an app container: keep the larger set (or, for
            # equal sets, the first name) and fold the other into it
            folded = [
                other
                for other, ocpus in members
                if other != name and (cpus < ocpus or (cpus == ocpus and other < name))
            ]
            if folded:
                notes.append(f"event=folded id=pod/{pod}/{name} into=pod/{pod}/{folded[0]}")
                continue
            raw.append((f"pod/{pod}/{name}", cpus))
    for pod, cpus in sorted(checkpoint.pod_entries.items()):
        inside = [i for i, c in raw if i.startswith(f"pod/{pod}/") and c.issubset(cpus)]
        # pod-level CPUs contain the container CPUs of the same pod: record only the extra
        extra = cpus
        for i in inside:
            extra = extra - dict(raw)[i]
        if extra:
            raw.append((f"pod/{pod}", extra))
    seen: dict[int, str] = {}
    for ident, cpus in raw:
        for cpu in cpus:
            if cpu in seen:
                raise StateFormatError(
                    f"{src}: CPU {cpu} is assigned to both {seen[cpu]!r} and {ident!r}; the "
                    "checkpoint is inconsistent and cannot be imported",
                    reason="kubelet_overlap",
                )
            seen[cpu] = ident
        inside_default = cpus & checkpoint.default_cpuset
        if inside_default:
            raise StateFormatError(
                f"{src}: CPUs {inside_default} of {ident!r} are also in the default CPU set "
                f"{checkpoint.default_cpuset}; the checkpoint is inconsistent and cannot be "
                "imported",
                reason="kubelet_overlap",
            )
    assigned = CPUSet.from_bits(sum(1 << c for c in seen))
    machine = online if online is not None else checkpoint.default_cpuset | assigned
    outside = assigned - machine
    if outside:
        raise StateFormatError(
            f"{src}: CPUs {outside} are assigned but not online on this machine ({machine})",
            reason="kubelet_cpus_offline",
        )
    reserved = machine - checkpoint.default_cpuset - assigned
    options: dict[str, str] = {}
    if reserved:
        options[STRICT_RESERVATION] = "true"
        notes.append(f"event=reserved cpus={reserved} cause=not_in_default_set")
    items: dict[str, Assignment] = {}
    for ident, cpus in raw:
        try:
            items[ident] = Assignment(
                id=ident,
                kind="exclusive",
                cpus=cpus,
                mems=mems_of(cpus) if mems_of is not None else CPUSet(),
                owner=_owner_of(ident),
                created=created,
                policy=KUBELET_POLICY,
            )
        except CorepinError as exc:
            raise StateFormatError(f"{src}: {exc.message}", reason="bad_kubelet_state") from None
        notes.append(f"event=imported id={ident} cpus={cpus}")
    state = HostState(
        topology=topology_fingerprint,
        online=machine,
        reserved=reserved,
        options=options,
        assignments=items,
    )
    return state, notes


def convert(
    checkpoint: KubeletCheckpoint, topology: Topology, *, created: float = 0.0
) -> tuple[HostState, list[str]]:
    """The corepin state for `checkpoint` on `topology` (not yet validated), with notes."""
    policy = checkpoint.policy_name
    if policy == NONE_POLICY:
        notes = ["event=nothing_to_import cause=policy_none (the none policy pins nothing)"]
        held = len(checkpoint.entries) + len(checkpoint.container_entries)
        if held or checkpoint.pod_entries:
            notes.append(f"event=ignored entries={held} cause=policy_none")
        return HostState.new(topology), notes
    if policy != STATIC_POLICY:
        raise InputError(
            f"{checkpoint.source}: the checkpoint was written by CPU manager policy {policy!r}; "
            f"corepin imports checkpoints of the {STATIC_POLICY!r} policy (and {NONE_POLICY!r}, "
            "which holds nothing)",
            reason="unknown_kubelet_policy",
        )
    online = topology.online_cpus
    state, notes = kubelet_to_host_state(
        checkpoint,
        online=online,
        topology_fingerprint=fingerprint(topology),
        created=created,
        mems_of=topology.mems_of,
    )
    absent = checkpoint.default_cpuset - online
    if absent:
        notes.append(f"event=default_cpus_dropped cpus={absent} cause=not_online")
    if not checkpoint.verified:
        notes.insert(0, "event=unverified cause=checksum_0 (the file carries no checksum)")
    return state, notes
