"""`NriPlugin` against a real peer: the fake runtime of tests/support/nri_runtime.py on a unix
socket (registration, Configure, Synchronize, events, errors, restarts, a pre-connected socket)."""

from __future__ import annotations

import logging
import shutil
import socket
import struct
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from corepin.core.errors import InputError
from corepin.nri import ttrpc
from corepin.nri.gen import api_pb2
from corepin.nri.plugin import NriPlugin, event_mask
from corepin.nri.ttrpc import NriError
from support.nri_runtime import (
    FakeRuntime,
    RuntimeCallError,
    Session,
    container,
    event_bit,
    pod,
)

EVENTS = (
    api_pb2.RUN_POD_SANDBOX,
    api_pb2.CREATE_CONTAINER,
    api_pb2.UPDATE_CONTAINER,
    api_pb2.STOP_CONTAINER,
    api_pb2.REMOVE_CONTAINER,
)
WAIT = 10.0


class Recorder:
    """Handlers that record every call (with the thread it ran on) and answer as told."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []
        self.threads: set[str] = set()
        self.fail: dict[str, Exception] = {}
        self.sync_updates: list[api_pb2.ContainerUpdate] = []
        self.create_answer = api_pb2.CreateContainerResponse()
        self.on_create: Callable[[api_pb2.CreateContainerRequest], None] | None = None
        self.disconnects = threading.Semaphore(0)
        self.shutdowns = threading.Event()

    def _record(self, name: str, value: object = None) -> None:
        self.calls.append((name, value))
        self.threads.add(threading.current_thread().name)
        if name in self.fail:
            raise self.fail[name]

    def names(self) -> list[str]:
        return [name for name, _ in self.calls]

    def configure(self, req: api_pb2.ConfigureRequest) -> None:
        self._record("configure", req)

    def synchronize(
        self, pods: Sequence[api_pb2.PodSandbox], containers: Sequence[api_pb2.Container]
    ) -> Sequence[api_pb2.ContainerUpdate]:
        self._record("synchronize", (list(pods), list(containers)))
        return self.sync_updates

    def create_container(
        self, req: api_pb2.CreateContainerRequest
    ) -> api_pb2.CreateContainerResponse:
        self._record("create_container", req)
        if self.on_create is not None:
            self.on_create(req)
        return self.create_answer

    def update_container(
        self, req: api_pb2.UpdateContainerRequest
    ) -> api_pb2.UpdateContainerResponse:
        self._record("update_container", req)
        return api_pb2.UpdateContainerResponse()

    def stop_container(self, req: api_pb2.StopContainerRequest) -> api_pb2.StopContainerResponse:
        self._record("stop_container", req)
        return api_pb2.StopContainerResponse()

    def state_change(self, ev: api_pb2.StateChangeEvent) -> None:
        self._record("state_change", ev.event)

    def shutdown(self) -> None:
        self._record("shutdown")
        self.shutdowns.set()

    def disconnected(self) -> None:
        self._record("disconnected")
        self.disconnects.release()


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    """A short directory for sockets (a unix socket path has at most 107 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="nri-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


class Bed:
    """A fake runtime, plugins on it, and their serve threads; everything closed afterwards."""

    def __init__(self, sock_dir: Path) -> None:
        self.path = sock_dir / "nri.sock"
        self.runtimes: list[FakeRuntime] = []
        self.plugins: list[NriPlugin] = []
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []

    def runtime(self, **kwargs: object) -> FakeRuntime:
        runtime = FakeRuntime(self.path, **kwargs)  # type: ignore[arg-type]
        self.runtimes.append(runtime)
        return runtime.start()

    def plugin(self, handlers: Recorder, **kwargs: object) -> NriPlugin:
        options: dict[str, object] = {
            "socket_path": str(self.path),
            "name": "corepin",
            "index": "10",
            "events": EVENTS,
        }
        options.update(kwargs)
        plugin = NriPlugin(handlers, **options)  # type: ignore[arg-type]
        self.plugins.append(plugin)
        return plugin

    def serve(self, plugin: NriPlugin) -> threading.Thread:
        thread = threading.Thread(target=plugin.serve, args=(self.stop,), daemon=True)
        self.threads.append(thread)
        thread.start()
        return thread

    def close(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(WAIT)
        for plugin in self.plugins:
            plugin.close()
        for runtime in self.runtimes:
            runtime.close()
        assert not any(t.is_alive() for t in self.threads), "a serve() did not return"


@pytest.fixture
def bed(sock_dir: Path) -> Iterator[Bed]:
    bed = Bed(sock_dir)
    yield bed
    bed.close()


def connected(
    bed: Bed, handlers: Recorder | None = None, **runtime: object
) -> tuple[FakeRuntime, NriPlugin, Recorder, Session]:
    """A runtime, a plugin registered on it and served, and the runtime's session."""
    handlers = handlers or Recorder()
    fake = bed.runtime(**runtime)
    plugin = bed.plugin(handlers)
    plugin.connect_first()
    bed.serve(plugin)
    session = fake.wait_session()
    assert plugin.wait_synchronized(WAIT)
    return fake, plugin, handlers, session


# ---------------------------------------------------------------- registration and set-up
def test_registration_configure_and_synchronize(bed: Bed) -> None:
    p = pod("web", annotations={"corepin.io/policy": "exclusive"})
    c = container(p, "app", cpu_request=2, cpu_limit=2, state=api_pb2.CONTAINER_RUNNING)
    handlers = Recorder()
    handlers.sync_updates = [
        api_pb2.ContainerUpdate(
            container_id=c.id,
            linux=api_pb2.LinuxContainerUpdate(
                resources=api_pb2.LinuxResources(cpu=api_pb2.LinuxCPU(cpus="2-3"))
            ),
        )
    ]
    fake, plugin, handlers, session = connected(bed, handlers, pods=[p], containers=[c])
    assert session.registration == api_pb2.RegisterPluginRequest(
        plugin_name="corepin", plugin_idx="10"
    )
    # RUN_POD_SANDBOX 1, CREATE 4, UPDATE 8, STOP 10, REMOVE 11: bits 0, 3, 7, 9, 10
    assert session.configure_response is not None
    assert session.configure_response.events == 0b110_1000_1001 == 0x689
    assert handlers.names() == ["configure", "synchronize"]
    pods, containers = handlers.calls[1][1]  # type: ignore[misc]
    assert [x.annotations["corepin.io/policy"] for x in pods] == ["exclusive"]
    assert [(x.id, x.linux.resources.cpu.quota.value) for x in containers] == [(c.id, 200_000)]
    assert containers[0].linux.resources.cpu.shares.value == 2048
    assert fake.containers[c.id].linux.resources.cpu.cpus == "2-3"  # the update was applied
    assert plugin.runtime == ("containerd", "v1.7.24")
    assert plugin.features.request_timeout is None and plugin.features.nri_version is None
    assert plugin.features.multipart_sync is False
    assert plugin.connected and plugin.registrations == 1


def test_the_subscription_mask_sets_bit_event_minus_one() -> None:
    assert event_mask([api_pb2.CREATE_CONTAINER]) == 0b1000
    assert event_mask([api_pb2.RUN_POD_SANDBOX, api_pb2.REMOVE_CONTAINER]) == 0b100_0000_0001
    with pytest.raises(InputError, match="unknown NRI event 15"):
        event_mask([15])
    with pytest.raises(InputError, match="at least one event"):
        event_mask([])


def test_a_multi_part_synchronize_reaches_the_handler_once_whole(bed: Bed) -> None:
    pods = [pod(f"p{i}") for i in range(5)]
    ctrs = [container(p, "c") for p in pods]
    _fake, plugin, handlers, session = connected(
        bed, sync_part=2, pods=pods, containers=ctrs, newer=True
    )
    assert handlers.names() == ["configure", "synchronize"]
    got_pods, got_ctrs = handlers.calls[1][1]  # type: ignore[misc]
    assert [p.id for p in got_pods] == [p.id for p in pods]
    assert [c.id for c in got_ctrs] == [c.id for c in ctrs]
    assert [(a.more, len(a.update)) for a in session.sync_answers] == [
        (True, 0),
        (True, 0),
        (False, 0),
    ]
    assert plugin.features.multipart_sync
    assert plugin.features.request_timeout == 5.0
    assert plugin.features.registration_timeout == 5.0
    assert plugin.features.nri_version == "v0.12.0"


def test_events_a_0_6_runtime_does_not_know_are_left_out_of_the_mask(bed: Bed) -> None:
    fake = bed.runtime()
    plugin = bed.plugin(Recorder(), events=[api_pb2.CREATE_CONTAINER, api_pb2.UPDATE_POD_SANDBOX])
    plugin.connect_first()
    assert fake.wait_session().events == event_bit(api_pb2.CREATE_CONTAINER)
    assert plugin.features.events == 0b1000


def test_a_newer_runtime_gets_the_newer_events(bed: Bed) -> None:
    fake = bed.runtime(newer=True)
    plugin = bed.plugin(Recorder(), events=[api_pb2.CREATE_CONTAINER, api_pb2.UPDATE_POD_SANDBOX])
    plugin.connect_first()
    assert fake.wait_session().events == 0b1000 | 1 << 11


@pytest.mark.parametrize("name", ["", "core-pin", "a/b", "core pin", "x\t"])
def test_a_bad_plugin_name_is_an_input_error(name: str) -> None:
    with pytest.raises(InputError, match="invalid NRI plugin name") as raised:
        NriPlugin(Recorder(), socket_path="/nonexistent", name=name, index="10", events=EVENTS)
    assert repr(name) in str(raised.value) and raised.value.exit_code == 2


@pytest.mark.parametrize("index", ["", "1", "100", "ab", "1a", "٣٣"])
def test_a_bad_plugin_index_is_an_input_error(index: str) -> None:
    with pytest.raises(InputError, match="invalid NRI plugin index") as raised:
        NriPlugin(
            Recorder(), socket_path="/nonexistent", name="corepin", index=index, events=EVENTS
        )
    assert repr(index) in str(raised.value)


def test_a_missing_socket_is_an_environment_problem_naming_it(sock_dir: Path) -> None:
    path = sock_dir / "absent.sock"
    plugin = NriPlugin(Recorder(), socket_path=str(path), name="corepin", index="10", events=EVENTS)
    with pytest.raises(NriError) as raised:
        plugin.connect_first()
    plugin.close()
    error = raised.value
    assert error.exit_code == 4 and error.reason == "nri_unreachable"
    assert str(path) in str(error) and "no such socket" in str(error)
    assert "\n" not in str(error)


def test_a_socket_nobody_listens_on_is_refused(sock_dir: Path) -> None:
    path = sock_dir / "dead.sock"
    with socket.socket(socket.AF_UNIX) as dead:
        dead.bind(str(path))  # bound, never listening
    plugin = NriPlugin(Recorder(), socket_path=str(path), name="corepin", index="10", events=EVENTS)
    with pytest.raises(NriError, match="connection refused"):
        plugin.connect_first()
    plugin.close()


def test_a_runtime_that_never_answers_the_registration_fails_it(sock_dir: Path) -> None:
    path = sock_dir / "mute.sock"
    with socket.socket(socket.AF_UNIX) as mute:
        mute.bind(str(path))
        mute.listen(1)
        plugin = NriPlugin(
            Recorder(), socket_path=str(path), name="corepin", index="10", events=EVENTS
        )
        with pytest.raises(NriError) as raised:
            plugin.connect_first(timeout=0.2)
        plugin.close()
    assert raised.value.reason == "nri_registration_failed"
    assert str(path) in str(raised.value) and "no answer" in str(raised.value)
    assert "\n" not in str(raised.value)


# ---------------------------------------------------------------- requests
def test_create_container_is_answered_by_the_handler_on_one_dispatcher_thread(bed: Bed) -> None:
    fake, _plugin, handlers, _ = connected(bed)
    p = pod("web")
    c = container(p, "app", cpu_request=1)
    handlers.create_answer = api_pb2.CreateContainerResponse(
        adjust=api_pb2.ContainerAdjustment(
            linux=api_pb2.LinuxContainerAdjustment(
                resources=api_pb2.LinuxResources(cpu=api_pb2.LinuxCPU(cpus="4", mems="0"))
            )
        )
    )
    fake.run_pod(p)
    answer = fake.create_container(p, c)
    assert answer == handlers.create_answer
    assert fake.containers[c.id].linux.resources.cpu.cpus == "4"
    fake.start_container(c)  # START is not subscribed: not sent
    fake.update_container(c, api_pb2.LinuxResources(cpu=api_pb2.LinuxCPU(cpus="0-7")))
    fake.stop_container(c)
    fake.remove_container(c)
    assert handlers.names() == [
        "configure",
        "synchronize",
        "state_change",
        "create_container",
        "update_container",
        "stop_container",
        "state_change",
    ]
    assert [v for n, v in handlers.calls if n == "state_change"] == [
        api_pb2.RUN_POD_SANDBOX,
        api_pb2.REMOVE_CONTAINER,
    ]
    assert handlers.threads == {"corepin-nri-dispatcher"}


def test_a_handler_that_raises_is_answered_internal_and_the_connection_goes_on(
    bed: Bed, caplog: pytest.LogCaptureFixture
) -> None:
    fake, plugin, handlers, _ = connected(bed)
    handlers.fail["create_container"] = ValueError("no CPUs left")
    p = pod()
    with (
        caplog.at_level(logging.ERROR, logger="corepin.nri"),
        pytest.raises(RuntimeCallError) as raised,
    ):
        fake.create_container(p, container(p))
    assert raised.value.code == ttrpc.INTERNAL == 13
    assert "no CPUs left" in raised.value.message
    assert any("CreateContainer failed" in r.getMessage() for r in caplog.records)
    del handlers.fail["create_container"]
    assert fake.create_container(p, container(p, "second")) == api_pb2.CreateContainerResponse()
    assert plugin.connected and not fake.session.closed.is_set()


def test_an_unknown_method_or_service_is_unimplemented_and_bad_payload_invalid(bed: Bed) -> None:
    fake, plugin, *_ = connected(bed)
    code, message, _ = fake.call_raw("nri.pkg.api.v1alpha1.Plugin", "Frobnicate", b"")
    assert code == ttrpc.UNIMPLEMENTED == 12 and "Frobnicate" in message
    code, _, _ = fake.call_raw("some.Other", "Configure", b"")
    assert code == 12
    code, message, _ = fake.call_raw("nri.pkg.api.v1alpha1.Plugin", "CreateContainer", b"\xff")
    assert code == ttrpc.INVALID_ARGUMENT == 3 and "CreateContainerRequest" in message
    fake.state_change(api_pb2.RUN_POD_SANDBOX, pod())
    assert plugin.connected


def test_update_containers_from_another_thread_while_a_request_is_in_flight(bed: Bed) -> None:
    fake, plugin, handlers, _ = connected(bed, fail_update=lambda u: u.container_id == "bad")
    entered, release = threading.Event(), threading.Event()

    def hold(_: api_pb2.CreateContainerRequest) -> None:
        entered.set()
        assert release.wait(WAIT)

    handlers.on_create = hold
    p = pod()
    c = container(p, "held")
    answers: list[object] = []
    creator = threading.Thread(target=lambda: answers.append(fake.create_container(p, c)))
    creator.start()
    assert entered.wait(WAIT)
    update = api_pb2.ContainerUpdate(
        container_id="bad",
        linux=api_pb2.LinuxContainerUpdate(
            resources=api_pb2.LinuxResources(cpu=api_pb2.LinuxCPU(cpus="1"))
        ),
    )
    failed = plugin.update_containers([update])  # the dispatcher is busy: the reader is not
    assert failed == [update]
    assert fake.update_requests[-1].update == [update]
    release.set()
    creator.join(WAIT)
    assert answers == [api_pb2.CreateContainerResponse()]


def test_update_containers_from_inside_a_handler(bed: Bed) -> None:
    fake, plugin, handlers, _ = connected(bed)
    p = pod()
    other = container(p, "other")
    fake.create_container(p, other)
    results: list[list[api_pb2.ContainerUpdate]] = []
    update = api_pb2.ContainerUpdate(
        container_id=other.id,
        linux=api_pb2.LinuxContainerUpdate(
            resources=api_pb2.LinuxResources(cpu=api_pb2.LinuxCPU(cpus="0-1"))
        ),
    )
    handlers.on_create = lambda _: results.append(plugin.update_containers([update]))
    fake.create_container(p, container(p, "new"))
    assert results == [[]]
    assert fake.containers[other.id].linux.resources.cpu.cpus == "0-1"


def test_update_containers_when_not_connected_says_so(bed: Bed) -> None:
    bed.runtime()
    plugin = bed.plugin(Recorder())
    with pytest.raises(NriError) as raised:
        plugin.update_containers([])
    assert raised.value.reason == "nri_not_connected" and str(bed.path) in str(raised.value)
    plugin.connect_first()
    plugin.connect_first()  # connected already: nothing more
    assert plugin.update_containers([]) == []
    assert len(bed.runtimes[0].sessions) == 1 and plugin.registrations == 1
    plugin.close()
    with pytest.raises(NriError, match="not connected"):
        plugin.update_containers([])


def test_large_answers_go_out_in_mux_frames_the_go_runtime_can_read(bed: Bed) -> None:
    fake, _, handlers, _ = connected(bed, chunk=7)  # and the runtime cuts its own frames small
    handlers.create_answer = api_pb2.CreateContainerResponse(
        update=[
            api_pb2.ContainerUpdate(
                container_id=f"container-{i:04d}",
                linux=api_pb2.LinuxContainerUpdate(
                    resources=api_pb2.LinuxResources(cpu=api_pb2.LinuxCPU(cpus="0-63,128-191"))
                ),
            )
            for i in range(1000)
        ]
    )
    p = pod()
    answer = fake.create_container(p, container(p))
    assert answer == handlers.create_answer
    assert len(handlers.create_answer.SerializeToString()) > 4 * 4096
    assert fake.oversized_frames == []


def test_the_observer_hears_of_every_request(bed: Bed) -> None:
    seen: list[tuple[str, int]] = []
    fake = bed.runtime()
    plugin = bed.plugin(Recorder(), observer=lambda method, _s, code: seen.append((method, code)))
    plugin.connect_first()
    fake.wait_session()
    assert plugin.wait_synchronized(WAIT)
    fake.call_raw("nri.pkg.api.v1alpha1.Plugin", "Nope", b"")
    # requests run in order: once the next one is answered, the observer has heard of "Nope"
    fake.state_change(api_pb2.RUN_POD_SANDBOX, pod())
    assert seen[:3] == [("Configure", 0), ("Synchronize", 0), ("Nope", 12)]


# ---------------------------------------------------------------- losing the runtime
def test_a_runtime_restart_is_survived_by_registering_again(bed: Bed) -> None:
    p = pod()
    c = container(p)
    fake, plugin, handlers, _ = connected(bed, pods=[p], containers=[c])
    fake.restart()
    assert handlers.disconnects.acquire(timeout=WAIT)
    session = fake.wait_session(2)
    assert session.registration is not None and session.registration.plugin_idx == "10"
    assert plugin.wait_synchronized(WAIT)
    assert handlers.names() == [
        "configure",
        "synchronize",
        "disconnected",
        "configure",
        "synchronize",
    ]
    assert [x.id for x in handlers.calls[-1][1][1]] == [c.id]  # type: ignore[index]
    assert plugin.registrations == 2 and plugin.connected


def test_the_plugin_keeps_redialling_while_the_runtime_is_away(bed: Bed) -> None:
    fake, plugin, handlers, _ = connected(bed)
    fake.close()
    assert handlers.disconnects.acquire(timeout=WAIT)
    assert not plugin.connected
    with pytest.raises(NriError, match="not connected"):
        plugin.update_containers([])
    fake.start()
    fake.wait_session(2)
    assert plugin.wait_synchronized(WAIT) and plugin.registrations == 2
    assert handlers.names().count("disconnected") == 1


def test_shutdown_is_answered_then_handled_and_the_plugin_redials(bed: Bed) -> None:
    fake, _plugin, handlers, _ = connected(bed)
    fake.shutdown()
    assert handlers.shutdowns.wait(WAIT)
    fake.drop("runtime stopped")
    assert handlers.disconnects.acquire(timeout=WAIT)
    fake.wait_session(2)
    assert handlers.names()[:4] == ["configure", "synchronize", "shutdown", "disconnected"]


@pytest.mark.parametrize(
    "garbage",
    [
        pytest.param(struct.pack(">II", 1, 0xFFFFFFF0), id="mux-length"),
        pytest.param(
            struct.pack(">II", 1, 10) + struct.pack(">IIBB", 0xFFFFFF, 1, 1, 0),
            id="ttrpc-length",
        ),
        pytest.param(
            struct.pack(">II", 1, 13) + struct.pack(">IIBB", 3, 1, 1, 0) + b"\xff\xff\xff",
            id="envelope",
        ),
    ],
)
def test_garbage_from_the_runtime_closes_the_connection_with_a_reason(
    bed: Bed, caplog: pytest.LogCaptureFixture, garbage: bytes
) -> None:
    fake, plugin, handlers, _ = connected(bed)
    with caplog.at_level(logging.WARNING, logger="corepin.nri"):
        fake.inject(garbage)
        assert handlers.disconnects.acquire(timeout=WAIT)
    lost = [
        r.getMessage() for r in caplog.records if "connection to the runtime lost" in r.getMessage()
    ]
    assert lost and "protocol error" in lost[0]
    fake.wait_session(2)  # the plugin dialled again
    assert plugin.wait_synchronized(WAIT)


def test_the_runtimes_pre_connected_socket_is_used_and_not_redialled(bed: Bed) -> None:
    ours, theirs = socket.socketpair()
    fake = FakeRuntime()
    bed.runtimes.append(fake)
    fake.attach(ours)
    handlers = Recorder()
    plugin = bed.plugin(
        handlers,
        socket_path=str(bed.path),  # nothing there: it must not be dialled
        environ={"NRI_PLUGIN_SOCKET": str(theirs.detach())},
    )
    plugin.connect_first()
    assert plugin.preconnected and "NRI_PLUGIN_SOCKET" in plugin.where
    fake.wait_session()
    assert plugin.wait_synchronized(WAIT)
    server = bed.serve(plugin)
    fake.drop("the runtime ends its plugin")
    server.join(WAIT)
    assert not server.is_alive(), "serve() must return when the runtime's socket closes"
    assert handlers.names() == ["configure", "synchronize", "disconnected"]
    assert plugin.registrations == 1


@pytest.mark.parametrize("value", ["x", "99999"])
def test_a_bad_pre_connected_socket_names_the_variable(value: str) -> None:
    plugin = NriPlugin(
        Recorder(),
        socket_path="/nonexistent",
        name="corepin",
        index="10",
        events=EVENTS,
        environ={"NRI_PLUGIN_SOCKET": value},
    )
    with pytest.raises(NriError, match=f"NRI_PLUGIN_SOCKET={value!r}|NRI_PLUGIN_SOCKET={value}"):
        plugin.connect_first()
    plugin.close()


def test_close_stops_everything_without_a_disconnected_call(bed: Bed) -> None:
    fake, plugin, handlers, session = connected(bed)
    bed.stop.set()
    for thread in bed.threads:
        thread.join(WAIT)
    plugin.close()
    assert fake.wait_closed(session)
    assert "disconnected" not in handlers.names()
    assert not any(
        t.name == "corepin-nri-dispatcher" and t.is_alive() for t in threading.enumerate()
    )
