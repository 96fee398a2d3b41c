"""The command's start-up path stays lean: building `corepin --help` imports no heavy module.

(The one-way layer contracts themselves are checked by `lint-imports` in `make check`.)
Each check runs in a fresh interpreter so that modules imported by other tests do not count.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from helpers import run_corepin

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
