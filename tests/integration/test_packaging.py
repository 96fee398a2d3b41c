"""Packaging for a host: the systemd unit of the reconcile loop, bash completion and the man
page - both generated from corepin's own argparse parser, so they follow every new option."""

from __future__ import annotations

import configparser
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from support.paths import REPO

UNIT = REPO / "packaging" / "systemd" / "corepin-reconcile.service"
CLI = Path(sys.executable).parent / "corepin"


def generate(script: str, out: Path) -> Path:
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / script), str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr
    return out


@pytest.fixture(scope="module")
def manpage(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generate("gen_man.py", tmp_path_factory.mktemp("man") / "man1" / "corepin.1")


@pytest.fixture(scope="module")
def completion(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generate("gen_completion.py", tmp_path_factory.mktemp("completion") / "corepin")


# ---------------------------------------------------------------------- systemd unit


def unit_sections() -> configparser.RawConfigParser:
    parser = configparser.RawConfigParser(strict=False)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(UNIT.read_text())
    return parser


def test_the_unit_runs_the_reconcile_loop_and_keeps_cgroups_and_irqs_writable() -> None:
    unit = unit_sections()
    assert unit.sections() == ["Unit", "Service", "Install"]
    start = unit["Service"]["ExecStart"].split()
    assert start[0].endswith("/corepin") and start[1:3] == ["reconcile", "--interval"]
    assert float(start[3]) > 0
    assert unit["Service"]["Restart"] == "on-failure"
    assert unit["Service"]["StateDirectory"] == "corepin"
    for forbidden in ("ProtectControlGroups", "ProtectKernelTunables"):
        assert forbidden not in unit["Service"], f"{forbidden} would stop cgroup or IRQ writes"
    assert unit["Service"].get("ProtectSystem") != "strict"
    assert unit["Install"]["WantedBy"] == "multi-user.target"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze here")
def test_systemd_analyze_verify_accepts_the_unit(tmp_path: Path, manpage: Path) -> None:
    text = UNIT.read_text().replace("/usr/local/bin/corepin", str(CLI))
    unit = tmp_path / UNIT.name
    unit.write_text(text)
    env = dict(os.environ, MANPATH=str(manpage.parent.parent))  # Documentation=man:corepin(1)
    done = subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, env=env
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stderr.strip() == "", done.stderr


def test_the_loop_the_unit_starts_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    loop = subprocess.Popen(
        [str(CLI), "reconcile", "--interval", "0.2", "--state-dir", str(tmp_path / "state")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        import time

        time.sleep(1.5)
        loop.terminate()
        _out, err = loop.communicate(timeout=10)
    finally:
        if loop.poll() is None:
            loop.kill()
            loop.wait()
    assert loop.returncode == 0, err
    assert "Traceback" not in err


# ---------------------------------------------------------------------- bash completion


def complete(script: Path, *words: str) -> list[str]:
    """What bash offers after `corepin WORDS` (the last word is the one being completed)."""
    line = ["corepin", *words]
    code = (
        f"source {script}\n"
        f"COMP_WORDS=({' '.join(repr(w) for w in line)}); COMP_CWORD={len(line) - 1}\n"
        '_corepin; printf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    done = subprocess.run(["bash", "-c", code], capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0, done.stderr
    return [w for w in done.stdout.splitlines() if w]


def test_the_completion_script_is_valid_bash(completion: Path) -> None:
    done = subprocess.run(["bash", "-n", str(completion)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_it_completes_subcommands_options_and_their_values(completion: Path) -> None:
    assert complete(completion, "sh") == ["shield"]
    assert set(complete(completion, "")) >= {"run", "pin", "shield", "report", "reconcile"}
    assert set(complete(completion, "shield", "")) >= {"on", "off", "status", "--scope"}
    assert complete(completion, "shield", "on", "--k") == ["--kthreads"]
    run = set(complete(completion, "run", "--"))
    assert {"--cpus", "--wait", "--membind", "--interleave", "--preferred"} <= run
    assert {"--reserved-cpus", "--reserved-count", "--exclusive"} <= run
    assert complete(completion, "report", "-o", "") == ["table", "json", "yaml", "svg"]
    assert complete(completion, "run", "--level", "n") == ["numa"]
    assert complete(completion, "pin", "--pid", "") == [], "a pid: nothing to offer"


def test_it_completes_directories_and_commands_where_they_belong(
    completion: Path, tmp_path: Path
) -> None:
    (tmp_path / "statedir").mkdir()
    (tmp_path / "a-file").write_text("")
    dirs = complete(completion, "run", "--state-dir", str(tmp_path / "st"))
    assert dirs == [str(tmp_path / "statedir")]
    assert "ls" in complete(completion, "run", "--exclusive", "1", "--", "l")


def test_a_new_option_reaches_the_completion_without_editing_it(completion: Path) -> None:
    from corepin.cli.main import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    shield = sub.choices["shield"]  # type: ignore[attr-defined]
    every = {o for a in shield._actions for o in a.option_strings if a.help != "==SUPPRESS=="}
    assert every <= set(complete(completion, "shield", "-"))


# ---------------------------------------------------------------------- man page


def test_the_man_page_renders_without_warnings(manpage: Path) -> None:
    if shutil.which("groff") is None:
        pytest.skip("no groff here")
    done = subprocess.run(
        ["groff", "-man", "-Tutf8", "-ww", "-z", str(manpage)], capture_output=True, text=True
    )
    assert done.returncode == 0 and done.stderr == "", done.stderr


def test_the_man_page_documents_every_command_and_option(manpage: Path) -> None:
    from corepin.cli.main import COMMANDS, build_parser

    text = manpage.read_text()
    for name in COMMANDS:
        assert f".SS corepin {name}" in text
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    for name in ("run", "pin", "shield", "report", "reconcile"):
        for action in sub.choices[name]._actions:  # type: ignore[attr-defined]
            for option in action.option_strings:
                if action.help != "==SUPPRESS==":
                    assert option.replace("-", "\\-") in text, f"{name} {option}"
    for line in text.splitlines():
        assert not line.startswith("'"), "a line starting with ' is a roff request"
        if line.startswith("."):
            assert line.split()[0] in {
                ".TH", ".SH", ".SS", ".TP", ".PP", ".ad", ".nf", ".fi", ".RS", ".RE"
            }, line  # fmt: skip
    assert ".SH EXIT STATUS" in text and "\\fBCOREPIN_STATE_DIR\\fR" in text


def test_the_man_page_has_examples_and_the_portable_ones_run(manpage: Path, tmp_path: Path) -> None:
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        from gen_man import EXAMPLES, PORTABLE_EXAMPLES
    finally:
        sys.path.remove(str(REPO / "scripts"))
    text = manpage.read_text()
    assert ".SH EXAMPLES" in text
    sections = [line for line in text.splitlines() if line.startswith(".SH ")]
    assert sections.index(".SH EXAMPLES") > sections.index(".SH EXIT STATUS")
    for _, command in EXAMPLES:
        for line in command.splitlines():
            assert line.replace("-", "\\-") in text
    for _, command in EXAMPLES[:PORTABLE_EXAMPLES]:
        for line in command.splitlines():
            argv = line.split()
            assert argv[0] == "corepin"
            done = subprocess.run(
                [str(CLI), *argv[1:]], capture_output=True, text=True, cwd=tmp_path, timeout=120
            )
            assert done.returncode == 0, f"{line}: {done.stderr}"
            assert done.stdout or "--out" in argv, line
    assert json.loads((tmp_path / "trace.json").read_text())["events"]


def test_it_offers_policy_and_machine_names(completion: Path) -> None:
    assert complete(completion, "allocate", "--policy", "") == [
        "topology-aware",
        "kubelet-static",
        "workload-aware",
    ]
    assert complete(completion, "run", "--policy", "k") == ["kubelet-static"]
    assert complete(completion, "topology", "--machine", "epyc") == ["epyc-4l3"]
    assert "list" in complete(completion, "simulate", "--machine", "")


def test_release_offers_the_ids_of_the_allocations_quietly(
    completion: Path, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    env = dict(os.environ, COREPIN_CGROUPS="off", COREPIN_STATE_DIR=str(state))
    path = f"{CLI.parent}:{env.get('PATH', '')}"
    code = lambda *words: (  # noqa: E731 - the bash lines of one completion
        f"export PATH={path}\nsource {completion}\n"
        f"COMP_WORDS=(corepin {' '.join(words)}); COMP_CWORD={len(words)}\n"
        '_corepin; printf "%s\\n" "${COMPREPLY[@]}"\n'
    )

    def offered(*words: str) -> tuple[list[str], str]:
        done = subprocess.run(["bash", "-c", code(*words)], capture_output=True, text=True, env=env)
        assert done.returncode == 0, done.stderr
        return [w for w in done.stdout.splitlines() if w], done.stderr

    missing, noise = offered("release", "--state-dir", str(tmp_path / "nowhere"), "''")
    assert noise == "", "completion stays quiet when report fails"
    assert not [w for w in missing if w.startswith("run-")]
    sleeper = subprocess.Popen(
        [str(CLI), "run", "--shared", "--name", "sleeper", "--", "sleep", "60"],
        env=env,
        stdout=subprocess.DEVNULL,
    )
    try:
        wait_for_ids = []
        for _ in range(200):
            wait_for_ids = [w for w in offered("release", "''")[0] if not w.startswith("-")]
            if wait_for_ids:
                break
            subprocess.run(["sleep", "0.05"], check=True)
        report = subprocess.run(
            [str(CLI), "report", "-o", "json"], env=env, capture_output=True, text=True
        )
        ids = [a["id"] for a in json.loads(report.stdout)["allocations"]]
        assert wait_for_ids == ids and len(ids) == 1
        assert offered("release", "--state-dir", str(state), "''")[0][-1] == ids[0]
        assert "--kill" in offered("release", "--")[0]
    finally:
        sleeper.terminate()
        sleeper.wait(timeout=30)
