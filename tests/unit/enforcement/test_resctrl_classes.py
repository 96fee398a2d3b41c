"""The QoS classes' resctrl groups, against trees laid out as the kernel documents them and
written through a fake kernel that refuses what resctrl refuses: the schemata text per vendor
and mode, groups made and removed, tasks assigned and moved, monitoring per class, refusals,
and no resctrl at all. Thread listing on real processes and a real cgroup (v1 cpu)."""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corepin.allocation.qos import CLASSES, ClassPolicy, default_class_policies
from corepin.core.errors import InputError
from corepin.enforcement.note import Note
from corepin.enforcement.resctrl import (
    ClassView,
    MonSample,
    ResctrlClasses,
    ResctrlError,
    ResctrlSamples,
    ResctrlWriter,
    cgroup_threads,
    group_name,
    is_default,
    open_resctrl,
    parse_schemata,
    threads_of,
)
from corepin.enforcement.resctrl.model import is_contiguous
from support.budget import examples
from support.resctrl_tree import FakeResctrlKernel, make_resctrl_tree

TREES: dict[str, dict[str, object]] = {
    "intel": {},
    "intel-cdp": {"cdp": True},
    "intel-no-mba": {"mba": False},
    "intel-sparse-ids": {"l3_ids": (0, 2), "cbm_mask": "7ff"},
    "amd": {"vendor": "amd", "l3_ids": (0, 1, 2, 3), "cbm_mask": "ffff"},
    "amd-sparse-ids": {"vendor": "amd", "l3_ids": (0, 2), "cbm_mask": "ffff"},
}

FULL = ClassPolicy((0, 100), 100)
#: BE squeezed in both, LS in cache only (MBA left out: the whole bandwidth), SYSTEM in
#: bandwidth only; LSE and LSR the whole machine
MIXED = {
    "LSE": FULL,
    "LSR": ClassPolicy(None, None),
    "LS": ClassPolicy((50, 100), None),
    "BE": ClassPolicy((0, 30), 42),
    "SYSTEM": ClassPolicy((0, 100), 20),
}


def _classes(tmp_path: Path, tree: str, **extra: object) -> tuple[ResctrlClasses, Path]:
    root = tmp_path / "resctrl"
    kernel = make_resctrl_tree(root, **{**TREES[tree], **extra})  # type: ignore[arg-type]
    classes = ResctrlClasses(ResctrlWriter(root, vendor=kernel.vendor, fs=kernel))
    return classes, root


def _kernel(classes: ResctrlClasses) -> FakeResctrlKernel:
    fs = classes.writer.fs
    assert isinstance(fs, FakeResctrlKernel)
    return fs


def _shown(root: Path) -> dict[str, str]:
    """group -> schemata text, as the kernel shows it, for every group but the root."""
    return {
        p.name: (p / "schemata").read_text()
        for p in sorted(root.iterdir())
        if p.is_dir() and p.name not in ("info", "mon_groups", "mon_data")
    }


