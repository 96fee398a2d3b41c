"""Simulator memory: peak RSS of `corepin simulate` for growing traces, streamed vs in memory.

For each event count N the real command runs in a child process, and beside it, in the same
run, a child that does the same work the in-memory way corepin used before it streamed (the
baseline):

- generate: `corepin simulate --generate --events N --out FILE` vs
  `json.dumps(generate_trace(...))` written to FILE (the whole trace as one list and one string);
- replay: `corepin simulate --trace FILE --policy P -o json` vs
  `replay(topology, parse_trace(json.load(FILE)), P)` (the whole trace as one list of events).

Peak RSS is the child's VmHWM (/proc/self/status, printed at its exit), so it includes the
interpreter (about 15 MiB); ru_maxrss would not do, as Linux folds the parent's peak at fork into
a child's. Seconds are the child's wall time. The streamed figures should stay flat as
N grows; the in-memory ones grow with N (`--generate --events 100000000` once reached 11.7 GiB).
Nothing is recorded in baseline.json: the baseline is measured in the same run.

    python benchmarks/bench_simulate_memory.py [--quick] [--events 10000,100000,1000000]
                                               [--policy NAME] [--topology NAME]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from _common import REPO, describe, table, topology

#: Appended to every child: print its peak RSS (KiB) as the last line of stderr at exit.
PEAK = """
    import atexit as _atexit, sys as _sys
    def _peak():
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                print("VmHWM", line.split()[1], file=_sys.stderr)
    _atexit.register(_peak)
"""

#: `corepin ARGS` as `python -m corepin` runs it.
COREPIN = """
    import sys
    from corepin.cli.main import main
    sys.exit(main(sys.argv[1:]))
"""

IN_MEMORY_GENERATE = """
    import json, sys
    from corepin.allocation.tracegen import ChurnOptions, generate_trace
    from corepin.topology.model import Topology
    topo = Topology.from_json(json.load(open(sys.argv[1])))
    trace = generate_trace(topo, seed=1, options=ChurnOptions(events=int(sys.argv[2])))
    with open(sys.argv[3], "w") as out:
        out.write(json.dumps(trace, separators=(",", ":")) + "\\n")
"""

IN_MEMORY_REPLAY = """
    import json, sys
    from corepin.allocation.policies import get_policy
    from corepin.allocation.simulate import parse_trace, replay
    from corepin.topology.model import Topology
    topo = Topology.from_json(json.load(open(sys.argv[1])))
    with open(sys.argv[2]) as f:
        trace = parse_trace(json.load(f))
    replay(topo, trace, get_policy(sys.argv[3]))
"""

ENV = {**os.environ, "PYTHONPATH": str(REPO / "src")}


def measure(argv: list[str]) -> tuple[float, float]:
    """Run `argv` (a `python` or `corepin` command line) to its end: (peak RSS in MiB, wall
    seconds)."""
    start = time.perf_counter()
    done = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=ENV)
    seconds = time.perf_counter() - start
    last = done.stderr.decode().splitlines()[-1:] or [""]
    if done.returncode != 0 or not last[0].startswith("VmHWM "):
        raise SystemExit(f"{argv[3:]} failed ({done.returncode}): {done.stderr.decode()[-500:]}")
    return int(last[0].split()[1]) / 1024, seconds


def python(code: str, *args: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(PEAK) + textwrap.dedent(code), *args]


def corepin(*args: str) -> list[str]:
    return python(COREPIN, *args)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small traces (CI smoke run)")
    parser.add_argument("--events", default="", help="comma-separated event counts")
    parser.add_argument("--policy", default="topology-aware", help="policy of the replays")
    parser.add_argument("--topology", default="single_socket_ht", help="synthetic machine")
    args = parser.parse_args()
    default = "1000,10000,100000" if args.quick else "10000,100000,1000000"
    counts = [int(n) for n in (args.events or default).split(",")]
    topo = topology(args.topology)
    print(f"# {args.topology}: {describe(topo)}; replay policy {args.policy}")
    rows = [
        (
            "events",
            "trace MiB",
            "generate: streamed MiB",
            "in memory MiB",
            "streamed s",
            "in memory s",
            "replay: streamed MiB",
            "in memory MiB",
            "streamed s",
            "in memory s",
        )
    ]
    with tempfile.TemporaryDirectory(prefix="corepin-bench-") as tmp:
        topo_file = Path(tmp) / "topology.json"
        topo_file.write_text(json.dumps(topo.to_json()))
        for n in counts:
            streamed_file = Path(tmp) / f"streamed-{n}.json"
            memory_file = Path(tmp) / f"memory-{n}.json"
            gen_stream = measure(
                corepin(
                    "simulate", "--generate", "--topology", str(topo_file), "--seed", "1",
                    "--events", str(n), "--out", str(streamed_file),
                )
            )  # fmt: skip
            gen_memory = measure(
                python(IN_MEMORY_GENERATE, str(topo_file), str(n), str(memory_file))
            )
            if streamed_file.read_bytes() != memory_file.read_bytes():
                raise SystemExit(f"{n} events: the streamed trace differs from the in-memory one")
            memory_file.unlink()
            rep_stream = measure(
                corepin(
                    "simulate", "--topology", str(topo_file), "--trace", str(streamed_file),
                    "--policy", args.policy, "-o", "json",
                )
            )  # fmt: skip
            rep_memory = measure(
                python(IN_MEMORY_REPLAY, str(topo_file), str(streamed_file), args.policy)
            )
            size = streamed_file.stat().st_size / (1 << 20)
            streamed_file.unlink()
            rows.append(
                (
                    f"{n:,}",
                    f"{size:.1f}",
                    f"{gen_stream[0]:.1f}",
                    f"{gen_memory[0]:.1f}",
                    f"{gen_stream[1]:.2f}",
                    f"{gen_memory[1]:.2f}",
                    f"{rep_stream[0]:.1f}",
                    f"{rep_memory[0]:.1f}",
                    f"{rep_stream[1]:.2f}",
                    f"{rep_memory[1]:.2f}",
                )
            )
            print(f"  {n:,} events done", flush=True)
    print()
    print(table(rows))
    first, last = rows[1], rows[-1]
    print()
    print(
        f"streamed peak RSS from {first[0]} to {last[0]} events: generate {first[2]} -> "
        f"{last[2]} MiB, replay {first[6]} -> {last[6]} MiB (in memory: {first[3]} -> "
        f"{last[3]} MiB and {first[7]} -> {last[7]} MiB)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
