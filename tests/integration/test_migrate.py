"""`corepin migrate`: import of the kubelet's cpu_manager_state into corepin's state directory.

The kubelet files are written here in tmp_path: the published vectors (values from the kubelet's
own tests, ../shared/fixtures/peer/kubelet_cpu_manager_state/vectors.json, skipped when absent)
and hand-written files with checksum 0. Imports that need more CPUs than this machine has run
against a synthetic sysfs tree (`--sysfs-root`), which `corepin report` then reads too: the
state is always written for the topology the host commands check it against.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from corepin.cli.main import main
from corepin.core.cpuset import CPUSet
from corepin.enforcement.faketree import make_fake_v1
from corepin.state import StateStore
from corepin.state.kubelet import checksum_v2
from corepin.testing.machines import dual_socket_ht, single_socket_ht
from corepin.testing.sysfs_tree import write_sysfs_tree
from corepin.topology.discover import discover
from support.helpers import (
    KUBELET_VECTORS_FILE,
    kubelet_vector_file,
    load_kubelet_vectors,
    run_corepin,
)

C = CPUSet.parse
VECTORS_FILE = KUBELET_VECTORS_FILE
VECTORS = load_kubelet_vectors()
POD = "0f8c2a6e-3b1d-4c2e-9a57-1d2e3f4a5b6c"
POD2 = "7a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d"
LIVE_CPUS = discover("/").online_cpus
ON_CPUS_0_1 = str(LIVE_CPUS) == "0-1"
on_cpus_0_1 = pytest.mark.skipif(
    not ON_CPUS_0_1, reason=f"entries written for CPUs 0-1; this machine has {LIVE_CPUS}"
)


def vector_content(v: dict[str, Any]) -> dict[str, Any]:
    """policyName, defaultCpuSet and entries of a vector (v4: from inside its data string)."""
    if v["format"] == "v4-data":
        inner = json.loads(v["data"])
        return {
            "policyName": inner["policyName"],
            "defaultCpuSet": inner["defaultCPUSet"],
            "entries": inner.get("entries", {}),
        }
    return {k: v[k] for k in ("policyName", "defaultCpuSet", "entries")}


def expected_ids(v: dict[str, Any]) -> dict[str, str]:
    """id -> CPUs corepin should import for a vector (empty for the none policy)."""
    content = vector_content(v)
    if content["policyName"] != "static":
        return {}
    out = {}
    for key, value in content["entries"].items():
        if isinstance(value, str):  # v1: containerID -> cpus
            out[f"container/{key}"] = value
        else:
            for name, cpus in value.items():
                out[f"pod/{key}/{name}"] = cpus
    return out


def parses(text: str) -> bool:
    try:
        CPUSet.parse(text)
    except ValueError:
        return False
    return True


def importable(v: dict[str, Any]) -> bool:
    content = vector_content(v)
    return (
        "expected_error" not in v
        and content["policyName"] in ("static", "none")
        and parses(content["defaultCpuSet"])
    )


def corepin(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """`corepin ARGS` in this process: (exit code, stdout, stderr)."""
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def migrate(
    capsys: pytest.CaptureFixture[str], kubelet: str, state_dir: Path | str, *extra: str
) -> tuple[int, str, str]:
    """`corepin migrate --from-kubelet KUBELET --state-dir STATE_DIR EXTRA...` in this process."""
    return corepin(
        capsys, "migrate", "--from-kubelet", kubelet, "--state-dir", str(state_dir), *extra
    )


def quarantine(
    capsys: pytest.CaptureFixture[str], state_dir: Path, *extra: str
) -> tuple[int, str, str]:
    """`corepin migrate --quarantine --state-dir STATE_DIR EXTRA...` in this process."""
    return corepin(capsys, "migrate", "--quarantine", "--state-dir", str(state_dir), *extra)


def report(capsys: pytest.CaptureFixture[str], state_dir: Path, *extra: str) -> dict[str, Any]:
    code, out, err = corepin(
        capsys, "report", "--state-dir", str(state_dir), "-o", "json", "--cgroups", "off", *extra
    )
    assert code == 0, err
    data: dict[str, Any] = json.loads(out)
    return data


@pytest.fixture(scope="module")
def sixteen(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A sysfs tree of a 16-CPU machine (1 socket, 8 cores x 2 threads)."""
    return str(write_sysfs_tree(single_socket_ht(), tmp_path_factory.mktemp("sysfs16")))


