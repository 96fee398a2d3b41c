"""Leader election around the controller (two replicas on one fake API server: only the leader
acts; failover on stop, on a leader that vanishes, and a leader that loses its Lease stops
acting) and the /healthz + /metrics server."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from corepin.agent.cluster.controller.controller import ControllerSettings
from corepin.agent.cluster.controller.service import ControllerService, check_api
from corepin.api.http import OpsServer
from corepin.core.errors import ApiUnreachable, EnvironmentProblem
from corepin.kube.client import KubeClient
from corepin.kube.config import load_config
from corepin.kube.resources import LEASES
from corepin.testing.fakeapi import FakeApiServer
from corepin.testing.machines import dual_socket_ht
from support.controller_helpers import (
    binding,
    create_binding,
    create_pod,
    ncpt,
    publish,
    wait_phase,
)
from support.helpers import wait_for
from support.kube_helpers import install_crds
from support.pods import container

WRITES = ("POST", "PUT", "PATCH", "DELETE")


def client(kubeconfig: Path, agent: str) -> KubeClient:
    return KubeClient.from_config(load_config(kubeconfig, env={}), timeout=5, user_agent=agent)


def service(kubeconfig: Path, identity: str) -> ControllerService:
    return ControllerService(
        client(kubeconfig, identity),
        ControllerSettings(),
        lease_namespace="default",
        lease_name="corepin-controller",
        identity=identity,
        lease_duration=4.0,
        renew_deadline=2.0,
        retry_period=0.2,
    )


@pytest.fixture
def pair(kube: KubeClient, fake_kubeconfig: Path) -> Iterator[tuple[ControllerService, ...]]:
    install_crds(kube)
    publish(kube, ncpt("worker-1", dual_socket_ht()))
    services = (service(fake_kubeconfig, "replica-a"), service(fake_kubeconfig, "replica-b"))
    for s in services:
        s.start()
    try:
        yield services
    finally:
        for s in services:
            s.stop(3.0)
            s.client.close()


def leader_of(services: tuple[ControllerService, ...]) -> ControllerService:
    found: list[ControllerService] = []

    def one() -> bool:
        found[:] = [s for s in services if s.is_leader]
        return len(found) == 1

    wait_for(one, 10, "exactly one leader")
    return found[0]


def writes_by(fake: FakeApiServer, agent: str) -> list[str]:
    """The writes `agent` made, leader election's own Lease writes left out."""
    return [
        f"{r.method} {r.path}"
        for r in fake.recorded()
        if r.user_agent == agent and r.method in WRITES and "/leases" not in r.path
    ]


def test_only_the_leader_acts_and_the_standby_says_so(
    fake_api: FakeApiServer, kube: KubeClient, pair: tuple[ControllerService, ...]
) -> None:
    leader = leader_of(pair)
    standby = next(s for s in pair if s is not leader)
    create_pod(kube, "web", container("app", "1", "1"))
    create_binding(kube, binding("web", "web", cpus="2"))
    wait_phase(kube, "web", "Validated")
    assert writes_by(fake_api, leader.identity), "the leader wrote the status"
    assert writes_by(fake_api, standby.identity) == []
    assert standby.controller is None and standby.terms == 0
    expected = (True, f"standby (leader: {leader.identity})")
    wait_for(lambda: standby.health() == expected, 10, "the standby to see the leader")
    wait_for(lambda: leader.health() == (True, "leading"), 10, "the leader to be healthy")
    assert leader.metrics.leader._value.get() == 1
    assert standby.metrics.leader._value.get() == 0
    assert not [r for r in fake_api.recorded(verb="watch") if r.user_agent == standby.identity], (
        "a standby opens no watches"
    )


def test_the_standby_takes_over_at_once_when_the_leader_stops(
    fake_api: FakeApiServer, kube: KubeClient, pair: tuple[ControllerService, ...]
) -> None:
    leader = leader_of(pair)
    standby = next(s for s in pair if s is not leader)
    started = time.monotonic()
    assert leader.stop(4.0)
    assert time.monotonic() - started < 4.0
    lease = kube.get(LEASES, "corepin-controller", "default")["spec"]
    assert lease["holderIdentity"] in ("", standby.identity), "the stopping leader released it"
    wait_for(lambda: standby.is_leader, 3.0, "the standby to lead before the lease would expire")
    create_pod(kube, "web", container("app", "1", "1"))
    create_binding(kube, binding("web", "web", cpus="2"))
    wait_phase(kube, "web", "Validated")
    assert writes_by(fake_api, standby.identity)
    assert kube.get(LEASES, "corepin-controller", "default")["spec"]["holderIdentity"] == (
        standby.identity
    )


def test_a_vanished_leader_is_replaced_after_the_lease_expires(
    kube: KubeClient, pair: tuple[ControllerService, ...]
) -> None:
    leader = leader_of(pair)
    standby = next(s for s in pair if s is not leader)
    leader.elector.release_on_stop = False  # as if the process died: the Lease stays held
    leader.stop(3.0)
    assert kube.get(LEASES, "corepin-controller", "default")["spec"]["holderIdentity"] == (
        leader.identity
    )
    wait_for(lambda: standby.is_leader, 10, "the standby to take the expired lease")
    create_pod(kube, "web", container("app", "1", "1"))
    create_binding(kube, binding("web", "web", cpus="2"))
    wait_phase(kube, "web", "Validated")


