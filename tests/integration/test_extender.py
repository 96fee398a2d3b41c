"""`corepin extender`: the extender v1 wire format against kube-scheduler's own golden samples
(../shared/fixtures/peer/scheduler_extender_v1), the verbs over HTTP against the fake API
server, and bodies that are not extender messages (4xx or an API-level error, never a crash or
a hang)."""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corepin.api.extender import wire
from corepin.api.http import OpsServer
from corepin.kube.client import KubeClient
from corepin.kube.resources import NODES, PODS
from corepin.state.model import HostState
from corepin.testing import machines as synthetic
from support import strategies
from support.budget import examples
from support.extender_harness import Extender
from support.helpers import wait_for
from support.kube_helpers import install_crds
from support.paths import PEER_FIXTURES
from support.placement_helpers import run_pods
from support.placement_publish import publish
from support.pods import EXCLUSIVE, container, pod

GOLDEN = PEER_FIXTURES / "scheduler_extender_v1"
SMALL = synthetic.named("single_socket_ht")


def golden_cases() -> list[dict[str, Any]]:
    path = GOLDEN / "golden.json"
    if not path.exists():
        return []
    cases: list[dict[str, Any]] = json.loads(path.read_text())["cases"]
    return cases


needs_golden = pytest.mark.skipif(not golden_cases(), reason=f"no golden samples in {GOLDEN}")


# ---------------------------------------------------------------------- golden wire format
@needs_golden
@pytest.mark.parametrize("case", golden_cases(), ids=lambda c: c["type"])
def test_every_extender_type_decodes_exactly_and_case_insensitively(case: dict[str, Any]) -> None:
    schema = wire.TYPES[case["type"]]
    text = case["expect_json_text"]
    assert wire.decode(text.encode(), schema) == case["expect_json"]
    # Go's decoder matches field names in any case: so does ours
    assert wire.decode(text.lower().encode(), schema) == case["expect_json"]


def _written(case: dict[str, Any]) -> Any:
    """The golden object as corepin's own writers build it."""
    data = case["expect_json"]
    kind = case["type"]
    if kind == "ExtenderFilterResult":
        return wire.filter_result(
            names=data["NodeNames"],
            nodes=data["Nodes"]["items"],
            failed=data["FailedNodes"],
            unresolvable=data["FailedAndUnresolvableNodes"],
            error=data["Error"],
        )
    if kind == "HostPriority":
        return wire.host_priorities([(data["Host"], data["Score"])])[0]
    if kind == "ExtenderBindingResult":
        return wire.binding_result(data["Error"])
    if kind == "ExtenderPreemptionResult":
        victims = {
            node: ([p["UID"] for p in v["Pods"]], v["NumPDBViolations"])
            for node, v in data["NodeNameToMetaVictims"].items()
        }
        return wire.preemption_result(victims)
    return None


@needs_golden
@pytest.mark.parametrize(
    "case",
    [c for c in golden_cases() if c["type"].endswith(("Result", "Priority"))],
    ids=lambda c: c["type"],
)
def test_every_answer_is_written_byte_for_byte_as_go_writes_it(case: dict[str, Any]) -> None:
    assert wire.encode(_written(case)).decode() == case["expect_json_text"]


@needs_golden
def test_the_readers_take_the_golden_requests() -> None:
    by_type = {c["type"]: c for c in golden_cases()}
    args = wire.decode(
        by_type["ExtenderArgs"]["expect_json_text"].lower().encode(), wire.EXTENDER_ARGS
    )
    assert wire.pod_of(args)["metadata"]["name"] == "podname"
    assert wire.node_names_of(args) == (["node1"], None)
    del args["NodeNames"]
    names, nodes = wire.node_names_of(args)
    assert names == ["nodename"] and nodes is not None and len(nodes) == 1
    binding = by_type["ExtenderBindingArgs"]["expect_json_text"].lower().encode()
    assert wire.binding_args(wire.decode(binding, wire.BINDING_ARGS)) == (
        "mypodnamespace",
        "mypodname",
        "mypoduid",
        "mynode",
    )
    preemption = wire.decode(
        by_type["ExtenderPreemptionArgs"]["expect_json_text"].encode(), wire.PREEMPTION_ARGS
    )
    assert wire.victims_of(preemption) == {"foo": (["myuid"], 1)}


