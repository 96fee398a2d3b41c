"""The informer against the fake API server: sync, handlers, dropped watches, 410 relists,
bookmarks, backoff, bounded stop, and a randomized run of API changes and faults after which
the cache equals the server's state with no update lost or delivered twice."""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from corepin.kube.client import KubeClient
from corepin.kube.config import load_config
from corepin.kube.informer import Informer, resource_version
from corepin.kube.resources import CONFIGMAPS, PODS
from corepin.testing.fakeapi import FakeApiServer
from corepin.testing.fakeapi.errors import ApiFailure
from support.budget import examples
from support.pods import pod

Obj = dict[str, Any]


def wait_for(predicate: Callable[[], bool], timeout: float = 10.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what or predicate}")


@dataclass
class Recorder:
    """Handler calls, checked for consistency as they arrive."""

    calls: list[tuple[str, str, str]] = field(default_factory=list)
    state: dict[tuple[str, str], str] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @staticmethod
    def key(obj: Obj) -> tuple[str, str]:
        meta = obj["metadata"]
        return (meta.get("namespace", ""), meta["name"])

    def add(self, obj: Obj) -> None:
        with self.lock:
            key, rv = self.key(obj), resource_version(obj)
            if key in self.state:
                self.problems.append(f"add of {key} already present")
            self.state[key] = rv
            self.calls.append(("add", key[1], rv))

    def update(self, old: Obj, new: Obj) -> None:
        with self.lock:
            key, rv = self.key(new), resource_version(new)
            if self.state.get(key) != resource_version(old):
                self.problems.append(
                    f"update of {key}: old {resource_version(old)} is not "
                    f"the last delivered {self.state.get(key)}"
                )
            if int(rv) <= int(self.state.get(key, "0")):
                self.problems.append(f"update of {key} to {rv} is not newer (duplicate)")
            self.state[key] = rv
            self.calls.append(("update", key[1], rv))

    def delete(self, obj: Obj) -> None:
        with self.lock:
            key = self.key(obj)
            if key not in self.state:
                self.problems.append(f"delete of {key} never added")
            self.state.pop(key, None)
            self.calls.append(("delete", key[1], resource_version(obj)))

    def attach(self, informer: Informer) -> None:
        informer.add_handlers(on_add=self.add, on_update=self.update, on_delete=self.delete)


def configmap(name: str, *, group: str = "a", value: str = "0") -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": "default", "labels": {"group": group}},
        "data": {"value": value},
    }


@pytest.fixture
def informers(kube: KubeClient) -> Iterator[list[Informer]]:
    made: list[Informer] = []
    yield made
    for informer in made:
        assert informer.stop(5), f"{informer.name} did not stop"


def start(
    kube: KubeClient, made: list[Informer], resource: Any = CONFIGMAPS, **kwargs: Any
) -> tuple[Informer, Recorder]:
    kwargs.setdefault("backoff_initial", 0.05)
    kwargs.setdefault("backoff_max", 0.4)
    informer = Informer(kube, resource, namespace="default", **kwargs)
    recorder = Recorder()
    recorder.attach(informer)
    made.append(informer)
    informer.start()
    assert informer.wait_for_sync(10), "informer never synced"
    wait_for(lambda: informer.stats.watches >= 1, what="the first watch")
    return informer, recorder


def server_versions(
    api: FakeApiServer, selector: Callable[[Obj], bool] = lambda o: True
) -> dict[tuple[str, str], str]:
    return {
        (o["metadata"]["namespace"], o["metadata"]["name"]): resource_version(o)
        for o in api.objects("v1", "configmaps", "default")
        if selector(o)
    }


def cache_versions(informer: Informer) -> dict[tuple[str, str], str]:
    return {Recorder.key(o): resource_version(o) for o in informer.cache.list()}