# ---------------------------------------------------------------------- schemata per vendor
@pytest.mark.parametrize(
    ("tree", "groups"),
    [
        pytest.param(
            "intel",
            {
                "corepin-ls": "L3:0=ffc00;1=ffc00\nMB:0=100;1=100\n",
                "corepin-be": "L3:0=0003f;1=0003f\nMB:0= 50;1= 50\n",
                "corepin-system": "L3:0=fffff;1=fffff\nMB:0= 20;1= 20\n",
            },
            id="intel-mba-percent-rounded-to-bandwidth-gran",
        ),
        pytest.param(
            "intel-cdp",
            {
                "corepin-ls": "L3CODE:0=ffc00;1=ffc00\nL3DATA:0=ffc00;1=ffc00\n"
                "    MB:0=100;1=100\n",
                "corepin-be": "L3CODE:0=0003f;1=0003f\nL3DATA:0=0003f;1=0003f\n"
                "    MB:0= 50;1= 50\n",
                "corepin-system": "L3CODE:0=fffff;1=fffff\nL3DATA:0=fffff;1=fffff\n"
                "    MB:0= 20;1= 20\n",
            },
        ),
        pytest.param(
            "intel-no-mba",
            {"corepin-ls": "L3:0=ffc00;1=ffc00\n", "corepin-be": "L3:0=0003f;1=0003f\n"},
            id="intel-no-mba-system-has-nothing-left-to-restrict",
        ),
        pytest.param(
            "intel-sparse-ids",
            {
                "corepin-ls": "L3:0=7e0;2=7e0\nMB:0=100;2=100\n",
                "corepin-be": "L3:0=00f;2=00f\nMB:0= 50;2= 50\n",
                "corepin-system": "L3:0=7ff;2=7ff\nMB:0= 20;2= 20\n",
            },
        ),
        pytest.param(
            "amd",
            {
                "corepin-ls": "L3:0=ff00;1=ff00;2=ff00;3=ff00\nMB:0=2048;1=2048;2=2048;3=2048\n",
                "corepin-be": "L3:0=001f;1=001f;2=001f;3=001f\nMB:0=861;1=861;2=861;3=861\n",
                "corepin-system": "L3:0=ffff;1=ffff;2=ffff;3=ffff\nMB:0=410;1=410;2=410;3=410\n",
            },
            id="amd-mba-absolute-of-2048",
        ),
        pytest.param(
            "amd-sparse-ids",
            {
                "corepin-ls": "L3:0=ff00;2=ff00\nMB:0=2048;2=2048\n",
                "corepin-be": "L3:0=001f;2=001f\nMB:0=861;2=861\n",
                "corepin-system": "L3:0=ffff;2=ffff\nMB:0=410;2=410\n",
            },
        ),
    ],
)
def test_schemata_per_vendor_and_mode(tmp_path: Path, tree: str, groups: dict[str, str]) -> None:
    classes, root = _classes(tmp_path, tree)
    kernel = _kernel(classes)
    notes = classes.apply(MIXED)
    assert _shown(root) == dict(sorted(groups.items()))
    assert kernel.made == [g for g in ("corepin-ls", "corepin-be", "corepin-system") if g in groups]
    assert [n.target for n in notes if n.action == "created"] == [f"resctrl/{g}" for g in groups]
    for qos_class in CLASSES:
        expect = group_name(qos_class) if group_name(qos_class) in groups else None
        assert classes.group_of(qos_class) == expect
    writes = classes.writes
    kernel.written.clear()
    kernel.made.clear()
    assert [n for n in classes.apply(MIXED) if n.action != "left"] == []
    assert kernel.written == [] and kernel.made == [] and kernel.removed == []
    assert classes.writes == writes, "the same policies again write nothing"


def test_the_default_policy_makes_one_group_for_be(tmp_path: Path) -> None:
    classes, root = _classes(tmp_path, "intel")
    notes = classes.apply(default_class_policies())
    assert _shown(root) == {"corepin-be": "L3:0=0003f;1=0003f\nMB:0=100;1=100\n"}
    assert notes == [
        Note("created", "resctrl/corepin-be", "group of class BE"),
        Note("resized", "resctrl/corepin-be", "L3:0=3f;1=3f (was L3:0=fffff;1=fffff)"),
    ]
    assert _kernel(classes).written == [("corepin-be/schemata", "L3:0=3f;1=3f\n")]


def test_a_missing_resource_is_left_out_with_a_note(tmp_path: Path) -> None:
    classes, _ = _classes(tmp_path, "intel-no-mba")
    notes = classes.apply({"SYSTEM": ClassPolicy((0, 100), 20)})
    assert notes == [
        Note("left", "resctrl/corepin-system", "SYSTEM mbaPercent: no memory bandwidth allocation")
    ]
    assert classes.group_of("SYSTEM") is None and _kernel(classes).made == []


