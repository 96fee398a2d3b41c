"""IRQs under a shield (`--irqs`, whole hierarchy only: IRQs are not scoped): each IRQ's
affinity (/proc/irq/N/smp_affinity_list) and /proc/irq/default_smp_affinity are confined to the
system set; IRQs the kernel refuses to move (per-CPU, managed) are reported and left, and `off`
puts back the ones still as the shield left them. `plan_irqs` decides (pure), `confine_irqs`
and `restore_irqs` apply through an `IrqWriter`.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Mapping

from corepin.core.cpuset import CPUSet
from corepin.core.errors import SysfsError
from corepin.core.record import record
from corepin.enforcement.note import Note
from corepin.enforcement.shield.result import ShieldResult, must
from corepin.enforcement.shield.scope import confine
from corepin.state.shield import SavedIrq, ShieldRecord

__all__ = [
    "IrqPlan",
    "IrqWriter",
    "confine_irqs",
    "irq_writer",
    "plan_irqs",
    "read_irqs",
    "restore_irqs",
]


@record
class IrqPlan:
    irq: str
    old: CPUSet
    new: CPUSet


def plan_irqs(
    current: Mapping[str, CPUSet], system: CPUSet, saved: Mapping[str, CPUSet] | None = None
) -> list[IrqPlan]:
    """Every IRQ (and `default`) confined to the system set from its original affinity (the
    `saved` one, else the current one); IRQs already there are omitted."""
    saved = saved or {}
    out = []
    for irq in sorted(current, key=_irq_order):
        new = confine(saved.get(irq, current[irq]), system)
        if new != current[irq]:
            out.append(IrqPlan(irq, current[irq], new))
    return out


def _irq_order(irq: str) -> tuple[int, int]:
    return (0, int(irq)) if irq.isdigit() else (1, 0)


def read_irqs(proc_root: str) -> dict[str, CPUSet]:
    """IRQ number -> affinity (`<proc>/irq/N/smp_affinity_list`), and `default` ->
    `<proc>/irq/default_smp_affinity` (a mask). Unreadable entries are skipped."""
    base = os.path.join(proc_root, "irq")
    out: dict[str, CPUSet] = {}
    try:
        names = os.listdir(base)
    except OSError as exc:
        raise SysfsError(base, f"cannot list: {exc.strerror or exc}") from exc
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(os.path.join(base, name, "smp_affinity_list"), encoding="ascii") as f:
                out[name] = CPUSet.parse(f.read().strip())
        except (OSError, ValueError, UnicodeDecodeError):
            continue
    try:
        with open(os.path.join(base, "default_smp_affinity"), encoding="ascii") as f:
            out["default"] = CPUSet.from_mask(f.read().strip())
    except (OSError, ValueError, UnicodeDecodeError):
        pass
    return out


IrqWriter = Callable[[str, CPUSet], None]


def irq_writer(proc_root: str) -> IrqWriter:
    """Writes an IRQ's affinity under `proc_root`; OSError when the kernel refuses."""

    def write(irq: str, cpus: CPUSet) -> None:
        base = os.path.join(proc_root, "irq")
        if irq == "default":
            path, text = os.path.join(base, "default_smp_affinity"), cpus.to_mask()
        else:
            path, text = os.path.join(base, irq, "smp_affinity_list"), str(cpus)
        fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
        try:
            os.write(fd, text.encode("ascii"))
        finally:
            os.close(fd)

    return write


def confine_irqs(result: ShieldResult, system: CPUSet, proc_root: str, write: IrqWriter) -> None:
    """Confine every IRQ (and the default affinity) to the system set through `write`,
    recording the affinity each had first; refusals are noted, and so is an IRQ that took
    the write but stays where it was (read back)."""
    record = must(result.record)
    saved = {i.irq: i.cpus for i in record.irq_affinity}
    current = read_irqs(proc_root)
    keep = {irq: cpus for irq, cpus in saved.items() if irq in current}
    written: list[IrqPlan] = []
    for plan in plan_irqs(current, system, saved):
        try:
            write(plan.irq, plan.new)
        except OSError as exc:
            what = errno.errorcode.get(exc.errno or 0, str(exc.errno))
            result.notes.append(
                Note(
                    "refused",
                    f"irq {plan.irq}",
                    f"the kernel keeps it on CPUs {plan.old} ({what}: {exc.strerror})",
                )
            )
            continue
        keep.setdefault(plan.irq, plan.old)
        written.append(plan)
    # some IRQs take the write and stay where they were (the timer and the cascade of a
    # legacy PIC, say): read back, and say so
    after = read_irqs(proc_root) if written else {}
    moved = 0
    for plan in written:
        now = after.get(plan.irq, plan.new)
        if now - system and now == plan.old:
            result.notes.append(
                Note(
                    "refused",
                    f"irq {plan.irq}",
                    f"the kernel accepted CPUs {plan.new} but keeps it on CPUs {now}",
                )
            )
        else:
            moved += 1
    if moved:
        result.notes.append(Note("moved", "irqs", f"{moved} IRQ(s) to CPUs {system}"))
    result.record = record.evolve(
        irq_affinity=tuple(SavedIrq(k, v) for k, v in sorted(keep.items()))
    )


def restore_irqs(
    record: ShieldRecord, system: CPUSet, notes: list[Note], proc_root: str, write: IrqWriter
) -> ShieldRecord:
    """Put back the saved affinity of every IRQ that still has the one the shield gave it;
    one changed since keeps what it has (noted). The record keeps what could not be put back."""
    current = read_irqs(proc_root)
    left = []
    for saved in record.irq_affinity:
        now = current.get(saved.irq)
        if now is None or now == saved.cpus:
            continue
        if now != confine(saved.cpus, system):
            notes.append(Note("left", f"irq {saved.irq}", f"changed since (CPUs {now}): kept"))
            continue
        try:
            write(saved.irq, saved.cpus)
            notes.append(Note("restored", f"irq {saved.irq}", f"CPUs {saved.cpus}"))
        except OSError as exc:
            notes.append(Note("failed", f"irq {saved.irq}", str(exc)))
            left.append(saved)
    return record.evolve(irq_affinity=tuple(left))
