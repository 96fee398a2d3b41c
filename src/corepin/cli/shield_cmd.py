"""`corepin shield on|off|status`: keep the tasks corepin does not manage off exclusive CPUs.

Argument parsing and rendering only; the work happens in `corepin.agent.host.agent` (transactions)
and `corepin.enforcement.shield.control` / `corepin.enforcement.shield.engine` (the shield itself).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from typing import Any

ACTIONS = ("on", "off", "status")


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    from corepin.cli.common import add_state_arguments
    from corepin.cli.host_cmd import add_reserved_arguments

    parser.usage = (
        "corepin shield on|off|status [--scope CGROUP] [--kthreads] [--irqs] "
        "[-o table|json|yaml] [--state-dir DIR] [--cgroups auto|on|off]"
    )
    parser.description = (
        "Make exclusive CPUs really exclusive. `on` creates a system cpuset below the scope "
        "(default: the whole cpuset hierarchy) holding the reserved CPUs and the shared pool, "
        "moves every task of the scope that corepin does not manage into it (other groups "
        "below the scope are narrowed in place; corepin's and the kubelet's are left alone), "
        "and from then on every allocation re-sizes it; `corepin reconcile` repairs drift and "
        "adopts new tasks. `off` puts back what it changed. `status` shows it, and every "
        "unmanaged task still allowed on a CPU outside the system set. Where no cpuset "
        "controller is usable the tasks' CPU affinity is confined instead (said so)."
    )
    parser.add_argument("action", choices=ACTIONS, help="on, off or status")
    parser.add_argument(
        "--scope",
        metavar="CGROUP",
        help="with on: the cgroup (a path in the cpuset hierarchy) whose tasks the shield "
        "covers (default: / - the whole hierarchy)",
    )
    parser.add_argument(
        "--kthreads",
        action="store_true",
        help="with on: also confine unbound kernel threads of the scope (per-CPU ones are "
        "left and reported)",
    )
    parser.add_argument(
        "--irqs",
        action="store_true",
        help="with on (whole hierarchy only): also move IRQ affinity off CPUs outside the "
        "system set (IRQs the kernel refuses to move are reported)",
    )
    parser.add_argument(
        "-o",
        "--output",
        choices=("table", "json", "yaml"),
        default="table",
        help="output format (default: table)",
    )
    add_reserved_arguments(parser)
    add_state_arguments(
        parser,
        cgroups_help="how the shield confines tasks: auto (default: a cpuset group when the "
        "cpuset hierarchy is usable, else affinity), on (cpuset required), off (affinity "
        "only); env COREPIN_CGROUPS",
    )
    parser.add_argument("--sysfs-root", metavar="DIR", help=argparse.SUPPRESS)
    parser.add_argument("--proc-root", metavar="DIR", help=argparse.SUPPRESS)


def run(args: Any) -> int:
    from corepin.agent.host.agent import HostAgent
    from corepin.agent.settings import HostSettings
    from corepin.cli.common import dump, write_output
    from corepin.cli.host_cmd import reserve_from
    from corepin.core.errors import InputError

    if args.action != "on":
        for flag, given in (
            ("--scope", args.scope is not None),
            ("--kthreads", args.kthreads),
            ("--irqs", args.irqs),
        ):
            if given:
                raise InputError(
                    f"{flag} applies to `corepin shield on` (the shield remembers it)",
                    reason="bad_usage",
                )
    settings = HostSettings.from_args(args, os.environ)
    agent = HostAgent(settings, reserve=reserve_from(args))
    if args.action == "status":
        data = agent.shield_status()
        text = dump(data, args.output) if args.output != "table" else _status_table(data)
        write_output(text, None)
        return 0
    if args.action == "on":
        from corepin.enforcement.shield.control import normalize_scope

        scope = normalize_scope(args.scope or "")
        result = agent.shield_on(scope=scope, kthreads=bool(args.kthreads), irqs=bool(args.irqs))
        why = agent.shield.why_affinity
        data = _result_data(result, why)
        if result.record is not None and result.record.mode == "affinity":
            import sys

            print(
                f"corepin shield: affinity-only shield ({why}): the tasks' CPU affinity is "
                "confined, which a task may widen again (`corepin reconcile` puts it back)",
                file=sys.stderr,
            )
        exposed: list[Any] = []
        if result.record is not None:
            exposed = agent.shield_status().get("exposed", [])
            data["exposed"] = exposed
        write_output(dump(data, args.output) if args.output != "table" else _notes(data), None)
        if exposed or result.failed:
            from corepin.core.errors import EnvironmentProblem

            pids = ", ".join(str(e["pid"]) for e in exposed[:10])
            raise EnvironmentProblem(
                f"the shield is up but does not cover {len(exposed)} task(s)"
                + (f" (pid {pids}{', ...' if len(exposed) > 10 else ''})" if exposed else "")
                + (f" and {len(result.failed)} change(s) failed" if result.failed else "")
                + ": see above and `corepin shield status`; `corepin shield off` undoes it",
                reason="shield_exposed",
            )
        return 0
    result = agent.shield_off()
    data = _result_data(result, "")
    write_output(dump(data, args.output) if args.output != "table" else _notes(data), None)
    if result.record is not None:
        from corepin.core.errors import EnvironmentProblem

        raise EnvironmentProblem(
            "the shield is not fully down (see above: what could not be undone stays recorded); "
            "`corepin shield off` again once that is fixed",
            reason="shield_left",
        )
    return 0


def _result_data(result: Any, why: str) -> dict[str, Any]:
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


def _notes(data: Mapping[str, Any]) -> str:
    from corepin.core.text import printable
    from corepin.enforcement.note import Note
    from corepin.enforcement.shield.control import notes_text

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


def _status_table(data: Mapping[str, Any]) -> str:
    from corepin.core.text import printable

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
