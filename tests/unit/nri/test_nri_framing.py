"""The NRI framing: ttrpc frames and the multiplexer, against bytes built by hand from the
protocol's description, and as properties (any cut of a stream decodes the same; garbage raises
nothing but the module's own error)."""

from __future__ import annotations

import contextlib
import itertools
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corepin.core.errors import EnvironmentProblem
from corepin.nri import mux, ttrpc
from corepin.nri.gen import api_pb2, ttrpc_pb2
from corepin.nri.mux import MuxDecoder, StreamDecoder, encode_mux
from corepin.nri.ttrpc import Frame, FrameDecoder, ProtocolError
from support.budget import examples


# ---------------------------------------------------------------- hand-built bytes
def test_a_ttrpc_frame_is_length_stream_type_flags_then_payload() -> None:
    assert ttrpc.encode_frame(1, ttrpc.TYPE_REQUEST, b"abc") == (
        b"\x00\x00\x00\x03\x00\x00\x00\x01\x01\x00abc"
    )
    assert ttrpc.encode_frame(0x01020304, ttrpc.TYPE_RESPONSE, b"", flags=0x05) == (
        b"\x00\x00\x00\x00\x01\x02\x03\x04\x02\x05"
    )


def test_a_mux_frame_is_connection_length_then_payload() -> None:
    assert encode_mux(2, b"hello") == b"\x00\x00\x00\x02\x00\x00\x00\x05hello"


def test_writes_are_cut_into_mux_frames_of_at_most_4096_bytes() -> None:
    data = bytes(range(256)) * 20  # 5120 bytes
    out = encode_mux(1, data)
    assert out[:8] == b"\x00\x00\x00\x01\x00\x00\x10\x00"  # 4096
    assert out[8 : 8 + 4096] == data[:4096]
    assert out[8 + 4096 : 16 + 4096] == b"\x00\x00\x00\x01\x00\x00\x04\x00"  # 1024
    assert out[16 + 4096 :] == data[4096:]
    assert mux.WRITE_CHUNK == 4096


def test_connection_zero_is_reserved() -> None:
    with pytest.raises(ProtocolError, match="reserved"):
        encode_mux(0, b"x")


def test_a_request_envelope_matches_the_protobuf_wire_by_hand() -> None:
    # Request{service="s" (field 1), method="m" (field 2), payload=RegisterPluginRequest
    # {plugin_name="p" (1), plugin_idx="10" (2)} (field 3), timeout_nano=2 s (field 4)}
    register = b"\x0a\x01p\x12\x0210"
    timeout = b"\x20\x80\xa8\xd6\xb9\x07"  # varint 2_000_000_000
    envelope = b"\x0a\x01s\x12\x01m\x1a" + bytes([len(register)]) + register + timeout
    frame = ttrpc.encode_request(
        7, "s", "m", api_pb2.RegisterPluginRequest(plugin_name="p", plugin_idx="10"), 2.0
    )
    assert frame == struct.pack(">IIBB", len(envelope), 7, 1, 0) + envelope
    parsed = ttrpc.parse_request(Frame(7, 1, 0, envelope))
    assert (parsed.service, parsed.method, parsed.timeout_nano) == ("s", "m", 2_000_000_000)


def test_an_error_response_matches_the_protobuf_wire_by_hand() -> None:
    # Response{status (field 1) = Status{code=12 (1), message="x" (2)}}
    envelope = b"\x0a\x05\x08\x0c\x12\x01x"
    assert ttrpc.encode_error(3, ttrpc.UNIMPLEMENTED, "x") == (
        b"\x00\x00\x00\x07\x00\x00\x00\x03\x02\x00" + envelope
    )
    parsed = ttrpc.parse_response(Frame(3, 2, 0, envelope))
    assert (parsed.status.code, parsed.status.message) == (12, "x")


