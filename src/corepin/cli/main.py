"""The `corepin` command: argument parsing, dispatch, and the one place mapping errors to exits.

Each subcommand lives in its own module with two functions:
`add_arguments(parser)` (cheap: no heavy imports at module level) and `run(args) -> int`.
Modules are only imported for the subcommand that runs (and to build `--help`).

This is also the one place that sets up logging, for every subcommand alike. corepin's log
records are informational notes (sysfs fallbacks on old kernels, state repairs, ...): by
default they print nothing, so that stdout and stderr carry only the command's own output and
one-line errors. `-v` (INFO) or `-vv` (DEBUG), before or after the subcommand, or
`COREPIN_LOG=debug|info|warning|error` show them on stderr; the more verbose of the two wins.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, NoReturn

from corepin.core.errors import (
    EXIT_INPUT,
    EXIT_INTERNAL,
    CorepinError,
    InputError,
    StateFormatError,
)

#: subcommand -> (module, one-line help). The order is the order of `corepin --help`.
COMMANDS: dict[str, tuple[str, str]] = {
    "topology": ("corepin.cli.topology_cmd", "show this machine's CPU/NUMA/cache topology"),
    "allocate": ("corepin.cli.allocate_cmd", "compute one allocation decision (no side effects)"),
    "simulate": ("corepin.cli.simulate_cmd", "replay a trace through policies and compare them"),
    "run": ("corepin.cli.run_cmd", "run a command pinned to exclusive or shared CPUs"),
    "pin": ("corepin.cli.pin_cmd", "adopt a running process: pin it and its children"),
    "report": ("corepin.cli.report_cmd", "show who holds which CPUs on this host"),
    "reconcile": ("corepin.cli.reconcile_cmd", "free dead allocations and re-apply drifted pins"),
    "release": (
        "corepin.cli.release_cmd",
        "end an allocation on purpose (optionally its processes)",
    ),
    "reserve": (
        "corepin.cli.reserve_cmd",
        "hold CPUs for a run to come (corepin run --reservation NAME)",
    ),
    "shield": ("corepin.cli.shield_cmd", "keep unmanaged tasks off exclusive CPUs (on|off|status)"),
    "migrate": ("corepin.cli.migrate_cmd", "import the kubelet's cpu_manager_state into corepin"),
    "agent": ("corepin.cli.agent_cmd", "run the Kubernetes node agent of one node"),
    "nri": ("corepin.cli.nri_cmd", "run as the container runtime's NRI plugin (pins at creation)"),
    "webhook": ("corepin.cli.webhook_cmd", "serve the admission webhook for pods (HTTPS)"),
    "controller": (
        "corepin.cli.controller_cmd",
        "run the cluster controller (validates PodCPUBindings, tidies; leader-elected)",
    ),
    "scheduler": ("corepin.cli.placement_cmd", "run the topology-aware second scheduler"),
    "extender": ("corepin.cli.placement_cmd", "serve the kube-scheduler extender"),
    "dev": (
        "corepin.cli.dev_cmd",
        "development helpers: `dev cluster`, a stand-in cluster on this machine",
    ),
}


_width: list[int] = []


def _terminal_width() -> int:
    """The help width: $COLUMNS, else the terminal's, else 80 (less 2), read once per process
    (argparse makes a formatter for every `add_argument`)."""
    if not _width:
        try:
            columns = int(os.environ.get("COLUMNS", "0")) or os.get_terminal_size(1).columns
        except (ValueError, OSError):
            columns = 80
        _width.append(columns - 2)
    return _width[0]


class _Formatter(argparse.HelpFormatter):
    """argparse's help layout with the terminal width read through `os` (argparse's own
    formatter imports shutil, and with it zlib, bz2 and lzma, on every `add_argument`)."""

    def __init__(
        self,
        prog: str,
        indent_increment: int = 2,
        max_help_position: int = 24,
        width: int | None = None,
    ) -> None:
        if width is None:
            width = _terminal_width()
        super().__init__(prog, indent_increment, max_help_position, width)


class _Parser(argparse.ArgumentParser):
    """argparse with our message format; usage errors exit 2."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_INPUT, f"corepin: error: {message}\n")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The full parser; with `only`, just that subcommand (its module imported, its options
    added; the other subcommands are left out, and with them one argparse parser each and its
    message-catalogue lookups), which keeps start-up cheap for the common case. `main` passes
    `only` when the command line names a known subcommand, so nothing else can be asked for."""
    parser = _Parser(
        prog="corepin",
        description=(
            "Topology-aware CPU and NUMA resource manager: gives workloads exclusive or shared "
            "CPUs aligned to sockets, NUMA nodes, L3 caches and cores, and pins their memory."
        ),
        epilog="Exit codes: 0 ok, 1 internal error, 2 bad input, 3 request cannot be satisfied, "
        "4 environment not usable.",
    )
    from corepin import __version__

    parser.add_argument("--version", action="version", version=f"corepin {__version__}")
    _add_verbose(parser, "verbose")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name, (module_name, help_text) in COMMANDS.items():
        if only is not None and name != only:
            continue
        __import__(module_name)  # importlib.import_module would load importlib for this
        module = sys.modules[module_name]
        cmd = sub.add_parser(name, help=help_text, description=help_text)
        module.add_arguments(cmd, name)
        _add_verbose(cmd, "sub_verbose")
        cmd.set_defaults(_module=module)
    return parser


def interrupted(exc: BaseException) -> bool:
    """Whether `exc` is a Ctrl-C, also when Python wrapped it on the way (a KeyboardInterrupt
    inside a class body being built while a module loads comes out as a RuntimeError)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, KeyboardInterrupt):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


