"""`corepin reserve NAME (--cpus N | --cpu-list LIST) [--level L] [--ttl SECONDS] [--reusable]`
and `corepin reserve --delete NAME`: hold CPUs on this host for a run to come (`corepin run
--reservation NAME`), or end a reservation (the work: `corepin.agent.host.reserve`).

Building the parser loads no agent module (`--help` and the other subcommands stay cheap): the
command's imports inside `run` stay there on purpose.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from corepin.cli.common import (
    add_host_arguments,
    add_output_argument,
    cpu_list,
    positive_seconds,
    render_output,
    write_output,
)
from corepin.cli.run_cmd import LEVELS, positive_int
from corepin.core.errors import InputError


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    parser.usage = (
        "corepin reserve NAME (--cpus N | --cpu-list LIST) [--level LEVEL] [--ttl SECONDS] "
        "[--reusable] [-o table|json|yaml] [--state-dir DIR]\n"
        "       corepin reserve --delete NAME [--state-dir DIR]"
    )
    parser.description = (
        "Hold CPUs for a run that has not started yet: no other run gets them (they leave "
        "the free set and the shared pool at once), and `corepin run --reservation NAME` "
        "gets exactly them. --cpus N chooses N CPUs by topology with the host's policy at "
        "the level, as a run would get them; --cpu-list takes exactly those (exit 3 naming "
        "who holds one that is not free). A reservation is used up by its first run unless "
        "--reusable, ends after --ttl SECONDS (a run on it then keeps its CPUs), and "
        "`corepin report` lists it."
    )
    parser.epilog = (
        "Exit codes: 0 reserved (or deleted), 2 bad name, list, level or ttl (or a name "
        "already taken), 3 the CPUs are not free."
    )
    parser.add_argument("name", nargs="?", metavar="NAME", help="the reservation's name")
    what = parser.add_mutually_exclusive_group()
    what.add_argument(
        "--cpus",
        type=positive_int,
        metavar="N",
        help="N CPUs chosen by topology (the host's policy, at --level)",
    )
    what.add_argument(
        "--cpu-list",
        type=cpu_list,
        metavar="LIST",
        help="exactly these CPUs (with the rest of their units of --level)",
    )
    what.add_argument(
        "--delete",
        metavar="NAME",
        help="end the reservation NAME (a run on its CPUs keeps them as its own)",
    )
    parser.add_argument(
        "--level",
        choices=LEVELS,
        default="cpu",
        help="exclusiveness level of the reservation and of the run that gets it: withhold "
        "whole units of this level (default: cpu)",
    )
    parser.add_argument(
        "--ttl",
        type=positive_seconds,
        metavar="SECONDS",
        help="the reservation ends after SECONDS (default: never)",
    )
    parser.add_argument(
        "--reusable",
        action="store_true",
        help="the CPUs come back to the reservation when its run ends (default: the first "
        "run uses it up)",
    )
    parser.add_argument(
        "--policy",
        metavar="NAME",
        help="allocation policy choosing --cpus N (default: $COREPIN_POLICY or topology-aware)",
    )
    add_output_argument(parser)
    add_host_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from corepin.agent.host.agent import HostAgent
    from corepin.agent.host.reserve import delete, reservation_row, reserve
    from corepin.agent.host.settings import HostSettings

    if args.delete is not None:
        if args.name is not None:
            raise InputError(
                f"--delete {args.delete} names the reservation: leave out NAME {args.name!r}",
                reason="bad_usage",
            )
        if args.ttl is not None or args.reusable or args.level != "cpu":
            raise InputError(
                "--ttl, --reusable and --level describe a new reservation, not --delete",
                reason="bad_usage",
            )
        settings = HostSettings.from_args(args, os.environ)
        gone = delete(HostAgent(settings), args.delete)
        _show(
            args.output,
            {"deleted": reservation_row(gone)},
            f"deleted reservation {gone.name} (CPUs {gone.cpus})",
        )
        return 0
    if args.name is None:
        raise InputError(
            "no reservation name given: `corepin reserve NAME --cpus N` (or --cpu-list "
            "LIST), `corepin reserve --delete NAME`",
            reason="bad_usage",
        )
    if args.cpus is None and args.cpu_list is None:
        raise InputError(
            f"reservation {args.name!r}: give --cpus N or --cpu-list LIST", reason="bad_usage"
        )
    settings = HostSettings.from_args(args, os.environ)
    made = reserve(
        HostAgent(settings),
        args.name,
        count=args.cpus,
        cpus=args.cpu_list,
        level=args.level,
        ttl=args.ttl,
        reusable=bool(args.reusable),
    )
    row = reservation_row(made)
    _show(args.output, row, _table([row]))
    return 0


def _table(rows: list[dict[str, Any]]) -> str:
    """Reservations as a table: NAME CPUS WITHHELD LEVEL REUSABLE EXPIRES USED-BY."""
    from corepin.cli.render.report import reservation_lines

    return "\n".join(reservation_lines(rows, title=False))


def _show(fmt: str, data: dict[str, Any], text: str) -> None:
    write_output(render_output(fmt, data, lambda: text + "\n"), None)
