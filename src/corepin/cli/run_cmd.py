"""`corepin run`: run a command pinned to exclusive or shared CPUs (the work:
`corepin.agent.host.run`); and the request options `run` and `pin` share (`spec_from`).

On the start-up path of `corepin run`: the imports inside functions stay there on purpose (each
module loaded costs every run its time; building the parser loads no agent module at all).
"""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING

from corepin.cli.common import (
    add_host_arguments,
    add_near_arguments,
    add_qos_arguments,
    add_reserved_arguments,
    cpu_list,
    near_names,
    qos_from,
    reserve_from,
)

if TYPE_CHECKING:
    from corepin.agent.host.run import RunSpec
    from corepin.enforcement.mempolicy import MemoryPolicy

#: The exclusiveness levels (`corepin.allocation.types.LEVELS`, which the parser does not load).
LEVELS = ("cpu", "core", "l3", "numa", "socket")


def positive_int(text: str) -> int:
    """argparse type: a positive integer (the message names the bad value)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _wait_seconds(text: str) -> float:
    """argparse type of --wait: seconds >= 0 (0: try once more after queueing)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"expected a number of seconds >= 0, got {text!r}")
    return value


def _memory_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--membind",
        type=cpu_list,
        metavar="NODES",
        help="allocate memory only on these NUMA nodes (numactl --membind); default: the "
        "nodes of the run's CPUs",
    )
    group.add_argument(
        "--interleave",
        type=cpu_list,
        metavar="NODES",
        help="interleave memory page by page across these NUMA nodes (numactl --interleave)",
    )
    group.add_argument(
        "--preferred",
        type=cpu_list,
        metavar="NODE",
        help="allocate memory on this NUMA node first, on others when it is full "
        "(numactl --preferred)",
    )


def _memory_from(args: argparse.Namespace) -> MemoryPolicy | None:
    from corepin.core.errors import InputError

    for mode, attr in (
        ("bind", "membind"),
        ("interleave", "interleave"),
        ("preferred", "preferred"),
    ):
        nodes = getattr(args, attr, None)
        if nodes is None:
            continue
        if not nodes:
            raise InputError(f"--{attr} names no NUMA node", reason="bad_nodes")
        if mode == "preferred" and len(nodes) != 1:
            raise InputError(
                f"--preferred takes one NUMA node, not {nodes} (use --interleave or --membind "
                "for several)",
                reason="bad_nodes",
            )
        from corepin.enforcement.mempolicy import MemoryPolicy

        return MemoryPolicy(mode, nodes)
    return None


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    parser.usage = (
        "corepin run [--exclusive N [--with-shared] | --cpus LIST | --reservation NAME | --shared] "
        "[--level LEVEL] [--near DEVICE [--near-strict]]... [--option NAME[=VALUE]]... "
        "[--partition root|isolated] [--no-rebalance] "
        "[--wait [SECONDS]] [--membind NODES | --interleave NODES | --preferred NODE] "
        "[--reserved-cpus CPUSET | --reserved-count N] [--qos-class CLASS] "
        "[--qos-config FILE] [--resctrl-root DIR] [--state-dir DIR] [--policy NAME] "
        "-- CMD ARGS..."
    )
    parser.description = (
        "Run CMD pinned to CPUs of its own (--exclusive N) or to the shared pool. The "
        "allocation is held while any process of the run lives (a daemon CMD leaves behind "
        "keeps it: `corepin report` shows it as lingering, `corepin release ID` ends it); "
        "corepin exits with CMD's exit code."
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--exclusive",
        type=positive_int,
        metavar="N",
        help="N CPUs for this command alone",
    )
    mode.add_argument(
        "--cpus",
        type=cpu_list,
        metavar="LIST",
        help="exactly these CPUs, for this command alone (exit 3 naming the holder when "
        "one is taken)",
    )
    mode.add_argument(
        "--reservation",
        metavar="NAME",
        help="run on exactly the CPUs of this reservation (`corepin reserve`), at its level; "
        "a one-time reservation ends when the run does (--reusable ones come back); exit 3 "
        "when it is not there (deleted, expired, used up) or another run is on it",
    )
    mode.add_argument(
        "--shared",
        action="store_true",
        help="run in the shared pool (the default): all CPUs no exclusive run holds",
    )
    parser.add_argument(
        "--with-shared",
        action="store_true",
        help="with --exclusive or --cpus: add the shared pool to the affinity mask",
    )
    parser.add_argument(
        "--wait",
        type=_wait_seconds,
        nargs="?",
        const=float("inf"),
        metavar="SECONDS",
        help="when the CPUs are not free, queue for them (in arrival order) instead of "
        "exiting 3; give up after SECONDS (default: no limit)",
    )
    _memory_arguments(parser)
    add_reserved_arguments(parser)
    parser.add_argument(
        "--level",
        choices=LEVELS,
        help="exclusiveness level: withhold whole units of this level (default: cpu)",
    )
    add_near_arguments(parser)
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
        help="request or policy option as `corepin allocate` takes it, repeatable: "
        "level=, smt=auto|whole-cores|spread, numa=NODES, "
        "workload=memory-bound|cpu-bound|io-bound|best-effort, prefer-isolated=, "
        "allow-isolated (shared runs), and the policy's own options",
    )
    parser.add_argument(
        "--partition",
        choices=("root", "isolated"),
        help="with --exclusive on cgroup v2: make the run's cpuset a partition of this "
        "kind, so no other process of the host runs on its CPUs (isolated: also outside "
        "the scheduler's load balancing); a partition the kernel refuses is reported and "
        "the run keeps a plain cpuset",
    )
    parser.add_argument(
        "--no-rebalance",
        action="store_true",
        help="never move this run to better-aligned CPUs (`corepin reconcile --rebalance` "
        "leaves it where it is; runs on a reservation are never moved either)",
    )
    parser.add_argument(
        "--name",
        metavar="NAME",
        help="a label for this run in reports (default: the command name)",
    )
    parser.add_argument(
        "--qos-class",
        metavar="CLASS",
        help="the run's node QoS class: LSE, LSR, LS, BE or SYSTEM (default: LSE for "
        "--exclusive and --cpus, LS for shared runs); BE only for shared runs, which then "
        "run in the best-effort group that `corepin reconcile` squeezes",
    )
    add_qos_arguments(parser)
    add_host_arguments(parser)
    parser.add_argument(
        "cmd",
        nargs=argparse.REMAINDER,
        metavar="-- CMD ARGS...",
        help="the command to run, after `--`",
    )


