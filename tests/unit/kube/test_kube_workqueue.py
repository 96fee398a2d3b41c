"""The controllers' work queue: deduplication, one worker per key, delays, backoff, shutdown."""

from __future__ import annotations

import threading
import time

from corepin.kube.workqueue import WorkQueue


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_key_added_many_times_while_waiting_is_handed_out_once() -> None:
    q: WorkQueue[str] = WorkQueue()
    for key in ("a", "b", "a", "a", "c", "b"):
        q.add(key)
    assert len(q) == 3
    assert [q.get(0), q.get(0), q.get(0)] == ["a", "b", "c"]
    assert q.get(0) is None


def test_a_key_added_while_it_is_processed_comes_back_after_done_and_not_before() -> None:
    q: WorkQueue[str] = WorkQueue()
    q.add("a")
    assert q.get(0) == "a"
    q.add("a")
    q.add("a")
    assert q.get(0) is None, "the same key must not go to a second worker at the same time"
    q.done("a")
    assert q.get(0) == "a"
    q.done("a")
    assert q.get(0) is None
    assert q.idle()


def test_idle_is_false_while_a_key_is_being_processed() -> None:
    q: WorkQueue[str] = WorkQueue()
    q.add("a")
    key = q.get(0)
    assert key == "a" and not q.idle()
    q.done(key)
    assert q.idle()


def test_add_after_waits_for_the_delay_and_the_earliest_delay_wins() -> None:
    clock = Clock()
    q: WorkQueue[str] = WorkQueue(monotonic=clock)
    q.add_after("a", 10)
    q.add_after("a", 3)
    q.add_after("a", 20)  # later than the pending 3 s: ignored
    assert q.delayed() == 1
    assert q.get(0) is None
    clock.now += 2.9
    assert q.get(0) is None
    clock.now += 0.2
    assert q.get(0) == "a"
    q.done("a")
    clock.now += 100
    assert q.get(0) is None, "the superseded 10 s and 20 s delays must not add it again"


def test_add_after_zero_adds_at_once() -> None:
    q: WorkQueue[str] = WorkQueue()
    q.add_after("a", 0)
    assert q.get(0) == "a"


def test_a_blocked_get_wakes_when_a_delay_passes() -> None:
    q: WorkQueue[str] = WorkQueue()
    q.add_after("late", 0.2)
    started = time.monotonic()
    assert q.get(5) == "late"
    assert 0.15 <= time.monotonic() - started < 2


def test_rate_limited_requeue_doubles_until_forgotten() -> None:
    clock = Clock()
    q: WorkQueue[str] = WorkQueue(base_delay=0.5, max_delay=3.0, monotonic=clock)
    delays = [q.add_rate_limited("k") for _ in range(5)]
    assert delays == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert q.failures("k") == 5
    q.forget("k")
    assert q.failures("k") == 0
    assert q.add_rate_limited("k") == 0.5
    clock.now += 0.5
    assert q.get(0) == "k"


def test_shutdown_wakes_a_blocked_worker_and_drops_everything() -> None:
    q: WorkQueue[str] = WorkQueue()
    got: list[str | None] = []
    worker = threading.Thread(target=lambda: got.append(q.get()))
    worker.start()
    time.sleep(0.05)
    q.add_after("later", 60)
    q.shutdown()
    worker.join(2)
    assert not worker.is_alive() and got == [None]
    q.add("x")
    assert q.get(0) is None and q.shutting_down


def test_many_producers_one_consumer_sees_every_key_and_no_key_twice_at_once() -> None:
    q: WorkQueue[int] = WorkQueue()
    in_flight: set[int] = set()
    seen: set[int] = set()
    overlap: list[int] = []
    stop = threading.Event()

    def consume() -> None:
        while not stop.is_set():
            key = q.get(0.05)
            if key is None:
                continue
            if key in in_flight:
                overlap.append(key)
            in_flight.add(key)
            seen.add(key)
            time.sleep(0.0002)  # widen the window in which a second worker could get it
            in_flight.discard(key)
            q.done(key)

    def produce(offset: int) -> None:
        for i in range(300):
            q.add((i + offset) % 50)

    consumers = [threading.Thread(target=consume) for _ in range(2)]
    producers = [threading.Thread(target=produce, args=(n,)) for n in range(4)]
    for t in consumers + producers:
        t.start()
    for t in producers:
        t.join()
    deadline = time.monotonic() + 5
    while not q.idle() and time.monotonic() < deadline:
        time.sleep(0.01)
    stop.set()
    for t in consumers:
        t.join()
    assert seen == set(range(50))
    assert overlap == []
