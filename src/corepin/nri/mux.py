"""The NRI multiplexer: several ttrpc byte streams over the one socket to the runtime.

Every chunk written on the socket is framed as

```
[u32 big-endian connection id][u32 big-endian payload length][payload]
```

with a payload of at most 16 MiB (1 << 24). Connection 1 carries the Plugin service (the runtime
calls the plugin), connection 2 the Runtime service (the plugin calls the runtime); id 0 is
reserved. A mux payload is any piece of its connection's ttrpc byte stream: one ttrpc frame may
be cut over several mux frames and one mux frame may hold several ttrpc frames, so each
connection has its own `FrameDecoder`.

`MuxDecoder` is the pure part (bytes in, `(connection id, payload)` out). `Mux` runs it over a
socket: one reader thread reads the socket and hands each whole ttrpc frame to a callback; `send`
may be called from any thread, a lock keeping the frames of different threads apart.

Writes are cut into mux frames of at most `WRITE_CHUNK` (4096) bytes: the runtime's Go reader
hands each mux frame whole to a 4096-byte buffer, and a larger frame is lost (containerd 1.7.24
never answered an UpdateContainers sent as one 10 kB mux frame, and dropped the plugin later).
"""

from __future__ import annotations

import contextlib
import logging
import socket
import struct
import threading
from collections.abc import Callable, Iterable
from typing import Final

from corepin.nri.ttrpc import Frame, FrameDecoder, NriError, ProtocolError

log = logging.getLogger("corepin.nri")

#: bytes of a mux header: connection id, payload length
MUX_HEADER_LEN: Final = 8
#: the largest payload of one mux frame
MAX_MUX_PAYLOAD: Final = 1 << 24
#: the largest mux payload this side writes (see the module's docstring)
WRITE_CHUNK: Final = 4096
#: the connection that carries the Plugin service (the runtime is the ttrpc client)
PLUGIN_CONN: Final = 1
#: the connection that carries the Runtime service (the plugin is the ttrpc client)
RUNTIME_CONN: Final = 2
#: reserved by the protocol
RESERVED_CONN: Final = 0
#: how long a write may wait for the runtime to read before the connection is given up
WRITE_TIMEOUT: Final = 10.0

_MUX_HEADER = struct.Struct(">II")


def encode_mux(conn_id: int, data: bytes, chunk: int = WRITE_CHUNK) -> bytes:
    """The mux frames that carry `data` on connection `conn_id`, cut every `chunk` bytes."""
    if not 0 < conn_id <= 0xFFFFFFFF:
        raise ProtocolError(f"mux connection id {conn_id} is reserved or out of range")
    if not 0 < chunk <= MAX_MUX_PAYLOAD:
        raise ProtocolError(f"mux chunk size {chunk} is out of range")
    out = bytearray()
    for start in range(0, len(data), chunk):
        piece = data[start : start + chunk]
        out += _MUX_HEADER.pack(conn_id, len(piece))
        out += piece
    return bytes(out)


class MuxDecoder:
    """Cuts mux frames out of the socket's byte stream fed in chunks of any size.

    `feed` returns `(connection id, payload)` for each mux frame the new bytes complete. A
    length over `MAX_MUX_PAYLOAD` raises `ProtocolError`, and every later call raises again.
    """

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._broken: str | None = None

    @property
    def pending(self) -> int:
        """Bytes received that do not make a whole mux frame yet."""
        return len(self._buffer)

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        """The mux frames that `data` completes."""
        if self._broken is not None:
            raise ProtocolError(self._broken)
        buffer = self._buffer
        buffer += data
        out: list[tuple[int, bytes]] = []
        offset = 0
        while len(buffer) - offset >= MUX_HEADER_LEN:
            conn_id, length = _MUX_HEADER.unpack_from(buffer, offset)
            if length > MAX_MUX_PAYLOAD:
                self._broken = (
                    f"mux frame of connection {conn_id} announces {length} bytes "
                    f"(the limit is {MAX_MUX_PAYLOAD})"
                )
                raise ProtocolError(self._broken)
            end = offset + MUX_HEADER_LEN + length
            if len(buffer) < end:
                break
            out.append((conn_id, bytes(buffer[offset + MUX_HEADER_LEN : end])))
            offset = end
        if offset:
            del buffer[:offset]
        return out