def test_without_cache_allocation_only_the_bandwidth_is_set(tmp_path: Path) -> None:
    root = tmp_path / "resctrl"
    kernel = make_resctrl_tree(root)
    (root / "info" / "L3" / "cbm_mask").unlink()
    classes = ResctrlClasses(ResctrlWriter(root, vendor="intel", fs=kernel))
    notes = classes.apply({"BE": ClassPolicy((0, 30), 42), "LS": ClassPolicy((0, 50), None)})
    assert [n for n in notes if n.action == "left"] == [
        Note("left", "resctrl/corepin-be", "BE l3Percent: no L3 cache allocation"),
        Note("left", "resctrl/corepin-ls", "LS l3Percent: no L3 cache allocation"),
    ]
    assert kernel.written == [("corepin-be/schemata", "MB:0=50;1=50\n")]
    assert classes.group_of("LS") is None and kernel.made == ["corepin-be"]


def test_is_default() -> None:
    assert is_default(FULL) and is_default(ClassPolicy()) and is_default(ClassPolicy(None, 100))
    assert not is_default(ClassPolicy((0, 99), None)) and not is_default(ClassPolicy(None, 90))
    assert group_name("be") == "corepin-be"


# ---------------------------------------------------------------------- groups made, removed
def test_classes_back_at_the_default_lose_their_group_and_tasks_fall_back(
    tmp_path: Path,
) -> None:
    classes, root = _classes(tmp_path, "intel")
    kernel = _kernel(classes)
    classes.apply(MIXED)
    classes.assign("LS", [201, 202])
    classes.assign("SYSTEM", [301])
    kernel.written.clear()
    notes = classes.apply(default_class_policies())
    assert kernel.removed == ["corepin-ls", "corepin-system"]
    assert [(n.action, n.target) for n in notes] == [
        ("removed", "resctrl/corepin-ls"),
        ("removed", "resctrl/corepin-system"),
        ("resized", "resctrl/corepin-be"),
    ]
    assert kernel.written == [("corepin-be/schemata", "MB:0=100;1=100\n")]
    assert _shown(root) == {"corepin-be": "L3:0=0003f;1=0003f\nMB:0=100;1=100\n"}
    assert sorted(int(t) for t in (root / "tasks").read_text().split()) == [201, 202, 301]
    assert classes.group_of("LS") is None and classes.group_of("BE") == "corepin-be"


def test_a_group_narrowed_before_is_widened_when_its_policy_leaves_a_resource_out(
    tmp_path: Path,
) -> None:
    classes, root = _classes(tmp_path, "intel")
    classes.apply({"BE": ClassPolicy((0, 30), 30)})
    classes.apply({"BE": ClassPolicy(None, 30)})
    assert _shown(root) == {"corepin-be": "L3:0=fffff;1=fffff\nMB:0= 30;1= 30\n"}


def test_groups_corepin_did_not_make_are_never_touched(tmp_path: Path) -> None:
    classes, root = _classes(tmp_path, "intel")
    kernel = _kernel(classes)
    for name in ("batch", "corepin-custom", "COREPIN-BE"):
        kernel.mkdir(root / name)
    kernel.write(root / "batch" / "schemata", "L3:0=3\n")
    kernel.write(root / "batch" / "tasks", "77\n")
    before = _shown(root)
    classes.apply(MIXED)
    classes.apply({})
    assert kernel.removed == ["corepin-ls", "corepin-be", "corepin-system"]
    assert _shown(root) == before
    assert (root / "batch" / "tasks").read_text() == "77\n"


def test_groups_left_by_an_earlier_run_are_found(tmp_path: Path) -> None:
    classes, root = _classes(tmp_path, "intel")
    classes.apply(MIXED)
    classes.assign("BE", [11])
    again = ResctrlClasses(classes.writer)
    assert again.group_of("BE") == "corepin-be" and again.group_of("LSE") is None
    assert [v.group for v in again.describe()] == ["corepin-ls", "corepin-be", "corepin-system"]
    writes = again.writes
    assert again.assign("BE", [11]) == [] and again.writes == writes
    again.apply({"LS": ClassPolicy((50, 100), None)})
    assert set(_shown(root)) == {"corepin-ls"}


