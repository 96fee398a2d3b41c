"""The Plugin service: the runtime's requests, run in order on one dispatcher thread.

The reader thread of a connection (`corepin.nri.connection`) only queues the runtime's requests;
`PluginService`'s dispatcher thread takes them one at a time, in the order they came, runs the
plugin's `Handlers` and answers on the connection each came on. Handlers therefore never run on
a reader thread and never two at once, and a handler may call the runtime itself
(`NriPlugin.update_containers`): the reader is free to deliver that answer.

What the protocol asks of a plugin is done here, so that `Handlers` see only whole events:
- Configure is answered with the subscription mask, `1 << (event - 1)` for each event;
- a Synchronize split in parts (`more`, newer runtimes) is collected, each part but the last
  answered `more=True` without updates, and `Handlers.synchronize` called once with everything;
- Shutdown is answered first, then `Handlers.shutdown` runs;
- an unknown service or method is answered UNIMPLEMENTED (12), a request whose message does not
  parse INVALID_ARGUMENT (3), a handler that raises INTERNAL (13) with its message (logged): the
  connection goes on;
- when a registered connection is lost, `Handlers.disconnected` runs once, in turn with the
  requests that came before.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from google.protobuf.message import DecodeError, Message

from corepin.core.errors import CorepinError
from corepin.nri import ttrpc
from corepin.nri.connection import Connection
from corepin.nri.gen import api_pb2, ttrpc_pb2
from corepin.nri.ttrpc import NriError

log = logging.getLogger("corepin.nri")

RUNTIME_SERVICE = "nri.pkg.api.v1alpha1.Runtime"
PLUGIN_SERVICE = "nri.pkg.api.v1alpha1.Plugin"
#: the highest event NRI 0.6 (containerd 1.7) knows; later ones make it refuse the plugin
LAST_EVENT_OF_NRI_0_6 = api_pb2.REMOVE_CONTAINER


class Handlers(Protocol):
    """What the plugin's logic implements. Every method runs on the dispatcher thread, one at a
    time; what one raises is answered as an INTERNAL error of that request."""

    def configure(self, req: api_pb2.ConfigureRequest) -> None:
        """The runtime introduced itself (first request of every connection)."""

    def synchronize(
        self, pods: Sequence[api_pb2.PodSandbox], containers: Sequence[api_pb2.Container]
    ) -> Sequence[api_pb2.ContainerUpdate]:
        """Everything the runtime runs (after Configure); the answer repairs containers."""
        ...

    def create_container(
        self, req: api_pb2.CreateContainerRequest
    ) -> api_pb2.CreateContainerResponse:
        """A container is about to be created."""
        ...

    def update_container(
        self, req: api_pb2.UpdateContainerRequest
    ) -> api_pb2.UpdateContainerResponse:
        """A container's resources are about to change."""
        ...

    def stop_container(self, req: api_pb2.StopContainerRequest) -> api_pb2.StopContainerResponse:
        """A container is stopping."""
        ...

    def state_change(self, ev: api_pb2.StateChangeEvent) -> None:
        """Any other subscribed event."""

    def shutdown(self) -> None:
        """The runtime is going away (called after the answer went out)."""

    def disconnected(self) -> None:
        """The connection to the runtime was lost (once per lost connection)."""


@dataclass(frozen=True, slots=True)
class RuntimeFeatures:
    """What the runtime told about itself in Configure, and what it was seen doing.

    `nri_version`, `request_timeout` and `registration_timeout` are None where the runtime did
    not send them (NRI 0.6, containerd 1.7); the timeouts are in seconds. `multipart_sync` is
    True once a Synchronize came in parts. `events` is the subscription mask answered.
    """

    runtime_name: str = ""
    runtime_version: str = ""
    nri_version: str | None = None
    request_timeout: float | None = None
    registration_timeout: float | None = None
    multipart_sync: bool = False
    events: int = 0


#: `(method, seconds it took, status code answered)` after every request
RequestObserver = Callable[[str, float, int], None]


@dataclass(slots=True)
class _Work:
    conn: Connection
    stream_id: int = 0
    envelope: ttrpc_pb2.Request | None = None  # None: the connection was lost
    arrived: float = 0.0  # time.monotonic() when the reader queued it


class _Answer:
    """What a method answers, and what runs once the answer is out."""

    __slots__ = ("after", "message")

    def __init__(self, message: Message, after: Callable[[], None] | None = None) -> None:
        self.message = message
        self.after = after


