"""The percent interface of node QoS: L3 ranges -> cache bit masks, MBA percent -> MB values,
policy parsing with errors naming the field, the CPU vendor from /proc/cpuinfo."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from corepin.allocation.qos import ClassPolicy
from corepin.enforcement.resctrl import (
    ResctrlInfo,
    ResctrlValueError,
    cbm_for_percent,
    check_cbm,
    class_schemata,
    mba_for_percent,
    read_cpu_vendor,
)
from support.budget import examples


@pytest.mark.parametrize(
    ("start", "end", "cbm_mask", "min_bits", "want"),
    [
        pytest.param(0, 30, 0xFFFFF, 1, 0x3F, id="0-30 of 20 ways is ways 0-5"),
        pytest.param(0, 100, 0xFFFFF, 1, 0xFFFFF, id="0-100 is the whole mask"),
        pytest.param(90, 100, 0xFFFFF, 1, 0xC0000, id="90-100 of 20 ways is ways 18-19"),
        pytest.param(30, 100, 0xFFFFF, 1, 0xFFFC0, id="30-100 of 20 ways is ways 6-19"),
        pytest.param(0, 1, 0xFFFFF, 1, 0x1, id="a tiny range still gets one way"),
        pytest.param(50, 51, 0xFFFFF, 1, 0x400, id="50-51 covers way 10"),
        pytest.param(50, 51, 0xFFFFF, 2, 0xC00, id="min_cbm_bits grows a run upward"),
        pytest.param(99, 100, 0xFFFFF, 4, 0xF0000, id="at the top it grows downward"),
        pytest.param(0, 30, 0x7FF, 1, 0xF, id="0-30 of 11 ways rounds out to 4 ways"),
        pytest.param(30, 60, 0x7FF, 1, 0x78, id="30-60 of 11 ways is ways 3-6"),
        pytest.param(0, 100, 0x7FF, 1, 0x7FF, id="0-100 of 11 ways"),
        pytest.param(0, 50, 0xFF0, 1, 0xF0, id="ways count from cbm_mask's lowest bit"),
        pytest.param(50, 100, 0xFF0, 1, 0xF00, id="upper half of an offset mask"),
        pytest.param(0, 1, 0xFF0, 8, 0xFF0, id="min_cbm_bits as wide as the mask"),
    ],
)
def test_percent_ranges_become_these_masks(
    start: int, end: int, cbm_mask: int, min_bits: int, want: int
) -> None:
    got = cbm_for_percent(start, end, cbm_mask, min_bits)
    assert got == want, f"{got:x} != {want:x}"


@pytest.mark.parametrize(("start", "end"), [(30, 30), (40, 20), (-1, 10), (0, 101)])
def test_bad_ranges_are_refused(start: int, end: int) -> None:
    with pytest.raises(ResctrlValueError, match=r"within 0\.\.100"):
        cbm_for_percent(start, end, 0xFFFFF)


def test_a_mask_narrower_than_min_cbm_bits_is_refused() -> None:
    with pytest.raises(ResctrlValueError, match="fewer than min_cbm_bits 4"):
        cbm_for_percent(0, 100, 0x7, 4)


geometry = st.tuples(st.integers(1, 32), st.integers(0, 8)).flatmap(
    lambda wo: st.tuples(st.just(wo[0]), st.just(wo[1]), st.integers(1, wo[0]))
)
ranges = st.tuples(st.integers(0, 100), st.integers(0, 100)).filter(lambda r: r[0] < r[1])


@settings(max_examples=examples(300))
@given(geometry, ranges, ranges)
def test_masks_are_valid_and_a_wider_range_never_has_fewer_ways(
    geo: tuple[int, int, int], inner: tuple[int, int], other: tuple[int, int]
) -> None:
    width, offset, min_bits = geo
    cbm_mask = ((1 << width) - 1) << offset
    mask = cbm_for_percent(*inner, cbm_mask, min_bits)
    bits = f"{mask:b}".strip("0")
    assert set(bits) == {"1"}, f"{mask:b} is one run"
    assert mask & ~cbm_mask == 0 and mask.bit_count() >= min_bits
    info = ResctrlInfo(l3_domains=(0,), cbm_mask=cbm_mask, min_cbm_bits=min_bits)
    assert check_cbm(mask, info) == mask, "the kernel's own checks take it"
    wider = (min(inner[0], other[0]), max(inner[1], other[1]))
    assume(wider != inner)
    assert cbm_for_percent(*wider, cbm_mask, min_bits).bit_count() >= mask.bit_count()


INTEL = ResctrlInfo(mb_domains=(0,), mb_unit="percent", bandwidth_gran=10, min_bandwidth=10)
AMD = ResctrlInfo(mb_domains=(0,), mb_unit="absolute", max_bandwidth=2048)


@pytest.mark.parametrize(
    ("info", "percent", "want"),
    [
        pytest.param(INTEL, 42, 50, id="intel rounds up to bandwidth_gran"),
        pytest.param(INTEL, 50, 50, id="intel keeps a multiple of the step"),
        pytest.param(INTEL, 1, 10, id="intel never goes below min_bandwidth"),
        pytest.param(INTEL, 100, 100, id="intel 100 percent"),
        pytest.param(AMD, 100, 2048, id="amd 100 percent is unlimited"),
        pytest.param(AMD, 50, 1024, id="amd half"),
        pytest.param(AMD, 1, 21, id="amd rounds up"),
    ],
)
def test_bandwidth_percent_in_the_vendors_unit(info: ResctrlInfo, percent: int, want: int) -> None:
    assert mba_for_percent(percent, info) == want


def test_intel_granularity_that_does_not_divide_100_is_clamped() -> None:
    info = ResctrlInfo(mb_domains=(0,), mb_unit="percent", bandwidth_gran=30, min_bandwidth=10)
    assert mba_for_percent(95, info) == 100


def test_class_schemata_leaves_out_what_the_machine_lacks() -> None:
    no_mba = ResctrlInfo(l3_domains=(0,), cbm_mask=0xFFFFF)
    assert class_schemata(ClassPolicy((0, 30), 50), no_mba) == (0x3F, None)
    with pytest.raises(ResctrlValueError, match="no L3 cache allocation"):
        class_schemata(ClassPolicy((0, 30), None), ResctrlInfo())


@pytest.mark.parametrize(
    ("vendor_id", "want"),
    [
        ("GenuineIntel", "intel"),
        ("AuthenticAMD", "amd"),
        ("HygonGenuine", "amd"),
        ("CentaurHauls", None),
    ],
)
def test_vendor_from_cpuinfo(tmp_path: Path, vendor_id: str, want: str | None) -> None:
    (tmp_path / "cpuinfo").write_text(
        f"processor\t: 0\nvendor_id\t: {vendor_id}\ncpu family\t: 25\n\nprocessor\t: 1\n"
    )
    assert read_cpu_vendor(tmp_path) == want


def test_no_cpuinfo_is_no_vendor(tmp_path: Path) -> None:
    assert read_cpu_vendor(tmp_path) is None