def spec_from(args: argparse.Namespace) -> RunSpec:
    """The RunSpec of `run` and `pin` from their options (InputError for bad combinations)."""
    from corepin.agent.host.run import RunSpec
    from corepin.allocation.api import parse_options
    from corepin.core.errors import InputError

    reservation = getattr(args, "reservation", None)  # `run` only
    owned = args.exclusive is not None or args.cpus is not None or reservation is not None
    if args.with_shared and not owned:
        raise InputError(
            "--with-shared needs --exclusive N, --cpus LIST or --reservation NAME",
            reason="bad_usage",
        )
    if reservation is not None:
        from corepin.state.reservations import check_name

        check_name(reservation, "--reservation")
    options = parse_options(args.option)
    if args.level is not None:
        if "level" in options:
            raise InputError(
                f"the level is given twice: --level {args.level} and --option "
                f"level={options['level']}",
                reason="bad_option",
            )
        if args.exclusive is None:
            raise InputError("--level applies to --exclusive runs only", reason="bad_usage")
        options["level"] = args.level
    if "shared" in options:
        raise InputError(
            "use --shared (not --option shared) for a run in the shared pool", reason="bad_option"
        )
    if args.cpus is not None and not args.cpus:
        raise InputError("--cpus names no CPU", reason="bad_usage")
    partition = getattr(args, "partition", None)  # `run` only
    if partition is not None and (not owned or args.with_shared):
        raise InputError(
            "--partition applies to exclusive runs (--exclusive N, --cpus LIST or "
            "--reservation NAME) without --with-shared only",
            reason="bad_usage",
        )
    near = near_names(args)  # `run` only
    if near and args.exclusive is None:
        raise InputError(
            "--near applies to --exclusive runs only (a shared run runs on the whole shared "
            "pool; --cpus names the CPUs itself)",
            reason="bad_usage",
        )
    qos = getattr(args, "qos_class", None)  # `run` only
    if qos is not None:
        from corepin.core.qos import check_class

        qos = check_class(qos, "--qos-class")
    return RunSpec(
        qos=qos,
        exclusive=args.exclusive,
        with_shared=bool(args.with_shared),
        options=options,
        partition=partition,
        cpus=args.cpus,
        memory=_memory_from(args),
        near=near,
        near_strict=bool(getattr(args, "near_strict", False)),
        reservation=reservation,
        rebalance=not getattr(args, "no_rebalance", False),
    )


def run(args: argparse.Namespace) -> int:
    from corepin.agent.host.agent import HostAgent
    from corepin.agent.host.run import Runner
    from corepin.agent.host.settings import HostSettings
    from corepin.core.errors import InputError

    settings = HostSettings.from_args(args, os.environ)
    argv = list(args.cmd or [])
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        raise InputError(
            "no command given: use `corepin run [options] -- CMD ARGS...`",
            reason="missing_command",
        )
    spec = spec_from(args)
    policy, resctrl_root = qos_from(args)
    agent = HostAgent(settings, reserve=reserve_from(args))
    agent.qos_policy = policy
    agent.resctrl_root = resctrl_root
    return Runner(agent).run(argv, spec, name=args.name, wait=args.wait)
