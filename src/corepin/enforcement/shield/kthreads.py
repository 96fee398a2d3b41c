"""Kernel threads under a shield (`--kthreads`): they never move between groups, so the
affinity of the unbound ones is confined to the system set instead; per-CPU kernel threads
(PF_NO_SETAFFINITY, or bound to one CPU) and IRQ threads (they follow their IRQ) are reported
and left. `plan_kernel_threads` decides (pure), `confine_kernel_threads` applies; `off` puts
them back through `AffinityMode.restore`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from corepin.core.cpuset import CPUSet
from corepin.core.record import record
from corepin.enforcement.affinity import AffinityError, ThreadAffinity
from corepin.enforcement.note import Note
from corepin.enforcement.shield.result import ShieldResult, must
from corepin.enforcement.shield.scope import confine
from corepin.state.shield import SavedAffinity, merge_saved
from corepin.sysfs.procfs import ProcessGone, ProcStat

__all__ = ["KthreadPlan", "confine_kernel_threads", "plan_kernel_threads"]


@record
class KthreadPlan:
    """What to do with one kernel thread: `new` affinity, or None with `why` it is left."""

    pid: int
    start_time: int
    comm: str
    old: CPUSet
    new: CPUSet | None
    why: str = ""


def plan_kernel_threads(
    threads: Iterable[tuple[ProcStat, CPUSet]],
    system: CPUSet,
    saved: Mapping[tuple[int, int], CPUSet] | None = None,
) -> list[KthreadPlan]:
    """Plans for kernel threads given as (stat, current affinity). Left alone: threads the
    kernel pins (PF_NO_SETAFFINITY), threads bound to a single CPU (per-CPU threads), IRQ
    threads (`irq/...`: they follow their IRQ). The others get `confine(original, system)`,
    the original being the `saved` one when there is one. Threads already there need nothing
    (`new` equals `old`)."""
    saved = saved or {}
    out: list[KthreadPlan] = []
    for st, current in threads:
        if not st.kernel_thread or not st.alive:
            continue
        original = saved.get((st.pid, st.start_time), current)
        why = ""
        if st.fixed_affinity:
            why = "per-CPU kernel thread: the kernel pins it (PF_NO_SETAFFINITY)"
        elif st.comm.startswith("irq/"):
            why = "IRQ thread: it follows its IRQ's affinity (--irqs)"
        elif len(original) == 1 and (st.pid, st.start_time) not in saved:
            why = f"bound to CPU {original}: a per-CPU kernel thread"
        if why:
            out.append(KthreadPlan(st.pid, st.start_time, st.comm, current, None, why))
            continue
        out.append(KthreadPlan(st.pid, st.start_time, st.comm, current, confine(original, system)))
    return out


def confine_kernel_threads(
    result: ShieldResult,
    system: CPUSet,
    table: Mapping[int, ProcStat],
    members: Iterable[int],
    affinity: ThreadAffinity,
) -> None:
    """Confine the unbound kernel threads among `members` (the scope's tasks) to the system set
    (`plan_kernel_threads`), recording the affinity each had first; the others are noted."""
    record = must(result.record)
    saved = {(t.pid, t.start_time): t.cpus for t in record.kernel_threads}
    inputs = []
    for pid in sorted(set(members)):
        st = table.get(pid)
        if st is None or not st.kernel_thread:
            continue
        try:
            inputs.append((st, affinity.get(pid, pid)))
        except ProcessGone:
            continue
    keep: list[SavedAffinity] = []
    pinned = 0
    for plan in plan_kernel_threads(inputs, system, saved):
        if plan.new is None:
            result.notes.append(Note("left", f"pid {plan.pid}", f"{plan.comm}: {plan.why}"))
            continue
        original = saved.get((plan.pid, plan.start_time), plan.old)
        if plan.new != plan.old:
            try:
                affinity.set(plan.pid, plan.pid, plan.new)
                pinned += 1
            except ProcessGone:
                continue
            except AffinityError as exc:
                result.notes.append(Note("refused", f"pid {plan.pid}", str(exc)))
                continue
        keep.append(SavedAffinity(plan.pid, plan.start_time, original))
    if pinned:
        result.notes.append(Note("pinned", "kernel threads", f"{pinned} confined to CPUs {system}"))
    result.record = record.evolve(kernel_threads=merge_saved(keep, ()))
