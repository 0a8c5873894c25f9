"""ttrpc, the small RPC protocol containerd speaks to NRI plugins: framing and one connection.

Why our own: no maintained Python ttrpc exists, and NRI needs only its unary
part. What is implemented follows ttrpc v1.2.7 (the version containerd v2.1.4
vendors; its PROTOCOL.md and channel.go):

- every message is a 10-byte header, then the payload: length (u32, big
  endian, payload only), stream id (u32 BE), type (u8: 1 request, 2 response,
  3 data), flags (u8);
- a payload longer than 4 MiB is refused: ttrpc discards it and answers the
  request with RESOURCE_EXHAUSTED, and so do we (the bytes are skipped, the
  connection survives); we never send one (`FrameTooLarge`);
- the client opens a stream per call with an odd id, sends one request
  (`ttrpc.Request`: service, method, payload), gets one response
  (`ttrpc.Response`: a google.rpc.Status and the payload). Streaming calls
  (data messages, the remote-open flag) are not used by NRI: a streaming
  request is answered UNIMPLEMENTED, stray data messages are dropped.

The byte stream underneath is a `ByteStream` (a connection of the NRI
multiplexer, plugin/nri/mux.py), so this module knows nothing of sockets.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from plugin.api.ttrpc import request_pb2
from plugin.errors import RuntimeFailure

log = logging.getLogger(__name__)

HEADER = struct.Struct(">IIBB")
HEADER_LEN = HEADER.size  # 10
#: ttrpc's messageLengthMax: the largest payload either side accepts.
MAX_MESSAGE = 4 << 20

FLAG_REMOTE_CLOSED = 0x1
FLAG_REMOTE_OPEN = 0x2
FLAG_NO_DATA = 0x4


class MessageType(enum.IntEnum):
    REQUEST = 1
    RESPONSE = 2
    DATA = 3


class Code(enum.IntEnum):
    """The gRPC status codes ttrpc carries in `Response.status.code` (the ones we use)."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    RESOURCE_EXHAUSTED = 8
    UNIMPLEMENTED = 12
    UNAVAILABLE = 14


class TtrpcError(RuntimeFailure):
    """The ttrpc peer broke the protocol or went away; the NRI plugin reconnects."""


class FrameTooLarge(TtrpcError):
    """A message over the 4 MiB limit (ours to send, or announced by the peer)."""


class ConnectionClosed(TtrpcError):
    """The connection closed while a call waited for its answer."""


class StatusError(TtrpcError):
    """A non-OK status: raised by `Endpoint.call` for the peer's, by a handler to choose our own."""

    def __init__(self, code: int, message: str):
        super().__init__(f"{_code_name(code)}: {message}")
        self.code = code
        self.message = message


def _code_name(code: int) -> str:
    try:
        return Code(code).name
    except ValueError:
        return f"code {code}"


@dataclass(frozen=True)
class Message:
    """One ttrpc message as read off the stream."""

    stream_id: int
    type: int
    flags: int
    payload: bytes


@dataclass(frozen=True)
class Oversized:
    """A message whose announced length exceeded `MAX_MESSAGE`: its payload was skipped unread."""

    stream_id: int
    type: int
    length: int

    def describe(self) -> str:
        return (f"ttrpc message of {self.length} bytes on stream {self.stream_id} exceeds the "
                f"maximum message size of {MAX_MESSAGE} bytes")


def encode(stream_id: int, type_: int, payload: bytes, flags: int = 0) -> bytes:
    """Header + payload of one message; refuses what the peer would refuse, before sending anything."""
    if len(payload) > MAX_MESSAGE:
        raise FrameTooLarge(f"ttrpc message of {len(payload)} bytes on stream {stream_id} exceeds the "
                            f"maximum message size of {MAX_MESSAGE} bytes; it was not sent")
    return HEADER.pack(len(payload), stream_id, type_, flags) + payload


class MessageReader:
    """Cuts a byte stream into messages, whatever the size of the pieces it arrives in.

    Why incremental (`feed`) rather than "read exactly n bytes": the bytes come
    through the multiplexer in chunks that need not line up with messages, and
    a pure decoder can be tested with every possible split.
    """

    def __init__(self) -> None:
        self._buf = bytearray()
        self._skip = 0  # bytes of an oversized payload still to discard

    def feed(self, data: bytes) -> list[Message | Oversized]:
        out: list[Message | Oversized] = []
        self._buf += data
        while True:
            if self._skip:
                n = min(self._skip, len(self._buf))
                del self._buf[:n]
                self._skip -= n
                if self._skip:
                    return out
            if len(self._buf) < HEADER_LEN:
                return out
            length, stream_id, type_, flags = HEADER.unpack_from(self._buf)
            if length > MAX_MESSAGE:
                del self._buf[:HEADER_LEN]
                self._skip = length
                out.append(Oversized(stream_id, type_, length))
                continue
            if len(self._buf) < HEADER_LEN + length:
                return out
            payload = bytes(self._buf[HEADER_LEN:HEADER_LEN + length])
            del self._buf[:HEADER_LEN + length]
            out.append(Message(stream_id, type_, flags, payload))

    @property
    def pending(self) -> int:
        """Bytes held for an incomplete message (0 at a message boundary)."""
        return len(self._buf) + self._skip


