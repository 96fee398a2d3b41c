"""Guest-side probe (stdlib only): what the kernel says about a process, as one JSON line.

python tests/vm/probe.py self [--alloc-mb N] [--hold FILE]
    this process: pid, Cpus_allowed_list, Mems_allowed_list, cgroup, the corepin
    environment; with --alloc-mb it first fills N MiB of fresh memory and reports on which
    NUMA nodes those pages landed (from /proc/self/numa_maps); with --hold it writes the
    line to FILE (atomically) and then sleeps until FILE.done appears (at most 300 s)
python tests/vm/probe.py pid PID...
    the same fields for other processes (one line each)
python tests/vm/probe.py cgroup PATH...
    cpuset.cpus, cpuset.cpus.effective, cpuset.mems, cpuset.cpus.partition and the
    processes of cgroup v2 groups (relative to /sys/fs/cgroup)
"""

from __future__ import annotations

import json
import mmap
import os
import re
import sys
from pathlib import Path
from typing import Any

CGROUP = Path("/sys/fs/cgroup")


def status(pid: int | str) -> dict[str, Any]:
    fields: dict[str, Any] = {"pid": int(pid) if pid != "self" else os.getpid()}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("Cpus_allowed_list", "Mems_allowed_list"):
            fields["cpus" if key.startswith("Cpus") else "mems"] = value.strip()
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        if line.startswith("0::"):
            fields["cgroup"] = line[3:]
    return fields


def node_pages(address: int, pid: str = "self") -> dict[str, int]:
    """Pages per NUMA node of the mapping that starts at `address` (numa_maps N<k>=pages)."""
    for line in Path(f"/proc/{pid}/numa_maps").read_text().splitlines():
        start, _, rest = line.partition(" ")
        if int(start, 16) == address:
            return {m[0]: int(m[1]) for m in re.findall(r"\bN(\d+)=(\d+)", rest)}
    return {}


def allocate(mib: int) -> dict[str, int]:
    """Fill `mib` MiB of a fresh anonymous mapping; its pages per node."""
    size = mib << 20
    area = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    page = mmap.PAGESIZE
    for offset in range(0, size, page):
        area[offset] = 1
    # the mapping's address: the only way from Python is through /proc/self/maps
    length = f"{size:x}"
    for line in Path("/proc/self/maps").read_text().splitlines():
        span = line.split(" ", 1)[0]
        lo, hi = (int(x, 16) for x in span.split("-"))
        if hi - lo == size and f"{hi - lo:x}" == length:
            pages = node_pages(lo)
            if sum(pages.values()) >= size // page:
                return pages
    return {}


def cgroup(path: str) -> dict[str, Any]:
    base = CGROUP / path.strip("/")
    out: dict[str, Any] = {"path": path}
    for name in (
        "cpuset.cpus",
        "cpuset.cpus.effective",
        "cpuset.mems",
        "cpuset.mems.effective",
        "cpuset.cpus.partition",
        "cgroup.procs",
    ):
        try:
            out[name] = (base / name).read_text().strip()
        except OSError as err:
            out[name] = f"error: {err.strerror}"
    return out


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    what, args = argv[0], argv[1:]
    if what == "self":
        line = status("self")
        line["env"] = {k: v for k, v in os.environ.items() if k.startswith("COREPIN_")}
        if "--alloc-mb" in args:
            line["pages"] = allocate(int(args[args.index("--alloc-mb") + 1]))
        text = json.dumps(line)
        if "--hold" in args:
            # FILE.done is a FIFO: the probe sleeps in the kernel until someone writes to it
            target = Path(args[args.index("--hold") + 1])
            done = target.with_name(target.name + ".done")
            os.mkfifo(done)
            scratch = target.with_name(target.name + ".tmp")
            scratch.write_text(text + "\n")
            scratch.rename(target)
            with open(done) as fifo:
                fifo.read()
        print(text)
        return 0
    if what == "pid":
        for pid in args:
            print(json.dumps(status(pid)))
        return 0
    if what == "cgroup":
        for path in args:
            print(json.dumps(cgroup(path)))
        return 0
    print(f"unknown probe {what!r}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
