"""Lease-based leader election against the fake: one leader among contenders, takeover only
after the lease expires as observed locally, release on stop, renew deadline."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from corepin.core.errors import RequestError
from corepin.kube.client import KubeClient
from corepin.kube.leader import LeaderElector
from corepin.kube.resources import LEASES
from corepin.testing.fakeapi import FakeApiServer


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def elector(
    kube: KubeClient, identity: str, clock: Callable[[], float] = time.monotonic, **kwargs: object
) -> LeaderElector:
    return LeaderElector(
        kube, "kube-system", "corepin-controller", identity, monotonic=clock, **kwargs
    )  # type: ignore[arg-type]


def lease(kube: KubeClient) -> dict[str, object]:
    spec: dict[str, object] = kube.get(LEASES, "corepin-controller", "kube-system")["spec"]
    return spec


def test_the_first_contender_creates_the_lease_and_the_second_waits(kube: KubeClient) -> None:
    clock = Clock()
    a, b = elector(kube, "a", clock), elector(kube, "b", clock)
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()
    assert b.leader == "a"
    spec = lease(kube)
    assert spec["holderIdentity"] == "a" and spec["leaseDurationSeconds"] == 15
    assert spec["leaseTransitions"] == 0
    assert str(spec["renewTime"]).endswith("Z") and "." in str(spec["renewTime"])


def test_takeover_happens_only_after_the_lease_expires_locally(kube: KubeClient) -> None:
    clock = Clock()
    a, b = elector(kube, "a", clock), elector(kube, "b", clock)
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()
    clock.now += 14
    assert not b.try_acquire_or_renew()  # a's record unchanged for 14 s < 15 s
    assert a.try_acquire_or_renew()  # a renews: the record changes, b's timer restarts
    clock.now += 14
    assert not b.try_acquire_or_renew()
    clock.now += 16
    assert b.try_acquire_or_renew()
    spec = lease(kube)
    assert spec["holderIdentity"] == "b" and spec["leaseTransitions"] == 1
    assert not a.try_acquire_or_renew()


def race(kube: KubeClient, name: str, count: int) -> list[str]:
    """`count` contenders try for a fresh lease at the same moment; who won."""
    contenders = [LeaderElector(kube, "default", name, f"c{i}") for i in range(count)]
    barrier = threading.Barrier(count)
    wins: list[str] = []

    def attempt(one: LeaderElector) -> None:
        barrier.wait()
        if one.try_acquire_or_renew():
            wins.append(one.identity)

    threads = [threading.Thread(target=attempt, args=(c,)) for c in contenders]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(5)
    return wins


def test_racing_contenders_never_both_win(kube: KubeClient) -> None:
    for round_ in range(10):
        name = f"race-{round_}"
        wins = race(kube, name, 4)
        holder = kube.get(LEASES, name, "default")["spec"]["holderIdentity"]
        assert wins == [holder], (round_, wins, holder)


def test_leader_loops_hand_over_on_stop(kube: KubeClient) -> None:
    started: list[str] = []
    stopped: list[str] = []

    def make(identity: str) -> LeaderElector:
        return LeaderElector(
            kube,
            "kube-system",
            "corepin-controller",
            identity,
            lease_duration=1.5,
            renew_deadline=1.0,
            retry_period=0.1,
            on_started_leading=lambda: started.append(identity),
            on_stopped_leading=lambda: stopped.append(identity),
        )

    first, second = make("first").start(), make("second").start()
    deadline = time.monotonic() + 5
    while not started and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(started) == 1
    leader, follower = (first, second) if started[0] == "first" else (second, first)
    time.sleep(0.5)
    assert leader.is_leader and not follower.is_leader and len(started) == 1
    began = time.monotonic()
    assert leader.stop(3)
    while len(started) < 2 and time.monotonic() < began + 5:
        time.sleep(0.02)
    # released, so the follower takes over well before the 1.5 s lease would have expired
    assert started == [leader.identity, follower.identity]
    assert time.monotonic() - began < 1.2
    assert stopped == [leader.identity]
    assert follower.stop(3)
    assert lease(kube)["holderIdentity"] == ""


def test_a_leader_that_cannot_renew_steps_down(kube: KubeClient, fake_api: FakeApiServer) -> None:
    stopped = threading.Event()
    one = LeaderElector(
        kube,
        "kube-system",
        "corepin-controller",
        "solo",
        lease_duration=1.0,
        renew_deadline=0.6,
        retry_period=0.1,
        on_stopped_leading=stopped.set,
    ).start()
    deadline = time.monotonic() + 5
    while not one.is_leader and time.monotonic() < deadline:
        time.sleep(0.02)
    assert one.is_leader
    fake_api.inject(
        "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases", status=503, times=None
    )
    assert stopped.wait(3) and not one.is_leader
    assert one.stop(2)


def test_settings_must_be_ordered() -> None:
    with pytest.raises(RequestError, match="lease_duration > renew_deadline"):
        LeaderElector(None, "ns", "n", "me", lease_duration=5, renew_deadline=10)  # type: ignore[arg-type]
    with pytest.raises(RequestError, match="identity"):
        LeaderElector(None, "ns", "n", "")  # type: ignore[arg-type]
