"""The pure half of a live move (`corepin.agent.node.move.relocate`): same size, kind and
level, only free CPUs or its own, never a container on a reservation."""

from __future__ import annotations

import pytest

from corepin.agent.node.move import relocate
from corepin.core.cpuset import CPUSet
from corepin.core.errors import AllocationError, RequestError
from corepin.state.model import Assignment, HostState
from corepin.state.owners import ContainerOwner
from corepin.state.reservations import Reservation
from corepin.testing import machines as synthetic

C = CPUSet.parse
TOPO = synthetic.named("dual_socket_ht")


def _exclusive(ident: str, cpus: str, *, reservation: str | None = None) -> Assignment:
    owner = ContainerOwner(pod_uid=ident, container="app", namespace="default", pod=ident)
    return Assignment(
        id=f"pod/{ident}/app",
        kind="exclusive",
        cpus=C(cpus),
        withheld=C(cpus),
        mems=TOPO.mems_of(C(cpus)),
        owner=owner,
        reservation=reservation,
    )


def test_a_move_takes_the_new_cpus_and_frees_the_old() -> None:
    state = HostState.new(TOPO).add(_exclusive("a", "2-3"))
    moved, m = relocate(state, "pod/a/app", C("4-5"), CPUSet(), TOPO, "test")
    new = moved.get("pod/a/app")
    assert new is not None and new.cpus == C("4-5") and new.withheld == C("4-5")
    assert C("2-3") <= moved.free and not C("4-5") & moved.free
    assert m.old.cpus == C("2-3") and m.new.cpus == C("4-5")
    assert "2-3 -> 4-5" in m.message


def test_a_move_onto_held_cpus_is_refused_and_nothing_changes() -> None:
    state = HostState.new(TOPO).add(_exclusive("a", "2-3")).add(_exclusive("b", "4-5"))
    with pytest.raises(AllocationError, match="cannot move"):
        relocate(state, "pod/a/app", C("4-5"), CPUSet(), TOPO, "test")
    with pytest.raises(RequestError, match="keeps the size"):
        relocate(state, "pod/a/app", C("6-8"), CPUSet(), TOPO, "test")
    with pytest.raises(RequestError, match="no assignment"):
        relocate(state, "pod/zz/app", C("6-7"), CPUSet(), TOPO, "test")


def test_a_container_on_a_reservation_is_not_moved() -> None:
    state = HostState.new(TOPO).add_reservation(Reservation("r1", C("2-3")))
    state = state.add(_exclusive("a", "2-3", reservation="r1"))
    with pytest.raises(RequestError, match="reservation"):
        relocate(state, "pod/a/app", C("6-7"), CPUSet(), TOPO, "test")
