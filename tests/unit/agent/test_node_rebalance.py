"""Rebalancing in the node agent, the parts without an agent: which containers may move
(`movables`: opt-out annotations, reservations, given CPUs, running containers), the rate limit
(a token bucket on an injected clock), advice told once per container and advice, moves
limited by the bucket, and the settings and flags."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from corepin.agent.node.hooks import Hooks
from corepin.agent.node.metrics import AgentMetrics
from corepin.agent.node.rebalance import (
    ADVISED,
    RateLimit,
    Rebalancer,
    advice,
    check_mode,
    movables,
    opted_out,
    running_containers,
)
from corepin.agent.node.settings import NodeSettings
from corepin.allocation.policies import get_policy
from corepin.allocation.rebalance import Alignment, Move
from corepin.cli import agent_cmd
from corepin.core.cpuset import CPUSet
from corepin.core.errors import InputError
from corepin.state.kubelet import KUBELET_POLICY
from corepin.state.model import Assignment, HostState
from corepin.state.owners import ContainerOwner
from corepin.state.reservations import Reservation
from corepin.testing.machines import SyntheticSpec, synthetic

C = CPUSet.parse
#: 2 NUMA nodes of 6 CPUs, no SMT: node 0 = CPUs 0-5, node 1 = CPUs 6-11
TOPO = synthetic(
    SyntheticSpec(numa_per_socket=2, cores_per_l3=6, threads_per_core=1, numbering="linear")
)


def _cid(name: str) -> str:
    return (name.encode().hex() * 64)[:64]


def _exclusive(
    name: str,
    cpus: str,
    *,
    container: str = "app",
    kind: str = "exclusive",
    policy: str = "",
    reservation: str | None = None,
    cgroup: str | None = "kubepods/x",
) -> Assignment:
    owner = ContainerOwner(
        pod_uid=f"uid-{name}",
        container=container,
        namespace="default",
        pod=name,
        container_id=_cid(name),
        runtime="containerd",
        cgroup=cgroup,
    )
    return Assignment(
        id=f"pod/uid-{name}/{container}",
        kind=kind,
        cpus=C(cpus),
        withheld=C(cpus),
        mems=TOPO.mems_of(C(cpus)),
        owner=owner,
        policy=policy,
        reservation=reservation,
    )


def _pod(
    name: str,
    annotations: Mapping[str, str] | None = None,
    *,
    running: bool = True,
    cid: str | None = None,
    deleting: bool = False,
    uid: str | None = None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": "default",
        "uid": uid or f"uid-{name}",
        "annotations": dict(annotations or {}),
    }
    if deleting:
        meta["deletionTimestamp"] = "2026-11-22T00:00:00Z"
    state = {"running": {"startedAt": "x"}} if running else {"waiting": {"reason": "x"}}
    return {
        "metadata": meta,
        "spec": {"containers": [{"name": "app"}]},
        "status": {
            "containerStatuses": [
                {
                    "name": "app",
                    "containerID": f"containerd://{cid or _cid(name)}",
                    "state": state,
                }
            ]
        },
    }


def _getter(*pods: dict[str, Any]) -> Any:
    table = {(p["metadata"]["namespace"], p["metadata"]["name"]): p for p in pods}
    return lambda namespace, name: table.get((namespace, name))


# ---------------------------------------------------------------------- selection


@pytest.mark.parametrize(
    ("annotations", "out"),
    [
        ({}, False),
        ({"corepin.io/rebalance": "never"}, True),
        ({"corepin.io/rebalance": " Never "}, True),
        ({"corepin.io/rebalance": "always"}, False),
        ({"corepin.io/rebalance.app": "never"}, True),
        ({"corepin.io/rebalance.other": "never"}, False),
        # the container's own annotation wins over the pod's
        ({"corepin.io/rebalance": "never", "corepin.io/rebalance.app": "allowed"}, False),
        ({"corepin.io/rebalance": "yes", "corepin.io/rebalance.app": "never"}, True),
    ],
)
def test_opted_out(annotations: dict[str, str], out: bool) -> None:
    assert opted_out(_pod("a", annotations), "app") is out


def test_running_containers_are_named_by_their_ids() -> None:
    assert running_containers(_pod("a")) == {"app": _cid("a")}
    assert running_containers(_pod("a", running=False)) == {}
    assert running_containers({"status": {"containerStatuses": "nonsense"}}) == {}


def test_movables_leave_out_what_must_not_move() -> None:
    state = HostState.new(TOPO).add_reservation(Reservation("r1", C("10-11")))
    rows = {
        "ok": _exclusive("ok", "0-1"),
        "never": _exclusive("never", "2"),
        "never-app": _exclusive("never-app", "3"),
        "reserved": _exclusive("reserved", "10-11", reservation="r1"),
        "binding": _exclusive("binding", "4", policy="binding"),
        "kubelet": _exclusive("kubelet", "5", policy=KUBELET_POLICY),
        "share": _exclusive("share", "6", kind="share"),
        "shared": _exclusive("shared", "", kind="shared"),
        "stopped": _exclusive("stopped", "7"),
        "restarted": _exclusive("restarted", "8"),
        "gone": _exclusive("gone", "9"),
        "deleting": _exclusive("deleting", "6-7"),
        "nocgroup": _exclusive("nocgroup", "8-9", cgroup=None),
    }
    # (several sets overlap: each case on a state of its own, with "ok" beside it)
    pods = _getter(
        _pod("ok"),
        _pod("never", {"corepin.io/rebalance": "never"}),
        _pod("never-app", {"corepin.io/rebalance.app": "never"}),
        _pod("reserved"),
        _pod("binding"),
        _pod("kubelet"),
        _pod("share"),
        _pod("shared"),
        _pod("stopped", running=False),
        _pod("restarted", cid="f" * 64),
        _pod("deleting", deleting=True),
        _pod("nocgroup"),
    )
    for name, a in rows.items():
        base = state.add(rows["ok"]) if name == "ok" else state.add(rows["ok"]).add(a)
        assert {m.id for m in movables(base, pods)} == {rows["ok"].id}, name
    moved = movables(state.add(rows["ok"]), pods)[0]
    assert (moved.cpus, moved.withheld, moved.level, moved.kind) == (
        C("0-1"),
        C("0-1"),
        "cpu",
        "exclusive",
    )


def test_a_pod_of_another_uid_under_the_same_name_is_not_the_container() -> None:
    state = HostState.new(TOPO).add(_exclusive("a", "0-1"))
    assert movables(state, _getter(_pod("a", uid="someone-else"))) == []


# ---------------------------------------------------------------------- rate limit


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_the_bucket_starts_full_and_refills_a_minute_s_worth() -> None:
    clock = Clock()
    bucket = RateLimit(6, clock)
    assert bucket.available() == 6
    for _ in range(6):
        bucket.take()
    assert bucket.available() == 0
    clock.now += 9.9
    assert bucket.available() == 0
    clock.now += 0.1  # 10 s: one move at 6 a minute
    assert bucket.available() == 1
    clock.now += 3600  # never more than a minute's worth
    assert bucket.available() == 6
    clock.now -= 500  # a clock that goes back gives nothing, takes nothing
    assert bucket.available() == 6


def test_rate_zero_allows_nothing_ever() -> None:
    clock = Clock()
    bucket = RateLimit(0, clock)
    clock.now += 1e6
    assert bucket.available() == 0


@given(
    rate=st.integers(1, 20),
    steps=st.lists(st.tuples(st.floats(0, 30), st.integers(0, 5)), max_size=40),
)
def test_no_window_sees_more_than_its_share_of_moves(
    rate: int, steps: list[tuple[float, int]]
) -> None:
    """Whatever the caller asks, the moves taken in any stretch of T seconds are at most
    rate + rate * T / 60 (the burst and the refill)."""
    clock = Clock(0.0)
    bucket = RateLimit(rate, clock)
    taken: list[float] = []
    for wait, want in steps:
        clock.now += wait
        for _ in range(min(want, bucket.available())):
            bucket.take()
            taken.append(clock.now)
    for i, start in enumerate(taken):
        for j in range(i, len(taken)):
            span = taken[j] - start
            assert j - i + 1 <= rate + rate * span / 60 + 1e-6


# ---------------------------------------------------------------------- the rebalancer


class Events:
    def __init__(self) -> None:
        self.told: list[tuple[str, str, str, str]] = []

    def event(self, pod: Mapping[str, Any], kind: str, reason: str, message: str) -> None:
        self.told.append((pod["metadata"]["name"], kind, reason, message))


class Counting(Hooks):
    def __init__(self) -> None:
        self.advised = 0
        self.moves: list[float] = []

    def rebalance_advised(self) -> None:
        self.advised += 1

    def rebalance_moved(self, seconds: float) -> None:
        self.moves.append(seconds)


class FakeMover:
    """Applies a move to the state the rebalancer reads (as the real mover commits it)."""

    def __init__(self, box: list[HostState]) -> None:
        self.box = box
        self.calls: list[tuple[str, CPUSet, CPUSet, str]] = []

    def move_container(self, ident: str, new: CPUSet, withheld: CPUSet, reason: str) -> None:
        self.calls.append((ident, new, withheld, reason))
        state = self.box[0]
        a = state.get(ident)
        assert a is not None
        self.box[0] = state.replace_assignment(
            a.evolve(cpus=new, withheld=withheld, mems=TOPO.mems_of(new))
        )


def _fragmented(*straddlers: str, fill: str = "") -> HostState:
    """Each straddler holds 3 CPUs on both nodes (5-7, then 4,8-9); `fill`: CPUs held by a
    container that never moves (its CPUs given by a binding)."""
    state = HostState.new(TOPO)
    if fill:
        state = state.add(_exclusive("filler", fill, policy="binding"))
    for name, cpus in zip(straddlers, ("5-7", "4,8-9"), strict=False):
        state = state.add(_exclusive(name, cpus))
    return state


def _rebalancer(
    mode: str, state: HostState, *pods: dict[str, Any], rate: int = 6, clock: Clock | None = None
) -> tuple[Rebalancer, Events, Counting, FakeMover, list[HostState]]:
    box = [state]
    events, hooks, mover = Events(), Counting(), FakeMover(box)
    reb = Rebalancer(
        mode,
        rate,
        TOPO,
        get_policy("topology-aware"),
        clock or Clock(),
        state=lambda: box[0],
        pod_of=_getter(*pods),
        promised=lambda s: CPUSet(),
        events=events,  # type: ignore[arg-type]
        hooks=hooks,
        mover=mover,  # type: ignore[arg-type]
    )
    return reb, events, hooks, mover, box


def test_report_advises_once_per_container_and_advice() -> None:
    state = _fragmented("s1")
    reb, events, hooks, mover, box = _rebalancer("report", state, _pod("s1"))
    reb.run()
    reb.run()
    assert len(events.told) == 1 and hooks.advised == 1 and not mover.calls
    name, kind, reason, message = events.told[0]
    assert (name, kind, reason) == ("s1", "Normal", ADVISED)
    assert "CPUs 5-7 span 2 NUMA nodes" in message and "1 NUMA node" in message
    # the container changed CPUs (here by hand): advice about it is new again
    a = box[0].get("pod/uid-s1/app")
    assert a is not None
    box[0] = box[0].replace_assignment(a.evolve(cpus=C("4,6-7"), withheld=C("4,6-7")))
    reb.run()
    assert len(events.told) == 2


def test_move_follows_the_plan_within_the_rate() -> None:
    clock = Clock()
    state = _fragmented("s1", "s2")
    reb, events, hooks, mover, box = _rebalancer(
        "move", state, _pod("s1"), _pod("s2"), rate=1, clock=clock
    )
    assert len(reb.plan()) == 1, "one token: one move planned"
    reb.run()
    assert len(mover.calls) == 1 and len(hooks.moves) == 1 and not events.told
    ident, new, _withheld, reason = mover.calls[0]
    moved = box[0].get(ident)
    assert moved is not None and moved.cpus == new and len(TOPO.numa_nodes_in(new)) == 1
    assert "rebalanced" in reason
    reb.run()
    assert len(mover.calls) == 1, "the bucket is empty"
    clock.now += 60
    reb.run()
    assert len(mover.calls) == 2


def test_off_plans_nothing_and_after_batch_waits_for_a_reason() -> None:
    state = _fragmented("s1")
    reb, _events, _hooks, mover, _ = _rebalancer("off", state, _pod("s1"))
    assert reb.plan() == ()
    reb.after_batch(["resync"], state, state)
    assert not mover.calls
    reb, _events, _hooks, mover, _ = _rebalancer("move", state, _pod("s1"))
    reb.after_batch(["pod"], state, state)  # nothing freed, no timer: no pass
    assert not mover.calls
    reb.after_batch(["heartbeat"], state, state)
    assert len(mover.calls) == 1


def test_promised_cpus_are_never_taken() -> None:
    state = _fragmented("s1", fill="3-4,8-11")  # free: 0-2, promised to a pod
    reb, _events, _hooks, mover, _ = _rebalancer("move", state, _pod("s1"), _pod("filler"))
    assert len(reb.plan()) == 1, "the setting: 0-2 would do"
    reb.promised = lambda s: C("0-2")
    reb.run()
    assert not mover.calls


def test_the_advice_names_both_sets() -> None:
    move = Move("x", C("5-7"), C("0-2"), C("0-2"), Alignment(2, 2, 0), Alignment(1, 1, 0))
    text = advice(move, "app")
    assert "'app'" in text and "5-7" in text and "0-2" in text
    assert "corepin.io/rebalance: never" in text


# ---------------------------------------------------------------------- settings and flags


def test_modes_and_rates_are_checked() -> None:
    check_mode("move", 0)
    with pytest.raises(InputError, match="--rebalance mode 'sometimes'"):
        check_mode("sometimes", 6)
    with pytest.raises(InputError, match="--rebalance-rate"):
        check_mode("move", -1)
    with pytest.raises(InputError, match="--rebalance mode"):
        NodeSettings(node_name="n", state_dir="/tmp/x", rebalance="yes")
    with pytest.raises(InputError, match="--rebalance-rate"):
        NodeSettings(node_name="n", state_dir="/tmp/x", rebalance_rate=-2)


def test_the_flags_reach_the_settings() -> None:
    parser = argparse.ArgumentParser()
    agent_cmd.add_arguments(parser, "agent")
    args = parser.parse_args(["--node-name", "n", "--state-dir", "/tmp/x"])
    settings = agent_cmd.settings_from(args, {})
    assert (settings.rebalance, settings.rebalance_rate) == ("report", 6)
    args = parser.parse_args(
        ["--node-name", "n", "--state-dir", "/tmp/x", "--rebalance", "move", "--rebalance-rate=0"]
    )
    settings = agent_cmd.settings_from(args, {})
    assert (settings.rebalance, settings.rebalance_rate) == ("move", 0)
    for bad in (["--rebalance", "maybe"], ["--rebalance-rate", "-1"], ["--rebalance-rate", "x"]):
        with pytest.raises(SystemExit):
            parser.parse_args(["--node-name", "n", *bad])


def test_the_metrics() -> None:
    metrics = AgentMetrics()
    metrics.rebalance_advised()
    metrics.rebalance_moved(0.004)
    metrics.rebalance_moved(-1.0)
    get = metrics.registry.get_sample_value
    assert get("corepin_rebalance_advised_total") == 1
    assert get("corepin_rebalance_moves_total") == 2
    assert get("corepin_rebalance_move_seconds_count") == 2
    assert get("corepin_rebalance_move_seconds_bucket", {"le": "0.005"}) == 2
