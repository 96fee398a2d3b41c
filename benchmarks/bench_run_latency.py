"""`corepin run --exclusive 1 -- true`: end-to-end wall time and where it goes, on a real disk.

Targets: corepin's own cost (`corepin run` minus `python -c pass`, run back to back in pairs in
this run: the median difference) <= 30 ms on the development VM (issue 14); median <= 120 ms
(issue 7).

What it prints:

1. The disk the state directory is on: device, filesystem, mount options, whether the device
   is rotational and has a volatile write cache, and what one durable commit of a small file
   costs there (write + fsync + rename + fsync of the directory), measured now. The state
   directory is a fresh directory under `--state-parent` (default: this checkout), never in
   tmpfs unless asked for: a tmpfs fsync is free and hides the cost users pay.
2. End to end (min / median / p90 over `--repeat` runs): `/bin/true`, `python -c pass` (the
   bare interpreter: the baseline), and the installed `corepin` console script (what users
   run) with bytecode cached (a normal installation; a private PYTHONPYCACHEPREFIX keeps the
   checkout clean), with cgroups auto and off, without a bytecode cache, and `python -m
   corepin`. Every run of one configuration shares its state directory, as runs on a host do.
3. The breakdown by phase (median ms per phase, for the stage before CMD runs and for the
   release after it exits), from the driver `_run_phases.py`: it runs the same command in one
   interpreter and times corepin's sub-steps by wrapping them once corepin has loaded them
   (corepin itself is not changed, so nothing slows the normal path). `interpreter start` is
   from spawning the interpreter to the driver's first line (the bare interpreter's own figure
   is printed beside it); `imports` is every import statement wherever it runs; `exit` is
   from corepin being done (its process only has to end) to the parent seeing the exit. The
   driver adds a little time of its own (its total is shown beside the console script's).

Usage: .venv/bin/python benchmarks/bench_run_latency.py [--repeat 21] [--state-parent DIR]

To measure another version of corepin with the same benchmark (before/after a change), put its
`src` first on PYTHONPATH: `git archive REV src | tar -x -C /tmp/old && PYTHONPATH=/tmp/old/src
.venv/bin/python benchmarks/bench_run_latency.py` (the console script then loads that copy).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET_MS = 120.0
OVERHEAD_TARGET_MS = 30.0
HERE = Path(__file__).resolve().parent

#: The phases of the breakdown, in the order a run meets them.
PHASES = (
    "interpreter start",
    "driver set-up",
    "imports",
    "parse arguments",
    "topology",
    "lock",
    "load checkpoint",
    "/proc reads",
    "validate",
    "liveness",
    "decide",
    "cgroup set-up",
    "fork",
    "commit",
    "fsync",
    "re-pin shared",
    "exec CMD",
    "CMD runs",
    "cgroup removal",
    "other",
    "exit",
)


# ---------------------------------------------------------------------- the disk


def _mount_of(path: Path) -> dict[str, str]:
    """Mount point, source, filesystem and options of the mount holding `path`
    (/proc/self/mountinfo: the entry with the device number of `path`, longest mount point)."""
    dev = os.stat(path).st_dev
    wanted = f"{os.major(dev)}:{os.minor(dev)}"
    best: dict[str, str] = {}
    real = os.path.realpath(path)
    with open("/proc/self/mountinfo", encoding="utf-8") as handle:
        for line in handle:
            left, _, right = line.partition(" - ")
            fields = left.split()
            if fields[2] != wanted:
                continue
            point = fields[4].replace("\\040", " ")
            if not (real == point or real.startswith(point.rstrip("/") + "/")):
                continue
            if len(point) < len(best.get("point", "")):
                continue
            fstype, source, super_options = [*right.split(), "", "", ""][:3]
            best = {
                "point": point,
                "source": source,
                "fstype": fstype,
                "options": fields[5],
                "super": super_options,
                "dev": wanted,
            }
    return best


def _block_device(dev: str) -> dict[str, str]:
    """The whole disk behind device `dev` (major:minor) and its queue settings."""
    link = Path("/sys/dev/block") / dev
    if not link.exists():
        return {}
    real = link.resolve()
    disk = real if (real / "queue").exists() else real.parent
    out = {"disk": disk.name}
    for name in ("rotational", "write_cache", "scheduler"):
        with contextlib.suppress(OSError):
            out[name] = (disk / "queue" / name).read_text().strip()
    return out


def durable_commit_ms(directory: Path, repeat: int) -> list[float]:
    """What the disk takes for one durable replace of a 1 KB file: write, fsync, rename, fsync
    of the directory (the checkpoint writer's sequence)."""
    times = []
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for i in range(repeat):
            start = time.perf_counter()
            fd = os.open(f".probe-{i}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600, dir_fd=dir_fd)
            os.write(fd, os.urandom(1024))
            os.fsync(fd)
            os.close(fd)
            os.replace(f".probe-{i}", "probe", src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            os.fsync(dir_fd)
            times.append((time.perf_counter() - start) * 1000)
        os.unlink("probe", dir_fd=dir_fd)
    finally:
        os.close(dir_fd)
    return times


def describe_disk(directory: Path, repeat: int) -> None:
    mount = _mount_of(directory)
    block = _block_device(mount.get("dev", ""))
    print(f"state directory: {directory}")
    print(
        f"  mount {mount.get('point', '?')}: {mount.get('source', '?')} "
        f"({mount.get('fstype', '?')}, {mount.get('options', '?')},{mount.get('super', '')})"
    )
    if block:
        rotational = {"0": "solid state", "1": "rotational (or unknown to the kernel)"}
        print(
            f"  disk {block['disk']}: {rotational.get(block.get('rotational', ''), '?')}, "
            f"write cache {block.get('write_cache', '?')}, scheduler {block.get('scheduler', '?')}"
        )
    else:
        print("  no block device behind it")
    if mount.get("fstype") in ("tmpfs", "ramfs"):
        print("  WARNING: in memory: fsync costs nothing here; pass --state-parent on a disk")
    probe = durable_commit_ms(directory, repeat)
    print(
        f"  one durable commit of 1 KB (write, fsync, rename, fsync dir): median "
        f"{statistics.median(probe):.2f} ms, max {max(probe):.2f} ms"
    )


# ---------------------------------------------------------------------- timing


def measure(cmd: list[str], env: dict[str, str], repeat: int) -> list[float]:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        done = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        times.append((time.perf_counter() - start) * 1000)
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed ({done.returncode}): {done.stderr!r}")
    return times


def row(name: str, times: list[float]) -> str:
    ordered = sorted(times)
    p90 = ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]
    return f"{name:<48} {ordered[0]:8.1f} {statistics.median(ordered):8.1f} {p90:8.1f}"


def first_line_ms(py: str, env: dict[str, str], repeat: int) -> list[float]:
    """Spawn to the first line of a `python -c` program (the bare interpreter's start-up)."""
    times = []
    for _ in range(repeat):
        start = time.monotonic_ns()
        done = subprocess.run(
            [py, "-c", "import time; print(time.monotonic_ns())"],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        times.append((int(done.stdout) - start) / 1e6)
    return times


class Phases:
    """What the driver runs found: per (stage, phase) the times of the counted runs (ms) and
    the fsync calls of the last run, the driver's totals, the targets it could not find."""

    def __init__(self) -> None:
        self.times: dict[tuple[str, str], list[float]] = {}
        self.fsyncs: dict[str, int] = {}
        self.totals: list[float] = []
        self.missing: set[str] = set()


def phases(py: str, argv: list[str], env: dict[str, str], repeat: int, scratch: Path) -> Phases:
    """Run the driver `repeat` times (the first run is not counted)."""
    sys.path.insert(0, str(HERE))
    from _run_phases import STUB

    stub = STUB.format(here=str(HERE))
    out = scratch / "phases.txt"
    result = Phases()
    found = result.times
    for i in range(repeat):
        start = time.monotonic_ns()
        done = subprocess.run(
            [py, "-c", stub, str(out), *argv],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        end = time.monotonic_ns()
        if done.returncode != 0:
            raise SystemExit(f"the phase driver failed ({done.returncode}): {done.stderr!r}")
        run: dict[tuple[str, str], float] = {}
        t0 = t1 = 0
        result.fsyncs = {}
        for line in out.read_text().splitlines():
            if line.startswith("T0 "):
                t0 = int(line[3:])
            elif line.startswith("T1 "):
                t1 = int(line[3:])
            elif line.startswith("MISSING "):
                result.missing.add(line[8:])
            elif line.startswith("COUNT\t"):
                _, stage, _, n = line.split("\t")
                result.fsyncs[stage] = result.fsyncs.get(stage, 0) + int(n)
            elif "\t" in line:
                stage, step, ns = line.split("\t")
                run[(stage, step)] = run.get((stage, step), 0.0) + int(ns) / 1e6
        run[("start", "interpreter start")] = (t0 - start) / 1e6
        run[("release", "exit")] = (end - t1) / 1e6
        if i == 0:
            continue  # the first run compiles bytecode and creates the state: not counted
        result.totals.append((end - start) / 1e6)
        for key, ms in run.items():
            found.setdefault(key, []).append(ms)
    # a phase missing from a run took no time in it
    runs = repeat - 1
    for times in found.values():
        times.extend([0.0] * (runs - len(times)))
    return result


def print_phases(result: Phases, bare_start: float) -> None:
    found = result.times
    print(f"{'phase (median ms)':<24} {'start':>8} {'release':>8}")
    names = list(PHASES) + sorted({step for _, step in found} - set(PHASES))
    for step in names:
        cells = []
        for stage in ("start", "release"):
            times = found.get((stage, step))
            cells.append(f"{statistics.median(times):8.2f}" if times else f"{'-':>8}")
        note = f"   (bare interpreter: {bare_start:.2f})" if step == "interpreter start" else ""
        print(f"{step:<24} {cells[0]} {cells[1]}{note}")
    sums = [
        sum(statistics.median(t) for (s, _), t in found.items() if s == stage)
        for stage in ("start", "release")
    ]
    print(f"{'sum of medians':<24} {sums[0]:8.2f} {sums[1]:8.2f}   total {sum(sums):.2f}")
    print(f"{'driver run, median total':<24} {statistics.median(result.totals):8.2f}")
    print(
        f"fsync calls per run: {result.fsyncs.get('start', 0)} before CMD runs, "
        f"{result.fsyncs.get('release', 0)} in the release"
    )


# ---------------------------------------------------------------------- main


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=21)
    parser.add_argument(
        "--state-parent",
        type=Path,
        default=HERE.parent,
        help="where the state directories go (default: this checkout; use a real disk)",
    )
    parser.add_argument(
        "--cgroups", default="auto", help="--cgroups of the breakdown runs (default: auto)"
    )
    args = parser.parse_args()
    if args.repeat < 3:
        parser.error("--repeat must be at least 3")
    tmp = Path(tempfile.mkdtemp(prefix="corepin-bench-run-"))
    disk = Path(tempfile.mkdtemp(prefix=".bench-run-state-", dir=args.state_parent))
    try:
        describe_disk(disk, args.repeat)
        base = dict(os.environ)
        base.pop("PYTHONDONTWRITEBYTECODE", None)
        cached = dict(base, PYTHONPYCACHEPREFIX=str(tmp / "pycache"))
        nocache = dict(base, PYTHONDONTWRITEBYTECODE="1")
        py = sys.executable
        where = subprocess.run(
            [py, "-c", "import corepin; print(corepin.__file__)"],
            env=cached,
            capture_output=True,
            text=True,
            check=True,
        )
        print(f"corepin measured: {Path(where.stdout.strip()).parent}")

        script = Path(py).parent / "corepin"
        entry = [str(script)] if script.exists() else [py, "-m", "corepin"]

        def run_argv(state: str, cgroups: str) -> list[str]:
            return [
                "run",
                "--state-dir",
                str(disk / state),
                "--cgroups",
                cgroups,
                "--exclusive",
                "1",
                "--",
                "true",
            ]

        measure([*entry, *run_argv("warm", "auto")], cached, 2)  # compile the bytecode once
        loadavg = os.getloadavg()
        print(f"load average before: {loadavg[0]:.2f} {loadavg[1]:.2f} {loadavg[2]:.2f}")
        print()
        print(f"{'end to end (ms)':<48} {'min':>8} {'median':>8} {'p90':>8}")
        print(row("/bin/true", measure(["/bin/true"], base, args.repeat)))
        bare = measure([py, "-c", "pass"], cached, args.repeat)
        print(row("python -c pass (the baseline)", bare))
        results = {}
        for name, env, cgroups, launcher in (
            ("corepin run (bytecode cached, cgroups auto)", cached, "auto", entry),
            ("corepin run (bytecode cached, cgroups off)", cached, "off", entry),
            ("corepin run (no bytecode cache, cgroups auto)", nocache, "auto", entry),
            ("python -m corepin run (cached, cgroups auto)", cached, "auto", [py, "-m", "corepin"]),
        ):
            state = name.replace(" ", "_").replace("(", "").replace(")", "").replace(",", "")
            times = measure([*launcher, *run_argv(state, cgroups)], env, args.repeat)
            results[name] = statistics.median(times)
            print(row(name, times))
        print()
        found = phases(py, run_argv("phases", args.cgroups), cached, args.repeat + 1, tmp)
        bare_start = statistics.median(first_line_ms(py, cached, args.repeat))
        print(f"breakdown of `corepin run --cgroups {args.cgroups} --exclusive 1 -- true`:")
        print_phases(found, bare_start)
        if found.missing:
            print(f"WARNING: the driver found no {', '.join(sorted(found.missing))} (renamed?)")
        print()
        headline = results["corepin run (bytecode cached, cgroups auto)"]
        # the headline, paired: each round runs the bare interpreter and corepin run back to
        # back, so a load that comes and goes (a shared machine) weighs on both alike
        pairs = []
        for _ in range(args.repeat):
            plain = measure([py, "-c", "pass"], cached, 1)[0]
            run = measure([*entry, *run_argv("paired", "auto")], cached, 1)[0]
            pairs.append(run - plain)
        own = statistics.median(pairs)
        verdict = "meets" if own <= OVERHEAD_TARGET_MS else "MISSES"
        print(
            f"corepin's own cost (corepin run, cgroups auto, minus python -c pass, in "
            f"{args.repeat} back-to-back pairs): median {own:.1f} ms, min {min(pairs):.1f} ms; "
            f"{verdict} the {OVERHEAD_TARGET_MS:.0f} ms target"
        )
        verdict = "meets" if headline <= TARGET_MS else "MISSES"
        print(f"median {headline:.1f} ms {verdict} the {TARGET_MS:.0f} ms target")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(disk, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
