"""resctrl classes on trees laid out as the kernel documents them, written through a fake
kernel that refuses what resctrl refuses: the schemata text per vendor and mode, refusals,
tasks and monitoring."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corepin.allocation.qos import ClassPolicy
from corepin.enforcement.resctrl import (
    KernelFs,
    MonSample,
    ResctrlError,
    ResctrlWriter,
    parse_schemata,
    read_monitoring,
)
from support.budget import examples
from support.resctrl_tree import FakeResctrlKernel, make_resctrl_tree

TREES: dict[str, dict[str, object]] = {
    "intel": {},
    "intel-cdp": {"cdp": True},
    "intel-no-mba": {"mba": False},
    "intel-11-ways-sparse-ids": {"l3_ids": (0, 2), "cbm_mask": "7ff"},
    "intel-min-2-bits": {"min_cbm_bits": 2, "l3_ids": (0,)},
    "amd": {"vendor": "amd", "l3_ids": (0, 1, 2, 3), "cbm_mask": "ffff"},
    "amd-sparse-ids": {"vendor": "amd", "l3_ids": (0, 2), "cbm_mask": "ffff"},
}


@pytest.mark.parametrize(
    ("tree", "policy", "written"),
    [
        pytest.param("intel", ClassPolicy((0, 30), 30), ["L3:0=3f;1=3f", "MB:0=30;1=30"]),
        pytest.param("intel", ClassPolicy((0, 30), 42), ["L3:0=3f;1=3f", "MB:0=50;1=50"]),
        pytest.param("intel", ClassPolicy((0, 100), 100), [], id="intel-defaults-write-nothing"),
        pytest.param("intel", ClassPolicy((90, 100), None), ["L3:0=c0000;1=c0000"]),
        pytest.param(
            "intel-cdp",
            ClassPolicy((0, 30), 30),
            ["L3CODE:0=3f;1=3f", "L3DATA:0=3f;1=3f", "MB:0=30;1=30"],
        ),
        pytest.param("intel-no-mba", ClassPolicy((0, 30), 30), ["L3:0=3f;1=3f"]),
        pytest.param(
            "intel-11-ways-sparse-ids", ClassPolicy((0, 30), 5), ["L3:0=f;2=f", "MB:0=10;2=10"]
        ),
        pytest.param("intel-min-2-bits", ClassPolicy((0, 1), None), ["L3:0=3"]),
        pytest.param(
            "amd",
            ClassPolicy((0, 30), 50),
            ["L3:0=1f;1=1f;2=1f;3=1f", "MB:0=1024;1=1024;2=1024;3=1024"],
        ),
        pytest.param("amd", ClassPolicy(None, 100), [], id="amd-unlimited-is-the-default"),
        pytest.param(
            "amd-sparse-ids", ClassPolicy((30, 100), 25), ["L3:0=fff0;2=fff0", "MB:0=512;2=512"]
        ),
    ],
)
def test_schemata_text_per_vendor_and_mode(
    tmp_path: Path, tree: str, policy: ClassPolicy, written: list[str]
) -> None:
    kernel = make_resctrl_tree(tmp_path, **TREES[tree])  # type: ignore[arg-type]
    writer = ResctrlWriter(tmp_path, vendor=kernel.vendor, fs=kernel)
    writer.apply_policy("corepin-be", policy)
    assert kernel.written == [("corepin-be/schemata", line + "\n") for line in written]
    assert (tmp_path / "corepin-be").is_dir()
    shown = parse_schemata((tmp_path / "corepin-be" / "schemata").read_text())
    for line in written:
        resource, values = next(iter(parse_schemata(line).items()))
        base = 10 if resource == "MB" else 16
        assert {d: int(v, base) for d, v in shown[resource].items()} == {
            d: int(v, base) for d, v in values.items()
        }, "the kernel took what was written"
    kernel.written.clear()
    assert writer.apply_policy("corepin-be", policy) == [] and kernel.written == []


def test_the_cdp_tree_has_code_and_data_info(tmp_path: Path) -> None:
    make_resctrl_tree(tmp_path, cdp=True)
    assert not (tmp_path / "info" / "L3").exists()
    assert (tmp_path / "info" / "L3CODE" / "cbm_mask").read_text() == "fffff\n"
    assert (tmp_path / "schemata").read_text().splitlines() == [
        "L3CODE:0=fffff;1=fffff",
        "L3DATA:0=fffff;1=fffff",
        "    MB:0=100;1=100",
    ]
    info = ResctrlWriter(tmp_path).info
    assert info.cdp and info.l3_resources == ("L3CODE", "L3DATA") and info.l3_domains == (0, 1)


def test_amd_vendor_comes_from_cpuinfo(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "cpuinfo").write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\n")
    kernel = make_resctrl_tree(tmp_path / "resctrl", vendor="amd", cbm_mask="ffff")
    writer = ResctrlWriter(tmp_path / "resctrl", fs=kernel, proc_root=proc)
    assert writer.vendor == "amd" and writer.info.mb_unit == "absolute"
    writer.apply_policy("corepin-be", ClassPolicy(None, 10))
    assert kernel.written == [("corepin-be/schemata", "MB:0=205;1=205\n")]


@pytest.mark.parametrize(
    ("text", "status"),
    [
        ("L3:0=100000\n", "Mask out of range"),
        ("L3:0=0\n", "Mask out of range"),
        ("L3:0=f0f\n", "The mask f0f has non-consecutive 1-bits"),
        ("L3:0=xyz\n", "Non-hex character in the mask xyz"),
        ("L3:5=f\n", "Unknown domain 5 for resource L3"),
        ("L3CODE:0=f\n", "Unknown or unsupported resource name 'L3CODE'"),
        ("MB:0=5\n", "MB value 5 out of range [10,100]"),
        ("MB:0=120\n", "MB value 120 out of range [10,100]"),
        ("L3:0=f", "schemata write must end with a newline"),
    ],
)
def test_the_fake_kernel_refuses_what_resctrl_refuses(
    tmp_path: Path, text: str, status: str
) -> None:
    kernel = make_resctrl_tree(tmp_path)
    kernel.mkdir(tmp_path / "g")
    before = (tmp_path / "g" / "schemata").read_text()
    with pytest.raises(OSError) as info:
        kernel.write(tmp_path / "g" / "schemata", text)
    assert info.value.errno == errno.EINVAL
    assert (tmp_path / "info" / "last_cmd_status").read_text() == status + "\n"
    assert (tmp_path / "g" / "schemata").read_text() == before and kernel.written == []


def test_the_fake_kernel_takes_sparse_masks_when_it_says_so(tmp_path: Path) -> None:
    kernel = make_resctrl_tree(tmp_path, sparse_masks=True, min_cbm_bits=2)
    kernel.write(tmp_path / "schemata", "L3:1=f0f\n")
    assert "1=00f0f" in (tmp_path / "schemata").read_text()
    with pytest.raises(OSError):
        kernel.write(tmp_path / "schemata", "L3:1=1\n")
    assert (
        tmp_path / "info" / "last_cmd_status"
    ).read_text() == "Need at least 2 bits in the mask\n"


def _stricter(kernel: FakeResctrlKernel, writer: ResctrlWriter) -> None:
    writer.info  # read before the kernel changes its mind  # noqa: B018
    kernel.min_cbm_bits = 4
    kernel.min_bandwidth = 40


def test_a_refused_write_names_the_group_the_line_and_the_kernels_status(tmp_path: Path) -> None:
    kernel = make_resctrl_tree(tmp_path)
    writer = ResctrlWriter(tmp_path, fs=kernel)
    _stricter(kernel, writer)
    with pytest.raises(ResctrlError) as info:
        writer.apply_policy("corepin-be", ClassPolicy((0, 10), None))
    message = str(info.value)
    assert f"{tmp_path}/corepin-be/schemata" in message
    assert "'L3:0=3;1=3'" in message and "(kernel: Need at least 4 bits in the mask)" in message
    assert info.value.exit_code == 4
    with pytest.raises(ResctrlError, match=r"'MB:0=30;1=30'.*MB value 30 out of range \[40,100\]"):
        writer.apply_policy("corepin-be", ClassPolicy(None, 30))


def test_running_out_of_closids(tmp_path: Path) -> None:
    kernel = make_resctrl_tree(tmp_path, num_closids=2)
    writer = ResctrlWriter(tmp_path, fs=kernel)
    writer.apply_policy("corepin-be", ClassPolicy((0, 30), None))
    with pytest.raises(ResctrlError) as info:
        writer.apply_policy("corepin-ls", ClassPolicy((0, 100), None))
    assert info.value.reason == "resctrl_no_closid" and "all 2 CLOSIDs" in str(info.value)
    assert (tmp_path / "info" / "last_cmd_status").read_text() == "Out of CLOSIDs\n"
    assert isinstance(info.value.__cause__, OSError)
    assert info.value.__cause__.errno == errno.ENOSPC


def test_a_new_group_gets_its_own_files(tmp_path: Path) -> None:
    kernel = make_resctrl_tree(tmp_path, vendor="amd", l3_ids=(0, 2), cbm_mask="ffff")
    ResctrlWriter(tmp_path, fs=kernel).apply_policy("corepin-be", ClassPolicy((0, 30), None))
    group = tmp_path / "corepin-be"
    assert sorted(p.name for p in group.iterdir()) == [
        "cpus",
        "cpus_list",
        "mode",
        "mon_data",
        "mon_groups",
        "schemata",
        "tasks",
    ]
    assert sorted(p.name for p in (group / "mon_data").iterdir()) == ["mon_L3_00", "mon_L3_02"]
    assert (group / "schemata").read_text() == "L3:0=001f;2=001f\nMB:0=2048;2=2048\n"


def test_tasks_move_between_groups_and_back_to_the_root(tmp_path: Path) -> None:
    kernel = make_resctrl_tree(tmp_path)
    writer = ResctrlWriter(tmp_path, fs=kernel)
    writer.apply_policy("corepin-be", ClassPolicy((0, 30), None))
    writer.apply_policy("corepin-ls", ClassPolicy((0, 100), None))
    kernel.gone.add(303)
    changes = writer.assign_tasks("corepin-be", [101, 102, 303])
    assert [c.new for c in changes] == ["101", "102"], "a task that is gone is skipped"
    writer.assign_tasks("corepin-ls", [102])
    assert writer.tasks("corepin-be") == [101] and writer.tasks("corepin-ls") == [102]
    writer.remove_class("corepin-be")
    assert writer.classes() == ["corepin-ls"]
    assert (tmp_path / "tasks").read_text().split() == ["101"]


def test_monitoring_per_cache_id_with_unavailable_and_error(tmp_path: Path) -> None:
    kernel = make_resctrl_tree(tmp_path, l3_ids=(0, 2))
    writer = ResctrlWriter(tmp_path, fs=kernel)
    writer.apply_policy("corepin-be", ClassPolicy((0, 30), None))
    kernel.set_counter("corepin-be", 0, "llc_occupancy", 4718592)
    kernel.set_counter("corepin-be", 0, "mbm_total_bytes", 123456789)
    kernel.set_counter("corepin-be", 0, "mbm_local_bytes", 100000000)
    kernel.set_counter("corepin-be", 2, "llc_occupancy", "Unavailable")
    kernel.set_counter("corepin-be", 2, "mbm_total_bytes", "Error")
    (tmp_path / "corepin-be" / "mon_data" / "mon_L3_02" / "mbm_local_bytes").unlink()
    assert read_monitoring(tmp_path, "corepin-be") == {
        0: MonSample(0, 4718592, 123456789, 100000000),
        2: MonSample(2, None, None, None),
    }
    assert read_monitoring(tmp_path)[2] == MonSample(2, 0, 0, 0), "the root group's own counters"


def test_monitoring_groups_have_their_own_counters(tmp_path: Path) -> None:
    kernel = make_resctrl_tree(tmp_path)
    writer = ResctrlWriter(tmp_path, fs=kernel)
    writer.apply_policy("corepin-be", ClassPolicy((0, 30), None))
    kernel.mkdir(tmp_path / "corepin-be" / "mon_groups" / "pod-a")
    kernel.set_counter("corepin-be", 1, "llc_occupancy", 65536, mon_group="pod-a")
    got = read_monitoring(tmp_path, "corepin-be", "pod-a")
    assert got[1].llc_occupancy == 65536 and got[0].llc_occupancy == 0
    assert read_monitoring(tmp_path, "corepin-be")[1].llc_occupancy == 0


def test_no_monitoring_is_a_clear_error(tmp_path: Path) -> None:
    make_resctrl_tree(tmp_path, mon=False)
    with pytest.raises(ResctrlError) as info:
        read_monitoring(tmp_path)
    assert info.value.reason == "resctrl_no_monitoring"
    with pytest.raises(ResctrlError, match="no monitoring data"):
        read_monitoring(tmp_path, "missing")


@settings(max_examples=examples(100))
@given(
    st.lists(st.integers(0, 63), min_size=1, max_size=6, unique=True),
    st.integers(1, 0xFFFFF),
    st.integers(1, 2048),
    st.booleans(),
)
def test_schemata_as_the_kernel_shows_it_parses_back(
    ids: list[int], mask: int, bandwidth: int, cdp: bool
) -> None:
    kernel = FakeResctrlKernel(
        root=Path("/nonexistent"),
        vendor="amd",
        l3_ids=tuple(ids),
        mb_ids=tuple(ids),
        cbm_mask=0xFFFFF,
        min_cbm_bits=1,
        sparse_masks=True,
        cdp=cdp,
        mba=True,
        bandwidth_gran=1,
        min_bandwidth=0,
        num_closids=16,
        mon=False,
    )
    values = {name: dict.fromkeys(ids, mask) for name in kernel.l3_names}
    values["MB"] = dict.fromkeys(ids, bandwidth)
    parsed = parse_schemata(kernel.render(values))
    assert {
        name: {d: int(v, 10 if name == "MB" else 16) for d, v in domains.items()}
        for name, domains in parsed.items()
    } == values


def test_the_production_filesystem_writes_plain_files(tmp_path: Path) -> None:
    fs = KernelFs()
    fs.mkdir(tmp_path / "g")
    fs.write(tmp_path / "g" / "tasks", "42\n")
    fs.write(tmp_path / "g" / "tasks", "43\n")
    assert (tmp_path / "g" / "tasks").read_text() == "43\n", "one write(2) per call"
    (tmp_path / "g" / "tasks").unlink()
    fs.rmdir(tmp_path / "g")
    assert not (tmp_path / "g").exists()
