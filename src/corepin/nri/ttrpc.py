"""ttrpc, the request/response protocol NRI speaks inside each multiplexed connection.

A ttrpc byte stream is a sequence of frames, each a 10-byte header and a payload:

```
[u32 big-endian payload length][u32 big-endian stream id][u8 type][u8 flags][payload]
```

Type 1 is a request (the payload a `ttrpc.Request`: service, method, the method's own message as
bytes, a deadline and metadata), type 2 its response (`ttrpc.Response`: a status and the method's
answer as bytes) on the same stream id, type 3 a data frame of a streaming call (NRI makes
none). A client numbers its requests with odd stream ids 1, 3, 5, ... A payload is at most
4 MiB.

This module is pure: `encode_frame` builds the bytes of a frame, `FrameDecoder` is fed the bytes
of a stream in chunks of any size and hands back whole frames, and the envelope helpers wrap and
unwrap `Request`/`Response`. Anything a peer sends that cannot be understood raises
`ProtocolError`, the one error of this module; the connection it came on is then unusable.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

from google.protobuf.message import DecodeError, Message

from corepin.core.errors import EnvironmentProblem
from corepin.nri.gen import ttrpc_pb2

#: bytes of a frame header: length, stream id, type, flags
HEADER_LEN: Final = 10
#: the largest payload a frame may carry (ttrpc's own limit)
MAX_PAYLOAD: Final = 4 << 20
#: the largest stream id (an unsigned 32-bit number)
MAX_STREAM_ID: Final = 0xFFFFFFFF

TYPE_REQUEST: Final = 1
TYPE_RESPONSE: Final = 2
TYPE_DATA: Final = 3
FRAME_TYPES: Final = frozenset({TYPE_REQUEST, TYPE_RESPONSE, TYPE_DATA})

# Status codes of google.rpc.Code that the NRI wire uses.
OK: Final = 0
INVALID_ARGUMENT: Final = 3
DEADLINE_EXCEEDED: Final = 4
RESOURCE_EXHAUSTED: Final = 8
UNIMPLEMENTED: Final = 12
INTERNAL: Final = 13
UNAVAILABLE: Final = 14

_HEADER = struct.Struct(">IIBB")


class NriError(EnvironmentProblem):
    """Talking to the container runtime over NRI failed (exit 4); `reason` says how:
    `nri_unreachable`, `nri_registration_failed`, `nri_not_connected`, `nri_connection_lost`,
    `nri_timeout`, ..."""

    default_reason = "nri"


class ProtocolError(NriError):
    """The peer sent bytes that are not the protocol (a bad length, an unknown frame type, an
    envelope that is not protobuf), or a frame this side was asked to send is out of bounds."""

    default_reason = "nri_protocol"


class RemoteError(NriError):
    """The peer answered a call with a failure status: `code` (google.rpc.Code) and its
    `status_message`."""

    default_reason = "nri_rejected"

    def __init__(self, method: str, code: int, status_message: str) -> None:
        self.method = method
        self.code = code
        self.status_message = status_message
        super().__init__(f"{method} failed: {status_message or 'no message'} (code {code})")


@dataclass(frozen=True, slots=True)
class Frame:
    """One ttrpc frame: its stream id, type (`TYPE_*`), flags and payload bytes."""

    stream_id: int
    type: int
    flags: int
    payload: bytes


def encode_frame(stream_id: int, frame_type: int, payload: bytes, flags: int = 0) -> bytes:
    """The bytes of one frame; `ProtocolError` when a field is out of its range or the payload
    is larger than `MAX_PAYLOAD`."""
    if len(payload) > MAX_PAYLOAD:
        raise ProtocolError(
            f"a ttrpc payload of {len(payload)} bytes exceeds the limit of {MAX_PAYLOAD}",
            reason="nri_message_too_large",
        )
    if not 0 <= stream_id <= MAX_STREAM_ID:
        raise ProtocolError(f"ttrpc stream id {stream_id} is out of range")
    if frame_type not in FRAME_TYPES:
        raise ProtocolError(f"unknown ttrpc frame type {frame_type}")
    if not 0 <= flags <= 0xFF:
        raise ProtocolError(f"ttrpc flags {flags} do not fit in a byte")
    return _HEADER.pack(len(payload), stream_id, frame_type, flags) + payload


class FrameDecoder:
    """Cuts frames out of a ttrpc byte stream fed in chunks of any size.

    `feed` returns the frames completed by the new bytes, in order, and keeps a partial frame
    for the next call. A header with a length over `MAX_PAYLOAD` or an unknown type raises
    `ProtocolError`; the decoder is then broken and raises again on every later call (the
    stream has lost its framing: the connection must be closed).
    """

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._broken: str | None = None

    @property
    def pending(self) -> int:
        """Bytes received that do not make a whole frame yet."""
        return len(self._buffer)

    def feed(self, data: bytes) -> list[Frame]:
        """The frames that `data` completes."""
        if self._broken is not None:
            raise ProtocolError(self._broken)
        buffer = self._buffer
        buffer += data
        frames: list[Frame] = []
        offset = 0
        while len(buffer) - offset >= HEADER_LEN:
            length, stream_id, frame_type, flags = _HEADER.unpack_from(buffer, offset)
            if length > MAX_PAYLOAD:
                self._broken = (
                    f"ttrpc frame of stream {stream_id} announces {length} bytes "
                    f"(the limit is {MAX_PAYLOAD})"
                )
                raise ProtocolError(self._broken)
            if frame_type not in FRAME_TYPES:
                self._broken = f"ttrpc frame of stream {stream_id} has unknown type {frame_type}"
                raise ProtocolError(self._broken)
            end = offset + HEADER_LEN + length
            if len(buffer) < end:
                break
            payload = bytes(buffer[offset + HEADER_LEN : end])
            frames.append(Frame(stream_id, frame_type, flags, payload))
            offset = end
        if offset:
            del buffer[:offset]
        return frames


# ---------------------------------------------------------------- the envelope
def encode_request(
    stream_id: int, service: str, method: str, message: Message, timeout: float | None = None
) -> bytes:
    """The frame of a call of `service`.`method` with `message`; `timeout` (seconds) goes into
    the envelope as the caller's deadline."""
    envelope = ttrpc_pb2.Request(
        service=service,
        method=method,
        payload=message.SerializeToString(),
        timeout_nano=int(timeout * 1e9) if timeout else 0,
    )
    return encode_frame(stream_id, TYPE_REQUEST, envelope.SerializeToString())


