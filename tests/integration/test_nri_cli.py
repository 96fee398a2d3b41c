"""`corepin nri` as a process, where no runtime is needed: bad input is refused with exit 2 and
one line naming the value, a socket nobody serves with exit 4 and one line naming the socket,
and the help says what the command is for."""

from __future__ import annotations

from pathlib import Path

import pytest

from support.helpers import run_corepin
from support.ports import free_port


def nri(tmp_path: Path, *extra: str) -> tuple[int, str]:
    done = run_corepin(
        "nri",
        "--state-dir",
        str(tmp_path / "state"),
        "--metrics-address",
        f"127.0.0.1:{free_port()}",
        "--connect-timeout",
        "0.5",
        *extra,
    )
    return done.returncode, done.stderr


def test_a_socket_nobody_serves_exits_4_with_one_line(tmp_path: Path) -> None:
    code, err = nri(tmp_path, "--socket", str(tmp_path / "nri.sock"))
    assert code == 4, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and str(tmp_path / "nri.sock") in lines[0], err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("flag", "value"),
    [("--plugin-index", "7"), ("--plugin-name", "my-plugin"), ("--reserved-cpus", "x-y")],
)
def test_bad_input_exits_2_naming_the_value(tmp_path: Path, flag: str, value: str) -> None:
    code, err = nri(tmp_path, "--socket", str(tmp_path / "nri.sock"), flag, value)
    assert code == 2, err
    assert value in err and "Traceback" not in err


def test_help_explains_the_command() -> None:
    done = run_corepin("nri", "--help")
    assert done.returncode == 0
    for word in ("NRI", "CreateContainer", "--socket", "--plugin-index", "corepin agent"):
        assert word in done.stdout
