"""`corepin pin --pid PID`: adopt a running process, pin it and its children (the work:
`corepin.agent.host.adopt`).

Building the parser loads no agent module (`--help` and the other subcommands stay cheap): the
command's imports inside `run` stay there on purpose.
"""

from __future__ import annotations

import argparse
import os

from corepin.cli.common import (
    add_host_arguments,
    add_output_argument,
    add_reserved_arguments,
    cpu_list,
    render_output,
    reserve_from,
    write_output,
)
from corepin.cli.run_cmd import LEVELS, positive_int, spec_from
from corepin.core.text import printable


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    parser.usage = (
        "corepin pin --pid PID [--exclusive N [--with-shared] | --cpus LIST | --shared] "
        "[--level LEVEL] [--option NAME[=VALUE]]... [--name NAME] [--state-dir DIR] "
        "[-o table|json|yaml]"
    )
    parser.description = (
        "Adopt a process that already runs: allocate CPUs for it as `corepin run` would and "
        "pin it, its threads and its children to them. The allocation is freed when the "
        "process and its children are gone (checked by pid and start time), or by "
        "`corepin release ID`. Kernel threads and processes corepin already manages are "
        "refused."
    )
    parser.add_argument("--pid", type=positive_int, required=True, help="the process")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--exclusive", type=positive_int, metavar="N", help="N CPUs of its own")
    mode.add_argument("--cpus", type=cpu_list, metavar="LIST", help="exactly these CPUs")
    mode.add_argument("--shared", action="store_true", help="the shared pool (the default)")
    parser.add_argument(
        "--with-shared",
        action="store_true",
        help="with --exclusive or --cpus: add the shared pool to the affinity mask",
    )
    parser.add_argument("--level", choices=LEVELS, help="exclusiveness level")
    parser.add_argument(
        "--option", action="append", default=[], metavar="NAME[=VALUE]", help="as for run"
    )
    parser.add_argument("--policy", metavar="NAME", help="allocation policy")
    parser.add_argument("--name", metavar="NAME", help="a label in reports")
    add_output_argument(parser, help="how to print the allocation: table (default), json or yaml")
    add_reserved_arguments(parser)
    add_host_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from corepin.agent.host.adopt import pin_process
    from corepin.agent.host.agent import HostAgent
    from corepin.agent.host.settings import HostSettings

    settings = HostSettings.from_args(args, os.environ)
    spec = spec_from(args)
    agent = HostAgent(settings, reserve=reserve_from(args))
    a = pin_process(agent, args.pid, spec, name=args.name)
    data = {
        "id": a.id,
        "pid": a.pid,
        "kind": a.kind,
        "cpus": str(a.cpus),
        "withheld": str(a.withheld),
        "mems": str(a.mems),
    }
    what = f"CPUs {a.cpus}" if a.holds else "the shared pool"
    line = printable(f"pinned pid {a.pid} ({a.label}) as {a.id}: {a.kind}, {what}") + "\n"
    write_output(render_output(args.output, data, lambda: line), None)
    return 0
