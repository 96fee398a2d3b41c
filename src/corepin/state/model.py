"""The in-memory node state: who holds which CPUs, as immutable values.

`Assignment` is what the state records for one workload (a `corepin run` process tree or a
container, see `corepin.state.owners`). `HostState` holds every assignment plus the machine
facts the pools are derived from (online, isolated, reserved and infra CPUs, options). Both are
frozen; every "change" is a pure method that returns a new value, so a transaction can compute
the next state, validate it and only then persist it. The same state serves standalone host
mode and the Kubernetes node agent.

Pools are derived, never stored, by the node's one pool model
(`corepin.allocation.pools.NodePools`): `state.pools` is built from the facts and the holds of
the assignments, and `shared_pool`, `free`, `held` and `exclusive_cpus` come from it.

Kinds (`corepin.allocation.pools.KINDS`):
- `exclusive`: own CPUs only; `withheld` = the CPUs plus the rest of the units the exclusiveness
  `level` withholds; out of the shared pool and the free set;
- `mixed`: like exclusive, plus the shared pool in one affinity mask
  (`corepin run --exclusive N --with-shared`);
- `share`: CPUs of its own that stay in the shared pool for others (out of the free set only);
- `shared`: the shared pool; `cpus` is empty, or the CPUs of the pool a best-effort workload
  was placed on (it runs on those of them that are in the pool).

Two names never mean the same thing: *reserved* CPUs are the node's system CPUs (never handed
out); *withheld* CPUs are those an assignment's exclusiveness level keeps from others.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final

from corepin.allocation.pools import HOLDING_KINDS, KINDS, NodePools
from corepin.allocation.types import LEVELS, WORKLOADS
from corepin.core.cpuset import CPUSet
from corepin.core.digest import canonical_digest
from corepin.core.errors import AllocationError, RequestError
from corepin.core.qos import check_class, class_of
from corepin.core.record import field, record, replace
from corepin.state.owners import ContainerOwner, Owner, ProcessOwner
from corepin.state.reservations import Reservation, check_name

if TYPE_CHECKING:
    from corepin.state.shield import ShieldRecord
    from corepin.topology.model import Topology

#: Option that keeps the reserved CPUs out of the shared pool too (kubelet option name).
STRICT_RESERVATION: Final = "strict-cpu-reservation"

_EMPTY: Final = CPUSet()
_NO_OPTIONS: Final[Mapping[str, str]] = MappingProxyType({})
_NO_ASSIGNMENTS: Final[Mapping[str, Assignment]] = MappingProxyType({})
_NO_RESERVATIONS: Final[Mapping[str, Reservation]] = MappingProxyType({})


def _is_true(value: str | None) -> bool:
    return value is not None and value.strip().lower() in ("", "1", "true", "yes", "on")


@record
class Assignment:
    """What the state records for one workload. Plain fields; validated on construction.

    - `cpus`: the CPUs it holds (empty for kind `shared` unless placed as best effort);
    - `withheld`: `cpus` plus the rest of the units withheld by the exclusiveness `level`
      (defaults to `cpus`; empty for kind `shared`);
    - `mems`: NUMA node ids for cpuset.mems (empty = not recorded; `validate` fills it in);
    - `owner`: a `ProcessOwner` or a `ContainerOwner` (None only in tests of pure pools);
    - `created`: wall-clock seconds when recorded; `policy`: the policy that decided;
      `workload`: the workload family when one was given;
    - `qos`: its QoS class when one was given explicitly (`corepin run --qos-class`, the
      `corepin.io/qos-class` annotation); None: derived (`qos_class`);
    - `near`: the devices its CPUs were chosen near (`corepin run --near`), as they were named;
    - `reservation`: the reservation whose CPUs it runs on (`corepin.state.reservations`), if any;
    - `rebalance`: whether rebalancing may move it to better-aligned CPUs (False: its owner asked
      not to be moved, `corepin run --no-rebalance`).
    """

    id: str
    kind: str = "exclusive"
    cpus: CPUSet = _EMPTY
    withheld: CPUSet = _EMPTY
    mems: CPUSet = _EMPTY
    level: str = "cpu"
    owner: Owner | None = None
    created: float = 0.0
    policy: str = ""
    workload: str | None = None
    qos: str | None = None
    near: tuple[str, ...] = ()
    reservation: str | None = None
    rebalance: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id or len(self.id) > 512:
            raise RequestError(f"assignment id must be a non-empty string, got {self.id!r}")
        if any(ord(ch) < 32 or ord(ch) == 127 for ch in self.id):
            raise RequestError(f"assignment id {self.id!r} contains control characters")
        if self.kind not in KINDS:
            raise RequestError(
                f"assignment {self.id!r}: kind must be one of {', '.join(KINDS)}, got {self.kind!r}"
            )
        for name in ("cpus", "withheld", "mems"):
            if not isinstance(getattr(self, name), CPUSet):
                raise RequestError(f"assignment {self.id!r}: {name} must be a CPUSet")
        if self.level not in LEVELS:
            raise RequestError(
                f"assignment {self.id!r}: level must be one of {', '.join(LEVELS)}, "
                f"got {self.level!r}"
            )
        if self.workload is not None and self.workload not in WORKLOADS:
            raise RequestError(
                f"assignment {self.id!r}: workload must be one of {', '.join(WORKLOADS)}, "
                f"got {self.workload!r}"
            )
        if self.qos is not None:
            object.__setattr__(self, "qos", check_class(self.qos, f"assignment {self.id!r}: qos"))
        if isinstance(self.near, list):
            object.__setattr__(self, "near", tuple(self.near))
        if not isinstance(self.near, tuple) or not all(
            isinstance(name, str) and name for name in self.near
        ):
            raise RequestError(
                f"assignment {self.id!r}: near must be device names, got {self.near!r}"
            )
        if self.reservation is not None:
            check_name(self.reservation, f"assignment {self.id!r}: reservation")
        if not isinstance(self.rebalance, bool):
            raise RequestError(f"assignment {self.id!r}: rebalance must be true or false")
        if self.owner is not None and not isinstance(self.owner, (ProcessOwner, ContainerOwner)):
            raise RequestError(f"assignment {self.id!r}: owner must be a process or a container")
        if self.kind == "shared":
            if self.withheld:
                raise RequestError(
                    f"assignment {self.id!r} is shared but withholds CPUs {self.withheld}"
                )
        else:
            if not self.cpus:
                raise RequestError(f"assignment {self.id!r} is {self.kind} but holds no CPUs")
            if not self.withheld:
                object.__setattr__(self, "withheld", self.cpus)
            elif not self.cpus.issubset(self.withheld):
                raise RequestError(
                    f"assignment {self.id!r}: withheld {self.withheld} must contain cpus "
                    f"{self.cpus}"
                )

    # ------------------------------------------------------------------ owner views
    @property
    def process(self) -> ProcessOwner | None:
        return self.owner if isinstance(self.owner, ProcessOwner) else None

    @property
    def container(self) -> ContainerOwner | None:
        return self.owner if isinstance(self.owner, ContainerOwner) else None

    @property
    def pid(self) -> int | None:
        return self.owner.pid if isinstance(self.owner, ProcessOwner) else None

    @property
    def cgroup(self) -> str | None:
        return self.owner.cgroup if self.owner is not None else None

    @property
    def label(self) -> str:
        return self.owner.label if self.owner is not None else self.id

    @property
    def qos_class(self) -> str:
        """Its QoS class: the one given (`qos`), else derived from its kind and, for a
        container, its Kubernetes QoS (`corepin.core.qos.class_of`)."""
        if self.qos is not None:
            return self.qos
        container = self.container
        return class_of(self.kind, (container.qos or None) if container is not None else None)

    @property
    def best_effort(self) -> bool:
        """Whether its class is BE."""
        return self.qos_class == "BE"

    # ------------------------------------------------------------------ pools
    @property
    def holds(self) -> bool:
        """True when it holds CPUs of its own (kinds exclusive, mixed and share)."""
        return self.kind in HOLDING_KINDS

    @property
    def exclusive(self) -> bool:
        """True when its CPUs are its alone (kinds exclusive and mixed)."""
        return self.kind in ("exclusive", "mixed")

    @property
    def with_shared(self) -> bool:
        """True when its affinity follows the shared pool (kinds shared and mixed)."""
        return self.kind in ("shared", "mixed")

    def affinity(self, shared_pool: CPUSet) -> CPUSet:
        """The whole CPU mask its processes run on, given the current shared pool."""
        if self.kind in ("exclusive", "share"):
            return self.cpus
        if self.kind == "shared":
            placed = self.cpus & shared_pool
            return placed or shared_pool
        return self.cpus | shared_pool

    def evolve(self, **changes: Any) -> Assignment:
        """A copy with some fields changed (validated again). When `cpus` changes and the
        withheld set was just the CPUs themselves (level cpu), the withheld set follows."""
        if "cpus" in changes and "withheld" not in changes and self.withheld == self.cpus:
            changes["withheld"] = _EMPTY
        return replace(self, **changes)


@record
class HostState:
    """Everything corepin persists about one node. Immutable; methods return new states.

    - `revision`: bumped by every committed transaction (a write counter, not a format version);
    - `topology`: fingerprint of the topology the state was built against (`fingerprint()`);
    - `online`, `isolated`: the online and isolated CPUs at that time;
    - `reserved`: the system's CPUs, never handed out; `infra`: infrastructure CPUs;
    - `options`: policy options (for example `strict-cpu-reservation`);
    - `assignments`: id -> Assignment, a read-only mapping sorted by id;
    - `shield`: the active shield (`corepin shield on`) and what it changed, or None;
    - `reservations`: name -> Reservation (CPUs held for a workload yet to come), sorted by
      name; their withheld CPUs are held like an exclusive assignment's;
    - `pools`: the derived `NodePools` (not stored).
    """

    revision: int = 0
    topology: str = ""
    online: CPUSet = _EMPTY
    isolated: CPUSet = _EMPTY
    reserved: CPUSet = _EMPTY
    infra: CPUSet = _EMPTY
    options: Mapping[str, str] = field(default_factory=lambda: _NO_OPTIONS)
    assignments: Mapping[str, Assignment] = field(default_factory=lambda: _NO_ASSIGNMENTS)
    shield: ShieldRecord | None = None
    reservations: Mapping[str, Reservation] = field(default_factory=lambda: _NO_RESERVATIONS)
    pools: NodePools = field(init=False, repr=False, compare=False)
    #: pod uid -> its assignments, built on first use (`pod_assignments`)
    _by_pod: dict[str, tuple[Assignment, ...]] | None = field(
        init=False, repr=False, compare=False, default=None
    )

    def __post_init__(self) -> None:
        if isinstance(self.revision, bool) or not isinstance(self.revision, int):
            raise RequestError(f"state revision must be an integer, got {self.revision!r}")
        for name in ("online", "isolated", "reserved", "infra"):
            if not isinstance(getattr(self, name), CPUSet):
                raise RequestError(f"state {name} must be a CPUSet")
        if not isinstance(self.options, MappingProxyType):
            object.__setattr__(self, "options", MappingProxyType(dict(self.options)))
        if not isinstance(self.assignments, MappingProxyType):
            items = dict(self.assignments)
            for key, value in items.items():
                if not isinstance(value, Assignment) or value.id != key:
                    raise RequestError(f"state assignment key {key!r} does not match its id")
            object.__setattr__(self, "assignments", MappingProxyType(dict(sorted(items.items()))))
        if not isinstance(self.reservations, MappingProxyType):
            held = dict(self.reservations)
            for key, res in held.items():
                if not isinstance(res, Reservation) or res.name != key:
                    raise RequestError(f"state reservation key {key!r} does not match its name")
            object.__setattr__(self, "reservations", MappingProxyType(dict(sorted(held.items()))))
        if self.shield is not None:
            # loaded only when a shield is on: `corepin run` reads states without one
            from corepin.state.shield import ShieldRecord

            if not isinstance(self.shield, ShieldRecord):
                raise RequestError("state shield must be a ShieldRecord or None")
        pools = NodePools.build(
            self.online,
            isolated=self.isolated,
            reserved=self.reserved,
            infra=self.infra,
            strict=_is_true(self.options.get(STRICT_RESERVATION)),
            holds=self._holds(),
        )
        object.__setattr__(self, "pools", pools)

    def _holds(self) -> Iterator[tuple[str, CPUSet]]:
        for a in self.assignments.values():
            yield a.kind, a.withheld
        for r in self.reservations.values():
            yield "exclusive", r.withheld

    # ------------------------------------------------------------------ construction
    @classmethod
    def new(
        cls,
        topology: Topology,
        *,
        reserved: CPUSet = _EMPTY,
        infra: CPUSet = _EMPTY,
        options: Mapping[str, str] | None = None,
    ) -> HostState:
        """An empty state for this machine."""
        return cls(
            topology=fingerprint(topology),
            online=topology.online_cpus,
            isolated=topology.isolated_cpus,
            reserved=reserved,
            infra=infra,
            options=options or {},
        )

    # ------------------------------------------------------------------ derived views
    @property
    def strict_reservation(self) -> bool:
        return self.pools.strict

    def __iter__(self) -> Iterator[Assignment]:
        return iter(self.assignments.values())

    def __contains__(self, assignment_id: object) -> bool:
        return assignment_id in self.assignments

    def get(self, assignment_id: str) -> Assignment | None:
        return self.assignments.get(assignment_id)

    @property
    def exclusive_cpus(self) -> CPUSet:
        """CPUs of exclusive and mixed assignments with the units their levels withhold."""
        return self.pools.exclusive_cpus

    @property
    def held(self) -> CPUSet:
        """CPUs of exclusive, mixed and share assignments with their withheld units."""
        return self.pools.held

    @property
    def shared_pool(self) -> CPUSet:
        """The CPUs shared workloads run on (see `NodePools.shared_pool`)."""
        return self.pools.shared_pool

    @property
    def free(self) -> CPUSet:
        """CPUs a new exclusive or share request may take."""
        return self.pools.free

    def shared_assignments(self) -> list[Assignment]:
        """Assignments whose affinity follows the shared pool (kinds shared and mixed)."""
        return [a for a in self.assignments.values() if a.with_shared]

    def usage_counts(self) -> dict[int, int]:
        """CPU -> how many shared assignments are placed on it (best-effort placement)."""
        counts: dict[int, int] = {}
        for a in self.assignments.values():
            if a.kind == "shared":
                for cpu in a.cpus:
                    counts[cpu] = counts.get(cpu, 0) + 1
        return counts

    def owner_of(self, cpu: int) -> str | None:
        """The id of the assignment withholding `cpu`, else `reservation <name>` when a
        reservation holds it, else None."""
        for a in self.assignments.values():
            if cpu in a.withheld:
                return a.id
        for r in self.reservations.values():
            if cpu in r.withheld:
                return f"reservation {r.name}"
        return None

    def pod_assignments(self, pod_uid: str) -> tuple[Assignment, ...]:
        """Every assignment of the pod with this uid (an index built once per state, so a
        pass over all pods stays linear)."""
        index = self._by_pod
        if index is None:
            built: dict[str, list[Assignment]] = {}
            for a in self.assignments.values():
                owner = a.container
                if owner is not None:
                    built.setdefault(owner.pod_uid, []).append(a)
            index = {uid: tuple(items) for uid, items in built.items()}
            object.__setattr__(self, "_by_pod", index)
        return index.get(pod_uid, ())

    def find_container(self, pod_uid: str, container: str) -> Assignment | None:
        """The assignment of a pod's container (identity pod uid + container name)."""
        for a in self.pod_assignments(pod_uid):
            if a.container is not None and a.container.container == container:
                return a
        return None

    def overlaps(self) -> list[tuple[str, str, CPUSet]]:
        """Pairs of assignments whose withheld sets overlap (should always be empty)."""
        out: list[tuple[str, str, CPUSet]] = []
        items = [a for a in self.assignments.values() if a.holds]
        for i, a in enumerate(items):
            for b in items[i + 1 :]:
                common = a.withheld & b.withheld
                if common:
                    out.append((a.id, b.id, common))
        for r in self.reservations.values():
            for a in items:
                common = a.withheld & r.withheld
                if common and a.reservation != r.name:
                    out.append((a.id, f"reservation {r.name}", common))
        return out

    # ------------------------------------------------------------------ pure updates
    def add(self, assignment: Assignment) -> HostState:
        """A state with `assignment` added.

        RequestError when the id is taken; AllocationError (reason `cpus_taken`,
        `cpus_reserved`, `cpus_infra` or `cpus_offline`) when its withheld CPUs are held by
        another assignment, reserved, infra or not online.
        """
        if assignment.id in self.assignments:
            raise RequestError(
                f"an assignment with id {assignment.id!r} already exists", reason="duplicate_id"
            )
        if assignment.reservation is not None:
            return self._add_on_reservation(assignment)
        try:
            self.pools.check_hold(assignment.kind, assignment.withheld)
        except AllocationError as exc:
            if exc.reason == "cpus_taken":
                clash = assignment.withheld & self.held
                owners = sorted({o for c in clash if (o := self.owner_of(c)) is not None})
                raise AllocationError(
                    f"CPUs {clash} of {assignment.id!r} are already held by {', '.join(owners)}",
                    reason="cpus_taken",
                ) from None
            raise AllocationError(f"{assignment.id!r}: {exc.message}", reason=exc.reason) from None
        items = dict(self.assignments)
        items[assignment.id] = assignment
        return replace(self, assignments=items)

    def _add_on_reservation(self, assignment: Assignment) -> HostState:
        """`add` for an assignment that runs on its reservation's CPUs: its CPUs must be the
        reservation's (or a part of them), and the reservation must not be in use already."""
        name = assignment.reservation
        held = self.reservations.get(name or "")
        if held is None:
            raise AllocationError(f"no reservation named {name!r}", reason="unknown_reservation")
        if held.in_use:
            raise AllocationError(
                f"reservation {name!r} is in use by {', '.join(held.consumed_by)}",
                reason="reservation_in_use",
            )
        outside = assignment.withheld - held.withheld
        if outside:
            without = replace(
                self, reservations={k: v for k, v in self.reservations.items() if k != name}
            )
            try:
                without.pools.check_hold(assignment.kind, outside)
            except AllocationError as exc:
                raise AllocationError(
                    f"{assignment.id!r}: CPUs {outside} are outside reservation {name!r}: "
                    f"{exc.message}",
                    reason=exc.reason,
                ) from None
        items = dict(self.assignments)
        items[assignment.id] = assignment
        reservations = dict(self.reservations)
        reservations[held.name] = replace(held, consumed_by=(assignment.id,))
        return replace(self, assignments=items, reservations=reservations)

    # ------------------------------------------------------------------ reservations
    def add_reservation(self, reservation: Reservation) -> HostState:
        """A state holding `reservation`. RequestError when the name is taken;
        AllocationError (as `add` names them) when its CPUs are not free."""
        if reservation.name in self.reservations:
            raise RequestError(
                f"a reservation named {reservation.name!r} already exists",
                reason="duplicate_reservation",
            )
        if reservation.consumed_by:
            raise RequestError(f"a new reservation {reservation.name!r} cannot be in use")
        try:
            self.pools.check_hold("exclusive", reservation.withheld)
        except AllocationError as exc:
            if exc.reason == "cpus_taken":
                clash = reservation.withheld & self.held
                owners = sorted({o for c in clash if (o := self.owner_of(c)) is not None})
                raise AllocationError(
                    f"CPUs {clash} of reservation {reservation.name!r} are already held by "
                    f"{', '.join(owners)}",
                    reason="cpus_taken",
                ) from None
            raise AllocationError(
                f"reservation {reservation.name!r}: {exc.message}", reason=exc.reason
            ) from None
        reservations = dict(self.reservations)
        reservations[reservation.name] = reservation
        return replace(self, reservations=reservations)

    def remove_reservation(self, name: str, *, missing_ok: bool = False) -> HostState:
        """A state without the reservation `name`; a workload on its CPUs keeps them as its
        own (its assignment no longer names it). RequestError if absent unless `missing_ok`."""
        if name not in self.reservations:
            if missing_ok:
                return self
            raise RequestError(f"no reservation named {name!r}", reason="unknown_reservation")
        return self._end_reservations({name})

    def expire_reservations(self, now: float) -> tuple[HostState, tuple[Reservation, ...]]:
        """The state without the reservations whose TTL has run out at `now` (workloads on
        them keep their CPUs, as `remove_reservation` says), and those."""
        gone = tuple(r for r in self.reservations.values() if r.expired(now))
        if not gone:
            return self, ()
        return self._end_reservations({r.name for r in gone}), gone

    def _end_reservations(self, names: set[str]) -> HostState:
        kept = {k: v for k, v in self.reservations.items() if k not in names}
        items = {
            k: a.evolve(reservation=None) if a.reservation in names else a
            for k, a in self.assignments.items()
        }
        return replace(self, reservations=kept, assignments=items)

    def _released(self, ids: set[str]) -> dict[str, Reservation]:
        """The reservations once the assignments `ids` are released: a one-time reservation
        their workload consumed ends, a reusable one is free again."""
        out: dict[str, Reservation] = {}
        for name, r in self.reservations.items():
            if not ids & set(r.consumed_by):
                out[name] = r
            elif r.reusable:
                out[name] = replace(r, consumed_by=tuple(i for i in r.consumed_by if i not in ids))
        return out

    def replace_assignment(self, assignment: Assignment) -> HostState:
        """A state where the assignment with the same id is replaced (KeyError-free: adds it).
        An assignment that stays on its reservation keeps the reservation."""
        old = self.assignments.get(assignment.id)
        name = assignment.reservation
        if old is None or name is None or old.reservation != name or name not in self.reservations:
            return self.remove(assignment.id, missing_ok=True).add(assignment)
        reservations = dict(self.reservations)
        reservations[name] = replace(reservations[name], consumed_by=())
        items = {k: v for k, v in self.assignments.items() if k != assignment.id}
        return replace(self, assignments=items, reservations=reservations).add(assignment)

    def remove(self, assignment_id: str, *, missing_ok: bool = False) -> HostState:
        """A state without `assignment_id` (RequestError if absent unless `missing_ok`)."""
        if assignment_id not in self.assignments:
            if missing_ok:
                return self
            raise RequestError(f"no assignment with id {assignment_id!r}", reason="unknown_id")
        items = dict(self.assignments)
        del items[assignment_id]
        return replace(self, assignments=items, reservations=self._released({assignment_id}))

    def remove_many(self, assignment_ids: Iterable[str]) -> HostState:
        ids = set(assignment_ids)
        if not ids & self.assignments.keys():
            return self
        return replace(
            self,
            assignments={k: v for k, v in self.assignments.items() if k not in ids},
            reservations=self._released(ids),
        )

    def with_options(self, options: Mapping[str, str]) -> HostState:
        return replace(self, options=options)

    def evolve(self, **changes: Any) -> HostState:
        return replace(self, **changes)


def fingerprint(topology: Topology) -> str:
    """`sha256:<hex>` of the canonical JSON form of the topology's CPUs and NUMA nodes (sorted
    keys, no spaces). Its PCI devices are left out: a device plugged in, removed or renamed
    does not make the state another machine's."""
    data = topology.to_json()
    data.pop("devices", None)
    return canonical_digest(data)
