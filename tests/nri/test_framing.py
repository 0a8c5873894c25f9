"""ttrpc framing and NRI's multiplexing (plugin/nri/ttrpc.py, plugin/nri/mux.py), byte for byte and on a socket.

The wire formats are containerd/ttrpc v1.2.7's channel.go and containerd/nri
v0.8.0's pkg/net/multiplex: the expected bytes below are written out from those
formats, not produced by our encoder. The socket tests run two of our endpoints
against each other over a real unix socket pair; tests/nri/test_nri_runtime.py
runs the plugin against NRI's own Go runtime.
"""

from __future__ import annotations

import asyncio
import socket
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from plugin.api.ttrpc import request_pb2
from plugin.nri import mux, ttrpc
from plugin.nri.mux import FrameReader, Multiplexer, encode_frames
from plugin.nri.ttrpc import Code, Endpoint, FrameTooLarge, Message, MessageReader, MessageType, Oversized, StatusError


def test_message_header_is_ttrpcs_ten_bytes():
    data = ttrpc.encode(7, MessageType.RESPONSE, b"abc", flags=ttrpc.FLAG_REMOTE_CLOSED)
    # u32 BE length of the payload, u32 BE stream id, u8 type, u8 flags, payload.
    assert data == b"\x00\x00\x00\x03" b"\x00\x00\x00\x07" b"\x02" b"\x01" b"abc"


def test_mux_frame_header_is_nris_eight_bytes():
    assert encode_frames(2, b"hello") == b"\x00\x00\x00\x02" b"\x00\x00\x00\x05" b"hello"


def _stream_of(messages: list[Message]) -> bytes:
    return b"".join(ttrpc.encode(m.stream_id, m.type, m.payload, m.flags) for m in messages)


MESSAGES = [Message(1, MessageType.REQUEST, 0, b"first"), Message(3, MessageType.REQUEST, 0, b""),
            Message(2, MessageType.RESPONSE, 0, bytes(range(256)) * 3), Message(5, MessageType.DATA, 4, b"x")]


def test_every_split_into_two_reads_gives_the_same_messages():
    data = _stream_of(MESSAGES)
    for cut in range(len(data) + 1):
        reader = MessageReader()
        got = reader.feed(data[:cut]) + reader.feed(data[cut:])
        assert got == MESSAGES, cut
        assert reader.pending == 0


@given(st.lists(st.integers(min_value=1, max_value=40), max_size=60))
def test_byte_by_byte_and_random_reads_give_the_same_messages(sizes):
    data = _stream_of(MESSAGES)
    reader, got, pos = MessageReader(), [], 0
    for n in sizes:
        got += reader.feed(data[pos:pos + n])
        pos += n
    got += reader.feed(data[pos:])
    assert got == MESSAGES


def test_a_half_read_message_is_held_not_delivered():
    data = ttrpc.encode(1, MessageType.REQUEST, b"0123456789")
    reader = MessageReader()
    assert reader.feed(data[:-1]) == []
    assert reader.pending == len(data) - 1
    assert reader.feed(data[-1:]) == [Message(1, MessageType.REQUEST, 0, b"0123456789")]


def test_an_oversized_message_is_skipped_and_the_next_one_still_read():
    too_big = ttrpc.MAX_MESSAGE + 1
    data = struct.pack(">IIBB", too_big, 9, MessageType.REQUEST, 0) + b"\0" * too_big
    data += ttrpc.encode(11, MessageType.REQUEST, b"after")
    reader = MessageReader()
    got = []
    for i in range(0, len(data), 1 << 20):  # in 1 MiB reads: the skip spans several of them
        got += reader.feed(data[i:i + (1 << 20)])
    assert got == [Oversized(9, MessageType.REQUEST, too_big), Message(11, MessageType.REQUEST, 0, b"after")]
    assert "4194305 bytes on stream 9 exceeds the maximum message size of 4194304" in got[0].describe()


