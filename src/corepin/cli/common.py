"""Helpers shared by the subcommands: topology sources, host-mode options, structured output,
files.

On the start-up path of `corepin run` (and of every parser): the imports inside functions stay
there on purpose (each module loaded costs every run its time).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from corepin.core.errors import EnvironmentProblem, InputError, TopologyError

if TYPE_CHECKING:
    import threading

    from corepin.allocation.qos import QosPolicy
    from corepin.core.cpuset import CPUSet
    from corepin.kube.config import ClusterConfig
    from corepin.topology.model import Topology

#: What `--cgroups` does for the commands of host mode that keep runs (run, pin, report,
#: release, reconcile).
HOST_CGROUPS_HELP = (
    "also confine runs with cpuset cgroups: auto (default: when the cpuset "
    "hierarchy is writable), on (required), off (affinity only); env COREPIN_CGROUPS"
)


#: Where the Kubernetes commands find the API when no --kubeconfig is given.
KUBECONFIG_DEFAULTS = "$KUBECONFIG, else ~/.kube/config, else the in-cluster service account"


def add_kube_arguments(
    parser: argparse.ArgumentParser, *, kubeconfig_help: str = f"default: {KUBECONFIG_DEFAULTS}"
) -> None:
    """--kubeconfig FILE and --context NAME, for every command that talks to the API
    (`kube_config` reads them)."""
    parser.add_argument("--kubeconfig", metavar="FILE", help=kubeconfig_help)
    parser.add_argument(
        "--context",
        metavar="NAME",
        help="the kubeconfig context to use (default: its current-context)",
    )


def kube_config(args: argparse.Namespace, environ: Mapping[str, str]) -> ClusterConfig:
    """The API configuration --kubeconfig and --context select (`corepin.kube.config`:
    $KUBECONFIG, ~/.kube/config and the in-cluster account from `environ` otherwise)."""
    from corepin.kube.config import load_config

    return load_config(args.kubeconfig, env=environ, context=args.context)


def positive_seconds(text: str) -> float:
    """argparse type: a positive number of seconds (the message names the bad value)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


