"""The fake API server's PodDisruptionBudget arithmetic (its disruption controller) and the
eviction handler's promise, as properties: the status follows the formulas of the real
controller for any pods and budget, and no order of evictions takes a budget's healthy pods
below `minAvailable`."""

from __future__ import annotations

import datetime as dt
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from corepin.testing.fakeapi import Cluster
from corepin.testing.fakeapi.cluster import WriteOptions
from corepin.testing.fakeapi.disruption import pdb_status
from corepin.testing.fakeapi.errors import ApiFailure

NOW = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)


def _pod(name: str, app: str, ready: bool) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"app": app}},
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def _ceil_percent(text: str, total: int) -> int:
    return -(-int(text[:-1]) * total // 100)


budgets = st.one_of(
    st.builds(lambda n: {"minAvailable": n}, st.integers(0, 12)),
    st.builds(lambda p: {"minAvailable": f"{p}%"}, st.integers(0, 100)),
    st.builds(lambda n: {"maxUnavailable": n}, st.integers(0, 12)),
    st.builds(lambda p: {"maxUnavailable": f"{p}%"}, st.integers(0, 100)),
)


@given(
    pods=st.lists(st.tuples(st.sampled_from(["web", "db"]), st.booleans()), max_size=10),
    budget=budgets,
)
def test_the_status_follows_the_controllers_formulas(
    pods: list[tuple[str, bool]], budget: dict[str, Any]
) -> None:
    objects = [_pod(f"p{i}", app, ready) for i, (app, ready) in enumerate(pods)]
    pdb = {
        "metadata": {"name": "b", "generation": 3},
        "spec": {"selector": {"matchLabels": {"app": "web"}}, **budget},
    }
    status = pdb_status(pdb, objects, NOW)
    selected = [r for app, r in pods if app == "web"]
    expected = len(selected)
    healthy = sum(selected)
    if "maxUnavailable" in budget:
        value = budget["maxUnavailable"]
        gone = _ceil_percent(value, expected) if isinstance(value, str) else value
        desired = max(0, expected - gone)
    else:
        value = budget["minAvailable"]
        desired = _ceil_percent(value, expected) if isinstance(value, str) else value
    allowed = max(0, healthy - desired) if expected > 0 else 0
    assert (status["expectedPods"], status["currentHealthy"]) == (expected, healthy)
    assert (status["desiredHealthy"], status["disruptionsAllowed"]) == (desired, allowed)
    assert status["observedGeneration"] == 3
    (cond,) = status["conditions"]
    assert cond["status"] == ("True" if allowed > 0 else "False")


@given(
    ready=st.lists(st.booleans(), min_size=1, max_size=8),
    min_available=st.integers(0, 8),
    order=st.randoms(use_true_random=False),
)
def test_no_order_of_evictions_breaks_min_available(
    ready: list[bool], min_available: int, order: Any
) -> None:
    cluster = Cluster()
    pods = cluster.resource("", "v1", "pods")
    opts = WriteOptions(field_manager="test")
    names = [f"p{i}" for i in range(len(ready))]
    for name, is_ready in zip(names, ready, strict=True):
        body = {
            "metadata": {"name": name, "labels": {"app": "web"}},
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "x:1"}]},
        }
        cluster.create(pods, "default", body, opts)
        cluster.patch(
            pods,
            "default",
            name,
            "application/merge-patch+json",
            _pod(name, "web", is_ready),
            opts,
            "status",
        )
    budget = {
        "metadata": {"name": "b"},
        "spec": {"minAvailable": min_available, "selector": {"matchLabels": {"app": "web"}}},
    }
    cluster.create(cluster.resource("policy", "v1", "poddisruptionbudgets"), "default", budget)
    order.shuffle(names)
    for name in names:
        try:
            cluster.evict("default", name, {"metadata": {"name": name}}, [])
        except ApiFailure as refused:
            assert refused.code == 429
    left = {k[1] for k in cluster.objects[("", "pods")]}
    healthy = sum(ready)
    # ready pods go while more than minAvailable are healthy, never below it
    assert sum(1 for i, r in enumerate(ready) if r and f"p{i}" in left) == min(
        healthy, min_available
    )
    if 0 < min_available <= healthy:
        # the budget stays met all along: every unready pod could go without charging it
        assert all(r for i, r in enumerate(ready) if f"p{i}" in left)
