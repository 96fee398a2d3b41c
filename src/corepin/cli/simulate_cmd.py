"""`corepin simulate`: replay a trace through policies and compare them.

corepin simulate --topology FILE|--sysfs-root DIR|--machine NAME --trace TRACE.json
                 [--policy NAME]... [--decisions FILE] [--rebalance [--rebalance-limit N]]
                 [-o table|json|yaml]
corepin simulate --generate --topology FILE|--sysfs-root DIR|--machine NAME [--seed N] [--events N]
                 [--out FILE]

Traces of any length run in bounded memory: `--generate` writes the events as the generator
yields them, and a replay streams the trace file (`corepin.allocation.tracestream`) once per
policy (plus a first pass that checks and counts it when --decisions or a progress bar needs
that). A trace that cannot be read twice (a pipe) is read into memory once instead. The seconds
of a result leave out the time spent reading the trace.

`--rebalance` replays each policy twice, without and with the rebalancing planner moving live
exclusive allocations after each event (at most `--rebalance-limit` moves per event), and
reports the gain: the NUMA-aligned and LLC-aligned shares of exclusive CPU-time, and the moves
made. `--decisions` then records the admissions of the replay without rebalancing.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import stat
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from typing import IO, TYPE_CHECKING, Any

from corepin.cli.common import (
    add_output_argument,
    add_topology_source,
    list_machines,
    load_topology,
    read_json_file,
    render_output,
    stream_output,
    write_output,
)
from corepin.core.errors import InputError

if TYPE_CHECKING:
    from corepin.allocation.simulate import DecisionRecord, PolicyResult, TraceEvent
    from corepin.allocation.types import Policy

#: Traces with at least this many events get a progress bar (when stderr is a terminal).
PROGRESS_MIN_EVENTS = 2000
#: Moves the rebalancing planner may make after each event (`--rebalance-limit`).
REBALANCE_LIMIT = 2


def add_arguments(parser: argparse.ArgumentParser, name: str = "simulate") -> None:
    add_topology_source(parser, machine=True)
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
    add_output_argument(
        parser, default=None, help="output format of a replay: table (default), json or yaml"
    )
    parser.add_argument(
        "--rebalance",
        action="store_true",
        help="replay each policy without and with rebalancing (live moves of misaligned "
        "exclusive allocations) and report the gain",
    )
    parser.add_argument(
        "--rebalance-limit",
        type=int,
        default=None,
        metavar="N",
        help=f"with --rebalance: at most N moves after each event (default {REBALANCE_LIMIT})",
    )
    gen = parser.add_argument_group("trace generation")
    gen.add_argument(
        "--generate",
        action="store_true",
        help="write a generated churn trace for the topology instead of replaying one",
    )
    gen.add_argument("--seed", type=int, default=None, help="generator seed (default 0)")
    gen.add_argument(
        "--events", type=int, default=None, help="number of generated events (default 2000)"
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


def _gain(before: float | None, after: float | None) -> float | None:
    return None if before is None or after is None else round(after - before, 4)


def _fmt_change(before: float | None, after: float | None) -> str:
    gain = _gain(before, after)
    if gain is None:
        return "-"
    return f"{_fmt_ratio(before)} -> {_fmt_ratio(after)} ({100 * gain:+.1f})"


def render_rebalance_table(pairs: list[tuple[PolicyResult, PolicyResult]]) -> str:
    """The gain of rebalancing per policy: (without, with) results of one trace."""
    header = (
        "POLICY",
        "ADMITTED",
        "MOVES",
        "MOVES/1K EVENTS",
        "NUMA-ALIGNED CPU-TIME",
        "LLC-ALIGNED CPU-TIME",
        "SECONDS",
    )
    rows = [header]
    for plain, moved in pairs:
        per_k = moved.moves_per_1000_events
        admitted = str(plain.admitted)
        if moved.admitted != plain.admitted:
            admitted += f" -> {moved.admitted}"
        rows.append(
            (
                plain.policy,
                admitted,
                str(moved.moves),
                "-" if per_k is None else f"{per_k:.1f}",
                _fmt_change(plain.numa_aligned_time_ratio, moved.numa_aligned_time_ratio),
                _fmt_change(plain.llc_aligned_time_ratio, moved.llc_aligned_time_ratio),
                f"{plain.seconds:.3f} -> {moved.seconds:.3f}",
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
    return "Rebalancing (without -> with):\n" + "\n".join(lines) + "\n"


def rebalance_json(plain: PolicyResult, moved: PolicyResult) -> dict[str, Any]:
    """One policy's JSON with --rebalance: the replay without rebalancing, the one with it
    under `rebalanced`, and the gain in aligned shares of exclusive CPU-time."""
    out = plain.to_json()
    out["rebalanced"] = moved.to_json()
    out["gain"] = {
        "numa_aligned_time": _gain(plain.numa_aligned_time_ratio, moved.numa_aligned_time_ratio),
        "llc_aligned_time": _gain(plain.llc_aligned_time_ratio, moved.llc_aligned_time_ratio),
        "moves": moved.moves,
        "moves_per_1000_events": moved.moves_per_1000_events,
    }
    return out


def _unwritable(path: str, exc: OSError) -> InputError:
    return InputError(f"cannot write decisions file {path!r}: {exc}", reason="unwritable")


def _generate(args: argparse.Namespace) -> int:
    from corepin.allocation.tracegen import ChurnOptions, iter_trace_events

    if args.trace is not None:
        raise InputError("--generate writes a trace; do not also give --trace", reason="usage")
    replay_only = _given(args, ("--policy", "policy"), ("--decisions", "decisions"))
    if args.output is not None:
        replay_only.append(f"-o {args.output}")
    if args.rebalance:
        replay_only.append("--rebalance")
    if replay_only:
        raise InputError(
            f"{', '.join(replay_only)}: replay options, meaningless with --generate (which "
            "writes a trace): replay the trace in a second run",
            reason="usage",
        )
    events = 2000 if args.events is None else args.events
    if events < 0:
        raise InputError(f"--events must be a non-negative integer, got {events}")
    topology = load_topology(args)
    seed = 0 if args.seed is None else args.seed
    stream = iter_trace_events(topology, seed=seed, options=ChurnOptions(events=events))
    stream_output(_trace_text(stream), args.out)
    return 0


def _trace_text(events: Iterator[dict[str, Any]], batch: int = 4096) -> Iterator[str]:
    """The text of `json.dumps({"events": [...]}, separators=(",", ":")) + "\n"`, in pieces of
    `batch` events (the whole trace is never one string; each piece is one C-encoded list)."""
    encode = json.JSONEncoder(separators=(",", ":")).encode
    yield '{"events":['
    sep = ""
    while True:
        pieces = list(itertools.islice(events, batch))
        if not pieces:
            break
        yield sep + encode(pieces)[1:-1]
        sep = ","
    yield "]}\n"


def _trace_chunks(path: str, size: int = 1 << 18) -> Iterator[str]:
    """The text of the trace file `path`, `size` characters at a time."""
    try:
        handle = open(path, encoding="utf-8")  # noqa: SIM115 - closed below
    except FileNotFoundError:
        raise InputError(f"trace file {path!r} does not exist", reason="no_such_file") from None
    except OSError as exc:
        raise _unreadable(path, exc) from exc
    with handle:
        while True:
            try:
                chunk = handle.read(size)
            except (OSError, UnicodeDecodeError) as exc:
                raise _unreadable(path, exc) from exc
            if not chunk:
                return
            yield chunk


def _unreadable(path: str, exc: Exception) -> InputError:
    return InputError(f"cannot read trace file {path!r}: {exc}", reason="unreadable_file")


def _replayable(path: str) -> bool:
    """Whether the trace can be read once per policy (a regular file: streamed each time);
    a pipe or a terminal is read once, into memory."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return True  # let the first read report the problem