class ByteStream(Protocol):
    """A bidirectional byte stream (one connection of the NRI multiplexer)."""

    async def read(self) -> bytes:
        """The next bytes; b"" once the stream is closed."""
        ...

    async def write(self, data: bytes) -> None: ...

    def close(self) -> None: ...


#: Serves one request: (service, method, request payload) -> response payload. Raising
#: `StatusError` answers with its code; any other exception answers UNKNOWN with its text.
Handler = Callable[[str, str, bytes], Awaitable[bytes]]


class Endpoint:
    """One ttrpc connection: sends our calls and, given a handler, serves the peer's.

    `run()` reads until the stream closes; calls still waiting then fail with
    `ConnectionClosed` and handlers still running are cancelled, so nothing
    outlives the connection.
    """

    def __init__(self, stream: ByteStream, handler: Handler | None = None, *, name: str = "ttrpc"):
        self._stream = stream
        self._handler = handler
        self._name = name
        self._next_stream = 1  # client streams are odd
        self._calls: dict[int, asyncio.Future[bytes]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._write_lock = asyncio.Lock()
        self._closed = False

    async def run(self) -> None:
        reader = MessageReader()
        try:
            while True:
                data = await self._stream.read()
                if not data:
                    return
                for msg in reader.feed(data):
                    self._dispatch(msg)
        finally:
            self._shutdown()

    def _shutdown(self) -> None:
        self._closed = True
        for fut in self._calls.values():
            if not fut.done():
                fut.set_exception(ConnectionClosed(f"{self._name}: connection closed before the answer came"))
        self._calls.clear()
        for task in list(self._tasks):
            task.cancel()

    def _dispatch(self, msg: Message | Oversized) -> None:
        if isinstance(msg, Oversized):
            log.warning("%s: %s", self._name, msg.describe())
            if msg.type == MessageType.REQUEST:
                self._spawn(self._answer(msg.stream_id, Code.RESOURCE_EXHAUSTED, msg.describe(), b""))
            elif msg.type == MessageType.RESPONSE and (fut := self._calls.pop(msg.stream_id, None)):
                if not fut.done():
                    fut.set_exception(FrameTooLarge(f"{self._name}: the answer was refused: {msg.describe()}"))
            return
        if msg.type == MessageType.RESPONSE:
            fut = self._calls.pop(msg.stream_id, None)
            if fut is None:
                log.warning("%s: response on stream %d, which no call is waiting for", self._name, msg.stream_id)
            elif not fut.done():
                fut.set_result(msg.payload)
        elif msg.type == MessageType.REQUEST:
            self._spawn(self._serve(msg))
        else:
            log.debug("%s: dropped a type-%d message on stream %d (streams are not used by NRI)",
                      self._name, msg.type, msg.stream_id)

    def _spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve(self, msg: Message) -> None:
        try:
            req = request_pb2.Request.FromString(msg.payload)
        except Exception as exc:  # noqa: BLE001 - a malformed request gets an answer, not a crash
            await self._answer(msg.stream_id, Code.UNKNOWN, f"malformed ttrpc request: {exc}", b"")
            return
        if msg.flags & (FLAG_REMOTE_OPEN | FLAG_REMOTE_CLOSED):
            await self._answer(msg.stream_id, Code.UNIMPLEMENTED,
                               f"/{req.service}/{req.method}: streaming calls are not supported", b"")
            return
        if self._handler is None:
            await self._answer(msg.stream_id, Code.UNIMPLEMENTED, f"service {req.service} is not served here", b"")
            return
        try:
            payload = await self._handler(req.service, req.method, req.payload)
        except StatusError as exc:
            await self._answer(msg.stream_id, exc.code, exc.message, b"")
        except Exception as exc:  # noqa: BLE001 - the handler's failure is the caller's answer
            await self._answer(msg.stream_id, Code.UNKNOWN, str(exc) or type(exc).__name__, b"")
        else:
            await self._answer(msg.stream_id, Code.OK, "", payload)

    async def _answer(self, stream_id: int, code: int, message: str, payload: bytes) -> None:
        resp = request_pb2.Response(status=request_pb2.Status(code=code, message=message), payload=payload)
        try:
            await self._send(encode(stream_id, MessageType.RESPONSE, resp.SerializeToString()))
        except FrameTooLarge as exc:
            await self._answer(stream_id, Code.RESOURCE_EXHAUSTED, str(exc), b"")
        except (ConnectionError, TtrpcError) as exc:
            log.info("%s: could not answer stream %d: %s", self._name, stream_id, exc)

    async def _send(self, data: bytes) -> None:
        if self._closed:
            raise ConnectionClosed(f"{self._name}: connection closed")
        async with self._write_lock:
            await self._stream.write(data)

    async def call(self, service: str, method: str, payload: bytes, *, timeout: float | None = None) -> bytes:
        """One unary call; the answer's payload, or `StatusError` with the peer's status."""
        stream_id = self._next_stream
        self._next_stream += 2
        req = request_pb2.Request(service=service, method=method, payload=payload,
                                  timeout_nano=int(timeout * 1e9) if timeout else 0)
        data = encode(stream_id, MessageType.REQUEST, req.SerializeToString())
        fut: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._calls[stream_id] = fut
        try:
            await self._send(data)
            async with asyncio.timeout(timeout):
                raw = await fut
        finally:
            self._calls.pop(stream_id, None)
        resp = request_pb2.Response.FromString(raw)
        if resp.status.code != Code.OK:
            raise StatusError(resp.status.code, resp.status.message)
        return resp.payload
