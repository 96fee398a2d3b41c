"""`corepin report`: who holds which CPUs - on this host (its state directory), in a running
agent (`--agent SOCKET`, over its node gRPC API) or on a Kubernetes node (`--node NAME`, its
NodeCPUTopology). The data: `corepin.agent.host.report`, `corepin.agent.host.remote`; the
drawing: `corepin.cli.render.report`.

Building the parser loads no agent module (`--help` and the other subcommands stay cheap): the
command's imports inside `run` stay there on purpose.
"""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING, Any

from corepin.cli.common import (
    KUBECONFIG_DEFAULTS,
    add_host_arguments,
    add_kube_arguments,
    add_output_argument,
    add_qos_arguments,
    kube_config,
    missing_state_dir,
    positive_seconds,
    write_output,
)
from corepin.core.errors import InputError

if TYPE_CHECKING:
    from corepin.topology.model import Topology


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    add_output_argument(
        parser,
        formats=("table", "json", "yaml", "svg"),
        help="table (default), json, yaml, or svg (the machine coloured by holder)",
    )
    parser.add_argument(
        "--sample",
        type=positive_seconds,
        metavar="SECONDS",
        help="measure each run's CPU use over SECONDS (default: its average since it started)",
    )
    parser.add_argument("--out", metavar="FILE", help="write the output to FILE")
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--agent",
        metavar="SOCKET",
        help="show a running agent's state through its node gRPC API (its unix socket, "
        "e.g. /run/corepin/corepin.sock) instead of this host's state directory",
    )
    source.add_argument(
        "--node",
        metavar="NAME",
        help="show a Kubernetes node's state from its NodeCPUTopology",
    )
    add_kube_arguments(
        parser,
        kubeconfig_help="with --node: the API server's kubeconfig "
        f"(default: {KUBECONFIG_DEFAULTS})",
    )
    add_qos_arguments(parser, config=False)
    add_host_arguments(parser)


def run(args: argparse.Namespace) -> int:
    if args.agent or args.node or args.kubeconfig or args.context:
        return _report_remote(args)
    from corepin.agent.host.agent import HostAgent
    from corepin.agent.host.besteffort import DEFAULT_RESCTRL_ROOT
    from corepin.agent.host.report import report
    from corepin.agent.host.settings import HostSettings
    from corepin.cli.render.report import render_report

    settings = HostSettings.from_args(args, os.environ)
    missing = missing_state_dir(settings.state_dir)
    agent = HostAgent(settings)
    state = agent.read_state()
    root = args.resctrl_root or DEFAULT_RESCTRL_ROOT

    def resctrl() -> list[dict[str, Any]]:
        if not os.path.isdir(root):
            return []  # no resctrl: nothing more to show (the engine is not even loaded)
        from corepin.agent.host.qos import describe_resctrl

        return describe_resctrl(root, settings.proc_root)

    data = report(agent, state, sample=args.sample or 0.0, resctrl=resctrl)
    text = render_report(args.output, data, state, lambda: agent.topology)
    if missing and args.output == "table":
        text = text.replace("(no allocations)", f"(no allocations: {missing})", 1)
    write_output(text, args.out)
    return 0


def _report_remote(args: argparse.Namespace) -> int:
    """`corepin report --agent SOCKET` (a running agent over gRPC) or `--node NAME` (a
    Kubernetes node's NodeCPUTopology): the same report as host mode."""
    from corepin.cli.render.report import render_report
    from corepin.state.report import report_data

    for option in (
        "state_dir",
        "cgroups",
        "cgroup_root",
        "sysfs_root",
        "proc_root",
        "resctrl_root",
    ):
        if getattr(args, option, None):
            raise InputError(
                f"--{option.replace('_', '-')} applies to this host's state, not to --agent "
                "or --node",
                reason="bad_usage",
            )
    if args.agent:
        if args.kubeconfig or args.context:
            flag = "--kubeconfig" if args.kubeconfig else "--context"
            raise InputError(f"{flag} applies to --node, not --agent", reason="bad_usage")
        from corepin.agent.host.agent import HostAgent
        from corepin.agent.host.report import report
        from corepin.agent.host.settings import HostSettings
        from corepin.api.grpc.client import AgentClient

        with AgentClient(args.agent) as client:
            listed = client.list_state()
            topology = client.topology()[1] if args.output == "svg" else None
        # the agent's socket is on this host: its processes are in this /proc
        data = report(
            HostAgent(HostSettings()),
            listed.state,
            sample=args.sample or 0.0,
            statuses=listed.statuses,
        )

        def given() -> Topology:
            assert topology is not None
            return topology

        text = render_report(args.output, data, listed.state, given)
        write_output(text, args.out)
        return 0
    if not args.node:
        flag = "--kubeconfig" if args.kubeconfig else "--context"
        raise InputError(f"{flag} needs --node NAME", reason="bad_usage")
    if args.sample:
        raise InputError(
            "--sample measures processes of this host: it applies to this host's state and "
            "--agent, not to --node",
            reason="bad_usage",
        )
    from corepin.agent.host.remote import read_node

    node_report, node_topology = read_node(args.node, kube_config(args, os.environ))
    data = report_data(node_report.state, pools=node_report.pools)
    data["reservations"] = [dict(row) for row in node_report.reservations]
    text = render_report(args.output, data, node_report.state, lambda: node_topology)
    write_output(text, args.out)
    return 0