# ---------------------------------------------------------------------- over HTTP
@pytest.fixture
def extender(kube: KubeClient) -> Iterator[Extender]:
    install_crds(kube)
    publish(kube, "roomy", HostState.new(SMALL), SMALL)
    publish(
        kube,
        "full",
        run_pods(
            SMALL, [pod("big", container("app", "15", "15"), annotations=EXCLUSIVE, running=True)]
        ),
        SMALL,
    )
    publish(
        kube,
        "half",
        run_pods(
            SMALL, [pod("mid", container("app", "8", "8"), annotations=EXCLUSIVE, running=True)]
        ),
        SMALL,
    )
    with Extender(kube) as ext:
        ext.wait_nodes("roomy", "full", "half")
        yield ext


def args(p: dict[str, Any], names: list[str]) -> dict[str, Any]:
    return {"Pod": p, "Nodes": None, "NodeNames": names}


def test_filter_with_node_names_answers_with_node_names_and_a_reason_per_failed_node(
    extender: Extender,
) -> None:
    code, answer = extender.post(
        "filter",
        args(
            pod("p", container("app", "4", "4"), annotations=EXCLUSIVE), ["roomy", "full", "bare"]
        ),
    )
    assert code == 200
    assert list(answer) == [
        "Nodes",
        "NodeNames",
        "FailedNodes",
        "FailedAndUnresolvableNodes",
        "Error",
    ]
    assert answer["Nodes"] is None and answer["NodeNames"] == ["roomy"] and answer["Error"] == ""
    assert list(answer["FailedNodes"]) == ["full"]
    assert "container 'app' asks for 4 exclusive CPU(s)" in answer["FailedNodes"]["full"]
    assert "only 1 free" in answer["FailedNodes"]["full"]
    assert list(answer["FailedAndUnresolvableNodes"]) == ["bare"]
    assert "no NodeCPUTopology" in answer["FailedAndUnresolvableNodes"]["bare"]


def test_filter_with_node_objects_answers_with_the_passing_objects(extender: Extender) -> None:
    nodes = {
        "metadata": {},
        "items": [
            {"metadata": {"name": n, "labels": {"zone": n}}, "spec": {}, "status": {}}
            for n in ("full", "roomy")
        ],
    }
    code, answer = extender.post(
        "filter",
        {
            "Pod": pod("p", container("app", "4", "4"), annotations=EXCLUSIVE),
            "Nodes": nodes,
            "NodeNames": None,
        },
    )
    assert code == 200 and answer["NodeNames"] is None
    assert answer["Nodes"]["items"] == [nodes["items"][1]]
    assert list(answer["FailedNodes"]) == ["full"]


def test_requests_are_read_whatever_the_case_of_their_keys(extender: Extender) -> None:
    body = (
        json.dumps(
            args(pod("p", container("app", "4", "4"), annotations=EXCLUSIVE), ["roomy", "full"])
        )
        .lower()
        .encode()
    )
    code, raw = extender.raw("POST", "/filter", body)
    answer = json.loads(raw)
    # the annotation key and value are lower case already; the CPU limit too
    assert code == 200 and answer["NodeNames"] == ["roomy"], answer


def test_prioritize_scores_0_to_10_per_node(extender: Extender) -> None:
    code, answer = extender.post(
        "prioritize",
        args(
            pod("p", container("app", "1", "1"), annotations=EXCLUSIVE), ["roomy", "half", "full"]
        ),
    )
    assert code == 200
    scores = {row["Host"]: row["Score"] for row in answer}
    assert list(answer[0]) == ["Host", "Score"]
    assert all(0 <= s <= 10 for s in scores.values())
    assert scores["half"] > scores["roomy"]  # MaximumUtilization packs
    assert scores["full"] == 0  # does not fit


def test_bind_places_binds_and_counts_the_pod_until_its_node_shows_it(
    extender: Extender, kube: KubeClient
) -> None:
    created = kube.create(
        PODS, pod("p", container("app", "8", "8"), annotations=EXCLUSIVE), "default"
    )
    deadline = time.monotonic() + 10
    while extender.feed.pods.cache.get("p", "default") is None and time.monotonic() < deadline:
        time.sleep(0.02)
    code, answer = extender.post(
        "bind",
        {
            "PodName": "p",
            "PodNamespace": "default",
            "PodUID": created["metadata"]["uid"],
            "Node": "roomy",
        },
    )
    assert code == 200 and answer == {"Error": ""}
    assert kube.get(PODS, "p", "default")["spec"]["nodeName"] == "roomy"
    # 16 CPUs - 8 in flight - 1 for the shared pool: 8 no longer fit
    _, again = extender.post(
        "filter", args(pod("q", container("app", "8", "8"), annotations=EXCLUSIVE), ["roomy"])
    )
    assert again["NodeNames"] == [] and "no CPU in the shared pool" in again["FailedNodes"]["roomy"]
    _, late = extender.post(
        "bind", {"PodName": "p", "PodNamespace": "default", "PodUID": "", "Node": "full"}
    )
    assert "no longer fits" in late["Error"] or "already" in late["Error"]


