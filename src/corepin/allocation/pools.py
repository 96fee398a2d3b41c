"""The one pool model of a node's CPUs (pure values, no I/O).

Every part of corepin that needs to know which CPUs are free, shared or held - the state of host
mode and of the node agent, the simulator, the published NodeCPUTopology and the placement core
- asks a `NodePools`; nothing else computes a pool. Deciding a request out of the pools is
`corepin.allocation.decide`.

Machine facts:
- **online**: the CPUs that can run anything.
- **isolated**: CPUs the kernel keeps out of the scheduler (`isolcpus=`): never in the shared pool;
  free for exclusive requests, which prefer them.
- **reserved**: CPUs kept for the system (kubelet `reserved-cpus` / `--reserved-cpus`, Koordinator's
  `node.koordinator.sh/reservation`): given as an explicit list or as a count chosen by topology.
  Reserved CPUs are never handed out. Without `strict` they still run shared work (as the kubelet
  does); with `strict` they run nothing but the system.
- **infra**: CPUs for infrastructure daemons (CMK's infra pool): never handed out, not shared.

Holds (what assignments take), by kind:
- `exclusive` and `mixed`: the assignment's CPUs plus the rest of the units its exclusiveness
  level withholds (its *withheld* set) belong to it alone: out of the free set and out of the
  shared pool (`mixed` runs on its own CPUs plus the shared pool);
- `share`: CPUs of its own that stay in the shared pool for others: out of the free set only;
- `shared`: runs on the shared pool and holds nothing.

Derived:
- *held* = withheld CPUs of every exclusive, mixed and share hold;
- *free* = online - reserved - infra - held (isolated CPUs are free);
- *shared pool* = online - isolated - infra - exclusive holds - (reserved when strict).

`NodePools` is an immutable value of integer bitmasks: taking or releasing a hold returns a new
value and costs a few integer operations (the simulator does it once per trace event).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from typing import Any, Final

from corepin.core.cpuset import CPUSet
from corepin.core.errors import AllocationError, CPUSetParseError, RequestError
from corepin.core.record import record
from corepin.topology.model import Topology

KOORDINATOR_RESERVATION = "node.koordinator.sh/reservation"

_EMPTY: Final = CPUSet()

#: Assignment kinds (see the module docstring).
KINDS: Final = ("exclusive", "mixed", "share", "shared")
#: Kinds whose withheld CPUs leave the shared pool.
EXCLUSIVE_KINDS: Final = frozenset({"exclusive", "mixed"})
#: Kinds that hold CPUs at all (out of the free set).
HOLDING_KINDS: Final = frozenset({"exclusive", "mixed", "share"})


# ---------------------------------------------------------------------- reserved CPUs
def parse_cpu_quantity(text: object) -> int:
    """A Kubernetes CPU quantity as whole CPUs: "2" -> 2, "1500m" -> 2 (rounded up), 3 -> 3."""
    # (the quantity parser loads `fractions` and `decimal`: only a reservation needs them, and
    # `corepin run` loads this module on its start-up path)
    from corepin.core.quantity import QuantityError, parse_quantity

    if isinstance(text, bool) or not isinstance(text, int | str):
        raise RequestError(f"invalid CPU quantity {text!r}", reason="bad_reservation")
    try:
        value = math.ceil(parse_quantity(text.strip() if isinstance(text, str) else text))
    except QuantityError:
        raise RequestError(
            f'invalid CPU quantity {text!r} (expected e.g. "2" or "1500m")',
            reason="bad_reservation",
        ) from None
    if value < 0:
        raise RequestError(f"CPU quantity cannot be negative: {text!r}", reason="bad_reservation")
    return value


@record
class Reservation:
    """What to reserve: a count chosen by topology, or an explicit list (the list wins)."""

    count: int = 0
    cpus: CPUSet | None = None


def parse_koordinator_reservation(value: str | Mapping[str, Any]) -> Reservation:
    """Koordinator's `node.koordinator.sh/reservation` annotation value, e.g.
    `{"resources": {"cpu": "2"}}` or `{"reservedCPUs": "0-1"}` (JSON text or a parsed mapping).
    `applyPolicy`, when given, must be a string; the reservation is the same whatever it says."""
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
    return Reservation(count, cpus)


# ---------------------------------------------------------------------- the pool model
@record
class NodePools:
    """The CPUs of one node at one moment: machine facts plus what the holds take.

    Build it with `NodePools.build(...)` (facts, optionally with holds) or from a topology with
    `NodePools.for_topology(...)`; change it with `hold` / `release`. The integer fields are
    bitmasks (bit i = CPU i).
    """

    online: int
    isolated: int = 0
    reserved: int = 0
    infra: int = 0
    strict: bool = False
    exclusive: int = 0
    share: int = 0

    # ------------------------------------------------------------------ construction
    @classmethod
    def build(
        cls,
        online: CPUSet,
        *,
        isolated: CPUSet = _EMPTY,
        reserved: CPUSet = _EMPTY,
        infra: CPUSet = _EMPTY,
        strict: bool = False,
        holds: Iterable[tuple[str, CPUSet]] = (),
    ) -> NodePools:
        """Pools from machine facts and `(kind, withheld)` holds. Holds are summed, not checked
        against each other (`overlaps` finds clashes in a restored state); `hold` checks."""
        exclusive = share = 0
        for kind, withheld in holds:
            if kind in EXCLUSIVE_KINDS:
                exclusive |= withheld.bits
            elif kind == "share":
                share |= withheld.bits
            elif kind != "shared":
                raise RequestError(f"unknown assignment kind {kind!r}", reason="bad_kind")
        return cls(
            online.bits,
            isolated.bits & online.bits,
            reserved.bits,
            infra.bits,
            strict,
            exclusive,
            share,
        )

    @classmethod
    def for_topology(
        cls,
        topology: Topology,
        *,
        reserved: CPUSet = _EMPTY,
        infra: CPUSet = _EMPTY,
        strict: bool = False,
    ) -> NodePools:
        """Empty pools of `topology` (online and isolated CPUs from it)."""
        if not infra.issubset(topology.online_cpus):
            raise RequestError(
                f"infra CPUs {infra - topology.online_cpus} are not online CPUs",
                reason="bad_infra",
            )
        return cls.build(
            topology.online_cpus,
            isolated=topology.isolated_cpus,
            reserved=reserved,
            infra=infra,
            strict=strict,
        )

    # ------------------------------------------------------------------ derived sets
    @property
    def held_bits(self) -> int:
        return self.exclusive | self.share

    @property
    def free_bits(self) -> int:
        return self.online & ~self.reserved & ~self.infra & ~self.exclusive & ~self.share

    @property
    def shared_bits(self) -> int:
        mask = self.online & ~self.isolated & ~self.infra & ~self.exclusive
        if self.strict:
            mask &= ~self.reserved
        return mask

    @property
    def free(self) -> CPUSet:
        """CPUs a new exclusive or share request may take."""
        return CPUSet.from_bits(self.free_bits)

    @property
    def shared_pool(self) -> CPUSet:
        """CPUs every shared workload runs on."""
        return CPUSet.from_bits(self.shared_bits)

    @property
    def held(self) -> CPUSet:
        """CPUs withheld by exclusive, mixed and share holds."""
        return CPUSet.from_bits(self.held_bits)

    @property
    def exclusive_cpus(self) -> CPUSet:
        """CPUs withheld by exclusive and mixed holds (out of the shared pool)."""
        return CPUSet.from_bits(self.exclusive)

    def shared_pool_for(self, *, allow_isolated: bool = False) -> CPUSet:
        """The shared pool, with the free isolated CPUs too when `allow_isolated`."""
        mask = self.shared_bits
        if allow_isolated:
            mask |= self.isolated & ~self.exclusive & ~self.infra
        return CPUSet.from_bits(mask)

    # ------------------------------------------------------------------ changes
    def check_hold(self, kind: str, withheld: CPUSet) -> None:
        """AllocationError (machine-readable reason) unless `withheld` can be held as `kind`:
        its CPUs must be online, not reserved, not infra and not held already."""
        if kind not in KINDS:
            raise RequestError(f"unknown assignment kind {kind!r}", reason="bad_kind")
        claim = withheld.bits
        if kind == "shared" or not claim:
            return
        taken = claim & self.held_bits
        if taken:
            raise AllocationError(
                f"CPUs {CPUSet.from_bits(taken)} are already held", reason="cpus_taken"
            )
        reserved = claim & self.reserved
        if reserved:
            raise AllocationError(
                f"CPUs {CPUSet.from_bits(reserved)} are reserved", reason="cpus_reserved"
            )
        infra = claim & self.infra
        if infra:
            raise AllocationError(
                f"CPUs {CPUSet.from_bits(infra)} are infra CPUs", reason="cpus_infra"
            )
        offline = claim & ~self.online
        if offline:
            raise AllocationError(
                f"CPUs {CPUSet.from_bits(offline)} are not online", reason="cpus_offline"
            )

    def hold(self, kind: str, withheld: CPUSet) -> NodePools:
        """These pools with `withheld` held as `kind` (checked by `check_hold`)."""
        self.check_hold(kind, withheld)
        return self._moved(kind, withheld.bits, 0)

    def release(self, kind: str, withheld: CPUSet) -> NodePools:
        """These pools without the hold `(kind, withheld)` (holds never overlap)."""
        return self._moved(kind, 0, withheld.bits)

    def _moved(self, kind: str, added: int, removed: int) -> NodePools:
        """These pools with `added` held and `removed` no longer held by holds of `kind`."""
        if kind in EXCLUSIVE_KINDS:
            exclusive, share = (self.exclusive | added) & ~removed, self.share
        elif kind == "share":
            exclusive, share = self.exclusive, (self.share | added) & ~removed
        else:
            return self
        return NodePools(
            self.online, self.isolated, self.reserved, self.infra, self.strict, exclusive, share
        )

    def keeps_shared_pool(self, withheld: CPUSet) -> bool:
        """Whether the shared pool keeps a CPU once `withheld` is held exclusively."""
        return bool(self.shared_bits & ~withheld.bits)
