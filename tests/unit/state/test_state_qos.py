"""An assignment's QoS class in the state model and the checkpoint: given or derived, written
and read back, old checkpoints without it still readable."""

from __future__ import annotations

import pytest

from corepin.allocation.qos import CLASSES, class_of
from corepin.core.cpuset import CPUSet
from corepin.core.errors import InputError, StateFormatError
from corepin.state import Assignment, ContainerOwner, HostState, ProcessOwner
from corepin.state.checkpoint import decode_checkpoint, encode_checkpoint, encode_legacy
from corepin.state.model import NODE_QOS_CLASSES, qos_name
from corepin.state.payload import CURRENT_VERSION, state_to_payload

C = CPUSet.parse


def container(qos: str) -> ContainerOwner:
    return ContainerOwner(pod_uid="u", container="c", qos=qos, cgroup="kubepods/podu/c")


def state_with(*assignments: Assignment) -> HostState:
    s = HostState(online=C("0-7"))
    for a in assignments:
        s = s.add(a)
    return s


def test_the_models_class_names_are_the_qos_packages() -> None:
    assert NODE_QOS_CLASSES == CLASSES


@pytest.mark.parametrize(
    ("assignment", "expected"),
    [
        (Assignment("e", cpus=C("1")), "LSE"),
        (Assignment("m", kind="mixed", cpus=C("1")), "LSE"),
        (Assignment("s", kind="share", cpus=C("1")), "LSR"),
        (Assignment("p", kind="shared", owner=ProcessOwner(5, 1)), "LS"),
        (Assignment("g", kind="shared", owner=container("guaranteed")), "LS"),
        (Assignment("b", kind="shared", owner=container("besteffort")), "BE"),
        (Assignment("x", kind="shared", owner=ProcessOwner(5, 1), qos="BE"), "BE"),
        (Assignment("y", cpus=C("1"), qos="SYSTEM"), "SYSTEM"),
    ],
    ids=[
        "an exclusive run is LSE",
        "a mixed run is LSE",
        "a share assignment is LSR",
        "a shared run is LS",
        "a guaranteed container on the shared pool is LS",
        "a best-effort container is BE",
        "a class given wins over the derived one",
        "an exclusive run may be given another class",
    ],
)
def test_the_effective_class_is_the_given_one_else_the_derived_one(
    assignment: Assignment, expected: str
) -> None:
    assert assignment.qos_class == expected
    assert assignment.best_effort == (expected == "BE")
    if assignment.qos is None:
        owner = assignment.container
        assert expected == class_of(assignment.kind, owner.qos if owner else None)


def test_a_class_is_taken_in_any_case_and_kept_canonical() -> None:
    assert Assignment("x", kind="shared", qos="be").qos == "BE"
    assert qos_name(" lsr ", "--qos-class") == "LSR"


def test_an_unknown_class_is_refused_naming_the_assignment_and_the_value() -> None:
    with pytest.raises(Exception, match=r"assignment 'x': qos: 'GOLD' is not a QoS class"):
        Assignment("x", kind="shared", qos="GOLD")
    with pytest.raises(Exception, match="--qos-class: 'gold'"):
        qos_name("gold", "--qos-class")


def test_a_class_round_trips_through_the_checkpoint() -> None:
    s = state_with(
        Assignment("be", kind="shared", owner=ProcessOwner(7, 3), qos="BE"),
        Assignment("ex", cpus=C("2-3"), owner=ProcessOwner(8, 4)),
    )
    back = decode_checkpoint(encode_checkpoint(s), "mem")
    assert back == s
    assert back.assignments["be"].qos == "BE" and back.assignments["ex"].qos is None
    rows = {r["id"]: r for r in state_to_payload(s)["assignments"]}
    assert rows["be"]["qos"] == "BE" and rows["ex"]["qos"] is None


def test_a_checkpoint_written_before_classes_reads_every_run_as_derived() -> None:
    payload = state_to_payload(
        state_with(
            Assignment("be", kind="shared", owner=ProcessOwner(7, 3)),
            Assignment("ex", cpus=C("2-3"), owner=ProcessOwner(8, 4)),
        )
    )
    for row in payload["assignments"]:
        del row["qos"]
    state = decode_checkpoint(encode_legacy(payload, CURRENT_VERSION), "/s/state.json")
    assert {a.id: (a.qos, a.qos_class) for a in state} == {
        "be": (None, "LS"),
        "ex": (None, "LSE"),
    }


@pytest.mark.parametrize(
    ("value", "problem"),
    [("GOLD", "is not a QoS class"), (3, "expected a string")],
    ids=["an unknown class", "a class that is a number"],
)
def test_a_bad_class_in_a_checkpoint_is_a_format_error_naming_the_row(
    value: object, problem: str
) -> None:
    payload = state_to_payload(state_with(Assignment("be", kind="shared", qos="BE")))
    payload["assignments"][0]["qos"] = value
    data = encode_legacy(payload, CURRENT_VERSION)
    with pytest.raises(StateFormatError, match=problem) as err:
        decode_checkpoint(data, "/s/state.json")
    assert "/s/state.json" in str(err.value) and "'be'" in str(err.value)


def test_the_class_survives_evolve_and_a_bad_one_is_refused_there_too() -> None:
    a = Assignment("x", kind="shared", qos="BE")
    assert a.evolve(cpus=C("1")).qos == "BE"
    assert a.evolve(qos=None).qos_class == "LS"
    with pytest.raises(InputError, match="'NOPE' is not a QoS class"):
        a.evolve(qos="NOPE")
