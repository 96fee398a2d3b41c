"""The state directory is trusted only when it is safe.

corepin runs as root. A directory that another user owns or may write would let that user
forge a validly checksummed checkpoint, or plant `state.lock` as a link to a file that root
then creates or opens. corepin refuses such a directory (exit 4, naming it and the fix) and
never follows a link inside its state directory. Paths the system cannot resolve (link loops,
names too long) are exit 2 or 4 with a message, never 1.

Everything runs for real: real directories, ownership and modes, links, the `corepin` command.
"""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from corepin.core.cpuset import CPUSet
from corepin.core.errors import StateError
from corepin.state import Assignment, HostState, ProcessOwner, StateStore
from corepin.state.checkpoint import encode_checkpoint, leftover_temp_files
from corepin.state.store import LOCK_FILE
from support.helpers import run_corepin

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to chown to another user")
NOBODY = 65534


def corepin(state: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`corepin CMD --state-dir STATE --cgroups off ARGS` (args[0] is the subcommand)."""
    return run_corepin(args[0], "--state-dir", str(state), "--cgroups", "off", *args[1:])


def assert_refused(out: subprocess.CompletedProcess[str], code: int, *needles: str) -> None:
    assert out.returncode == code, (out.returncode, out.stdout, out.stderr)
    assert "Traceback" not in out.stderr and "internal error" not in out.stderr, out.stderr
    for needle in needles:
        assert needle in out.stderr, (needle, out.stderr)


def forged_checkpoint() -> bytes:
    """A validly checksummed checkpoint that claims CPU 0 for a process that is not there."""
    state = HostState(online=CPUSet.parse("0")).add(
        Assignment("forged/1", cpus=CPUSet.of(0), owner=ProcessOwner(1, 1))
    )
    return encode_checkpoint(state)


COMMANDS = {
    "report": ("report",),
    "run": ("run", "--exclusive", "1", "--", "true"),
    "reconcile": ("reconcile", "--once"),
}


# ---------------------------------------------------------------------- whose directory


@needs_root
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_state_dir_owned_by_another_user_is_refused_with_the_fix(
    tmp_path: Path, command: str
) -> None:
    state = tmp_path / "theirs"
    state.mkdir(mode=0o700)
    (state / "state.json").write_bytes(forged_checkpoint())
    os.chown(state / "state.json", NOBODY, NOBODY)
    os.chown(state, NOBODY, NOBODY)
    out = corepin(state, *COMMANDS[command])
    assert_refused(out, 4, str(state), f"uid {NOBODY}", "chown", "--state-dir")
    assert "forged/1" not in out.stdout
    assert sorted(p.name for p in state.iterdir()) == ["state.json"], "nothing created in it"


@pytest.mark.parametrize(
    ("mode", "who"),
    [(0o770, "its group"), (0o757, "others"), (0o777, "group and others"), (0o1777, "group")],
    ids=[
        "a group-writable state dir is refused",
        "an other-writable state dir is refused",
        "a world-writable state dir is refused",
        "a sticky world-writable state dir (like /tmp) is refused",
    ],
)
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_state_dir_writable_by_others_is_refused_with_the_fix(
    tmp_path: Path, mode: int, who: str, command: str
) -> None:
    state = tmp_path / "open"
    state.mkdir()
    state.chmod(mode)
    (state / "state.json").write_bytes(forged_checkpoint())
    out = corepin(state, *COMMANDS[command])
    assert_refused(out, 4, str(state), f"writable by {who}", "chmod go-w", "--state-dir")
    assert "forged/1" not in out.stdout
    assert not (state / LOCK_FILE).exists()


def test_the_directory_corepin_creates_is_0700_and_accepted(tmp_path: Path) -> None:
    state = tmp_path / "new" / "state"
    out = corepin(state, "run", "--exclusive", "1", "--", "true")
    assert out.returncode == 0, out.stderr
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    assert corepin(state, "report").returncode == 0


def test_a_mkdir_p_directory_with_mode_0755_is_accepted(tmp_path: Path) -> None:
    """The README demo makes its state dir with `mkdir -p` under umask 022."""
    state = tmp_path / ".corepin-demo"
    done = subprocess.run(["sh", "-c", f"umask 022 && mkdir -p {state}"], check=True)
    assert done.returncode == 0 and stat.S_IMODE(state.stat().st_mode) == 0o755
    out = corepin(state, "run", "--exclusive", "1", "--", "true")
    assert out.returncode == 0, out.stderr
    assert corepin(state, "report", "-o", "json").returncode == 0


def test_a_state_dir_path_that_is_a_link_to_a_safe_directory_is_accepted(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(real)
    out = corepin(tmp_path / "link", "run", "--exclusive", "1", "--", "true")
    assert out.returncode == 0, out.stderr
    assert (real / "state.json").is_file()


@needs_root
def test_a_link_to_a_directory_of_another_user_is_refused(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, NOBODY, NOBODY)
    (tmp_path / "link").symlink_to(theirs)
    assert_refused(corepin(tmp_path / "link", *COMMANDS["run"]), 4, f"uid {NOBODY}", "chown")
    assert list(theirs.iterdir()) == []


# ---------------------------------------------------------------------- links inside it


@pytest.mark.parametrize("command", ["run", "reconcile"])
def test_a_state_lock_planted_as_a_link_is_refused_and_its_target_never_created(
    tmp_path: Path, command: str
) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    target = tmp_path / "victim"  # e.g. /etc/ld.so.preload for a real attacker
    (state / LOCK_FILE).symlink_to(target)
    out = corepin(state, *COMMANDS[command])
    assert_refused(out, 4, str(state / LOCK_FILE), "symbolic link")
    assert not target.exists(), "root must not create the file a planted link points to"


def test_a_state_lock_linked_to_an_existing_file_leaves_that_file_alone(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    target = tmp_path / "precious"
    target.write_text("keep me\n")
    target.chmod(0o644)
    (state / LOCK_FILE).symlink_to(target)
    with pytest.raises(StateError) as info, StateStore(state).transaction():
        pass
    assert info.value.reason == "state_symlink" and str(state / LOCK_FILE) in str(info.value)
    assert target.read_text() == "keep me\n" and stat.S_IMODE(target.stat().st_mode) == 0o644


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_checkpoint_planted_as_a_link_is_refused_not_read(tmp_path: Path, command: str) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    forged = tmp_path / "forged.json"
    forged.write_bytes(forged_checkpoint())
    (state / "state.json").symlink_to(forged)
    out = corepin(state, *COMMANDS[command])
    assert_refused(out, 4, str(state / "state.json"), "symbolic link")
    assert "forged/1" not in out.stdout
    assert forged.read_bytes() == forged_checkpoint(), "the link's target is never written"
    assert (state / "state.json").is_symlink(), "nor is the link replaced behind the operator"


def test_the_lock_queue_planted_as_a_link_is_refused(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (state / "state.lock.queue").symlink_to(elsewhere)
    with pytest.raises(StateError) as info, StateStore(state).transaction():
        pass
    assert info.value.exit_code == 4 and "state.lock.queue" in str(info.value)
    assert list(elsewhere.iterdir()) == []


def test_a_link_named_like_a_leftover_temp_file_is_removed_not_its_target(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state")
    store.ensure_directory()
    target = tmp_path / "precious"
    target.write_text("keep me\n")
    (tmp_path / "state" / ".state.json.tmp-1-deadbeef").symlink_to(target)
    with store.transaction() as tx:
        tx.commit(tx.state.evolve(online=CPUSet.parse("0-1")))
    assert leftover_temp_files(store.directory) == []
    assert target.read_text() == "keep me\n"


def test_a_fifo_planted_as_the_checkpoint_is_refused_without_hanging(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    os.mkfifo(state / "state.json")
    out = corepin(state, "report")  # run_corepin times out (60 s) if the open blocks
    assert_refused(out, 4, str(state / "state.json"), "not a regular file")


# ---------------------------------------------------------------------- unresolvable paths


def _loop(tmp_path: Path) -> Path:
    (tmp_path / "loop-a").symlink_to(tmp_path / "loop-b")
    (tmp_path / "loop-b").symlink_to(tmp_path / "loop-a")
    return tmp_path / "loop-a"


@pytest.mark.parametrize(
    "which",
    ["link loop", "below a link loop", "name too long", "path too long"],
)
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_an_unresolvable_state_dir_exits_2_or_4_with_a_message(
    tmp_path: Path, which: str, command: str
) -> None:
    state = {
        "link loop": lambda: _loop(tmp_path),
        "below a link loop": lambda: _loop(tmp_path) / "state",
        "name too long": lambda: tmp_path / ("n" * 300),
        "path too long": lambda: tmp_path.joinpath(*["d" * 200] * 25),
    }[which]()
    out = corepin(state, *COMMANDS[command])
    assert out.returncode in (2, 4), (out.returncode, out.stderr)
    assert "Traceback" not in out.stderr and "internal error" not in out.stderr, out.stderr
    assert "--state-dir" in out.stderr, out.stderr
    assert ("symbolic links" in out.stderr) == ("loop" in which), out.stderr
    assert ("too long" in out.stderr) == ("too long" in which), out.stderr


def test_migrate_into_an_unresolvable_state_dir_exits_4(tmp_path: Path) -> None:
    kubelet = tmp_path / "cpu_manager_state"
    kubelet.write_text('{"policyName":"none","defaultCpuSet":"","checksum":0}')
    out = run_corepin(
        "migrate", "--from-kubelet", str(kubelet), "--state-dir", str(_loop(tmp_path) / "s")
    )
    assert_refused(out, 4, "symbolic links", "--state-dir")


@needs_root
def test_a_report_reads_a_safe_state_dir_on_a_read_only_mount_and_run_is_refused(
    tmp_path: Path,
) -> None:
    state = tmp_path / "ro"
    state.mkdir(mode=0o700)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k,mode=0700", "tmpfs", str(state)],
        capture_output=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {mounted.stderr!r}")
    try:
        assert corepin(state, "run", "--exclusive", "1", "--", "true").returncode == 0
        subprocess.run(["mount", "-o", "remount,ro", str(state)], check=True)
        out = corepin(state, "report", "-o", "json")
        assert out.returncode == 0, out.stderr
        assert_refused(corepin(state, *COMMANDS["run"]), 4, str(state))
    finally:
        subprocess.run(["umount", str(state)], check=False)
