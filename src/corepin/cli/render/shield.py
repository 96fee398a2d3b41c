"""What `corepin shield on|off|status` prints: the data of a shield's result (`result_data`,
printed as JSON or YAML), and the tables of its notes and of its status."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from corepin.core.text import printable
from corepin.enforcement.note import Note
from corepin.enforcement.shield.control import notes_text

if TYPE_CHECKING:
    from corepin.enforcement.shield.result import ShieldResult


def result_data(result: ShieldResult, why: str) -> dict[str, Any]:
    record = result.record
    data: dict[str, Any] = {
        "on": record is not None,
        "notes": [n.to_json() for n in result.notes],
        "counts": {},
    }
    for n in result.notes:
        data["counts"][n.action] = data["counts"].get(n.action, 0) + 1
    if record is not None:
        data.update(
            {
                "scope": "/" + record.scope,
                "mode": record.mode,
                "cgroup_version": record.cgroup_version or None,
                "why_affinity": why or None,
                "system_group": ("/" + record.system_group) if record.mode == "cpuset" else None,
            }
        )
    return data


def notes_table(data: Mapping[str, Any]) -> str:
    lines = []
    if data["on"]:
        if data["mode"] == "cpuset":
            lines.append(
                printable(
                    f"shield on: scope {data['scope']}, cgroup v{data['cgroup_version']} "
                    f"cpuset {data['system_group']}"
                )
            )
        else:
            lines.append(printable(f"shield on: scope {data['scope']}, affinity only"))
    notes = [Note(n["action"], n["target"], n["detail"]) for n in data["notes"]]
    lines.extend(notes_text(notes))
    if not data["on"]:
        lines.append("shield off")
    return "\n".join(lines) + "\n"


def status_table(data: Mapping[str, Any]) -> str:
    if not data["on"]:
        return (
            f"shield: off\nsystem set would be: CPUs {data['system_cpus'] or '(none)'} "
            f"(reserved {data['reserved'] or '-'}, shared pool {data['shared_pool'] or '-'})\n"
        )
    rows = [
        ("shield", "on"),
        ("scope", data["scope"]),
        (
            "mode",
            f"cgroup v{data['cgroup_version']} cpuset" if data["mode"] == "cpuset" else "affinity",
        ),
        ("system set", f"CPUs {data['system_cpus'] or '(none)'}"),
        ("exclusive", data["exclusive_cpus"] or "-"),
        ("reserved", data["reserved"] or "-"),
    ]
    live = data.get("live", {})
    if "system_group" in live:
        rows.append(
            (
                "system group",
                f"{live['system_group']}: CPUs {live.get('system_group_cpus', '?')}, "
                f"{live.get('system_group_tasks', '?')} task(s)",
            )
        )
    if "system_group_error" in live:
        rows.append(("system group", live["system_group_error"]))
    rows.append(("moved tasks", str(data["moved_tasks"])))
    if data["restricted_groups"]:
        rows.append(("narrowed groups", ", ".join(data["restricted_groups"])))
    if data["mode"] == "affinity":
        rows.append(("pinned tasks", str(data["pinned_tasks"])))
    if data["kthreads"]:
        rows.append(("kernel threads", f"{data['pinned_kernel_threads']} confined"))
    if data["irqs"]:
        kept = data.get("irqs_kept") or []
        what = ", ".join(f"{k['irq']} on {k['cpus']}" for k in kept[:10])
        rows.append(
            (
                "IRQs",
                f"{data['moved_irqs']} moved"
                + (
                    f"; the kernel keeps {len(kept)} outside the system set: {what}" if kept else ""
                ),
            )
        )
    exposed = data["exposed"]
    rows.append(("exposed tasks", str(len(exposed)) + (" (none: good)" if not exposed else "")))
    width = max(len(k) for k, _ in rows)
    lines = [printable(f"{k.ljust(width)}  {v}") for k, v in rows]
    for item in exposed[:20]:
        where = (
            f"may run on CPUs {item['cpus']}" if item.get("cpus") else item.get("why", "exposed")
        )
        lines.append(printable(f"  pid {item['pid']} tid {item['tid']} ({item['comm']}) {where}"))
    if len(exposed) > 20:
        lines.append(f"  ... and {len(exposed) - 20} more")
    return "\n".join(lines) + "\n"
