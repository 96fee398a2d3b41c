"""The event recorder against the fake: core/v1 Events, count aggregation of repeats, folding of
similar events, the spam filter, re-creation after deletion, background writing."""

from __future__ import annotations

import datetime as dt

from corepin.kube.client import KubeClient
from corepin.kube.events import COMBINED_PREFIX, EventRecorder, ObjectReference
from corepin.kube.resources import EVENTS, EVENTS_V1, PODS
from corepin.testing.fakeapi import FakeApiServer
from support.pods import pod


class Clock:
    def __init__(self) -> None:
        self.wall = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)
        self.mono = 1000.0

    def advance(self, seconds: float) -> None:
        self.wall += dt.timedelta(seconds=seconds)
        self.mono += seconds


def recorder(kube: KubeClient, clock: Clock, **kwargs: object) -> EventRecorder:
    return EventRecorder(
        kube,
        "corepin-agent",
        host="node-1",
        clock=lambda: clock.wall,
        monotonic=lambda: clock.mono,
        **kwargs,
    )  # type: ignore[arg-type]


def events_of(kube: KubeClient, name: str) -> list[dict[str, object]]:
    found = kube.list(EVENTS, "default", field_selector=f"involvedObject.name={name}")
    return list(found["items"])


def test_an_event_names_its_object_and_source(kube: KubeClient) -> None:
    target = kube.create(PODS, pod("web"))
    written = recorder(kube, Clock()).event(target, "Normal", "CPUPinned", "app: cpus 2-3")
    assert written is not None
    [event] = events_of(kube, "web")
    assert event["involvedObject"] == {
        "kind": "Pod",
        "name": "web",
        "namespace": "default",
        "apiVersion": "v1",
        "uid": target["metadata"]["uid"],
        "resourceVersion": target["metadata"]["resourceVersion"],
    }
    assert (event["type"], event["reason"], event["message"], event["count"]) == (
        "Normal",
        "CPUPinned",
        "app: cpus 2-3",
        1,
    )
    assert event["source"] == {"component": "corepin-agent", "host": "node-1"}
    assert event["firstTimestamp"] == event["lastTimestamp"] == "2025-01-01T00:00:00Z"
    assert str(event["metadata"]["name"]).startswith("web.")  # type: ignore[index]


def test_repeats_are_aggregated_into_one_event_with_a_count(
    kube: KubeClient, fake_api: FakeApiServer
) -> None:
    target = kube.create(PODS, pod("web"))
    clock = Clock()
    events = recorder(kube, clock)
    for _ in range(3):
        events.event(target, "Warning", "CPUPinFailed", "no exclusive CPUs free")
        clock.advance(10)
    [event] = events_of(kube, "web")
    assert event["count"] == 3
    assert event["firstTimestamp"] == "2025-01-01T00:00:00Z"
    assert event["lastTimestamp"] == "2025-01-01T00:00:20Z"
    assert events.stats.created == 1 and events.stats.aggregated == 2
    assert len(fake_api.recorded(verb="patch", resource="events")) == 2
    # a different reason or message is a different event
    events.event(target, "Warning", "CPUPinFailed", "another reason")
    events.event(target, "Normal", "CPUPinned", "no exclusive CPUs free")
    assert len(events_of(kube, "web")) == 3


def test_a_deleted_event_is_written_again_with_its_count(kube: KubeClient) -> None:
    target = kube.create(PODS, pod("web"))
    events = recorder(kube, Clock())
    first = events.event(target, "Normal", "CPUMoved", "moved")
    assert first is not None
    kube.delete(EVENTS, first["metadata"]["name"], "default")
    again = events.event(target, "Normal", "CPUMoved", "moved")
    assert again is not None and again["count"] == 2
    assert again["metadata"]["name"] == first["metadata"]["name"]
    assert (again["type"], again["reason"]) == ("Normal", "CPUMoved")


def test_many_similar_events_are_combined(kube: KubeClient) -> None:
    target = kube.create(PODS, pod("web"))
    events = recorder(kube, Clock(), similar_threshold=3)
    for i in range(6):
        events.event(target, "Warning", "CPUPolicyIgnored", f"container c{i}: limit not whole")
    found = events_of(kube, "web")
    combined = [e for e in found if str(e["message"]).startswith(COMBINED_PREFIX)]
    assert len(found) == 3 and len(combined) == 1
    assert combined[0]["count"] == 4


def test_a_flood_is_cut_by_the_spam_filter_and_refills_with_time(kube: KubeClient) -> None:
    target = kube.create(PODS, pod("web"))
    clock = Clock()
    events = recorder(kube, clock, burst=3, refill_seconds=60)
    results = [events.event(target, "Normal", "CPUPinned", "same") for _ in range(5)]
    assert [r is not None for r in results] == [True, True, True, False, False]
    assert events.stats.dropped == 2
    clock.advance(61)
    assert events.event(target, "Normal", "CPUPinned", "same") is not None
    assert events_of(kube, "web")[0]["count"] == 4


def test_write_failures_are_counted_not_raised(kube: KubeClient, fake_api: FakeApiServer) -> None:
    fake_api.inject("/api/v1/namespaces/default/events", status=500)
    events = recorder(kube, Clock())
    ref = ObjectReference("Node", "node-1", uid="u1")
    assert events.event(ref, "Warning", "Broken", "x") is None
    assert events.stats.errors == 1
    # cluster-scoped objects get their events in "default"
    assert events.event(ref, "Warning", "Broken", "x") is not None
    assert kube.list(EVENTS, "default")["items"][0]["involvedObject"]["kind"] == "Node"


def test_background_writing_drains_on_flush(kube: KubeClient) -> None:
    target = kube.create(PODS, pod("web"))
    events = recorder(kube, Clock()).start()
    try:
        for _ in range(4):
            assert events.event(target, "Normal", "CPUPinned", "pinned") is None
        assert events.flush(5)
    finally:
        events.stop()
    assert events_of(kube, "web")[0]["count"] == 4


def test_events_api_group_shows_the_same_events(kube: KubeClient) -> None:
    target = kube.create(PODS, pod("web"))
    recorder(kube, Clock()).event(target, "Normal", "CPUPinned", "app: 2-3")
    [event] = kube.list(EVENTS_V1, "default")["items"]
    assert event["regarding"]["name"] == "web" and event["note"] == "app: 2-3"
    assert event["reportingController"] == "corepin-agent" and event["deprecatedCount"] == 1
