"""The controller's decisions about CPUReservations, as pure functions (no API, no clock: the
time is passed in).

`decide_reservation(obj, now, node_exists)` -> a `ReservationAction`, the first matching rule
deciding:

- a reservation the wire model cannot read goes `Failed` (its message names the field);
- one consumed under `allocateOnce` (phase `Succeeded`, written by the node's agent) is
  deleted;
- one that is done otherwise (`Expired`, `Failed`, a reusable `Succeeded`) is left alone;
- one whose TTL ran out (creation + `spec.ttl` <= now) goes `Expired` (the agent releases
  its CPUs when it sees that);
- a `Pending` one whose `spec.nodeName` names no Node (`node_exists` False; None: not known)
  goes `Failed`;
- otherwise its `status.expireTime` (creation + ttl) and `status.nodeName` (the spec's, when
  the status has none) are written when missing or different, and it is looked at again when
  its TTL runs out (`recheck_after`).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, Final

from corepin.core.record import record
from corepin.kube.models import CPUReservation, FieldError, format_time

#: what the controller did (metrics label, log event)
EXPIRED: Final = "expired"
FAILED: Final = "failed"
DELETED: Final = "deleted"
UPDATED: Final = "updated"
NOTHING: Final = ""


@record
class ReservationAction:
    """What to do with one reservation: write `status` (None: keep it), delete it, or look
    again after `recheck_after` seconds (None: only on a change)."""

    action: str = NOTHING
    status: Mapping[str, Any] | None = None
    delete: bool = False
    recheck_after: float | None = None
    message: str = ""

    @property
    def writes(self) -> bool:
        return self.status is not None


def node_to_check(obj: Mapping[str, Any]) -> str | None:
    """The node whose existence decides the reservation: `spec.nodeName` of a readable, not
    done reservation still Pending (the agent of a node that exists takes it to Available;
    the scheduler only picks nodes that exist). None: nothing to look up."""
    try:
        r = CPUReservation.from_dict(obj)
    except FieldError:
        return None
    if r.status.phase != "Pending" or r.done:
        return None
    return r.spec.node_name


def _status_of(obj: Mapping[str, Any]) -> dict[str, Any]:
    raw = obj.get("status")
    return dict(raw) if isinstance(raw, Mapping) else {}


def decide_reservation(
    obj: Mapping[str, Any], now: datetime, node_exists: bool | None = None
) -> ReservationAction:
    """What the controller does with the reservation `obj` at `now` (module docstring)."""
    old = _status_of(obj)
    try:
        r = CPUReservation.from_dict(obj)
    except FieldError as exc:
        if old.get("phase") == "Failed":
            return ReservationAction()
        message = f"the reservation cannot be read: {exc.message}"
        return ReservationAction(
            FAILED, {**old, "phase": "Failed", "message": message}, message=message
        )
    phase = r.status.phase
    if phase == "Succeeded" and r.spec.allocate_once:
        users = ", ".join(f"{u.namespace}/{u.name}" for u in r.status.owners) or "its pod"
        return ReservationAction(DELETED, delete=True, message=f"consumed by {users}")
    if r.done:
        return ReservationAction()
    status = dict(old)
    expires = r.expires_at()
    if expires is not None:
        status["expireTime"] = format_time(expires)
    if r.spec.node_name and not r.status.node_name:
        status["nodeName"] = r.spec.node_name
    if expires is not None and now >= expires:
        message = (
            f"its TTL of {r.spec.ttl} s ran out at {format_time(expires)}"
            + (" unused" if not r.status.owners else "")
            + "; its CPUs are given back"
        )
        status.update(phase="Expired", message=message)
        return ReservationAction(EXPIRED, status, message=message)
    if phase == "Pending" and r.spec.node_name and node_exists is False:
        message = f"node {r.spec.node_name!r} (spec.nodeName) does not exist"
        status.update(phase="Failed", message=message)
        return ReservationAction(FAILED, status, message=message)
    recheck = None if expires is None else max(0.0, (expires - now).total_seconds())
    if status == old:
        return ReservationAction(recheck_after=recheck)
    status.setdefault("phase", phase)
    return ReservationAction(UPDATED, status, recheck_after=recheck)


__all__ = [
    "DELETED",
    "EXPIRED",
    "FAILED",
    "NOTHING",
    "UPDATED",
    "ReservationAction",
    "decide_reservation",
    "node_to_check",
]