def test_sending_an_oversized_message_is_refused_before_any_byte_goes_out():
    with pytest.raises(FrameTooLarge, match=r"4194305 bytes on stream 3 exceeds .* 4194304 bytes; it was not sent"):
        ttrpc.encode(3, MessageType.REQUEST, b"\0" * (ttrpc.MAX_MESSAGE + 1))
    assert len(ttrpc.encode(3, MessageType.REQUEST, b"\0" * ttrpc.MAX_MESSAGE)) == ttrpc.MAX_MESSAGE + 10


def test_interleaved_connections_reassemble_each_stream():
    """Two connections' ttrpc messages, cut into frames that do not line up with messages, interleaved."""
    a = _stream_of(MESSAGES[:2])
    b = _stream_of(MESSAGES[2:])
    wire = b""
    for i in range(0, max(len(a), len(b)), 7):
        wire += encode_frames(1, a[i:i + 7]) + encode_frames(2, b[i:i + 7])
    frames, readers, got = FrameReader(), {1: MessageReader(), 2: MessageReader()}, {1: [], 2: []}
    for i in range(0, len(wire), 5):
        for conn_id, payload in frames.feed(wire[i:i + 5]):
            got[conn_id] += readers[conn_id].feed(payload)
    assert got == {1: MESSAGES[:2], 2: MESSAGES[2:]}