def _pending(kube: KubeClient, extender: Extender, p: dict[str, Any]) -> str:
    """Create the pod and wait until the extender's informer has it; its uid."""
    created = kube.create(PODS, p, "default")
    wait_for(
        lambda: extender.feed.pods.cache.get(p["metadata"]["name"], "default") is not None,
        timeout=10,
        what="the extender to see the pod",
    )
    return str(created["metadata"]["uid"])


def _bind(extender: Extender, name: str, uid: str, node: str) -> str:
    code, answer = extender.post(
        "bind", {"PodName": name, "PodNamespace": "default", "PodUID": uid, "Node": node}
    )
    assert code == 200
    return str(answer["Error"])


def test_bind_refuses_pods_nodes_and_placements_kube_scheduler_would_not_make(
    extender: Extender, kube: KubeClient
) -> None:
    kube.patch(
        NODES,
        "half",
        {"spec": {"taints": [{"key": "dedicated", "value": "db", "effect": "NoSchedule"}]}},
    )
    kube.patch(NODES, "full", {"spec": {"unschedulable": True}})
    kube.patch(NODES, "roomy", {"metadata": {"labels": {"disk": "ssd"}}})
    wait_for(
        lambda: all(
            (extender.feed.nodes.cache.get(n) or {}).get("spec")  # type: ignore[union-attr]
            for n in ("full", "half")
        ),
        timeout=10,
        what="the node changes",
    )
    refused = extender.metrics.bindings.labels("refused")
    before = refused._value.get()

    # another scheduler's pod, on a node that would take it
    other = pod(
        "other", container("app", "1", "1"), annotations=EXCLUSIVE, scheduler="corepin-scheduler"
    )
    error = _bind(extender, "other", _pending(kube, extender, other), "roomy")
    assert "schedulerName 'corepin-scheduler'" in error and "default-scheduler" in error
    # a node that does not exist
    lost = pod("lost", container("app", "1", "1"), annotations=EXCLUSIVE)
    error = _bind(extender, "lost", _pending(kube, extender, lost), "nowhere")
    assert error == "node 'nowhere' does not exist"
    # a NoSchedule taint the pod does not tolerate; a cordoned node
    tainted = pod("tainted", container("app", "1", "1"), annotations=EXCLUSIVE)
    uid = _pending(kube, extender, tainted)
    assert "taint dedicated=db:NoSchedule" in _bind(extender, "tainted", uid, "half")
    assert "cordoned" in _bind(extender, "tainted", uid, "full")
    # a nodeSelector the node's labels do not match
    picky = pod("picky", container("app", "1", "1"), annotations=EXCLUSIVE)
    picky["spec"]["nodeSelector"] = {"disk": "nvme"}
    error = _bind(extender, "picky", _pending(kube, extender, picky), "roomy")
    assert "nodeSelector (disk=nvme)" in error
    for name in ("other", "lost", "tainted", "picky"):
        assert not kube.get(PODS, name, "default")["spec"].get("nodeName"), name
    assert refused._value.get() - before == 5

    # what kube-scheduler would do is still done: a tolerated taint, a matching selector
    tainted_ok = pod("tolerant", container("app", "1", "1"), annotations=EXCLUSIVE)
    tainted_ok["spec"]["tolerations"] = [{"key": "dedicated", "operator": "Exists"}]
    assert _bind(extender, "tolerant", _pending(kube, extender, tainted_ok), "half") == ""
    assert kube.get(PODS, "tolerant", "default")["spec"]["nodeName"] == "half"
    picky_ok = pod("ssd", container("app", "1", "1"), annotations=EXCLUSIVE)
    picky_ok["spec"]["nodeSelector"] = {"disk": "ssd"}
    assert _bind(extender, "ssd", _pending(kube, extender, picky_ok), "roomy") == ""
    assert kube.get(PODS, "ssd", "default")["spec"]["nodeName"] == "roomy"


def test_bind_takes_the_scheduler_names_it_is_given(kube: KubeClient) -> None:
    install_crds(kube)
    publish(kube, "roomy", HostState.new(SMALL), SMALL)
    service = {"scheduler_names": ("default-scheduler", "pinned")}
    with Extender(kube, service=service) as ext:
        ext.wait_nodes("roomy")
        mine = pod("mine", container("app", "1", "1"), annotations=EXCLUSIVE, scheduler="pinned")
        assert _bind(ext, "mine", _pending(kube, ext, mine), "roomy") == ""
        theirs = pod("theirs", container("app", "1", "1"), annotations=EXCLUSIVE, scheduler="other")
        assert "schedulerName 'other'" in _bind(ext, "theirs", _pending(kube, ext, theirs), "roomy")


