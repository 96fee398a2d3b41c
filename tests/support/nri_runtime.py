"""A container runtime's side of NRI, for tests: a real unix-socket peer, no containerd.

`FakeRuntime` listens on a socket path (or serves a socket given to it, as a runtime that
starts its plugin does), accepts a plugin and speaks the wire protocol as containerd 1.7 (NRI
0.6.1) does: it waits for RegisterPlugin, answers it, then calls Configure and Synchronize with
the pods and containers it holds, and afterwards whatever the test asks (`create_container`,
`update_container`, `stop_container`, `state_change`, `shutdown`, ...). It answers the plugin's
UpdateContainers and records them. It applies what the plugin answers (adjustments, updates) to
the containers it holds, so that a restarted runtime synchronizes the plugin with what it was
told. `restart` closes everything and listens again on the same path; `inject` writes raw bytes.

Its framing is written here on purpose, from the protocol's description, without
`corepin.nri`'s code: a bug in the plugin's framing cannot hide behind the same bug here.
A mux frame from the plugin larger than 4096 bytes is recorded in `oversized_frames`: the Go
runtime reads every mux frame into a buffer of that size and drops the connection on a larger
one.

Typical use::

    with FakeRuntime(tmp_path / "nri.sock") as runtime:
        plugin = NriPlugin(handlers, socket_path=str(runtime.path), name="corepin", ...)
        plugin.connect_first()
        session = runtime.wait_session()          # registered, configured, synchronized
        p = pod("web", annotations={...})
        c = container(p, "app", cpu_request=2, cpu_limit=2)
        runtime.run_pod(p)
        answer = runtime.create_container(p, c)  # the plugin's CreateContainerResponse
"""

from __future__ import annotations

import contextlib
import itertools
import socket
import struct
import threading
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from google.protobuf.message import Message

from corepin.nri.gen import api_pb2, ttrpc_pb2

PLUGIN_SERVICE = "nri.pkg.api.v1alpha1.Plugin"
RUNTIME_SERVICE = "nri.pkg.api.v1alpha1.Runtime"
PLUGIN_CONN, RUNTIME_CONN = 1, 2
REQUEST, RESPONSE = 1, 2
#: the Go runtime's read buffer for one mux frame
GO_READ_BUFFER = 4096
#: the events NRI 0.6.1 knows (1..11) and the ones newer runtimes know (1..14)
VALID_EVENTS_0_6 = (1 << 11) - 1
VALID_EVENTS_NEWER = (1 << 14) - 1

M = TypeVar("M", bound=Message)


class RuntimeCallError(Exception):
    """The plugin answered a call of the runtime with a failure status."""

    def __init__(self, method: str, code: int, message: str) -> None:
        super().__init__(f"{method}: status {code}: {message}")
        self.method = method
        self.code = code
        self.message = message


class SessionClosed(Exception):
    """The plugin's connection ended while the runtime waited for an answer."""


# ---------------------------------------------------------------- builders
def pod(
    name: str = "pod0",
    *,
    namespace: str = "default",
    uid: str | None = None,
    id: str | None = None,
    annotations: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    cgroup_parent: str = "",
) -> api_pb2.PodSandbox:
    """A pod sandbox as the runtime describes it (ids made up when not given)."""
    uid = uid or str(uuid.uuid4())
    return api_pb2.PodSandbox(
        id=id or "sandbox-" + uid[:8],
        name=name,
        uid=uid,
        namespace=namespace,
        annotations=dict(annotations or {}),
        labels=dict(labels or {}),
        linux=api_pb2.LinuxPodSandbox(cgroup_parent=cgroup_parent),
    )