class PluginService:
    """The dispatcher of the runtime's requests (see the module's docstring)."""

    def __init__(
        self, handlers: Handlers, events: int, *, observer: RequestObserver | None = None
    ) -> None:
        self._handlers = handlers
        self._events = events
        self._observer = observer
        self._queue: queue.SimpleQueue[_Work | None] = queue.SimpleQueue()
        self._thread = threading.Thread(
            target=self._loop, name="corepin-nri-dispatcher", daemon=True
        )
        self._features = RuntimeFeatures()
        self._configured = False
        self._sync_conn: Connection | None = None
        self._sync_pods: list[api_pb2.PodSandbox] = []
        self._sync_containers: list[api_pb2.Container] = []
        self._synced = threading.Condition()
        self._synced_conn: Connection | None = None
        self._methods: dict[str, tuple[type[Message], Callable[[Connection, Message], _Answer]]]
        self._methods = {
            "Configure": (api_pb2.ConfigureRequest, self._configure),
            "Synchronize": (api_pb2.SynchronizeRequest, self._synchronize),
            "CreateContainer": (api_pb2.CreateContainerRequest, self._create_container),
            "UpdateContainer": (api_pb2.UpdateContainerRequest, self._update_container),
            "StopContainer": (api_pb2.StopContainerRequest, self._stop_container),
            "StateChange": (api_pb2.StateChangeEvent, self._state_change),
            "Shutdown": (api_pb2.Empty, self._shutdown),
        }

    # ------------------------------------------------------------ life and state
    @property
    def features(self) -> RuntimeFeatures:
        """What the runtime told in its last Configure (see `RuntimeFeatures`)."""
        return self._features

    @property
    def configured(self) -> bool:
        """True once a Configure has been answered."""
        return self._configured

    def start(self) -> None:
        """Start the dispatcher thread (once)."""
        if self._thread.ident is None:
            self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the dispatcher after the work already queued (not from a handler)."""
        self._queue.put(None)
        if self._thread.ident is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def submit(self, conn: Connection, stream_id: int, envelope: ttrpc_pb2.Request) -> None:
        """Queue a request of the runtime (from the reader thread)."""
        self._queue.put(_Work(conn, stream_id, envelope, time.monotonic()))

    def lost(self, conn: Connection) -> None:
        """Queue `Handlers.disconnected` for a registered connection that ended."""
        self._queue.put(_Work(conn))

    def wait_synchronized(self, conn: Connection, timeout: float | None) -> bool:
        """Wait until `conn`'s Synchronize has been answered; True when it has."""
        with self._synced:
            return self._synced.wait_for(lambda: self._synced_conn is conn, timeout)

    # ------------------------------------------------------------ the dispatcher
    def _loop(self) -> None:
        while (work := self._queue.get()) is not None:
            try:
                if work.envelope is None:
                    self._disconnected(work.conn)
                else:
                    self._handle(work.conn, work.stream_id, work.envelope, work.arrived)
            except Exception:  # never lose the dispatcher: the next request must be served
                log.exception("NRI: the dispatcher failed on a request")

    def _disconnected(self, conn: Connection) -> None:
        if self._sync_conn is conn:
            self._reset_sync(None)
        try:
            self._handlers.disconnected()
        except Exception:
            log.exception("NRI: the disconnected handler failed")

    def _handle(
        self, conn: Connection, stream_id: int, envelope: ttrpc_pb2.Request, arrived: float
    ) -> None:
        """Run one request and answer it; the time reported runs from its arrival (the time
        it waited behind others included) to its answer."""
        method = envelope.method
        if conn.closed:
            log.debug("NRI: %s dropped: its connection is closed", method)
            return
        code, message, answer = self._run(conn, envelope)
        try:
            if answer is not None:
                conn.reply(stream_id, answer.message)
            else:
                conn.reply_error(stream_id, code, message)
        except NriError as exc:
            log.warning("NRI: the answer to %s was not sent: %s", method, exc)
        took = time.monotonic() - arrived
        if envelope.timeout_nano and took * 1e9 > envelope.timeout_nano:
            log.warning(
                "NRI: %s took %.3f s, longer than the runtime waits (%.3f s)",
                method,
                took,
                envelope.timeout_nano / 1e9,
            )
        if self._observer is not None:
            try:
                self._observer(method, took, code)
            except Exception:
                log.exception("NRI: the request observer failed")
        if answer is not None and answer.after is not None:
            try:
                answer.after()
            except Exception:
                log.exception("NRI: %s: the handler failed after the answer", method)

    def _run(
        self, conn: Connection, envelope: ttrpc_pb2.Request
    ) -> tuple[int, str, _Answer | None]:
        """Run one request: (status code, error message, answer or None on failure)."""
        name = f"{envelope.service}/{envelope.method}"
        entry = self._methods.get(envelope.method)
        if envelope.service != PLUGIN_SERVICE or entry is None:
            log.warning("NRI: the runtime called %s, which corepin does not serve", name)
            return ttrpc.UNIMPLEMENTED, f"{name} is not implemented by this plugin", None
        request_type, run = entry
        request = request_type()
        try:
            request.ParseFromString(envelope.payload)
        except (DecodeError, ValueError, RuntimeError) as exc:
            log.warning("NRI: %s: the request does not parse: %s", name, exc)
            return ttrpc.INVALID_ARGUMENT, f"{name}: not a {request_type.__name__}: {exc}", None
        try:
            return ttrpc.OK, "", run(conn, request)
        except Exception as exc:
            if isinstance(exc, CorepinError):
                log.error("NRI: %s failed: %s", name, exc)
            else:
                log.exception("NRI: %s failed", name)
            return ttrpc.INTERNAL, f"{name}: {exc or type(exc).__name__}", None

    # ------------------------------------------------------------ the methods
    def _configure(self, conn: Connection, message: Message) -> _Answer:
        assert isinstance(message, api_pb2.ConfigureRequest)
        events = self._events
        newer = message.request_timeout > 0  # request_timeout came with NRI 0.7
        if not newer and events >> LAST_EVENT_OF_NRI_0_6:
            log.info(
                "NRI: the runtime (NRI 0.6) knows no event after %d: not subscribed to those",
                LAST_EVENT_OF_NRI_0_6,
            )
            events &= (1 << LAST_EVENT_OF_NRI_0_6) - 1
        self._features = replace(
            self._features,
            runtime_name=message.runtime_name,
            runtime_version=message.runtime_version,
            nri_version=message.nri_version or None,
            request_timeout=message.request_timeout / 1000 if newer else None,
            registration_timeout=(
                message.registration_timeout / 1000 if message.registration_timeout > 0 else None
            ),
            events=events,
        )
        self._reset_sync(conn)
        self._handlers.configure(message)
        self._configured = True
        return _Answer(api_pb2.ConfigureResponse(events=events))

    def _synchronize(self, conn: Connection, message: Message) -> _Answer:
        assert isinstance(message, api_pb2.SynchronizeRequest)
        if self._sync_conn is not conn:
            self._reset_sync(conn)
        self._sync_pods.extend(message.pods)
        self._sync_containers.extend(message.containers)
        if message.more:
            if not self._features.multipart_sync:
                self._features = replace(self._features, multipart_sync=True)
            return _Answer(api_pb2.SynchronizeResponse(more=True))
        pods, containers = self._sync_pods, self._sync_containers
        self._reset_sync(conn)
        updates = self._handlers.synchronize(pods, containers)
        with self._synced:
            self._synced_conn = conn
            self._synced.notify_all()
        return _Answer(api_pb2.SynchronizeResponse(update=list(updates)))

    def _create_container(self, conn: Connection, message: Message) -> _Answer:
        assert isinstance(message, api_pb2.CreateContainerRequest)
        return _answer(self._handlers.create_container(message), api_pb2.CreateContainerResponse)

    def _update_container(self, conn: Connection, message: Message) -> _Answer:
        assert isinstance(message, api_pb2.UpdateContainerRequest)
        return _answer(self._handlers.update_container(message), api_pb2.UpdateContainerResponse)

    def _stop_container(self, conn: Connection, message: Message) -> _Answer:
        assert isinstance(message, api_pb2.StopContainerRequest)
        return _answer(self._handlers.stop_container(message), api_pb2.StopContainerResponse)

    def _state_change(self, conn: Connection, message: Message) -> _Answer:
        assert isinstance(message, api_pb2.StateChangeEvent)
        self._handlers.state_change(message)
        return _Answer(api_pb2.Empty())

    def _shutdown(self, conn: Connection, message: Message) -> _Answer:
        log.info("NRI: the runtime is shutting down")
        return _Answer(api_pb2.Empty(), after=self._handlers.shutdown)

    def _reset_sync(self, conn: Connection | None) -> None:
        self._sync_conn = conn
        self._sync_pods = []
        self._sync_containers = []


def _answer(value: object, expected: type[Message]) -> _Answer:
    """A handler's answer, checked: None stands for the empty answer."""
    if value is None:
        return _Answer(expected())
    if not isinstance(value, expected):
        raise TypeError(f"the handler answered a {type(value).__name__}, not a {expected.__name__}")
    return _Answer(value)
