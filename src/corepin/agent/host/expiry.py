"""The end of host reservations: expired (every host transaction drops them first,
`HostAgent.transaction`) or deleted (`corepin reserve --delete`). A run on an ended
reservation keeps its CPUs as its own: its assignment no longer names the reservation.

Pure functions of the state; loaded by a host transaction only when the state holds
reservations.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from corepin.state.model import HostState
    from corepin.state.reservations import Reservation


def end_reservations(state: HostState, gone: tuple[Reservation, ...]) -> HostState:
    """`state` (the reservations `gone` already removed from it) where the runs that were on
    their CPUs hold those CPUs as their own (their assignments name no reservation)."""
    for r in gone:
        for ident in r.consumed_by:
            a = state.get(ident)
            if a is not None and a.reservation == r.name:
                state = state.replace_assignment(a.evolve(reservation=None))
    return state


def drop_expired(state: HostState, now: float) -> tuple[HostState, tuple[Reservation, ...]]:
    """`state` without the reservations whose TTL has run out at `now` (a run on one keeps its
    CPUs), and those."""
    if not state.reservations:
        return state, ()
    kept, gone = state.expire_reservations(now)
    if not gone:
        return state, ()
    return end_reservations(kept, gone), gone


__all__ = ["drop_expired", "end_reservations"]
