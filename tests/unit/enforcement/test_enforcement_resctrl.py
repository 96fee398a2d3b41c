"""resctrl writer on fake resctrl trees: Intel percent MBA, AMD absolute MBA, sparse cache ids."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corepin.core.ids import IdError
from corepin.enforcement.resctrl import (
    ResctrlError,
    ResctrlInfo,
    ResctrlValueError,
    ResctrlWriter,
    check_cbm,
    parse_schemata,
)
from support.budget import examples
from support.resctrl_tree import make_resctrl_tree


@pytest.fixture
def intel(tmp_path: Path) -> ResctrlWriter:
    return ResctrlWriter(tmp_path, fs=make_resctrl_tree(tmp_path))


@pytest.fixture
def amd(tmp_path: Path) -> ResctrlWriter:
    kernel = make_resctrl_tree(tmp_path, vendor="amd", l3_ids=range(4), cbm_mask="ffff")
    return ResctrlWriter(tmp_path, fs=kernel)


def test_intel_machine_facts_are_read_from_info(intel: ResctrlWriter) -> None:
    info = intel.info
    assert info.l3_domains == (0, 1) and info.mb_domains == (0, 1)
    assert info.cbm_mask == 0xFFFFF and info.num_closids == 16
    assert info.mb_unit == "percent" and info.bandwidth_gran == 10 and info.min_bandwidth == 10


def test_a_class_gets_its_l3_and_mb_lines_and_a_second_pass_writes_nothing(
    intel: ResctrlWriter,
) -> None:
    changes = intel.ensure_class("latency", l3=0xFF, mb=50)
    assert [c.what for c in changes] == ["mkdir", "schemata", "schemata"]
    assert parse_schemata((intel.root / "latency" / "schemata").read_text()) == {
        "L3": {0: "000ff", 1: "000ff"},
        "MB": {0: "50", 1: "50"},
    }, "as the kernel shows them: masks zero-padded to the width of cbm_mask"
    writes = intel.writes
    assert intel.ensure_class("latency", l3=0xFF, mb=50) == []
    assert intel.writes == writes


def test_only_the_differing_domains_are_written(intel: ResctrlWriter) -> None:
    intel.ensure_class("c", l3={0: 0xF0, 1: 0xF0})
    changes = intel.ensure_class("c", l3={0: 0xF0, 1: 0x0F})
    assert [(c.old, c.new) for c in changes] == [("L3:1=f0", "L3:1=f")]


def test_intel_percent_is_rounded_up_to_the_granularity_and_bounded(
    intel: ResctrlWriter,
) -> None:
    assert intel.mb_values(42) == {0: "50", 1: "50"}
    assert intel.mb_values({0: 10, 1: 100}) == {0: "10", 1: "100"}
    with pytest.raises(ResctrlValueError, match=r"outside 10\.\.100"):
        intel.mb_values(5)
    with pytest.raises(ResctrlValueError, match=r"outside 10\.\.100"):
        intel.mb_values(150)
    intel.ensure_class("c", mb=42)
    assert intel.ensure_class("c", mb=42) == [], "the rounded value is what the kernel shows"


def test_amd_bandwidth_is_absolute_up_to_the_default(amd: ResctrlWriter) -> None:
    assert amd.info.mb_unit == "absolute" and amd.info.max_bandwidth == 2048
    assert amd.mb_values(1024) == dict.fromkeys(range(4), "1024")
    assert amd.mb_values(7) == dict.fromkeys(range(4), "7"), "no percent rounding on AMD"
    with pytest.raises(ResctrlValueError, match=r"1\.\.2048"):
        amd.mb_values(4096)


def test_vendor_parameter_decides_the_unit(tmp_path: Path) -> None:
    kernel = make_resctrl_tree(
        tmp_path, l3_ids=(0,), cbm_mask="ffff", bandwidth_gran=1, min_bandwidth=0
    )
    assert ResctrlWriter(tmp_path, fs=kernel).info.mb_unit == "percent"
    amd = ResctrlWriter(tmp_path, vendor="AMD", fs=kernel)
    assert amd.info.mb_unit == "absolute"
    with pytest.raises(IdError):
        ResctrlWriter(tmp_path, vendor="via")


def test_intel_mba_mbps_mount_is_absolute(tmp_path: Path) -> None:
    kernel = make_resctrl_tree(tmp_path, l3_ids=(0,), cbm_mask="7ff", mba_mbps=True)
    writer = ResctrlWriter(tmp_path, fs=kernel)
    assert writer.info.mb_unit == "absolute"
    assert writer.mb_values(20000) == {0: "20000"}


def test_sparse_cache_ids_are_used_as_they_are(tmp_path: Path) -> None:
    kernel = make_resctrl_tree(tmp_path, l3_ids=(0, 2, 4), cbm_mask="fff")
    writer = ResctrlWriter(tmp_path, fs=kernel)
    assert writer.info.l3_domains == (0, 2, 4)
    writer.ensure_class("db", l3={0: 0x3, 2: 0xC, 4: 0x30}, mb=30)
    assert [text for _, text in kernel.written] == ["L3:0=3;2=c;4=30\n", "MB:0=30;2=30;4=30\n"]
    assert (tmp_path / "db" / "schemata").read_text().splitlines() == [
        "L3:0=003;2=00c;4=030",
        "MB:0= 30;2= 30;4= 30",
    ], "the kernel shows masks zero-padded and MB values padded to three places"
    with pytest.raises(
        ResctrlValueError, match=r"\[1\] do not exist here; the domains are 0, 2, 4"
    ):
        writer.ensure_class("db", l3={1: 0x3})


@pytest.mark.parametrize(
    ("mask", "needle"),
    [
        pytest.param(0, "at least one bit", id="an empty mask is refused"),
        pytest.param(0x100000, "outside info/L3/cbm_mask", id="a bit beyond cbm_mask is refused"),
        pytest.param(0x5, "not contiguous", id="a mask with a hole is refused"),
        pytest.param(0x1, "at least 2", id="fewer bits than min_cbm_bits are refused"),
    ],
)
def test_invalid_masks(mask: int, needle: str) -> None:
    info = ResctrlInfo(l3_domains=(0,), cbm_mask=0xFFFFF, min_cbm_bits=2)
    with pytest.raises(ResctrlValueError, match=needle):
        check_cbm(mask, info, domain=0)


def test_sparse_masks_allow_holes_when_the_machine_says_so() -> None:
    info = ResctrlInfo(l3_domains=(0,), cbm_mask=0xFFFF, sparse_masks=True)
    assert check_cbm(0x0F0F, info) == 0x0F0F


@settings(max_examples=examples(200))
@given(st.integers(1, 0xFFFFF))
def test_accepted_masks_are_one_run_of_bits_within_cbm_mask(mask: int) -> None:
    info = ResctrlInfo(l3_domains=(0,), cbm_mask=0xFFFFF, min_cbm_bits=1)
    try:
        check_cbm(mask, info)
    except ResctrlValueError:
        return
    bits = f"{mask:b}".strip("0")
    assert set(bits) == {"1"}, f"{mask:b} is one run"


def test_tasks_are_assigned_once(intel: ResctrlWriter) -> None:
    intel.ensure_class("latency", l3=0xF)
    changes = intel.assign_tasks("latency", [101, 102])
    assert [c.new for c in changes] == ["101", "102"]
    assert intel.tasks("latency") == [101, 102]
    assert intel.assign_tasks("latency", [101, 102]) == []
    with pytest.raises(IdError):
        intel.assign_tasks("latency", [0])


def test_class_names_are_validated_and_reserved_names_refused(intel: ResctrlWriter) -> None:
    for bad in ("../x", "info", "mon_groups", "a/b", ""):
        with pytest.raises(IdError):
            intel.ensure_class(bad, l3=0xF)
    assert not (intel.root.parent / "x").exists()


def test_dry_run_creates_nothing(intel: ResctrlWriter) -> None:
    changes = intel.ensure_class("later", l3=0xF, mb=20, dry_run=True)
    assert [c.what for c in changes] == ["mkdir", "schemata", "schemata"]
    assert not (intel.root / "later").exists() and intel.writes == 0


def test_classes_list_and_removal(intel: ResctrlWriter) -> None:
    intel.ensure_class("a", l3=0xF)
    intel.ensure_class("b", l3=0xF0)
    assert intel.classes() == ["a", "b"]
    intel.remove_class("a")
    assert intel.classes() == ["b"]
    intel.remove_class("a")  # already gone: fine


def test_no_resctrl_mount_is_an_environment_problem(tmp_path: Path) -> None:
    with pytest.raises(ResctrlError) as info:
        ResctrlWriter(tmp_path / "missing").ensure_class("x", l3=1)
    assert info.value.reason == "resctrl_unavailable" and info.value.exit_code == 4


def test_machine_without_mba_rejects_bandwidth(tmp_path: Path) -> None:
    kernel = make_resctrl_tree(tmp_path, l3_ids=(0,), cbm_mask="ff", mba=False)
    writer = ResctrlWriter(tmp_path, fs=kernel)
    with pytest.raises(ResctrlValueError, match="no memory bandwidth"):
        writer.ensure_class("x", mb=50)
    assert writer.ensure_class("x", l3=0xF)


def test_running_out_of_closids_names_the_limit(tmp_path: Path) -> None:
    kernel = make_resctrl_tree(tmp_path, l3_ids=(0,), cbm_mask="ff", mba=False, num_closids=3)
    writer = ResctrlWriter(tmp_path, fs=kernel)
    writer.ensure_class("one", l3=0x3)
    writer.ensure_class("two", l3=0xC)
    with pytest.raises(ResctrlError) as info:
        writer.ensure_class("three", l3=0x30)
    assert info.value.reason == "resctrl_no_closid"
    assert "all 3 CLOSIDs" in str(info.value)
    assert not (tmp_path / "three").exists()
