"""`corepin shield on|off|status`: keep the tasks corepin does not manage off exclusive CPUs.

Argument parsing only; the work happens in `corepin.agent.host.shield` (transactions) and
`corepin.enforcement.shield.control` / `corepin.enforcement.shield.engine` (the shield itself),
the output in `corepin.cli.render.shield`.

Building the parser loads no agent module (`--help` and the other subcommands stay cheap): the
command's imports inside `run` stay there on purpose.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from corepin.cli.common import (
    add_host_arguments,
    add_output_argument,
    add_reserved_arguments,
    missing_state_dir,
    render_output,
    reserve_from,
    write_output,
)
from corepin.core.errors import EnvironmentProblem, InputError

ACTIONS = ("on", "off", "status")


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
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
    add_output_argument(parser)
    add_reserved_arguments(parser)
    add_host_arguments(
        parser,
        cgroups_help="how the shield confines tasks: auto (default: a cpuset group when the "
        "cpuset hierarchy is usable, else affinity), on (cpuset required), off (affinity "
        "only); env COREPIN_CGROUPS",
    )


def run(args: argparse.Namespace) -> int:
    from corepin.agent.host.agent import HostAgent
    from corepin.agent.host.settings import HostSettings
    from corepin.agent.host.shield import shield_off, shield_on, shield_status
    from corepin.cli.render.shield import notes_table, result_data, status_table

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
        missing = missing_state_dir(settings.state_dir)
        data = shield_status(agent)
        text = render_output(args.output, data, lambda: status_table(data))
        if missing and args.output == "table":
            text += f"({missing})\n"
        write_output(text, None)
        return 0
    if args.action == "on":
        from corepin.enforcement.shield.control import normalize_scope

        scope = normalize_scope(args.scope or "")
        result = shield_on(agent, scope=scope, kthreads=bool(args.kthreads), irqs=bool(args.irqs))
        why = agent.shield.why_affinity
        data = result_data(result, why)
        if result.record is not None and result.record.mode == "affinity":
            print(
                f"corepin shield: affinity-only shield ({why}): the tasks' CPU affinity is "
                "confined, which a task may widen again (`corepin reconcile` puts it back)",
                file=sys.stderr,
            )
        exposed: list[Any] = []
        if result.record is not None:
            exposed = shield_status(agent).get("exposed", [])
            data["exposed"] = exposed
        write_output(render_output(args.output, data, lambda: notes_table(data)), None)
        if exposed or result.failed:
            pids = ", ".join(str(e["pid"]) for e in exposed[:10])
            raise EnvironmentProblem(
                f"the shield is up but does not cover {len(exposed)} task(s)"
                + (f" (pid {pids}{', ...' if len(exposed) > 10 else ''})" if exposed else "")
                + (f" and {len(result.failed)} change(s) failed" if result.failed else "")
                + ": see above and `corepin shield status`; `corepin shield off` undoes it",
                reason="shield_exposed",
            )
        return 0
    result = shield_off(agent)
    data = result_data(result, "")
    write_output(render_output(args.output, data, lambda: notes_table(data)), None)
    if result.record is not None:
        raise EnvironmentProblem(
            "the shield is not fully down (see above: what could not be undone stays recorded); "
            "`corepin shield off` again once that is fixed",
            reason="shield_left",
        )
    return 0
