"""The validating webhook's decision on a `CPUReservation` (pure).

Refused (`status.code` 403, the message naming the field):
- a reservation the wire model (`corepin.kube.models.CPUReservation`) cannot read: both or
  neither of `spec.cpus` and `spec.cpuSet`, a count below 1, a CPU list that is not one, an
  unknown level, no owner, an owner row naming nothing, a bad label selector, a TTL that is no
  duration or out of range, a status phase that is not one;
- an UPDATE that changes the spec once the reservation has left `Pending` (its CPUs are held,
  used or given back: the spec it was held under stays what it was).

Status updates go through the status subresource, which the webhook is not sent
(`is_reservation_request` ignores subresources).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from corepin.api.webhook.review import Outcome
from corepin.kube.models import CPUR_KIND, CPUReservation, FieldError
from corepin.kube.models.cpur import CPUR_PLURAL

GROUP: Final = "corepin.io"


def is_reservation_request(request: Mapping[str, Any]) -> bool:
    """Whether the request creates or updates a CPUReservation (not its status)."""
    if request.get("subResource") or request.get("operation") not in ("CREATE", "UPDATE"):
        return False
    resource, kind = request.get("resource"), request.get("kind")
    if isinstance(resource, Mapping) and resource.get("resource") == CPUR_PLURAL:
        return resource.get("group") == GROUP
    return (
        isinstance(kind, Mapping) and kind.get("kind") == CPUR_KIND and kind.get("group") == GROUP
    )


def validate_reservation(request: Mapping[str, Any]) -> Outcome:
    """The answer to a CREATE or UPDATE of a CPUReservation (see the module docstring)."""
    try:
        new = CPUReservation.from_dict(request.get("object"))
    except FieldError as exc:
        return Outcome(False, f"CPUReservation refused: {exc.message}")
    if request.get("operation") != "UPDATE":
        return Outcome(True)
    try:
        old = CPUReservation.from_dict(request.get("oldObject"))
    except FieldError:
        return Outcome(True)  # an old object it cannot read: judge the new one alone
    phase = old.status.phase
    if phase == "Pending":
        return Outcome(True)
    before, after = old.spec.to_dict(), new.spec.to_dict()
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    if not changed:
        return Outcome(True)
    fields = ", ".join(f"spec.{k}" for k in changed)
    return Outcome(
        False,
        f"CPUReservation {new.name!r} is {phase}: its spec cannot change once it has left "
        f"Pending ({fields} changed); delete it and create a new one instead",
    )


__all__ = ["is_reservation_request", "validate_reservation"]