def _add_verbose(parser: argparse.ArgumentParser, dest: str) -> None:
    # The subcommand counts into its own dest: argparse would otherwise let the subparser's
    # default overwrite a -v given before the subcommand.
    parser.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=0,
        dest=dest,
        help="show corepin's informational notes on stderr (-vv: debug detail too); "
        "also COREPIN_LOG=info|debug",
    )


#: COREPIN_LOG values and -v counts, as logging levels (numbers of the logging module).
LOG_LEVELS: dict[str, int] = {"debug": 10, "info": 20, "warning": 30, "error": 40}


def log_level(verbosity: int, environ: Mapping[str, str]) -> int | None:
    """The level to show corepin's log records at, or None to show nothing: the more verbose
    of `-v` (1 INFO, 2+ DEBUG) and COREPIN_LOG (empty counts as unset; other values are an
    InputError)."""
    levels = []
    if verbosity > 0:
        levels.append(LOG_LEVELS["info"] if verbosity == 1 else LOG_LEVELS["debug"])
    name = environ.get("COREPIN_LOG", "").strip().lower()
    if name:
        if name not in LOG_LEVELS:
            raise InputError(
                f"COREPIN_LOG={environ['COREPIN_LOG']!r} is not a log level (choose from "
                f"{', '.join(LOG_LEVELS)})",
                reason="bad_log_level",
            )
        levels.append(LOG_LEVELS[name])
    return min(levels) if levels else None


@contextlib.contextmanager
def logging_for(level: int | None) -> Iterator[None]:
    """corepin's loggers print at `level` (None: nothing at all) while the command runs; the
    previous configuration is restored afterwards (main() may run inside a bigger program).
    With nothing to show, `logging` is not even loaded (`corepin.core.log`) unless a module
    uses it directly."""
    from corepin.core import log

    if level is None and "logging" not in sys.modules:
        previous = log.silence(True)
        try:
            yield
        finally:
            log.silence(previous)
        return
    import logging

    logger = logging.getLogger("corepin")
    saved = (logger.level, logger.propagate, list(logger.handlers))
    handler: logging.Handler
    if level is None:
        handler = logging.NullHandler()  # no handler would mean logging's "last resort" prints
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("corepin: %(name)s %(levelname)s %(message)s"))
    logger.handlers = [handler]
    logger.setLevel(logging.CRITICAL + 1 if level is None else level)
    logger.propagate = False
    try:
        yield
    finally:
        logger.setLevel(saved[0])
        logger.propagate = saved[1]
        logger.handlers = saved[2]


def fix_hint(args: argparse.Namespace, exc: CorepinError) -> str:
    """What to add to the message of `exc`: for a corepin checkpoint that cannot be read
    (not the kubelet's, which `corepin migrate` reads), the command that moves it aside."""
    if not isinstance(exc, StateFormatError) or args.command == "migrate":
        return ""
    import shlex

    where = getattr(args, "state_dir", None)
    option = f" --state-dir {shlex.quote(where)}" if where else ""
    return (
        f"; if it cannot be restored, `corepin migrate --quarantine{option}` moves it aside "
        "(state.json.corrupt-<time>) and corepin starts again from an empty state"
    )


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    first = next((a for a in argv if not a.startswith("-")), None)
    try:
        parser = build_parser(first if first in COMMANDS else None)
        args = parser.parse_args(argv)
    except BaseException as exc:
        if interrupted(exc):
            return 130
        raise
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_INPUT
    try:
        level = log_level(args.verbose + args.sub_verbose, os.environ)
        with logging_for(level):
            code: int = args._module.run(args)
        return code
    except CorepinError as exc:
        print(f"corepin {args.command}: {exc}{fix_hint(args, exc)}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0
    except Exception as exc:  # a bug: say so, keep the traceback for COREPIN_DEBUG
        if interrupted(exc):
            return 130
        if os.environ.get("COREPIN_DEBUG"):
            raise
        print(
            f"corepin {args.command}: internal error: {type(exc).__name__}: {exc} "
            "(this is a bug; rerun with COREPIN_DEBUG=1 for a traceback and report it)",
            file=sys.stderr,
        )
        return EXIT_INTERNAL


if __name__ == "__main__":
    raise SystemExit(main())
