"""One live NRI connection: the runtime's requests in, the plugin's calls out.

On the multiplexed socket (`corepin.nri.mux`) the plugin is a ttrpc server on connection 1 and a
ttrpc client on connection 2. `Connection` does both ends' bookkeeping and nothing else: every
request of the runtime is handed, unparsed beyond its envelope, to `on_request` (the plugin
queues it for its dispatcher), `reply`/`reply_error` answer it, and `call` sends a request of the
plugin and waits for its answer, which the reader thread delivers; any number of threads may
call at once. When the socket ends, every waiting call fails with `NriError`
(`nri_connection_lost`) and `on_lost` is told why, once.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
from collections.abc import Callable
from typing import TypeVar

from google.protobuf.message import DecodeError, Message

from corepin.nri import ttrpc
from corepin.nri.gen import ttrpc_pb2
from corepin.nri.mux import PLUGIN_CONN, RUNTIME_CONN, Mux
from corepin.nri.ttrpc import Frame, NriError, ProtocolError, RemoteError

log = logging.getLogger("corepin.nri")

M = TypeVar("M", bound=Message)


class _Pending:
    """A call waiting for its answer."""

    __slots__ = ("done", "error", "method", "response")

    def __init__(self, method: str) -> None:
        self.method = method
        self.done = threading.Event()
        self.response: ttrpc_pb2.Response | None = None
        self.error: NriError | None = None


class Connection:
    """The two ttrpc ends of one socket to the runtime (see the module's docstring).

    `on_request(connection, stream id, envelope)` and `on_lost(connection, reason)` run on the
    reader thread and must not block.
    """

    def __init__(
        self,
        sock: socket.socket,
        *,
        on_request: Callable[[Connection, int, ttrpc_pb2.Request], None],
        on_lost: Callable[[Connection, str], None],
        label: str = "NRI",
    ) -> None:
        self.label = label
        self._on_request = on_request
        self._on_lost = on_lost
        self._lock = threading.Lock()
        self._pending: dict[int, _Pending] = {}
        self._next_stream = 1
        self._lost = False
        self._registered = False
        self._mux = Mux(sock, on_frame=self._frame, on_close=self._closed)

    # ------------------------------------------------------------ life
    def start(self) -> None:
        """Start reading the socket."""
        self._mux.start()

    def close(self, reason: str = "closed by the plugin") -> None:
        """End the connection (idempotent)."""
        self._mux.close(reason)

    @property
    def closed(self) -> bool:
        """True once the connection has ended or is ending."""
        return self._mux.closed

    @property
    def reason(self) -> str | None:
        """Why the connection ended; None while it is up."""
        return self._mux.reason

    def wait_closed(self, timeout: float | None = None) -> bool:
        """Wait until the connection has ended and `on_lost` has run; True when it has."""
        return self._mux.wait_closed(timeout)

    @property
    def registered(self) -> bool:
        """True once `mark_registered` succeeded: the runtime accepted the plugin."""
        return self._registered

    def mark_registered(self) -> bool:
        """Record that the runtime accepted the registration; False when the connection was
        lost meanwhile (then `on_lost` has already run without seeing it registered)."""
        with self._lock:
            if self._lost:
                return False
            self._registered = True
            return True

    # ------------------------------------------------------------ the plugin's calls
    def call(
        self, service: str, method: str, request: Message, response_type: type[M], timeout: float
    ) -> M:
        """Call `service`.`method` of the runtime and wait at most `timeout` seconds for the
        answer. Raises `NriError` (`nri_timeout`, `nri_connection_lost`), `RemoteError` (the
        runtime answered with a failure status) or `ProtocolError` (an answer that is not
        `response_type`)."""
        pending = _Pending(method)
        with self._lock:
            if self._lost:
                raise NriError(
                    f"{method}: NRI connection closed: {self.reason}", reason="nri_connection_lost"
                )
            stream_id = self._next_stream
            self._next_stream = stream_id + 2 if stream_id < ttrpc.MAX_STREAM_ID - 2 else 1
            self._pending[stream_id] = pending
        try:
            self._mux.send(
                RUNTIME_CONN, ttrpc.encode_request(stream_id, service, method, request, timeout)
            )
            if not pending.done.wait(timeout):
                raise NriError(
                    f"{method}: no answer from the runtime in {timeout:g} s", reason="nri_timeout"
                )
        finally:
            with self._lock:
                self._pending.pop(stream_id, None)
        if pending.error is not None:
            raise pending.error
        response = pending.response
        assert response is not None
        if response.HasField("status") and response.status.code != ttrpc.OK:
            raise RemoteError(method, response.status.code, response.status.message)
        answer = response_type()
        try:
            answer.ParseFromString(response.payload)
        except (DecodeError, ValueError, RuntimeError) as exc:
            raise ProtocolError(
                f"{method}: the runtime's answer is not a {response_type.__name__}: {exc}"
            ) from exc
        return answer

    # ------------------------------------------------------------ answers to the runtime
    def reply(self, stream_id: int, message: Message) -> None:
        """Answer the runtime's request `stream_id` with `message`; an answer too large for a
        frame is replaced by a RESOURCE_EXHAUSTED status. Raises `NriError` when the connection
        is gone."""
        try:
            frame = ttrpc.encode_response(stream_id, message)
        except ProtocolError as exc:
            log.error("%s: answer to request %d not sent: %s", self.label, stream_id, exc)
            frame = ttrpc.encode_error(stream_id, ttrpc.RESOURCE_EXHAUSTED, str(exc))
        self._mux.send(PLUGIN_CONN, frame)

    def reply_error(self, stream_id: int, code: int, message: str) -> None:
        """Answer the runtime's request `stream_id` with failure status `code` and `message`."""
        self._mux.send(PLUGIN_CONN, ttrpc.encode_error(stream_id, code, message[:65536]))

    # ------------------------------------------------------------ the reader's side
    def _frame(self, conn_id: int, frame: Frame) -> None:
        if conn_id == PLUGIN_CONN and frame.type == ttrpc.TYPE_REQUEST:
            self._on_request(self, frame.stream_id, ttrpc.parse_request(frame))
        elif conn_id == RUNTIME_CONN and frame.type == ttrpc.TYPE_RESPONSE:
            response = ttrpc.parse_response(frame)
            with self._lock:
                pending = self._pending.pop(frame.stream_id, None)
            if pending is None:
                log.debug("%s: answer to stream %d came too late", self.label, frame.stream_id)
                return
            pending.response = response
            pending.done.set()
        elif conn_id == RUNTIME_CONN and frame.type == ttrpc.TYPE_REQUEST:
            request = ttrpc.parse_request(frame)
            log.warning(
                "%s: the runtime called %s.%s on the plugin's client connection",
                self.label,
                request.service,
                request.method,
            )
            answer = ttrpc.encode_error(
                frame.stream_id, ttrpc.UNIMPLEMENTED, "the plugin serves nothing here"
            )
            with contextlib.suppress(NriError):  # the connection is going away anyway
                self._mux.send(RUNTIME_CONN, answer)
        else:
            log.debug(
                "%s: ignored a frame of type %d on connection %d (stream %d)",
                self.label,
                frame.type,
                conn_id,
                frame.stream_id,
            )

    def _closed(self, reason: str) -> None:
        with self._lock:
            self._lost = True
            pending = list(self._pending.values())
            self._pending.clear()
        for call in pending:
            call.error = NriError(
                f"{call.method}: NRI connection lost: {reason}", reason="nri_connection_lost"
            )
            call.done.set()
        self._on_lost(self, reason)
