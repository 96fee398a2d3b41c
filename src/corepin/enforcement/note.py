"""`Note`: one thing enforcement did, left alone or could not do, as the reports show it.

Host mode's reconcile and pool changes, the shield, and the pinning of a run all report
through this one shape: `action` on `target`, with `detail`.

Actions used: moved, restricted, pinned, restored, created, removed, resized (done); left (not
touched on purpose: a kernel thread, a per-CPU one, a group changed by someone else); refused
(the kernel said no: reported, not an error); failed (an error).
"""

from __future__ import annotations

from corepin.core.record import record
from corepin.core.text import printable


@record
class Note:
    """One thing done, left or refused: `action` on `target`, with `detail`."""

    action: str
    target: str
    detail: str

    def to_json(self) -> dict[str, str]:
        return {"action": self.action, "target": self.target, "detail": self.detail}

    def __str__(self) -> str:
        return printable(f"{self.action} {self.target}: {self.detail}")
