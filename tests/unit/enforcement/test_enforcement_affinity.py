"""Per-process affinity of real process trees (parent, child, threads), checked in /proc.

sched_setaffinity on one's own children needs no privilege, so these run everywhere with at least
two online CPUs in this process's affinity.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from corepin.core.cpuset import CPUSet
from corepin.core.errors import InputError
from corepin.enforcement.affinity import (
    AffinityError,
    get_affinity,
    pin_process_tree,
    set_affinity,
)
from corepin.enforcement.reconcile import ProcessTarget, reconcile
from corepin.sysfs.procfs import (
    ProcessGone,
    cpus_allowed_list,
    descendants,
    list_threads,
    process_start_time,
)

ONLINE = CPUSet(os.sched_getaffinity(0))
needs_two = pytest.mark.skipif(len(ONLINE) < 2, reason="needs at least two CPUs in the affinity")

TREE = """
import subprocess, sys, threading, time
ev = threading.Event()
for _ in range(3):
    threading.Thread(target=ev.wait, daemon=True).start()
child = subprocess.Popen([sys.executable, "-c",
    "import threading, time\\n"
    "ev = threading.Event()\\n"
    "[threading.Thread(target=ev.wait, daemon=True).start() for _ in range(2)]\\n"
    "print('ready', flush=True)\\n"
    "time.sleep(60)\\n"], stdout=subprocess.PIPE, text=True)
child.stdout.readline()
print(child.pid, flush=True)
time.sleep(60)
"""


@pytest.fixture
def tree() -> Iterator[tuple[int, int]]:
    """(parent pid, child pid): each with extra threads, the child a separate process."""
    with subprocess.Popen([sys.executable, "-c", TREE], stdout=subprocess.PIPE, text=True) as proc:
        try:
            assert proc.stdout is not None
            child = int(proc.stdout.readline())
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                if len(list_threads(proc.pid)) >= 4 and len(list_threads(child)) >= 3:
                    break
                time.sleep(0.01)
            yield proc.pid, child
        finally:
            for pid in descendants(proc.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, 9)
            proc.kill()
            proc.wait()


def all_threads(pids: list[int]) -> list[tuple[int, int]]:
    return [(p, t) for p in pids for t in list_threads(p)]


@needs_two
def test_every_thread_of_parent_and_child_gets_the_cpus(tree: tuple[int, int]) -> None:
    parent, child = tree
    want = CPUSet.of(ONLINE.last())
    result = pin_process_tree(parent, want, start_time=process_start_time(parent))
    threads = all_threads([parent, child])
    assert len(threads) >= 7, "parent: main + 3 threads, child: main + 2 threads"
    for pid, tid in threads:
        assert cpus_allowed_list(pid, tid=tid) == want, f"thread {tid} of {pid} in /proc"
    assert len(result.changes) >= 7 and result.writes == len(result.changes)
    again = pin_process_tree(parent, want)
    assert again.writes == 0 and again.changes == [], "a second pass is a no-op"
    assert again.checked >= 7


@needs_two
def test_without_descendants_only_the_process_threads_change(tree: tuple[int, int]) -> None:
    parent, child = tree
    want = CPUSet.of(ONLINE.first())
    pin_process_tree(parent, want, include_descendants=False)
    assert all(cpus_allowed_list(parent, tid=t) == want for t in list_threads(parent))
    assert cpus_allowed_list(child) == ONLINE


@needs_two
def test_a_reused_pid_is_reported_gone_and_nothing_is_written(tree: tuple[int, int]) -> None:
    parent, _child = tree
    start = process_start_time(parent)
    with pytest.raises(ProcessGone):
        pin_process_tree(parent, CPUSet.of(ONLINE.first()), start_time=start + 1)
    assert cpus_allowed_list(parent) == ONLINE
    report = reconcile([ProcessTarget(parent, CPUSet.of(ONLINE.first()), start_time=start - 1)])
    assert report.gone and report.gone[0].pid == parent and report.writes == 0


@needs_two
def test_reconcile_pins_drift_back_and_a_steady_state_writes_nothing(
    tree: tuple[int, int],
) -> None:
    parent, child = tree
    want = CPUSet.of(ONLINE.last())
    target = ProcessTarget(parent, want, start_time=process_start_time(parent))
    first = reconcile([target])
    assert first.ok and first.writes >= 7
    assert {c.what for c in first.changes} == {"affinity"}
    set_affinity(list_threads(child)[-1], ONLINE)  # drift: a thread widened itself
    second = reconcile([target])
    assert second.writes == 1 and len(second.changes) == 1
    assert second.changes[0].new == str(want)
    third = reconcile([target])
    assert third.writes == 0 and third.changes == []


def test_dry_run_reports_without_writing(tree: tuple[int, int]) -> None:
    parent, _child = tree
    want = CPUSet.of(ONLINE.first())
    report = reconcile([ProcessTarget(parent, want)], dry_run=True)
    if want != ONLINE:
        assert report.changes and report.writes == 0
    assert get_affinity(parent) == ONLINE


def test_a_dead_process_is_gone_not_an_error() -> None:
    proc = subprocess.Popen(["true"])
    proc.wait()
    report = reconcile([ProcessTarget(proc.pid, ONLINE)])
    assert report.ok and [g.pid for g in report.gone] == [proc.pid]


def test_threads_exiting_during_the_walk_are_tolerated() -> None:
    code = (
        "import threading, time\n"
        "def churn():\n"
        "    while True:\n"
        "        ts = [threading.Thread(target=time.sleep, args=(0.001,)) for _ in range(8)]\n"
        "        [t.start() for t in ts]; [t.join() for t in ts]\n"
        "threading.Thread(target=churn, daemon=True).start()\n"
        "time.sleep(30)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code])
    try:
        time.sleep(0.2)
        for cpus in (CPUSet.of(ONLINE.first()), ONLINE) * 10:
            result = pin_process_tree(proc.pid, cpus)
            assert result.checked >= 1
    finally:
        proc.kill()
        proc.wait()


def test_empty_cpus_are_an_input_error() -> None:
    with pytest.raises(InputError, match="empty"):
        pin_process_tree(os.getpid(), CPUSet())


def test_cpus_the_machine_lacks_are_refused_with_a_clear_reason() -> None:
    proc = subprocess.Popen(["sleep", "30"])
    try:
        with pytest.raises(AffinityError) as info:
            set_affinity(proc.pid, CPUSet.of(4000))
        assert info.value.reason == "affinity_invalid"
        assert str(proc.pid) in str(info.value)
    finally:
        proc.kill()
        proc.wait()