def test_class_names_are_checked(tmp_path: Path) -> None:
    classes, _ = _classes(tmp_path, "intel")
    with pytest.raises(InputError, match="'GOLD' is not a QoS class"):
        classes.apply({"GOLD": ClassPolicy((0, 30), None)})
    classes.apply({"be": ClassPolicy((0, 30), None)})
    assert classes.group_of("Be") == "corepin-be"
    with pytest.raises(InputError):
        classes.group_of("gold")


# ---------------------------------------------------------------------- tasks
def test_tasks_are_assigned_once_and_move_when_their_class_changes(tmp_path: Path) -> None:
    classes, root = _classes(tmp_path, "intel")
    kernel = _kernel(classes)
    classes.apply(MIXED)
    kernel.written.clear()
    kernel.gone.add(303)
    assert classes.assign("BE", [101, 102, 303]) == [
        Note("moved", "resctrl/corepin-be", "2 task(s) of class BE: 101, 102")
    ], "a task that is gone is skipped"
    assert classes.assign("BE", [101, 102]) == [] and len(kernel.written) == 2
    classes.assign("LS", [101])
    assert classes.writer.tasks("corepin-be") == [102]
    assert classes.writer.tasks("corepin-ls") == [101]
    kernel.written.clear()
    assert classes.assign("LSE", [102, 500]) == [
        Note("moved", "resctrl (root group)", "1 task(s) of class LSE: 102")
    ], "back to the root group from corepin's group; a task elsewhere is left alone"
    assert kernel.written == [("tasks", "102\n")]
    assert (root / "tasks").read_text().split() == ["102"]
    assert classes.writer.tasks("corepin-be") == []
    assert classes.assign("LSE", [102, 500]) == []


def test_tasks_of_a_class_at_the_default_in_someone_elses_group_stay(tmp_path: Path) -> None:
    classes, root = _classes(tmp_path, "intel")
    kernel = _kernel(classes)
    kernel.mkdir(root / "batch")
    kernel.write(root / "batch" / "tasks", "77\n")
    classes.apply(MIXED)
    kernel.written.clear()
    assert classes.assign("LSE", [77]) == [] and kernel.written == []


def test_a_note_names_the_first_tasks_and_counts_the_rest(tmp_path: Path) -> None:
    classes, _ = _classes(tmp_path, "intel")
    classes.apply(MIXED)
    [note] = classes.assign("BE", range(1000, 1011))
    assert note.detail == (
        "11 task(s) of class BE: 1000, 1001, 1002, 1003, 1004, 1005, 1006, 1007 and 3 more"
    )


def _fake_proc(root: Path, threads: dict[int, list[int]]) -> Path:
    for pid, tids in threads.items():
        for tid in tids:
            (root / str(pid) / "task" / str(tid)).mkdir(parents=True)
    return root


def test_threads_of_lists_every_thread_and_skips_processes_that_are_gone(
    tmp_path: Path,
) -> None:
    proc = _fake_proc(tmp_path / "proc", {40: [40, 52, 41], 60: [60]})
    assert threads_of([60, 40, 99, 40], proc) == [60, 40, 41, 52]
    classes, _ = _classes(tmp_path, "intel")
    assert classes.threads_of([40], proc) == [40, 41, 52]


def test_threads_of_a_real_process_include_its_new_threads() -> None:
    stop = threading.Event()
    started = threading.Event()
    tids: list[int] = []

    def work() -> None:
        tids.append(threading.get_native_id())
        started.set()
        stop.wait()

    worker = threading.Thread(target=work)
    worker.start()
    try:
        started.wait()
        got = threads_of([os.getpid()])
        assert os.getpid() in got and tids[0] in got
        assert ResctrlClasses(ResctrlWriter()).threads_of([os.getpid()]) == got
    finally:
        stop.set()
        worker.join()
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert threads_of([child.pid]) == [], "a process that exited has no threads"


_THREADS = """
import threading, time
for _ in range(2):
    threading.Thread(target=time.sleep, args=(600,), daemon=True).start()
print("ready", flush=True)
time.sleep(600)
"""

_CPU_V1 = Path("/sys/fs/cgroup/cpu")


