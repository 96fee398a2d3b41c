"""The agent's metrics and the /healthz + /metrics server,
ending with a real Prometheus that scrapes the server and answers a query about it."""

from __future__ import annotations

import http.client
import json
import os
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from corepin.agent.node.metrics import AgentMetrics
from corepin.api.http import OpsServer, parse_address, render
from corepin.core.cpuset import CPUSet
from corepin.core.errors import EnvironmentProblem, InputError
from corepin.state.model import Assignment, HostState
from corepin.testing.machines import dual_socket_ht
from support.helpers import wait_for
from support.ports import free_port

#: Every metric name of the contract, as the exposition spells it.
CONTRACT_NAMES = (
    "corepin_shared_pool_cpus",
    "corepin_exclusive_cpus",
    "corepin_allocated_cpus",
    "corepin_pinning_requests_total",
    "corepin_pinning_errors_total",
    "corepin_cgroup_writes_total",
    "corepin_reconcile_duration_seconds",
    "corepin_decision_duration_seconds",
    "corepin_pod_event_to_pinned_seconds",
    "corepin_watch_restarts_total",
)


def busy_state() -> tuple[HostState, object]:
    """Dual socket HT (2 NUMA nodes): an exclusive core on node 0, a share CPU on node 1."""
    topology = dual_socket_ht()
    node0, node1 = (topology.cpus_in_numa_nodes(n) for n in topology.numa_node_ids()[:2])
    first = node0.first()
    core = topology.siblings_of(first)
    state = (
        HostState.new(topology)
        .add(Assignment("db", "exclusive", CPUSet.of(first), core, level="core"))
        .add(Assignment("web", "share", CPUSet.of(node1.first())))
    )
    return state, topology