# ---------------------------------------------------------------------- basics
def test_sync_loads_the_list_and_handlers_see_every_change(
    kube: KubeClient, fake_api: FakeApiServer, informers: list[Informer]
) -> None:
    kube.create(CONFIGMAPS, configmap("one"))
    informer, recorder = start(kube, informers)
    assert informer.synced and [c[:2] for c in recorder.calls] == [("add", "one")]
    kube.create(CONFIGMAPS, configmap("two"))
    kube.patch(CONFIGMAPS, "one", {"data": {"value": "1"}}, "default")
    kube.delete(CONFIGMAPS, "two", "default")
    wait_for(lambda: len(recorder.calls) == 4, what="three more handler calls")
    assert [c[:2] for c in recorder.calls] == [
        ("add", "one"),
        ("add", "two"),
        ("update", "one"),
        ("delete", "two"),
    ]
    assert informer.cache.get("one", "default")["data"] == {"value": "1"}  # type: ignore[index]
    assert informer.cache.get("two", "default") is None
    assert recorder.problems == []


def test_events_do_not_cause_lists(
    kube: KubeClient, fake_api: FakeApiServer, informers: list[Informer]
) -> None:
    informer, _ = start(kube, informers)
    for i in range(20):
        kube.create(CONFIGMAPS, configmap(f"c{i}"))
    wait_for(lambda: len(informer.cache) == 20, what="20 objects cached")
    assert len(fake_api.recorded(verb="list", resource="configmaps")) == 1
    assert informer.stats.lists == 1 and informer.stats.events == 20


def test_list_items_without_kind_get_it_in_the_cache(
    kube: KubeClient, informers: list[Informer]
) -> None:
    kube.create(PODS, pod("web"))
    informer, _ = start(kube, informers, PODS)
    cached = informer.cache.get("web", "default")
    assert cached is not None and cached["kind"] == "Pod" and cached["apiVersion"] == "v1"


@pytest.mark.parametrize("abrupt", [True, False], ids=["connection cut", "stream ended"])
def test_a_dropped_watch_resumes_without_losing_or_repeating_changes(
    kube: KubeClient, fake_api: FakeApiServer, informers: list[Informer], abrupt: bool
) -> None:
    informer, recorder = start(kube, informers)
    kube.create(CONFIGMAPS, configmap("one"))
    wait_for(lambda: len(recorder.calls) == 1)
    fake_api.inject(
        "/api/v1/namespaces/default/configmaps", status=500, times=2, query={"watch": "1"}
    )
    assert fake_api.drop_watches(abrupt=abrupt) == 1
    kube.create(CONFIGMAPS, configmap("two"))
    kube.patch(CONFIGMAPS, "one", {"data": {"value": "9"}}, "default")
    wait_for(lambda: cache_versions(informer) == server_versions(fake_api), what="caught up")
    assert [c[:2] for c in recorder.calls] == [("add", "one"), ("add", "two"), ("update", "one")]
    assert informer.stats.lists == 1 and informer.stats.relists == 0
    assert informer.stats.watch_errors >= 2
    assert recorder.problems == []


def test_410_gone_leads_to_a_relist_that_reports_what_changed(
    kube: KubeClient, fake_api: FakeApiServer, informers: list[Informer]
) -> None:
    kube.create(CONFIGMAPS, configmap("stays"))
    kube.create(CONFIGMAPS, configmap("goes"))
    informer, recorder = start(kube, informers, watch_timeout=600)
    # keep the informer off the watch while the history moves on and is compacted
    fault = fake_api.inject(
        "/api/v1/namespaces/default/configmaps", status=500, times=None, query={"watch": "1"}
    )
    fake_api.drop_watches()
    kube.delete(CONFIGMAPS, "goes", "default")
    kube.create(CONFIGMAPS, configmap("new"))
    kube.patch(CONFIGMAPS, "stays", {"data": {"value": "2"}}, "default")
    fake_api.compact()
    wait_for(lambda: informer.stats.watch_errors >= 1, what="a failed watch")
    fake_api.faults.remove(fault)
    wait_for(lambda: informer.stats.relists == 1, what="a relist after 410")
    wait_for(lambda: cache_versions(informer) == server_versions(fake_api), what="caught up")
    assert sorted(c[:2] for c in recorder.calls[2:]) == [
        ("add", "new"),
        ("delete", "goes"),
        ("update", "stays"),
    ]
    assert recorder.problems == []