def test_a_configure_answer_carries_the_mask_in_field_2() -> None:
    # ConfigureResponse{events (field 2) = 0x209}: tag 0x10, varint 0x209 = 0x89 0x04
    answer = ttrpc.encode_response(1, api_pb2.ConfigureResponse(events=0x209))
    envelope = b"\x12\x03\x10\x89\x04"  # Response{payload (field 2)}
    assert answer == struct.pack(">IIBB", len(envelope), 1, 2, 0) + envelope


def test_the_decoder_cuts_hand_built_frames() -> None:
    stream = (
        b"\x00\x00\x00\x02"
        b"\x00\x00\x00\x01"
        b"\x01\x00"
        b"hi"
        b"\x00\x00\x00\x00"
        b"\x00\x00\x00\x03"
        b"\x03\x02"
        b"\x00\x00\x00\x01"
        b"\x00\x00\x00\x05"
        b"\x02"
    )
    decoder = FrameDecoder()
    assert decoder.feed(stream) == [Frame(1, 1, 0, b"hi"), Frame(3, 3, 2, b"")]
    assert decoder.pending == 9
    assert decoder.feed(b"\x00!") == [Frame(5, 2, 0, b"!")]
    assert decoder.pending == 0


def test_one_ttrpc_frame_over_several_mux_frames_and_several_in_one() -> None:
    first = b"\x00\x00\x00\x03\x00\x00\x00\x01\x01\x00abc"
    second = b"\x00\x00\x00\x01\x00\x00\x00\x03\x01\x00d"
    answer = b"\x00\x00\x00\x00\x00\x00\x00\x01\x02\x00"
    trunk = (
        b"\x00\x00\x00\x01\x00\x00\x00\x04"
        + first[:4]
        + b"\x00\x00\x00\x02\x00\x00\x00\x0a"
        + answer  # connection 2 in between
        + b"\x00\x00\x00\x01"
        + struct.pack(">I", len(first) - 4 + len(second))
        + first[4:]
        + second
        + b"\x00\x00\x00\x09\x00\x00\x00\x01"
        b"z"  # a connection nobody opened: dropped
    )
    assert StreamDecoder().feed(trunk) == [
        (2, Frame(1, 2, 0, b"")),
        (1, Frame(1, 1, 0, b"abc")),
        (1, Frame(3, 1, 0, b"d")),
    ]


# ---------------------------------------------------------------- limits
def test_the_largest_ttrpc_payload_is_4_mib() -> None:
    decoder = FrameDecoder()
    assert decoder.feed(struct.pack(">IIBB", 4 << 20, 1, 1, 0)) == []
    with pytest.raises(ProtocolError, match="announces 4194305 bytes"):
        FrameDecoder().feed(struct.pack(">IIBB", (4 << 20) + 1, 1, 1, 0))
    with pytest.raises(ProtocolError) as raised:
        ttrpc.encode_frame(1, 1, bytes((4 << 20) + 1))
    assert raised.value.reason == "nri_message_too_large"


def test_the_largest_mux_payload_is_16_mib() -> None:
    assert MuxDecoder().feed(struct.pack(">II", 1, 1 << 24)) == []
    with pytest.raises(ProtocolError, match="announces 16777217 bytes"):
        MuxDecoder().feed(struct.pack(">II", 1, (1 << 24) + 1))


@pytest.mark.parametrize("kind", [0, 4, 255])
def test_an_unknown_frame_type_breaks_the_stream_for_good(kind: int) -> None:
    decoder = FrameDecoder()
    with pytest.raises(ProtocolError, match=f"unknown type {kind}"):
        decoder.feed(struct.pack(">IIBB", 0, 1, kind, 0))
    with pytest.raises(ProtocolError):
        decoder.feed(ttrpc.encode_frame(1, 1, b""))


def test_encode_refuses_what_does_not_fit_the_header() -> None:
    for args in ((-1, 1, b""), (1 << 32, 1, b""), (1, 9, b"")):
        with pytest.raises(ProtocolError):
            ttrpc.encode_frame(*args)
    with pytest.raises(ProtocolError):
        ttrpc.encode_frame(1, 1, b"", flags=256)


