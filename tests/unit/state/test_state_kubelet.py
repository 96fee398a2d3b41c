"""Import of the kubelet's cpu_manager_state: formats, exact checksums, conversion.

Vectors come from ../shared/fixtures/peer/kubelet_cpu_manager_state/vectors.json (values from the
kubelet's own tests); the tests skip when the fixtures are absent.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from corepin.core.cpuset import CPUSet
from corepin.core.errors import StateFormatError
from corepin.state import STRICT_RESERVATION, StateStore
from corepin.state.kubelet import (
    checksum_v1,
    checksum_v2,
    checksum_v3,
    checksum_v4,
    fnv32a,
    kubelet_to_host_state,
    parse_kubelet_state,
    read_kubelet_state,
    spew_v2,
)
from support.helpers import KUBELET_VECTORS_FILE, kubelet_vector_file, load_kubelet_vectors

C = CPUSet.parse
VECTORS_FILE = KUBELET_VECTORS_FILE
VECTORS = load_kubelet_vectors()
needs_fixtures = pytest.mark.skipif(not VECTORS, reason=f"fixtures absent: {VECTORS_FILE}")


def computed(v: dict[str, Any]) -> int:
    if v["format"] == "v4-data":
        return checksum_v4(v["data"])
    if v["format"] == "v1":
        return checksum_v1(v["policyName"], v["defaultCpuSet"], v["entries"])
    return checksum_v2(v["policyName"], v["defaultCpuSet"], v["entries"])


def test_fnv1a_32_matches_the_published_test_values() -> None:
    assert fnv32a(b"") == 0x811C9DC5
    assert fnv32a(b"a") == 0xE40C292C
    assert fnv32a(b"foobar") == 0xBF9CF968


def test_the_printed_struct_has_the_go_spew_layout() -> None:
    text = spew_v2("static", "1-3", {"pod": {"b": "5", "a": "4"}, "another": {}})
    assert text == (
        "(*state.CPUManagerCheckpoint){PolicyName:(string)static DefaultCPUSet:(string)1-3 "
        "Entries:(map[string]map[string]string)map[another:map[] pod:map[a:4 b:5]] "
        "Checksum:(checksum.Checksum)0}"
    )


@needs_fixtures
@pytest.mark.parametrize("vector", VECTORS, ids=[v["name"] for v in VECTORS])
def test_every_vector_checksum_is_reproduced_or_documented_as_unreproducible(
    vector: dict[str, Any],
) -> None:
    want = vector.get("checksum", vector.get("dataChecksum"))
    if vector.get("reproducible", True):
        assert computed(vector) == want
    elif "classic_formula_gives" in vector:
        assert computed(vector) == vector["classic_formula_gives"]
        # the newest kubelet hashes its v3 struct (with an empty PodEntries) for v2 files too
        assert (
            checksum_v3(vector["policyName"], vector["defaultCpuSet"], vector["entries"], {})
            == want
        )
    else:
        assert computed(vector) != want  # a deliberately wrong checksum


@needs_fixtures
@pytest.mark.parametrize("vector", VECTORS, ids=[v["name"] for v in VECTORS])
def test_every_vector_parses_or_fails_exactly_as_the_kubelet_does(vector: dict[str, Any]) -> None:
    source = f"/var/lib/kubelet/cpu_manager_state ({vector['name']})"
    expected_error = vector.get("expected_error")
    if expected_error is None and vector["format"] == "v4-data" and "unparsable" in vector["name"]:
        # the kubelet's test of this vector expects this error (the vector leaves it implicit)
        expected_error = 'could not parse default cpu set "1.3"'
    if expected_error is not None:
        with pytest.raises(StateFormatError) as info:
            parse_kubelet_state(kubelet_vector_file(vector), source)
        msg = str(info.value)
        assert msg.startswith(source + ": ")
        kubelet_part = expected_error.split(": strconv")[0]  # Go's parser text differs
        assert kubelet_part in msg
        return
    ck = parse_kubelet_state(kubelet_vector_file(vector), source)
    assert ck.verified
    if vector["format"] == "v4-data":
        inner = json.loads(vector["data"])
        assert ck.format == "v4" and ck.policy_name == inner["policyName"]
        assert ck.default_cpuset == C(inner["defaultCPUSet"])
        entries = inner.get("entries", {})
    else:
        assert ck.policy_name == vector["policyName"]
        assert ck.default_cpuset == C(vector["defaultCpuSet"])
        entries = vector["entries"]
    if vector["format"] == "v1" and entries:
        assert ck.format == "v1"
        assert {k: str(v) for k, v in ck.container_entries.items()} == entries
    else:
        got = {pod: {c: str(s) for c, s in m.items()} for pod, m in ck.entries.items()}
        assert got == entries
    if "expected_error_when_configured_policy_is_none" in vector:
        with pytest.raises(StateFormatError) as info:
            parse_kubelet_state(kubelet_vector_file(vector), source, expected_policy="none")
        assert vector["expected_error_when_configured_policy_is_none"] in str(info.value)
        assert info.value.reason == "policy_mismatch"


@needs_fixtures
def test_an_invalid_checksum_is_reported_as_a_corrupted_checkpoint() -> None:
    vector = next(v for v in VECTORS if v["name"] == "v2 invalid checksum")
    with pytest.raises(StateFormatError) as info:
        parse_kubelet_state(kubelet_vector_file(vector), "/k/cpu_manager_state")
    assert info.value.reason == "checksum_mismatch"
    assert "/k/cpu_manager_state: checkpoint is corrupted: checksum 1337" in str(info.value)


def test_a_zero_checksum_means_none_and_is_accepted_unverified() -> None:
    ck = parse_kubelet_state('{"policyName":"static","defaultCpuSet":"0-3","checksum":0}')
    assert not ck.verified and ck.default_cpuset == C("0-3")


def test_keys_match_case_insensitively_like_go_encoding_json() -> None:
    policy, default = "none", "4-6"
    body = {"POLICYNAME": policy, "defaultCPUSet": default, "checksum": 354655845}
    assert parse_kubelet_state(json.dumps(body)).default_cpuset == C(default)


def test_a_v3_file_with_pod_level_entries_verifies_and_imports() -> None:
    # from the newest kubelet's tests: "Restore checkpoint from v3 (migration)"
    doc = {
        "policyName": "static",
        "defaultCPUSet": "1-2",
        "entries": {"pod1": {"container1": "5-6", "container2": "3-4"}},
        "podEntries": {"pod2": {"cpuSet": "7-9"}},
        "checksum": 2284712151,
    }
    ck = parse_kubelet_state(json.dumps(doc))
    assert ck.format == "v3" and ck.verified and ck.pod_entries == {"pod2": C("7-9")}
    state, _ = kubelet_to_host_state(ck)
    assert state.assignments["pod/pod2"].cpus == C("7-9")
    assert state.assignments["pod/pod1/container2"].cpus == C("3-4")
    assert state.shared_pool == C("1-2")
    doc["podEntries"] = {"pod2": {"cpuSet": "7-8"}}
    with pytest.raises(StateFormatError, match="checkpoint is corrupted"):
        parse_kubelet_state(json.dumps(doc))


def test_a_v4_file_with_pod_entries_keeps_only_the_pod_cpus_beyond_its_containers() -> None:
    data = (
        '{"policyName":"static","defaultCPUSet":"1-3","entries":{"pod":{"container1":"4-6",'
        '"container2":"7-9"}},"podEntries":{"pod":{"cpuSet":"4-10"}}}'
    )
    ck = parse_kubelet_state(json.dumps({"data": data, "checksum": 2328898362}))
    assert ck.format == "v4" and ck.pod_entries == {"pod": C("4-10")}
    state, _ = kubelet_to_host_state(ck)
    assert state.assignments["pod/pod"].cpus == C("10")
    assert state.exclusive_cpus == C("4-10") and state.shared_pool == C("1-3")


def test_a_v4_file_without_a_checksum_is_refused() -> None:
    with pytest.raises(StateFormatError, match="no checksum"):
        parse_kubelet_state(json.dumps({"data": '{"policyName":"none"}'}))


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("{", "not valid JSON"),
        ("[]", "expected a JSON object"),
        ('{"policyName": 5}', "policyName must be a string"),
        ('{"entries": []}', "entries must be an object"),
        ('{"entries": {"pod": 5}, "checksum": 0}', "must map container names"),
        ('{"checksum": -1}', "checksum must be an unsigned integer"),
        ('{"podEntries": {"p": "1"}, "checksum": 0}', "must be an object with a cpuSet"),
        ('{"data": 5, "checksum": 1}', "data must be a string"),
    ],
    ids=[
        "truncated JSON",
        "a JSON list",
        "a numeric policy name",
        "entries as a list",
        "a pod entry that is not an object",
        "a negative checksum",
        "a pod-level entry that is not an object",
        "a data section that is not a string",
    ],
)
def test_malformed_kubelet_files_name_the_file_and_the_problem(text: str, fragment: str) -> None:
    with pytest.raises(StateFormatError) as info:
        parse_kubelet_state(text, "/var/lib/kubelet/cpu_manager_state")
    assert str(info.value).startswith("/var/lib/kubelet/cpu_manager_state: ")
    assert fragment in str(info.value)


# ---------------------------------------------------------------------- conversion


def static_file(entries: dict[str, dict[str, str]], default: str) -> str:
    return json.dumps(
        {
            "policyName": "static",
            "defaultCpuSet": default,
            "entries": entries,
            "checksum": checksum_v2("static", default, entries),
        }
    )


def test_a_static_policy_checkpoint_becomes_exclusive_assignments_and_a_shared_pool() -> None:
    entries = {"uid-1": {"app": "2-3"}, "uid-2": {"db": "4,12"}}
    ck = parse_kubelet_state(static_file(entries, "0-1,5-11,13-15"), "/k/cms")
    state, notes = kubelet_to_host_state(
        ck, online=C("0-15"), topology_fingerprint="sha256:t", created=5.0
    )
    assert set(state.assignments) == {"pod/uid-1/app", "pod/uid-2/db"}
    app = state.assignments["pod/uid-1/app"]
    assert (app.kind, app.cpus, app.policy, app.created) == (
        "exclusive",
        C("2-3"),
        "kubelet-static",
        5.0,
    )
    assert app.container is not None
    assert (app.container.pod_uid, app.container.container) == ("uid-1", "app")
    assert state.shared_pool == C("0-1,5-11,13-15"), "the default CPU set is the shared pool"
    assert state.reserved == C("") and state.topology == "sha256:t"
    assert "event=imported id=pod/uid-1/app cpus=2-3" in notes


def test_cpus_in_no_set_become_strictly_reserved_as_with_strict_cpu_reservation() -> None:
    ck = parse_kubelet_state(static_file({"u": {"c": "2-3"}}, "1,4-7"))
    state, notes = kubelet_to_host_state(ck, online=C("0-7"))
    assert state.reserved == C("0") and state.options[STRICT_RESERVATION] == "true"
    assert state.shared_pool == C("1,4-7") and state.free == C("1,4-7")
    assert "event=reserved cpus=0 cause=not_in_default_set" in notes


def test_v1_entries_use_the_container_map_when_given() -> None:
    entries = {"cid-a": "4-6", "cid-b": "1-3"}
    text = json.dumps(
        {
            "policyName": "static",
            "defaultCpuSet": "7-9",
            "entries": entries,
            "checksum": checksum_v1("static", "7-9", entries),
        }
    )
    ck = parse_kubelet_state(text)
    state, _ = kubelet_to_host_state(ck, container_map={"cid-a": ("pod", "container1")})
    assert set(state.assignments) == {"pod/pod/container1", "container/cid-b"}
    assert state.online == C("1-9")


def test_init_container_cpus_reused_by_an_app_container_are_folded_into_it() -> None:
    entries = {"u": {"init": "2", "app": "2-3"}}
    state, notes = kubelet_to_host_state(parse_kubelet_state(static_file(entries, "0-1,4-7")))
    assert set(state.assignments) == {"pod/u/app"}
    assert "event=folded id=pod/u/init into=pod/u/app" in notes
    same = {"u": {"init": "2-3", "app": "2-3"}}
    state, notes = kubelet_to_host_state(parse_kubelet_state(static_file(same, "0-1,4-7")))
    assert set(state.assignments) == {"pod/u/app"}, "equal sets are kept once"
    assert "event=folded id=pod/u/init into=pod/u/app" in notes


@pytest.mark.parametrize(
    ("entries", "default", "fragment"),
    [
        ({"u": {"a": "2-3"}, "v": {"b": "3-4"}}, "0-1,5-7", "CPU 3 is assigned to both"),
        ({"u": {"a": "2-3"}}, "0-3", "also in the default CPU set"),
    ],
    ids=["two pods holding one CPU", "an entry inside the default set"],
)
def test_inconsistent_checkpoints_are_refused(
    entries: dict[str, dict[str, str]], default: str, fragment: str
) -> None:
    ck = parse_kubelet_state(static_file(entries, default), "/k/cms")
    with pytest.raises(StateFormatError, match=fragment) as info:
        kubelet_to_host_state(ck)
    assert str(info.value).startswith("/k/cms: ")


def test_assigned_cpus_that_are_not_online_are_refused() -> None:
    ck = parse_kubelet_state(static_file({"u": {"a": "8"}}, "0-7"))
    with pytest.raises(StateFormatError, match="CPUs 8 are assigned but not online"):
        kubelet_to_host_state(ck, online=C("0-7"))


def test_an_imported_state_is_committed_through_a_store(tmp_path: Path) -> None:
    path = tmp_path / "cpu_manager_state"
    path.write_text(static_file({"u": {"c": "2-3"}}, "0-1,4-7"))
    ck = read_kubelet_state(str(path), expected_policy="static")
    state, _ = kubelet_to_host_state(ck, mems_of=lambda cpus: CPUSet.of(0))
    store = StateStore(tmp_path / "corepin")
    with store.transaction() as tx:
        tx.commit(state)
    restored = store.read()
    assert restored is not None
    assert restored.assignments["pod/u/c"].mems == C("0")
    assert restored.assignments == state.assignments
    with pytest.raises(StateFormatError, match="cannot read"):
        read_kubelet_state(str(tmp_path / "missing"))
