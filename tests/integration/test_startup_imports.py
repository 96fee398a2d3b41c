"""The command's start-up path stays lean: building `corepin --help` imports no heavy module.

(The one-way layer contracts themselves are checked by `lint-imports` in `make check`.)
Each check runs in a fresh interpreter so that modules imported by other tests do not count.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from support.helpers import run_corepin

#: Modules (and their submodules) that parsing arguments must not need.
FORBIDDEN = (
    "yaml",
    "xml",
    "asyncio",
    "http",
    "email",
    "ssl",
    "hypothesis",
    "corepin.cli.render",
    "corepin.topology.discover",
    "corepin.topology.build",
    "corepin.api",
    "grpc",
    "google.protobuf",
    "prometheus_client",
)
#: Packages whose submodules (policies, checkpoints, cgroup writers, ...) load only on demand.
LAZY_PACKAGES = (
    "corepin.sysfs",
    "corepin.allocation",
    "corepin.state",
    "corepin.enforcement",
    "corepin.kube",
    "corepin.agent",
    "corepin.api",
)

PROBE = """
import json, sys
from corepin.cli.main import build_parser
build_parser()
print(json.dumps(sorted(sys.modules)))
"""


def _modules_after(code: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    loaded: list[str] = json.loads(done.stdout)
    return loaded


@pytest.fixture(scope="module")
def startup_modules() -> list[str]:
    return _modules_after(PROBE)


@pytest.mark.parametrize("name", FORBIDDEN)
def test_building_the_command_line_does_not_import(startup_modules: list[str], name: str) -> None:
    offenders = [m for m in startup_modules if m == name or m.startswith(name + ".")]
    assert offenders == [], f"start-up imports {offenders}: import them inside run() instead"


@pytest.mark.parametrize("package", LAZY_PACKAGES)
def test_building_the_command_line_loads_no_submodule_of(
    startup_modules: list[str], package: str
) -> None:
    offenders = [m for m in startup_modules if m.startswith(package + ".")]
    assert offenders == [], f"start-up imports {offenders}: import them inside run() instead"


def test_import_corepin_alone_loads_neither_discovery_nor_allocation() -> None:
    loaded = _modules_after("import json, sys, corepin; print(json.dumps(sorted(sys.modules)))")
    assert "corepin.topology.discover" not in loaded
    assert not [m for m in loaded if m.startswith("corepin.allocation.")]
    assert "yaml" not in loaded


def test_python_dash_m_corepin_help_lists_the_subcommands() -> None:
    done = run_corepin("--help")
    assert done.returncode == 0, done.stderr
    assert "topology" in done.stdout and "Exit codes" in done.stdout


def test_importing_the_kube_package_alone_loads_no_network_code() -> None:
    loaded = _modules_after(
        "import json, sys, corepin.kube; print(json.dumps(sorted(sys.modules)))"
    )
    assert not [m for m in loaded if m.split(".")[0] in ("http", "ssl", "yaml")]
    assert not [m for m in loaded if m.startswith("corepin.kube.")]


#: The surfaces' libraries: only commands that serve or query an agent load them.
SURFACES = ("corepin.api", "grpc", "google.protobuf", "prometheus_client", "corepin.kube")

RUN_PROBE = """
import json, sys
from corepin.cli.main import main
code = main(sys.argv[1:])
print(json.dumps({"code": code, "modules": sorted(sys.modules)}))
"""


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "--cgroups", "off", "--", "true"],
        ["report", "--cgroups", "off", "-o", "json"],
    ],
    ids=["corepin run", "corepin report of this host"],
)
def test_host_commands_never_load_the_surfaces(tmp_path: object, argv: list[str]) -> None:
    import os

    state = os.path.join(str(tmp_path), "state")
    full = [argv[0], "--state-dir", state, *argv[1:]]
    done = subprocess.run(
        [sys.executable, "-c", RUN_PROBE, *full],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert answer["code"] == 0, done.stderr
    loaded = answer["modules"]
    offenders = [m for m in loaded for s in SURFACES if m == s or m.startswith(s + ".")]
    assert offenders == [], f"{argv[0]} loads {offenders}"


#: What `corepin run` never needs on its way to CMD: each costs start-up time on every run.
NOT_ON_THE_RUN_PATH = (
    "inspect",
    "dataclasses",
    "ast",
    "subprocess",
    "threading",
    "logging",
    "hashlib",
    "shutil",
    "tempfile",
    "pathlib",
    "ctypes",
    "datetime",
    "uuid",
    "socket",
    "random",
    "zlib",
    "lzma",
    "bz2",
    "corepin.cli.topology_cmd",
    "corepin.cli.allocate_cmd",
    "corepin.cli.simulate_cmd",
    "corepin.cli.shield_cmd",
    "corepin.cli.migrate_cmd",
    "corepin.cli.agent_cmd",
    "corepin.cli.webhook_cmd",
    "corepin.cli.controller_cmd",
    "corepin.cli.placement_cmd",
    "corepin.enforcement.shield.control",
    "corepin.agent.node",
    "corepin.state.waitline",
)


def test_corepin_run_loads_nothing_it_does_not_use(tmp_path: object) -> None:
    import os

    state = os.path.join(str(tmp_path), "state")
    argv = ["run", "--state-dir", state, "--cgroups", "off", "--exclusive", "1", "--", "true"]
    done = subprocess.run(
        [sys.executable, "-c", RUN_PROBE, *argv],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert answer["code"] == 0, done.stderr
    loaded = answer["modules"]
    offenders = [m for m in loaded for s in NOT_ON_THE_RUN_PATH if m == s or m.startswith(s + ".")]
    assert offenders == [], f"corepin run loads {offenders}"


def test_a_named_subcommand_gets_a_parser_of_its_own_alone() -> None:
    """`corepin run ...` builds the `run` parser and no other (each argparse parser costs its
    construction and message-catalogue lookups on every start); the full parser still lists
    every subcommand for `corepin --help`."""
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import json, sys\n"
            "from corepin.cli.main import build_parser\n"
            "def names(p):\n"
            "    sub = next(a for a in p._actions if a.dest == 'command')\n"
            "    return sorted(sub.choices)\n"
            "print(json.dumps([names(build_parser('run')), names(build_parser()), "
            "'corepin.cli.topology_cmd' in sys.modules]))",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    only, full, other_loaded = json.loads(done.stdout)
    assert only == ["run"]
    from corepin.cli.main import COMMANDS

    assert full == sorted(COMMANDS)
    assert other_loaded  # the full parser imports every subcommand's module (for --help)
