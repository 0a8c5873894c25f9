"""NRI's connection multiplexing: two ttrpc connections over the one socket to the runtime.

Why: an NRI plugin both serves (the runtime calls Configure, Synchronize and
the events on it) and calls (it registers itself), over a single unix socket.
containerd/nri v0.8.0 (pkg/net/multiplex) splits the socket into numbered
connections; this is the same wire format:

- a frame is an 8-byte header, connection id (u32, big endian) and payload
  length (u32 BE), then the payload: a piece of that connection's byte
  stream. Pieces need not line up with ttrpc messages; a connection's bytes
  are its frames' payloads in order.
- a payload is at most one ttrpc header plus ttrpc's 4 MiB message limit;
  longer writes are cut into several frames, and a peer announcing a longer
  frame is refused (`FrameTooLarge`: the stream cannot be trusted after it,
  so the whole socket is closed and the plugin reconnects).
- connection 0 is reserved; 1 is the plugin service (the runtime is the
  client, we serve), 2 the runtime service (we are the client). Frames for
  a connection nobody opened are dropped, as the Go side does.
"""

from __future__ import annotations

import asyncio
import logging
import struct

from plugin.nri.ttrpc import HEADER_LEN, MAX_MESSAGE, ConnectionClosed, FrameTooLarge

log = logging.getLogger(__name__)

HEADER = struct.Struct(">II")
#: The multiplexer's largest frame payload: one whole ttrpc message of the largest size.
MAX_PAYLOAD = HEADER_LEN + MAX_MESSAGE
PLUGIN_SERVICE_CONN = 1
RUNTIME_SERVICE_CONN = 2
#: Frames queued per connection before the reader waits for its consumer (Go: 256, then it fails).
QUEUE_FRAMES = 256


def encode_frames(conn_id: int, data: bytes) -> bytes:
    """`data` for connection `conn_id`, as one frame or several of at most `MAX_PAYLOAD` bytes."""
    if conn_id == 0:
        raise ValueError("multiplexer connection id 0 is reserved")
    if not data:
        return b""
    return b"".join(HEADER.pack(conn_id, len(data[i:i + MAX_PAYLOAD])) + data[i:i + MAX_PAYLOAD]
                    for i in range(0, len(data), MAX_PAYLOAD))


class FrameReader:
    """Cuts the socket's bytes into (connection id, payload) frames; pieces of any size go in."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        self._buf += data
        out: list[tuple[int, bytes]] = []
        while len(self._buf) >= HEADER.size:
            conn_id, length = HEADER.unpack_from(self._buf)
            if length > MAX_PAYLOAD:
                raise FrameTooLarge(f"NRI multiplexer frame of {length} bytes for connection {conn_id} exceeds "
                                    f"the maximum of {MAX_PAYLOAD} bytes (a ttrpc header plus its 4 MiB limit); "
                                    "the peer does not speak NRI's multiplexing or the stream is corrupt")
            if len(self._buf) < HEADER.size + length:
                break
            out.append((conn_id, bytes(self._buf[HEADER.size:HEADER.size + length])))
            del self._buf[:HEADER.size + length]
        return out


class MuxConn:
    """One multiplexed connection: a `plugin.nri.ttrpc.ByteStream`."""

    def __init__(self, mux: Multiplexer, conn_id: int):
        self._mux = mux
        self.conn_id = conn_id
        self._queue: asyncio.Queue[bytes] = asyncio.Queue(QUEUE_FRAMES)
        self._eof = False

    async def read(self) -> bytes:
        if self._eof:
            return b""
        data = await self._queue.get()
        if not data:
            self._eof = True
        return data

    async def write(self, data: bytes) -> None:
        await self._mux._write(self.conn_id, data)

    def close(self) -> None:
        self._mux._forget(self)
        self._end()

    def _end(self) -> None:
        """Wake the reader with end-of-stream, even when the queue is full."""
        if self._eof:
            return
        while self._queue.full():
            self._queue.get_nowait()
        self._queue.put_nowait(b"")


class Multiplexer:
    """Numbered connections over one stream socket (NRI's trunk)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self._reader = reader
        self._writer = writer
        self._conns: dict[int, MuxConn] = {}
        self._closed = False
        self._write_lock = asyncio.Lock()

    def open(self, conn_id: int) -> MuxConn:
        if conn_id == 0:
            raise ValueError("multiplexer connection id 0 is reserved")
        if conn_id not in self._conns:
            self._conns[conn_id] = MuxConn(self, conn_id)
        return self._conns[conn_id]

    async def run(self) -> None:
        """Hand each frame to its connection until the socket closes; then end every connection.

        Raises `FrameTooLarge` for an oversized frame, after closing everything.
        """
        frames = FrameReader()
        try:
            while True:
                data = await self._reader.read(1 << 16)
                if not data:
                    return
                for conn_id, payload in frames.feed(data):
                    conn = self._conns.get(conn_id)
                    if conn is None:
                        log.debug("NRI multiplexer: dropped %d bytes for unopened connection %d",
                                  len(payload), conn_id)
                    elif payload:
                        await conn._queue.put(payload)
        finally:
            self.close()

    async def _write(self, conn_id: int, data: bytes) -> None:
        if self._closed:
            raise ConnectionClosed(f"NRI multiplexer closed; connection {conn_id} cannot send")
        # One writer at a time: a connection's frames must not interleave with another's mid-frame.
        async with self._write_lock:
            try:
                self._writer.write(encode_frames(conn_id, data))
                await self._writer.drain()
            except OSError as exc:  # the peer went away mid-write: the same as a close, for the caller
                self.close()
                raise ConnectionClosed(f"NRI multiplexer: connection {conn_id} cannot send: {exc}") from exc

    def _forget(self, conn: MuxConn) -> None:
        if self._conns.get(conn.conn_id) is conn:
            del self._conns[conn.conn_id]

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for conn in list(self._conns.values()):
            conn._end()
        self._writer.close()

    @property
    def closed(self) -> bool:
        return self._closed
