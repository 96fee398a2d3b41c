"""The worked examples of the README's Policies section stay true (same machine, same answers)."""

from __future__ import annotations

import pytest

from corepin import CPUSet
from corepin.allocation.api import decide
from corepin.core.errors import SMTAlignmentError
from corepin.testing.machines import SyntheticSpec, synthetic

M32 = synthetic(SyntheticSpec(sockets=2, numa_per_socket=2))


@pytest.mark.parametrize(
    ("count", "available", "options", "policy", "cpus", "reserved"),
    [
        pytest.param(
            4,
            "2-15,17-31",
            (),
            "topology-aware",
            "2-3,18-19",
            "2-3,18-19",
            id="four CPUs fill the partly used node 0 so the empty nodes stay whole",
        ),
        pytest.param(
            6,
            "2-3,6-15,17-19,21-31",
            (),
            "topology-aware",
            "8-10,24-26",
            "8-10,24-26",
            id="six CPUs take one whole node on socket 1 instead of splitting two nodes",
        ),
        pytest.param(
            6,
            "2-3,6-15,17-19,21-31",
            (),
            "kubelet-static",
            "2-3,6,18-19,22",
            "2-3,6,18-19,22",
            id="the kubelet's packing splits the same six CPUs over nodes 0 and 1",
        ),
        pytest.param(
            1,
            "1-31",
            ("level=core",),
            "topology-aware",
            "1",
            "1,17",
            id="level core withholds the sibling of the chosen CPU",
        ),
        pytest.param(
            2,
            "1-31",
            ("level=numa",),
            "topology-aware",
            "4,20",
            "4-7,20-23",
            id="level numa takes an entirely free node and withholds all of it",
        ),
    ],
)
def test_readme_policy_example(
    count: int, available: str, options: tuple[str, ...], policy: str, cpus: str, reserved: str
) -> None:
    decision = decide(M32, count, available=CPUSet.parse(available), policy=policy, options=options)
    assert str(decision.cpus) == cpus
    assert str(decision.withheld) == reserved


def test_readme_full_pcpus_only_example_refuses_an_odd_count() -> None:
    with pytest.raises(SMTAlignmentError) as info:
        decide(M32, 3, policy="topology-aware", options=("full-pcpus-only",))
    assert info.value.reason == "smt_alignment"