def test_bookmarks_keep_the_version_fresh_so_compaction_needs_no_relist(
    kube: KubeClient, fake_api: FakeApiServer, informers: list[Informer]
) -> None:
    informer, _ = start(kube, informers)
    kube.create(CONFIGMAPS, configmap("mine"))
    for i in range(5):  # changes the informer does not watch move the revision on
        kube.create(PODS, pod(f"p{i}"))
    latest = fake_api.cluster.rv
    wait_for(lambda: int(informer.last_resource_version or 0) >= latest, what="a bookmark")
    assert informer.stats.bookmarks >= 1
    fake_api.compact()
    fake_api.drop_watches()
    kube.create(CONFIGMAPS, configmap("after"))
    wait_for(lambda: informer.cache.get("after", "default") is not None)
    assert informer.stats.relists == 0


def test_watch_failures_back_off_exponentially_and_recover(
    kube: KubeClient, fake_api: FakeApiServer, informers: list[Informer]
) -> None:
    informer, _ = start(kube, informers, backoff_initial=0.1, backoff_max=0.8)
    fake_api.clear_requests()
    fake_api.inject(
        "/api/v1/namespaces/default/configmaps", status=503, times=5, query={"watch": "1"}
    )
    assert fake_api.drop_watches() == 1
    wait_for(lambda: informer.stats.watch_errors >= 6, timeout=15, what="6 failed watches")
    kube.create(CONFIGMAPS, configmap("later"))
    wait_for(lambda: informer.cache.get("later", "default") is not None, timeout=5)
    starts = [r.at for r in fake_api.recorded(verb="watch")]
    gaps = [b - a for a, b in itertools.pairwise(starts)][:5]
    # delays are drawn from [d/2, d] with d doubling from 0.1 up to 0.8
    assert gaps[0] < 0.3 and gaps[3] >= 0.38, gaps
    assert max(gaps) < 1.2, gaps


def test_a_failing_list_is_retried_before_sync(
    kube: KubeClient, fake_api: FakeApiServer, informers: list[Informer]
) -> None:
    fake_api.inject(
        "/api/v1/namespaces/default/configmaps$", status=500, times=2, query={"limit": "*"}
    )
    informer, _ = start(kube, informers)
    assert informer.stats.list_errors == 2 and informer.stats.lists == 1


def test_a_selector_informer_sees_objects_leave_and_return(
    kube: KubeClient, informers: list[Informer]
) -> None:
    kube.create(CONFIGMAPS, configmap("m", group="a"))
    informer, recorder = start(kube, informers, label_selector="group=a")
    kube.patch(CONFIGMAPS, "m", {"metadata": {"labels": {"group": "b"}}}, "default")
    wait_for(lambda: len(informer.cache) == 0, what="object left the selector")
    kube.patch(CONFIGMAPS, "m", {"metadata": {"labels": {"group": "a"}}}, "default")
    wait_for(lambda: len(informer.cache) == 1, what="object came back")
    assert [c[0] for c in recorder.calls] == ["add", "delete", "add"]


def test_pods_of_one_node_by_field_selector(kube: KubeClient, informers: list[Informer]) -> None:
    kube.create(PODS, pod("mine", node="node-1"))
    kube.create(PODS, pod("theirs", node="node-2"))
    kube.create(PODS, pod("pending"))
    informer, _ = start(kube, informers, PODS, field_selector="spec.nodeName=node-1")
    kube.bind("default", "pending", "node-1")
    wait_for(lambda: len(informer.cache) == 2, what="the bound pod to arrive")
    assert informer.cache.keys() == [("default", "mine"), ("default", "pending")]


def test_a_raising_handler_is_counted_and_the_informer_goes_on(
    kube: KubeClient, informers: list[Informer]
) -> None:
    informer = Informer(kube, CONFIGMAPS, namespace="default")
    informers.append(informer)
    seen: list[str] = []

    def explode(obj: Obj) -> None:
        seen.append(obj["metadata"]["name"])
        raise RuntimeError("handler bug")

    informer.add_handlers(on_add=explode)
    informer.start()
    assert informer.wait_for_sync(5)
    kube.create(CONFIGMAPS, configmap("x"))
    kube.create(CONFIGMAPS, configmap("y"))
    wait_for(lambda: seen == ["x", "y"])
    assert informer.stats.handler_errors == 2 and informer.running


