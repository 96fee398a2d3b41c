"""`corepin reconcile [--once | --interval SECONDS] [--rebalance]`: free dead allocations,
re-apply drifted pins, repair the shield, and with --rebalance move misaligned exclusive runs
live (the work: `corepin.agent.host.reconcile`, `corepin.agent.host.rebalance`).

Building the parser loads no agent module (`--help` and the other subcommands stay cheap): the
command's imports inside `run` stay there on purpose.
"""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING

from corepin.cli.common import (
    add_host_arguments,
    add_output_argument,
    add_qos_arguments,
    add_reserved_arguments,
    positive_seconds,
    qos_from,
    render_output,
    reserve_from,
    write_output,
)
from corepin.core.errors import InputError

if TYPE_CHECKING:
    from corepin.allocation.rebalance import Move
    from corepin.enforcement.note import Note


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    parser.description = (
        "Free allocations whose processes are gone, re-apply pins that drifted, repair "
        "the shield (resize it, adopt new tasks) and run one node QoS period (best-effort "
        "suppression, CPU burst, resctrl classes and tasks); with --interval, again and "
        "again (a systemd unit in packaging/ runs it)."
    )
    parser.add_argument(
        "--rebalance",
        action="store_true",
        help="also move exclusive runs that span more NUMA nodes, L3 caches or partial "
        "cores than their size needs to better-aligned free CPUs, live (cpuset in place, "
        "memory migrated where the kernel can, every thread re-pinned); one line per move. "
        "Runs on a reservation and runs started with --no-rebalance are never moved",
    )
    parser.add_argument(
        "--rebalance-limit",
        type=_positive_count,
        metavar="N",
        help="with --rebalance: at most N moves a pass, the worst-aligned runs first "
        "(default: every move that helps)",
    )
    parser.add_argument("--once", action="store_true", help="one pass, then exit")
    add_reserved_arguments(parser)
    parser.add_argument(
        "--interval",
        type=positive_seconds,
        default=None,
        metavar="SECONDS",
        help="seconds between passes in loop mode (default: 10; not with --once)",
    )
    add_output_argument(
        parser,
        help="how to print what changed: table (default), json or yaml; with --once one "
        "indented JSON document, in loop mode one JSON document per pass, each on one line "
        "(JSON Lines, for streaming)",
    )
    add_qos_arguments(parser)
    add_host_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from corepin.agent.host.agent import HostAgent
    from corepin.agent.host.qos import HostQos
    from corepin.agent.host.reconcile import QOS_SAMPLE, reconcile_forever, reconcile_once
    from corepin.agent.host.settings import HostSettings

    if args.rebalance_limit is not None and not args.rebalance:
        raise InputError(
            f"--rebalance-limit {args.rebalance_limit} limits the moves of --rebalance: give "
            "--rebalance too",
            reason="bad_usage",
        )
    settings = HostSettings.from_args(args, os.environ)
    policy, resctrl_root = qos_from(args)  # a bad file: exit 2, nothing touched
    agent = HostAgent(settings, reserve=reserve_from(args))
    agent.qos_policy = policy
    agent.resctrl_root = resctrl_root
    loop = HostQos(agent, policy=policy, config=args.qos_config or None, resctrl_root=resctrl_root)

    moves: list[Move] = []

    def moved(made: list[Move]) -> None:
        moves[:] = made

    def show(changes: list[Note]) -> None:
        data: dict[str, object] = {"changes": [c.to_json() for c in changes]}
        if args.rebalance:
            data["moves"] = [m.to_json() for m in moves]

        def table() -> str:
            if changes:
                return "".join(f"{change}\n" for change in changes)
            return "nothing to do\n" if args.once else ""

        text = render_output(args.output, data, table, compact=not args.once)
        if args.output == "yaml" and not args.once:
            text = "---\n" + text  # one YAML document per pass
        if text:
            write_output(text, None)

    if args.once:
        if args.interval is not None:
            raise InputError(
                f"--once runs one pass; --interval {args.interval:g} is for loop mode: give "
                "one or the other",
                reason="bad_usage",
            )
        changes = reconcile_once(
            agent,
            loop,
            sample=QOS_SAMPLE,
            rebalancing=bool(args.rebalance),
            rebalance_limit=args.rebalance_limit,
            moved=moves,
        )
        show(changes)
        return 0
    reconcile_forever(
        agent,
        10.0 if args.interval is None else args.interval,
        show,
        loop,
        rebalancing=bool(args.rebalance),
        rebalance_limit=args.rebalance_limit,
        moved=moved,
    )
    return 0


def _positive_count(text: str) -> int:
    """A whole number >= 1 (argparse names the option and the value when it is not)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}")
    return value
