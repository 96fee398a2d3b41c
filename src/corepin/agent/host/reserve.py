"""`corepin reserve`: hold CPUs on this host for a run that has not started yet, and the end
of reservations (deleted, expired).

A reservation (`corepin.state.reservations.Reservation`) holds its CPUs like an exclusive run:
they leave the free set and the shared pool at once (the shared runs are re-pinned), and no run
gets them but `corepin run --reservation NAME`, which gets exactly them. Each command works in
one state transaction (under the state lock), as every host command does:

- `reserve(host, name, count=N | cpus=LIST, level=..., ttl=..., reusable=...)`: N CPUs chosen
  by the host's policy at `level` out of the free set (the same decision a run gets, so a
  reservation is as well aligned as a run would be), or exactly `cpus` (with the rest of their
  units of `level`);
- `delete(host, name)`: the reservation ends; a run on its CPUs keeps them as its own;
- expiry is what every host transaction does first (`HostAgent.transaction`, with
  `HostState.expire_reservations`): a reservation whose TTL ran out ends; one a run uses ends
  too, and the run keeps its CPUs as its own (its assignment no longer names the reservation);
- `reserved_decision(state, name, topology)`: the CPUs `corepin run --reservation NAME` gets.

Loaded by a host transaction only when the state holds reservations.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from corepin.allocation.api import build_request
from corepin.allocation.levels import withheld_for
from corepin.allocation.types import LEVELS, Decision
from corepin.core.cpuset import CPUSet
from corepin.core.errors import AllocationError, InputError
from corepin.core.text import utc_text
from corepin.state.reservations import Reservation, check_name

if TYPE_CHECKING:
    from corepin.agent.host.agent import HostAgent
    from corepin.state.model import HostState
    from corepin.topology.model import Topology


# ---------------------------------------------------------------------- reserve, delete


def check_ttl(ttl: float | None) -> float | None:
    """`ttl` when it is a usable number of seconds (> 0, finite) or None; InputError naming it."""
    if ttl is None:
        return None
    if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not 0 < ttl < math.inf:
        raise InputError(f"--ttl {ttl!r}: expected a positive number of seconds", reason="bad_ttl")
    return float(ttl)


def reserve(
    host: HostAgent,
    name: str,
    *,
    count: int | None = None,
    cpus: CPUSet | None = None,
    level: str = "cpu",
    ttl: float | None = None,
    reusable: bool = False,
    options: Mapping[str, str] | None = None,
) -> Reservation:
    """Hold `count` CPUs chosen by the host's policy at `level`, or exactly `cpus`, for a run
    to come (see the module docstring). InputError (exit 2) for a bad name, list, level or ttl,
    or a name already taken; AllocationError (exit 3, naming who holds a CPU) when the CPUs
    are not free."""

    check_name(name)
    expires_in = check_ttl(ttl)
    if level not in LEVELS:
        raise InputError(
            f"--level {level!r}: expected one of {', '.join(LEVELS)}", reason="bad_level"
        )
    if (count is None) == (cpus is None):
        raise InputError("give one of --cpus N and --cpu-list LIST", reason="bad_usage")
    if count is not None and count <= 0:
        raise InputError(f"--cpus {count}: expected a positive number", reason="bad_usage")
    if cpus is not None and not cpus:
        raise InputError("--cpu-list names no CPU", reason="bad_usage")
    with host.transaction() as txn:
        state, _ = host.liveness.reap(txn.state)
        state = host.with_reserved(state)
        if name in state.reservations:
            held = state.reservations[name]
            raise InputError(
                f"a reservation named {name!r} already exists (CPUs {held.cpus}); delete it "
                f"first with `corepin reserve --delete {name}`",
                reason="duplicate_reservation",
            )
        if cpus is not None:
            online = host.topology.online_cpus
            if not cpus <= online:
                raise InputError(
                    f"--cpu-list {cpus}: CPUs {cpus - online} are not online CPUs of this "
                    f"machine (online: {online})",
                    reason="bad_cpus",
                )
            withheld = withheld_for(host.topology, level, cpus)
            host.decide_cpus(state, withheld, "exclusive")  # names the holder of a taken CPU
            chosen = cpus
        else:
            assert count is not None
            request = build_request(count, {**(options or {}), "level": level})
            decision = host.decide(state, request, "exclusive")
            chosen, withheld = decision.cpus, decision.withheld
        now = time.time()
        made = Reservation(
            name=name,
            cpus=chosen,
            withheld=withheld,
            level=level,
            reusable=reusable,
            expires=None if expires_in is None else now + expires_in,
            created=now,
        )
        state = txn.commit(host.sync_shield(state.add_reservation(made), strict=True))
        host.repin_shared(state)  # the shared runs leave the reserved CPUs at once
    return made


def delete(host: HostAgent, name: str) -> Reservation:
    """End the reservation `name` (a run on its CPUs keeps them as its own): the reservation
    as it was. InputError (exit 2) naming the reservations there are when it is not one."""
    check_name(name)
    with host.transaction() as txn:
        state = txn.state
        held = state.reservations.get(name)
        if held is None:
            known = ", ".join(state.reservations) or "none"
            raise InputError(
                f"no reservation named {name!r} (reservations: {known})",
                reason="unknown_reservation",
            )
        state = state.remove_reservation(name)
        state = txn.commit(host.sync_shield(state))
        host.repin_shared(state)  # the CPUs it held and no run keeps are shared again
    return held


# ---------------------------------------------------------------------- a run on a reservation


def reserved_decision(state: HostState, name: str, topology: Topology) -> Decision:
    """The decision of `corepin run --reservation NAME`: exactly the reservation's CPUs (its
    withheld set with them). AllocationError (exit 3, one line) for a reservation that is not
    there (never made, deleted, expired, or a one-time one already used up) or in use."""

    held = state.reservations.get(name)
    if held is None:
        known = ", ".join(state.reservations) or "none"
        raise AllocationError(
            f"no reservation named {name!r}: never made, deleted, expired or used up "
            f"(reservations: {known})",
            reason="unknown_reservation",
        )
    if held.in_use:
        raise AllocationError(
            f"reservation {name!r} is in use by {', '.join(held.consumed_by)}",
            reason="reservation_in_use",
        )
    return Decision(held.cpus, topology.mems_of(held.cpus), held.withheld, "reservation")


# ---------------------------------------------------------------------- how it is shown


def reservation_row(r: Reservation) -> dict[str, Any]:
    """One reservation as `corepin reserve` and `corepin report` print it: `name`, `cpus`,
    `expires` (RFC 3339 UTC or null), `consumed_by` (the run on it or null), and `withheld`,
    `level`, `reusable`."""
    return {
        "name": r.name,
        "cpus": str(r.cpus),
        "expires": utc_text(r.expires),
        "consumed_by": r.consumed_by[0] if r.consumed_by else None,
        "withheld": str(r.withheld),
        "level": r.level,
        "reusable": r.reusable,
    }


__all__ = [
    "check_ttl",
    "delete",
    "reservation_row",
    "reserve",
    "reserved_decision",
]
