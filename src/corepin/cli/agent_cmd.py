"""`corepin agent`: the Kubernetes node agent.

Argument parsing and wiring only; the agent itself is `corepin.agent.node.agent.NodeAgent`.
The agent's modules are imported inside `run` (and `settings_from`): building `corepin --help`
imports every subcommand's module, and must stay cheap.
"""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING

from corepin.cli.common import add_kube_arguments, kube_config, positive_seconds, stop_on_signals

if TYPE_CHECKING:
    from corepin.agent.node.hooks import Hooks
    from corepin.agent.node.metrics import AgentMetrics
    from corepin.agent.node.settings import NodeSettings
    from corepin.allocation.qos import QosPolicy
    from corepin.enforcement.qos.engine import QosReport
    from corepin.state.model import HostState
    from corepin.topology.model import Topology


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    parser.description = (
        "Run the node agent: watch this node's pods, give their containers the CPUs their "
        "annotations ask for (corepin.io/cpu-policy: none|share|exclusive), enforce them "
        "through the container cgroups, and publish the node's CPUs as a NodeCPUTopology."
    )
    parser.add_argument("--node-name", metavar="NAME", help="this node (default: $NODE_NAME)")
    add_kube_arguments(parser)
    parser.add_argument("--sysfs-root", metavar="DIR", default="/", help="default: /")
    parser.add_argument("--proc-root", metavar="DIR", default="/proc", help="default: /proc")
    parser.add_argument(
        "--cgroup-root",
        metavar="DIR",
        default="/sys/fs/cgroup",
        help="where the cgroup hierarchies are mounted (default: /sys/fs/cgroup)",
    )
    parser.add_argument(
        "--kubelet-cgroup-root",
        metavar="PATH",
        default="/",
        help="the kubelet's own --cgroup-root (default: /)",
    )
    parser.add_argument(
        "--cgroup-driver",
        choices=("auto", "cgroupfs", "systemd"),
        default="auto",
        help="the kubelet's cgroup driver (default: auto, from what exists)",
    )
    parser.add_argument(
        "--state-dir",
        metavar="DIR",
        default="/var/lib/corepin",
        help="where the node's checkpoint (state.json) and lock live (default: /var/lib/corepin)",
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
    parser.add_argument(
        "--reserved-cpus",
        metavar="CPUSET",
        help="CPUs never handed out (a node annotation corepin.io/reservation overrides it)",
    )
    parser.add_argument(
        "--grpc-socket",
        metavar="PATH",
        default="/run/corepin/corepin.sock",
        help="unix socket of the node gRPC API (`corepin report --agent PATH` reads it; "
        "default: /run/corepin/corepin.sock)",
    )
    parser.add_argument(
        "--metrics-address",
        metavar="HOST:PORT",
        default=":9464",
        help="serves /healthz and /metrics over HTTP (default: :9464)",
    )
    parser.add_argument(
        "--assignment-dir",
        metavar="DIR",
        default="/run/corepin/assignments",
        help="one file per container with its CPUs (mounted into pods at /etc/corepin by the "
        "webhook; '' for none)",
    )
    parser.add_argument(
        "--resync-period",
        metavar="SECONDS",
        type=positive_seconds,
        default=30.0,
        help="every SECONDS, go over every pod again and check every cgroup for drift (no "
        "write when nothing drifted; default: 30)",
    )
    parser.add_argument(
        "--api-idle-timeout",
        metavar="SECONDS",
        type=_idle_seconds,
        default=40.0,
        help="a watch silent this long counts as a dead connection and is reopened; /healthz "
        "fails while no list or watch has answered for this long (default: 40)",
    )
    parser.add_argument(
        "--kubelet-compat",
        action="store_true",
        help="run beside the kubelet's static CPU manager: import its assignments, leave them",
    )
    parser.add_argument(
        "--shield-system",
        action="store_true",
        help="keep everything outside the kubelet's pods (system daemons, the kubelet, the "
        "runtime) on the reserved CPUs and the shared pool: a system cpuset re-sized with "
        "every allocation (`corepin shield status --state-dir` shows it; `off` takes it down)",
    )
    parser.add_argument(
        "--qos-config",
        metavar="FILE",
        help="the node QoS policy (YAML or JSON: classes, beSuppress, cpuBurst, beCPUIdle); the "
        "ConfigMap corepin-qos (key qos.yaml) in the agent's namespace ($POD_NAMESPACE) wins "
        "while it exists (default: the default policy)",
    )
    parser.add_argument(
        "--resctrl-root",
        metavar="DIR",
        default="/sys/fs/resctrl",
        help="where resctrl is mounted, for cache and memory bandwidth classes (default: "
        "/sys/fs/resctrl; none there: the classes are off)",
    )
    parser.add_argument(
        "--pod-resources-socket",
        metavar="PATH",
        default="/var/lib/kubelet/pod-resources/kubelet.sock",
        help="the kubelet's PodResources API: exclusive CPUs go near the NUMA nodes of each "
        "container's devices (annotation corepin.io/device-alignment: preferred, required or "
        "none) and the node's devices are published in its NodeCPUTopology (default: "
        "/var/lib/kubelet/pod-resources/kubelet.sock; none there: the agent works without "
        "devices and says so once; '' turns it off)",
    )
    parser.add_argument(
        "--qos-period",
        metavar="SECONDS",
        type=_qos_seconds,
        default=1.0,
        help="period of the QoS loop: best-effort suppression, CPU burst, resctrl tasks "
        "(default: 1; 0: no loop)",
    )
    parser.add_argument(
        "--rebalance",
        choices=("off", "report", "move"),
        default="report",
        help="running exclusive containers that span more NUMA nodes or L3 caches than their "
        "size needs while better-aligned CPUs are free: report (a CPURebalanceAdvised Event), "
        "move (re-pinned live, memory migrated; CPUMoved) or off; never a pod or container "
        "annotated corepin.io/rebalance[.<container>]: never (default: report)",
    )
    parser.add_argument(
        "--rebalance-rate",
        metavar="N",
        type=_moves_per_minute,
        default=6,
        help="at most N live moves per minute (default: 6; 0: none)",
    )
    parser.add_argument(
        "--kubelet-state",
        metavar="FILE",
        default="/var/lib/kubelet/cpu_manager_state",
        help="the kubelet's CPU manager checkpoint (default: /var/lib/kubelet/cpu_manager_state)",
    )
    parser.add_argument(
        "--evict-on-reservation",
        action="store_true",
        help="evict (Eviction API, PodDisruptionBudgets honoured) a pod whose exclusive CPUs a "
        "new reservation (CPUReservation, node reservation annotation) takes when no other CPUs "
        "fit it (default: the reservation waits and the pod is told, CPUReservationBlocked)",
    )


def _idle_seconds(text: str) -> float:
    """argparse type of --api-idle-timeout: at least 4 s (watches end 1 s or more before it,
    and the API server's last bookmark comes 2 s before a watch ends)."""
    value = positive_seconds(text)
    if value < 4:
        raise argparse.ArgumentTypeError(f"expected at least 4 seconds, got {text!r}")
    return value


def _qos_seconds(text: str) -> float:
    """argparse type of --qos-period: 0 (off) or positive seconds."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if value == 0:
        return 0.0
    return positive_seconds(text)


def _moves_per_minute(text: str) -> int:
    """argparse type of --rebalance-rate: a whole number, 0 or more."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected 0 or more moves per minute, got {text!r}")
    return value


