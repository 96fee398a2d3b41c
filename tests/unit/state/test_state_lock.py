"""The state lock: waiters served in arrival order, dead waiters skipped, an operator's `flock`
still pauses corepin, a timeout that says who holds the lock, and a reconcile loop that
survives a busy lock.

Every waiter here is a real process (the same StateStore code as `corepin`) queueing on a real
flock; the test only signals processes it started.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from corepin.core.errors import StateError
from corepin.state import StateStore
from corepin.state.lock import QUEUE_DIR
from support.helpers import corepin_argv, run_corepin, wait_for
from support.paths import SRC

ENV = {**os.environ, "PYTHONPATH": str(SRC)}

HOLDER = """
    import sys
    from corepin.state import StateStore
    with StateStore(sys.argv[1]).lock(timeout=60):
        print("locked", flush=True)
        sys.stdin.readline()  # hold the lock until told to let go
"""

WAITER = """
    import sys, time
    from corepin.state import StateStore
    store = StateStore(sys.argv[1])
    print("waiting", flush=True)
    with store.lock(timeout=60):
        with open(sys.argv[2], "a") as out:
            out.write(sys.argv[3] + "\\n")
        time.sleep(0.02)
"""


def spawn(code: str, *args: str, **kw: object) -> subprocess.Popen[str]:
    return subprocess.Popen(  # type: ignore[call-overload, no-any-return]
        [sys.executable, "-c", textwrap.dedent(code), *args], text=True, env=ENV, **kw
    )


def tickets(state: Path) -> list[str]:
    queue = state / QUEUE_DIR
    return sorted(n for n in os.listdir(queue) if not n.startswith(".")) if queue.exists() else []


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[str]]]:
    """Processes a test started; any still running at the end are killed (and their pipes
    closed)."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for p in started:
        if p.poll() is None:
            p.kill()
        p.wait(timeout=10)
        for pipe in (p.stdin, p.stdout, p.stderr):
            if pipe is not None:
                pipe.close()