def test_the_errors_are_environment_problems_with_exit_4() -> None:
    assert issubclass(ProtocolError, EnvironmentProblem)
    assert ProtocolError("x").exit_code == 4
    error = ttrpc.RemoteError("UpdateContainers", 13, "boom")
    assert (error.reason, error.code, str(error)) == (
        "nri_rejected",
        13,
        "UpdateContainers failed: boom (code 13)",
    )


def test_a_garbage_envelope_is_a_protocol_error() -> None:
    with pytest.raises(ProtocolError, match="not a valid envelope"):
        ttrpc.parse_request(Frame(1, 1, 0, b"\xff\xff\xff"))


# ---------------------------------------------------------------- properties
frames = st.lists(
    st.builds(
        Frame,
        stream_id=st.integers(0, 0xFFFFFFFF),
        type=st.sampled_from(sorted(ttrpc.FRAME_TYPES)),
        flags=st.integers(0, 255),
        payload=st.binary(max_size=300),
    ),
    max_size=12,
)


def _cut(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    edges = [0, *points, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(edges)]


@settings(max_examples=examples(200))
@given(frames, st.lists(st.integers(0, 10_000), max_size=40))
def test_any_cut_of_a_ttrpc_stream_decodes_to_the_same_frames(
    sent: list[Frame], cuts: list[int]
) -> None:
    data = b"".join(ttrpc.encode_frame(f.stream_id, f.type, f.payload, f.flags) for f in sent)
    decoder = FrameDecoder()
    got = [frame for piece in _cut(data, cuts) for frame in decoder.feed(piece)]
    assert got == sent
    assert decoder.pending == 0


@settings(max_examples=examples(200))
@given(
    st.lists(st.tuples(st.sampled_from([1, 2]), frames.map(tuple)), max_size=6),
    st.integers(1, 64),
    st.lists(st.integers(0, 10_000), max_size=40),
)
def test_any_cut_of_a_multiplexed_stream_decodes_to_each_connections_frames(
    bursts: list[tuple[int, tuple[Frame, ...]]], chunk: int, cuts: list[int]
) -> None:
    trunk = b""
    sent: dict[int, list[Frame]] = {1: [], 2: []}
    for conn_id, burst in bursts:
        data = b"".join(ttrpc.encode_frame(f.stream_id, f.type, f.payload, f.flags) for f in burst)
        trunk += encode_mux(conn_id, data, chunk=chunk)
        sent[conn_id].extend(burst)
    decoder = StreamDecoder()
    got: dict[int, list[Frame]] = {1: [], 2: []}
    for piece in _cut(trunk, cuts):
        for conn_id, frame in decoder.feed(piece):
            got[conn_id].append(frame)
    assert got == sent


@settings(max_examples=examples(300))
@given(st.lists(st.binary(max_size=64), max_size=8))
def test_garbage_raises_nothing_but_the_protocol_error(pieces: list[bytes]) -> None:
    ttrpc_decoder, stream_decoder = FrameDecoder(), StreamDecoder()
    for piece in pieces:
        for decoder in (ttrpc_decoder, stream_decoder):
            with contextlib.suppress(ProtocolError):
                decoder.feed(piece)
        for parse in (ttrpc.parse_request, ttrpc.parse_response):
            with contextlib.suppress(ProtocolError):
                parse(Frame(1, 1, 0, piece))


@settings(max_examples=examples(100))
@given(st.text(max_size=20), st.text(max_size=20), st.binary(max_size=100), st.integers(0, 2**62))
def test_a_request_envelope_round_trips(
    service: str, method: str, payload: bytes, timeout: int
) -> None:
    envelope = ttrpc_pb2.Request(
        service=service, method=method, payload=payload, timeout_nano=timeout
    )
    frame = ttrpc.encode_frame(9, ttrpc.TYPE_REQUEST, envelope.SerializeToString())
    (decoded,) = FrameDecoder().feed(frame)
    assert ttrpc.parse_request(decoded) == envelope