def test_preempt_keeps_the_nodes_where_the_victims_make_room(
    extender: Extender, kube: KubeClient
) -> None:
    big = pod("big", container("app", "15", "15"), annotations=EXCLUSIVE, running=True)
    victims = {"Pods": [{"UID": big["metadata"]["uid"]}], "NumPDBViolations": 0}
    code, answer = extender.post(
        "preempt",
        {
            "Pod": pod("p", container("app", "4", "4"), annotations=EXCLUSIVE),
            "NodeNameToVictims": None,
            "NodeNameToMetaVictims": {
                "full": victims,
                "roomy": {"Pods": [], "NumPDBViolations": 0},
            },
        },
    )
    assert code == 200
    assert set(answer["NodeNameToMetaVictims"]) == {"full", "roomy"}
    code, answer = extender.post(
        "preempt",
        {
            "Pod": pod("p", container("app", "4", "4"), annotations=EXCLUSIVE),
            "NodeNameToMetaVictims": {"full": {"Pods": [], "NumPDBViolations": 0}},
        },
    )
    assert answer == {"NodeNameToMetaVictims": {}}


def test_a_stale_node_fails_with_how_long_its_agent_has_been_silent(kube: KubeClient) -> None:
    install_crds(kube)
    publish(kube, "old", HostState.new(SMALL), SMALL, heartbeat=time.time() - 600)
    with Extender(kube, stale_after=60.0) as ext:
        ext.wait_nodes("old")
        _, answer = ext.post(
            "filter", args(pod("p", container("app", "1", "1"), annotations=EXCLUSIVE), ["old"])
        )
    assert "last reported 6" in answer["FailedNodes"]["old"]


def test_healthz_and_metrics_on_the_same_port(extender: Extender) -> None:
    extender.post(
        "filter", args(pod("p", container("app", "1", "1"), annotations=EXCLUSIVE), ["roomy"])
    )
    assert extender.raw("GET", "/healthz") == (200, b"ok\n")
    code, body = extender.raw("GET", "/metrics")
    text = body.decode()
    assert code == 200 and 'corepin_placement_requests_total{code="200",verb="filter"} 1.0' in text
    assert extender.raw("GET", "/filter")[0] == 405
    assert extender.raw("GET", "/nowhere")[0] == 404
    assert extender.raw("DELETE", "/filter")[0] == 405


def test_healthz_and_metrics_are_the_pages_every_corepin_server_serves(
    extender: Extender,
) -> None:
    # the same pages as the ops server's (corepin.api.http): HEAD too, one content type
    with OpsServer("127.0.0.1:0", metrics=extender.metrics.registry, ready=True) as ops:
        for method, path in (("GET", "/healthz"), ("HEAD", "/healthz"), ("HEAD", "/metrics")):
            mine = http.client.HTTPConnection("127.0.0.1", extender.server.port, timeout=20)
            theirs = http.client.HTTPConnection("127.0.0.1", ops.port, timeout=20)
            try:
                mine.request(method, path)
                theirs.request(method, path)
                a, b = mine.getresponse(), theirs.getresponse()
                assert (a.status, a.getheader("Content-Type"), a.read()) == (
                    b.status,
                    b.getheader("Content-Type"),
                    b.read(),
                )
                assert a.status == 200
            finally:
                mine.close()
                theirs.close()


# ---------------------------------------------------------------------- bodies, not requests
def _deep(levels: int) -> bytes:
    return b'{"Pod":' + b"[" * levels + b"]" * levels + b',"NodeNames":["roomy"]}'


BAD_BODIES = [
    ("not JSON at all", b"hello"),
    ("invalid UTF-8", b'{"Pod": "\xff\xfe", "NodeNames": []}'),
    ("a JSON array", b"[1, 2, 3]"),
    ("no pod", b'{"NodeNames": ["roomy"]}'),
    ("a pod that is a number", b'{"Pod": 5, "NodeNames": ["roomy"]}'),
    ("node names that are numbers", b'{"Pod": {"metadata": {"name": "p"}}, "NodeNames": [1, 2]}'),
    ("neither node names nor nodes", b'{"Pod": {"metadata": {"name": "p"}}}'),
    ("nodes without names", b'{"Pod": {"metadata": {"name": "p"}}, "Nodes": {"items": [{}]}}'),
    (
        "containers that are a string",
        b'{"Pod": {"metadata": {"name": "p"}, "spec": {"containers": "x"}}, "NodeNames": []}',
    ),
    ("deep nesting", _deep(100_000)),
    ("a truncated body", b'{"Pod": {"metadata": {"name": "p"'),
]  # fmt: skip