def hold(state: Path, procs: list[subprocess.Popen[str]]) -> subprocess.Popen[str]:
    holder = spawn(HOLDER, str(state), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    procs.append(holder)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
    return holder


def release(holder: subprocess.Popen[str]) -> None:
    assert holder.stdin is not None
    holder.stdin.write("go\n")
    holder.stdin.flush()
    assert holder.wait(timeout=10) == 0


def test_waiters_get_the_lock_in_the_order_they_asked_for_it(
    tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    state = tmp_path / "state"
    StateStore(state).ensure_directory()
    order = tmp_path / "order"
    holder = hold(state, procs)
    names = [f"w{i}" for i in range(8)]
    for name in names:
        waiter = spawn(WAITER, str(state), str(order), name, stdout=subprocess.PIPE)
        procs.append(waiter)
        assert waiter.stdout is not None and waiter.stdout.readline().strip() == "waiting"
        time.sleep(0.3)  # it is queued (or polling) well before the next one starts
    release(holder)
    for p in procs[1:]:
        assert p.wait(timeout=60) == 0
    assert order.read_text().split() == names
    assert tickets(state) == [], "every waiter left the queue"


def test_a_killed_waiter_does_not_block_the_ones_behind_it(
    tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    state = tmp_path / "state"
    StateStore(state).ensure_directory()
    order = tmp_path / "order"
    holder = hold(state, procs)
    doomed = spawn(WAITER, str(state), str(order), "doomed", stdout=subprocess.PIPE)
    procs.append(doomed)
    wait_for(lambda: len(tickets(state)) == 1, what="the first waiter's ticket")
    behind = spawn(WAITER, str(state), str(order), "behind", stdout=subprocess.PIPE)
    procs.append(behind)
    wait_for(lambda: len(tickets(state)) == 2, what="the second waiter's ticket")
    doomed.kill()  # its ticket file stays behind, no longer locked
    doomed.wait(timeout=10)
    release(holder)
    assert behind.wait(timeout=10) == 0
    assert order.read_text().split() == ["behind"]
    assert tickets(state) == [], "the dead waiter's ticket was removed"


def test_leftovers_of_dead_waiters_are_cleared_by_the_next_one(tmp_path: Path) -> None:
    state = tmp_path / "state"
    store = StateStore(state)
    with store.lock():
        pass
    queue = state / QUEUE_DIR
    (queue / "00000000000000000001-999999-deadbeef").write_text("")  # nobody holds its flock
    (queue / ".tmp-999999-deadbeef").write_text("")  # died before renaming its ticket
    t0 = time.monotonic()
    with store.lock(timeout=5):
        assert time.monotonic() - t0 < 1.0
    assert os.listdir(queue) == []


def state_args(state: Path) -> tuple[str, ...]:
    return ("--state-dir", str(state), "--cgroups", "off")


def run_true(state: Path) -> tuple[str, ...]:
    """`corepin run` of an exclusive `true`."""
    return ("run", *state_args(state), "--exclusive", "1", "--", "true")


def operator_flock(lock: Path, procs: list[subprocess.Popen[str]]) -> subprocess.Popen[str]:
    """`flock state.lock -c 'echo locked; read line'` as an operator would run it."""
    if shutil.which("flock") is None:
        pytest.skip("util-linux flock(1) is not installed")
    p = subprocess.Popen(
        ["flock", str(lock), "sh", "-c", "echo locked; read line"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    procs.append(p)
    assert p.stdout is not None and p.stdout.readline().strip() == "locked"
    return p


def test_an_operators_flock_pauses_corepin_and_the_timeout_names_it(
    tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    state = tmp_path / "state"
    store = StateStore(state)
    store.ensure_directory()
    operator = operator_flock(Path(store.lock_path), procs)
    env = {**ENV, "COREPIN_LOCK_TIMEOUT": "0.6"}
    t0 = time.monotonic()
    out = run_corepin(*run_true(state), env=env)
    waited = time.monotonic() - t0
    assert out.returncode == 4, out.stderr
    assert waited >= 0.6
    assert "waited 0.6 s" in out.stderr, out.stderr
    assert f"held by pid {operator.pid} (flock)" in out.stderr, out.stderr
    assert store.lock_path in out.stderr
    assert not (state / "state.json").exists(), "nothing was written while paused"
    assert operator.stdin is not None
    operator.stdin.write("\n")
    operator.stdin.flush()
    assert operator.wait(timeout=10) == 0
    done = run_corepin(*run_true(state), env=env)
    assert done.returncode == 0, done.stderr


def test_the_timeout_counts_the_corepin_processes_queued_ahead(
    tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    state = tmp_path / "state"
    StateStore(state).ensure_directory()
    holder = hold(state, procs)
    ahead = spawn(WAITER, str(state), str(tmp_path / "order"), "ahead", stdout=subprocess.PIPE)
    procs.append(ahead)
    wait_for(lambda: len(tickets(state)) == 1, what="the waiter's ticket")
    with pytest.raises(StateError) as info, StateStore(state).lock(timeout=0.3):
        pass
    message = str(info.value)
    assert info.value.reason == "lock_timeout"
    assert f"held by pid {holder.pid} (python" in message, message
    assert "1 other corepin process queue" in message, message
    assert len(tickets(state)) == 1, "the timed-out waiter left the queue"
    release(holder)
    assert ahead.wait(timeout=10) == 0


def test_reconcile_in_loop_mode_survives_a_busy_lock_and_carries_on(
    tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    state = tmp_path / "state"
    StateStore(state).ensure_directory()
    holder = hold(state, procs)
    loop = subprocess.Popen(
        corepin_argv("reconcile", *state_args(state), "--interval", "0.2", "-o", "json"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "COREPIN_LOCK_TIMEOUT": "0.3"},
    )
    procs.append(loop)
    time.sleep(2.0)  # several passes find the lock busy
    assert loop.poll() is None, "the loop must not die on a busy lock"
    release(holder)
    time.sleep(1.5)  # and several find it free
    assert loop.poll() is None
    loop.send_signal(signal.SIGTERM)
    out, err = loop.communicate(timeout=15)
    assert loop.returncode == 0, err
    warnings = [line for line in err.splitlines() if "warning" in line]
    assert len(warnings) >= 2, err
    assert all("waited 0.3 s" in w and "trying again in 0.2 s" in w for w in warnings), err
    assert "Traceback" not in err
    passes = [json.loads(line) for line in out.splitlines()]
    assert len(passes) >= 2 and all(p == {"changes": []} for p in passes), out


SQUATTER = """
    import os, sys
    from corepin.state.lock import QUEUE_DIR, _open_queue, _take_ticket
    directory = sys.argv[1]
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    queue_fd = _open_queue(dir_fd, os.path.join(directory, QUEUE_DIR))
    _take_ticket(queue_fd)  # a place in line, kept locked, but the lock is never taken
    print("queued", flush=True)
    sys.stdin.readline()
"""


def test_a_stopped_run_at_the_head_of_the_line_loses_its_place_while_stopped(
    tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    state = tmp_path / "state"
    StateStore(state).ensure_directory()
    holder = hold(state, procs)
    run = subprocess.Popen(corepin_argv(*run_true(state)), env=ENV, start_new_session=True)
    procs.append(run)
    wait_for(lambda: len(tickets(state)) == 1, what="the run's ticket")
    os.kill(run.pid, signal.SIGSTOP)  # Ctrl-Z while it queues for the lock
    try:
        release(holder)
        env = {**ENV, "COREPIN_LOCK_TIMEOUT": "5"}
        out = run_corepin("reconcile", "--once", *state_args(state), env=env)
        assert out.returncode == 0, out.stderr
        assert len(tickets(state)) == 1, "the stopped run keeps its ticket"
    finally:
        os.kill(run.pid, signal.SIGCONT)
    assert run.wait(timeout=30) == 0, "the resumed run got the lock"
    assert tickets(state) == []


def test_a_resumed_waiter_takes_its_place_back(
    tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    state = tmp_path / "state"
    StateStore(state).ensure_directory()
    order = tmp_path / "order"
    holder = hold(state, procs)
    first = spawn(WAITER, str(state), str(order), "first", stdout=subprocess.PIPE)
    procs.append(first)
    wait_for(lambda: len(tickets(state)) == 1, what="the first waiter's ticket")
    os.kill(first.pid, signal.SIGSTOP)
    second = spawn(WAITER, str(state), str(order), "second", stdout=subprocess.PIPE)
    procs.append(second)
    wait_for(lambda: len(tickets(state)) == 2, what="the second waiter's ticket")
    os.kill(first.pid, signal.SIGCONT)
    time.sleep(0.3)  # running again: the older ticket is first in line once more
    release(holder)
    assert first.wait(timeout=30) == 0 and second.wait(timeout=30) == 0
    assert order.read_text().split() == ["first", "second"]


def test_a_waiter_that_leaves_a_free_lock_untaken_loses_its_place(
    tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    state = tmp_path / "state"
    StateStore(state).ensure_directory()
    squatter = spawn(SQUATTER, str(state), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    procs.append(squatter)
    assert squatter.stdout is not None and squatter.stdout.readline().strip() == "queued"
    env = {**ENV, "COREPIN_LOCK_TIMEOUT": "5"}
    out = run_corepin("reconcile", "--once", *state_args(state), env=env)
    assert out.returncode == 0, out.stderr
    done = run_corepin(*run_true(state), env=env)
    assert done.returncode == 0, done.stderr
    assert len(tickets(state)) == 1, "the slow waiter keeps its ticket"


def test_the_holders_are_read_from_proc_locks_by_device_and_inode() -> None:
    from corepin.sysfs.procfs import parse_lock_holders

    text = (
        "1: FLOCK  ADVISORY  WRITE 4242 fe:00:2148852 0 EOF\n"
        "1: -> FLOCK  ADVISORY  WRITE 4343 fe:00:2148852 0 EOF\n"  # a waiter, not a holder
        "2: POSIX  ADVISORY  WRITE 77 08:01:2148852 0 EOF\n"  # same inode, other device
        "3: OFDLCK ADVISORY  READ  -1 fe:00:2148852 0 EOF\n"  # no pid to name
        "4: FLOCK  ADVISORY  WRITE 99 103:02:5 0 EOF\n"
    )
    assert parse_lock_holders(text, os.makedev(0xFE, 0), 2148852) == [4242]
    assert parse_lock_holders(text, os.makedev(8, 1), 2148852) == [77]
    assert parse_lock_holders(text, os.makedev(0x103, 2), 5) == [99]
    assert parse_lock_holders(text, os.makedev(0xFE, 0), 1) == []
