"""`corepin dev cluster`: the development stand-in cluster on this machine (the fake API server,
a stand-in kubelet with real processes in scratch cgroups, and the real corepin agent,
controller, scheduler and webhook; `corepin.testing.cluster`). A stand-in for trying corepin's
Kubernetes mode in minutes, not a Kubernetes cluster."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    parser.description = (
        "Development helpers. `cluster`: a stand-in Kubernetes cluster on this machine (a fake "
        "API server, a stand-in kubelet running real processes in scratch cgroups, the real "
        "corepin agent, controller, scheduler and webhook), with sample pods pinned; runs until "
        "Ctrl-C, then stops everything and cleans up. Needs root."
    )
    sub = parser.add_subparsers(
        dest="dev_command", metavar="WHAT", required=True, help="what to run: cluster"
    )
    cluster = sub.add_parser(
        "cluster",
        help="run the development stand-in cluster on this machine",
        description="Run the development stand-in cluster on this machine (not Kubernetes).",
    )
    cluster.add_argument(
        "--once",
        action="store_true",
        help="start it, apply and show the samples, then stop and clean up (tests, CI)",
    )
    cluster.add_argument(
        "--nodes", type=int, choices=(1, 2), default=2, help="how many nodes (default: 2)"
    )
    cluster.add_argument(
        "--timeout",
        type=float,
        default=180.0,
        metavar="SECONDS",
        help="how long to wait for each step: the agents, the samples pinned (default: 180)",
    )


def run(args: argparse.Namespace) -> int:
    from corepin.testing.cluster import Options
    from corepin.testing.cluster import run as run_cluster

    return run_cluster(Options(once=args.once, nodes=args.nodes, timeout=args.timeout))
