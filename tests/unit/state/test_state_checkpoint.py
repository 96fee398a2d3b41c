"""The checkpoint file: canonical checksummed format, bad input, migrations."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corepin.core.cpuset import CPUSet
from corepin.core.digest import canonical_bytes, canonical_digest, sha256_hex
from corepin.core.errors import StateFormatError
from corepin.state import Assignment, ContainerOwner, HostState, ProcessOwner, StateStore
from corepin.state.checkpoint import (
    decode_checkpoint,
    encode_checkpoint,
    encode_legacy,
    read_checkpoint,
    write_checkpoint,
)
from corepin.state.migrations import MIGRATIONS
from corepin.state.payload import CURRENT_VERSION, state_to_payload
from support import strategies
from support.budget import examples
from support.paths import DATA

C = CPUSet.parse


def sample() -> HostState:
    s = HostState(
        revision=7,
        topology="sha256:ab",
        online=C("0-8"),
        isolated=C("8"),
        reserved=C("0"),
        infra=C("1"),
    )
    s = s.add(
        Assignment(
            "run/4242",
            cpus=C("2-3"),
            withheld=C("2-3,6-7"),
            mems=C("0"),
            level="core",
            owner=ProcessOwner(
                4242,
                987654,
                runner_pid=4240,
                runner_start_time=987650,
                session=4242,
                members=((4300, 987700),),
                name="ünï",
                command="iperf3 -s\nforged",
            ),
            created=1700000000.25,
            policy="topology-aware",
            workload="cpu-bound",
        )
    )
    s = s.add(Assignment("run/77", kind="shared", owner=ProcessOwner(77, 5), created=3.0))
    s = s.add(Assignment("sh/1", kind="share", cpus=C("5"), created=3.5))
    return s.add(
        Assignment(
            "pod/u/c",
            kind="mixed",
            cpus=C("4"),
            owner=ContainerOwner(
                pod_uid="u",
                container="c",
                namespace="ns",
                pod="p",
                container_id="abc",
                qos="burstable",
                runtime="containerd",
                cgroup="kubepods/burstable/podu/abc",
            ),
            policy="x",
        )
    )


def test_a_checkpoint_round_trips_every_field() -> None:
    s = sample()
    assert decode_checkpoint(encode_checkpoint(s), "mem") == s


def test_the_checksum_is_sha256_of_the_canonical_payload_bytes_embedded_verbatim() -> None:
    data = encode_checkpoint(sample())
    doc = json.loads(data)
    assert doc["version"] == CURRENT_VERSION
    body = json.dumps(doc["payload"], sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert body.encode() in data, "the payload bytes in the file are the canonical bytes"
    assert doc["checksum"] == "sha256:" + sha256_hex(body.encode())
    assert doc["checksum"] == canonical_digest(state_to_payload(sample()))
    assert data.endswith(b"}\n")


def test_a_reformatted_but_unchanged_checkpoint_still_verifies() -> None:
    doc = json.loads(encode_checkpoint(sample()))
    pretty = json.dumps(doc, indent=4).encode()
    assert decode_checkpoint(pretty, "pretty.json") == sample()


owners = st.one_of(
    st.none(),
    st.builds(
        ProcessOwner,
        pid=st.integers(1, 2**22),
        start_time=st.one_of(st.none(), st.integers(0, 2**62)),
        session=st.one_of(st.none(), st.integers(1, 2**22)),
        members=st.lists(st.tuples(st.integers(1, 2**22), st.integers(0, 2**40)), max_size=3).map(
            tuple
        ),
        name=st.text(max_size=8),
        command=st.text(max_size=12),
    ),
    st.builds(
        ContainerOwner,
        pod_uid=st.text("abcdef0123456789-", min_size=1, max_size=12),
        container=st.text("abc-", max_size=6),
        container_id=st.text("0123456789abcdef", max_size=12),
    ),
)


@settings(max_examples=examples(80))
@given(
    st.lists(
        st.tuples(
            strategies.cpusets(st.integers(0, 63), min_size=1, max_size=5),
            st.sampled_from(["exclusive", "mixed", "share", "shared"]),
            owners,
            st.floats(allow_nan=False, allow_infinity=False),
            st.sampled_from([None, "memory-bound", "best-effort"]),
        ),
        max_size=6,
    ),
    st.integers(0, 2**40),
)
def test_any_state_round_trips_through_the_checkpoint_format(rows: list[Any], rev: int) -> None:
    s = HostState(revision=rev, online=CPUSet.range(0, 63))
    for i, (cpus, kind, owner, created, workload) in enumerate(rows):
        a = Assignment(
            f"id-{i}",
            kind=kind,
            cpus=CPUSet() if kind == "shared" else cpus,
            owner=owner,
            created=created,
            workload=workload,
        )
        try:
            s = s.add(a)
        except Exception:
            continue
    assert decode_checkpoint(encode_checkpoint(s), "x") == s


# ---------------------------------------------------------------------- bad input


def good_doc() -> dict[str, Any]:
    return json.loads(encode_checkpoint(sample()))


def resign(doc: dict[str, Any]) -> bytes:
    """Re-compute the checksum after editing the payload (to reach the field checks)."""
    doc["checksum"] = canonical_digest(doc["payload"])
    return json.dumps(doc).encode()


def edit(path: list[Any], value: Any) -> bytes:
    doc = good_doc()
    target = doc
    for key in path[:-1]:
        target = target[key]
    if value is KeyError:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return resign(doc)


BAD_FILES = [
    ("an empty file", b"", "empty", "truncated"),
    ("a file of garbage", b"\x00\xff\xfe garbage", "not UTF-8", "bad_json"),
    ("text that is not JSON", b"hello world", "not valid JSON", "bad_json"),
    ("a JSON list instead of an object", b"[1, 2]", "expected a JSON object", "bad_field"),
    ("no version", b'{"payload": {}, "checksum": "sha256:00"}', "'version'", "missing_field"),
    ("no checksum", b'{"version": 3, "payload": {}}', "'checksum'", "missing_field"),
    ("no payload", b'{"version": 3, "checksum": "x"}', "'payload'", "missing_field"),
    (
        "a version written by a newer corepin",
        b'{"version": 99, "payload": {}, "checksum": "sha256:00"}',
        "version 99 is newer",
        "unknown_version",
    ),
    (
        "a string version",
        b'{"version": "2", "payload": {}, "checksum": "sha256:00"}',
        "version",
        "bad_field",
    ),
    (
        "version zero",
        b'{"version": 0, "payload": {}, "checksum": "sha256:00"}',
        "version",
        "bad_field",
    ),
    (
        "a checksum without algorithm",
        b'{"version": 3, "payload": {}, "checksum": "abc"}',
        "checksum",
        "bad_field",
    ),
    (
        "a payload that is a list",
        b'{"version": 3, "payload": [], "checksum": "sha256:0"}',
        "payload",
        "bad_field",
    ),
]


@pytest.mark.parametrize(
    ("what", "data", "fragment", "reason"), BAD_FILES, ids=[b[0] for b in BAD_FILES]
)
def test_malformed_files_raise_state_format_error_naming_the_file(
    what: str, data: bytes, fragment: str, reason: str
) -> None:
    with pytest.raises(StateFormatError) as info:
        decode_checkpoint(data, "/var/lib/corepin/state.json")
    msg = str(info.value)
    assert msg.startswith("/var/lib/corepin/state.json: "), msg
    assert fragment in msg
    assert info.value.reason == reason
    assert info.value.exit_code == 2


WRONG_TYPES = [
    ("revision as a string", ["payload", "revision"], "7", "payload.revision: expected an integer"),
    ("missing assignments", ["payload", "assignments"], KeyError, "missing field 'assignments'"),
    (
        "assignments as an object",
        ["payload", "assignments"],
        {},
        "payload.assignments: expected a list",
    ),
    ("online CPUs as a number", ["payload", "online"], 5, "payload.online: expected a string"),
    ("online CPUs unparsable", ["payload", "online"], "0-x", "invalid CPU set '0-x'"),
    ("cpus beyond the limit", ["payload", "assignments", 0, "cpus"], "99999", "beyond the limit"),
    (
        "an assignment of unknown kind",
        ["payload", "assignments", 0, "kind"],
        "hog",
        "kind: expected one of",
    ),
    (
        "a pid that is a float",
        ["payload", "assignments", 1, "owner", "pid"],
        1.5,
        "pid must be a non-negative integer",
    ),
    (
        "an owner of unknown type",
        ["payload", "assignments", 0, "owner", "type"],
        "vm",
        "owner type must be 'process' or 'container'",
    ),
    (
        "an owner with an unknown field",
        ["payload", "assignments", 0, "owner", "uid"],
        0,
        "unknown field 'uid'",
    ),
    (
        "an owner that is a string",
        ["payload", "assignments", 0, "owner"],
        "root",
        ".owner: expected a JSON object",
    ),
    (
        "a created time that is text",
        ["payload", "assignments", 0, "created"],
        "now",
        ".created: expected a number",
    ),
    (
        "a workload that is a number",
        ["payload", "assignments", 0, "workload"],
        3,
        ".workload: expected a string",
    ),
    (
        "an assignment without an id",
        ["payload", "assignments", 0, "id"],
        KeyError,
        "missing field 'id'",
    ),
    (
        "an exclusive assignment with no CPUs",
        ["payload", "assignments", 0, "cpus"],
        "",
        "holds no CPUs",
    ),
    (
        "options that are a list",
        ["payload", "options"],
        ["a"],
        "payload.options: expected a JSON object",
    ),
]


@pytest.mark.parametrize(
    ("what", "path", "value", "fragment"), WRONG_TYPES, ids=[w[0] for w in WRONG_TYPES]
)
def test_wrong_field_types_are_reported_with_their_json_path(
    what: str, path: list[Any], value: Any, fragment: str
) -> None:
    with pytest.raises(StateFormatError) as info:
        decode_checkpoint(edit(path, value), "/x/state.json")
    assert str(info.value).startswith("/x/state.json: ")
    assert fragment in str(info.value)


def test_duplicate_assignment_ids_are_refused() -> None:
    doc = good_doc()
    doc["payload"]["assignments"].append(doc["payload"]["assignments"][0])
    with pytest.raises(StateFormatError, match="duplicate id"):
        decode_checkpoint(resign(doc), "f")


def test_a_flipped_bit_in_the_payload_is_a_checksum_mismatch() -> None:
    data = bytearray(encode_checkpoint(sample()))
    i = data.index(b'"cpus":"2-3"') + len(b'"cpus":"')
    assert data[i : i + 3] == b"2-3"
    data[i : i + 3] = b"2-5"  # one CPU more for run/4242, same length
    with pytest.raises(StateFormatError) as info:
        decode_checkpoint(bytes(data), "/s/state.json")
    assert info.value.reason == "checksum_mismatch"
    assert "/s/state.json: checksum mismatch" in str(info.value)
    assert "quarantine" in str(info.value), "the message says what the operator can do"


def test_every_truncation_of_a_checkpoint_is_detected() -> None:
    data = encode_checkpoint(sample())
    for n in range(len(data) - 1):  # the last byte is the newline: dropping it is harmless
        with pytest.raises(StateFormatError) as info:
            decode_checkpoint(data[:n], "/s/state.json")
        assert str(info.value).startswith("/s/state.json: ")
        assert info.value.reason in ("truncated", "bad_json", "checksum_mismatch"), n
    assert decode_checkpoint(data[:-1], "s") == sample()


def test_a_corrupt_checkpoint_on_disk_is_kept_untouched_by_read_and_transaction(
    tmp_path: Path,
) -> None:
    store = StateStore(tmp_path)
    write_checkpoint(store.path, sample())
    corrupt = Path(store.path).read_bytes()[:-40]
    Path(store.path).write_bytes(corrupt)
    with pytest.raises(StateFormatError, match=str(store.path)):
        store.read()
    with pytest.raises(StateFormatError), store.transaction():
        pass
    assert Path(store.path).read_bytes() == corrupt, "the bad file is never replaced"
    moved = store.quarantine()
    assert moved is not None and ".corrupt-" in moved
    assert Path(moved).read_bytes() == corrupt
    assert store.read() is None
    with store.transaction() as tx:
        assert tx.state == HostState() and not tx.existed


def test_reading_a_directory_in_place_of_the_state_file_is_a_format_error(tmp_path: Path) -> None:
    (tmp_path / "state.json").mkdir()
    with pytest.raises(StateFormatError, match="is a directory"):
        read_checkpoint(str(tmp_path / "state.json"))


# ---------------------------------------------------------------------- migrations


def v1_payload() -> dict[str, Any]:
    return {
        "revision": 3,
        "topology": "sha256:old",
        "online": "0-3",
        "reserved": "0",
        "options": {},
        "assignments": [
            {
                "id": "run/10",
                "exclusive": True,
                "cpus": "1-2",
                "pid": 10,
                "created": 5.0,
                "policy": "p",
            },
            {
                "id": "run/11",
                "exclusive": False,
                "cpus": "3",
                "pid": 11,
                "created": 6.0,
                "policy": "p",
            },
        ],
    }


def test_a_version_1_checkpoint_is_migrated_to_the_current_model() -> None:
    state = decode_checkpoint(encode_legacy(v1_payload(), 1), "/s/state.json")
    excl = state.assignments["run/10"]
    assert (excl.kind, excl.cpus, excl.withheld, excl.pid) == ("exclusive", C("1-2"), C("1-2"), 10)
    assert excl.process is not None and excl.process.start_time is None, "v1 knew no start time"
    assert excl.mems == C(""), "v1 knew no mems"
    shared = state.assignments["run/11"]
    assert shared.kind == "shared" and shared.cpus == C("")
    assert state.revision == 3 and state.reserved == C("0")
    assert all(MIGRATIONS.get(v) is not None for v in (1, 2, 3)) and CURRENT_VERSION == 4


def test_a_version_2_checkpoint_written_by_corepin_0_1_keeps_every_assignment() -> None:
    """tests/data/state-v2-corepin-0.1.0.json was written by corepin 0.1.0 (commit 0249315):
    runs, a shared and a mixed run, a pinned container and three kubelet imports."""
    raw = (DATA / "state-v2-corepin-0.1.0.json").read_bytes()
    old = json.loads(raw)["payload"]
    state = decode_checkpoint(raw, "/s/state.json")
    assert sorted(state.assignments) == sorted(row["id"] for row in old["assignments"])
    for row in old["assignments"]:
        a = state.assignments[row["id"]]
        assert (a.kind, str(a.cpus), str(a.withheld), str(a.mems), a.level) == (
            row["kind"],
            row["cpus"],
            row["reserved"],
            row["mems"],
            row["level"],
        )
        assert (a.created, a.policy, a.cgroup, a.pid) == (
            row["created"],
            row["policy"],
            row["cgroup"],
            row["pid"],
        )
    run = state.assignments["run-4242-beef"].process
    assert run is not None
    assert (run.pid, run.start_time, run.runner_pid, run.runner_start_time) == (
        4242,
        987654,
        4240,
        987650,
    )
    assert (run.name, run.command, run.cgroup) == ("iperf", "iperf3 -s", "corepin/run-4242-beef")
    pinned = state.assignments["ctr-0123456789ab"].container
    assert pinned is not None and pinned.container_id == "0123456789abcdef"
    imported = state.assignments["pod/0f1e2d3c-aaaa-bbbb-cccc-000000000001/app"].container
    assert imported is not None
    assert (imported.pod_uid, imported.container) == ("0f1e2d3c-aaaa-bbbb-cccc-000000000001", "app")
    v1_entry = state.assignments["container/deadbeef"].container
    assert v1_entry is not None and v1_entry.container_id == "deadbeef"
    pod_level = state.assignments["pod/0f1e2d3c-aaaa-bbbb-cccc-000000000002"].container
    assert pod_level is not None and pod_level.container == ""
    assert (state.revision, str(state.online), str(state.reserved)) == (41, "0-15", "0")
    assert state.strict_reservation and state.isolated == C("") and state.infra == C("")
    assert decode_checkpoint(encode_checkpoint(state), "again") == state


def test_a_migrated_checkpoint_is_written_back_in_the_current_version(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    Path(store.path).write_bytes(encode_legacy(v1_payload(), 1))
    with store.transaction() as tx:
        tx.commit(tx.state)
    doc = json.loads(Path(store.path).read_bytes())
    assert doc["version"] == CURRENT_VERSION
    assert doc["payload"]["assignments"][0]["owner"]["start_time"] is None
    assert doc["payload"]["revision"] == 4


def test_a_broken_version_1_checkpoint_names_the_field() -> None:
    p = v1_payload()
    p["assignments"][0]["exclusive"] = "yes"
    with pytest.raises(
        StateFormatError, match=r"/s/state.json: payload.assignments\[0\].exclusive"
    ):
        decode_checkpoint(encode_legacy(p, 1), "/s/state.json")


def test_a_version_1_file_with_a_bad_checksum_is_refused_before_migration() -> None:
    data = encode_legacy(v1_payload(), 1).replace(b'"1-2"', b'"1-3"')
    with pytest.raises(StateFormatError, match="checksum mismatch"):
        decode_checkpoint(data, "f")


def test_canonical_bytes_are_independent_of_key_order() -> None:
    assert canonical_bytes({"b": 1, "a": [1, {"z": 0, "y": 1}]}) == b'{"a":[1,{"y":1,"z":0}],"b":1}'
