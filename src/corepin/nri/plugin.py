"""corepin as an NRI plugin: connect to the runtime, register, serve, reconnect.

`NriPlugin` owns the life of the plugin's connection to the container runtime:

- `connect_first` dials the runtime's NRI socket (or takes the socket the runtime handed over
  in `NRI_PLUGIN_SOCKET`, when the runtime started the plugin), starts reading it, and registers
  (RegisterPlugin on the Runtime service). Failing that it raises `NriError`, an
  `EnvironmentProblem` (exit 4) whose one line names the socket and why.
- The runtime then calls the plugin (Configure, Synchronize, the subscribed events); the requests
  run on one dispatcher thread (`corepin.nri.service`) through the plugin's `Handlers`.
- `serve` keeps the plugin connected until told to stop: when the connection is lost (a runtime
  restart) `Handlers.disconnected` runs, and the plugin dials again with a bounded exponential
  backoff and registers again; the runtime Configures and Synchronizes it anew. A socket handed
  over by the runtime is not redialled: its end is the end of `serve`.
- `update_containers` asks the runtime to change containers outside any request (from any
  thread, while connected).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Iterable, Mapping, Sequence

from corepin.core.errors import InputError
from corepin.nri.connection import Connection
from corepin.nri.gen import api_pb2
from corepin.nri.service import (
    RUNTIME_SERVICE,
    Handlers,
    PluginService,
    RequestObserver,
    RuntimeFeatures,
)
from corepin.nri.ttrpc import NriError

log = logging.getLogger("corepin.nri")

#: where containerd and CRI-O listen for NRI plugins by default
DEFAULT_SOCKET = "/var/run/nri/nri.sock"
#: set by a runtime that starts the plugin itself: the number of an already connected socket
SOCKET_ENV = "NRI_PLUGIN_SOCKET"
#: the first pause before dialling again; it doubles up to `backoff_max`
BACKOFF_START = 0.1
#: the events NRI defines (api_pb2.Event, without UNKNOWN)
KNOWN_EVENTS = frozenset(v for v in api_pb2.Event.values() if v != api_pb2.UNKNOWN)


def event_mask(events: Iterable[int]) -> int:
    """The subscription mask of ConfigureResponse: bit `1 << (event - 1)` for each event.
    `InputError` for an event NRI does not define, or for none at all (the runtime reads an
    empty mask as every event)."""
    mask = 0
    for event in events:
        if event not in KNOWN_EVENTS:
            raise InputError(f"unknown NRI event {event!r}", reason="bad_nri_event")
        mask |= 1 << (event - 1)
    if not mask:
        raise InputError("an NRI plugin must subscribe to at least one event")
    return mask


def check_name(name: str) -> str:
    """`name` when it is a usable plugin name (not empty, no '-', '/' or white space)."""
    if not name or any(ch in "-/" or ch.isspace() for ch in name):
        raise InputError(
            f"invalid NRI plugin name {name!r}: it must be non-empty, without '-', '/' or "
            "white space",
            reason="bad_nri_plugin_name",
        )
    return name


def check_index(index: str) -> str:
    """`index` when it is a plugin index: exactly two decimal digits, "00" to "99"."""
    if len(index) != 2 or not all(ch in "0123456789" for ch in index):
        raise InputError(
            f"invalid NRI plugin index {index!r}: it must be two digits, 00 to 99",
            reason="bad_nri_plugin_index",
        )
    return index


class NriPlugin:
    """The plugin's side of NRI (see the module's docstring).

    `environ` is where `NRI_PLUGIN_SOCKET` is looked up (default: the process' environment);
    `observer(method, seconds, status code)` is told about every request served.
    """

    def __init__(
        self,
        handlers: Handlers,
        *,
        socket_path: str = DEFAULT_SOCKET,
        name: str,
        index: str,
        events: Iterable[int],
        backoff_max: float = 5.0,
        register_timeout: float = 5.0,
        environ: Mapping[str, str] | None = None,
        observer: RequestObserver | None = None,
    ) -> None:
        self.name = check_name(name)
        self.index = check_index(index)
        if backoff_max < BACKOFF_START:
            raise InputError(f"NRI reconnection backoff {backoff_max!r} s is below {BACKOFF_START}")
        if register_timeout <= 0:
            raise InputError(f"NRI registration timeout {register_timeout!r} s is not positive")
        self.socket_path = socket_path
        self._backoff_max = backoff_max
        self._register_timeout = register_timeout
        self._environ = os.environ if environ is None else environ
        self._service = PluginService(handlers, event_mask(events), observer=observer)
        self._lock = threading.Lock()
        self._conn: Connection | None = None
        self._preconnected = False
        self._closing = False
        self._registrations = 0

    # ------------------------------------------------------------ what the runtime told
    @property
    def runtime(self) -> tuple[str, str] | None:
        """(name, version) of the runtime from its last Configure; None before one."""
        if not self._service.configured:
            return None
        features = self._service.features
        return features.runtime_name, features.runtime_version

    @property
    def features(self) -> RuntimeFeatures:
        """What the runtime told and did (newer-runtime fields, multi-part Synchronize)."""
        return self._service.features

    @property
    def connected(self) -> bool:
        """True while a registered connection is up."""
        conn = self._conn
        return conn is not None and conn.registered and not conn.closed

    @property
    def registrations(self) -> int:
        """How many times the plugin has registered (1 + the reconnections)."""
        return self._registrations

    @property
    def preconnected(self) -> bool:
        """True when the plugin uses the socket the runtime handed over (NRI_PLUGIN_SOCKET)."""
        return self._preconnected

    @property
    def where(self) -> str:
        """The socket in words, for messages."""
        if self._preconnected:
            return f"the pre-connected NRI socket ({SOCKET_ENV}={self._environ.get(SOCKET_ENV)})"
        return f"the NRI socket {self.socket_path}"

    # ------------------------------------------------------------ connecting
    def connect_first(self, timeout: float | None = None) -> None:
        """Connect and register (waiting at most `timeout` s for the runtime's answer, default
        `register_timeout`). Raises `NriError` (exit 4) naming the socket and why. Does
        nothing while connected."""
        if self.connected:
            return
        self._connect(self._register_timeout if timeout is None else timeout)

    def wait_synchronized(self, timeout: float | None = None) -> bool:
        """Wait until the current connection's Synchronize has been answered; True if it has."""
        conn = self._conn
        return conn is not None and self._service.wait_synchronized(conn, timeout)

    def serve(self, stop: threading.Event) -> None:
        """Serve the runtime until `stop` is set, reconnecting when the connection is lost
        (0.1 s, doubling to `backoff_max`, between attempts). Connects first when
        `connect_first` was not called. Returns early when the runtime's pre-connected socket
        closes (the runtime owns that life). Call `close` afterwards."""
        delay = BACKOFF_START
        failures = 0
        while not stop.is_set() and not self._closing:
            conn = self._conn
            if conn is not None:
                while not conn.closed:
                    if stop.wait(0.05):
                        return
                if self._preconnected:
                    log.info(
                        "NRI: %s closed (%s): the runtime ended the plugin", self.where, conn.reason
                    )
                    return
                with self._lock:
                    if self._conn is conn:
                        self._conn = None
                delay = BACKOFF_START
            if stop.wait(delay):
                return
            try:
                self._connect(self._register_timeout)
            except NriError as exc:
                failures += 1
                level = logging.WARNING if failures == 1 else logging.DEBUG
                log.log(level, "NRI: reconnecting (attempt %d): %s", failures, exc)
                delay = min(delay * 2, self._backoff_max)
                if self._preconnected:
                    return
            else:
                failures = 0
                delay = BACKOFF_START

    def _connect(self, timeout: float) -> None:
        if self._closing:
            raise NriError("the NRI plugin is closed", reason="nri_not_connected")
        if self._preconnected:
            raise NriError(f"{self.where} was closed", reason="nri_connection_lost")
        sock = self._open(timeout)
        self._service.start()
        conn = Connection(
            sock,
            on_request=self._service.submit,
            on_lost=self._lost,
            label=f"NRI ({self.name})",
        )
        with self._lock:
            self._conn = conn
        conn.start()
        request = api_pb2.RegisterPluginRequest(plugin_name=self.name, plugin_idx=self.index)
        try:
            conn.call(RUNTIME_SERVICE, "RegisterPlugin", request, api_pb2.Empty, timeout)
        except NriError as exc:
            conn.close(f"registration failed: {exc}")
            with self._lock:
                if self._conn is conn and not self._preconnected:
                    self._conn = None
            raise NriError(
                f"{self.where}: registration as {self.name!r} (index {self.index}) failed: {exc}",
                reason="nri_registration_failed",
            ) from exc
        if not conn.mark_registered():
            raise NriError(
                f"{self.where}: the runtime closed the connection after registration: "
                f"{conn.reason}",
                reason="nri_registration_failed",
            )
        self._registrations += 1
        log.info("NRI: registered as %s (index %s) on %s", self.name, self.index, self.where)

    def _open(self, timeout: float) -> socket.socket:
        fd_text = self._environ.get(SOCKET_ENV, "")
        if fd_text:
            try:
                fd = int(fd_text)
            except ValueError:
                raise NriError(
                    f"{SOCKET_ENV}={fd_text!r} is not a file descriptor number",
                    reason="nri_unreachable",
                ) from None
            try:
                sock = socket.socket(fileno=fd)
            except OSError as exc:
                raise NriError(
                    f"{SOCKET_ENV}={fd}: not a usable socket: {exc.strerror or exc}",
                    reason="nri_unreachable",
                ) from exc
            self._preconnected = True
            return sock
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect(self.socket_path)
        except OSError as exc:
            sock.close()
            raise NriError(
                f"cannot reach the NRI socket {self.socket_path}: {_why(exc)}",
                reason="nri_unreachable",
            ) from exc
        return sock

    def _lost(self, conn: Connection, reason: str) -> None:
        if self._closing:
            return
        if conn.registered:
            log.warning("NRI: connection to the runtime lost: %s", reason)
            self._service.lost(conn)
        else:
            log.debug("NRI: connection closed before registration: %s", reason)

    # ------------------------------------------------------------ the plugin's own calls
    def update_containers(
        self,
        updates: Sequence[api_pb2.ContainerUpdate],
        timeout: float = 2.0,
        *,
        evict: Sequence[api_pb2.ContainerEviction] = (),
    ) -> list[api_pb2.ContainerUpdate]:
        """Ask the runtime to apply `updates` (and `evict`) now; returns the updates it could
        not apply. Any thread may call, a handler included (but the runtime may be waiting for
        that handler's answer while holding a lock: push from another thread after answering).
        Raises `NriError`: `nri_not_connected`, `nri_timeout`, `nri_connection_lost`, or a
        `RemoteError` when the runtime refuses."""
        conn = self._conn
        if conn is None or conn.closed or not conn.registered:
            raise NriError(
                f"not connected to the runtime through {self.where}", reason="nri_not_connected"
            )
        request = api_pb2.UpdateContainersRequest(update=updates, evict=evict)
        answer = conn.call(
            RUNTIME_SERVICE, "UpdateContainers", request, api_pb2.UpdateContainersResponse, timeout
        )
        return list(answer.failed)

    def close(self) -> None:
        """Close the connection and stop the dispatcher (idempotent; not from a handler)."""
        self._closing = True
        with self._lock:
            conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
            conn.wait_closed(2.0)
        self._service.stop()


def _why(exc: OSError) -> str:
    if isinstance(exc, FileNotFoundError):
        return "no such socket (is NRI enabled in the runtime's configuration?)"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused (no runtime is listening)"
    if isinstance(exc, PermissionError):
        return "permission denied"
    if isinstance(exc, TimeoutError):
        return "timed out"
    return exc.strerror or str(exc)