def write(path: Path, doc: Any) -> str:
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return str(path)


# ---------------------------------------------------------------------- every file form


@pytest.mark.skipif(not VECTORS, reason=f"fixtures absent: {VECTORS_FILE}")
@pytest.mark.parametrize("vector", VECTORS, ids=[v["name"] for v in VECTORS])
def test_every_published_checkpoint_imports_or_is_refused_with_exit_2_and_report_shows_it(
    vector: dict[str, Any], tmp_path: Path, sixteen: str, capsys: pytest.CaptureFixture[str]
) -> None:
    kubelet = write(tmp_path / "cpu_manager_state", kubelet_vector_file(vector))
    state_dir = tmp_path / "state"
    code, out, err = migrate(
        capsys,
        kubelet,
        state_dir,
        "--sysfs-root",
        sixteen,
        "--cgroups",
        "off",
        "-o",
        "json",
    )
    if not importable(vector):
        # unparsable CPU lists, a foreign policy, a checksum that does not match: refused, and
        # nothing is written (the newest kubelet's v2 vector, marked "not reproduced by the
        # classic formula", verifies through the v3 struct and imports)
        assert code == 2, out
        assert kubelet in err and "Traceback" not in err
        assert not (state_dir / "state.json").exists()
        return
    assert code == 0, err
    result = json.loads(out)
    want = expected_ids(vector)
    assert {a["id"]: a["cpus"] for a in result["assignments"]} == want
    assert result["written"] is True and result["format"] == vector["format"].split("-")[0]
    shown = report(capsys, state_dir, "--sysfs-root", sixteen)
    assert {a["id"]: a["exclusive_cpus"] for a in shown["allocations"]} == want
    if want:  # static: the default set is the shared pool, the rest of the machine reserved
        default = C(vector_content(vector)["defaultCpuSet"])
        assert shown["shared_pool"] == str(default)
        held = CPUSet.from_bits(sum(C(c).bits for c in want.values()))
        assert shown["reserved"] == str(C("0-15") - default - held)
    else:  # none pins nothing: the whole machine is shared
        assert shown["shared_pool"] == "0-15" and shown["reserved"] == ""


HAND_WRITTEN = {
    "v2 with checksum 0 and the kubelet's key spelling": {
        "policyName": "static",
        "defaultCpuSet": "0",
        "entries": {POD: {"app": "1"}},
        "checksum": 0,
    },
    "v2 with the upstream tests' defaultCPUSet spelling and no checksum key": {
        "policyName": "static",
        "defaultCPUSet": "0",
        "entries": {POD: {"app": "1"}},
    },
    "v3 with a pod-level entry holding its container's CPUs": {
        "policyName": "static",
        "defaultCpuSet": "0",
        "entries": {POD: {"app": "1"}},
        "podEntries": {POD: {"cpuSet": "1"}},
        "checksum": 0,
    },
    "v1 keyed by container id with checksum 0": {
        "policyName": "static",
        "defaultCpuSet": "0",
        "entries": {"a" * 64: "1"},
        "checksum": 0,
    },
    "v2 with an init container whose CPUs the app container reuses": {
        "policyName": "static",
        "defaultCpuSet": "0",
        "entries": {POD: {"init": "1", "app": "1"}},
        "checksum": 0,
    },
}
HAND_WRITTEN_IDS = {
    "v1 keyed by container id with checksum 0": "container/" + "a" * 64,
    "v2 with an init container whose CPUs the app container reuses": f"pod/{POD}/app",
}


