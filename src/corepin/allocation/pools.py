"""CPU pools: reserved, infra, shared and exclusive (pure values, no I/O).

- **reserved**: CPUs kept for the system (kubelet `reserved-cpus` / `--reserved-cpus`, Koordinator's
  `node.koordinator.sh/reservation`): given as an explicit list or as a count chosen by topology.
  Reserved CPUs are never handed out exclusively. Without `strict` they still run shared work
  (as the kubelet does); with `strict` they run nothing but the system.
- **infra**: CPUs for infrastructure daemons (CMK's infra pool): never exclusive, not shared.
- **exclusive**: the CPUs withheld by exclusive assignments (each decision's `reserved`, i.e. its
  CPUs plus the rest of the units its exclusiveness level withholds).
- **shared**: every online CPU that is not exclusive, not infra, not strict-reserved and not
  isolated (isolated CPUs join the shared pool only when asked). It is recomputed from the
  assignments, so it grows and shrinks as exclusive assignments come and go.

`PoolState` is an immutable value; `with_assignment` / `without` return new states. The state
layer and the simulator build on it.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from corepin.allocation.types import Decision, Policy, Request
from corepin.core.cpuset import CPUSet
from corepin.core.errors import AllocationError, CPUSetParseError, RequestError
from corepin.topology.model import Topology

KOORDINATOR_RESERVATION = "node.koordinator.sh/reservation"

_NO_ASSIGNMENTS: Mapping[str, Decision] = MappingProxyType({})


# ---------------------------------------------------------------------- reserved CPUs
def parse_cpu_quantity(text: object) -> int:
    """A Kubernetes CPU quantity as whole CPUs: "2" -> 2, "1500m" -> 2 (rounded up), 3 -> 3."""
    if isinstance(text, bool):
        raise RequestError(f"invalid CPU quantity {text!r}", reason="bad_reservation")
    if isinstance(text, int):
        value = text
    elif isinstance(text, str):
        body = text.strip()
        try:
            if body.endswith("m"):
                milli = int(body[:-1])
                value = -(-milli // 1000)
            else:
                value = int(body)
        except ValueError:
            raise RequestError(
                f'invalid CPU quantity {text!r} (expected e.g. "2" or "1500m")',
                reason="bad_reservation",
            ) from None
    else:
        raise RequestError(f"invalid CPU quantity {text!r}", reason="bad_reservation")
    if value < 0:
        raise RequestError(f"CPU quantity cannot be negative: {text!r}", reason="bad_reservation")
    return value


@dataclass(frozen=True, slots=True)
class Reservation:
    """What to reserve: a count chosen by topology, or an explicit list (the list wins)."""

    count: int = 0
    cpus: CPUSet | None = None
    apply_policy: str = "Default"


def parse_koordinator_reservation(value: str | Mapping[str, Any]) -> Reservation:
    """Koordinator's `node.koordinator.sh/reservation` annotation value, e.g.
    `{"resources": {"cpu": "2"}}` or `{"reservedCPUs": "0-1"}` (JSON text or a parsed mapping)."""
    data: Any = value
    if isinstance(value, str):
        try:
            data = json.loads(value) if value.strip() else {}
        except json.JSONDecodeError as exc:
            raise RequestError(
                f"{KOORDINATOR_RESERVATION} annotation {value!r} is not valid JSON: {exc.msg}",
                reason="bad_reservation",
            ) from None
    if not isinstance(data, Mapping):
        raise RequestError(
            f"{KOORDINATOR_RESERVATION} annotation must be a JSON object, got {value!r}",
            reason="bad_reservation",
        )
    cpus: CPUSet | None = None
    text = data.get("reservedCPUs")
    if text is not None:
        if not isinstance(text, str):
            raise RequestError(
                f"reservedCPUs must be a CPU list, got {text!r}", reason="bad_reservation"
            )
        try:
            cpus = CPUSet.parse(text)
        except CPUSetParseError as exc:
            raise RequestError(f"reservedCPUs: {exc}", reason="bad_reservation") from None
    count = 0
    resources = data.get("resources")
    if resources is not None:
        if not isinstance(resources, Mapping):
            raise RequestError(
                f"resources must be an object, got {resources!r}", reason="bad_reservation"
            )
        if "cpu" in resources:
            count = parse_cpu_quantity(resources["cpu"])
    policy = data.get("applyPolicy", "Default")
    if not isinstance(policy, str):
        raise RequestError(
            f"applyPolicy must be a string, got {policy!r}", reason="bad_reservation"
        )
    return Reservation(count, cpus, policy)


def select_reserved(topology: Topology, count: int = 0, explicit: CPUSet | None = None) -> CPUSet:
    """The reserved CPUs: `explicit` when given (must be online CPUs of the topology), else
    `count` CPUs chosen by topology (the kubelet's choice when the kubelet-static module is
    present, else the topology-aware choice: whole cores, packed, lowest ids)."""
    online = topology.online_cpus
    if explicit is not None:
        if not explicit.issubset(online):
            raise RequestError(
                f"reserved CPUs {explicit - online} are not online CPUs of this topology",
                reason="bad_reservation",
            )
        return explicit
    if count < 0:
        raise RequestError(
            f"reserved CPU count cannot be negative: {count}", reason="bad_reservation"
        )
    if count == 0:
        return CPUSet()
    if count > len(online):
        raise RequestError(
            f"cannot reserve {count} CPUs: the topology has {len(online)} online",
            reason="bad_reservation",
        )
    try:
        kubelet = importlib.import_module("corepin.allocation.kubelet_static")
        chosen = kubelet.select_reserved(topology, count)
        if isinstance(chosen, CPUSet):
            return chosen
    except ImportError:
        pass
    from corepin.allocation.topology_aware import TopologyAwarePolicy

    return TopologyAwarePolicy().decide(topology, Request(count), online).cpus


# ---------------------------------------------------------------------- pool state
@dataclass(frozen=True, slots=True)
class PoolState:
    """Pools of one machine at one moment (immutable).

    `assignments` maps an id to its Decision; exclusive ones withhold `decision.reserved`,
    shared ones (empty `reserved`) withhold nothing and count as users of their CPUs.
    """

    topology: Topology
    reserved: CPUSet = field(default_factory=CPUSet)
    infra: CPUSet = field(default_factory=CPUSet)
    assignments: Mapping[str, Decision] = field(default_factory=lambda: _NO_ASSIGNMENTS)
    strict: bool = False
    _withheld: int = field(default=-1, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.assignments, MappingProxyType):
            object.__setattr__(self, "assignments", MappingProxyType(dict(self.assignments)))
        if self._withheld < 0:
            mask = 0
            for d in self.assignments.values():
                mask |= d.reserved.bits
            object.__setattr__(self, "_withheld", mask)

    # ------------------------------------------------------------------ pools
    def exclusive_cpus(self) -> CPUSet:
        """Every CPU withheld by an exclusive assignment."""
        return CPUSet.from_bits(self._withheld)

    def available_for_exclusive(self) -> CPUSet:
        """Online CPUs free for a new exclusive decision: not reserved, infra or withheld."""
        online = self.topology.online_cpus.bits
        return CPUSet.from_bits(online & ~self.reserved.bits & ~self.infra.bits & ~self._withheld)

    def shared_pool(self, *, allow_isolated: bool = False) -> CPUSet:
        """Online CPUs for shared work: not exclusive, not infra, not reserved when strict,
        not isolated unless `allow_isolated`."""
        mask = self.topology.online_cpus.bits & ~self._withheld & ~self.infra.bits
        if self.strict:
            mask &= ~self.reserved.bits
        if not allow_isolated:
            mask &= ~self.topology.isolated_cpus.bits
        return CPUSet.from_bits(mask)

    def usage_counts(self) -> dict[int, int]:
        """CPU -> how many shared assignments run on it (for best-effort placement)."""
        counts: dict[int, int] = {}
        for d in self.assignments.values():
            if not d.reserved:
                for cpu in d.cpus:
                    counts[cpu] = counts.get(cpu, 0) + 1
        return counts

    # ------------------------------------------------------------------ changes
    def with_assignment(self, ident: str, decision: Decision) -> PoolState:
        """A new state that also holds `decision` under `ident`.

        Raises RequestError when `ident` is already assigned and AllocationError (reason
        "overlap") when an exclusive decision touches withheld, reserved or infra CPUs."""
        if ident in self.assignments:
            raise RequestError(f"assignment {ident!r} already exists", reason="duplicate_id")
        claim = decision.reserved.bits
        if claim:
            clash = claim & (self._withheld | self.reserved.bits | self.infra.bits)
            if clash:
                raise AllocationError(
                    f"decision for {ident!r} withholds CPUs {CPUSet.from_bits(clash)} that are "
                    "already exclusive, reserved or infra",
                    reason="overlap",
                )
            outside = claim & ~self.topology.online_cpus.bits
            if outside:
                raise AllocationError(
                    f"decision for {ident!r} uses CPUs {CPUSet.from_bits(outside)} that are not "
                    "online",
                    reason="offline_cpus",
                )
        table = dict(self.assignments)
        table[ident] = decision
        return PoolState(
            self.topology,
            self.reserved,
            self.infra,
            MappingProxyType(table),
            self.strict,
            self._withheld | claim,
        )

    def without(self, ident: str) -> PoolState:
        """A new state without `ident` (the same state when it is not assigned)."""
        if ident not in self.assignments:
            return self
        table = {k: v for k, v in self.assignments.items() if k != ident}
        return PoolState(self.topology, self.reserved, self.infra, table, self.strict)

    def allocate(self, ident: str, request: Request, policy: Policy) -> tuple[PoolState, Decision]:
        """Decide `request` with `policy` from the right pool and record it under `ident`."""
        if ident in self.assignments:
            raise RequestError(f"assignment {ident!r} already exists", reason="duplicate_id")
        if request.exclusive and request.workload != "best-effort":
            decision = policy.decide(self.topology, request, self.available_for_exclusive())
        else:
            pool = self.shared_pool(allow_isolated="allow-isolated" in request.options)
            from corepin.allocation.workload_aware import WorkloadAwarePolicy

            if request.workload == "best-effort" and isinstance(policy, WorkloadAwarePolicy):
                decision = policy.decide(self.topology, request, pool, usage=self.usage_counts())
            else:
                decision = policy.decide(self.topology, request, pool)
            if decision.reserved:
                decision = Decision(
                    decision.cpus, decision.mems, CPUSet(), decision.policy, decision.explanation
                )
        return self.with_assignment(ident, decision), decision

    @classmethod
    def build(
        cls,
        topology: Topology,
        *,
        reserved: Reservation | CPUSet | int | None = None,
        infra: CPUSet | None = None,
        strict: bool = False,
    ) -> PoolState:
        """A fresh state; `reserved` as a Reservation, an explicit CPUSet or a count."""
        if isinstance(reserved, Reservation):
            chosen = select_reserved(topology, reserved.count, reserved.cpus)
        elif isinstance(reserved, CPUSet):
            chosen = select_reserved(topology, explicit=reserved)
        elif isinstance(reserved, int):
            chosen = select_reserved(topology, reserved)
        else:
            chosen = CPUSet()
        infra_set = infra or CPUSet()
        if not infra_set.issubset(topology.online_cpus):
            raise RequestError(
                f"infra CPUs {infra_set - topology.online_cpus} are not online CPUs",
                reason="bad_infra",
            )
        return cls(topology, chosen, infra_set, strict=strict)
