"""`ShieldResult`: what one call of the shield's engine did.

Not a `ReconcileReport` nor a list of `Note`s alone: besides the notes (`corepin.enforcement.
note.Note`, the report every enforcement step gives people) it carries the updated
`ShieldRecord`, which the caller commits to the state with the pools it follows (and which,
while a shield is being raised, is kept up to date step by step so that a failure half-way can
be taken back).
"""

from __future__ import annotations

from corepin.core.record import field, record
from corepin.enforcement.note import Note
from corepin.state.shield import ShieldRecord

__all__ = ["ShieldResult", "must"]


@record(frozen=False, slots=False)
class ShieldResult:
    """What one engine call did: the updated record and the notes."""

    record: ShieldRecord | None
    notes: list[Note] = field(default_factory=list)

    def count(self, action: str) -> int:
        return sum(1 for n in self.notes if n.action == action)

    @property
    def failed(self) -> list[Note]:
        return [n for n in self.notes if n.action == "failed"]


def must(record: ShieldRecord | None) -> ShieldRecord:
    """The record of a result that has one (every result but `off`'s when all is undone)."""
    assert record is not None
    return record
