"""CPU hog: N busy processes (default: one per online CPU) spinning until terminated.

SIGTERM or SIGINT to the hog stops every spinner. Spinners also stop on their own when their
parent goes away, so a killed hog never leaves busy orphans behind.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys


def spin() -> None:
    parent = os.getppid()
    x = 0
    while True:
        for _ in range(200_000):
            x = (x * 7 + 1) & 0xFFFFFFFF
        if os.getppid() != parent:
            os._exit(0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("processes", nargs="?", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    children: list[int] = []
    for _ in range(args.processes):
        pid = os.fork()
        if pid == 0:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            spin()
        children.append(pid)

    def stop(signum: int, _frame: object) -> None:
        for child in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)
        for child in children:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(child, 0)
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(f"hog: {args.processes} spinners on CPUs {sorted(os.sched_getaffinity(0))}", flush=True)
    while True:
        signal.pause()


if __name__ == "__main__":
    raise SystemExit(main())
