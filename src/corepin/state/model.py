"""The in-memory host state: who holds which CPUs, as immutable values.

`Assignment` is what the state records for one workload (a `corepin run` process tree or a
container). `HostState` holds every assignment plus the machine facts the pools are derived
from (online CPUs, reserved CPUs, options). Both are frozen; every "change" is a pure method
that returns a new value, so a transaction can compute the next state, validate it and only
then persist it.

Pools (derived, never stored):
- exclusive CPUs in use: the union of the `reserved` sets of exclusive and mixed assignments
  (the chosen CPUs plus the rest of the units their exclusiveness level withholds);
- shared pool: online - exclusive in use - reserved CPUs when the reservation is strict
  (option `strict-cpu-reservation`), else online - exclusive in use (the kubelet's default
  set keeps the reserved CPUs for best-effort work);
- free: what a new exclusive request may take: online - exclusive in use - reserved CPUs.

Kinds: `exclusive` (own CPUs only), `shared` (the shared pool only, `cpus` empty) and `mixed`
(own CPUs plus the shared pool in one affinity mask: `corepin run --exclusive N --with-shared`).

A process is identified by `pid` plus `start_time` (field 22 of /proc/PID/stat, clock ticks
since boot) so that a recycled PID never keeps a dead allocation alive.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final

from corepin.core.cpuset import CPUSet
from corepin.core.errors import AllocationError, RequestError

if TYPE_CHECKING:
    from corepin.topology.model import Topology

KINDS: Final = ("exclusive", "shared", "mixed")
#: Option that keeps the reserved CPUs out of the shared pool too (kubelet option name).
STRICT_RESERVATION: Final = "strict-cpu-reservation"

_EMPTY: Final = CPUSet()
_NO_OPTIONS: Final[Mapping[str, str]] = MappingProxyType({})
_NO_ASSIGNMENTS: Final[Mapping[str, Assignment]] = MappingProxyType({})


def _is_true(value: str | None) -> bool:
    return value is not None and value.strip().lower() in ("", "1", "true", "yes", "on")


@dataclass(frozen=True, slots=True)
class Assignment:
    """What the state records for one workload. Plain fields; validated on construction.

    - `cpus`: the CPUs it holds exclusively (empty for kind `shared`);
    - `reserved`: `cpus` plus the rest of the units withheld by the exclusiveness `level`
      (defaults to `cpus`);
    - `mems`: NUMA node ids for cpuset.mems (empty = not recorded; `validate` fills it in);
    - `pid` + `start_time`: process identity for host mode; `cgroup`: container cgroup path;
    - `created`: wall-clock seconds when recorded; `policy`: the policy that decided;
    - `meta`: free-form string annotations (source of an import, command line, ...).
    """

    id: str
    kind: str = "exclusive"
    cpus: CPUSet = _EMPTY
    reserved: CPUSet = _EMPTY
    mems: CPUSet = _EMPTY
    level: str = "cpu"
    pid: int | None = None
    start_time: int | None = None
    cgroup: str | None = None
    created: float = 0.0
    policy: str = ""
    meta: Mapping[str, str] = field(default_factory=lambda: _NO_OPTIONS)

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id or len(self.id) > 512:
            raise RequestError(f"assignment id must be a non-empty string, got {self.id!r}")
        if any(ord(ch) < 32 for ch in self.id):
            raise RequestError(f"assignment id {self.id!r} contains control characters")
        if self.kind not in KINDS:
            raise RequestError(
                f"assignment {self.id!r}: kind must be one of {', '.join(KINDS)}, got {self.kind!r}"
            )
        for name in ("cpus", "reserved", "mems"):
            if not isinstance(getattr(self, name), CPUSet):
                raise RequestError(f"assignment {self.id!r}: {name} must be a CPUSet")
        if self.kind == "shared":
            if self.cpus or self.reserved:
                raise RequestError(
                    f"assignment {self.id!r} is shared but holds exclusive CPUs {self.cpus}"
                )
        else:
            if not self.cpus:
                raise RequestError(f"assignment {self.id!r} is {self.kind} but holds no CPUs")
            if not self.reserved:
                object.__setattr__(self, "reserved", self.cpus)
            elif not self.cpus.issubset(self.reserved):
                raise RequestError(
                    f"assignment {self.id!r}: reserved {self.reserved} must contain cpus "
                    f"{self.cpus}"
                )
        for name in ("pid", "start_time"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 0
            ):
                raise RequestError(
                    f"assignment {self.id!r}: {name} must be a non-negative integer, got {value!r}"
                )
        if self.pid is not None and self.pid == 0:
            raise RequestError(f"assignment {self.id!r}: pid 0 is not a process")
        if self.cgroup is not None and not isinstance(self.cgroup, str):
            raise RequestError(f"assignment {self.id!r}: cgroup must be a string or None")
        if not isinstance(self.meta, MappingProxyType):
            object.__setattr__(self, "meta", MappingProxyType(dict(self.meta)))

    @property
    def exclusive(self) -> bool:
        """True when it holds CPUs of its own (kinds exclusive and mixed)."""
        return self.kind != "shared"

    @property
    def with_shared(self) -> bool:
        """True when its affinity includes the shared pool (kinds shared and mixed)."""
        return self.kind != "exclusive"

    def affinity(self, shared_pool: CPUSet) -> CPUSet:
        """The whole CPU mask its processes run on, given the current shared pool."""
        if self.kind == "exclusive":
            return self.cpus
        if self.kind == "shared":
            return shared_pool
        return self.cpus | shared_pool

    def evolve(self, **changes: Any) -> Assignment:
        """A copy with some fields changed (validated again). When `cpus` changes and the
        reserved set was just the CPUs themselves (level cpu), the reserved set follows."""
        if "cpus" in changes and "reserved" not in changes and self.reserved == self.cpus:
            changes["reserved"] = _EMPTY
        return replace(self, **changes)


@dataclass(frozen=True, slots=True)
class HostState:
    """Everything corepin persists about one host. Immutable; methods return new states.

    - `revision`: bumped by every committed transaction (a write counter, not a format version);
    - `topology`: fingerprint of the topology the state was built against (`fingerprint()`);
    - `online`: the online CPUs at that time (pools are derived from it);
    - `reserved`: CPUs never handed out exclusively (system/kube reserved);
    - `options`: policy options (for example `strict-cpu-reservation`);
    - `assignments`: id -> Assignment, a read-only mapping.
    """

    revision: int = 0
    topology: str = ""
    online: CPUSet = _EMPTY
    reserved: CPUSet = _EMPTY
    options: Mapping[str, str] = field(default_factory=lambda: _NO_OPTIONS)
    assignments: Mapping[str, Assignment] = field(default_factory=lambda: _NO_ASSIGNMENTS)

    def __post_init__(self) -> None:
        if isinstance(self.revision, bool) or not isinstance(self.revision, int):
            raise RequestError(f"state revision must be an integer, got {self.revision!r}")
        if not isinstance(self.options, MappingProxyType):
            object.__setattr__(self, "options", MappingProxyType(dict(self.options)))
        if not isinstance(self.assignments, MappingProxyType):
            items = dict(self.assignments)
            for key, value in items.items():
                if not isinstance(value, Assignment) or value.id != key:
                    raise RequestError(f"state assignment key {key!r} does not match its id")
            object.__setattr__(self, "assignments", MappingProxyType(dict(sorted(items.items()))))

    # ------------------------------------------------------------------ construction
    @classmethod
    def new(
        cls,
        topology: Topology,
        *,
        reserved: CPUSet = _EMPTY,
        options: Mapping[str, str] | None = None,
    ) -> HostState:
        """An empty state for this machine."""
        return cls(
            topology=fingerprint(topology),
            online=topology.online_cpus,
            reserved=reserved,
            options=options or {},
        )

    # ------------------------------------------------------------------ derived views
    @property
    def strict_reservation(self) -> bool:
        return _is_true(self.options.get(STRICT_RESERVATION))

    def __iter__(self) -> Iterator[Assignment]:
        return iter(self.assignments.values())

    def __contains__(self, assignment_id: object) -> bool:
        return assignment_id in self.assignments

    def get(self, assignment_id: str) -> Assignment | None:
        return self.assignments.get(assignment_id)

    @property
    def exclusive_cpus(self) -> CPUSet:
        """CPUs held exclusively (including those withheld by exclusiveness levels)."""
        mask = 0
        for a in self.assignments.values():
            mask |= a.reserved.bits
        return CPUSet.from_bits(mask)

    @property
    def shared_pool(self) -> CPUSet:
        """Online CPUs not held exclusively (minus reserved ones when strict)."""
        pool = self.online - self.exclusive_cpus
        if self.strict_reservation:
            pool = pool - self.reserved
        return pool

    @property
    def free(self) -> CPUSet:
        """CPUs a new exclusive request may take."""
        return self.online - self.exclusive_cpus - self.reserved

    def shared_assignments(self) -> list[Assignment]:
        """Assignments whose affinity follows the shared pool (kinds shared and mixed)."""
        return [a for a in self.assignments.values() if a.with_shared]

    def owner_of(self, cpu: int) -> str | None:
        """The id of the assignment holding `cpu` exclusively, if any."""
        for a in self.assignments.values():
            if cpu in a.reserved:
                return a.id
        return None

    def overlaps(self) -> list[tuple[str, str, CPUSet]]:
        """Pairs of assignments whose exclusive sets overlap (should always be empty)."""
        out: list[tuple[str, str, CPUSet]] = []
        items = [a for a in self.assignments.values() if a.exclusive]
        for i, a in enumerate(items):
            for b in items[i + 1 :]:
                common = a.reserved & b.reserved
                if common:
                    out.append((a.id, b.id, common))
        return out

    # ------------------------------------------------------------------ pure updates
    def add(self, assignment: Assignment) -> HostState:
        """A state with `assignment` added.

        RequestError when the id is taken; AllocationError (reason `cpus_taken`) when its CPUs
        overlap another exclusive assignment, are reserved, or are not online.
        """
        if assignment.id in self.assignments:
            raise RequestError(
                f"an assignment with id {assignment.id!r} already exists", reason="duplicate_id"
            )
        self._check_fits(assignment, self.exclusive_cpus)
        items = dict(self.assignments)
        items[assignment.id] = assignment
        return replace(self, assignments=items)

    def _check_fits(self, assignment: Assignment, taken: CPUSet) -> None:
        if not assignment.exclusive:
            return
        clash = assignment.reserved & taken
        if clash:
            owners = sorted({o for c in clash if (o := self.owner_of(c)) is not None})
            raise AllocationError(
                f"CPUs {clash} of {assignment.id!r} are already held by {', '.join(owners)}",
                reason="cpus_taken",
            )
        held = assignment.cpus & self.reserved
        if held:
            raise AllocationError(
                f"CPUs {held} of {assignment.id!r} are reserved", reason="cpus_reserved"
            )
        if self.online and not assignment.reserved.issubset(self.online):
            raise AllocationError(
                f"CPUs {assignment.reserved - self.online} of {assignment.id!r} are not online",
                reason="cpus_offline",
            )

    def replace_assignment(self, assignment: Assignment) -> HostState:
        """A state where the assignment with the same id is replaced (KeyError-free: adds it)."""
        rest = self.remove(assignment.id, missing_ok=True)
        return rest.add(assignment)

    def remove(self, assignment_id: str, *, missing_ok: bool = False) -> HostState:
        """A state without `assignment_id` (RequestError if absent unless `missing_ok`)."""
        if assignment_id not in self.assignments:
            if missing_ok:
                return self
            raise RequestError(f"no assignment with id {assignment_id!r}", reason="unknown_id")
        items = dict(self.assignments)
        del items[assignment_id]
        return replace(self, assignments=items)

    def remove_many(self, assignment_ids: Iterable[str]) -> HostState:
        ids = set(assignment_ids)
        if not ids & self.assignments.keys():
            return self
        return replace(
            self, assignments={k: v for k, v in self.assignments.items() if k not in ids}
        )

    def with_reserved(self, reserved: CPUSet) -> HostState:
        return replace(self, reserved=reserved)

    def with_options(self, options: Mapping[str, str]) -> HostState:
        return replace(self, options=options)

    def with_topology(self, topology: Topology) -> HostState:
        """Same assignments, machine facts (fingerprint, online CPUs) from `topology`.

        No safety checks: `corepin.state.validate` is the checked way to adopt a new topology.
        """
        return replace(self, topology=fingerprint(topology), online=topology.online_cpus)

    def bump(self) -> HostState:
        """The same state with the next revision (done by `Transaction.commit`)."""
        return replace(self, revision=self.revision + 1)

    def evolve(self, **changes: Any) -> HostState:
        return replace(self, **changes)


def fingerprint(topology: Topology) -> str:
    """`sha256:<hex>` of the canonical JSON form of the topology (sorted keys, no spaces)."""
    from corepin.state.checkpoint import canonical_bytes, sha256_hex

    return "sha256:" + sha256_hex(canonical_bytes(topology.to_json()))
