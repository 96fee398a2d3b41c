"""A checkout anywhere on the host runs in a guest, even below a path the guest covers with its
own tmpfs (/tmp, /run): a clone in /tmp once failed every guest test because its init mounted a
tmpfs over /tmp and commands could not `cd` into the checkout."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from vm import Guest, GuestPool, Shape
from vm import skip_reason as vm_skip_reason
from vm.guest import REPO

pytestmark = [
    pytest.mark.vm,
    pytest.mark.skipif(vm_skip_reason() is not None, reason=vm_skip_reason() or ""),
]

TINY = Shape("tiny", cores=2, mem_mb=384)


@pytest.fixture
def checkout_in_tmp() -> Iterator[Path]:
    """A stand-in checkout directly below the host's /tmp (whatever pytest's basetemp is), with
    a venv of its own (bare: the probe needs only the standard library), this checkout's probe
    and a marker file only it holds."""
    where = Path(tempfile.mkdtemp(prefix="corepin clone ", dir="/tmp"))
    try:
        (where / "MARKER").write_text(f"checkout {where}\n")
        subprocess.run(
            [sys.executable, "-m", "venv", "--without-pip", str(where / ".venv")],
            check=True,
            timeout=120,
        )
        (where / "tests" / "vm").mkdir(parents=True)
        shutil.copy(REPO / "tests" / "vm" / "probe.py", where / "tests" / "vm" / "probe.py")
        yield where
    finally:
        shutil.rmtree(where, ignore_errors=True)


def test_a_checkout_under_tmp_is_where_the_guest_runs_its_commands(
    checkout_in_tmp: Path, tmp_path: Path, vm_pool: GuestPool
) -> None:
    # a file in the host's /tmp beside the checkout: the guest's own /tmp must not show it
    beside = Path(tempfile.mkstemp(prefix="corepin-beside-", dir="/tmp")[1])
    guest = Guest(
        TINY,
        tmp_path / "guest",
        boot_files=vm_pool.boot_files(),
        pool=vm_pool,
        checkout=checkout_in_tmp,
    )
    try:
        result = guest.run(
            f"pwd; cat MARKER; command -v python; python tests/vm/probe.py self | head -c 1; "
            f"echo; test -e {beside} && echo host-tmp-visible || echo own-tmp; "
            "grep -c ' /tmp tmpfs ' /proc/mounts"
        )
    finally:
        guest.stop()
        os.unlink(beside)
    assert result.returncode == 0, result.output
    cwd, marker, python, probe, tmp, tmpfs = result.stdout.splitlines()[:6]
    assert cwd == str(checkout_in_tmp)
    assert marker == f"checkout {checkout_in_tmp}"
    assert python == str(checkout_in_tmp / ".venv" / "bin" / "python")
    assert probe == "{"  # the probe's JSON line: Python from the checkout's venv runs there
    assert tmp == "own-tmp" and tmpfs == "1"