BAD_PREEMPTIONS = [
    ("no pod", b'{"NodeNameToMetaVictims": {}}'),
    ("victims that are a list", b'{"Pod": {"metadata": {"name": "p"}}, "NodeNameToVictims": []}'),
    (
        "victims without uids",
        b'{"Pod": {"metadata": {"name": "p"}}, "NodeNameToMetaVictims": {"a": {"Pods": [{}]}}}',
    ),
    (
        "a violation count that is text",
        b'{"Pod": {"metadata": {"name": "p"}}, '
        b'"NodeNameToMetaVictims": {"a": {"Pods": [], "NumPDBViolations": "1"}}}',
    ),
]


@pytest.mark.parametrize(
    ("verb", "what", "body"),
    [(v, w, b) for v in ("filter", "prioritize", "bind") for w, b in BAD_BODIES]
    + [("preempt", w, b) for w, b in BAD_BODIES[:5] + BAD_PREEMPTIONS],
    ids=[f"{v}: {w}" for v in ("filter", "prioritize", "bind") for w, _ in BAD_BODIES]
    + [f"preempt: {w}" for w, _ in BAD_BODIES[:5] + BAD_PREEMPTIONS],
)
def test_a_body_that_is_not_a_request_gets_a_400_with_the_error(
    extender: Extender, verb: str, what: str, body: bytes
) -> None:
    code, raw = extender.raw("POST", f"/{verb}", body)
    assert code == 400, raw
    assert json.loads(raw)["Error"]
    assert extender.raw("GET", "/healthz")[0] == 200  # and the server goes on


def test_huge_arrays_are_answered(extender: Extender) -> None:
    names = [f"node-{i}" for i in range(200_000)]
    started = time.monotonic()
    code, answer = extender.post(
        "filter", args(pod("p", container("app", "1", "1"), annotations=EXCLUSIVE), names)
    )
    assert code == 200 and len(answer["FailedAndUnresolvableNodes"]) == 200_000
    assert time.monotonic() - started < 20


def test_ten_megabytes_of_junk_is_refused_and_a_longer_body_is_never_read(
    extender: Extender,
) -> None:
    code, raw = extender.raw("POST", "/filter", b"x" * (10 * 1024 * 1024))
    assert code == 400 and json.loads(raw)["Error"]
    code, raw = extender.raw(
        "POST", "/filter", b"", headers={"Content-Length": str(64 * 1024 * 1024)}
    )
    assert code == 413 and "larger than" in json.loads(raw)["Error"]


def test_a_body_without_a_length_is_refused(extender: Extender) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", extender.server.port, timeout=10)
    conn.putrequest("POST", "/filter")
    conn.putheader("Transfer-Encoding", "chunked")
    conn.endheaders()
    conn.send(b"0\r\n\r\n")
    assert conn.getresponse().status == 411
    conn.close()


def test_a_client_that_stops_sending_is_dropped_after_the_timeout(extender: Extender) -> None:
    import socket

    with socket.create_connection(("127.0.0.1", extender.server.port), timeout=10) as sock:
        sock.sendall(b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        started = time.monotonic()
        received = b""
        while chunk := sock.recv(1024):
            received += chunk
        # answered 408 when the request's time (2 s here) is up, then closed
        assert received.startswith(b"HTTP/1.1 408 "), received
        assert time.monotonic() - started < 5
    assert extender.raw("GET", "/healthz")[0] == 200


json_values = strategies.json_values(max_text=5, max_key=12, max_leaves=30)
keys = st.sampled_from(
    ["Pod", "pod", "NodeNames", "nodenames", "Nodes", "PodName", "PodNamespace", "Node",
     "NodeNameToMetaVictims", "metadata", "spec", "containers", "name"]
)  # fmt: skip


@settings(max_examples=examples(300), suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    verb=st.sampled_from(["filter", "prioritize", "bind", "preempt"]),
    body=st.dictionaries(keys, json_values, max_size=5) | json_values,
)
def test_any_json_gets_an_answer_or_a_400_never_a_crash(
    extender: Extender, verb: str, body: Any
) -> None:
    code, payload = extender.service.answer(verb, json.dumps(body).encode())
    assert code in (200, 400)
    wire.encode(payload)