def test_stop_is_bounded_even_while_a_list_hangs(kube: KubeClient, fake_api: FakeApiServer) -> None:
    fake_api.inject(
        "/api/v1/namespaces/default/configmaps$", status=None, delay=5.0, query={"limit": "*"}
    )
    informer = Informer(kube, CONFIGMAPS, namespace="default").start()
    wait_for(
        lambda: any(r.path.endswith("/configmaps") for r in fake_api.recorded()),
        what="the list to start",
    )
    began = time.monotonic()
    assert informer.stop(2.0)
    assert time.monotonic() - began < 1.0
    assert not informer.synced


def test_stop_while_watching_is_prompt_and_calls_no_handler_after(
    kube: KubeClient, fake_api: FakeApiServer
) -> None:
    informer = Informer(kube, CONFIGMAPS, namespace="default")
    calls: list[str] = []
    informer.add_handlers(on_add=lambda o: calls.append(o["metadata"]["name"]))
    informer.start()
    assert informer.wait_for_sync(5)
    began = time.monotonic()
    assert informer.stop(2.0) and time.monotonic() - began < 1.0
    kube.create(CONFIGMAPS, configmap("late"))
    time.sleep(0.2)
    assert calls == [] and fake_api.open_watches() == 0


# ---------------------------------------------------------------------- randomized
NAMES = [f"cm{i}" for i in range(5)]
STEP = st.one_of(
    st.tuples(st.just("create"), st.sampled_from(NAMES), st.sampled_from(["a", "b"])),
    st.tuples(st.just("update"), st.sampled_from(NAMES), st.sampled_from(["a", "b"])),
    st.tuples(st.just("delete"), st.sampled_from(NAMES), st.just("")),
    st.tuples(st.just("drop"), st.booleans(), st.just("")),
    st.tuples(st.just("compact"), st.just(""), st.just("")),
    st.tuples(st.just("fail_watch"), st.integers(1, 3), st.just("")),
    st.tuples(st.just("fail_list"), st.integers(1, 2), st.just("")),
    st.tuples(st.just("pause"), st.integers(0, 40), st.just("")),
)


def run_steps(api: FakeApiServer, steps: list[tuple[Any, Any, Any]]) -> None:
    rt = api.rt("v1", "configmaps")
    cluster = api.cluster
    for counter, (kind, arg, group) in enumerate(steps):
        # writes that do not apply (create of an existing name, ...) are refused and skipped
        if kind == "create":
            with contextlib.suppress(ApiFailure):
                api.create("v1", "configmaps", configmap(arg, group=group))
        elif kind == "update":
            patch = {"metadata": {"labels": {"group": group}}, "data": {"value": str(counter)}}
            with contextlib.suppress(ApiFailure):
                cluster.patch(rt, "default", arg, "application/merge-patch+json", patch)
        elif kind == "delete":
            with contextlib.suppress(ApiFailure):
                cluster.delete(rt, "default", arg)
        elif kind == "drop":
            api.drop_watches(abrupt=arg)
        elif kind == "compact":
            api.compact()
        elif kind == "fail_watch":
            api.inject(
                "/api/v1/namespaces/default/configmaps$",
                status=500,
                times=arg,
                query={"watch": "1"},
            )
        elif kind == "fail_list":
            api.inject(
                "/api/v1/namespaces/default/configmaps$",
                status=503,
                times=arg,
                query={"limit": "*"},
            )
        else:
            time.sleep(arg / 1000)


