"""Bad input and unusable environments in host mode: each a clear message and the exit code of
the documented exit codes (2 bad input, 3 unsatisfiable, 4 environment), never a traceback, and
never a silent rewrite of a state file corepin cannot read."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from corepin.agent.host.adopt import pin_container
from corepin.agent.host.agent import HostAgent
from corepin.agent.host.run import Runner, RunSpec
from corepin.agent.host.settings import HostSettings
from corepin.core.cpuset import CPUSet
from corepin.core.errors import InputError
from corepin.core.ids import IdError
from corepin.enforcement.faketree import make_fake_v1
from corepin.state.checkpoint import encode_checkpoint, encode_legacy
from corepin.state.model import Assignment, HostState
from corepin.state.owners import ProcessOwner
from corepin.sysfs.procfs import process_start_time
from support.helpers import run_corepin


def assert_clean_failure(out: subprocess.CompletedProcess[str], code: int, *needles: str) -> None:
    assert out.returncode == code, (out.returncode, out.stderr)
    assert "Traceback" not in out.stderr
    for needle in needles:
        assert needle in out.stderr, out.stderr


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    d = tmp_path / "state"
    d.mkdir()
    return d


def write_state(state_dir: Path, state: HostState) -> Path:
    path = state_dir / "state.json"
    path.write_bytes(encode_checkpoint(state))
    return path


def me() -> tuple[int, int]:
    pid = os.getpid()
    return pid, process_start_time(pid)


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (b"{not json", "not valid JSON"),
        (b'{"version":2,"checksum":"sha256:00","payload":{"revision":1', "truncated"),
        (b"", "empty"),
    ],
    ids=[
        "a state file that is not JSON is refused and named",
        "a truncated state file is detected as truncated",
        "an empty state file is refused",
    ],
)
@pytest.mark.parametrize("command", ["report", "run", "reconcile"])
def test_malformed_state_files_exit_2_and_stay_untouched(
    state_dir: Path, content: bytes, needle: str, command: str
) -> None:
    path = state_dir / "state.json"
    path.write_bytes(content)
    args = {
        "report": ["report"],
        "run": ["run", "--exclusive", "1", "--", "true"],
        "reconcile": ["reconcile", "--once"],
    }[command]
    out = run_corepin(*args[:1], "--state-dir", str(state_dir), "--cgroups", "off", *args[1:])
    assert_clean_failure(out, 2, str(path), needle)
    assert path.read_bytes() == content, "a state file corepin cannot read is never replaced"


def test_a_checkpoint_whose_payload_was_edited_fails_its_checksum(state_dir: Path) -> None:
    path = write_state(state_dir, HostState(online=CPUSet.parse("0-1")))
    doc = json.loads(path.read_text())
    doc["payload"]["online"] = "0-63"
    path.write_text(json.dumps(doc))
    out = run_corepin("report", "--state-dir", str(state_dir))
    assert_clean_failure(out, 2, "checksum mismatch")


def test_an_unknown_newer_state_version_is_refused_with_what_to_do(state_dir: Path) -> None:
    path = state_dir / "state.json"
    path.write_bytes(encode_legacy({"revision": 1}, 99))
    out = run_corepin("report", "--state-dir", str(state_dir))
    assert_clean_failure(out, 2, "version 99", "upgrade corepin")


def test_an_allocation_on_cpus_this_machine_does_not_have_is_refused_with_exit_4(
    state_dir: Path,
) -> None:
    pid, start = me()  # a live process, so the allocation is not simply reaped
    far = CPUSet.parse("900-901")
    write_state(
        state_dir,
        HostState(
            online=far,
            assignments={
                "ghost": Assignment(id="ghost", cpus=far, owner=ProcessOwner(pid, start)),
            },
        ),
    )
    before = (state_dir / "state.json").read_bytes()
    out = run_corepin("run", "--state-dir", str(state_dir), "--exclusive", "1", "--", "true")
    assert_clean_failure(out, 4, "900-901", "ghost")
    assert (state_dir / "state.json").read_bytes() == before


def test_an_allocation_on_missing_cpus_whose_process_is_gone_is_simply_freed(
    state_dir: Path,
) -> None:
    far = CPUSet.parse("900-901")
    write_state(
        state_dir,
        HostState(
            online=far,
            assignments={"old": Assignment(id="old", cpus=far, owner=ProcessOwner(4_000_000, 1))},
        ),
    )
    out = run_corepin("reconcile", "--once", "--state-dir", str(state_dir), "--cgroups", "off")
    assert out.returncode == 0, out.stderr
    assert "freed old" in out.stdout


def test_a_state_dir_below_a_regular_file_is_an_environment_problem(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    out = run_corepin(
        "run", "--state-dir", str(blocker / "state"), "--exclusive", "1", "--", "true"
    )
    assert_clean_failure(out, 4, str(blocker / "state"))


@pytest.fixture
def unwritable_dir(tmp_path: Path) -> Iterator[Path]:
    target = tmp_path / "ro"
    target.mkdir()
    if os.geteuid() == 0:
        mounted = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(target)],
            capture_output=True,
        )
        if mounted.returncode != 0:
            pytest.skip(f"cannot mount a read-only tmpfs: {mounted.stderr!r}")
        try:
            yield target
        finally:
            subprocess.run(["umount", str(target)], check=False)
    else:
        target.chmod(0o500)
        try:
            yield target
        finally:
            target.chmod(0o700)


def test_a_state_dir_corepin_may_not_write_exits_4_with_what_to_do(unwritable_dir: Path) -> None:
    out = run_corepin(
        "run", "--state-dir", str(unwritable_dir / "state"), "--exclusive", "1", "--", "true"
    )
    assert_clean_failure(out, 4, "--state-dir")


def test_the_state_dir_comes_from_the_environment_when_not_given(tmp_path: Path) -> None:
    env = dict(os.environ, COREPIN_STATE_DIR=str(tmp_path / "from-env"))
    out = run_corepin("run", "--cgroups", "off", "--exclusive", "1", "--", "true", env=env)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "from-env" / "state.json").exists()


@pytest.mark.parametrize(
    "args",
    [
        ["run", "--exclusive", "0", "--", "true"],
        ["run", "--exclusive", "two", "--", "true"],
        ["run", "--exclusive", "1", "--level", "rack", "--", "true"],
        ["run", "--exclusive", "1", "--shared", "--", "true"],
        ["run", "--exclusive", "1", "--policy", "no-such-policy", "--", "true"],
        ["run", "--shared", "--level", "numa", "--", "true"],
        ["run", "--cgroups", "sometimes", "--", "true"],
        ["reconcile", "--interval", "0"],
        ["report", "-o", "pdf"],
    ],
    ids=[
        "zero exclusive CPUs is a usage error",
        "a non-numeric CPU count is a usage error",
        "an unknown exclusiveness level is a usage error",
        "exclusive and shared at once is a usage error",
        "an unknown policy is named in the error",
        "a level without --exclusive is a usage error",
        "an unknown cgroups mode is a usage error",
        "a zero reconcile interval is a usage error",
        "an unknown report format is a usage error",
    ],
)
def test_bad_options_exit_2(args: list[str], tmp_path: Path) -> None:
    out = run_corepin(args[0], "--state-dir", str(tmp_path / "s"), *args[1:])
    assert_clean_failure(out, 2)
    assert not (tmp_path / "marker").exists()


def test_an_unknown_policy_is_named(tmp_path: Path) -> None:
    out = run_corepin(
        "run", "--state-dir", str(tmp_path), "--exclusive", "1", "--policy", "nope", "--", "true"
    )
    assert_clean_failure(out, 2, "'nope'")


@pytest.mark.parametrize(
    "bad_id",
    ["../../etc", "abc/def", "..", "", "a" * 64 + "/x", "ctr\x00"],
    ids=[
        "a container id climbing out of the hierarchy is rejected",
        "a container id with a slash is rejected",
        "a dot-dot container id is rejected",
        "an empty container id is rejected",
        "a container id with a path tail is rejected",
        "a container id with a NUL byte is rejected",
    ],
)
def test_bad_container_ids_are_rejected_before_anything_is_touched(
    tmp_path: Path, bad_id: str
) -> None:
    agent = HostAgent(HostSettings(state_dir=str(tmp_path / "state"), cgroups="off"))
    with pytest.raises(IdError) as info:
        pin_container(agent, bad_id, exclusive=1)
    assert info.value.exit_code == 2
    assert not (tmp_path / "state").exists(), "nothing was written for a bad id"


def test_a_state_file_with_a_cgroup_path_escaping_the_hierarchy_is_never_written_to(
    state_dir: Path, tmp_path: Path
) -> None:
    fake_root = tmp_path / "cgroup"
    online = CPUSet(os.sched_getaffinity(0))
    make_fake_v1(fake_root, cpus=online, mems=CPUSet.of(0), separate_cpu_mount=False)
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "cpuset.cpus").write_text("untouched\n")
    cpu = CPUSet.of(online.first())
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        write_state(
            state_dir,
            HostState(
                online=online,
                assignments={
                    "evil": Assignment(
                        id="evil",
                        cpus=cpu,
                        owner=ProcessOwner(
                            sleeper.pid,
                            process_start_time(sleeper.pid),
                            cgroup="corepin/../../../victim",
                        ),
                    ),
                    "other": Assignment(
                        id="other",
                        kind="shared",
                        owner=ProcessOwner(
                            sleeper.pid,
                            process_start_time(sleeper.pid),
                            cgroup="kubepods",  # the kubelet's parent itself: not a pod's group
                        ),
                    ),
                },
            ),
        )
        out = run_corepin(
            "reconcile",
            "--once",
            "--state-dir",
            str(state_dir),
            "--cgroups",
            "on",
            "--cgroup-root",
            str(fake_root),
        )
        assert out.returncode == 0, out.stderr
        assert "refused evil: cgroup 'corepin/../../../victim'" in out.stdout
        assert "refused other: cgroup 'kubepods'" in out.stdout
        assert (victim / "cpuset.cpus").read_text() == "untouched\n"
        assert not (fake_root / "cpuset" / "kubepods").exists()
    finally:
        sleeper.kill()
        sleeper.wait()


def test_missing_command_names_the_usage(tmp_path: Path) -> None:
    out = run_corepin("run", "--state-dir", str(tmp_path), "--shared", "--")
    assert_clean_failure(out, 2, "CMD")


def test_input_error_type_of_missing_command_in_the_agent(tmp_path: Path) -> None:
    agent = HostAgent(HostSettings(state_dir=str(tmp_path), cgroups="off"))
    with pytest.raises(InputError):
        Runner(agent).run([], RunSpec(exclusive=1))


def test_cgroups_on_with_a_cgroup_root_without_cpuset_exits_4_naming_it(tmp_path: Path) -> None:
    root = tmp_path / "not-a-cgroup-mount"
    root.mkdir()
    out = run_corepin(
        "run",
        "--state-dir",
        str(tmp_path / "state"),
        "--cgroups",
        "on",
        "--cgroup-root",
        str(root),
        "--",
        "true",
    )
    assert_clean_failure(out, 4, str(root / "cpuset"), "--cgroups off")
