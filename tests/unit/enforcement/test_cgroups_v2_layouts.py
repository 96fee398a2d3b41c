"""The cgroup v2 driver and the reconcile engine in the layouts v2 allows besides corepin's own
(on a directory tree standing in for cgroupfs; the same layouts on a real kernel are checked in
a guest by tests/vm/test_vm_v2_layouts.py): a group holding processes is never asked to hand
controllers down, groups on the way that do not hand cpuset down get it, groups made inside a
threaded subtree are made threaded, a threaded group's processes come from its threads, and an
ancestor that stopped handing a group's CPUs down is widened."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from corepin.core.cpuset import CPUSet
from corepin.core.errors import CgroupError
from corepin.enforcement.cgroups import CgroupV2
from corepin.enforcement.cgroups.driver import processes_of
from corepin.enforcement.faketree import make_fake_v2
from corepin.enforcement.reconcile import CgroupTarget, Reconciler

ALL = CPUSet.parse("0-15")
NODES = CPUSet.parse("0-3")


@pytest.fixture
def v2(tmp_path: Path) -> CgroupV2:
    return make_fake_v2(tmp_path, cpus=ALL, mems=NODES)


def test_a_group_holding_processes_is_not_asked_to_hand_cpuset_down(v2: CgroupV2) -> None:
    v2.controllers = ("cpuset",)
    v2.guard_processes = True  # as host mode sets it (usable_hierarchy)
    v2.create("corepin")
    v2.write_file("corepin", "cgroup.procs", "4242")
    with pytest.raises(CgroupError) as caught:
        v2.create("corepin/sd-1/run-1")
    assert caught.value.reason == "cgroup_has_processes"
    assert "holds processes (4242)" in caught.value.message
    assert v2.read_file("corepin", "cgroup.subtree_control") == ""
    assert not v2.exists("corepin/sd-1")


def test_groups_on_the_way_that_do_not_hand_cpuset_down_get_it(v2: CgroupV2) -> None:
    v2.controllers = ("cpuset",)
    v2.write_file("", "cgroup.subtree_control", "")
    os.makedirs(os.path.join(v2.root, "corepin", "sd-1"))  # made by someone else, bare
    v2.create("corepin/sd-1/run-1")
    assert v2.read_file("", "cgroup.subtree_control") == "+cpuset"
    assert v2.read_file("corepin", "cgroup.subtree_control") == "+cpuset"
    assert v2.read_file("corepin/sd-1", "cgroup.subtree_control") == "+cpuset"


@pytest.mark.parametrize("parent_type", ["threaded", "domain threaded"])
def test_groups_made_inside_a_threaded_subtree_are_threaded(v2: CgroupV2, parent_type: str) -> None:
    v2.controllers = ("cpuset",)
    v2.create("corepin/sd-1")
    v2.write_file("corepin/sd-1", "cgroup.type", parent_type)
    v2.create("corepin/sd-1/run-1")
    assert v2.group_type("corepin/sd-1/run-1") == "threaded"
    assert v2.group_type("corepin") == "domain"  # nothing above it touched


def test_the_processes_of_threads_are_their_thread_groups() -> None:
    started = threading.Event()
    stop = threading.Event()
    tids: list[int] = []

    def work() -> None:
        tids.append(threading.get_native_id())
        started.set()
        stop.wait(10)

    worker = threading.Thread(target=work)
    worker.start()
    try:
        started.wait(10)
        me = str(threading.get_native_id())
        got = processes_of([str(tids[0]), me, "999999999"])
    finally:
        stop.set()
        worker.join()
    assert got == [os.getpid()]


def test_an_ancestor_that_stopped_handing_the_cpus_down_is_widened(v2: CgroupV2) -> None:
    v2.controllers = ("cpuset",)
    v2.create("corepin/sd-1/run-1")
    v2.write_file("corepin/sd-1/run-1", "cpuset.cpus", "12-15")
    v2.write_file("corepin/sd-1/run-1", "cpuset.mems", "3")
    # someone narrowed the (inheriting) parent; the kernel gives the run the parent's CPUs
    v2.write_file("corepin/sd-1", "cpuset.cpus", "0-3")
    v2.write_file("corepin/sd-1/run-1", "cpuset.cpus.effective", "0-3")
    v2.write_file("corepin/sd-1/run-1", "cpuset.mems.effective", "3")
    want = CgroupTarget("corepin/sd-1/run-1", cpus=CPUSet.parse("12-15"), mems=CPUSet.parse("3"))
    report = Reconciler(v2).reconcile([want])
    assert report.errors == []
    assert [(c.path, c.new, c.why) for c in report.changes] == [
        ("corepin/sd-1", "0-3,12-15", "widen-ancestor")
    ]
    assert v2.read_file("corepin/sd-1/run-1", "cpuset.cpus") == "12-15"
    # once the kernel hands them down again, nothing is written
    v2.write_file("corepin/sd-1/run-1", "cpuset.cpus.effective", "12-15")
    assert Reconciler(v2).reconcile([want]).writes == 0
