"""The shape of the package, checked: no import cycle, no module or class too big to read.

The limits are the ones the code is kept to: a module of about 600 lines and a class of about
400 read in one sitting. `allocation/kubelet_static.py` is the exception: it mirrors the
kubelet's own files, function for function, so that the two can be compared side by side.
"""

from __future__ import annotations

import ast
from pathlib import Path

import grimp
import pytest

from support import paths

SRC = paths.SRC / "corepin"
GENERATED = SRC / "api" / "grpc" / "gen"
MODULE_LINES = 600
CLASS_LINES = 400
EXEMPT_MODULES = {"allocation/kubelet_static.py"}


def _modules() -> list[Path]:
    return sorted(p for p in SRC.rglob("*.py") if GENERATED not in p.parents)


def test_the_package_has_no_import_cycle() -> None:
    graph = grimp.build_graph("corepin", cache_dir=None)
    cycles = []
    for module in sorted(graph.modules):
        for imported in graph.find_modules_directly_imported_by(module):
            chain = graph.find_shortest_chain(importer=imported, imported=module)
            if chain is not None:
                cycles.append(" -> ".join((module, *chain)))
    assert cycles == []


def test_no_module_is_longer_than_a_sitting() -> None:
    long = {
        str(p.relative_to(SRC)): n
        for p in _modules()
        if (n := len(p.read_text().splitlines())) > MODULE_LINES
        and str(p.relative_to(SRC)) not in EXEMPT_MODULES
    }
    assert long == {}


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(SRC)))
def test_no_class_is_longer_than_a_sitting(path: Path) -> None:
    tree = ast.parse(path.read_text())
    long = {
        node.name: (node.end_lineno or node.lineno) - node.lineno + 1
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
        and (node.end_lineno or node.lineno) - node.lineno + 1 > CLASS_LINES
    }
    assert long == {}