def test_a_long_write_is_cut_into_frames_of_the_maximum_payload():
    data = bytes(range(256)) * ((mux.MAX_PAYLOAD * 2) // 256 + 3)
    wire = encode_frames(1, data)
    frames = FrameReader().feed(wire)
    assert [len(p) for _, p in frames] == [mux.MAX_PAYLOAD, mux.MAX_PAYLOAD, len(data) - 2 * mux.MAX_PAYLOAD]
    assert b"".join(p for _, p in frames) == data


def test_an_oversized_mux_frame_is_refused_with_a_clear_error():
    with pytest.raises(FrameTooLarge, match=r"frame of 4194315 bytes for connection 1 exceeds the maximum of "
                                            r"4194314 bytes .* does not speak NRI's multiplexing"):
        FrameReader().feed(struct.pack(">II", 1, mux.MAX_PAYLOAD + 1))


# --- two endpoints over a real unix socket pair, through the multiplexer ---


async def _pair(handler) -> tuple[Endpoint, Endpoint, list[asyncio.Task], list[Multiplexer]]:
    """A client endpoint on one end's connection 2, a serving endpoint on the other end's connection 2."""
    left, right = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    muxes = [Multiplexer(*await asyncio.open_unix_connection(sock=s)) for s in (left, right)]
    client = Endpoint(muxes[0].open(mux.RUNTIME_SERVICE_CONN), name="client")
    server = Endpoint(muxes[1].open(mux.RUNTIME_SERVICE_CONN), handler, name="server")
    tasks = [asyncio.create_task(t) for t in (muxes[0].run(), muxes[1].run(), client.run(), server.run())]
    return client, server, tasks, muxes


async def _close(tasks, muxes) -> None:
    for m in muxes:
        m.close()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_concurrent_calls_get_their_own_answers_whatever_order_they_finish_in():
    first_may_finish = asyncio.Event()
    order: list[str] = []

    async def handler(service: str, method: str, payload: bytes) -> bytes:
        if payload == b"slow":
            await first_may_finish.wait()
        order.append(payload.decode())
        return f"{service}/{method}:{payload.decode()}".encode()

    client, _, tasks, muxes = await _pair(handler)
    try:
        slow = asyncio.create_task(client.call("svc", "Slow", b"slow"))
        fast = await client.call("svc", "Fast", b"fast")
        assert fast == b"svc/Fast:fast" and not slow.done()
        first_may_finish.set()
        assert await slow == b"svc/Slow:slow"
        assert order == ["fast", "slow"]
    finally:
        await _close(tasks, muxes)


async def test_a_handler_exception_becomes_the_callers_error_and_the_connection_lives_on():
    async def handler(service: str, method: str, payload: bytes) -> bytes:
        if method == "Boom":
            raise RuntimeError("netns /var/run/netns/x is gone")
        if method == "Missing":
            raise StatusError(Code.UNIMPLEMENTED, "no such method")
        return b"ok"

    client, _, tasks, muxes = await _pair(handler)
    try:
        with pytest.raises(StatusError) as err:
            await client.call("svc", "Boom", b"")
        assert err.value.code == Code.UNKNOWN and err.value.message == "netns /var/run/netns/x is gone"
        with pytest.raises(StatusError) as err:
            await client.call("svc", "Missing", b"")
        assert err.value.code == Code.UNIMPLEMENTED
        assert await client.call("svc", "Fine", b"") == b"ok"
    finally:
        await _close(tasks, muxes)


async def test_an_oversized_request_is_answered_resource_exhausted_and_the_next_call_works():
    async def handler(service: str, method: str, payload: bytes) -> bytes:
        return b"ok"

    left, right = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    server_mux = Multiplexer(*await asyncio.open_unix_connection(sock=right))
    server = Endpoint(server_mux.open(1), handler, name="server")
    tasks = [asyncio.create_task(server_mux.run()), asyncio.create_task(server.run())]
    reader, writer = await asyncio.open_unix_connection(sock=left)
    try:
        # A peer that ignores the limit: announces 4 MiB + 1 on stream 1 (sent in frames of the maximum size).
        big = ttrpc.MAX_MESSAGE + 1
        writer.write(encode_frames(1, struct.pack(">IIBB", big, 1, MessageType.REQUEST, 0) + b"\0" * big))
        good = request_pb2.Request(service="svc", method="M").SerializeToString()
        writer.write(encode_frames(1, ttrpc.encode(3, MessageType.REQUEST, good)))
        await writer.drain()
        frames, messages = FrameReader(), MessageReader()
        answers: list[Message] = []
        while len(answers) < 2:
            data = await reader.read(1 << 16)
            assert data, "the server closed the connection"
            for _, payload in frames.feed(data):
                answers += messages.feed(payload)
        by_stream = {m.stream_id: request_pb2.Response.FromString(m.payload) for m in answers}
        assert by_stream[1].status.code == Code.RESOURCE_EXHAUSTED
        assert "exceeds the maximum message size of 4194304" in by_stream[1].status.message
        assert by_stream[3].status.code == Code.OK and by_stream[3].payload == b"ok"
    finally:
        writer.close()
        await _close(tasks, [server_mux])


async def test_an_oversized_mux_frame_closes_the_socket_and_ends_every_connection():
    left, right = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    m = Multiplexer(*await asyncio.open_unix_connection(sock=right))
    conn = m.open(1)
    run = asyncio.create_task(m.run())
    _, writer = await asyncio.open_unix_connection(sock=left)
    writer.write(struct.pack(">II", 1, mux.MAX_PAYLOAD + 1))
    await writer.drain()
    with pytest.raises(FrameTooLarge):
        await run
    assert await conn.read() == b"" and m.closed
    writer.close()


async def test_a_call_waiting_when_the_connection_closes_fails_with_a_reason():
    entered, never = asyncio.Event(), asyncio.Event()

    async def handler(service: str, method: str, payload: bytes) -> bytes:
        entered.set()
        await never.wait()
        return b""

    client, _, tasks, muxes = await _pair(handler)
    call = asyncio.create_task(client.call("svc", "Hang", b""))
    await entered.wait()  # the request arrived; its answer never will
    muxes[1].close()  # the serving side goes away
    with pytest.raises(ttrpc.ConnectionClosed, match="connection closed before the answer came"):
        await call
    await _close(tasks, muxes)
