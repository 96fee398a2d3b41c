"""`corepin simulate` generates and replays traces as streams, in bounded memory.

`--generate --events 100000000` once grew to 11.7 GiB: the whole trace was built as one list
and one string, and a replay read the whole file with `json.load`. Now events are generated,
written, read and replayed one at a time. The memory tests run the real command in a child
process and compare its peak RSS (VmHWM) for ten times more events.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from corepin.allocation.simulate import TraceError, parse_trace
from corepin.allocation.tracegen import ChurnOptions, generate_trace, iter_trace_events
from corepin.allocation.tracestream import stream_raw_events, stream_trace
from corepin.cli.main import main
from corepin.testing.machines import dual_socket_ht, single_socket_ht
from support.helpers import corepin_argv


def pieces(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


@pytest.fixture(scope="module")
def trace() -> dict[str, Any]:
    return generate_trace(dual_socket_ht(), seed=11, options=ChurnOptions(events=3000))


# ---------------------------------------------------------------------- the stream reader


@pytest.mark.parametrize("size", [1, 7, 4096, 1 << 20])
@pytest.mark.parametrize("indent", [None, 2], ids=["compact", "indented"])
def test_the_stream_reads_the_same_events_as_parse_trace(
    trace: dict[str, Any], size: int, indent: int | None
) -> None:
    text = json.dumps(trace, indent=indent)
    assert list(stream_trace(pieces(text, size))) == list(parse_trace(trace).events)


def test_the_generator_streams_the_events_of_generate_trace() -> None:
    options = ChurnOptions(events=2500)
    streamed = list(iter_trace_events(dual_socket_ht(), seed=4, options=options))
    assert streamed == generate_trace(dual_socket_ht(), seed=4, options=options)["events"]


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("", "must be an object"),
        ("[]", "must be an object"),
        ('{"events": [{"op": "add", "id": "a", "cpus": 1}', "expected ',' or ']'"),
        ('{"events": [{"op": "add", "id": "a", "cp', "not valid JSON"),
        ('{"events": [{"op": "add", "id": "a", "cpus": 1},]}', "not valid JSON"),
        ('{"events": []} []', "extra data"),
        ('{"events": {}}', "events must be a list"),
        ('{"event": []}', "unknown top-level field"),
        ('{"events": [], "x": 1}', "unknown top-level field"),
        ('{"events": [{"op": "add", "id": "a", "cpus": 0}]}', "cpus must be a positive"),
        (
            '{"events": [{"op": "add", "id": "a", "cpus": 1}, '
            '{"op": "add", "id": "a", "cpus": 1}]}',
            "duplicate add of live id",
        ),
    ],
    ids=[
        "an empty file",
        "a list at the top",
        "a truncated list",
        "a truncated event",
        "a trailing comma",
        "text after the trace",
        "events that are not a list",
        "a misspelt events key",
        "a second top-level key",
        "a bad event",
        "a duplicate live id",
    ],
)
def test_a_malformed_trace_is_a_trace_error(text: str, problem: str) -> None:
    for size in (1, 5, 1 << 20):
        with pytest.raises(TraceError, match=problem) as info:
            list(stream_trace(pieces(text, size)))
        assert info.value.exit_code == 2


def test_syntax_errors_name_the_line_and_column() -> None:
    text = '{\n  "events": [\n    {"op": "add", "id": "a", "cpus": 1},\n    {"op" "add"}\n  ]\n}\n'
    for size in (1, 3, 64):
        with pytest.raises(TraceError, match="at line 4 column 11"):  # as json.loads says
            list(stream_raw_events(pieces(text, size)))


# ---------------------------------------------------------------------- the command


def test_generate_writes_exactly_the_json_of_the_whole_trace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    topo = tmp_path / "topo.json"
    topo.write_text(json.dumps(dual_socket_ht().to_json()))
    for events in (0, 1, 4096, 4097, 9000):
        out = tmp_path / f"gen-{events}.json"
        argv = ["simulate", "--generate", "--topology", str(topo), "--seed", "5"]
        assert main([*argv, "--events", str(events), "--out", str(out)]) == 0
        whole = generate_trace(dual_socket_ht(), seed=5, options=ChurnOptions(events=events))
        assert out.read_text() == json.dumps(whole, separators=(",", ":")) + "\n"
    capsys.readouterr()


def _without_seconds(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {k: v for k, v in r.items() if k not in ("seconds", "events_per_second")} for r in results
    ]


def test_a_streamed_replay_gives_the_results_of_a_replay_from_memory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from corepin.allocation.policies import POLICY_NAMES, get_policy
    from corepin.allocation.simulate import replay

    topo = dual_socket_ht()
    data = generate_trace(topo, seed=2, options=ChurnOptions(events=3000))
    trace_file = tmp_path / "trace.json"
    trace_file.write_text(json.dumps(data, indent=1))
    topo_file = tmp_path / "topo.json"
    topo_file.write_text(json.dumps(topo.to_json()))
    decisions = tmp_path / "decisions.jsonl"
    argv = ["simulate", "--topology", str(topo_file), "--trace", str(trace_file), "-o", "json"]
    assert main([*argv, "--decisions", str(decisions)]) == 0
    streamed = json.loads(capsys.readouterr().out)
    records: list[dict[str, Any]] = []
    expected = []
    for name in POLICY_NAMES:
        result = replay(
            topo,
            parse_trace(data),
            get_policy(name),
            on_decision=lambda r: records.append(r.to_json()),
        )
        expected.append(result.to_json())
    assert _without_seconds(streamed) == _without_seconds(expected)
    assert [json.loads(line) for line in decisions.read_text().splitlines()] == records


@pytest.mark.parametrize("decisions", [False, True], ids=["results only", "with --decisions"])
def test_a_trace_bad_at_its_end_is_refused_with_nothing_written(
    decisions: bool, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    topo_file = tmp_path / "topo.json"
    topo_file.write_text(json.dumps(dual_socket_ht().to_json()))
    data = generate_trace(dual_socket_ht(), seed=2, options=ChurnOptions(events=3000))
    data["events"].append({"op": "add", "id": "late/bad/c", "cpus": -1})
    trace_file = tmp_path / "trace.json"
    trace_file.write_text(json.dumps(data))
    out = tmp_path / "decisions.jsonl"
    argv = ["simulate", "--topology", str(topo_file), "--trace", str(trace_file)]
    assert main([*argv, *(["--decisions", str(out)] if decisions else [])]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "trace event 3000 field 'cpus'" in captured.err
    assert not out.exists()


def test_a_trace_from_a_pipe_is_read_once_and_replayed_by_every_policy(tmp_path: Path) -> None:
    topo_file = tmp_path / "topo.json"
    topo_file.write_text(json.dumps(single_socket_ht().to_json()))
    data = generate_trace(single_socket_ht(), seed=1, options=ChurnOptions(events=500))
    done = subprocess.run(
        corepin_argv(
            "simulate", "--topology", str(topo_file), "--trace", "/dev/stdin", "-o", "json"
        ),
        input=json.dumps(data),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    results = json.loads(done.stdout)
    assert len(results) >= 2 and all(r["events"] == 500 for r in results)


# ---------------------------------------------------------------------- bounded memory


#: Runs `corepin ARGS` (cli.main, as `python -m corepin` does) and prints the peak resident set
#: size of this process, VmHWM, as the last line of stderr. (The ru_maxrss of a child is no
#: good here: Linux folds the parent's peak at fork into it, and pytest is bigger than corepin.)
PEAK = """
import atexit, sys
def peak():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            print("VmHWM", line.split()[1], file=sys.stderr)
atexit.register(peak)
from corepin.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def peak_rss_kib(*args: str) -> int:
    """Run `corepin ARGS` to its end in a child process; its peak RSS in KiB."""
    done = subprocess.run(
        [sys.executable, "-c", PEAK, *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    last = done.stderr.splitlines()[-1].split()
    assert last[0] == "VmHWM", done.stderr
    return int(last[1])


#: Growth of the peak RSS allowed for ten times more events (the old code grew by hundreds).
FLAT_KIB = 8 * 1024


@pytest.mark.slow
def test_generating_ten_times_more_events_needs_no_more_memory(tmp_path: Path) -> None:
    topo_file = tmp_path / "topo.json"
    topo_file.write_text(json.dumps(dual_socket_ht().to_json()))
    peaks = {}
    for events in (100_000, 1_000_000):
        out = tmp_path / f"gen-{events}.json"
        peaks[events] = peak_rss_kib(
            "simulate", "--generate", "--topology", str(topo_file), "--events", str(events),
            "--out", str(out),
        )  # fmt: skip
        assert out.stat().st_size > events * 40, "the whole trace was written"
    assert peaks[1_000_000] - peaks[100_000] < FLAT_KIB, peaks


@pytest.mark.slow
def test_replaying_ten_times_more_events_needs_no_more_memory(tmp_path: Path) -> None:
    topo = single_socket_ht()
    topo_file = tmp_path / "topo.json"
    topo_file.write_text(json.dumps(topo.to_json()))
    peaks = {}
    for events in (20_000, 200_000):
        trace_file = tmp_path / f"trace-{events}.json"
        generate = ["simulate", "--generate", "--topology", str(topo_file), "--seed", "3"]
        assert main([*generate, "--events", str(events), "--out", str(trace_file)]) == 0
        assert trace_file.stat().st_size > 1 << 20, "both traces span several 256 KiB reads"
        peaks[events] = peak_rss_kib(
            "simulate", "--topology", str(topo_file), "--trace", str(trace_file),
            "--policy", "topology-aware", "-o", "json",
        )  # fmt: skip
    assert peaks[200_000] - peaks[20_000] < FLAT_KIB, peaks
