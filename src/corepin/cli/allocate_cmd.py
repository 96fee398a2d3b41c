"""`corepin allocate`: one allocation decision, no side effects.

`--near DEVICE` names devices of the topology (`--topology FILE`'s `devices`, or those found
under `--sysfs-root`): their CPUs become the request's `near` option (`corepin.allocation.near`).
"""

from __future__ import annotations

import argparse
import sys

from corepin.cli.common import (
    add_near_arguments,
    add_output_argument,
    add_topology_source,
    list_machines,
    load_topology,
    near_names,
    near_options,
    render_output,
    write_output,
)
from corepin.core.errors import EXIT_OK, EXIT_UNSATISFIABLE, AllocationError, RequestError


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    add_topology_source(parser, machine=True)
    parser.add_argument(
        "--count",
        metavar="N",
        help="number of CPUs (a positive integer; required)",
    )
    parser.add_argument(
        "--available",
        metavar="CPUSET",
        default=None,
        help="CPUs to choose from, Linux list form (default: every online CPU)",
    )
    parser.add_argument(
        "--policy",
        default="topology-aware",
        metavar="NAME",
        help="topology-aware (default), kubelet-static or workload-aware",
    )
    parser.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="NAME[=VALUE]",
        help="request or policy option, repeatable: level=cpu|core|l3|numa|socket, "
        "workload=memory-bound|cpu-bound|io-bound|best-effort, smt=auto|whole-cores|spread, "
        "numa=NODES, prefer-isolated=false, shared; kubelet-static: full-pcpus-only, "
        "distribute-cpus-across-numa, distribute-cpus-across-cores, "
        "prefer-align-cpus-by-uncorecache, align-by-socket",
    )
    add_near_arguments(parser)
    add_output_argument(
        parser,
        help="table (default: the CPU list), json or yaml (cpus, mems, reserved, policy, "
        "explanation)",
    )


def parse_count(text: str) -> int:
    body = text.strip()
    if not body.lstrip("+").isdigit() or not body.isascii():
        raise RequestError(f"--count {text!r} is not a positive integer", reason="bad_count")
    value = int(body)
    if value <= 0:
        raise RequestError(f"--count {text!r} is not a positive integer", reason="bad_count")
    return value


#: Request options that only shape exclusive requests (a shared one gets the whole pool).
EXCLUSIVE_ONLY = ("level", "smt", "numa", "workload", "prefer-isolated", "near", "near-strict")


def refuse_ignored_options(options: list[str], policy: str) -> None:
    """RequestError (exit 2) for request options the decision would silently ignore: shaping
    options on a shared request, `workload` for a policy other than workload-aware and
    `prefer-isolated` for kubelet-static (which knows no isolated CPUs)."""
    from corepin.allocation.api import parse_options
    from corepin.allocation.types import option_flag

    opts = parse_options(options)
    if option_flag(opts, "shared"):
        ignored = [
            f"{k}={opts[k]}"
            for k in EXCLUSIVE_ONLY
            if k in opts and (k, opts[k]) != ("level", "cpu")
        ]
        if ignored:
            raise RequestError(
                f"option {', '.join(ignored)} shapes exclusive requests only; a shared request "
                "runs on the whole shared pool: drop it, or drop the shared option",
                reason="ignored_option",
            )
    if "workload" in opts and policy != "workload-aware":
        raise RequestError(
            f"option workload={opts['workload']} is used by policy workload-aware only; "
            f"policy {policy!r} would ignore it: add --policy workload-aware, or drop it",
            reason="ignored_option",
        )
    if "prefer-isolated" in opts and policy == "kubelet-static":
        raise RequestError(
            f"option prefer-isolated={opts['prefer-isolated']} means nothing to policy "
            "'kubelet-static' (the kubelet does not tell isolated CPUs apart): drop it",
            reason="ignored_option",
        )


def run(args: argparse.Namespace) -> int:
    from corepin.allocation.api import decide, parse_options
    from corepin.allocation.near import near_cpus
    from corepin.allocation.types import option_flag
    from corepin.core.cpuset import CPUSet

    if list_machines(args):
        return EXIT_OK
    if args.count is None:
        raise RequestError("allocate needs --count N", reason="bad_usage")
    count = parse_count(args.count)
    names = near_names(args)
    refuse_ignored_options(args.option, args.policy)
    options = parse_options(args.option)
    if names and option_flag(options, "shared"):
        raise RequestError(
            "--near shapes exclusive requests only; a shared request runs on the whole shared "
            "pool: drop --near, or drop the shared option",
            reason="ignored_option",
        )
    available = CPUSet.parse(args.available) if args.available is not None else None
    topology = load_topology(args)
    near = near_cpus(topology, names) if names else None
    options = near_options(options, near, args.near_strict)
    try:
        decision = decide(topology, count, available=available, policy=args.policy, options=options)
    except AllocationError as exc:
        print(f"corepin allocate: {exc} (reason: {exc.reason})", file=sys.stderr)
        return EXIT_UNSATISFIABLE
    data = decision.to_json()
    if names:
        data["near"] = {"devices": list(names), "cpus": str(near), "strict": args.near_strict}
    write_output(render_output(args.output, data, lambda: f"{decision.cpus}\n"), None)
    return EXIT_OK