class StreamDecoder:
    """A `MuxDecoder` with one `FrameDecoder` per connection: socket bytes in, `(connection id,
    ttrpc frame)` out. Frames of connections not in `connections` are dropped (as the runtime
    drops those of connections it has not opened)."""

    def __init__(self, connections: Iterable[int] = (PLUGIN_CONN, RUNTIME_CONN)) -> None:
        self._mux = MuxDecoder()
        self._streams = {conn_id: FrameDecoder() for conn_id in connections}

    def feed(self, data: bytes) -> list[tuple[int, Frame]]:
        """The ttrpc frames that `data` completes, with their connection ids, in order."""
        out: list[tuple[int, Frame]] = []
        for conn_id, payload in self._mux.feed(data):
            decoder = self._streams.get(conn_id)
            if decoder is None:
                log.debug("NRI: dropped %d bytes for unknown connection %d", len(payload), conn_id)
                continue
            try:
                frames = decoder.feed(payload)
            except ProtocolError as exc:
                raise ProtocolError(f"connection {conn_id}: {exc}") from exc
            out.extend((conn_id, frame) for frame in frames)
        return out


class Mux:
    """The multiplexer over one connected socket.

    `start` launches the reader thread; it hands every ttrpc frame to `on_frame(connection id,
    frame)` (on the reader thread: it must not block) and, once, `on_close(reason)` when the
    socket ends for any cause: the peer closed it, a read or write failed, the peer broke the
    protocol, `on_frame` raised, or `close` was called. The socket is closed by then.
    """

    def __init__(
        self,
        sock: socket.socket,
        *,
        on_frame: Callable[[int, Frame], None],
        on_close: Callable[[str], None],
        name: str = "corepin-nri-reader",
    ) -> None:
        self._sock = sock
        self._on_frame = on_frame
        self._on_close = on_close
        self._write_lock = threading.Lock()
        self._state_lock = threading.Lock()
        self._reason: str | None = None
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._read_loop, name=name, daemon=True)
        sock.settimeout(WRITE_TIMEOUT)

    @property
    def closed(self) -> bool:
        """True once the connection has ended (or is ending)."""
        return self._reason is not None

    @property
    def reason(self) -> str | None:
        """Why the connection ended; None while it is up."""
        return self._reason

    def start(self) -> None:
        """Start reading."""
        self._thread.start()

    def wait_closed(self, timeout: float | None = None) -> bool:
        """Wait until the reader has finished and `on_close` has run; True when it has."""
        return self._closed.wait(timeout)

    def send(self, conn_id: int, frame: bytes) -> None:
        """Write the bytes of one ttrpc frame (`corepin.nri.ttrpc.encode_*`) on connection
        `conn_id`, whole, between the frames other threads write. Raises `NriError` (reason
        `nri_connection_lost`) when the connection is closed or the write fails (the connection
        is then closed)."""
        data = encode_mux(conn_id, frame)
        with self._write_lock:
            if self._reason is not None:
                raise NriError(
                    f"NRI connection closed: {self._reason}", reason="nri_connection_lost"
                )
            try:
                self._sock.sendall(data)
            except OSError as exc:
                why = (
                    f"the runtime did not read for {WRITE_TIMEOUT:g} s"
                    if isinstance(exc, TimeoutError)
                    else f"write failed: {exc}"
                )
                self.close(why)
                raise NriError(
                    f"NRI connection closed: {why}", reason="nri_connection_lost"
                ) from exc

    def close(self, reason: str = "closed by the plugin") -> None:
        """End the connection (idempotent); the first reason given is the one kept."""
        with self._state_lock:
            if self._reason is not None:
                return
            self._reason = reason
        # wakes the reader blocked in recv; the reader closes the socket and reports
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        if not self._thread.is_alive() and self._thread.ident is None:
            self._finish()

    def _read_loop(self) -> None:
        decoder = StreamDecoder()
        try:
            while self._reason is None:
                try:
                    data = self._sock.recv(1 << 16)
                except TimeoutError:
                    continue
                except OSError as exc:
                    self.close(f"read failed: {exc}")
                    break
                if not data:
                    self.close("the runtime closed the connection")
                    break
                for conn_id, frame in decoder.feed(data):
                    if self._reason is not None:
                        break
                    self._on_frame(conn_id, frame)
        except ProtocolError as exc:
            self.close(f"protocol error: {exc}")
        except Exception as exc:  # a bug in on_frame: the connection cannot go on safely
            log.exception("NRI: handling a frame failed")
            self.close(f"internal error while reading: {exc!r}")
        finally:
            self._finish()

    def _finish(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.close()
        try:
            self._on_close(self._reason or "closed")
        except Exception:
            log.exception("NRI: the connection's close callback failed")
        finally:
            self._closed.set()
