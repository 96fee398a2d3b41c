"""`corepin run`, `pin`, `report`, `reconcile`, `release`: standalone host mode.

Argument parsing only; the work happens in `corepin.agent.host.agent`, imported when a command runs
so that `corepin --help` and the other subcommands stay cheap.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from corepin.agent.settings import HostSettings
    from corepin.kube.nodestate import NodeReport
    from corepin.state.model import HostState
    from corepin.topology.model import Topology

from corepin.cli.common import positive_seconds

LEVELS = ("cpu", "core", "l3", "numa", "socket")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _cpu_list(text: str) -> Any:
    """argparse type: a CPU (or NUMA node) list such as `0-3,8` (the message names the bad
    value)."""
    from corepin.core.cpuset import CPUSet
    from corepin.core.errors import CPUSetParseError

    try:
        return CPUSet.parse(text)
    except CPUSetParseError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _wait_seconds(text: str) -> float:
    """argparse type of --wait: seconds >= 0 (0: try once more after queueing)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"expected a number of seconds >= 0, got {text!r}")
    return value


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a CPU count, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a CPU count >= 0, got {text!r}")
    return value


def add_reserved_arguments(parser: argparse.ArgumentParser) -> None:
    """--reserved-cpus CPUSET | --reserved-count N: the host's reserved CPUs (kept in the
    state; never handed out)."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--reserved-cpus",
        type=_cpu_list,
        metavar="CPUSET",
        help="reserve exactly these CPUs for the system (kept in the state until changed; "
        "never handed out; '' reserves none); refused while an allocation holds one of them",
    )
    group.add_argument(
        "--reserved-count",
        type=_count,
        metavar="N",
        help="reserve N CPUs chosen by topology as the kubelet chooses them (whole cores, "
        "lowest ids first)",
    )


def reserve_from(args: Any) -> tuple[int, Any] | None:
    """(count, explicit CPUs) for HostAgent from --reserved-cpus / --reserved-count."""
    cpus = getattr(args, "reserved_cpus", None)
    count = getattr(args, "reserved_count", None)
    if cpus is not None:
        return (0, cpus)
    if count is not None:
        return (count, None)
    return None


def _memory_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--membind",
        type=_cpu_list,
        metavar="NODES",
        help="allocate memory only on these NUMA nodes (numactl --membind); default: the "
        "nodes of the run's CPUs",
    )
    group.add_argument(
        "--interleave",
        type=_cpu_list,
        metavar="NODES",
        help="interleave memory page by page across these NUMA nodes (numactl --interleave)",
    )
    group.add_argument(
        "--preferred",
        type=_cpu_list,
        metavar="NODE",
        help="allocate memory on this NUMA node first, on others when it is full "
        "(numactl --preferred)",
    )


def _memory_from(args: Any) -> Any:
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


def _common(parser: argparse.ArgumentParser) -> None:
    from corepin.cli.common import add_state_arguments

    add_state_arguments(
        parser,
        cgroups_help="also confine runs with cpuset cgroups: auto (default: when the cpuset "
        "hierarchy is writable), on (required), off (affinity only); env COREPIN_CGROUPS",
    )
    parser.add_argument("--sysfs-root", metavar="DIR", help=argparse.SUPPRESS)
    parser.add_argument("--proc-root", metavar="DIR", help=argparse.SUPPRESS)


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    if name == "run":
        parser.usage = (
            "corepin run [--exclusive N [--with-shared] | --cpus LIST | --shared] "
            "[--level LEVEL] [--option NAME[=VALUE]]... [--partition root|isolated] "
            "[--wait [SECONDS]] [--membind NODES | --interleave NODES | --preferred NODE] "
            "[--reserved-cpus CPUSET | --reserved-count N] [--state-dir DIR] [--policy NAME] "
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
            type=_positive_int,
            metavar="N",
            help="N CPUs for this command alone",
        )
        mode.add_argument(
            "--cpus",
            type=_cpu_list,
            metavar="LIST",
            help="exactly these CPUs, for this command alone (exit 3 naming the holder when "
            "one is taken)",
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
            "--name",
            metavar="NAME",
            help="a label for this run in reports (default: the command name)",
        )
        _common(parser)
        parser.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD ARGS...")
    elif name == "pin":
        parser.usage = (
            "corepin pin --pid PID [--exclusive N [--with-shared] | --cpus LIST | --shared] "
            "[--level LEVEL] [--option NAME[=VALUE]]... [--name NAME] [--state-dir DIR] "
            "[-o text|json]"
        )
        parser.description = (
            "Adopt a process that already runs: allocate CPUs for it as `corepin run` would and "
            "pin it, its threads and its children to them. The allocation is freed when the "
            "process and its children are gone (checked by pid and start time), or by "
            "`corepin release ID`. Kernel threads and processes corepin already manages are "
            "refused."
        )
        parser.add_argument("--pid", type=_positive_int, required=True, help="the process")
        mode = parser.add_mutually_exclusive_group()
        mode.add_argument("--exclusive", type=_positive_int, metavar="N", help="N CPUs of its own")
        mode.add_argument("--cpus", type=_cpu_list, metavar="LIST", help="exactly these CPUs")
        mode.add_argument("--shared", action="store_true", help="the shared pool (the default)")
        parser.add_argument(
            "--with-shared",
            action="store_true",
            help="with --exclusive or --cpus: add the shared pool to the affinity mask",
        )
        parser.add_argument("--level", choices=LEVELS, help="exclusiveness level")
        parser.add_argument(
            "--option", action="append", default=[], metavar="NAME[=VALUE]", help="as for run"
        )
        parser.add_argument("--policy", metavar="NAME", help="allocation policy")
        parser.add_argument("--name", metavar="NAME", help="a label in reports")
        parser.add_argument(
            "-o",
            "--output",
            choices=("text", "json"),
            default="text",
            help="how to print the allocation (default: text)",
        )
        add_reserved_arguments(parser)
        _common(parser)
    elif name == "report":
        parser.add_argument(
            "-o",
            "--output",
            choices=("table", "json", "yaml", "svg"),
            default="table",
            help="output format (default: table)",
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
        parser.add_argument(
            "--kubeconfig",
            metavar="FILE",
            help="with --node: the API server's kubeconfig (default: $KUBECONFIG, else the "
            "in-cluster service account)",
        )
        _common(parser)
    elif name == "release":
        parser.description = (
            "End an allocation on purpose: free its CPUs. Without --kill, processes of it that "
            "still run move to the shared pool (tracked until they exit); with --kill they get "
            "SIGTERM, then SIGKILL after a grace period."
        )
        parser.add_argument("id", metavar="ID", help="the allocation id (see `corepin report`)")
        parser.add_argument(
            "--kill", action="store_true", help="end the run's processes, then free its CPUs"
        )
        parser.add_argument(
            "-o",
            "--output",
            choices=("text", "json"),
            default="text",
            help="how to print what changed (default: text)",
        )
        _common(parser)
    elif name == "reconcile":
        parser.description = (
            "Free allocations whose processes are gone, re-apply pins that drifted, and repair "
            "the shield (resize it, adopt new tasks); with --interval, again and again (a "
            "systemd unit in packaging/ runs it)."
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
        parser.add_argument(
            "-o",
            "--output",
            choices=("text", "json"),
            default="text",
            help="how to print what changed (default: text)",
        )
        _common(parser)
    else:  # pragma: no cover - the dispatcher only passes the five names
        raise ValueError(f"unknown host subcommand {name!r}")


def run(args: Any) -> int:
    from corepin.agent.settings import HostSettings

    if args.command == "report" and (args.agent or args.node or args.kubeconfig):
        return _cmd_report_remote(args)
    settings = HostSettings.from_args(args, os.environ)
    if args.command == "run":
        return _cmd_run(settings, args)
    if args.command == "pin":
        return _cmd_pin(settings, args)
    if args.command == "report":
        return _cmd_report(settings, args)
    if args.command == "release":
        return _cmd_release(settings, args)
    return _cmd_reconcile(settings, args)


def _spec_from(args: Any) -> Any:
    """The RunSpec of `run` and `pin` from their options (InputError for bad combinations)."""
    from corepin.agent.host.agent import RunSpec
    from corepin.allocation.api import parse_options
    from corepin.core.errors import InputError

    owned = args.exclusive is not None or args.cpus is not None
    if args.with_shared and not owned:
        raise InputError("--with-shared needs --exclusive N or --cpus LIST", reason="bad_usage")
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
    if partition is not None and (
        (args.exclusive is None and args.cpus is None) or args.with_shared
    ):
        raise InputError(
            "--partition applies to exclusive runs (--exclusive N or --cpus LIST) without "
            "--with-shared only",
            reason="bad_usage",
        )
    return RunSpec(
        exclusive=args.exclusive,
        with_shared=bool(args.with_shared),
        options=options,
        partition=partition,
        cpus=args.cpus,
        memory=_memory_from(args),
    )


def _cmd_run(settings: HostSettings, args: Any) -> int:
    from corepin.agent.host.agent import HostAgent
    from corepin.core.errors import InputError

    argv = list(args.cmd or [])
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        raise InputError(
            "no command given: use `corepin run [options] -- CMD ARGS...`",
            reason="missing_command",
        )
    spec = _spec_from(args)
    agent = HostAgent(settings, reserve=reserve_from(args))
    return agent.run(argv, spec, name=args.name, wait=args.wait)


def _cmd_pin(settings: HostSettings, args: Any) -> int:
    import json

    from corepin.agent.host.agent import HostAgent
    from corepin.core.text import printable

    spec = _spec_from(args)
    a = HostAgent(settings, reserve=reserve_from(args)).pin_process(args.pid, spec, name=args.name)
    if args.output == "json":
        print(
            json.dumps(
                {
                    "id": a.id,
                    "pid": a.pid,
                    "kind": a.kind,
                    "cpus": str(a.cpus),
                    "withheld": str(a.withheld),
                    "mems": str(a.mems),
                }
            ),
            flush=True,
        )
    else:
        what = f"CPUs {a.cpus}" if a.holds else "the shared pool"
        print(printable(f"pinned pid {a.pid} ({a.label}) as {a.id}: {a.kind}, {what}"), flush=True)
    return 0


def _cmd_report(settings: HostSettings, args: Any) -> int:
    from corepin.agent.host.agent import HostAgent
    from corepin.cli.common import write_output

    agent = HostAgent(settings)
    state = agent.read_state()
    data = agent.report(state, sample=args.sample or 0.0)
    write_output(_render_report(args.output, data, state, lambda: agent.topology), args.out)
    return 0


def _render_report(
    fmt: str, data: Mapping[str, Any], state: HostState, topology: Callable[[], Topology]
) -> str:
    """The report in `fmt` (table, json, yaml or svg; the SVG needs the topology)."""
    from corepin.cli.common import dump

    if fmt in ("json", "yaml"):
        return dump(data, fmt)
    if fmt == "svg":
        return _report_svg(topology(), state, data)
    return _report_table(data)


def _cmd_report_remote(args: Any) -> int:
    """`corepin report --agent SOCKET` (a running agent over gRPC) or `--node NAME` (a
    Kubernetes node's NodeCPUTopology): the same report as host mode."""
    from corepin.cli.common import write_output
    from corepin.core.errors import InputError
    from corepin.state.report import report_data

    for option in ("state_dir", "cgroups", "cgroup_root", "sysfs_root", "proc_root"):
        if getattr(args, option, None):
            raise InputError(
                f"--{option.replace('_', '-')} applies to this host's state, not to --agent "
                "or --node",
                reason="bad_usage",
            )
    if args.agent:
        if args.kubeconfig:
            raise InputError("--kubeconfig applies to --node, not --agent", reason="bad_usage")
        from corepin.api.grpc.client import AgentClient

        with AgentClient(args.agent) as client:
            listed = client.list_state()
            topology = client.topology()[1] if args.output == "svg" else None
        data = report_data(listed.state, listed.statuses)
        # the agent's socket is on this host: its processes are in this /proc
        from corepin.agent.host.agent import HostAgent
        from corepin.agent.settings import HostSettings

        live = HostAgent(HostSettings()).live(listed.state, sample=args.sample or 0.0)
        for row in data["allocations"]:
            row.update(live.get(row["id"], {}))
        text = _render_report(args.output, data, listed.state, lambda: _given(topology))
        write_output(text, args.out)
        return 0
    if not args.node:
        raise InputError("--kubeconfig needs --node NAME", reason="bad_usage")
    if args.sample:
        raise InputError(
            "--sample measures processes of this host: it applies to this host's state and "
            "--agent, not to --node",
            reason="bad_usage",
        )
    report, node_topology = _read_node(args.node, args.kubeconfig)
    data = report_data(report.state, pools=report.pools)
    text = _render_report(args.output, data, report.state, lambda: node_topology)
    write_output(text, args.out)
    return 0


def _given(topology: Topology | None) -> Topology:
    assert topology is not None
    return topology


def _read_node(name: str, kubeconfig: str | None) -> tuple[NodeReport, Topology]:
    """The node's report and topology from its NodeCPUTopology."""
    from corepin.core.errors import ApiNotFound, EnvironmentProblem, InputError
    from corepin.kube.client import KubeClient
    from corepin.kube.config import load_config
    from corepin.kube.models import NodeCPUTopology
    from corepin.kube.nodestate import node_state
    from corepin.kube.resources import NCPT

    client = KubeClient.from_config(load_config(kubeconfig, env=os.environ), timeout=15)
    try:
        obj = client.get(NCPT, name)
    except ApiNotFound as exc:
        if exc.details.get("name") != name:  # the type itself is not served
            raise EnvironmentProblem(
                f"the API server does not serve {NCPT} ({exc.api_message}): "
                "are corepin's CRDs installed (deploy/crd)?",
                reason="no_crd",
            ) from None
        raise InputError(
            f"node {name!r} has no NodeCPUTopology: is the corepin agent running on it?",
            reason="no_such_node",
        ) from None
    finally:
        client.close()
    ncpt = NodeCPUTopology.from_dict(obj)
    return node_state(ncpt), ncpt.spec.topology


def _report_table(data: Mapping[str, Any]) -> str:
    from corepin.core.text import printable

    live = any("live_cpus" in a for a in data["allocations"])
    header: tuple[str, ...] = ("ID", "NAME", "PID", "KIND", "CPUS", "MEMS", "STATUS", "COMMAND")
    if live:
        header = ("ID", "NAME", "PID", "KIND", "CPUS", "LIVE", "CPU%", "MEMS", "STATUS", "COMMAND")
    rows: list[tuple[str, ...]] = [header]
    for a in data["allocations"]:
        cells = [a["id"], a["name"], str(a["pid"] or "-"), a["kind"], a["cpus"] or "-"]
        if live:
            percent = a.get("cpu_percent")
            cells += [a.get("live_cpus") or "-", "-" if percent is None else f"{percent:.1f}"]
        cells += [a["mems"] or "-", a["status"] or "-", a["command"][:40]]
        rows.append(tuple(printable(cell) for cell in cells))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    if len(rows) == 1:
        lines.append("(no allocations)")
    lines.append("")
    lines.append(f"shared pool: {data['shared_pool'] or '(empty)'}")
    lines.append(f"free:        {data['free'] or '(none)'}")
    if data["reserved"]:
        lines.append(f"reserved:    {data['reserved']}")
    marked = [a for a in data["allocations"] if a["status"] in ("dead", "lingering")]
    if marked:
        lines.append(
            "dead: nothing of the run is left (freed by the next run or `corepin reconcile`); "
            "lingering: CMD exited, processes it left behind still hold the CPUs "
            "(`corepin release ID [--kill]`)"
        )
    if live:
        over = {a.get("cpu_percent_over") for a in data["allocations"]} - {None}
        if over:
            lines.append(f"CPU%: of one CPU, {', '.join(sorted(over))}")
    return "\n".join(lines) + "\n"


def _report_svg(topology: Topology, state: HostState, data: Mapping[str, Any]) -> str:
    from corepin.cli.render.svg import render_svg
    from corepin.core.text import printable

    owners: dict[int, str] = {}
    for cpu in topology.online_cpus:
        owners[cpu] = "free"
    for cpu in state.shared_pool:
        owners[cpu] = "shared"
    for cpu in state.reserved:
        owners[cpu] = "reserved"
    statuses = {row["id"]: row.get("status") for row in data["allocations"]}
    for a in state:
        label = printable(f"{a.label} (pid {a.pid})" if a.pid else a.label)
        if statuses.get(a.id) in ("dead", "lingering"):
            label += f" [{statuses[a.id]}]"
        for cpu in a.withheld:
            owners[cpu] = label
    shared_users = [a for a in state if a.kind == "shared"]
    title = (
        f"corepin report: {len(data['allocations'])} allocation(s), shared pool CPUs "
        f"{data['shared_pool'] or '(empty)'} used by {len(shared_users)} shared run(s)"
    )
    return render_svg(topology, owners, title=title)


def _cmd_release(settings: HostSettings, args: Any) -> int:
    import json

    from corepin.agent.host.agent import HostAgent

    changes = HostAgent(settings).release(args.id, kill=bool(args.kill))
    if args.output == "json":
        print(json.dumps({"changes": [c.to_json() for c in changes]}), flush=True)
    else:
        for change in changes:
            print(change, flush=True)
    return 0


def _cmd_reconcile(settings: HostSettings, args: Any) -> int:
    import json
    import signal
    import sys
    import time

    from corepin.agent.host.agent import HostAgent
    from corepin.enforcement.note import Note

    agent = HostAgent(settings, reserve=reserve_from(args))

    def show(changes: list[Note]) -> None:
        if args.output == "json":
            print(json.dumps({"changes": [c.to_json() for c in changes]}), flush=True)
        elif changes:
            for change in changes:
                print(change, flush=True)
        elif args.once:
            print("nothing to do", flush=True)

    if args.once:
        if args.interval is not None:
            from corepin.core.errors import InputError

            raise InputError(
                f"--once runs one pass; --interval {args.interval:g} is for loop mode: give "
                "one or the other",
                reason="bad_usage",
            )
        show(agent.reconcile_once())
        return 0
    from corepin.core.errors import StateError

    interval = 10.0 if args.interval is None else args.interval
    stop = False

    def on_signal(_signum: int, _frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    while not stop:
        try:
            show(agent.reconcile_once())
        except StateError as exc:
            if exc.reason != "lock_timeout":
                raise
            # busy is not broken: an operator may hold the lock for a while
            print(
                f"corepin reconcile: warning: {exc}; trying again in {interval:g} s",
                file=sys.stderr,
                flush=True,
            )
        deadline = time.monotonic() + interval
        while not stop and time.monotonic() < deadline:
            time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
    return 0