@pytest.fixture
def scratch_cpu_cgroup() -> Iterator[Path]:
    if not (_CPU_V1 / "tasks").is_file() or not os.access(_CPU_V1, os.W_OK):
        pytest.skip("needs a writable cgroup v1 cpu hierarchy")
    group = _CPU_V1 / f"corepin-test-{secrets.token_hex(4)}"
    (group / "child").mkdir(parents=True)
    try:
        yield group
    finally:
        for folder in (group / "child", group):
            for tid in (folder / "tasks").read_text().split():
                with contextlib.suppress(ProcessLookupError):
                    (_CPU_V1 / "tasks").write_text(tid)
            folder.rmdir()


def test_cgroup_threads_of_a_real_cgroup(scratch_cpu_cgroup: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", _THREADS], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
        (scratch_cpu_cgroup / "child" / "cgroup.procs").write_text(str(child.pid))
        got = cgroup_threads(scratch_cpu_cgroup)
        assert len(got) == 3 and sorted(got) == sorted(threads_of([child.pid]))
        assert cgroup_threads(scratch_cpu_cgroup / "child") == got
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
        if child.stdout is not None:
            child.stdout.close()


def test_cgroup_threads_read_v2_thread_lists(tmp_path: Path) -> None:
    (tmp_path / "pod" / "c1").mkdir(parents=True)
    (tmp_path / "pod" / "cgroup.threads").write_text("")
    (tmp_path / "pod" / "cgroup.procs").write_text("")
    (tmp_path / "pod" / "c1" / "cgroup.threads").write_text("7\n9\n")
    (tmp_path / "pod" / "c1" / "cgroup.procs").write_text("7\n")
    assert cgroup_threads(tmp_path / "pod") == [7, 9]
    assert cgroup_threads(tmp_path / "gone") == []


# ---------------------------------------------------------------------- monitoring
def test_describe_and_samples_per_class(tmp_path: Path) -> None:
    classes, _ = _classes(tmp_path, "intel-sparse-ids")
    kernel = _kernel(classes)
    classes.apply({"BE": ClassPolicy((0, 30), 42), "LS": ClassPolicy((50, 100), None)})
    kernel.set_counter("corepin-be", 0, "llc_occupancy", 4718592)
    kernel.set_counter("corepin-be", 0, "mbm_total_bytes", 123456789)
    kernel.set_counter("corepin-be", 0, "mbm_local_bytes", 100000000)
    kernel.set_counter("corepin-be", 2, "llc_occupancy", "Unavailable")
    kernel.set_counter("corepin-be", 2, "mbm_total_bytes", "Error")
    kernel.set_counter("corepin-ls", 2, "mbm_local_bytes", 5)
    views = classes.describe()
    assert views == [
        ClassView(
            qos_class="LS",
            group="corepin-ls",
            l3_masks={0: "7e0", 2: "7e0"},
            l3_ways={0: 6, 2: 6},
            mb={0: 100, 2: 100},
            mb_unit="percent",
            monitoring={0: MonSample(0, 0, 0, 0), 2: MonSample(2, 0, 0, 5)},
        ),
        ClassView(
            qos_class="BE",
            group="corepin-be",
            l3_masks={0: "f", 2: "f"},
            l3_ways={0: 4, 2: 4},
            mb={0: 50, 2: 50},
            mb_unit="percent",
            monitoring={
                0: MonSample(0, 4718592, 123456789, 100000000),
                2: MonSample(2, None, None, 0),
            },
        ),
    ]
    assert views[1].to_json()["l3"] == {
        "0": {"mask": "f", "ways": 4},
        "2": {"mask": "f", "ways": 4},
    }
    assert views[1].to_json()["monitoring"]["2"] == {
        "llcOccupancyBytes": None,
        "mbmTotalBytes": None,
        "mbmLocalBytes": 0,
    }
    assert classes.samples() == ResctrlSamples(
        occupancy=[("LS", "0", 0), ("LS", "2", 0), ("BE", "0", 4718592)],
        bandwidth=[
            ("LS", "0", "total", 0),
            ("LS", "0", "local", 0),
            ("LS", "2", "total", 0),
            ("LS", "2", "local", 5),
            ("BE", "0", "total", 123456789),
            ("BE", "0", "local", 100000000),
            ("BE", "2", "local", 0),
        ],
    )


def test_describe_under_cdp_and_amd(tmp_path: Path) -> None:
    cdp, _ = _classes(tmp_path / "a", "intel-cdp")
    cdp.apply({"BE": ClassPolicy((0, 30), None)})
    [view] = cdp.describe()
    assert view.l3_masks == {0: "3f", 1: "3f"} and view.l3_ways == {0: 6, 1: 6}
    amd, _ = _classes(tmp_path / "b", "amd")
    amd.apply({"BE": ClassPolicy(None, 50)})
    [view] = amd.describe()
    assert view.mb == dict.fromkeys(range(4), 1024) and view.mb_unit == "absolute"
    assert view.l3_ways == dict.fromkeys(range(4), 16)


def test_no_monitoring_gives_no_samples(tmp_path: Path) -> None:
    classes, _ = _classes(tmp_path, "intel", mon=False)
    classes.apply(MIXED)
    assert [v.monitoring for v in classes.describe()] == [{}, {}, {}]
    assert classes.samples() == ResctrlSamples([], [])


# ---------------------------------------------------------------------- refusals
def test_no_closid_left_names_num_closids(tmp_path: Path) -> None:
    classes, root = _classes(tmp_path, "intel", num_closids=3)
    with pytest.raises(ResctrlError) as info:
        classes.apply(MIXED)
    assert info.value.reason == "resctrl_no_closid"
    assert "all 3 CLOSIDs" in str(info.value) and "info/L3/num_closids" in str(info.value)
    assert f"{root}/corepin-system" in str(info.value)
    assert (root / "info" / "last_cmd_status").read_text() == "Out of CLOSIDs\n"
    assert classes.group_of("LS") == "corepin-ls" and classes.group_of("SYSTEM") is None
    classes.apply({"BE": ClassPolicy((0, 30), None), "SYSTEM": ClassPolicy(None, 20)})
    assert set(_shown(root)) == {"corepin-be", "corepin-system"}, (
        "groups back at the default are removed first, freeing their CLOSIDs"
    )


def test_a_refused_schemata_is_reported_and_the_new_group_removed(tmp_path: Path) -> None:
    classes, root = _classes(tmp_path, "intel")
    kernel = _kernel(classes)
    classes.writer.info  # read before the kernel changes its mind  # noqa: B018
    kernel.min_cbm_bits = 4
    with pytest.raises(ResctrlError) as info:
        classes.apply({"BE": ClassPolicy((0, 10), None)})
    message = str(info.value)
    assert f"{root}/corepin-be/schemata" in message
    assert "'L3:0=3;1=3'" in message and "(kernel: Need at least 4 bits in the mask)" in message
    assert kernel.made == ["corepin-be"] and kernel.removed == ["corepin-be"]
    assert classes.group_of("BE") is None and _shown(root) == {}


def test_a_refused_schemata_of_an_existing_group_keeps_it(tmp_path: Path) -> None:
    classes, root = _classes(tmp_path, "intel")
    kernel = _kernel(classes)
    classes.apply({"BE": ClassPolicy((0, 30), 30)})
    kernel.min_bandwidth = 40
    with pytest.raises(ResctrlError, match=r"MB value 20 out of range \[40,100\]"):
        classes.apply({"BE": ClassPolicy((0, 40), 20)})
    assert classes.group_of("BE") == "corepin-be" and kernel.removed == []
    assert _shown(root) == {"corepin-be": "L3:0=000ff;1=000ff\nMB:0= 30;1= 30\n"}, (
        "the lines before the refused one were taken"
    )


def test_no_resctrl_is_a_note(tmp_path: Path) -> None:
    (tmp_path / "resctrl").mkdir()
    classes, note = open_resctrl(tmp_path / "resctrl", tmp_path)
    assert classes is None and note is not None and "\n" not in note
    assert note.startswith(f"no resctrl filesystem at {tmp_path / 'resctrl'}")
    assert open_resctrl(tmp_path / "missing")[0] is None


def test_open_resctrl_reads_the_vendor_from_cpuinfo(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "cpuinfo").write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\n")
    kernel = make_resctrl_tree(tmp_path / "resctrl", vendor="amd", cbm_mask="ffff")
    classes, note = open_resctrl(tmp_path / "resctrl", proc, fs=kernel)
    assert note is None and classes is not None
    assert classes.writer.vendor == "amd" and classes.writer.info.mb_unit == "absolute"
    classes.apply({"BE": ClassPolicy(None, 10)})
    assert kernel.written == [("corepin-be/schemata", "MB:0=205;1=205\n")]
    intel, _ = open_resctrl(tmp_path / "resctrl", vendor="intel", fs=kernel)
    assert intel is not None and intel.writer.vendor == "intel"


# ---------------------------------------------------------------------- property
_policies = st.dictionaries(
    st.sampled_from(CLASSES),
    st.builds(
        ClassPolicy,
        st.one_of(
            st.none(),
            st.tuples(st.integers(0, 99), st.integers(1, 100)).filter(lambda p: p[0] < p[1]),
        ),
        st.one_of(st.none(), st.integers(1, 100)),
    ),
)


@settings(max_examples=examples(60))
@given(
    machine=st.fixed_dictionaries(
        {
            "vendor": st.sampled_from(("intel", "amd")),
            "l3_ids": st.sampled_from(((0,), (0, 1), (0, 2), (0, 2, 4, 6))),
            "cbm_mask": st.sampled_from(("fffff", "7ff", "ffff", "ff0", "3")),
            "min_cbm_bits": st.integers(1, 2),
            "cdp": st.booleans(),
            "mba": st.booleans(),
        }
    ),
    steps=st.lists(_policies, min_size=1, max_size=3),
)
def test_every_class_gets_one_valid_group_and_a_second_apply_writes_nothing(
    tmp_path_factory: pytest.TempPathFactory,
    machine: dict[str, object],
    steps: list[dict[str, ClassPolicy]],
) -> None:
    root = tmp_path_factory.mktemp("resctrl")
    kernel = make_resctrl_tree(root, **machine)  # type: ignore[arg-type]
    classes = ResctrlClasses(ResctrlWriter(root, vendor=kernel.vendor, fs=kernel))
    for policies in steps:
        classes.apply(policies)
        shown = {name: parse_schemata(text) for name, text in _shown(root).items()}
        for qos_class in CLASSES:
            policy = policies.get(qos_class, ClassPolicy())
            effective = ClassPolicy(policy.l3_percent, policy.mba_percent if kernel.mba else None)
            group = group_name(qos_class)
            if is_default(effective):
                assert group not in shown and classes.group_of(qos_class) is None
                continue
            assert group in shown and classes.group_of(qos_class) == group
            masks = [int(v, 16) for r in kernel.l3_names for v in shown[group][r].values()]
            assert len(masks) == len(kernel.l3_names) * len(kernel.l3_ids)
            for mask in masks:
                assert is_contiguous(mask) and mask & ~kernel.cbm_mask == 0
                assert mask.bit_count() >= kernel.min_cbm_bits
            if kernel.mba:
                bandwidth = [int(v) for v in shown[group]["MB"].values()]
                assert len(bandwidth) == len(kernel.mb_ids)
                assert all(kernel.min_bandwidth <= v <= kernel.mb_default for v in bandwidth)
        assert len(shown) == sum(
            not is_default(ClassPolicy(p.l3_percent, p.mba_percent if kernel.mba else None))
            for p in policies.values()
        )
        writes, written = classes.writes, len(kernel.written)
        made, removed = len(kernel.made), len(kernel.removed)
        classes.apply(policies)
        assert classes.writes == writes and len(kernel.written) == written
        assert (len(kernel.made), len(kernel.removed)) == (made, removed)