@on_cpus_0_1
@pytest.mark.parametrize("name", list(HAND_WRITTEN))
def test_a_hand_written_checkpoint_with_checksum_0_imports_for_this_machine(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kubelet = write(tmp_path / "cpu_manager_state", HAND_WRITTEN[name])
    state_dir = tmp_path / "state"
    code, out, err = migrate(
        capsys,
        kubelet,
        state_dir,
        "--cgroups",
        "off",
    )
    assert code == 0, err
    assert "no checksum (0)" in out and "event=unverified" in out
    want = HAND_WRITTEN_IDS.get(name, f"pod/{POD}/app")
    shown = report(capsys, state_dir)
    assert [(a["id"], a["exclusive_cpus"]) for a in shown["allocations"]] == [(want, "1")]
    assert shown["shared_pool"] == "0" and shown["free"] == "0"


def test_a_v3_pod_level_entry_with_extra_cpus_becomes_its_own_allocation(
    tmp_path: Path, sixteen: str, capsys: pytest.CaptureFixture[str]
) -> None:
    kubelet = write(
        tmp_path / "k",
        {
            "policyName": "static",
            "defaultCpuSet": "0-11",
            "entries": {POD: {"app": "12-13"}},
            "podEntries": {POD: {"cpuSet": "12-15"}},
            "checksum": 0,
        },
    )
    state_dir = tmp_path / "state"
    code, _, err = migrate(
        capsys,
        kubelet,
        state_dir,
        "--sysfs-root",
        sixteen,
        "--cgroups",
        "off",
    )
    assert code == 0, err
    shown = report(capsys, state_dir, "--sysfs-root", sixteen)
    assert {a["id"]: a["exclusive_cpus"] for a in shown["allocations"]} == {
        f"pod/{POD}/app": "12-13",
        f"pod/{POD}": "14-15",
    }
    assert shown["reserved"] == "" and shown["shared_pool"] == "0-11"


def test_the_text_output_lists_assignments_pools_and_notes(
    tmp_path: Path, sixteen: str, capsys: pytest.CaptureFixture[str]
) -> None:
    entries = {POD: {"app": "2-3"}, POD2: {"db": "4-7"}}
    kubelet = write(
        tmp_path / "k",
        {
            "policyName": "static",
            "defaultCpuSet": "8-15",
            "entries": entries,
            "checksum": checksum_v2("static", "8-15", entries),
        },
    )
    code, out, err = migrate(
        capsys,
        kubelet,
        tmp_path / "s",
        "--sysfs-root",
        sixteen,
        "--cgroups",
        "off",
    )
    assert code == 0, err
    lines = out.splitlines()
    assert f"checksum {checksum_v2('static', '8-15', entries)}: verified" in lines[0]
    assert "written to:" in lines[1] and "(revision 1)" in lines[1]
    assert any(line.split()[:3] == [f"pod/{POD}/app", "2-3", "0"] for line in lines)
    assert any(line.split()[:2] == [f"pod/{POD2}/db", "4-7"] for line in lines)
    assert "shared pool: 8-15" in lines
    assert "reserved:    0-1 (strict-cpu-reservation)" in lines
    assert "notes:" in lines and "  event=reserved cpus=0-1 cause=not_in_default_set" in lines


# ---------------------------------------------------------------------- refusals


def test_a_checksum_mismatch_exits_2_naming_the_file_and_both_checksums(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    entries = {POD: {"app": "1"}}
    good = checksum_v2("static", "0", entries)
    kubelet = write(
        tmp_path / "cpu_manager_state",
        {"policyName": "static", "defaultCpuSet": "0", "entries": entries, "checksum": 1337},
    )
    state_dir = tmp_path / "state"
    code, out, err = migrate(capsys, kubelet, state_dir)
    assert code == 2 and out == ""
    assert kubelet in err and "1337" in err and str(good) in err
    assert "checkpoint is corrupted" in err and "restore the file" in err
    assert not state_dir.exists()


def test_a_checkpoint_whose_entries_overlap_the_default_set_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kubelet = write(
        tmp_path / "k",
        {"policyName": "static", "defaultCpuSet": "0-1", "entries": {POD: {"a": "1"}}},
    )
    code, _, err = migrate(capsys, kubelet, tmp_path / "s")
    assert code == 2 and "also in the default CPU set" in err


def test_entries_on_cpus_this_machine_does_not_have_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    far = str(max(LIVE_CPUS) + 1)
    kubelet = write(
        tmp_path / "k",
        {"policyName": "static", "defaultCpuSet": "0", "entries": {POD: {"a": far}}},
    )
    code, _, err = migrate(capsys, kubelet, tmp_path / "s")
    assert code == 2 and f"CPUs {far} are assigned but not online" in err
    assert not (tmp_path / "s").exists()


def test_a_missing_kubelet_file_exits_2_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = str(tmp_path / "nope")
    code, _, err = migrate(capsys, missing, "x")
    assert code == 2 and missing in err and "cannot read" in err


def test_a_state_that_already_holds_allocations_is_refused_unless_forced(
    tmp_path: Path, sixteen: str, capsys: pytest.CaptureFixture[str]
) -> None:
    state_dir = tmp_path / "state"
    first = write(
        tmp_path / "k1",
        {"policyName": "static", "defaultCpuSet": "2-15", "entries": {POD: {"a": "0-1"}}},
    )
    second = write(
        tmp_path / "k2",
        {"policyName": "static", "defaultCpuSet": "0-13", "entries": {POD2: {"b": "14-15"}}},
    )
    common = ("--sysfs-root", sixteen, "--cgroups", "off")
    assert migrate(capsys, first, state_dir, *common)[0] == 0
    before = (state_dir / "state.json").read_bytes()

    code, out, err = migrate(capsys, second, state_dir, *common)
    assert code == 4 and out == ""
    assert f"already holds 1 allocation(s) (pod/{POD}/a)" in err
    assert "corepin reconcile --once" in err and "--force" in err
    assert (state_dir / "state.json").read_bytes() == before

    code, out, err = migrate(capsys, second, state_dir, *common, "--dry-run", "-o", "json")
    assert code == 4, "a dry run refuses the same way"
    assert (state_dir / "state.json").read_bytes() == before
    code, out, err = migrate(capsys, second, state_dir, *common, "--force", "-o", "json")
    assert code == 0, err
    result = json.loads(out)
    assert result["replaced"] == [f"pod/{POD}/a"] and result["revision"] == 2
    shown = report(capsys, state_dir, "--sysfs-root", sixteen)
    assert [a["id"] for a in shown["allocations"]] == [f"pod/{POD2}/b"]


def test_a_state_without_allocations_is_replaced_without_force(
    tmp_path: Path, sixteen: str, capsys: pytest.CaptureFixture[str]
) -> None:
    state_dir = tmp_path / "state"
    none = write(tmp_path / "k0", {"policyName": "none", "defaultCpuSet": ""})
    static = write(
        tmp_path / "k1",
        {"policyName": "static", "defaultCpuSet": "2-15", "entries": {POD: {"a": "0-1"}}},
    )
    common = ("--sysfs-root", sixteen, "--cgroups", "off")
    code, out, _ = migrate(capsys, none, state_dir, *common)
    assert code == 0 and "(no assignments)" in out and "policy_none" in out
    assert migrate(capsys, static, state_dir, *common)[0] == 0
    assert len(report(capsys, state_dir, "--sysfs-root", sixteen)["allocations"]) == 1


# ---------------------------------------------------------------------- dry run, topology


def test_a_dry_run_prints_the_import_and_writes_nothing(
    tmp_path: Path, sixteen: str, capsys: pytest.CaptureFixture[str]
) -> None:
    kubelet = write(
        tmp_path / "k",
        {"policyName": "static", "defaultCpuSet": "4-15", "entries": {POD: {"a": "0-3"}}},
    )
    state_dir = tmp_path / "state"
    code, out, err = migrate(
        capsys,
        kubelet,
        state_dir,
        "--sysfs-root",
        sixteen,
        "--dry-run",
        "-o",
        "json",
        "--cgroups",
        "off",
    )
    assert code == 0, err
    result = json.loads(out)
    assert result["dry_run"] is True and result["written"] is False and result["revision"] is None
    owner = {
        "type": "container",
        "pod_uid": POD,
        "container": "a",
        "namespace": "",
        "pod": "",
        "container_id": "",
        "qos": "",
        "runtime": "",
        "cgroup": None,
    }
    assert result["assignments"] == [
        {"id": f"pod/{POD}/a", "cpus": "0-3", "mems": "0", "cgroup": None, "owner": owner}
    ]
    assert result["shared_pool"] == "4-15"
    assert not state_dir.exists()  # not even the directory or its lock file

    code, out, _ = migrate(
        capsys,
        kubelet,
        state_dir,
        "--sysfs-root",
        sixteen,
        "--dry-run",
        "--cgroups",
        "off",
    )
    assert code == 0 and f"dry run: nothing written to {state_dir}" in out
    assert not state_dir.exists()


def test_topology_file_previews_another_machine_but_writes_only_for_this_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = write(tmp_path / "dual.json", dual_socket_ht().to_json())
    kubelet = write(
        tmp_path / "k",
        {"policyName": "static", "defaultCpuSet": "0-7,16-31", "entries": {POD: {"a": "8-15"}}},
    )
    state_dir = tmp_path / "state"
    code, out, err = migrate(
        capsys,
        kubelet,
        state_dir,
        "--topology",
        other,
        "--dry-run",
        "-o",
        "json",
        "--cgroups",
        "off",
    )
    assert code == 0, err
    assert json.loads(out)["assignments"][0]["cpus"] == "8-15"

    code, out, err = migrate(
        capsys,
        kubelet,
        state_dir,
        "--topology",
        other,
        "--cgroups",
        "off",
    )
    assert code == 2 and "does not describe this machine" in err and "--dry-run" in err
    assert not state_dir.exists()


@on_cpus_0_1
def test_a_topology_file_of_this_machine_writes_a_state_report_accepts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = corepin(capsys, "topology", "-o", "json")
    assert code == 0
    here = write(tmp_path / "here.json", out)
    kubelet = write(
        tmp_path / "k", {"policyName": "static", "defaultCpuSet": "1", "entries": {POD: {"a": "0"}}}
    )
    state_dir = tmp_path / "state"
    code, _, err = migrate(
        capsys,
        kubelet,
        state_dir,
        "--topology",
        here,
        "--cgroups",
        "off",
    )
    assert code == 0, err
    assert [a["id"] for a in report(capsys, state_dir)["allocations"]] == [f"pod/{POD}/a"]


# ---------------------------------------------------------------------- container cgroups


def test_imported_containers_are_found_in_the_cpuset_hierarchy_and_stay_alive_while_there(
    tmp_path: Path, sixteen: str, capsys: pytest.CaptureFixture[str]
) -> None:
    cg = tmp_path / "cgroup"
    make_fake_v1(cg, cpus=C("0-15"), mems=C("0"))
    cid = "b" * 64
    app = cg / "cpuset" / "kubepods" / f"pod{POD}" / ("c" * 64)
    pause = cg / "cpuset" / "kubepods" / f"pod{POD}" / ("d" * 64)
    v1ctr = cg / "cpuset" / "kubepods" / f"pod{POD2}" / cid
    # corepin's own parent group, as `corepin run` leaves it (the report's pinner opens it)
    own = cg / "cpuset" / "corepin"
    for d, cpus in ((app, "4-5"), (pause, "6-15"), (v1ctr, "2-3"), (own, "0-15")):
        d.mkdir(parents=True)
        (d / "cpuset.cpus").write_text(cpus + "\n")
        (d / "cpuset.mems").write_text("0\n")
    kubelet = write(
        tmp_path / "k",
        {
            "policyName": "static",
            "defaultCpuSet": "6-15",
            "entries": {POD: {"app": "4-5"}, POD2: {"sidecar": "0-1"}},
        },
    )
    state_dir = tmp_path / "state"
    common = ("--sysfs-root", sixteen, "--cgroup-root", str(cg), "--cgroups", "on")
    code, out, err = migrate(
        capsys,
        kubelet,
        state_dir,
        *common,
        "-o",
        "json",
    )
    assert code == 0, err
    result = json.loads(out)
    cgroups = {a["id"]: a["cgroup"] for a in result["assignments"]}
    assert cgroups == {
        f"pod/{POD}/app": f"kubepods/pod{POD}/{'c' * 64}",
        f"pod/{POD2}/sidecar": None,
    }
    assert any(n.startswith(f"event=no_container id=pod/{POD2}/sidecar") for n in result["notes"])

    def alive() -> dict[str, bool]:
        code, out, err = corepin(
            capsys, "report", "--state-dir", str(state_dir), "-o", "json", *common
        )
        assert code == 0, err
        return {a["id"]: a["alive"] for a in json.loads(out)["allocations"]}

    assert alive() == {f"pod/{POD}/app": True, f"pod/{POD2}/sidecar": False}
    for name in os.listdir(app):
        (app / name).unlink()
    app.rmdir()
    assert alive() == {f"pod/{POD}/app": False, f"pod/{POD2}/sidecar": False}

    # v1 files name the container id: its directory is found wherever the layout put it
    v1 = write(
        tmp_path / "v1",
        {"policyName": "static", "defaultCpuSet": "4-15", "entries": {cid: "2-3"}, "checksum": 0},
    )
    code, out, err = migrate(
        capsys,
        v1,
        tmp_path / "s2",
        *common,
        "--dry-run",
        "-o",
        "json",
    )
    assert code == 0, err
    assert json.loads(out)["assignments"][0]["cgroup"] == f"kubepods/pod{POD2}/{cid}"


# ---------------------------------------------------------------------- quarantine


def test_quarantine_moves_a_corrupt_checkpoint_aside_and_an_import_then_succeeds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    (state_dir / "state.json").write_text('{"version": 1, "payload": {"revision": ')
    kubelet = write(
        tmp_path / "k", {"policyName": "static", "defaultCpuSet": "0", "entries": {POD: {"a": "1"}}}
    )
    code, _, err = migrate(
        capsys,
        kubelet,
        state_dir,
        "--cgroups",
        "off",
    )
    assert code == 2 and "truncated" in err
    assert f"corepin migrate --quarantine --state-dir {state_dir}" in err
    assert "--force" not in err  # forcing never overwrites a corrupt checkpoint

    code, out, err = quarantine(capsys, state_dir, "-o", "json")
    assert code == 0, err
    moved = json.loads(out)["moved_to"]
    assert moved.startswith(str(state_dir / "state.json.corrupt-")) and Path(moved).exists()
    assert Path(moved).read_text() == '{"version": 1, "payload": {"revision": '
    assert not (state_dir / "state.json").exists()

    if ON_CPUS_0_1:
        code, _, err = migrate(
            capsys,
            kubelet,
            state_dir,
            "--cgroups",
            "off",
        )
        assert code == 0, err
        assert [a["id"] for a in report(capsys, state_dir)["allocations"]] == [f"pod/{POD}/a"]


def test_quarantine_leaves_a_healthy_checkpoint_alone_unless_forced(
    tmp_path: Path, sixteen: str, capsys: pytest.CaptureFixture[str]
) -> None:
    state_dir = tmp_path / "state"
    code, out, _ = quarantine(capsys, state_dir)
    assert code == 0 and "nothing to quarantine" in out
    kubelet = write(
        tmp_path / "k",
        {"policyName": "static", "defaultCpuSet": "2-15", "entries": {POD: {"a": "0-1"}}},
    )
    assert (
        migrate(
            capsys,
            kubelet,
            state_dir,
            "--sysfs-root",
            sixteen,
            "--cgroups",
            "off",
        )[0]
        == 0
    )
    code, _, err = quarantine(capsys, state_dir)
    assert code == 2 and "not corrupt" in err and "1 allocation(s)" in err
    assert StateStore(state_dir).read() is not None
    code, out, err = quarantine(capsys, state_dir, "--force")
    assert code == 0 and "state.json.corrupt-" in out
    assert StateStore(state_dir).read() is None


def test_migrate_needs_exactly_one_of_from_kubelet_and_quarantine(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["migrate", "--state-dir", "x"])
    assert exc.value.code == 2
    assert "--from-kubelet" in capsys.readouterr().err


@on_cpus_0_1
def test_the_installed_command_imports_and_reports_end_to_end(tmp_path: Path) -> None:
    kubelet = write(
        tmp_path / "k", {"policyName": "static", "defaultCpuSet": "0", "entries": {POD: {"a": "1"}}}
    )
    state_dir = str(tmp_path / "state")
    done = run_corepin("migrate", "--from-kubelet", kubelet, "--state-dir", state_dir)
    assert done.returncode == 0, done.stderr
    shown = run_corepin("report", "--state-dir", state_dir, "-o", "json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["allocations"][0]["id"] == f"pod/{POD}/a"
