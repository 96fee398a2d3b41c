"""What enforcement reports: `Note` for people, `Change` for one write with its values.

`Note`: one thing enforcement did, left alone or could not do, as the reports show it. Host
mode's reconcile and pool changes, the shield, and the pinning of a run all report through this
one shape: `action` on `target`, with `detail`.

Actions used: moved, restricted, pinned, restored, created, removed, resized (done); left (not
touched on purpose: a kernel thread, a per-CPU one, a group changed by someone else); refused
(the kernel said no: reported, not an error); failed (an error).

`Change`: one write (a cgroup file, a directory made, a thread's affinity, a resctrl schemata
line) with the value before and after, as the reconcile engine, the thread-affinity walk and
the resctrl writer record it. It stays its own shape because it carries what a `Note` does not
- the old and the new value, why the write was ordered as it was, whose target it served - and
because its JSON (in `ReconcileReport.to_json`) is a form kept as it is. Whoever reports to
people turns it into a `Note` with words of their own (host pinning, the shield).
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


@record
class Change:
    """One write (or, in a dry run, one write that would happen)."""

    #: mkdir | cpuset.cpus | cpuset.mems | cpu.max | cpu.cfs_quota_us | affinity | schemata |
    #: tasks
    what: str
    #: relative cgroup path, "pid <pid> tid <tid>", or "resctrl/<class>"
    path: str
    old: str
    new: str
    why: str = "target"  # target | widen-ancestor | widen-first | shrink-child | create
    owner: str = ""  # the target's owner, for affinity changes

    def to_json(self) -> dict[str, str]:
        return {
            "what": self.what,
            "path": self.path,
            "old": self.old,
            "new": self.new,
            "why": self.why,
        }
