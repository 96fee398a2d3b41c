"""The devices a run's CPUs were chosen near, in the state model, the checkpoint and the report
data: written and read back, old checkpoints without them still readable."""

from __future__ import annotations

import pytest

from corepin.core.cpuset import CPUSet
from corepin.core.errors import InputError, StateFormatError
from corepin.state import Assignment, HostState, ProcessOwner
from corepin.state.checkpoint import decode_checkpoint, encode_checkpoint, encode_legacy
from corepin.state.payload import CURRENT_VERSION, state_to_payload
from corepin.state.report import report_data

C = CPUSet.parse


def state_with(*assignments: Assignment) -> HostState:
    s = HostState(online=C("0-7"))
    for a in assignments:
        s = s.add(a)
    return s


def two_runs() -> HostState:
    return state_with(
        Assignment("gpu", cpus=C("4-5"), owner=ProcessOwner(7, 3), near=("nvidia1", "eth1")),
        Assignment("plain", cpus=C("2"), owner=ProcessOwner(8, 4)),
    )


def test_the_devices_round_trip_through_the_checkpoint_in_order() -> None:
    s = two_runs()
    back = decode_checkpoint(encode_checkpoint(s), "mem")
    assert back == s
    assert back.assignments["gpu"].near == ("nvidia1", "eth1")
    assert back.assignments["plain"].near == ()
    rows = {r["id"]: r for r in state_to_payload(s)["assignments"]}
    assert rows["gpu"]["near"] == ["nvidia1", "eth1"] and rows["plain"]["near"] == []


@pytest.mark.parametrize("old", ["absent", "null"])
def test_a_checkpoint_without_devices_reads_every_run_as_near_none(old: str) -> None:
    payload = state_to_payload(two_runs())
    for row in payload["assignments"]:
        if old == "absent":
            del row["near"]
        else:
            row["near"] = None
    state = decode_checkpoint(encode_legacy(payload, CURRENT_VERSION), "/s/state.json")
    assert {a.id: a.near for a in state} == {"gpu": (), "plain": ()}


@pytest.mark.parametrize(
    ("value", "problem"),
    [("eth1", "expected a list of strings"), ([""], "non-empty string"), ([3], "non-empty")],
    ids=["a string", "an empty name", "a number"],
)
def test_bad_devices_in_a_checkpoint_are_a_format_error_naming_the_row(
    value: object, problem: str
) -> None:
    payload = state_to_payload(two_runs())
    payload["assignments"][0]["near"] = value
    with pytest.raises(StateFormatError, match=problem) as err:
        decode_checkpoint(encode_legacy(payload, CURRENT_VERSION), "/s/state.json")
    assert "/s/state.json" in str(err.value) and "'gpu'" in str(err.value)


def test_the_model_refuses_names_that_are_not_strings_and_takes_a_list() -> None:
    assert Assignment("x", cpus=C("1"), near=["eth0"]).near == ("eth0",)  # type: ignore[arg-type]
    with pytest.raises(InputError, match="near must be device names"):
        Assignment("x", cpus=C("1"), near=("",))


def test_the_report_data_lists_each_runs_devices() -> None:
    rows = {r["id"]: r for r in report_data(two_runs())["allocations"]}
    assert rows["gpu"]["near"] == ["nvidia1", "eth1"] and rows["plain"]["near"] == []
