"""The node gRPC API with a real server and real clients over a real unix socket
(and TLS over TCP), served by host mode (`HostBackend`) on this machine's topology, pinning
real processes by affinity (no cgroups), each test with its own state directory.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from corepin.agent.host.agent import HostAgent
from corepin.agent.host.backend import HostBackend
from corepin.agent.host.settings import HostSettings
from corepin.agent.ports import AllocationSpec, ContainerRef, ProcessRef, StateFeed
from corepin.allocation.levels import withheld_for
from corepin.api.grpc import convert
from corepin.api.grpc.client import AgentClient
from corepin.api.grpc.gen.v1alpha1 import pinning_pb2 as pb
from corepin.api.grpc.gen.v1alpha1 import pinning_pb2_grpc
from corepin.api.grpc.gen.v1alpha1 import topology_pb2 as tpb
from corepin.api.grpc.server import GrpcServer, Listen, prepare_socket_path
from corepin.core.cpuset import CPUSet
from corepin.core.errors import AllocationError, EnvironmentProblem, InputError
from corepin.state.model import Assignment, HostState
from corepin.state.owners import ContainerOwner, ProcessOwner
from corepin.testing.machines import dual_socket_ht, single_socket_ht
from support.helpers import allowed_cpus, corepin_argv, run_corepin, wait_for

ONLINE = sorted(os.sched_getaffinity(0))
needs_two_cpus = pytest.mark.skipif(len(ONLINE) < 2, reason="needs at least 2 CPUs")


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    """A short directory for sockets (a unix socket path has at most 107 bytes; pytest's tmp
    paths can be longer)."""
    path = Path(tempfile.mkdtemp(prefix="cp-grpc-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    path = tmp_path / "state"
    path.mkdir(mode=0o700)
    return path


@pytest.fixture
def backend(state_dir: Path) -> Iterator[HostBackend]:
    settings = HostSettings(state_dir=str(state_dir), cgroups="off")
    b = HostBackend(HostAgent(settings), node_name="node-a", poll_interval=0.05)
    yield b
    b.close()


@pytest.fixture
def server(backend: HostBackend, sock_dir: Path) -> Iterator[GrpcServer]:
    with GrpcServer(backend, Listen.unix(str(sock_dir / "run" / "corepin.sock"))) as srv:
        yield srv


@pytest.fixture
def client(server: GrpcServer) -> Iterator[AgentClient]:
    with AgentClient(server.endpoint) as c:
        yield c


@pytest.fixture
def sleeper() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait(timeout=10)


def start_sleep(procs: list[subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
    p = subprocess.Popen(["sleep", "60"])
    procs.append(p)
    return p


def stub(server: GrpcServer) -> tuple[grpc.Channel, pinning_pb2_grpc.CPUPinningStub]:
    channel = grpc.insecure_channel(server.endpoint)
    return channel, pinning_pb2_grpc.CPUPinningStub(channel)


def rpc_error(call: object) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        call()  # type: ignore[operator]
    return caught.value


def reason_of(err: grpc.RpcError) -> str | None:
    assert isinstance(err, grpc.Call)
    return dict(err.trailing_metadata() or ()).get("corepin-reason")


# ---------------------------------------------------------------------- the RPCs
def test_get_topology_returns_the_agents_topology_and_node_name(
    client: AgentClient, backend: HostBackend
) -> None:
    node, topology = client.topology()
    assert node == "node-a"
    assert topology == backend.topology()
    assert topology.to_json() == backend.topology().to_json()


def test_list_of_a_fresh_node_has_no_allocation_and_every_online_cpu_shared(
    client: AgentClient, backend: HostBackend
) -> None:
    listed = client.list_state()
    assert listed.node_name == "node-a"
    assert list(listed.state) == []
    assert listed.state.shared_pool == backend.topology().online_cpus
    assert listed.state.free == backend.topology().online_cpus


@needs_two_cpus
def test_allocate_pins_a_running_process_and_list_shows_it_running(
    client: AgentClient, sleeper: list[subprocess.Popen[bytes]]
) -> None:
    p = start_sleep(sleeper)
    a = client.allocate(AllocationSpec.build(cpus=1, owner=ProcessRef(p.pid), name="napper"))
    assert a.kind == "exclusive" and len(a.cpus) == 1
    assert isinstance(a.owner, ProcessOwner) and a.owner.pid == p.pid
    assert allowed_cpus(p.pid) == str(a.cpus)
    listed = client.list_state()
    assert [x.id for x in listed.state] == [a.id]
    assert listed.statuses == {a.id: "running"}
    assert listed.state.get(a.id) == a
    assert not (listed.state.shared_pool & a.cpus)
    assert listed.state.get(a.id).label == "napper"  # type: ignore[union-attr]


@needs_two_cpus
def test_a_shared_allocation_follows_the_shared_pool(
    client: AgentClient, sleeper: list[subprocess.Popen[bytes]]
) -> None:
    exclusive, shared = start_sleep(sleeper), start_sleep(sleeper)
    s = client.allocate(AllocationSpec.build(owner=ProcessRef(shared.pid)))
    assert s.kind == "shared"
    assert allowed_cpus(shared.pid) == str(CPUSet(ONLINE))
    e = client.allocate(AllocationSpec.build(cpus=1, owner=ProcessRef(exclusive.pid)))
    pool = client.list_state().state.shared_pool
    assert pool == CPUSet(ONLINE) - e.cpus
    assert allowed_cpus(shared.pid) == str(pool)


@needs_two_cpus
def test_release_frees_the_cpus_of_a_finished_process(
    client: AgentClient, sleeper: list[subprocess.Popen[bytes]]
) -> None:
    p = start_sleep(sleeper)
    a = client.allocate(AllocationSpec.build(cpus=1, owner=ProcessRef(p.pid)))
    p.kill()
    p.wait()
    released = client.release(a.id)
    assert released == a
    state = client.list_state().state
    assert list(state) == []
    assert state.free == CPUSet(ONLINE)


@needs_two_cpus
def test_release_of_a_live_process_moves_it_to_the_shared_pool(
    client: AgentClient, sleeper: list[subprocess.Popen[bytes]]
) -> None:
    p = start_sleep(sleeper)
    a = client.allocate(AllocationSpec.build(cpus=1, owner=ProcessRef(p.pid)))
    client.release(a.id)
    moved = client.list_state().state.get(a.id)
    assert moved is not None and moved.kind == "shared" and not moved.withheld
    assert allowed_cpus(p.pid) == str(CPUSet(ONLINE))


# ---------------------------------------------------------------------- errors
def test_release_of_an_unknown_id_is_not_found_with_the_reason(server: GrpcServer) -> None:
    channel, pinning = stub(server)
    with channel:
        err = rpc_error(lambda: pinning.Release(pb.ReleaseRequest(id="nope"), timeout=10))
    assert err.code() == grpc.StatusCode.NOT_FOUND  # type: ignore[attr-defined]
    assert "nope" in err.details()  # type: ignore[attr-defined]
    assert reason_of(err) == "unknown_id"


def test_allocating_more_cpus_than_the_node_has_is_resource_exhausted(
    server: GrpcServer, sleeper: list[subprocess.Popen[bytes]]
) -> None:
    p = start_sleep(sleeper)
    channel, pinning = stub(server)
    request = pb.AllocateRequest(cpus=len(ONLINE) + 1, process=pb.ProcessRef(pid=p.pid))
    with channel:
        err = rpc_error(lambda: pinning.Allocate(request, timeout=10))
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED  # type: ignore[attr-defined]
    assert reason_of(err) == "not_enough_cpus"


@pytest.mark.parametrize(
    ("request_fields", "reason"),
    [
        ({"cpus": 1}, "no_owner"),
        ({"kind": "hoarder", "cpus": 1, "process": {"pid": 1}}, "bad_kind"),
        ({"kind": "exclusive", "process": {"pid": 1}}, "bad_count"),
        ({"cpus": 1, "level": "galaxy", "process": {"pid": 1}}, "bad_level"),
        ({"cpus": 1, "options": {"smt": "sideways"}, "process": {"pid": 1}}, "bad_smt"),
        ({"cpus": 1, "process": {"pid": 999_999_999}}, "no_such_process"),
        ({"kind": "share", "cpus": 1, "container": {"container_id": "ab" * 32}}, "bad_kind"),
    ],
    ids=[
        "an allocation without a process or a container",
        "an unknown kind",
        "an exclusive allocation of zero CPUs",
        "an unknown exclusiveness level",
        "an unknown SMT option value",
        "a process that does not exist",
        "a share container in host mode",
    ],
)
def test_bad_allocate_requests_are_invalid_argument_naming_the_problem(
    server: GrpcServer, request_fields: dict[str, object], reason: str
) -> None:
    channel, pinning = stub(server)
    request = pb.AllocateRequest(**request_fields)  # type: ignore[arg-type]
    with channel:
        err = rpc_error(lambda: pinning.Allocate(request, timeout=10))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err.details()  # type: ignore[attr-defined]
    assert reason_of(err) == reason


@needs_two_cpus
def test_the_client_maps_status_codes_back_to_corepin_errors(
    client: AgentClient, sleeper: list[subprocess.Popen[bytes]]
) -> None:
    p = start_sleep(sleeper)
    with pytest.raises(InputError) as bad:
        client.release("nope")
    assert bad.value.reason == "unknown_id" and bad.value.exit_code == 2
    with pytest.raises(AllocationError) as short:
        client.allocate(AllocationSpec.build(cpus=len(ONLINE) + 1, owner=ProcessRef(p.pid)))
    assert short.value.exit_code == 3
    client.allocate(AllocationSpec.build(cpus=1, owner=ProcessRef(p.pid)))
    with pytest.raises(InputError) as twice:
        client.allocate(AllocationSpec.build(cpus=1, owner=ProcessRef(p.pid)))
    assert twice.value.reason == "already_pinned"


def test_a_client_of_a_missing_socket_is_an_environment_problem(sock_dir: Path) -> None:
    with pytest.raises(EnvironmentProblem, match="no corepin agent socket"):
        AgentClient(str(sock_dir / "absent.sock"))


def test_a_client_of_a_dead_socket_says_it_cannot_reach_the_agent(sock_dir: Path) -> None:
    path = sock_dir / "dead.sock"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(path))
    s.close()  # the file stays, nobody listens
    with AgentClient(str(path), timeout=5) as c, pytest.raises(EnvironmentProblem) as caught:
        c.list_state()
    assert caught.value.reason == "agent_unreachable" and str(path) in str(caught.value)


# ---------------------------------------------------------------------- watch
def collect(stream: object, events: list[pb.WatchEvent]) -> threading.Thread:
    def run() -> None:
        for event in stream:  # type: ignore[attr-defined]
            events.append(event)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def types(events: list[pb.WatchEvent]) -> list[tuple[str, str]]:
    return [(pb.WatchEvent.Type.Name(e.type), e.allocation.id) for e in events]


@needs_two_cpus
def test_watch_sees_the_initial_state_then_allocate_and_release(
    client: AgentClient, sleeper: list[subprocess.Popen[bytes]]
) -> None:
    events: list[pb.WatchEvent] = []
    stream = client.watch()
    t = collect(stream, events)
    wait_for(lambda: len(events) >= 1, what="the initial event")
    assert types(events) == [("INITIAL", "")]
    assert list(events[0].state.allocations) == []
    p = start_sleep(sleeper)
    a = client.allocate(AllocationSpec.build(cpus=1, owner=ProcessRef(p.pid)))
    wait_for(lambda: ("ADDED", a.id) in types(events), what="the ADDED event")
    added = events[-1]
    assert convert.assignment_from_message(added.allocation) == a
    assert added.pools.shared_pool == str(CPUSet(ONLINE) - a.cpus)
    p.kill()
    p.wait()
    client.release(a.id)
    wait_for(lambda: ("DELETED", a.id) in types(events), what="the DELETED event")
    assert events[-1].pools.free == str(CPUSet(ONLINE))
    assert events[-1].revision > added.revision
    stream.cancel()
    t.join(timeout=5)
    assert not t.is_alive()


@needs_two_cpus
def test_watch_sees_changes_other_corepin_processes_make_in_the_state_dir(
    client: AgentClient, state_dir: Path
) -> None:
    events: list[pb.WatchEvent] = []
    stream = client.watch(skip_initial=True)
    t = collect(stream, events)
    time.sleep(0.3)  # the watch is subscribed
    run = subprocess.Popen(
        corepin_argv(
            "run", "--state-dir", str(state_dir), "--cgroups", "off", "--exclusive", "1",
            "--name", "outsider", "--", "sleep", "1",
        )
    )  # fmt: skip
    try:
        wait_for(lambda: any(e.type == pb.WatchEvent.ADDED for e in events), what="ADDED")
        added = next(e for e in events if e.type == pb.WatchEvent.ADDED)
        assert added.allocation.process.name == "outsider"
        assert run.wait(timeout=30) == 0
        wait_for(lambda: any(e.type == pb.WatchEvent.DELETED for e in events), what="DELETED")
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
        stream.cancel()
        t.join(timeout=5)
    assert next(e.type for e in events) == pb.WatchEvent.ADDED  # no INITIAL when skipped


def test_watch_streams_end_when_the_server_stops(backend: HostBackend, sock_dir: Path) -> None:
    srv = GrpcServer(backend, Listen.unix(str(sock_dir / "w.sock")))
    srv.start()
    events: list[pb.WatchEvent] = []
    failures: list[BaseException] = []
    client = AgentClient(srv.endpoint)

    def run() -> None:
        try:
            for e in client.watch():
                events.append(e)
        except Exception as exc:
            failures.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    wait_for(lambda: events, what="the initial event")
    started = time.monotonic()
    srv.stop(grace=0.5)
    t.join(timeout=10)
    assert not t.is_alive()
    assert time.monotonic() - started < 5
    client.close()


def test_watches_beyond_the_limit_are_refused_while_unary_calls_go_on(
    backend: HostBackend, sock_dir: Path
) -> None:
    with GrpcServer(backend, Listen.unix(str(sock_dir / "l.sock")), max_watches=2) as srv:
        channel, pinning = stub(srv)
        with channel:
            first = pinning.Watch(pb.WatchRequest())
            second = pinning.Watch(pb.WatchRequest())
            next(first), next(second)
            third = pinning.Watch(pb.WatchRequest())
            err = rpc_error(lambda: next(third))
            assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED  # type: ignore[attr-defined]
            assert pinning.List(pb.ListRequest(), timeout=5).state.node_name == "node-a"
            first.cancel()
            second.cancel()


def test_a_feed_subscription_gets_the_newest_state_and_skips_older_ones() -> None:
    feed = StateFeed()
    sub = feed.subscribe()
    assert sub.next(0.01) is None
    for revision in (1, 2, 3):
        feed.publish(HostState(revision=revision))
    got = sub.next(0.01)
    assert got is not None and got.revision == 3
    assert sub.next(0.01) is None
    woke: list[object] = []
    t = threading.Thread(target=lambda: woke.append(sub.next(10)))
    t.start()
    time.sleep(0.05)
    sub.close()
    t.join(timeout=2)
    assert woke == [None]


# ---------------------------------------------------------------------- health, reflection
def test_health_check_says_serving_for_the_server_and_each_service(server: GrpcServer) -> None:
    channel = grpc.insecure_channel(server.endpoint)
    health = health_pb2_grpc.HealthStub(channel)
    with channel:
        for service in ("", "corepin.v1alpha1.Topology", "corepin.v1alpha1.CPUPinning"):
            answer = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
            assert answer.status == health_pb2.HealthCheckResponse.SERVING, service
        err = rpc_error(
            lambda: health.Check(health_pb2.HealthCheckRequest(service="nope.Nope"), timeout=5)
        )
        assert err.code() == grpc.StatusCode.NOT_FOUND  # type: ignore[attr-defined]


def test_reflection_lists_the_services_and_describes_the_rpcs(server: GrpcServer) -> None:
    from google.protobuf.descriptor_pool import DescriptorPool

    channel = grpc.insecure_channel(server.endpoint)
    with channel:
        database = ProtoReflectionDescriptorDatabase(channel)
        services = set(database.get_services())
        assert {
            "corepin.v1alpha1.Topology",
            "corepin.v1alpha1.CPUPinning",
            "grpc.health.v1.Health",
            "grpc.reflection.v1alpha.ServerReflection",
        } <= services
        pool = DescriptorPool(database)
        pinning = pool.FindServiceByName("corepin.v1alpha1.CPUPinning")
        methods = {m.name: m for m in pinning.methods}
        assert sorted(methods) == ["Allocate", "List", "Release", "Watch"]
        assert methods["Watch"].server_streaming and not methods["List"].server_streaming
        assert methods["Allocate"].input_type.full_name == "corepin.v1alpha1.AllocateRequest"
        topology = pool.FindServiceByName("corepin.v1alpha1.Topology")
        assert [m.name for m in topology.methods] == ["GetTopology"]


# ---------------------------------------------------------------------- the socket
def test_the_socket_has_mode_0600_in_a_private_directory(server: GrpcServer) -> None:
    path = server.listen.socket
    assert path is not None
    st = os.stat(path)
    assert stat.S_ISSOCK(st.st_mode)
    assert stat.S_IMODE(st.st_mode) == 0o600
    assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700


def test_the_socket_is_0600_whatever_the_umask(backend: HostBackend, sock_dir: Path) -> None:
    old = os.umask(0)
    try:
        with GrpcServer(backend, Listen.unix(str(sock_dir / "u.sock"))) as srv:
            assert stat.S_IMODE(os.stat(str(sock_dir / "u.sock")).st_mode) == 0o600
            assert srv.port
    finally:
        os.umask(old)


def test_stopping_removes_the_socket(backend: HostBackend, sock_dir: Path) -> None:
    with GrpcServer(backend, Listen.unix(str(sock_dir / "s.sock"))):
        assert (sock_dir / "s.sock").exists()
    assert not (sock_dir / "s.sock").exists()


def test_a_stale_socket_is_replaced(backend: HostBackend, sock_dir: Path) -> None:
    path = sock_dir / "stale.sock"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(path))
    s.close()
    with GrpcServer(backend, Listen.unix(str(path))) as srv, AgentClient(srv.endpoint) as c:
        assert c.health() == "SERVING"


def test_a_socket_another_server_answers_on_is_refused(
    server: GrpcServer, backend: HostBackend
) -> None:
    path = server.listen.socket
    assert path is not None
    with pytest.raises(EnvironmentProblem, match="another process serves") as caught:
        GrpcServer(backend, Listen.unix(path)).start()
    assert caught.value.exit_code == 4
    with AgentClient(server.endpoint) as c:
        assert c.health() == "SERVING"  # the running server was left alone


def test_a_path_that_is_not_a_socket_is_refused_and_left_alone(sock_dir: Path) -> None:
    path = sock_dir / "precious.txt"
    path.write_text("keep me\n")
    with pytest.raises(EnvironmentProblem, match="is not a socket") as caught:
        prepare_socket_path(str(path))
    assert caught.value.reason == "socket_path_taken"
    assert path.read_text() == "keep me\n"


def test_a_socket_path_longer_than_the_kernel_allows_is_refused() -> None:
    with pytest.raises(InputError, match="at most 107"):
        Listen.unix("/tmp/" + "x" * 120 + ".sock")


# ---------------------------------------------------------------------- TCP and TLS
def test_plain_tcp_is_refused_on_both_ends() -> None:
    with pytest.raises(InputError, match="plain TCP") as caught:
        Listen.tcp("127.0.0.1:0", cert=None, key=None)
    assert caught.value.reason == "plaintext_tcp"
    with pytest.raises(InputError, match="only with TLS"):
        AgentClient("127.0.0.1:50051")


def test_tls_over_tcp_serves_clients_that_trust_the_ca(
    backend: HostBackend, tls_material: object
) -> None:
    tls = tls_material
    listen = Listen.tcp(
        "127.0.0.1:0",
        cert=str(tls.server.cert),  # type: ignore[attr-defined]
        key=str(tls.server.key),  # type: ignore[attr-defined]
    )
    with GrpcServer(backend, listen) as srv:
        assert srv.endpoint.startswith("127.0.0.1:") and srv.port
        with AgentClient(srv.endpoint, tls_ca=str(tls.ca.cert)) as c:  # type: ignore[attr-defined]
            assert c.list_state().node_name == "node-a"
            assert c.health() == "SERVING"
        # a plaintext client gets nothing from the TLS port
        channel, pinning = stub(srv)
        with channel:
            err = rpc_error(lambda: pinning.List(pb.ListRequest(), timeout=3))
            assert err.code() == grpc.StatusCode.UNAVAILABLE  # type: ignore[attr-defined]


def test_tls_with_a_client_ca_refuses_clients_without_a_certificate(
    backend: HostBackend, tls_material: object
) -> None:
    tls = tls_material
    listen = Listen.tcp(
        "127.0.0.1:0",
        cert=str(tls.server.cert),  # type: ignore[attr-defined]
        key=str(tls.server.key),  # type: ignore[attr-defined]
        client_ca=str(tls.ca.cert),  # type: ignore[attr-defined]
    )
    ca = str(tls.ca.cert)  # type: ignore[attr-defined]
    user = tls.client("operator")  # type: ignore[attr-defined]
    with GrpcServer(backend, listen) as srv:
        with (
            AgentClient(srv.endpoint, tls_ca=ca, timeout=3) as anonymous,
            pytest.raises(EnvironmentProblem),
        ):
            anonymous.list_state()
        with AgentClient(
            srv.endpoint, tls_ca=ca, tls_cert=str(user.cert), tls_key=str(user.key)
        ) as known:
            assert known.list_state().node_name == "node-a"


# ---------------------------------------------------------------------- conversions
def test_a_state_round_trips_through_its_message_with_statuses() -> None:
    topology = single_socket_ht()
    base = HostState.new(topology, reserved=CPUSet.parse("0"), options={"a": "b"})
    state = (
        base.add(
            Assignment(
                "run-1",
                "exclusive",
                CPUSet.parse("2"),
                withheld_for(topology, "core", CPUSet.parse("2")),
                CPUSet.parse("0"),
                "core",
                ProcessOwner(pid=42, start_time=7, runner_pid=41, name="db", command="db -x"),
                created=12.5,
                policy="topology-aware",
                workload="cpu-bound",
            )
        )
        .add(
            Assignment(
                "ctr-1",
                "share",
                CPUSet.parse("3"),
                owner=ContainerOwner(
                    pod_uid="u1", container="app", namespace="ns", pod="p", cgroup="/kubepods/x"
                ),
            )
        )
        .add(Assignment("run-2", "shared", owner=ProcessOwner(pid=43)))
        .evolve(revision=9)
    )
    message = convert.state_message(state, {"run-1": "running"}, node_name="n")
    wire = pb.NodeState.FromString(message.SerializeToString())
    back, statuses = convert.state_from_message(wire)
    assert back == state
    assert back.shared_pool == state.shared_pool and back.free == state.free
    assert statuses == {"run-1": "running"}


def test_a_topology_round_trips_through_its_message_with_its_nulls() -> None:
    topology = dual_socket_ht()
    data = topology.to_json()
    data["cpus"][3].update(online=False, socket=None, die=None, numa=None, l3=None, core=None)
    data["cpus"][3]["l2"] = None
    data["devices"] = [
        {
            "address": "0000:3b:00.0",
            "class": "0x030200",
            "vendor": "0x10de",
            "device": "0x2330",
            "numa": 1,
            "local_cpus": "8-15",
            "names": ["card0", "nvidia0"],
        },
        {"address": "0000:00:1f.6", "class": "0x020000", "numa": None, "names": ["eth0"]},
    ]
    odd = type(topology).from_json(data)
    wire = convert.topology_message(odd).SerializeToString()
    back = convert.topology_from_message(tpb.NodeTopology.FromString(wire))
    assert back == odd and len(back.devices) == 2
    assert back.to_json() == odd.to_json()


def test_container_refs_need_a_pod_and_container_or_an_id() -> None:
    with pytest.raises(InputError):
        ContainerRef(pod_uid="u")
    assert ContainerRef(container_id="abc").container_id == "abc"


# ---------------------------------------------------------------------- corepin report --agent
@needs_two_cpus
def test_report_agent_prints_what_host_mode_prints_for_the_same_state(
    server: GrpcServer, client: AgentClient, state_dir: Path, sleeper: list[subprocess.Popen[bytes]]
) -> None:
    p = start_sleep(sleeper)
    client.allocate(AllocationSpec.build(cpus=1, owner=ProcessRef(p.pid), name="napper"))
    socket_path = server.listen.socket
    assert socket_path is not None
    for fmt in ("json", "table", "yaml", "svg"):
        remote = run_corepin("report", "--agent", socket_path, "-o", fmt)
        local = run_corepin("report", "--state-dir", str(state_dir), "--cgroups", "off", "-o", fmt)
        assert remote.returncode == 0, remote.stderr
        assert remote.stdout == local.stdout, fmt
    data = json.loads(run_corepin("report", "--agent", socket_path, "-o", "json").stdout)
    assert data["allocations"][0]["name"] == "napper"
    assert data["allocations"][0]["status"] == "running"
    svg = run_corepin("report", "--agent", socket_path, "-o", "svg")
    assert "<svg" in svg.stdout and "napper (pid" in svg.stdout


def test_report_agent_of_a_missing_socket_exits_4_with_one_line(sock_dir: Path) -> None:
    done = run_corepin("report", "--agent", str(sock_dir / "none.sock"))
    assert done.returncode == 4
    assert done.stderr.count("\n") == 1 and "no corepin agent socket" in done.stderr


def test_report_agent_refuses_host_state_options() -> None:
    done = run_corepin("report", "--agent", "/run/x.sock", "--state-dir", "/tmp")
    assert done.returncode == 2 and "--state-dir" in done.stderr


@needs_two_cpus
def test_allocate_calls_count_as_pinning_requests_and_errors_by_reason(
    backend: HostBackend, sock_dir: Path, sleeper: list[subprocess.Popen[bytes]]
) -> None:
    from corepin.agent.node.metrics import AgentMetrics

    metrics = AgentMetrics()
    p, q = start_sleep(sleeper), start_sleep(sleeper)
    with (
        GrpcServer(backend, Listen.unix(str(sock_dir / "m.sock")), metrics=metrics) as srv,
        AgentClient(srv.endpoint) as c,
    ):
        c.allocate(AllocationSpec.build(cpus=1, owner=ProcessRef(p.pid)))
        with pytest.raises(AllocationError):
            c.allocate(AllocationSpec.build(cpus=len(ONLINE) + 1, owner=ProcessRef(q.pid)))
        with pytest.raises(InputError):
            c.allocate(AllocationSpec.build(cpus=1))
    sample = metrics.registry.get_sample_value
    assert sample("corepin_pinning_requests_total") == 3
    assert sample("corepin_pinning_errors_total", {"reason": "not_enough_cpus"}) == 1
    assert sample("corepin_pinning_errors_total", {"reason": "no_owner"}) == 1