def container(
    sandbox: api_pb2.PodSandbox,
    name: str = "c0",
    *,
    id: str | None = None,
    annotations: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    cpu_request: float | None = None,
    cpu_limit: float | None = None,
    shares: int | None = None,
    quota: int | None = None,
    period: int = 100_000,
    cpus: str = "",
    mems: str = "",
    state: int = api_pb2.CONTAINER_UNKNOWN,
    pid: int = 0,
) -> api_pb2.Container:
    """A container of `sandbox` as the runtime describes it. `cpu_request`/`cpu_limit` (in
    CPUs) become CFS shares and quota the way the kubelet converts them (shares = millicores *
    1024 / 1000, at least 2; quota = millicores * period / 1000, at least 1000); `shares` and
    `quota` set them as given instead."""
    cpu = api_pb2.LinuxCPU(cpus=cpus, mems=mems)
    if cpu_request is not None and shares is None:
        shares = max(2, round(cpu_request * 1000) * 1024 // 1000)
    if cpu_limit is not None and quota is None:
        quota = max(1000, round(cpu_limit * 1000) * period // 1000)
    if shares is not None:
        cpu.shares.value = shares
    if quota is not None:
        cpu.quota.value = quota
        cpu.period.value = period
    return api_pb2.Container(
        id=id or "ctr-" + uuid.uuid4().hex[:12],
        pod_sandbox_id=sandbox.id,
        name=name,
        state=state,
        annotations=dict(annotations or {}),
        labels=dict(labels or {}),
        pid=pid,
        linux=api_pb2.LinuxContainer(resources=api_pb2.LinuxResources(cpu=cpu)),
    )


def apply_resources(target: api_pb2.LinuxResources, change: api_pb2.LinuxResources) -> None:
    """Apply `change` to `target` as the runtime applies an adjustment or an update: every
    field set in `change` (an optional value even when zero, a CPU or memory list when not
    empty) replaces the one of `target`."""
    for part in ("memory", "cpu"):
        if not change.HasField(part):
            continue
        source, dest = getattr(change, part), getattr(target, part)
        for descriptor, value in source.ListFields():
            if descriptor.message_type is not None:
                getattr(dest, descriptor.name).CopyFrom(value)
            else:
                setattr(dest, descriptor.name, value)
    for name in ("blockio_class", "rdt_class"):
        if change.HasField(name):
            getattr(target, name).CopyFrom(getattr(change, name))
    target.unified.update(change.unified)


def event_bit(event: int) -> int:
    """The bit of `event` in a subscription mask."""
    return 1 << (event - 1)


# ---------------------------------------------------------------- one plugin connection
@dataclass
class Session:
    """One plugin connection and what happened on it."""

    sock: socket.socket
    number: int
    registration: api_pb2.RegisterPluginRequest | None = None
    events: int = 0  # the subscription (0 before Configure)
    configure_response: api_pb2.ConfigureResponse | None = None
    sync_updates: list[api_pb2.ContainerUpdate] = field(default_factory=list)
    sync_answers: list[api_pb2.SynchronizeResponse] = field(default_factory=list)
    error: str | None = None  # why the runtime gave up on the plugin, if it did
    close_reason: str | None = None
    registered: threading.Event = field(default_factory=threading.Event)
    ready: threading.Event = field(default_factory=threading.Event)
    closed: threading.Event = field(default_factory=threading.Event)
    write_lock: threading.Lock = field(default_factory=threading.Lock)
    lock: threading.Lock = field(default_factory=threading.Lock)
    pending: dict[int, list[object]] = field(default_factory=dict)
    streams: itertools.count[int] = field(default_factory=lambda: itertools.count(1, 2))

    def subscribed(self, event: int) -> bool:
        """True when the plugin subscribed to `event` (an empty mask means every event)."""
        return self.events == 0 or bool(self.events & event_bit(event))


class FakeRuntime:
    """The runtime side of NRI (see the module's docstring). Use as a context manager, or call
    `start` and `close`. `newer=True` plays a newer runtime (request and registration timeouts
    and an NRI version in Configure, events 12-14 valid); `sync_part` > 0 splits Synchronize
    into parts of that many pods and containers (a newer runtime's multi-part Synchronize);
    `chunk` cuts every frame the runtime writes into mux frames of that many bytes;
    `fail_update(update)` True makes the runtime report that update failed."""

    def __init__(
        self,
        path: str | Path | None = None,
        *,
        name: str = "containerd",
        version: str = "v1.7.24",
        config: str = "",
        newer: bool = False,
        sync_part: int = 0,
        chunk: int = 0,
        call_timeout: float = 5.0,
        register_timeout: float = 5.0,
        pods: Iterable[api_pb2.PodSandbox] = (),
        containers: Iterable[api_pb2.Container] = (),
        fail_update: Callable[[api_pb2.ContainerUpdate], bool] | None = None,
    ) -> None:
        self.path = Path(path) if path is not None else None
        self.name, self.version, self.config = name, version, config
        self.newer = newer or sync_part > 0
        self.sync_part = sync_part
        self.chunk = chunk
        self.call_timeout = call_timeout
        self.register_timeout = register_timeout
        self.fail_update = fail_update
        self.pods: dict[str, api_pb2.PodSandbox] = {p.id: p for p in pods}
        self.containers: dict[str, api_pb2.Container] = {c.id: c for c in containers}
        self.sessions: list[Session] = []
        self.update_requests: list[api_pb2.UpdateContainersRequest] = []
        self.oversized_frames: list[int] = []
        self.protocol_errors: list[str] = []
        self._changed = threading.Condition()
        self._listener: socket.socket | None = None
        self._threads: list[threading.Thread] = []
        self._stopping = False

    # ------------------------------------------------------------ life
    def __enter__(self) -> FakeRuntime:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> FakeRuntime:
        """Listen on `path` (accepting one plugin after another)."""
        assert self.path is not None, "a FakeRuntime without a path serves a given socket"
        self._stopping = False
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(self.path))
        listener.listen(4)
        listener.settimeout(0.05)
        self._listener = listener
        self._spawn(self._accept_loop, listener)
        return self

    def attach(self, sock: socket.socket) -> Session:
        """Serve the plugin at the other end of an already connected `sock` (the runtime that
        started its plugin with NRI_PLUGIN_SOCKET)."""
        self._stopping = False
        return self._begin(sock)

    def drop(self, reason: str = "dropped by the test") -> None:
        """Close the current plugin connection (the runtime keeps listening)."""
        if self.sessions:
            self._end(self.sessions[-1], reason)

    def restart(self) -> None:
        """A runtime restart: close the listener and every connection, listen again."""
        self.close()
        self.start()

    def close(self) -> None:
        """Close the listener and every connection, and wait for the threads."""
        self._stopping = True
        if self._listener is not None:
            self._listener.close()
            self._listener = None
            if self.path is not None:
                with contextlib.suppress(FileNotFoundError):
                    self.path.unlink()
        for session in list(self.sessions):
            self._end(session, "runtime closed")
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(5)
        self._threads = [t for t in self._threads if t.is_alive()]

    # ------------------------------------------------------------ waiting
    @property
    def session(self) -> Session:
        """The latest plugin connection."""
        assert self.sessions, "no plugin has connected"
        return self.sessions[-1]

    def wait_session(self, number: int | None = None, timeout: float = 10.0) -> Session:
        """The `number`th connection (1-based; default: the latest one that has not ended, or
        that the runtime refused) once registered, configured and synchronized;
        AssertionError on timeout or when the runtime refused the plugin."""

        def found() -> Session | None:
            if number is not None:
                return self.sessions[number - 1] if len(self.sessions) >= number else None
            live = [s for s in self.sessions if not s.closed.is_set() or s.error is not None]
            return live[-1] if live else None

        with self._changed:
            ok = self._changed.wait_for(
                lambda: (s := found()) is not None and (s.ready.is_set() or s.error is not None),
                timeout,
            )
        session = found()
        assert ok and session is not None, f"no plugin session {number or ''} in {timeout} s"
        assert session.error is None, f"the runtime refused the plugin: {session.error}"
        return session

    def wait_closed(self, session: Session | None = None, timeout: float = 10.0) -> bool:
        """Wait until `session` (default: the latest) has ended; True when it has."""
        return (session or self.session).closed.wait(timeout)

    def wait_updates(
        self, count: int, timeout: float = 10.0
    ) -> list[api_pb2.UpdateContainersRequest]:
        """The plugin's UpdateContainers calls, once there are at least `count`."""
        with self._changed:
            ok = self._changed.wait_for(lambda: len(self.update_requests) >= count, timeout)
        assert ok, (
            f"{len(self.update_requests)} UpdateContainers calls, not {count}, in {timeout} s"
        )
        return list(self.update_requests)

    # ------------------------------------------------------------ the runtime's events
    def configure(self, session: Session | None = None) -> api_pb2.ConfigureResponse:
        """Call Configure (done by itself after registration)."""
        session = session or self.session
        request = api_pb2.ConfigureRequest(
            config=self.config, runtime_name=self.name, runtime_version=self.version
        )
        if self.newer:
            request.registration_timeout = int(self.register_timeout * 1000)
            request.request_timeout = int(self.call_timeout * 1000)
            request.nri_version = "v0.12.0"
        answer = self.call("Configure", request, api_pb2.ConfigureResponse, session)
        valid = VALID_EVENTS_NEWER if self.newer else VALID_EVENTS_0_6
        if answer.events & ~valid:
            self._refuse(session, f"invalid plugin events: 0x{answer.events & ~valid:x}")
        session.events = answer.events
        session.configure_response = answer
        return answer

    def synchronize(self, session: Session | None = None) -> list[api_pb2.ContainerUpdate]:
        """Call Synchronize with every pod and container held (in parts when `sync_part`);
        applies the updates answered and returns them."""
        session = session or self.session
        pods, ctrs = list(self.pods.values()), list(self.containers.values())
        size = self.sync_part or max(len(pods), len(ctrs), 1)
        start = 0
        while True:
            more = start + size < max(len(pods), len(ctrs))
            request = api_pb2.SynchronizeRequest(
                pods=pods[start : start + size], containers=ctrs[start : start + size], more=more
            )
            answer = self.call("Synchronize", request, api_pb2.SynchronizeResponse, session)
            session.sync_answers.append(answer)
            if not more:
                break
            if answer.update or not answer.more:
                self._refuse(session, "plugin does not handle split sync requests")
            start += size
        session.sync_updates = list(answer.update)
        self._apply_updates(answer.update)
        return session.sync_updates

    def run_pod(self, sandbox: api_pb2.PodSandbox) -> None:
        """RunPodSandbox: hold the pod and tell the plugin (StateChange, when subscribed)."""
        self.pods[sandbox.id] = sandbox
        self.state_change(api_pb2.RUN_POD_SANDBOX, sandbox)

    def create_container(
        self, sandbox: api_pb2.PodSandbox, ctr: api_pb2.Container
    ) -> api_pb2.CreateContainerResponse | None:
        """CreateContainer: ask the plugin (None when it did not subscribe), apply its
        adjustment to `ctr` and its updates to the others, hold `ctr` (state CREATED)."""
        self.pods.setdefault(sandbox.id, sandbox)
        held = api_pb2.Container()
        held.CopyFrom(ctr)
        held.state = api_pb2.CONTAINER_CREATED
        answer = None
        if self._ready().subscribed(api_pb2.CREATE_CONTAINER):
            request = api_pb2.CreateContainerRequest(pod=sandbox, container=held)
            answer = self.call("CreateContainer", request, api_pb2.CreateContainerResponse)
            apply_resources(held.linux.resources, answer.adjust.linux.resources)
            for key, value in answer.adjust.annotations.items():
                held.annotations[key] = value
        self.containers[held.id] = held
        if answer is not None:
            self._apply_updates(answer.update)
        self.state_change(api_pb2.POST_CREATE_CONTAINER, sandbox, held)
        return answer

    def start_container(self, ctr: api_pb2.Container) -> None:
        """StartContainer: state RUNNING, StateChange START and POST_START when subscribed."""
        held = self.containers[ctr.id]
        held.state = api_pb2.CONTAINER_RUNNING
        self.state_change(api_pb2.START_CONTAINER, self.pods[held.pod_sandbox_id], held)
        self.state_change(api_pb2.POST_START_CONTAINER, self.pods[held.pod_sandbox_id], held)

    def update_container(
        self, ctr: api_pb2.Container, resources: api_pb2.LinuxResources
    ) -> api_pb2.UpdateContainerResponse | None:
        """UpdateContainerResources: ask the plugin, then apply `resources` and the updates it
        answered (an update of `ctr` itself overrides `resources`)."""
        held = self.containers[ctr.id]
        answer = None
        if self._ready().subscribed(api_pb2.UPDATE_CONTAINER):
            request = api_pb2.UpdateContainerRequest(
                pod=self.pods[held.pod_sandbox_id], container=held, linux_resources=resources
            )
            answer = self.call("UpdateContainer", request, api_pb2.UpdateContainerResponse)
        apply_resources(held.linux.resources, resources)
        if answer is not None:
            self._apply_updates(answer.update)
        return answer

    def stop_container(self, ctr: api_pb2.Container) -> api_pb2.StopContainerResponse | None:
        """StopContainer: ask the plugin, apply its updates, state STOPPED."""
        held = self.containers[ctr.id]
        answer = None
        if self._ready().subscribed(api_pb2.STOP_CONTAINER):
            request = api_pb2.StopContainerRequest(
                pod=self.pods[held.pod_sandbox_id], container=held
            )
            answer = self.call("StopContainer", request, api_pb2.StopContainerResponse)
            self._apply_updates(answer.update)
        held.state = api_pb2.CONTAINER_STOPPED
        return answer

    def remove_container(self, ctr: api_pb2.Container) -> None:
        """RemoveContainer: forget `ctr`, StateChange REMOVE_CONTAINER when subscribed."""
        held = self.containers.pop(ctr.id)
        self.state_change(api_pb2.REMOVE_CONTAINER, self.pods[held.pod_sandbox_id], held)

    def remove_pod(self, sandbox: api_pb2.PodSandbox) -> None:
        """StopPodSandbox and RemovePodSandbox (its containers must be gone)."""
        self.state_change(api_pb2.STOP_POD_SANDBOX, sandbox)
        self.pods.pop(sandbox.id, None)
        self.state_change(api_pb2.REMOVE_POD_SANDBOX, sandbox)

    def state_change(
        self, event: int, sandbox: api_pb2.PodSandbox, ctr: api_pb2.Container | None = None
    ) -> bool:
        """Tell the plugin about `event` when it subscribed; True when it was told."""
        if not self._ready().subscribed(event):
            return False
        request = api_pb2.StateChangeEvent(event=event, pod=sandbox, container=ctr)
        self.call("StateChange", request, api_pb2.Empty)
        return True

    def shutdown(self) -> None:
        """Call Shutdown (the runtime is going away; it closes the connection afterwards only
        when the test says so: `drop`, `restart`, `close`)."""
        self.call("Shutdown", api_pb2.Empty(), api_pb2.Empty)

    # ------------------------------------------------------------ the wire
    def call(
        self,
        method: str,
        request: Message,
        response_type: type[M],
        session: Session | None = None,
        *,
        service: str = PLUGIN_SERVICE,
    ) -> M:
        """Call `service`.`method` of the plugin; `RuntimeCallError` on a failure status."""
        code, message, payload = self.call_raw(
            service, method, request.SerializeToString(), session
        )
        if code:
            raise RuntimeCallError(method, code, message)
        answer = response_type()
        answer.ParseFromString(payload)
        return answer

    def call_raw(
        self, service: str, method: str, payload: bytes, session: Session | None = None
    ) -> tuple[int, str, bytes]:
        """Call the plugin with raw payload bytes: (status code, status message, payload)."""
        session = session or self.session
        slot: list[object] = [threading.Event()]
        with session.lock:
            if session.closed.is_set():
                raise SessionClosed(f"{method}: the plugin connection is closed")
            stream = next(session.streams)
            session.pending[stream] = slot
        envelope = ttrpc_pb2.Request(
            service=service,
            method=method,
            payload=payload,
            timeout_nano=int(self.call_timeout * 1e9),
        )
        self._send(session, PLUGIN_CONN, stream, REQUEST, envelope.SerializeToString())
        done = slot[0]
        assert isinstance(done, threading.Event)
        if not done.wait(self.call_timeout):
            with session.lock:
                session.pending.pop(stream, None)
            raise TimeoutError(f"{method}: no answer from the plugin in {self.call_timeout} s")
        if len(slot) == 1:
            raise SessionClosed(f"{method}: the plugin connection closed: {session.close_reason}")
        response = slot[1]
        assert isinstance(response, ttrpc_pb2.Response)
        return response.status.code, response.status.message, response.payload

    def inject(self, data: bytes, session: Session | None = None) -> None:
        """Write `data` on the socket as it is (garbage, hand-built frames)."""
        session = session or self.session
        with session.write_lock:
            session.sock.sendall(data)

    def send_mux(self, conn_id: int, payload: bytes, session: Session | None = None) -> None:
        """Write one mux frame holding `payload` (any ttrpc bytes) on connection `conn_id`."""
        self.inject(struct.pack(">II", conn_id, len(payload)) + payload, session)

    # ------------------------------------------------------------ inside
    def _ready(self) -> Session:
        """The latest session, once it is set up (the runtime sends no event before)."""
        session = self.session
        if not session.ready.wait(self.call_timeout):
            raise SessionClosed(f"the plugin session is not set up: {session.error or 'timeout'}")
        return session

    def _spawn(self, target: Callable[..., None], *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True, name="fake-nri-runtime")
        self._threads.append(thread)
        thread.start()

    def _accept_loop(self, listener: socket.socket) -> None:
        while not self._stopping and self._listener is listener:
            try:
                sock, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self._begin(sock)

    def _begin(self, sock: socket.socket) -> Session:
        sock.settimeout(None)
        session = Session(sock=sock, number=len(self.sessions) + 1)
        with self._changed:
            self.sessions.append(session)
            self._changed.notify_all()
        self._spawn(self._read_loop, session)
        self._spawn(self._introduce, session)
        return session

    def _introduce(self, session: Session) -> None:
        """What the runtime does with a new plugin: registration, Configure, Synchronize."""
        if not session.registered.wait(self.register_timeout):
            if not session.closed.is_set():
                self._refuse(session, "plugin registration timed out", raise_=False)
            return
        try:
            self.configure(session)
            self.synchronize(session)
        except (RuntimeCallError, SessionClosed, TimeoutError, _Refused) as exc:
            if not session.closed.is_set():
                self._refuse(session, f"plugin set-up failed: {exc}", raise_=False)
            return
        with self._changed:
            session.ready.set()
            self._changed.notify_all()

    def _read_loop(self, session: Session) -> None:
        buffers = {PLUGIN_CONN: bytearray(), RUNTIME_CONN: bytearray()}
        trunk = bytearray()
        reason = "the plugin closed the connection"
        try:
            while True:
                data = session.sock.recv(65536)
                if not data:
                    break
                trunk += data
                while len(trunk) >= 8:
                    conn_id, length = struct.unpack(">II", trunk[:8])
                    if len(trunk) < 8 + length:
                        break
                    payload = bytes(trunk[8 : 8 + length])
                    del trunk[: 8 + length]
                    if length > GO_READ_BUFFER:
                        self.oversized_frames.append(length)
                    if conn_id not in buffers:
                        continue
                    stream = buffers[conn_id]
                    stream += payload
                    while len(stream) >= 10:
                        size, stream_id, kind, _flags = struct.unpack(">IIBB", stream[:10])
                        if len(stream) < 10 + size:
                            break
                        body = bytes(stream[10 : 10 + size])
                        del stream[: 10 + size]
                        self._frame(session, conn_id, stream_id, kind, body)
        except (OSError, SessionClosed) as exc:
            reason = f"read failed: {exc}"
        except Exception as exc:  # the plugin sent what is not the protocol
            reason = f"bad frame from the plugin: {exc!r}"
            self.protocol_errors.append(reason)
        finally:
            self._end(session, session.close_reason or reason)
            session.sock.close()

    def _frame(
        self, session: Session, conn_id: int, stream_id: int, kind: int, body: bytes
    ) -> None:
        if conn_id == PLUGIN_CONN and kind == RESPONSE:
            response = ttrpc_pb2.Response()
            response.ParseFromString(body)
            with session.lock:
                slot = session.pending.pop(stream_id, None)
            if slot is not None:
                slot.append(response)
                event = slot[0]
                assert isinstance(event, threading.Event)
                event.set()
        elif conn_id == RUNTIME_CONN and kind == REQUEST:
            request = ttrpc_pb2.Request()
            request.ParseFromString(body)
            code, message, payload = self._serve(session, request)
            envelope = ttrpc_pb2.Response(payload=payload)
            if code:
                envelope.status.code = code
                envelope.status.message = message
            self._send(session, RUNTIME_CONN, stream_id, RESPONSE, envelope.SerializeToString())
            if request.method == "RegisterPlugin" and code:
                self._end(session, f"registration refused: {message}")

    def _serve(self, session: Session, request: ttrpc_pb2.Request) -> tuple[int, str, bytes]:
        if request.service != RUNTIME_SERVICE:
            return 12, f"unknown service {request.service}", b""
        if request.method == "RegisterPlugin":
            registration = api_pb2.RegisterPluginRequest()
            registration.ParseFromString(request.payload)
            index = registration.plugin_idx
            if not registration.plugin_name:
                return 2, "invalid (empty) plugin name", b""
            if len(index) != 2 or not index.isdigit():
                return 2, f"invalid plugin index {index!r}", b""
            session.registration = registration
            session.registered.set()
            return 0, "", b""
        if request.method == "UpdateContainers":
            update = api_pb2.UpdateContainersRequest()
            update.ParseFromString(request.payload)
            failed = self._apply_updates(update.update)
            with self._changed:
                self.update_requests.append(update)
                self._changed.notify_all()
            answer = api_pb2.UpdateContainersResponse(failed=failed)
            return 0, "", answer.SerializeToString()
        return 12, f"unknown method {request.method}", b""

    def _apply_updates(
        self, updates: Sequence[api_pb2.ContainerUpdate]
    ) -> list[api_pb2.ContainerUpdate]:
        failed = []
        for update in updates:
            held = self.containers.get(update.container_id)
            if held is None or (self.fail_update is not None and self.fail_update(update)):
                failed.append(update)
                continue
            apply_resources(held.linux.resources, update.linux.resources)
        return failed

    def _send(self, session: Session, conn_id: int, stream_id: int, kind: int, body: bytes) -> None:
        data = struct.pack(">IIBB", len(body), stream_id, kind, 0) + body
        size = self.chunk or len(data)
        out = b"".join(
            struct.pack(">II", conn_id, len(data[i : i + size])) + data[i : i + size]
            for i in range(0, len(data), size)
        )
        try:
            with session.write_lock:
                session.sock.sendall(out)
        except OSError as exc:
            self._end(session, f"write failed: {exc}")
            raise SessionClosed(f"write failed: {exc}") from exc

    def _refuse(self, session: Session, error: str, *, raise_: bool = True) -> None:
        session.error = error
        self._end(session, error)
        with self._changed:
            self._changed.notify_all()
        if raise_:
            raise _Refused(error)

    def _end(self, session: Session, reason: str) -> None:
        with session.lock:
            if session.closed.is_set():
                return
            session.close_reason = reason
            session.closed.set()
            pending = list(session.pending.values())
            session.pending.clear()
        for slot in pending:
            event = slot[0]
            assert isinstance(event, threading.Event)
            event.set()
        with contextlib.suppress(OSError):  # wakes the reader, which closes the socket
            session.sock.shutdown(socket.SHUT_RDWR)
        with self._changed:
            self._changed.notify_all()


class _Refused(Exception):
    """The runtime gave up on the plugin (Session.error says why)."""