def add_topology_source(
    parser: argparse.ArgumentParser, *, default_root: bool = True, machine: bool = False
) -> None:
    """--topology FILE | --sysfs-root DIR, and with `machine` --machine NAME (a shape of the
    catalogue, `corepin.testing.catalogue`): one of them (`load_topology` reads it)."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--topology",
        metavar="FILE",
        help="topology JSON file (the form `corepin topology -o json` prints)",
    )
    group.add_argument(
        "--sysfs-root",
        metavar="DIR",
        default=None,
        help="read DIR/sys/devices/system/{cpu,node} instead of this machine's /sys"
        + (" (default: /)" if default_root else ""),
    )
    if machine:
        group.add_argument(
            "--machine",
            metavar="NAME",
            help="a synthetic machine of a named shape instead of this one (intel-2s-ht, "
            "epyc-4l3, alderlake, arm-clusters, gpu-server, ...; `--machine list` prints "
            "the names)",
        )


def list_machines(args: argparse.Namespace) -> bool:
    """With `--machine list`: print the catalogue's machine names, one per line, and say so
    (the command then exits 0 without doing anything else)."""
    if getattr(args, "machine", None) != "list":
        return False
    from corepin.testing.catalogue import names

    write_output("".join(f"{name}\n" for name in names()), None)
    return True


def add_state_arguments(parser: argparse.ArgumentParser, *, cgroups_help: str) -> None:
    """The host-mode settings every state-keeping command takes (`HostSettings.from_args`):
    --state-dir DIR, --cgroups auto|on|off (`cgroups_help` says what cgroups do for this
    command) and the hidden --cgroup-root DIR."""
    parser.add_argument(
        "--state-dir",
        metavar="DIR",
        help="state directory (default: $COREPIN_STATE_DIR or /var/lib/corepin)",
    )
    parser.add_argument("--cgroups", choices=("auto", "on", "off"), help=cgroups_help)
    parser.add_argument("--cgroup-root", metavar="DIR", help=argparse.SUPPRESS)


def missing_state_dir(state_dir: str) -> str | None:
    """For a command that only reads the state (`report`, `shield status`): when `state_dir`
    does not exist, a note naming it for the table (the command reports the empty state such a
    directory stands for, exit 0, as JSON and YAML too; its table says why, so that a mistyped
    directory does not pass for an idle host); None when it exists. The commands that write
    create the directory."""
    import os

    if os.path.lexists(state_dir):
        return None
    return f"state directory {state_dir!r} does not exist: nothing has run with it yet"


def add_host_arguments(
    parser: argparse.ArgumentParser, *, cgroups_help: str = HOST_CGROUPS_HELP
) -> None:
    """The state arguments (`add_state_arguments`) and the hidden --sysfs-root DIR and
    --proc-root DIR of a host-mode command."""
    add_state_arguments(parser, cgroups_help=cgroups_help)
    parser.add_argument("--sysfs-root", metavar="DIR", help=argparse.SUPPRESS)
    parser.add_argument("--proc-root", metavar="DIR", help=argparse.SUPPRESS)


def add_qos_arguments(parser: argparse.ArgumentParser, *, config: bool = True) -> None:
    """Node QoS options of host mode: --qos-config FILE (with `config`) and --resctrl-root DIR
    (`qos_from` reads them)."""
    if config:
        parser.add_argument(
            "--qos-config",
            metavar="FILE",
            help="node QoS policy (YAML or JSON: classes, beSuppress, cpuBurst, beCPUIdle); "
            "kept in the state directory for later commands (default: the last one given)",
        )
    parser.add_argument(
        "--resctrl-root",
        metavar="DIR",
        help="where resctrl is mounted (default: /sys/fs/resctrl; not there: a note, no error)",
    )


def qos_from(args: argparse.Namespace) -> tuple[QosPolicy | None, str | None]:
    """(the QoS policy in --qos-config FILE or None, --resctrl-root or None). A bad file is
    an InputError naming it and the field, before anything is touched."""
    root = getattr(args, "resctrl_root", None)
    if root == "":
        raise InputError("--resctrl-root '' names no directory", reason="bad_usage")
    path = getattr(args, "qos_config", None)
    if path is None:
        return None, root
    if path == "":
        raise InputError("--qos-config '' names no file", reason="bad_usage")
    from corepin.agent.qos_file import read_policy_file

    return read_policy_file(path), root


def cpu_list(text: str) -> CPUSet:
    """argparse type: a CPU (or NUMA node) list such as `0-3,8` (the message names the bad
    value)."""
    from corepin.core.cpuset import CPUSet
    from corepin.core.errors import CPUSetParseError

    try:
        return CPUSet.parse(text)
    except CPUSetParseError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


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
        type=cpu_list,
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


def add_near_arguments(parser: argparse.ArgumentParser) -> None:
    """--near DEVICE (repeatable) and --near-strict: CPUs near the devices a workload uses."""
    parser.add_argument(
        "--near",
        action="append",
        default=[],
        metavar="DEVICE",
        help="prefer CPUs near this device (its local CPUs, its NUMA node's): a PCI address, "
        "a network interface, a block device or a device node such as /dev/nvidia0; "
        "repeatable (near any of them); memory follows the CPUs",
    )
    parser.add_argument(
        "--near-strict",
        action="store_true",
        help="with --near: only CPUs near the devices (exit 3 when they cannot be had)",
    )


def near_names(args: argparse.Namespace) -> tuple[str, ...]:
    """The --near devices as given (stripped); InputError for an empty one, or for
    --near-strict without --near."""
    names = tuple(name.strip() for name in getattr(args, "near", None) or ())
    if any(not name for name in names):
        raise InputError("--near '' names no device", reason="bad_usage")
    if getattr(args, "near_strict", False) and not names:
        raise InputError("--near-strict needs --near DEVICE", reason="bad_usage")
    return names


def near_options(options: dict[str, str], near: CPUSet | None, strict: bool) -> dict[str, str]:
    """`options` with the request options of --near (`near=CPUS`, `near-strict`) added;
    InputError when --option gave them too."""
    if near is None:
        return options
    for name in ("near", "near-strict"):
        if name in options:
            raise InputError(
                f"--option {name} and --near both choose the CPUs to be near: give one",
                reason="bad_option",
            )
    out = dict(options)
    out["near"] = str(near)
    if strict:
        out["near-strict"] = "true"
    return out


def reserve_from(args: argparse.Namespace) -> tuple[int, CPUSet | None] | None:
    """(count, explicit CPUs) for HostAgent from --reserved-cpus / --reserved-count."""
    cpus = getattr(args, "reserved_cpus", None)
    count = getattr(args, "reserved_count", None)
    if cpus is not None:
        return (0, cpus)
    if count is not None:
        return (count, None)
    return None


def load_topology(args: argparse.Namespace) -> Topology:
    """The topology named by --topology FILE or --machine NAME, else discovered under
    --sysfs-root (default /)."""
    path = getattr(args, "topology", None)
    root = getattr(args, "sysfs_root", None)
    name = getattr(args, "machine", None)
    for option, value in (("--topology", path), ("--sysfs-root", root), ("--machine", name)):
        if value == "":
            raise InputError(
                f"{option} '' names nothing: give a file or directory, or leave the option out",
                reason="bad_usage",
            )
    if name is not None:
        from corepin.testing.catalogue import machine

        return machine(name)
    if path is not None:
        from corepin.topology.model import Topology

        return Topology.from_json(read_json_file(path, what="topology file"))
    from corepin.topology.discover import discover

    return discover(root or "/")


def read_json_file(path: str, *, what: str) -> Any:
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except FileNotFoundError:
        raise InputError(f"{what} {path!r} does not exist", reason="no_such_file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read {what} {path!r}: {exc}", reason="unreadable_file") from exc
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise TopologyError(
            f"{what} {path!r} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}",
            reason="bad_json",
        ) from None


#: The names of `-o` formats: the human one is `table` everywhere; `text`, its old name in
#: some commands, is still accepted.
FORMAT_ALIASES = {"text": "table"}


def _format(text: str) -> str:
    return FORMAT_ALIASES.get(text, text)


def add_output_argument(
    parser: argparse.ArgumentParser,
    *,
    formats: tuple[str, ...] = ("table", "json", "yaml"),
    default: str | None = "table",
    help: str | None = None,
) -> None:
    """-o/--output FORMAT, the same on every command that reports: `table` (the default, for
    people; `text` is an alias), `json` (pretty-printed) and `yaml`, plus the command's own
    (`svg`, `tree`). `render_output` turns the data into the chosen text."""
    if help is None:
        help = "output format: " + ", ".join(formats) + " (default: table)"
    parser.add_argument(
        "-o",
        "--output",
        type=_format,
        choices=formats,
        default=default,
        metavar="{" + ",".join(formats) + "}",
        help=help,
    )


def render_output(fmt: str, data: Any, table: Callable[[], str], *, compact: bool = False) -> str:
    """The one place that decides what `-o FORMAT` prints: `json` (indented by 2; with
    `compact`, one line), `yaml`, or else the command's own text, `table()`."""
    if fmt in ("json", "yaml"):
        return dump(data, fmt, compact=compact)
    return table()


