"""The guest harness itself (`tests/vm`): commands, the share, pytest inside a guest, and the
ways a guest breaks - a command past its limit, a guest that dies, a kernel panic, no 9p, a
boot that hangs - each ending in a clear error with the console's tail, QEMU gone."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from vm import Guest, GuestBootError, GuestDied, GuestPool, GuestTimeout, Shape
from vm import skip_reason as vm_skip_reason
from vm.guest import REPO
from vm.image import prepare

pytestmark = [pytest.mark.vm]
needs_qemu = pytest.mark.skipif(vm_skip_reason() is not None, reason=vm_skip_reason() or "")

TINY = Shape("tiny", cores=2, mem_mb=384)


@pytest.fixture(scope="module")
def tiny(vm_pool: GuestPool) -> Guest:
    return vm_pool.get("tiny", TINY)


@needs_qemu
def test_a_command_runs_on_the_guest_kernel_in_this_checkout(tiny: Guest) -> None:
    result = tiny.run(
        "uname -r; pwd; nproc; cat /sys/fs/cgroup/cgroup.controllers; "
        "grep ' / ' /proc/mounts; echo to-stderr >&2; exit 3"
    )
    assert result.returncode == 3
    release, cwd, nproc, controllers, root_mount = result.stdout.splitlines()[:5]
    assert release == tiny.release and release != os.uname().release
    assert cwd == str(REPO)
    assert nproc == "2"
    assert "cpuset" in controllers.split()
    assert root_mount.split()[2] == "9p" and "ro" in root_mount.split()[3].split(",")
    assert result.stderr == "to-stderr\n"


@needs_qemu
def test_the_share_is_one_directory_at_the_same_path_on_both_sides(tiny: Guest) -> None:
    (tiny.share / "from-host").write_text("hello guest\n")
    tiny.run(
        f"cat {tiny.share}/from-host > {tiny.share}/from-guest; echo back >> "
        f"{tiny.share}/from-guest"
    ).check()
    assert (tiny.share / "from-guest").read_text() == "hello guest\nback\n"


GUEST_TEST = """
import corepin, os

def test_corepin_comes_from_the_checkout():
    assert corepin.__file__.startswith({src!r})

def test_the_kernel_offers_cgroup_v2_cpusets():
    with open("/sys/fs/cgroup/cgroup.controllers") as f:
        assert "cpuset" in f.read().split()

def test_this_one_fails_on_purpose():
    assert os.cpu_count() == 3
"""


@needs_qemu
def test_a_pytest_selection_runs_inside_the_guest_with_this_venv(tiny: Guest) -> None:
    # python startup is ~18x slower in the guest: no conftest, no cache, one small file
    (tiny.share / "test_in_guest.py").write_text(GUEST_TEST.format(src=str(REPO / "src")))
    result = tiny.pytest(
        "--noconftest", "-q", "-p", "no:hypothesispytest", str(tiny.share / "test_in_guest.py")
    )
    assert result.returncode == 1, result.output
    assert "1 failed, 2 passed" in result.stdout
    assert "assert 2 == 3" in result.stdout


@needs_qemu
def test_a_command_past_its_limit_is_killed_and_the_guest_lives_on(tiny: Guest) -> None:
    with pytest.raises(GuestTimeout, match="2s limit"):
        tiny.run("echo started; sleep 60", timeout=2)
    assert tiny.run("echo still here").check().stdout == "still here\n"


@needs_qemu
def test_a_guest_that_dies_under_a_command_fails_with_the_console_tail(tiny: Guest) -> None:
    with pytest.raises(GuestDied) as caught:
        tiny.run("echo bye-from-guest > /dev/console; echo o > /proc/sysrq-trigger; sleep 60")
    assert "bye-from-guest" in caught.value.console
    assert not tiny.running


def _broken(tmp_path: Path, vm_pool: GuestPool, **kw: object) -> Guest:
    return Guest(TINY, tmp_path / "guest", pool=vm_pool, **kw)  # type: ignore[arg-type]


@needs_qemu
def test_a_kernel_panic_fails_the_boot_with_the_console_tail(
    tmp_path: Path, vm_pool: GuestPool
) -> None:
    guest = _broken(tmp_path, vm_pool, boot_files=vm_pool.boot_files(), cmdline=["rdinit=/none"])
    with pytest.raises(GuestBootError, match="stopped before it was ready") as caught:
        guest.start()
    assert "Kernel panic" in caught.value.console
    assert not guest.running


@needs_qemu
def test_a_guest_without_9p_fails_the_boot_naming_what_is_missing(
    tmp_path: Path, vm_pool: GuestPool
) -> None:
    files = prepare(tmp_path / "boot", modules=())
    guest = _broken(tmp_path, vm_pool, boot_files=files)
    with pytest.raises(GuestBootError) as caught:
        guest.start()
    assert "FAILED: cannot mount the host root (9p tag hostroot)" in caught.value.console
    assert not guest.running


@needs_qemu
def test_a_boot_that_does_not_finish_in_time_is_killed(tmp_path: Path, vm_pool: GuestPool) -> None:
    guest = _broken(tmp_path, vm_pool, boot_files=vm_pool.boot_files(), boot_timeout=0.5)
    with pytest.raises(GuestBootError, match="not ready after"):
        guest.start()
    assert guest.process is None and not guest.running


def _by_hand(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tests.vm", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
        check=False,
    )


def test_by_hand_the_shapes_are_listed_with_what_they_are() -> None:
    out = _by_hand("--list")
    assert out.returncode == 0, out.stderr
    assert "numa4-smt2: 16 CPUs, 2 socket(s)" in out.stdout
    assert "offline 6-7, isolcpus=2-3" in out.stdout


def test_by_hand_where_guests_cannot_run_it_says_why_and_exits_77() -> None:
    out = _by_hand("l3x2", "--", "true", env={"COREPIN_VM": "off"})
    assert out.returncode == 77
    assert "guests cannot run here: guest tests turned off (COREPIN_VM=off)" in out.stderr
