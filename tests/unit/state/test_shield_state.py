"""The shield in the state: its record survives the checkpoint (version 4) exactly, a version 3
checkpoint migrates keeping every assignment, a bad record is refused naming the field, and the
system set follows the pools (reserved CPUs plus the shared pool; on the reserved CPUs alone
when the shared pool is empty)."""

from __future__ import annotations

import json

import pytest

from corepin.core.cpuset import CPUSet
from corepin.core.errors import InputError, StateFormatError
from corepin.enforcement.shield.control import keep_system, normalize_scope, system_cpus
from corepin.state.checkpoint import decode_checkpoint, encode_checkpoint, encode_legacy
from corepin.state.model import STRICT_RESERVATION, Assignment, HostState
from corepin.state.owners import ProcessOwner
from corepin.state.payload import CURRENT_VERSION, state_to_payload
from corepin.state.shield import (
    MovedTask,
    RestrictedGroup,
    SavedAffinity,
    SavedIrq,
    ShieldRecord,
)

C = CPUSet.parse


def shielded_state() -> HostState:
    record = ShieldRecord(
        scope="batch.slice",
        mode="cpuset",
        cgroup_version=2,
        kthreads=True,
        irqs=False,
        since=1700000000.5,
        excluded=("corepin", "kubepods"),
        enabled=("", "batch.slice"),
        moved=(MovedTask(100, 5000, "batch.slice"), MovedTask(101, 5001, "batch.slice/x")),
        restricted=(
            RestrictedGroup("batch.slice/svc", ""),
            RestrictedGroup("batch.slice/y", "2-3"),
        ),
        kernel_threads=(SavedAffinity(11, 11, C("0-3")),),
        irq_affinity=(SavedIrq("24", C("0-3")), SavedIrq("default", C("0-3"))),
    )
    run = Assignment(
        "run-1", "exclusive", C("3"), owner=ProcessOwner(pid=4242, start_time=9, name="srv")
    )
    return HostState(online=C("0-3"), reserved=C("0"), assignments={"run-1": run}, shield=record)


def test_the_shield_record_round_trips_through_the_checkpoint() -> None:
    state = shielded_state()
    again = decode_checkpoint(encode_checkpoint(state), "state.json")
    assert again == state and again.shield == state.shield
    assert json.loads(encode_checkpoint(state))["version"] == CURRENT_VERSION == 4


def test_a_version_3_checkpoint_migrates_with_every_assignment_and_no_shield() -> None:
    state = shielded_state().evolve(shield=None)
    payload = state_to_payload(state)
    del payload["shield"]
    old = decode_checkpoint(encode_legacy(payload, 3), "state.json")
    assert old.shield is None and list(old.assignments) == ["run-1"]
    assert old.assignments["run-1"] == state.assignments["run-1"]


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("mode", "magic", "shield mode"),
        ("moved", [[1, 2]], "shield.moved"),
        ("irq_affinity", [["x", "0"]], "IRQ must be a number"),
        ("restricted", [["a\nb", "0"]], "control characters"),
        ("cgroup_version", 0, "a cpuset shield names cgroup version 1 or 2"),
    ],
)
def test_a_bad_shield_record_is_refused_naming_the_field(
    field: str, value: object, says: str
) -> None:
    payload = state_to_payload(shielded_state())
    payload["shield"][field] = value
    data = encode_legacy(payload, 4)
    with pytest.raises(StateFormatError) as info:
        decode_checkpoint(data, "/s/state.json")
    assert "/s/state.json: payload.shield" in str(info.value) and says in str(info.value)


def test_the_system_set_is_the_reserved_cpus_plus_the_shared_pool() -> None:
    state = shielded_state()
    assert system_cpus(state) == C("0-2"), "CPU 3 is held exclusively"
    strict = state.evolve(
        options={STRICT_RESERVATION: "true"},
        assignments={"run-1": state.assignments["run-1"].evolve(cpus=C("1-3"), withheld=C("1-3"))},
    )
    assert strict.shared_pool == CPUSet(), "strict: reserved CPUs are not in the shared pool"
    assert system_cpus(strict) == C("0"), "the system set lives on the reserved CPUs"
    assert not keep_system(strict), "with reserved CPUs the shared pool may go"
    assert keep_system(state.evolve(reserved=CPUSet())), "without, it must keep a CPU"
    assert not keep_system(state.evolve(shield=None, reserved=CPUSet()))


@pytest.mark.parametrize(
    ("given", "scope"), [("/", ""), ("", ""), ("/a/b/", "a/b"), ("batch.slice", "batch.slice")]
)
def test_scopes_are_cgroup_paths(given: str, scope: str) -> None:
    assert normalize_scope(given) == scope


@pytest.mark.parametrize("bad", ["../x", "a/../b", "a\nb"])
def test_a_scope_that_is_not_a_cgroup_path_is_refused(bad: str) -> None:
    with pytest.raises(InputError) as info:
        normalize_scope(bad)
    assert info.value.exit_code == 2