def dump(data: Any, fmt: str, *, compact: bool = False) -> str:
    """Render plain data as `json` (indented by 2, or one line with `compact`) or `yaml` text
    (ending with a newline)."""
    if fmt == "json":
        if compact:
            return json.dumps(data) + "\n"
        return json.dumps(data, indent=2) + "\n"
    if fmt == "yaml":
        import yaml

        return str(yaml.safe_dump(data, sort_keys=False, default_flow_style=False))
    raise InputError(f"unknown output format {fmt!r}")


def stream_output(pieces: Iterable[str], out: str | None) -> None:
    """Write `pieces` one after the other to standard output or the file `out` (for output too
    big to hold as one string); failures as in `write_output`."""
    if out is None or out == "-":
        try:
            for piece in pieces:
                sys.stdout.write(piece)
            sys.stdout.flush()
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise EnvironmentProblem(
                f"cannot write to standard output: {exc.strerror or exc}",
                reason="stdout_unwritable",
            ) from exc
        return
    try:
        with open(out, "w", encoding="utf-8") as handle:
            for piece in pieces:
                handle.write(piece)
    except OSError as exc:
        raise InputError(f"cannot write output file {out!r}: {exc}", reason="unwritable") from exc


def write_output(text: str, out: str | None) -> None:
    """Print `text`, or write it to the file `out` (atomically enough for a CLI: whole text).
    A failing write is an InputError naming the file, or EnvironmentProblem for stdout."""
    if out is None or out == "-":
        try:
            sys.stdout.write(text)
            sys.stdout.flush()
        except BrokenPipeError:
            raise  # the reader went away: cli.main treats that as success
        except OSError as exc:
            raise EnvironmentProblem(
                f"cannot write to standard output: {exc.strerror or exc}",
                reason="stdout_unwritable",
            ) from exc
        return
    try:
        with open(out, "w", encoding="utf-8") as handle:
            handle.write(text)
    except OSError as exc:
        raise InputError(f"cannot write output file {out!r}: {exc}", reason="unwritable") from exc


def stop_on_signals() -> threading.Event:
    """An event that SIGTERM and SIGINT set (a server command's clean stop). Install it before
    anything starts serving, so a signal that arrives while the first lists load still stops
    the command cleanly instead of killing it."""
    import signal
    import threading

    done = threading.Event()

    def on_signal(_signum: int, _frame: object) -> None:
        done.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return done