def settings_from(args: argparse.Namespace, environ: dict[str, str]) -> NodeSettings:
    """NodeSettings from the parsed arguments (exported for tests)."""
    from corepin.agent.node.settings import NodeSettings
    from corepin.allocation.api import parse_options
    from corepin.core.cpuset import CPUSet

    reserved = CPUSet.parse(args.reserved_cpus) if args.reserved_cpus else None
    return NodeSettings(
        node_name=args.node_name or environ.get("NODE_NAME", ""),
        state_dir=args.state_dir,
        sysfs_root=args.sysfs_root,
        proc_root=args.proc_root,
        cgroup_root=args.cgroup_root,
        kubelet_cgroup_root=args.kubelet_cgroup_root,
        cgroup_driver=args.cgroup_driver,
        policy=args.policy,
        options=parse_options(args.option),
        reserved_cpus=reserved,
        resync_period=args.resync_period,
        kubelet_compat=bool(args.kubelet_compat),
        kubelet_state=args.kubelet_state,
        grpc_socket=args.grpc_socket,
        metrics_address=args.metrics_address,
        assignment_dir=args.assignment_dir,
        shield_system=bool(args.shield_system),
        qos_config=args.qos_config or None,
        resctrl_root=args.resctrl_root,
        qos_period=args.qos_period,
        namespace=environ.get("POD_NAMESPACE", ""),
        pod_resources_socket=args.pod_resources_socket,
        evict_on_reservation=bool(args.evict_on_reservation),
        rebalance=args.rebalance,
        rebalance_rate=args.rebalance_rate,
    )


