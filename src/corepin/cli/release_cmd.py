"""`corepin release ID [--kill]`: end an allocation on purpose (the work:
`corepin.agent.host.release`).

Building the parser loads no agent module (`--help` and the other subcommands stay cheap): the
command's imports inside `run` stay there on purpose.
"""

from __future__ import annotations

import argparse
import os

from corepin.cli.common import add_host_arguments, add_output_argument, render_output, write_output


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    parser.description = (
        "End an allocation on purpose: free its CPUs. Without --kill, processes of it that "
        "still run move to the shared pool (tracked until they exit); with --kill they get "
        "SIGTERM, then SIGKILL after a grace period."
    )
    parser.add_argument("id", metavar="ID", help="the allocation id (see `corepin report`)")
    parser.add_argument(
        "--kill", action="store_true", help="end the run's processes, then free its CPUs"
    )
    add_output_argument(parser, help="how to print what changed: table (default), json or yaml")
    add_host_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from corepin.agent.host.agent import HostAgent
    from corepin.agent.host.release import release
    from corepin.agent.host.settings import HostSettings

    settings = HostSettings.from_args(args, os.environ)
    changes = release(HostAgent(settings), args.id, kill=bool(args.kill))
    data = {"changes": [c.to_json() for c in changes]}
    write_output(render_output(args.output, data, lambda: "".join(f"{c}\n" for c in changes)), None)
    return 0
