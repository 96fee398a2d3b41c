"""The state directory: locked transactions, crash safety, concurrency, permissions.

Crash and concurrency tests run real writer processes (the same code as `corepin`), crash them
at named points of the atomic write with os._exit, or SIGKILL them at random moments.
"""

from __future__ import annotations

import json
import os
import random
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from corepin.core.cpuset import CPUSet
from corepin.core.errors import StateError
from corepin.state import Assignment, HostState, StateStore, state_dir_from
from corepin.state.checkpoint import WRITE_POINTS, leftover_temp_files, write_checkpoint
from corepin.state.owners import ProcessOwner
from support.paths import SRC

C = CPUSet.parse


def run_py(
    code: str, *args: str, timeout: float = 60, **kw: object
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    return subprocess.run(  # type: ignore[call-overload, no-any-return]
        [sys.executable, "-c", textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        **kw,
    )


def seeded(tmp_path: Path, n: int = 3) -> StateStore:
    store = StateStore(tmp_path / "state")
    with store.transaction() as tx:
        s = tx.state.evolve(online=C("0-15"))
        for i in range(n):
            s = s.add(Assignment(f"run/{i}", cpus=CPUSet.of(i + 1), owner=ProcessOwner(100 + i, i)))
        tx.commit(s)
    return store


# ---------------------------------------------------------------------- basics


def test_a_missing_state_directory_is_created_with_mode_0700(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "a" / "b")
    with store.transaction() as tx:
        assert tx.state == HostState() and not tx.existed
    mode = stat.S_IMODE(os.stat(store.directory).st_mode)
    assert mode == 0o700
    assert store.read() is None, "a transaction without commit writes nothing"
    assert not os.path.exists(store.path)


def test_commit_writes_atomically_and_bumps_the_revision(tmp_path: Path) -> None:
    store = seeded(tmp_path)
    state = store.read()
    assert state is not None and state.revision == 1 and len(state.assignments) == 3
    with store.transaction() as tx:
        written = tx.commit(tx.state.remove("run/0"))
        assert tx.state is written and tx.committed and written.revision == 2
    assert store.read() == written
    assert stat.S_IMODE(os.stat(store.path).st_mode) == 0o600
    assert leftover_temp_files(store.directory) == []


def test_reading_a_state_directory_that_does_not_exist_gives_no_state(tmp_path: Path) -> None:
    assert StateStore(tmp_path / "nothing").read() is None
    assert not (tmp_path / "nothing").exists(), "reading never creates the directory"


def test_the_state_directory_comes_from_option_then_environment_then_default() -> None:
    assert state_dir_from({}, None) == "/var/lib/corepin"
    assert state_dir_from({"COREPIN_STATE_DIR": "/run/cp"}, None) == "/run/cp"
    assert state_dir_from({"COREPIN_STATE_DIR": "/run/cp"}, "/opt/s") == "/opt/s"


def test_a_state_dir_that_is_a_file_is_an_environment_error(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    for path in (tmp_path / "f", tmp_path / "f" / "sub"):
        with pytest.raises(StateError) as info, StateStore(path).transaction():
            pass
        assert info.value.exit_code == 4
        assert str(path) in str(info.value) and "--state-dir" in str(info.value)


def test_the_lock_times_out_with_a_message_saying_what_to_do(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    with store.lock():
        t0 = time.monotonic()
        with pytest.raises(StateError) as info, store.transaction(timeout=0.2):
            pass
        waited = time.monotonic() - t0
    assert 0.18 <= waited < 2.0
    assert info.value.reason == "lock_timeout" and info.value.exit_code == 4
    assert "fuser" in str(info.value) and store.lock_path in str(info.value)
    with store.transaction(timeout=0.2):
        pass  # released


def test_the_lock_of_a_killed_process_is_released_by_the_kernel(tmp_path: Path) -> None:
    code = f"""
        import os, sys, time
        from corepin.state import StateStore
        with StateStore({str(tmp_path)!r}).lock():
            print("locked", flush=True)
            time.sleep(60)
    """
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
        with pytest.raises(StateError), StateStore(tmp_path).lock(timeout=0.1):
            pass
    finally:
        proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
    with StateStore(tmp_path).lock(timeout=1.0):
        pass


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a check as another user")
def test_a_state_dir_without_permission_is_exit_4_with_advice(tmp_path: Path) -> None:
    owned = tmp_path / "root-only"
    owned.mkdir(mode=0o700)
    os.chmod(tmp_path, 0o755)
    code = """
        import os, sys
        from corepin.core.errors import CorepinError
        from corepin.state import StateStore
        os.setgid(65534); os.setuid(65534)  # after the imports: the stdlib may be root-only
        for d in sys.argv[1:]:
            try:
                with StateStore(d).transaction():
                    pass
                print("ok")
            except CorepinError as e:
                print(e.exit_code, e.reason, e.message.replace(chr(10), " "))
    """
    res = run_py(code, str(owned), str(owned / "sub"), "/proc/corepin-nowhere")
    lines = res.stdout.splitlines()
    assert res.returncode == 0, res.stderr
    assert len(lines) == 3, res.stdout + res.stderr
    for line in lines:
        assert line.startswith("4 "), line
        assert ("--state-dir" in line and "COREPIN_STATE_DIR" in line) or "state_dir" in line
    assert str(owned) in lines[0] and "state_permission" in lines[0]


# ---------------------------------------------------------------------- crash safety

CRASHER = """
    import os, sys
    from corepin.core.cpuset import CPUSet
    from corepin.state import Assignment, ProcessOwner, StateStore
    point = sys.argv[2]
    def hook(name):
        if name == point:
            os._exit(17)
    store = StateStore(sys.argv[1], write_hook=hook)
    with store.transaction() as tx:
        new = Assignment("run/new", cpus=CPUSet.of(9), owner=ProcessOwner(999, 1))
        tx.commit(tx.state.add(new))
    os._exit(0)
"""


@pytest.mark.parametrize(
    "point", WRITE_POINTS, ids=[f"crash after the write is {p}" for p in WRITE_POINTS]
)
def test_a_crash_at_any_point_of_the_write_leaves_the_old_or_the_new_state(
    tmp_path: Path, point: str
) -> None:
    store = seeded(tmp_path)
    before = store.read()
    assert before is not None
    res = run_py(CRASHER, store.directory, point)
    assert res.returncode == 17, res.stderr
    after = store.read()  # readable, never corrupt
    assert after is not None
    if WRITE_POINTS.index(point) < WRITE_POINTS.index("renamed"):
        assert after == before, "before the rename the old checkpoint is intact"
        assert len(leftover_temp_files(store.directory)) == 1, "the crashed writer left its temp"
    else:
        assert after.revision == before.revision + 1
        assert "run/new" in after and set(before.assignments) < set(after.assignments)
    # the next writer cleans up and carries on
    with store.transaction() as tx:
        tx.commit(tx.state.add(Assignment("run/next", cpus=CPUSet.of(12))))
    assert leftover_temp_files(store.directory) == []
    final = store.read()
    assert final is not None and set(before.assignments) <= set(final.assignments)


def test_an_exception_inside_the_write_removes_the_temp_file(tmp_path: Path) -> None:
    def hook(name: str) -> None:
        if name == "written":
            raise RuntimeError("disk on fire")

    store = seeded(tmp_path)
    before = store.read()
    with (
        pytest.raises(RuntimeError),
        StateStore(store.directory, write_hook=hook).transaction() as tx,
    ):
        tx.commit(tx.state.remove("run/1"))
    assert leftover_temp_files(store.directory) == []
    assert store.read() == before


LOOPER = """
    import sys
    from corepin.state import Assignment, ProcessOwner, StateStore
    store = StateStore(sys.argv[1])
    prefix = sys.argv[2]
    n = 0
    while True:
        with store.transaction() as tx:
            if n % 3 == 2:  # every third transaction frees the previous allocation
                tx.commit(tx.state.remove(f"{prefix}{n - 1}"))
                print(f"-{prefix}{n - 1}", flush=True)
            else:
                owner = ProcessOwner(n + 1)
                tx.commit(tx.state.add(Assignment(f"{prefix}{n}", kind="shared", owner=owner)))
                print(f"+{prefix}{n}", flush=True)
        n += 1
"""


def test_sigkill_of_a_writer_at_random_moments_never_loses_a_committed_allocation(
    tmp_path: Path,
) -> None:
    rng = random.Random(20240611)
    store = StateStore(tmp_path / "state")
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    expected: set[str] = set()
    for round_no in range(6):
        proc = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(LOOPER), store.directory, f"r{round_no}-"],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        assert proc.stdout is not None
        first = proc.stdout.readline()  # it is writing now
        time.sleep(rng.uniform(0.0, 0.15))
        os.kill(proc.pid, signal.SIGKILL)
        rest = proc.stdout.read()
        proc.stdout.close()
        proc.wait()
        assert proc.returncode == -signal.SIGKILL
        state = store.read()  # always readable
        assert state is not None, f"round {round_no}: no checkpoint"
        last_added = ""
        for line in (first + rest).split():
            if line[0] == "+":
                expected.add(line[1:])
                last_added = line[1:]
            else:
                expected.discard(line[1:])
        held = set(state.assignments)
        # Only the one transaction in flight at the kill (committed, not yet acknowledged) may
        # differ: an extra allocation, or the removal of the allocation added just before.
        missing = expected - held
        assert missing <= {last_added}, (
            f"round {round_no}: acknowledged allocations lost: {missing}"
        )
        assert len(held ^ expected) <= 1, f"round {round_no}: {held ^ expected}"
        expected = held
    with store.transaction():
        pass  # the next start removes what a killed writer left behind
    assert leftover_temp_files(store.directory) == []


# ---------------------------------------------------------------------- concurrency

INCREMENTER = """
    import sys
    from corepin.state import Assignment, ProcessOwner, StateStore
    store = StateStore(sys.argv[1])
    me = sys.argv[2]
    for i in range(int(sys.argv[3])):
        with store.transaction(timeout=60) as tx:
            s = tx.state
            count = int(s.options.get("counter", "0"))
            s = s.with_options({**s.options, "counter": str(count + 1)})
            tx.commit(s.add(Assignment(f"{me}-{i}", kind="shared")))
"""


def test_twenty_processes_doing_read_modify_write_lose_no_update(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state")
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(INCREMENTER), store.directory, f"p{n}", "10"],
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in range(20)
    ]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    state = store.read()
    assert state is not None
    assert state.options["counter"] == "200"
    assert state.revision == 200
    assert len(state.assignments) == 200


CLAIMER = """
    import sys
    from corepin.core.cpuset import CPUSet
    from corepin.core.errors import CorepinError
    from corepin.state import Assignment, ProcessOwner, StateStore
    store = StateStore(sys.argv[1])
    try:
        with store.transaction(timeout=60) as tx:
            free = tx.state.free
            if len(free) < 1:
                print("none")
                sys.exit(3)
            cpu = free.lowest(1)
            tx.commit(tx.state.add(Assignment(sys.argv[2], cpus=cpu)))
            print(cpu)
    except CorepinError as e:
        print(e.message)
        sys.exit(e.exit_code)
"""


def test_concurrent_claims_never_share_an_exclusive_cpu(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state")
    with store.transaction() as tx:
        tx.commit(tx.state.evolve(online=C("0-11"), reserved=C("0")))
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(CLAIMER), store.directory, f"run/{n}"],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        for n in range(20)
    ]
    outs = [(p.communicate(timeout=120)[0].strip(), p.returncode) for p in procs]
    winners = [o for o, rc in outs if rc == 0]
    losers = [o for o, rc in outs if rc != 0]
    assert len(winners) == 11 and len(set(winners)) == 11
    assert all(o == "none" for o in losers) and len(losers) == 9
    state = store.read()
    assert state is not None and state.overlaps() == [] and state.free == C("")


def test_a_checkpoint_written_by_write_checkpoint_is_valid_json(tmp_path: Path) -> None:
    path = str(tmp_path / "state.json")
    write_checkpoint(path, HostState(online=C("0-3")))
    assert json.loads(Path(path).read_text())["payload"]["online"] == "0-3"


# ---------------------------------------------------------------------- what a commit fsyncs

FSYNC_PROBE = """
    import sys
    from corepin.core.cpuset import CPUSet
    from corepin.state import Assignment, ContainerOwner, ProcessOwner, StateStore
    store = StateStore(sys.argv[1])
    what = sys.argv[2]
    with store.transaction() as tx:
        s = tx.state
        if what == "run":
            s = s.add(Assignment("run/9", cpus=CPUSet.of(9), owner=ProcessOwner(999, 1)))
        elif what == "first":  # a shared run: an empty state has no CPUs to give
            ident = f"run/{len(s.assignments)}"
            s = s.add(Assignment(ident, kind="shared", owner=ProcessOwner(999, 1)))
        elif what == "release":
            s = s.remove("run/1")
        elif what == "reserve":
            s = s.evolve(reserved=CPUSet.of(15))
        elif what == "container":
            owner = ContainerOwner(container_id="c" * 64)
            s = s.add(Assignment("ctr-1", cpus=CPUSet.of(10), owner=owner))
        tx.commit(s)
"""


def fsynced(directory: Path, what: str) -> list[str]:
    """The files and directories one commit of `what` fsyncs, as strace sees them (names
    relative to the state directory; '.' is the directory itself)."""
    log = directory.parent / f"strace-{what}.txt"
    res = subprocess.run(
        [
            *("strace", "-f", "-y", "-e", "trace=fsync,fdatasync", "-o", str(log)),
            *(sys.executable, "-c", textwrap.dedent(FSYNC_PROBE), str(directory), what),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(SRC)},
    )
    assert res.returncode == 0, res.stderr
    out = []
    for line in log.read_text().splitlines():
        if "sync(" not in line or "<" not in line:
            continue
        path = line.split("<", 1)[1].split(">", 1)[0]
        rel = os.path.relpath(path, directory)
        out.append("temp" if rel.startswith(".state.json.tmp-") else rel)
    return out


needs_strace = pytest.mark.skipif(
    subprocess.run(["sh", "-c", "command -v strace"], capture_output=True).returncode != 0,
    reason="needs strace",
)


@needs_strace
@pytest.mark.parametrize(
    ("what", "expected"),
    [
        ("run", ["temp"]),
        ("release", ["temp"]),
        ("reserve", ["temp", "."]),
        ("container", ["temp", "."]),
    ],
)
def test_a_commit_of_process_records_alone_fsyncs_the_file_and_others_the_directory_too(
    tmp_path: Path, what: str, expected: list[str]
) -> None:
    store = seeded(tmp_path)
    before = store.read()
    assert before is not None
    assert fsynced(Path(store.directory), what) == expected
    after = store.read()
    assert after is not None and after.revision == before.revision + 1


@needs_strace
def test_the_first_checkpoint_of_a_directory_is_fsynced_with_its_directory(tmp_path: Path) -> None:
    directory = tmp_path / "state"
    StateStore(directory).ensure_directory()
    assert fsynced(directory, "first") == ["temp", "."]
    assert fsynced(directory, "first") == ["temp"], "the second commit of the same kind"


def test_only_processes_differ_tells_records_of_processes_from_what_outlives_them() -> None:
    from corepin.state.owners import ContainerOwner
    from corepin.state.store import only_processes_differ

    base = HostState(online=C("0-15"), reserved=C("0"))
    run = Assignment("run/1", cpus=CPUSet.of(3), owner=ProcessOwner(100, 5))
    ctr = Assignment("ctr-1", cpus=CPUSet.of(4), owner=ContainerOwner(container_id="c" * 64))
    bare = Assignment("bare", cpus=CPUSet.of(5))  # no owner: kept as lasting
    with_run = base.add(run)
    assert only_processes_differ(base, with_run)
    assert only_processes_differ(with_run, base)
    assert only_processes_differ(with_run, with_run.evolve(revision=7))
    moved = with_run.replace_assignment(run.evolve(kind="shared", cpus=CPUSet(), withheld=CPUSet()))
    assert only_processes_differ(with_run, moved)
    assert not only_processes_differ(base, base.evolve(reserved=C("0-1")))
    assert not only_processes_differ(base, base.evolve(options={"strict-cpu-reservation": "true"}))
    assert not only_processes_differ(base, base.add(ctr))
    assert not only_processes_differ(base.add(ctr), base)
    assert not only_processes_differ(base, base.add(bare))
    assert not only_processes_differ(with_run, base.add(bare))
    assert not only_processes_differ(base, base.evolve(online=C("0-7")))