def sample(metrics: AgentMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def get(url: str, *, method: str = "GET", accept: str | None = None) -> tuple[int, str, str]:
    request = urllib.request.Request(url, method=method)
    if accept:
        request.add_header("Accept", accept)
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, answer.read().decode(), answer.headers["Content-Type"]
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode(), err.headers["Content-Type"]


# ---------------------------------------------------------------------- metrics
def test_observe_state_sets_the_pool_gauges_and_allocated_cpus_per_numa_node() -> None:
    state, topology = busy_state()
    metrics = AgentMetrics()
    metrics.observe_state(state, topology)  # type: ignore[arg-type]
    assert sample(metrics, "corepin_shared_pool_cpus") == len(state.shared_pool)
    assert sample(metrics, "corepin_exclusive_cpus") == len(state.exclusive_cpus) == 2
    node_ids = topology.numa_node_ids()  # type: ignore[attr-defined]
    assert sample(metrics, "corepin_allocated_cpus", numa_node=str(node_ids[0])) == 2
    assert sample(metrics, "corepin_allocated_cpus", numa_node=str(node_ids[1])) == 1
    for other in node_ids[2:]:
        assert sample(metrics, "corepin_allocated_cpus", numa_node=str(other)) == 0
    freed = state.remove("db").remove("web")
    metrics.observe_state(freed, topology)  # type: ignore[arg-type]
    assert sample(metrics, "corepin_exclusive_cpus") == 0
    assert sample(metrics, "corepin_allocated_cpus", numa_node=str(node_ids[0])) == 0
    assert sample(metrics, "corepin_shared_pool_cpus") == len(topology.online_cpus)  # type: ignore[attr-defined]


def test_counters_and_histograms_count_what_the_agent_reports() -> None:
    metrics = AgentMetrics()
    for _ in range(3):
        metrics.pinning_request()
    metrics.pinning_error("not_enough_cpus")
    metrics.pinning_error("not_enough_cpus")
    metrics.pinning_error("")
    metrics.cgroup_writes(4)
    metrics.cgroup_writes(0)
    metrics.watch_restart()
    metrics.observe_pod_event_to_pinned(0.3)
    metrics.observe_pod_event_to_pinned(-1.0)  # a clock step never makes a negative latency
    with metrics.time_reconcile():
        time.sleep(0.01)
    with metrics.time_decision():
        pass
    assert sample(metrics, "corepin_pinning_requests_total") == 3
    assert sample(metrics, "corepin_pinning_errors_total", reason="not_enough_cpus") == 2
    assert sample(metrics, "corepin_pinning_errors_total", reason="unknown") == 1
    assert sample(metrics, "corepin_cgroup_writes_total") == 4
    assert sample(metrics, "corepin_watch_restarts_total") == 1
    assert sample(metrics, "corepin_pod_event_to_pinned_seconds_count") == 2
    assert sample(metrics, "corepin_pod_event_to_pinned_seconds_bucket", le="0.01") == 1
    assert sample(metrics, "corepin_pod_event_to_pinned_seconds_bucket", le="0.5") == 2
    reconcile_sum = sample(metrics, "corepin_reconcile_duration_seconds_sum")
    assert reconcile_sum is not None and reconcile_sum >= 0.01
    assert sample(metrics, "corepin_decision_duration_seconds_count") == 1
    with pytest.raises(ValueError):
        metrics.cgroup_writes(-1)


def test_the_exposition_has_every_contract_name_with_its_type() -> None:
    state, topology = busy_state()
    metrics = AgentMetrics()
    metrics.observe_state(state, topology)  # type: ignore[arg-type]
    body, content_type = render(metrics.registry)
    assert content_type.startswith("text/plain")
    text = body.decode()
    families = {f.name: f.type for f in text_string_to_metric_families(text)}
    expected_types = {
        "corepin_shared_pool_cpus": "gauge",
        "corepin_exclusive_cpus": "gauge",
        "corepin_allocated_cpus": "gauge",
        "corepin_pinning_requests": "counter",
        "corepin_pinning_errors": "counter",
        "corepin_cgroup_writes": "counter",
        "corepin_reconcile_duration_seconds": "histogram",
        "corepin_decision_duration_seconds": "histogram",
        "corepin_pod_event_to_pinned_seconds": "histogram",
        "corepin_watch_restarts": "counter",
    }
    assert {k: families.get(k) for k in expected_types} == expected_types
    for name in CONTRACT_NAMES:
        assert f"# HELP {name} " in text or f"# HELP {name.removesuffix('_total')}" in text
    assert 'corepin_allocated_cpus{numa_node="0"} 2.0' in text


def test_two_agents_in_one_process_keep_their_metrics_apart() -> None:
    a, b = AgentMetrics(), AgentMetrics()
    a.pinning_request()
    assert sample(a, "corepin_pinning_requests_total") == 1
    assert sample(b, "corepin_pinning_requests_total") == 0


# ---------------------------------------------------------------------- addresses
@pytest.mark.parametrize(
    ("address", "expected"),
    [
        (":9464", ("", 9464)),
        ("127.0.0.1:0", ("127.0.0.1", 0)),
        ("localhost:9465", ("localhost", 9465)),
        ("[::1]:9466", ("::1", 9466)),
    ],
    ids=["an empty host is every interface", "IPv4", "a name", "IPv6 in brackets"],
)
def test_parse_address(address: str, expected: tuple[str, int]) -> None:
    assert parse_address(address) == expected


@pytest.mark.parametrize("address", ["9464", "host:", "host:port", ":70000", "::1:9464"])
def test_bad_addresses_are_input_errors_naming_them(address: str) -> None:
    with pytest.raises(InputError, match="bad address"):
        parse_address(address)


# ---------------------------------------------------------------------- the server
@pytest.fixture
def ops() -> Iterator[tuple[OpsServer, AgentMetrics]]:
    metrics = AgentMetrics()
    server = OpsServer("127.0.0.1:0", metrics=metrics.registry)
    server.start()
    yield server, metrics
    server.stop()


def test_healthz_is_503_until_ready_then_200(ops: tuple[OpsServer, AgentMetrics]) -> None:
    server, _ = ops
    assert get(server.url + "/healthz")[:2] == (503, "not ready\n")
    server.set_ready(True)
    assert get(server.url + "/healthz")[:2] == (200, "ok\n")
    flag = {"ready": False}
    server.set_ready(lambda: flag["ready"])
    assert get(server.url + "/healthz")[0] == 503
    flag["ready"] = True
    assert get(server.url + "/healthz")[0] == 200

    def broken() -> bool:
        raise RuntimeError("probe failed")

    server.set_ready(broken)
    assert get(server.url + "/healthz")[0] == 503


def test_metrics_page_serves_the_registry_in_both_formats(
    ops: tuple[OpsServer, AgentMetrics],
) -> None:
    server, metrics = ops
    metrics.pinning_request()
    status, body, content_type = get(server.url + "/metrics")
    assert status == 200 and content_type.startswith("text/plain; version=0.0.4")
    assert "corepin_pinning_requests_total 1.0" in body
    status, body, content_type = get(
        server.url + "/metrics", accept="application/openmetrics-text; version=1.0.0"
    )
    assert status == 200 and content_type.startswith("application/openmetrics-text")
    assert body.rstrip().endswith("# EOF")
    assert get(server.url + "/metrics", method="HEAD")[:2] == (200, "")


def test_other_paths_and_methods_are_refused(ops: tuple[OpsServer, AgentMetrics]) -> None:
    server, _ = ops
    assert get(server.url + "/")[0] == 404
    assert get(server.url + "/metricsx")[0] == 404
    assert get(server.url + "/metrics", method="POST")[0] == 405


def test_stop_is_bounded_even_with_a_silent_client_connected(
    ops: tuple[OpsServer, AgentMetrics],
) -> None:
    server, _ = ops
    port = server.port
    idle = socket.create_connection(("127.0.0.1", port))
    idle.sendall(b"GET /metr")  # a request that never finishes
    started = time.monotonic()
    server.stop()
    assert time.monotonic() - started < 4
    idle.close()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()


def test_every_interface_serves_ipv4_clients() -> None:
    with OpsServer(":0", ready=True) as server:
        port = server.port
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.request("GET", "/healthz")
        assert conn.getresponse().status == 200
        conn.close()


def test_a_port_in_use_is_an_environment_problem_naming_the_address() -> None:
    with OpsServer("127.0.0.1:0") as first:
        taken = f"127.0.0.1:{first.port}"
        with pytest.raises(EnvironmentProblem, match=taken) as caught:
            OpsServer(taken).start()
        assert caught.value.exit_code == 4


# ---------------------------------------------------------------------- a real Prometheus
def prometheus_query(base: str, query: str) -> list[dict[str, object]]:
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": query})
    status, body, _ = get(url)
    assert status == 200, body
    answer = json.loads(body)
    assert answer["status"] == "success", answer
    result: list[dict[str, object]] = answer["data"]["result"]
    return result


@pytest.mark.slow
def test_a_real_prometheus_scrapes_the_server_and_answers_queries(tmp_path: Path) -> None:
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("the prometheus binary is not installed (sh scripts/install-deps.sh --test)")
    state, topology = busy_state()
    metrics = AgentMetrics()
    metrics.observe_state(state, topology)  # type: ignore[arg-type]
    for _ in range(3):
        metrics.pinning_request()
    metrics.pinning_error("not_enough_cpus")
    metrics.observe_reconcile(0.02)
    server = OpsServer("127.0.0.1:0", metrics=metrics.registry, ready=True)
    server.start()
    data = tmp_path / "prometheus-data"
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "scrape_configs:\n  - job_name: corepin\n    static_configs:\n"
        f"      - targets: ['127.0.0.1:{server.port}']\n"
    )
    web = f"127.0.0.1:{free_port()}"
    log = (tmp_path / "prometheus.log").open("w")
    process = subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={data}",
            f"--web.listen-address={web}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://{web}"
    try:
        wait_for(lambda: _ready(base, process), timeout=30, what="Prometheus to be ready")
        wait_for(
            lambda: prometheus_query(base, "corepin_pinning_requests_total"),
            timeout=30,
            what="Prometheus to scrape corepin's server",
        )
        (requests,) = prometheus_query(base, "corepin_pinning_requests_total")
        assert requests["metric"]["job"] == "corepin"  # type: ignore[index]
        assert requests["value"][1] == "3"  # type: ignore[index]
        (errors,) = prometheus_query(base, 'corepin_pinning_errors_total{reason="not_enough_cpus"}')
        assert errors["value"][1] == "1"  # type: ignore[index]
        (exclusive,) = prometheus_query(base, "corepin_exclusive_cpus")
        assert exclusive["value"][1] == "2"  # type: ignore[index]
        per_node = prometheus_query(base, "sum(corepin_allocated_cpus)")
        assert per_node[0]["value"][1] == "3"  # type: ignore[index]
        (up,) = prometheus_query(base, 'up{job="corepin"}')
        assert up["value"][1] == "1"  # type: ignore[index]
        (count,) = prometheus_query(base, "corepin_reconcile_duration_seconds_count")
        assert count["value"][1] == "1"  # type: ignore[index]
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
        log.close()
        server.stop()
        shutil.rmtree(data, ignore_errors=True)
    assert process.returncode is not None
    assert not data.exists()
    assert not os.path.exists(f"/proc/{process.pid}") or _zombie_or_other(process.pid)


def _ready(base: str, process: subprocess.Popen[bytes]) -> bool:
    if process.poll() is not None:
        raise AssertionError(f"prometheus exited with {process.returncode}")
    try:
        return get(base + "/-/ready")[0] == 200
    except OSError:
        return False


def _zombie_or_other(pid: int) -> bool:
    """A pid that exists again after our Prometheus was reaped belongs to someone else."""
    try:
        return "prometheus" not in Path(f"/proc/{pid}/comm").read_text()
    except OSError:
        return True
