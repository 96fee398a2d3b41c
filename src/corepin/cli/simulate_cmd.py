"""`corepin simulate`: replay a trace through policies and compare them (CONTRACTS.md section 4).

corepin simulate --topology FILE|--sysfs-root DIR --trace TRACE.json [--policy NAME]...
                 [--decisions FILE] [-o table|json]
corepin simulate --generate --topology FILE|--sysfs-root DIR [--seed N] [--events N]
                 [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import IO, TYPE_CHECKING, Any

from corepin.cli.common import add_topology_source, load_topology, read_json_file, write_output
from corepin.core.errors import InputError

if TYPE_CHECKING:
    from corepin.allocation.simulate import DecisionRecord, PolicyResult
    from corepin.allocation.types import Policy

#: Traces with at least this many events get a progress bar (when stderr is a terminal).
PROGRESS_MIN_EVENTS = 2000


def add_arguments(parser: argparse.ArgumentParser, name: str = "simulate") -> None:
    add_topology_source(parser)
    parser.add_argument("--trace", metavar="TRACE.json", help="trace of add/remove events")
    parser.add_argument(
        "--policy",
        metavar="NAME",
        action="append",
        default=None,
        help="policy to replay (repeat for several; default: every registered policy)",
    )
    parser.add_argument(
        "--decisions",
        metavar="FILE",
        help="write one JSON line per add event and policy: policy, event, id, cpus, reason",
    )
    parser.add_argument(
        "-o", "--output", choices=("table", "json"), default="table", help="output format"
    )
    gen = parser.add_argument_group("trace generation")
    gen.add_argument(
        "--generate",
        action="store_true",
        help="write a generated churn trace for the topology instead of replaying one",
    )
    gen.add_argument("--seed", type=int, default=0, help="generator seed (default 0)")
    gen.add_argument(
        "--events", type=int, default=2000, help="number of generated events (default 2000)"
    )
    gen.add_argument(
        "--out", metavar="FILE", help="write the generated trace here (default: stdout)"
    )


def _policies(names: list[str] | None) -> list[Policy]:
    """The named policies (each once, in the order given), else every registered policy."""
    from corepin.allocation.policies import POLICY_NAMES, get_policy

    return [get_policy(n) for n in dict.fromkeys(names or POLICY_NAMES)]


class _ProgressBar:
    """A plain `\\r` text bar on a terminal stream; silent otherwise."""

    def __init__(self, stream: IO[str], label: str, width: int = 30) -> None:
        self.stream = stream
        self.label = label
        self.width = width

    def __call__(self, done: int, total: int) -> None:
        filled = self.width * done // total if total else self.width
        pct = 100 * done // total if total else 100
        bar = "#" * filled + "-" * (self.width - filled)
        self.stream.write(f"\r{self.label:<16} [{bar}] {pct:3d}% {done}/{total} events")
        if done >= total:
            self.stream.write("\n")
        self.stream.flush()


def _fmt_ratio(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def render_table(results: list[PolicyResult]) -> str:
    header = (
        "POLICY",
        "ADMITTED",
        "REJECTED",
        "NUMA-ALIGNED",
        "LLC-ALIGNED",
        "FULL-CORE",
        "SECONDS",
        "EVENTS/S",
    )
    rows = [header]
    for r in results:
        eps = r.events_per_second
        rows.append(
            (
                r.policy,
                str(r.admitted),
                str(r.rejected),
                _fmt_ratio(r.numa_aligned_ratio),
                _fmt_ratio(r.llc_aligned_ratio),
                _fmt_ratio(r.full_core_ratio),
                f"{r.seconds:.3f}",
                "-" if eps is None else f"{eps:,.0f}",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = [
        "  ".join(
            cell.ljust(w) if i == 0 else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in rows
    ]
    for r in results:
        if r.reasons:
            text = ", ".join(f"{k} {v}" for k, v in sorted(r.reasons.items()))
            lines.append(f"{r.policy} rejections: {text}")
    return "\n".join(lines) + "\n"


def _unwritable(path: str, exc: OSError) -> InputError:
    return InputError(f"cannot write decisions file {path!r}: {exc}", reason="unwritable")


def _generate(args: argparse.Namespace) -> int:
    from corepin.allocation.tracegen import ChurnOptions, generate_trace

    if args.trace:
        raise InputError("--generate writes a trace; do not also give --trace", reason="usage")
    if args.events < 0:
        raise InputError(f"--events must be a non-negative integer, got {args.events}")
    topology = load_topology(args)
    trace = generate_trace(topology, seed=args.seed, options=ChurnOptions(events=args.events))
    write_output(json.dumps(trace, separators=(",", ":")) + "\n", args.out)
    return 0


def run(args: argparse.Namespace) -> int:
    if args.generate:
        return _generate(args)
    if not args.trace:
        raise InputError("simulate needs --trace TRACE.json (or --generate)", reason="usage")
    from corepin.allocation.simulate import AlignmentMetrics, parse_trace, replay

    trace = parse_trace(read_json_file(args.trace, what="trace file"))
    topology = load_topology(args)
    policies = _policies(args.policy)
    sink: IO[str] | None = None
    if args.decisions:
        try:
            sink = open(args.decisions, "w", encoding="utf-8")  # noqa: SIM115 - closed below
        except OSError as exc:
            raise _unwritable(args.decisions, exc) from exc
    show_progress = (
        args.output == "table" and len(trace.events) >= PROGRESS_MIN_EVENTS and sys.stderr.isatty()
    )
    metrics = AlignmentMetrics(topology)
    results: list[PolicyResult] = []
    try:
        for policy in policies:
            on_decision = None
            if sink is not None:
                out = sink

                def on_decision(record: DecisionRecord, out: IO[str] = out) -> None:
                    try:
                        out.write(json.dumps(record.to_json(), separators=(",", ":")) + "\n")
                    except OSError as exc:
                        raise _unwritable(args.decisions, exc) from exc

            progress = _ProgressBar(sys.stderr, policy.name) if show_progress else None
            start = time.perf_counter()
            result = replay(
                topology,
                trace,
                policy,
                on_decision=on_decision,
                progress=progress,
                metrics=metrics,
            )
            results.append(result.with_seconds(time.perf_counter() - start))
    finally:
        if sink is not None:
            try:
                sink.close()
            except OSError as exc:
                raise _unwritable(args.decisions, exc) from exc
    if args.output == "json":
        data: list[dict[str, Any]] = [r.to_json() for r in results]
        write_output(json.dumps(data, indent=2) + "\n", None)
    else:
        write_output(render_table(results), None)
    return 0
