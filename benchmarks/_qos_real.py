"""Shared helpers of the QoS benchmarks that run on the host's real cgroup v1 hierarchies.

- `Scratch`: a scratch group `corepin-bench-<random>` in the cpuset, cpu and cpuacct mounts,
  sub-groups below it, commands started inside one, and removal of everything afterwards (also
  after Ctrl-C or SIGTERM: `interrupts_as_keyboard` turns SIGTERM and SIGHUP into
  KeyboardInterrupt, so every `finally` runs);
- `Periodic`: the QoS engine's period run in a thread of the benchmark, as a node's loop does;
- `stop`: ends a process group the benchmark started (never anything else).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from corepin.core.cpuset import CPUSet
from corepin.enforcement.cgroups import CgroupV1
from corepin.enforcement.qos import CpuControl, QosEngine, QosNode

CGROUP = Path("/sys/fs/cgroup")
CPUSET = CGROUP / "cpuset"
CPU = CGROUP / "cpu"
CPUACCT = CGROUP / "cpuacct"


def host_engine(be_group: str | None) -> tuple[QosEngine, QosNode]:
    """A QoS engine over this host's v1 mounts, and the node it sees: every CPU this process
    may use shared, none exclusive or reserved, `be_group` the BE group (None: no BE work)."""
    online = CPUSet(os.sched_getaffinity(0))
    driver = CgroupV1(str(CPUSET), str(CPU))
    engine = QosEngine(CpuControl(driver, cpuacct_root=str(CPUACCT)), driver)
    node = QosNode(
        online=online,
        reserved=CPUSet(),
        exclusive=CPUSet(),
        lsr=CPUSet(),
        shared_pool=online,
        be_group=be_group,
    )
    return engine, node


def why_not_real() -> str | None:
    """Why the real v1 hierarchies cannot be used here (None: they can)."""
    if os.geteuid() != 0:
        return "needs root (scratch cgroups under /sys/fs/cgroup)"
    for mount, probe in ((CPUSET, "cpuset.cpus"), (CPU, "cpu.cfs_quota_us"), (CPUACCT, "")):
        if not (mount / probe).exists() or not os.access(mount, os.W_OK):
            return f"needs a writable cgroup v1 {mount.name} mount at {mount}"
    return None


def interrupts_as_keyboard() -> None:
    """SIGTERM and SIGHUP raise KeyboardInterrupt in the main thread (clean-up still runs)."""

    def raise_interrupt(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, raise_interrupt)
    signal.signal(signal.SIGHUP, raise_interrupt)


class Scratch:
    """`corepin-bench-<random>` in the cpuset, cpu and cpuacct hierarchies; sub-groups below."""

    def __init__(self) -> None:
        self.name = f"corepin-bench-{uuid.uuid4().hex[:8]}"
        self.mounts = (CPUSET, CPU, CPUACCT)
        self._make(self.name)

    def _make(self, rel: str) -> None:
        for mount in self.mounts:
            path = mount / rel
            path.mkdir()
            if mount == CPUSET:
                parent = path.parent
                for name in ("cpuset.mems", "cpuset.cpus"):
                    (path / name).write_text((parent / name).read_text())

    def group(self, sub: str) -> str:
        """Create `<scratch>/<sub>` everywhere; its relative path (as drivers take it)."""
        rel = f"{self.name}/{sub}"
        self._make(rel)
        return rel

    def enter_argv(self, rel: str, argv: list[str]) -> list[str]:
        """`argv` started inside group `rel` in every mount (the shell joins, then execs)."""
        joins = " && ".join(f'echo $$ > "{m / rel}/cgroup.procs"' for m in self.mounts)
        return ["sh", "-c", f'{joins} && exec "$@"', "sh", *argv]

    @staticmethod
    def usage_ns(rel: str) -> int:
        """The group's CPU time so far (cpuacct.usage), read by the benchmark itself."""
        return int((CPUACCT / rel / "cpuacct.usage").read_text())

    @staticmethod
    def cpu_stat(rel: str) -> dict[str, int]:
        """The group's cpu.stat (nr_periods, nr_throttled, throttled_time ...)."""
        out = {}
        for line in (CPU / rel / "cpu.stat").read_text().splitlines():
            key, _, value = line.partition(" ")
            out[key] = int(value)
        return out

    @staticmethod
    def write(mount: Path, rel: str, name: str, value: str) -> None:
        (mount / rel / name).write_text(value)

    @staticmethod
    def read(mount: Path, rel: str, name: str) -> str:
        return (mount / rel / name).read_text().strip()

    def close(self) -> None:
        """Remove every group below and the scratch group itself (waiting for exiting tasks)."""
        for mount in self.mounts:
            top = mount / self.name
            for _ in range(200):
                if not top.exists():
                    break
                with contextlib.suppress(OSError):
                    dirs = sorted((d for d, _s, _f in os.walk(top)), key=lambda x: -x.count(os.sep))
                    for d in dirs:
                        os.rmdir(d)
                time.sleep(0.05)
            if top.exists():
                print(f"warning: could not remove {top} (tasks still in it?)")


def start(argv: list[str], *, ready_line: bool = False) -> subprocess.Popen[str]:
    """Start `argv` in a session of its own (so `stop` reaches all it forks)."""
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    if ready_line:
        assert proc.stdout is not None
        if not proc.stdout.readline():
            err = proc.stderr.read() if proc.stderr else ""
            raise SystemExit(f"{argv[-2:]} did not start: {err.strip()}")
    return proc


def stop(proc: subprocess.Popen[Any]) -> None:
    """SIGTERM to the process group the benchmark started, SIGKILL after 10 s."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


class Periodic(threading.Thread):
    """Calls `period()` every `interval` seconds (first call at once) until `close()`; keeps
    what it returned with the time, and the first exception (re-raised by `close`)."""

    def __init__(self, period: Callable[[], Any], interval: float) -> None:
        super().__init__(daemon=True, name="qos-period")
        self.period = period
        self.interval = interval
        self.results: list[tuple[float, Any]] = []
        self.error: BaseException | None = None
        self._done = threading.Event()

    def run(self) -> None:
        next_at = time.monotonic()
        while not self._done.is_set():
            try:
                self.results.append((time.monotonic(), self.period()))
            except BaseException as err:  # handed to the main thread
                self.error = err
                return
            next_at += self.interval
            self._done.wait(max(0.0, next_at - time.monotonic()))

    def between(self, start: float, end: float) -> list[Any]:
        return [r for t, r in self.results if start <= t <= end]

    def close(self) -> None:
        self._done.set()
        self.join(timeout=30)
        if self.error is not None:
            raise self.error