def encode_response(stream_id: int, message: Message) -> bytes:
    """The frame of a successful answer carrying `message`."""
    envelope = ttrpc_pb2.Response(payload=message.SerializeToString())
    return encode_frame(stream_id, TYPE_RESPONSE, envelope.SerializeToString())


def encode_error(stream_id: int, code: int, message: str) -> bytes:
    """The frame of a failed answer: status `code` (google.rpc.Code) and `message`."""
    envelope = ttrpc_pb2.Response(status=ttrpc_pb2.Status(code=code, message=message))
    return encode_frame(stream_id, TYPE_RESPONSE, envelope.SerializeToString())


def parse_request(frame: Frame) -> ttrpc_pb2.Request:
    """The `Request` envelope of a request frame (`ProtocolError` when it is not one)."""
    request = ttrpc_pb2.Request()
    _parse(request, frame, "request")
    return request


def parse_response(frame: Frame) -> ttrpc_pb2.Response:
    """The `Response` envelope of a response frame (`ProtocolError` when it is not one)."""
    response = ttrpc_pb2.Response()
    _parse(response, frame, "response")
    return response


def _parse(envelope: Message, frame: Frame, what: str) -> None:
    try:
        envelope.ParseFromString(frame.payload)
    except (DecodeError, ValueError, RuntimeError) as exc:
        raise ProtocolError(
            f"ttrpc {what} of stream {frame.stream_id} is not a valid envelope: {exc}"
        ) from exc