class _ReadClock:
    """An event stream that adds up the time spent reading it: a replay's seconds leave it
    out, so they measure the policy (as when the whole trace was read beforehand)."""

    def __init__(self, events: Iterable[TraceEvent]) -> None:
        self._events = events
        self.seconds = 0.0

    def __iter__(self) -> Iterator[TraceEvent]:
        clock = time.perf_counter
        stream = iter(self._events)
        while True:
            start = clock()
            event = next(stream, None)
            self.seconds += clock() - start
            if event is None:
                return
            yield event


def _given(args: argparse.Namespace, *options: tuple[str, str]) -> list[str]:
    """The options (flag, attribute) that were given on the command line."""
    return [flag for flag, attr in options if getattr(args, attr) is not None]


def run(args: argparse.Namespace) -> int:
    if list_machines(args):
        return 0
    if args.generate:
        return _generate(args)
    if args.rebalance_limit is not None:
        if not args.rebalance:
            raise InputError("--rebalance-limit needs --rebalance", reason="usage")
        if args.rebalance_limit < 1:
            raise InputError(
                f"--rebalance-limit must be a positive integer, got {args.rebalance_limit}",
                reason="usage",
            )
    generate_only = _given(args, ("--out", "out"), ("--seed", "seed"), ("--events", "events"))
    if generate_only:
        raise InputError(
            f"{', '.join(generate_only)}: trace generation options, meaningless without "
            "--generate (a replay prints its results; --decisions FILE writes them)",
            reason="usage",
        )
    if args.trace == "":
        raise InputError("--trace '' names no file: give TRACE.json", reason="usage")
    if args.trace is None:
        raise InputError("simulate needs --trace TRACE.json (or --generate)", reason="usage")
    from corepin.allocation.simulate import AlignmentMetrics, parse_trace, replay
    from corepin.allocation.tracestream import stream_trace

    # The trace is streamed once per policy. When decisions are written as they come, or a
    # progress bar needs the length, a first pass checks it whole and counts it, so a bad trace
    # is refused before any decision is written; otherwise the first replay checks it (the
    # results are printed only at the end, so a bad trace still prints nothing but the error).
    path = args.trace
    output = args.output or "table"
    bar = output == "table" and sys.stderr.isatty()
    kept: tuple[TraceEvent, ...] | None = None
    total: int | None = None
    if not _replayable(path):
        kept = parse_trace(read_json_file(path, what="trace file")).events
        total = len(kept)
    elif args.decisions or bar:
        total = sum(1 for _ in stream_trace(_trace_chunks(path)))

    def events() -> Iterable[TraceEvent]:
        return kept if kept is not None else stream_trace(_trace_chunks(path))

    topology = load_topology(args)
    policies = _policies(args.policy)
    sink: IO[str] | None = None
    if args.decisions:
        try:
            sink = open(args.decisions, "w", encoding="utf-8")  # noqa: SIM115 - closed below
        except OSError as exc:
            raise _unwritable(args.decisions, exc) from exc
    show_progress = bar and total is not None and total >= PROGRESS_MIN_EVENTS
    metrics = AlignmentMetrics(topology)
    limit = REBALANCE_LIMIT if args.rebalance_limit is None else args.rebalance_limit
    results: list[PolicyResult] = []
    rebalanced: list[PolicyResult] = []

    def replay_one(
        policy: Policy,
        rebalance: bool,
        on_decision: Callable[[DecisionRecord], None] | None,
        label: str,
    ) -> PolicyResult:
        nonlocal total
        progress = _ProgressBar(sys.stderr, label) if show_progress else None
        reading = _ReadClock(events())
        start = time.perf_counter()
        result = replay(
            topology,
            reading,
            policy,
            on_decision=on_decision,
            progress=progress,
            metrics=metrics,
            total=total,
            rebalance=rebalance,
            rebalance_limit=limit,
        )
        if total is None:
            total = result.events
        elif result.events != total:
            raise InputError(
                f"trace file {path!r} changed while it was replayed ({total} events, then "
                f"{result.events})",
                reason="trace_changed",
            )
        elapsed = time.perf_counter() - start
        return result.with_seconds(max(0.0, elapsed - reading.seconds))

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

            results.append(replay_one(policy, False, on_decision, policy.name))
            if args.rebalance:
                rebalanced.append(replay_one(policy, True, None, f"{policy.name} +moves"))
    finally:
        if sink is not None:
            try:
                sink.close()
            except OSError as exc:
                raise _unwritable(args.decisions, exc) from exc
    pairs = list(zip(results, rebalanced, strict=True)) if args.rebalance else []
    data: list[dict[str, Any]] = (
        [rebalance_json(plain, moved) for plain, moved in pairs]
        if args.rebalance
        else [r.to_json() for r in results]
    )

    def table() -> str:
        text = render_table(results)
        if args.rebalance:
            text += "\n" + render_rebalance_table(pairs)
        return text

    write_output(render_output(output, data, table), None)
    return 0