@settings(max_examples=examples(30), suppress_health_check=list(HealthCheck))
@given(steps=st.lists(STEP, min_size=5, max_size=30))
def test_random_changes_and_faults_end_with_the_servers_state(
    tmp_path_factory: Any, steps: list[Any]
) -> None:
    with FakeApiServer(bookmark_interval=0.2, history_limit=40) as api:
        path = api.write_kubeconfig(Path(tmp_path_factory.mktemp("kc")) / "kc")
        kube = KubeClient.from_config(load_config(path, env={}), timeout=5)
        everything = Informer(
            kube,
            CONFIGMAPS,
            namespace="default",
            page_size=2,
            watch_timeout=1,
            backoff_initial=0.02,
            backoff_max=0.2,
        )
        group_a = Informer(
            kube,
            CONFIGMAPS,
            namespace="default",
            label_selector="group=a",
            watch_timeout=1,
            backoff_initial=0.02,
            backoff_max=0.2,
        )
        recorders = (Recorder(), Recorder())
        for informer, recorder in zip((everything, group_a), recorders, strict=True):
            recorder.attach(informer)
            informer.start()
        try:
            run_steps(api, steps)
            api.clear_faults()
            in_a = lambda o: o["metadata"].get("labels", {}).get("group") == "a"  # noqa: E731
            wait_for(
                lambda: cache_versions(everything) == server_versions(api),
                timeout=15,
                what="the unfiltered informer to converge",
            )
            wait_for(
                lambda: cache_versions(group_a) == server_versions(api, in_a),
                timeout=15,
                what="the group=a informer to converge",
            )
            for informer, recorder in zip((everything, group_a), recorders, strict=True):
                assert recorder.problems == []
                assert recorder.state == cache_versions(informer)
                event(f"relisted: {informer.stats.relists > 0}")
                event(f"watch errors: {informer.stats.watch_errors > 0}")
        finally:
            assert everything.stop(5) and group_a.stop(5)
            kube.close()


def test_a_good_watch_resets_the_backoff_so_the_next_incident_starts_small(
    kube: KubeClient, fake_api: FakeApiServer, informers: list[Informer]
) -> None:
    informer, _ = start(kube, informers, backoff_initial=0.2, backoff_max=3.2)
    path = "/api/v1/namespaces/default/configmaps"
    fake_api.inject(path, status=503, times=5, query={"watch": "1"})
    assert fake_api.drop_watches() == 1
    wait_for(lambda: informer.stats.watch_errors >= 6, timeout=30, what="the first incident")
    kube.create(CONFIGMAPS, configmap("between"))
    wait_for(lambda: informer.cache.get("between", "default") is not None, timeout=10)
    # a second incident, a moment later: one failed watch
    fake_api.clear_requests()
    fake_api.inject(path, status=503, times=1, query={"watch": "1"})
    assert fake_api.drop_watches() == 1
    wait_for(lambda: len(fake_api.recorded(verb="watch")) >= 2, timeout=10, what="a retry")
    first, second = (r.at for r in fake_api.recorded(verb="watch")[:2])
    # the first delay again: [0.1, 0.2] s, not the 1.6-3.2 s the first incident had reached
    assert second - first < 1.0, second - first


@settings(max_examples=examples(200))
@given(
    failures=st.integers(0, 80),
    initial=st.floats(0.01, 2.0),
    maximum=st.floats(0.5, 30.0),
    asked=st.none() | st.floats(0.0, 1e6, allow_nan=False),
    seed=st.integers(0, 2**32),
)
def test_backoff_delays_stay_within_their_bounds(
    failures: int, initial: float, maximum: float, asked: float | None, seed: int
) -> None:
    import random

    from corepin.kube.informer import RETRY_AFTER_MAX, Backoff

    backoff = Backoff(initial, maximum, random.Random(seed))
    for _ in range(failures):
        backoff.next_delay()
    delay = backoff.next_delay(asked)
    if asked is None:
        ceiling = min(maximum, initial * 2**failures)
        assert ceiling / 2 <= delay <= ceiling
    else:
        # the server's wish, capped, with at most 10 % on top
        wish = min(asked, RETRY_AFTER_MAX)
        assert wish <= delay <= wish * 1.1 + 1e-9
    backoff.reset()
    assert backoff.next_delay() <= initial


def test_a_watch_from_a_version_the_server_does_not_have_yet_relists(
    kube: KubeClient, fake_api: FakeApiServer, informers: list[Informer]
) -> None:
    kube.create(CONFIGMAPS, configmap("kept"))
    backup = fake_api.snapshot()
    informer, recorder = start(kube, informers, idle_timeout=6)
    kube.create(CONFIGMAPS, configmap("lost"))
    wait_for(lambda: informer.cache.get("lost", "default") is not None)
    fake_api.restore(backup)
    wait_for(lambda: informer.stats.behind >= 1, timeout=20, what="the server found behind")
    wait_for(lambda: cache_versions(informer) == server_versions(fake_api), what="relisted")
    assert informer.cache.get("lost", "default") is None
    kube.create(CONFIGMAPS, configmap("new"))
    wait_for(lambda: informer.cache.get("new", "default") is not None, timeout=10)
    assert recorder.problems == []
