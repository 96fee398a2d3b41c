"""The reconcile engine on fake cgroup trees that refuse what the v1 kernel refuses."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corepin.core.cpuset import CPUSet
from corepin.core.errors import InputError
from corepin.core.ids import IdError
from corepin.enforcement.cgroups import CgroupV1, CgroupV2, CpuQuota
from corepin.enforcement.faketree import make_fake_v1, make_fake_v2
from corepin.enforcement.layout import container_cgroup_path
from corepin.enforcement.reconcile import CgroupTarget, Reconciler, reconcile
from corepin.topology.model import CPUInfo, Topology
from support.budget import examples

ALL = CPUSet.parse("0-7")
NODES = CPUSet.parse("0-1")
S = CPUSet.parse


def two_node_topology() -> Topology:
    return Topology([CPUInfo(cpu=c, numa=c // 4, core=c, l3=c // 4) for c in range(8)])


@pytest.fixture
def v1(tmp_path: Path) -> CgroupV1:
    return make_fake_v1(tmp_path, cpus=ALL, mems=NODES)


def fast_tmp() -> tempfile.TemporaryDirectory[str]:
    """A temp dir on tmpfs when there is one: creating files on this disk costs milliseconds."""
    shm = Path("/dev/shm")
    return tempfile.TemporaryDirectory(
        dir=shm if shm.is_dir() and os.access(shm, os.W_OK) else None
    )


def test_a_steady_state_of_500_containers_performs_zero_writes() -> None:
    with fast_tmp() as tmp:
        _steady_state(make_fake_v1(tmp, cpus=ALL, mems=NODES))


def _steady_state(v1: CgroupV1) -> None:
    targets = []
    for i in range(500):
        uid = f"{i:08x}-0000-4000-8000-000000000000"
        path = container_cgroup_path("cgroupfs", "burstable", uid, "containerd", f"{i:064x}")
        v1.create(path)
        targets.append(
            CgroupTarget(path, cpus=CPUSet.of(i % 8), mems=CPUSet.of(0), quota=CpuQuota.unlimited())
        )
    first = reconcile(targets, cgroups=v1)
    assert first.ok, first.errors
    assert first.writes == 1000, "cpus and mems of every container differ once"
    second = reconcile(targets, cgroups=v1)
    assert second.ok and second.changes == [] and second.writes == 0
    assert second.checked == 500


def test_moving_a_parent_and_child_to_disjoint_cpus_widens_then_shrinks(v1: CgroupV1) -> None:
    v1.create("pod/ctr")
    v1.write_cpus("pod/ctr", S("0-1"))
    v1.write_cpus("pod", S("0-3"))
    v1.record = True
    report = reconcile(
        [CgroupTarget("pod/ctr", cpus=S("4-5")), CgroupTarget("pod", cpus=S("4-7"))], cgroups=v1
    )
    assert report.ok, report.errors
    assert v1.read_cpus("pod") == S("4-7") and v1.read_cpus("pod/ctr") == S("4-5")
    written = [(Path(f).parent.name, v) for f, v in v1.journal]
    assert written == [("pod", "0-7"), ("ctr", "4-5"), ("pod", "4-7")], (
        "parent widened first, child set, parent shrunk last"
    )
    assert [c.why for c in report.changes] == ["widen-first", "target", "target"]


def test_shrinking_a_parent_first_shrinks_live_children_that_use_dropped_cpus(
    v1: CgroupV1,
) -> None:
    v1.create("pod/a")
    v1.create("pod/b/inner")
    v1.write_cpus("pod/b/inner", S("6-7"))
    report = reconcile([CgroupTarget("pod", cpus=S("0-3"))], cgroups=v1)
    assert report.ok, report.errors
    assert v1.read_cpus("pod") == S("0-3")
    assert v1.read_cpus("pod/a") == S("0-3"), "a child keeps what it may still use"
    assert v1.read_cpus("pod/b") == S("0-3")
    assert v1.read_cpus("pod/b/inner") == S("0-3"), "no CPU left in common: takes the new set"
    assert {c.path for c in report.changes if c.why == "shrink-child"} == {
        "pod/a",
        "pod/b",
        "pod/b/inner",
    }


def test_a_target_outside_its_ancestors_widens_the_ancestors_first(v1: CgroupV1) -> None:
    v1.create("kubepods/burstable/pod1/ctr")
    for rel in ("kubepods/burstable/pod1/ctr", "kubepods/burstable/pod1", "kubepods/burstable"):
        v1.write_cpus(rel, S("0-1"))
    v1.write_cpus("kubepods", S("0-3"))
    report = reconcile([CgroupTarget("kubepods/burstable/pod1/ctr", cpus=S("6"))], cgroups=v1)
    assert report.ok, report.errors
    assert v1.read_cpus("kubepods") == S("0-3,6")
    assert v1.read_cpus("kubepods/burstable") == S("0-1,6")
    assert v1.read_cpus("kubepods/burstable/pod1") == S("0-1,6")
    assert v1.read_cpus("kubepods/burstable/pod1/ctr") == S("6")
    assert [c.why for c in report.changes] == ["widen-ancestor"] * 3 + ["target"]


def test_mems_default_to_the_numa_nodes_of_the_cpus(v1: CgroupV1) -> None:
    v1.create("g")
    reconciler = Reconciler(v1, topology=two_node_topology())
    report = reconciler.reconcile([CgroupTarget("g", cpus=S("4-5"))])
    assert report.ok
    assert v1.read_mems("g") == CPUSet.of(1)
    assert [c.what for c in report.changes] == ["cpuset.mems", "cpuset.cpus"], "mems first"


def test_contradictory_nesting_is_rejected_before_any_write(v1: CgroupV1) -> None:
    v1.create("pod/ctr")
    with pytest.raises(InputError) as info:
        reconcile(
            [CgroupTarget("pod", cpus=S("0-1")), CgroupTarget("pod/ctr", cpus=S("2"))], cgroups=v1
        )
    assert info.value.reason == "inconsistent_targets"
    assert "'pod/ctr'" in str(info.value)
    assert v1.writes == 4, "only the writes of create()"


def test_one_bad_path_rejects_the_whole_desired_state(v1: CgroupV1) -> None:
    v1.create("good")
    writes = v1.writes
    with pytest.raises(IdError):
        reconcile(
            [CgroupTarget("good", cpus=S("1")), CgroupTarget("good/../../etc", cpus=S("1"))],
            cgroups=v1,
        )
    assert v1.writes == writes
    assert v1.read_cpus("good") == ALL


def test_duplicate_and_empty_targets_are_input_errors(v1: CgroupV1) -> None:
    with pytest.raises(InputError, match="twice"):
        reconcile([CgroupTarget("a", cpus=S("1")), CgroupTarget("/a/", cpus=S("2"))], cgroups=v1)
    with pytest.raises(InputError, match="empty CPU set"):
        reconcile([CgroupTarget("a", cpus=CPUSet())], cgroups=v1)
    with pytest.raises(InputError, match="root"):
        reconcile([CgroupTarget("/", cpus=S("1"))], cgroups=v1)


def test_missing_groups_are_reported_or_created(v1: CgroupV1) -> None:
    report = reconcile([CgroupTarget("gone/ctr", cpus=S("1"))], cgroups=v1)
    assert report.missing == ["gone/ctr"] and report.writes == 0
    report = reconcile([CgroupTarget("corepin/run-1", cpus=S("1"), create=True)], cgroups=v1)
    assert report.ok, report.errors
    assert [c.what for c in report.changes][:2] == ["mkdir", "mkdir"]
    assert v1.read_cpus("corepin/run-1") == S("1")


def test_dry_run_reports_the_changes_and_writes_nothing(v1: CgroupV1) -> None:
    v1.create("pod/ctr")
    before = v1.writes
    targets = [
        CgroupTarget("pod/ctr", cpus=S("2"), quota=CpuQuota.for_cpus(1)),
        CgroupTarget("new/group", cpus=S("3"), create=True),
    ]
    planned = reconcile(targets, cgroups=v1, dry_run=True)
    assert planned.dry_run and planned.writes == 0 and v1.writes == before
    assert not v1.exists("new")
    assert {(c.what, c.path) for c in planned.changes} == {
        ("cpuset.cpus", "pod/ctr"),
        ("cpu.cfs_quota_us", "pod/ctr"),
        ("mkdir", "new"),
        ("mkdir", "new/group"),
        ("cpuset.cpus", "new/group"),
    }
    applied = reconcile(targets, cgroups=v1)
    assert applied.ok, applied.errors
    assert {(c.what, c.path, c.new) for c in applied.changes if c.what != "mkdir"} == {
        (c.what, c.path, c.new) for c in planned.changes if c.what != "mkdir"
    }


def test_quota_removed_for_an_exclusively_pinned_container_and_raised_top_down(
    v1: CgroupV1,
) -> None:
    v1.create("pod/ctr")
    v1.write_quota("pod", CpuQuota(100000, 100000))
    v1.write_quota("pod/ctr", CpuQuota(50000, 100000))
    report = reconcile(
        [
            CgroupTarget("pod/ctr", quota=CpuQuota(200000, 100000)),
            CgroupTarget("pod", quota=CpuQuota(400000, 100000)),
        ],
        cgroups=v1,
    )
    assert report.ok, report.errors
    assert [c.path for c in report.changes] == ["pod", "pod/ctr"], "raise the parent first"
    report = reconcile(
        [
            CgroupTarget("pod/ctr", quota=CpuQuota(50000, 100000)),
            CgroupTarget("pod", quota=CpuQuota(100000, 100000)),
        ],
        cgroups=v1,
    )
    assert report.ok, report.errors
    assert [c.path for c in report.changes] == ["pod/ctr", "pod"], "lower the child first"
    report = reconcile([CgroupTarget("pod/ctr", quota=CpuQuota.unlimited())], cgroups=v1)
    assert report.ok and v1.read_quota("pod/ctr").is_unlimited
    assert reconcile([CgroupTarget("pod/ctr", quota=CpuQuota.unlimited())], cgroups=v1).writes == 0


def test_a_refused_write_is_reported_and_the_other_targets_still_apply(v1: CgroupV1) -> None:
    v1.create("a")
    v1.create("b")
    report = reconcile([CgroupTarget("a", cpus=S("9")), CgroupTarget("b", cpus=S("2"))], cgroups=v1)
    assert not report.ok
    assert [e.reason for e in report.errors] == ["cgroup_invalid_value"]
    assert v1.read_cpus("b") == S("2")


def test_v2_widens_ancestors_with_explicit_cpus_and_skips_inheriting_ones(tmp_path: Path) -> None:
    v2 = make_fake_v2(tmp_path, cpus=ALL, mems=NODES)
    v2.create("kubepods.slice/kubepods-pod1.slice/ctr.scope")
    v2.write_cpus("kubepods.slice", S("0-3"))
    report = reconcile(
        [CgroupTarget("kubepods.slice/kubepods-pod1.slice/ctr.scope", cpus=S("5"))], cgroups=v2
    )
    assert report.ok, report.errors
    assert v2.read_cpus("kubepods.slice") == S("0-3,5")
    assert v2.read_cpus("kubepods.slice/kubepods-pod1.slice") == CPUSet(), "inherits: untouched"
    assert v2.read_cpus("kubepods.slice/kubepods-pod1.slice/ctr.scope") == S("5")
    report = reconcile(
        [
            CgroupTarget(
                "kubepods.slice/kubepods-pod1.slice/ctr.scope",
                cpus=S("5"),
                quota=CpuQuota.unlimited(),
            )
        ],
        cgroups=v2,
    )
    assert report.writes == 0


def _random_tree(draw: st.DrawFn) -> list[str]:
    paths = ["t"]
    for _ in range(draw(st.integers(1, 8))):
        parent = draw(st.sampled_from(paths))
        if parent.count("/") < 3:
            paths.append(f"{parent}/g{len(paths)}")
    return paths


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[list[str], dict[str, CPUSet], dict[str, CPUSet]]:
    paths = _random_tree(draw)
    nonempty = st.integers(1, 255).map(CPUSet.from_bits)

    def consistent() -> dict[str, CPUSet]:
        out: dict[str, CPUSet] = {}
        for p in paths:  # parents come before children in `paths`
            parent = out.get(p.rsplit("/", 1)[0], ALL) if "/" in p else ALL
            out[p] = draw(nonempty) & parent or parent
        return out

    initial = consistent()
    desired = consistent()
    chosen = draw(st.lists(st.sampled_from(paths), min_size=1, unique=True))
    return paths, initial, {p: desired[p] for p in chosen}


@settings(max_examples=examples(60))
@given(scenarios())
def test_any_consistent_desired_state_is_reached_without_a_refused_write(
    scenario: tuple[list[str], dict[str, CPUSet], dict[str, CPUSet]],
) -> None:
    paths, initial, desired = scenario
    with fast_tmp() as tmp:
        drv = make_fake_v1(tmp, cpus=ALL, mems=NODES)
        for p in paths:
            drv.create(p)
        for p in reversed(paths):  # children first: they shrink within the full parent
            drv.write_cpus(p, initial[p])
        report = reconcile([CgroupTarget(p, cpus=c) for p, c in desired.items()], cgroups=drv)
        assert report.ok, report.errors
        for p, cpus in desired.items():
            assert drv.read_cpus(p) == cpus
        for p in paths:  # the v1 invariant holds everywhere afterwards
            if "/" in p:
                assert drv.read_cpus(p) <= drv.read_cpus(p.rsplit("/", 1)[0])
        again = reconcile([CgroupTarget(p, cpus=c) for p, c in desired.items()], cgroups=drv)
        assert again.writes == 0 and again.changes == []


def test_report_is_json_serialisable(v1: CgroupV1) -> None:
    v1.create("g")
    report = reconcile([CgroupTarget("g", cpus=S("1"))], cgroups=v1)
    data = report.to_json()
    assert data["writes"] == 1
    assert data["changes"] == [
        {"what": "cpuset.cpus", "path": "g", "old": "0-7", "new": "1", "why": "target"}
    ]


def test_v2_driver_is_usable_without_fake_mode_flags(tmp_path: Path) -> None:
    drv = CgroupV2(tmp_path)
    assert drv.version == 2 and not drv.fake_tree


def test_a_move_that_asks_for_it_turns_on_v1_memory_migration_before_the_mems_change(
    v1: CgroupV1,
) -> None:
    v1.create("g")
    reconciler = Reconciler(v1, topology=two_node_topology())
    assert reconciler.reconcile([CgroupTarget("g", cpus=S("0-1"))]).ok
    report = reconciler.reconcile([CgroupTarget("g", cpus=S("4-5"), migrate_memory=True)])
    assert report.ok
    assert v1.read_file("g", "cpuset.memory_migrate").strip() == "1"
    assert [c.what for c in report.changes] == [
        "cpuset.memory_migrate",
        "cpuset.mems",
        "cpuset.cpus",
    ], "the flag is on before the memory nodes change"
    again = reconciler.reconcile([CgroupTarget("g", cpus=S("0-1"), migrate_memory=True)])
    assert [c.what for c in again.changes] == ["cpuset.mems", "cpuset.cpus"], "written once"


def test_memory_migration_is_left_alone_when_the_memory_nodes_stay(v1: CgroupV1) -> None:
    v1.create("g")
    reconciler = Reconciler(v1, topology=two_node_topology())
    assert reconciler.reconcile([CgroupTarget("g", cpus=S("0-1"))]).ok
    report = reconciler.reconcile([CgroupTarget("g", cpus=S("2-3"), migrate_memory=True)])
    assert [c.what for c in report.changes] == ["cpuset.cpus"]