def test_a_leader_that_loses_its_lease_stops_acting_and_stands_by(
    kube: KubeClient, fake_kubeconfig: Path
) -> None:
    install_crds(kube)
    one = service(fake_kubeconfig, "replica-a").start()
    try:
        wait_for(lambda: one.is_leader, 10, "leading")
        controller = one.controller
        assert controller is not None
        lease = kube.get(LEASES, "corepin-controller", "default")
        lease["spec"]["holderIdentity"] = "someone-else"
        lease["spec"]["leaseDurationSeconds"] = 60
        kube.replace(LEASES, lease)
        wait_for(lambda: not one.is_leader, 10, "the leader to notice")
        assert not controller.health()[0] and controller.queue.shutting_down
        assert one.health() == (True, "standby (leader: someone-else)")
    finally:
        one.stop(3.0)
        one.client.close()


# ---------------------------------------------------------------------- /healthz, /metrics
def get(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return answer.status, answer.headers["Content-Type"], answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], exc.read().decode()


def test_healthz_and_metrics_of_a_leader_and_a_standby(
    kube: KubeClient, pair: tuple[ControllerService, ...]
) -> None:
    leader = leader_of(pair)
    standby = next(s for s in pair if s is not leader)
    create_pod(kube, "web", container("app", "1", "1"))
    create_binding(kube, binding("web", "web", cpus="2"))
    wait_phase(kube, "web", "Validated")
    valid = leader.metrics.verdicts.labels("Validated", "Valid")
    wait_for(lambda: valid._value.get() == 1, 10, "the leader to count its verdict")
    acting = leader.controller
    assert acting is not None
    wait_for(lambda: acting.bindings_by_phase() == {("user", "Validated"): 1}, 10, "the cache")
    servers = {
        s.identity: OpsServer(
            "127.0.0.1:0", metrics=s.metrics.registry, ready=lambda s=s: s.health()[0]
        )
        for s in pair
    }
    for server in servers.values():
        server.start()
    try:
        base = {k: v.url for k, v in servers.items()}
        wait_for(lambda: standby.elector.leader == leader.identity, 10, "the standby to see it")
        code, kind, text = get(base[leader.identity] + "/healthz")
        assert (code, text) == (200, "ok\n") and kind.startswith("text/plain")
        code, _, text = get(base[standby.identity] + "/healthz")
        assert (code, text) == (200, "ok\n"), "a standby is healthy"
        code, kind, text = get(base[leader.identity] + "/metrics")
        assert code == 200 and kind.startswith("text/plain; version=0.0.4")
        assert "corepin_controller_leader 1.0" in text
        verdict = 'corepin_controller_binding_verdicts_total{phase="Validated",reason="Valid"}'
        assert f"{verdict} 1.0" in text
        assert 'corepin_controller_bindings{phase="Validated",writer="user"} 1.0' in text
        assert 'corepin_controller_watch_restarts_total{resource="pods"}' in text
        assert "corepin_controller_reconcile_duration_seconds_bucket" in text
        _, _, text = get(base[standby.identity] + "/metrics")
        assert "corepin_controller_leader 0.0" in text
        assert "corepin_controller_queue_depth 0.0" in text
        standby.stop(3.0)
        code, _, text = get(base[standby.identity] + "/healthz")
        assert (code, text) == (503, "not ready\n")
    finally:
        for server in servers.values():
            server.stop()


def test_health_before_the_election_runs_and_openmetrics(fake_kubeconfig: Path) -> None:
    one = service(fake_kubeconfig, "replica-a")
    assert one.health() == (False, "leader election is not running")
    server = OpsServer("127.0.0.1:0", metrics=one.metrics.registry, ready=lambda: one.health()[0])
    server.start()
    try:
        code, _, text = get(f"{server.url}/healthz")
        assert (code, text) == (503, "not ready\n")
        request = urllib.request.Request(
            f"{server.url}/metrics",
            headers={"Accept": "application/openmetrics-text; version=1.0.0"},
        )
        with urllib.request.urlopen(request, timeout=5) as answer:
            assert answer.headers["Content-Type"].startswith("application/openmetrics-text")
            body = answer.read().decode()
        assert "corepin_controller_leader 0.0" in body and body.endswith("# EOF\n")
    finally:
        server.stop()
        one.client.close()


def test_an_address_in_use_is_an_environment_problem() -> None:
    with OpsServer("127.0.0.1:0") as first:
        second = OpsServer(f"127.0.0.1:{first.port}")
        with pytest.raises(EnvironmentProblem) as caught:
            second.start()
        assert caught.value.exit_code == 4
        assert f"127.0.0.1:{first.port}" in caught.value.message


def test_check_api_says_what_is_missing(kube: KubeClient, tmp_path: Path) -> None:
    with pytest.raises(EnvironmentProblem) as caught:
        check_api(kube, "default")
    assert caught.value.message == (
        "the API server does not serve the CRD podcpubindings.corepin.io: install the CRDs "
        "first (kubectl apply -k deploy/crd)"
    )
    install_crds(kube)
    check_api(kube, "default")
    config = tmp_path / "unreachable"
    config.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: x\n"
        "clusters: [{name: x, cluster: {server: 'http://127.0.0.1:1'}}]\n"
        "contexts: [{name: x, context: {cluster: x, user: x}}]\nusers: [{name: x, user: {}}]\n"
    )
    with pytest.raises(ApiUnreachable):
        check_api(client(config, "x"), "default")
