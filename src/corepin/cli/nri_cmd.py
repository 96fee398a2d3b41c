"""`corepin nri`: corepin as an NRI plugin of the container runtime (containerd >= 1.7 with NRI
enabled, CRI-O >= 1.26).

Argument parsing and wiring only; the plugin is `corepin.agent.node.nri.runner.NriAgent`. Its
modules are imported inside `run` (and `settings_from`): building `corepin --help` imports every
subcommand's module, and must stay cheap.
"""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING

from corepin.cli.common import add_kube_arguments, kube_config, stop_on_signals

if TYPE_CHECKING:
    from corepin.agent.node.nri.settings import NriSettings


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    parser.description = (
        "Run corepin inside the container runtime as a Node Resource Interface (NRI) plugin: "
        "every container gets the CPUs its pod's annotations ask for (corepin.io/cpu-policy: "
        "none|share|exclusive) in the runtime's CreateContainer reply, before its first "
        "instruction, and the containers on the shared pool are updated in the same reply. "
        "The runtime writes the cgroups; corepin writes none. Same decisions, checkpoint and "
        "state directory as `corepin agent`, which must not run on the same node."
    )
    parser.add_argument(
        "--socket",
        metavar="PATH",
        default="/var/run/nri/nri.sock",
        help="the runtime's NRI socket (default: /var/run/nri/nri.sock; a socket the runtime "
        "hands over in $NRI_PLUGIN_SOCKET wins)",
    )
    parser.add_argument("--plugin-name", metavar="NAME", default="corepin", help="default: corepin")
    parser.add_argument(
        "--plugin-index",
        metavar="NN",
        default="10",
        help="two digits; plugins are called in ascending index order (default: 10)",
    )
    parser.add_argument("--node-name", metavar="NAME", help="default: $NODE_NAME, else hostname")
    parser.add_argument(
        "--state-dir",
        metavar="DIR",
        default="/var/lib/corepin",
        help="where the node's checkpoint (state.json) and lock live (default: /var/lib/corepin)",
    )
    parser.add_argument("--sysfs-root", metavar="DIR", default="/", help="default: /")
    parser.add_argument(
        "--cgroup-root",
        metavar="DIR",
        default="/sys/fs/cgroup",
        help="where the cgroup hierarchies are mounted (default: /sys/fs/cgroup); accepted as "
        "the agent accepts it, though in NRI mode the runtime writes the cgroups and corepin "
        "reads none",
    )
    parser.add_argument(
        "--policy",
        metavar="NAME",
        default="topology-aware",
        help="allocation policy of exclusive containers: topology-aware (default), "
        "kubelet-static or workload-aware",
    )
    parser.add_argument(
        "--option", action="append", default=[], metavar="NAME[=VALUE]", help="repeatable"
    )
    parser.add_argument("--reserved-cpus", metavar="CPUSET", help="CPUs never handed out")
    add_kube_arguments(
        parser,
        kubeconfig_help="also publish to the Kubernetes API (default: $KUBECONFIG, else "
        "in-cluster when running in a pod, else NRI alone; with --context: ~/.kube/config too)",
    )
    parser.add_argument(
        "--metrics-address",
        metavar="HOST:PORT",
        default=":9464",
        help="serves /healthz (200 once synchronized with the runtime) and /metrics "
        "(default: :9464)",
    )
    parser.add_argument(
        "--qos-config",
        metavar="FILE",
        help="node QoS policy (YAML or JSON); in NRI mode its classes' resctrl shares are used: "
        "each container runs in its class's resctrl group (default: the default policy)",
    )
    parser.add_argument(
        "--resctrl-root",
        metavar="DIR",
        default="/sys/fs/resctrl",
        help="where resctrl is mounted (default: /sys/fs/resctrl; not there: logged, no error)",
    )
    parser.add_argument(
        "--connect-timeout",
        metavar="SECONDS",
        type=float,
        default=10.0,
        help="how long to wait for the runtime's socket at start (default: 10)",
    )


def settings_from(args: argparse.Namespace, environ: dict[str, str]) -> NriSettings:
    """NriSettings from the parsed arguments (exported for tests)."""
    from corepin.agent.node.nri.settings import NriSettings
    from corepin.allocation.api import parse_options
    from corepin.core.cpuset import CPUSet

    reserved = CPUSet.parse(args.reserved_cpus) if args.reserved_cpus else None
    return NriSettings(
        node_name=args.node_name or environ.get("NODE_NAME", "") or os.uname().nodename,
        socket=args.socket,
        plugin_name=args.plugin_name,
        plugin_index=args.plugin_index,
        state_dir=args.state_dir,
        sysfs_root=args.sysfs_root,
        cgroup_root=args.cgroup_root,
        policy=args.policy,
        options=parse_options(args.option),
        reserved_cpus=reserved,
        metrics_address=args.metrics_address,
        qos_config=args.qos_config or None,
        resctrl_root=args.resctrl_root,
    )


def run(args: argparse.Namespace) -> int:
    from corepin.agent.node.metrics import NriMetrics
    from corepin.agent.node.nri.runner import NriAgent
    from corepin.allocation.policies import get_policy
    from corepin.api.http import OpsServer
    from corepin.topology.discover import discover

    environ = dict(os.environ)
    settings = settings_from(args, environ)
    get_policy(settings.policy)  # an unknown policy is refused before anything starts
    topology = discover(settings.sysfs_root)
    metrics = NriMetrics()
    client = None
    if (
        args.kubeconfig
        or args.context
        or environ.get("KUBECONFIG")
        or environ.get("KUBERNETES_SERVICE_HOST")
    ):
        from corepin.kube.client import KubeClient

        client = KubeClient.from_config(kube_config(args, environ))
    agent = NriAgent(settings, topology, metrics=metrics, client=client)
    ops = OpsServer(settings.metrics_address, metrics=metrics.registry, ready=agent.ready)
    done = stop_on_signals()
    ops.start()
    try:
        agent.start(timeout=args.connect_timeout)
        done.wait()
    finally:
        agent.stop(timeout=2.5)
        ops.stop(timeout=1.0)
        if client is not None:
            client.close()
    return 0
