"""`corepin run`, `corepin report`, `corepin reconcile`: standalone host mode (CONTRACTS.md 5).

Argument parsing only; the work happens in `corepin.agent.host`, imported when a command runs
so that `corepin --help` and the other subcommands stay cheap.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

LEVELS = ("cpu", "core", "l3", "numa", "socket")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--state-dir",
        metavar="DIR",
        help="state directory (default: $COREPIN_STATE_DIR or /var/lib/corepin)",
    )
    parser.add_argument(
        "--cgroups",
        choices=("auto", "on", "off"),
        help="also confine runs with cpuset cgroups: auto (default: when the cpuset hierarchy is "
        "writable), on (required), off (affinity only); env COREPIN_CGROUPS",
    )
    parser.add_argument("--cgroup-root", metavar="DIR", help=argparse.SUPPRESS)
    parser.add_argument("--sysfs-root", metavar="DIR", help=argparse.SUPPRESS)


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    if name == "run":
        parser.usage = (
            "corepin run [--exclusive N [--with-shared] | --shared] [--level LEVEL] "
            "[--state-dir DIR] [--policy NAME] -- CMD ARGS..."
        )
        mode = parser.add_mutually_exclusive_group()
        mode.add_argument(
            "--exclusive",
            type=_positive_int,
            metavar="N",
            help="N CPUs for this command alone",
        )
        mode.add_argument(
            "--shared",
            action="store_true",
            help="run in the shared pool (the default): all CPUs no exclusive run holds",
        )
        parser.add_argument(
            "--with-shared",
            action="store_true",
            help="with --exclusive: add the shared pool to the affinity mask",
        )
        parser.add_argument(
            "--level",
            choices=LEVELS,
            default="cpu",
            help="exclusiveness level: withhold whole units of this level (default: cpu)",
        )
        parser.add_argument(
            "--policy",
            metavar="NAME",
            help="allocation policy (default: $COREPIN_POLICY or topology-aware)",
        )
        parser.add_argument(
            "--option",
            action="append",
            default=[],
            metavar="NAME[=VALUE]",
            help="policy option, repeatable",
        )
        parser.add_argument(
            "--name",
            metavar="NAME",
            help="a label for this run in reports (default: the command name)",
        )
        _common(parser)
        parser.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD ARGS...")
    elif name == "report":
        parser.add_argument(
            "-o",
            "--output",
            choices=("table", "json", "yaml", "svg"),
            default="table",
            help="output format (default: table)",
        )
        parser.add_argument("--out", metavar="FILE", help="write the output to FILE")
        _common(parser)
    elif name == "reconcile":
        parser.add_argument("--once", action="store_true", help="one pass, then exit")
        parser.add_argument(
            "--interval",
            type=_positive_float,
            default=10.0,
            metavar="SECONDS",
            help="seconds between passes in loop mode (default: 10)",
        )
        parser.add_argument(
            "-o",
            "--output",
            choices=("text", "json"),
            default="text",
            help="how to print what changed (default: text)",
        )
        _common(parser)
    else:  # pragma: no cover - the dispatcher only passes the three names
        raise ValueError(f"unknown host subcommand {name!r}")


def run(args: Any) -> int:
    from corepin.agent import host as host
    from corepin.agent.settings import HostSettings

    settings = HostSettings.from_args(args, os.environ)
    if args.command == "run":
        return host.cmd_run(settings, args)
    if args.command == "report":
        return host.cmd_report(settings, args)
    return host.cmd_reconcile(settings, args)
