"""The top-level Python API (`corepin.__all__`), pinned."""

from __future__ import annotations

import inspect
import pydoc
import re

import pytest

import corepin
from corepin.core import errors

PUBLIC = {
    "CPUSet",
    "Topology",
    "discover",
    "allocate",
    "AllocationError",
    "CPUSetParseError",
    "CorepinError",
    "EnvironmentProblem",
    "InputError",
    "RequestError",
    "SysfsError",
    "TopologyError",
}


def test_all_lists_exactly_the_contracted_names() -> None:
    assert set(corepin.__all__) == PUBLIC
    assert len(corepin.__all__) == len(PUBLIC)


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_every_public_name_resolves(name: str) -> None:
    assert getattr(corepin, name) is not None


def test_unknown_attributes_raise_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no_such_thing"):
        _ = corepin.no_such_thing  # type: ignore[attr-defined]


def test_error_classes_are_the_ones_of_the_one_hierarchy() -> None:
    for name in (
        "AllocationError",
        "EnvironmentProblem",
        "InputError",
        "SysfsError",
        "TopologyError",
    ):
        cls = getattr(corepin, name)
        assert cls is getattr(errors, name)
        assert issubclass(cls, corepin.CorepinError)
    assert issubclass(corepin.TopologyError, ValueError)
    assert corepin.InputError("x").exit_code == 2
    assert corepin.AllocationError("x").exit_code == 3
    assert corepin.EnvironmentProblem("x").exit_code == 4


def test_cpuset_parse_and_str_follow_the_linux_list_form() -> None:
    s = corepin.CPUSet.parse("0-3,8")
    assert str(s) == "0-3,8" and str(corepin.CPUSet()) == ""


def test_discover_takes_a_sysfs_root_defaulting_to_slash() -> None:
    params = inspect.signature(corepin.discover).parameters
    assert next(iter(params)) == "sysfs_root"
    assert params["sysfs_root"].default == "/"


def test_allocate_has_the_contracted_signature() -> None:
    params = inspect.signature(corepin.allocate).parameters
    assert list(params)[:2] == ["topology", "count"]
    for name, default in (("available", None), ("policy", "topology-aware"), ("options", ())):
        assert params[name].kind is inspect.Parameter.KEYWORD_ONLY
        assert params[name].default == default


def test_topology_json_methods_exist() -> None:
    assert callable(corepin.Topology.from_json) and callable(corepin.Topology.to_json)


def test_help_of_the_package_names_only_exported_names() -> None:
    """`help(corepin)` (the docstring and those of the exported functions) speaks of no error
    a user could not import from `corepin`."""
    text = pydoc.render_doc(corepin, renderer=pydoc.plaintext)
    mentioned = set(re.findall(r"\b([A-Z][A-Za-z]*(?:Error|Problem))\b", text))
    assert "RequestError" in mentioned
    assert mentioned - {"ValueError"} <= set(corepin.__all__)