def run(args: argparse.Namespace) -> int:
    from corepin.agent.node.agent import NodeAgent
    from corepin.agent.node.enforce import ContainerCgroups, open_hierarchy
    from corepin.agent.node.metrics import AgentMetrics
    from corepin.agent.node.qos import log_no_resctrl
    from corepin.allocation.policies import get_policy
    from corepin.api.grpc.server import GrpcServer, Listen
    from corepin.api.http import OpsServer
    from corepin.core.record import replace
    from corepin.enforcement.qos.cpu import CpuControl, find_cpuacct_root
    from corepin.enforcement.qos.engine import QosEngine
    from corepin.enforcement.resctrl.classes import open_resctrl
    from corepin.kube.client import KubeClient
    from corepin.topology.discover import discover

    environ = dict(os.environ)
    settings = settings_from(args, environ)
    get_policy(settings.policy)  # an unknown policy is refused before anything starts
    topology = discover(settings.sysfs_root)
    driver = open_hierarchy(settings.cgroup_root)
    cgroups = ContainerCgroups(
        driver,
        topology,
        kubelet_root=settings.kubelet_cgroup_root,
        layout=settings.cgroup_driver,
        proc_root=settings.proc_root,
    )
    client = KubeClient.from_config(kube_config(args, environ), idle_timeout=args.api_idle_timeout)
    if not settings.namespace and client.default_namespace:
        settings = replace(settings, namespace=client.default_namespace)
    metrics = AgentMetrics()
    engine = None
    if settings.qos_period > 0:
        resctrl, note = open_resctrl(settings.resctrl_root, settings.proc_root)
        if resctrl is None:
            log_no_resctrl(note)
        else:
            metrics.watch_resctrl(resctrl.samples)
        cpu = CpuControl(driver, find_cpuacct_root(settings.cgroup_root))
        engine = QosEngine(cpu, driver, resctrl=resctrl, proc_root=settings.proc_root)
    agent = NodeAgent(
        settings, client, topology, cgroups, hooks=_metrics_hooks(metrics), qos_engine=engine
    )

    def ready() -> bool:
        # started, and every informer heard from the API lately (a dead connection shows here)
        return agent.synced.is_set() and all(i.in_contact() for i in agent.watches.informers)

    ops = OpsServer(settings.metrics_address, metrics=metrics.registry, ready=ready)
    grpc_server = GrpcServer(agent, Listen.unix(settings.grpc_socket), metrics=metrics)
    done = stop_on_signals()
    ops.start()
    try:
        # a second agent of this node waits here (not ready) until the first one goes
        if not agent.acquire_node_lock(done):
            return 0
        agent.start()
        grpc_server.start()
        watches = 0
        while not done.wait(0.5):
            restarts = sum(i.stats.watch_restarts for i in agent.watches.every_informer)
            for _ in range(restarts - watches):
                metrics.watch_restart()
            watches = restarts
    finally:
        grpc_server.stop(grace=1.0)
        agent.stop(timeout=2.5)
        ops.stop(timeout=1.0)
        client.close()
    return 0


def _metrics_hooks(metrics: AgentMetrics) -> Hooks:
    """The agent's hooks as Prometheus metrics."""
    from corepin.agent.node.hooks import Hooks

    class MetricsHooks(Hooks):
        def decided(self, seconds: float) -> None:
            metrics.observe_decision(seconds)

        def pinning(self, ok: bool, reason: str = "") -> None:
            metrics.pinning_request()
            if not ok:
                metrics.pinning_error(reason or "error")

        def cgroup_writes(self, count: int) -> None:
            if count:
                metrics.cgroup_writes(count)

        def reconciled(self, seconds: float) -> None:
            metrics.observe_reconcile(seconds)

        def pinned_after(self, seconds: float) -> None:
            metrics.observe_pod_event_to_pinned(seconds)

        def state(self, state: HostState, topology: Topology) -> None:
            metrics.observe_state(state, topology)

        def qos_period(self, report: QosReport, cpu_seconds: float) -> None:
            metrics.observe_qos(report.be_budget, report.burst_changes)
            if report.writes:
                metrics.cgroup_writes(report.writes)

        def qos_policy(self, policy: QosPolicy) -> None:
            metrics.qos_policy_changed()

        def rebalance_advised(self) -> None:
            metrics.rebalance_advised()

        def rebalance_moved(self, seconds: float) -> None:
            metrics.rebalance_moved(seconds)

    return MetricsHooks()
