"""A small, bounded, read-only HTTP/1.1 server on the daemon's asyncio loop.

Why not prometheus-client's own server: it is a threading WSGI server with no
timeouts, so every idle or half-sent connection held a thread and a file
descriptor forever (1,000 of them: 1,013 threads, 1,020 fds, +26 MiB; a low fd
limit then aborted gRPC at the next kubelet restart). The endpoint is reachable
from the pod network, so it has to survive idle connections, slowloris
clients and garbage without costing the daemon its memory or its fds.

How: h11 (a sans-IO HTTP/1.1 parser from the python-hyper project: pure
Python, no dependencies, the parser under httpcore and uvicorn) does the
protocol; this module only moves bytes between it and asyncio streams and
enforces the limits in `HTTPLimits`. aiohttp would bring a client, a router
and five C-extension dependencies for three GET routes, and the cap and the
whole-request deadline below would still be ours to add. The limits:
- a whole-request deadline: the request line and headers must be complete
  within `request_timeout_s` of the connection opening (or of the previous
  response), however the bytes trickle in; then the connection is closed;
- a response that the client does not take within `write_timeout_s` is dropped;
- at most `max_connections` connections at once. A new connection beyond the
  cap closes the connection that has waited longest for its request (idle
  keep-alive clients, slowloris), so a kubelet probe still gets in while idle
  connections fill the cap; if every connection is busy answering, the new
  one is closed at once. Nothing is queued beyond the kernel's listen backlog.
  The server accepts sockets itself, at most `ACCEPT_BATCH` per loop turn, and
  counts each one against the cap the moment it exists, so the endpoint holds
  at most `max_connections + 2 * ACCEPT_BATCH` fds (the excess only until the
  cut ones close on the next loop turn), whatever a flood of connections does;
- request headers of at most `max_header_bytes` (431 beyond), no request
  bodies (413), only GET and HEAD (405).
Everything runs on the one asyncio loop: no thread per connection, and the
handler reads the daemon's state from the loop that writes it.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
from collections.abc import Callable
from dataclasses import dataclass

import h11

from .address import parse_address

log = logging.getLogger(__name__)

_READ_CHUNK = 4096
#: Connections accepted per loop turn; the rest wait in the kernel's queue for the next turn.
ACCEPT_BATCH = 16
_BACKLOG = 128
#: accept() errors that mean "out of fds or memory": stop accepting for a moment, as asyncio does.
_EXHAUSTED = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}


@dataclass(frozen=True)
class HTTPLimits:
    #: Connections served at once; beyond it the longest-waiting one is closed.
    max_connections: int = 64
    #: Seconds for a whole request line and header block, from connect or the previous response.
    request_timeout_s: float = 5.0
    #: Seconds the client gets to take a response.
    write_timeout_s: float = 5.0
    #: Largest request line plus headers, in bytes.
    max_header_bytes: int = 8192

    def __post_init__(self) -> None:
        if self.max_connections < 1 or self.request_timeout_s <= 0 or self.write_timeout_s <= 0 \
                or self.max_header_bytes < 256:
            raise ValueError(f"unusable HTTP limits: {self}")


@dataclass(frozen=True)
class HTTPRequest:
    method: str
    #: The path without the query string.
    path: str
    query: str
    #: Lower-case header names; the last value of a repeated header wins.
    headers: dict[str, str]


@dataclass(frozen=True)
class HTTPResponse:
    status: int
    body: bytes = b""
    content_type: str = "text/plain; charset=utf-8"
    headers: tuple[tuple[str, str], ...] = ()


#: Routes one request; runs on the loop, so it must not block.
Handler = Callable[[HTTPRequest], HTTPResponse]


@dataclass(eq=False)
class _Connection:
    sock: socket.socket
    parser: h11.Connection
    #: Loop time since which it waits for its client's request (from the accept, or from the previous
    #: response); None while a request is answered. Only a waiting connection can be evicted.
    waiting_since: float | None
    task: asyncio.Task | None = None
    transport: asyncio.Transport | None = None
    #: Why this side cut the connection (timeout, evicted); None while it is open.
    closed_for: str | None = None


class BoundedHTTPServer:
    """Serves `handler` on `address` within `limits`; `on_drop(reason)` counts cut connections."""

    def __init__(self, address: str, handler: Handler, limits: HTTPLimits = HTTPLimits(),
                 on_drop: Callable[[str], None] = lambda reason: None):
        self.host, self._port = parse_address(address)
        self.handler = handler
        self.limits = limits
        self.on_drop = on_drop
        self._listener: socket.socket | None = None
        self._conns: set[_Connection] = set()
        self._tasks: set[asyncio.Task] = set()
        self._resume: asyncio.TimerHandle | None = None

    @property
    def port(self) -> int:
        """The bound port (the real one when the address asked for port 0)."""
        return self._listener.getsockname()[1] if self._listener is not None else self._port

    @property
    def connections(self) -> int:
        """Connections open now: never more than `limits.max_connections`."""
        return len(self._conns)

    async def start(self) -> None:
        self._listener = await asyncio.get_running_loop().run_in_executor(None, self._listen)
        asyncio.get_running_loop().add_reader(self._listener.fileno(), self._accept)

    def _listen(self) -> socket.socket:
        family, type_, proto, _, addr = socket.getaddrinfo(
            self.host, self._port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
        sock = socket.socket(family, type_, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                # `[::]` means every interface, IPv4 included (as in Go and most servers), so a dual-stack
                # pod whose primary IP is IPv4 passes its probes too.
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            sock.bind(addr)
            sock.listen(_BACKLOG)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        return sock

    async def stop(self) -> None:
        if self._listener is None:
            return
        loop = asyncio.get_running_loop()
        loop.remove_reader(self._listener.fileno())
        if self._resume is not None:
            self._resume.cancel()
        self._listener.close()
        self._listener = None
        for c in list(self._conns):
            self._cut(c, None)
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- connections ---------------------------------------------------------
    def _accept(self) -> None:
        """The listening socket is readable: take up to ACCEPT_BATCH connections, each within the cap."""
        assert self._listener is not None
        for _ in range(ACCEPT_BATCH):
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                if e.errno not in _EXHAUSTED:
                    continue  # e.g. ECONNABORTED: that client is gone already
                # Out of fds: pause rather than spin; the timeouts free fds meanwhile.
                log.warning("http endpoint cannot accept; pausing for 1 s", extra={"reason": str(e)})
                loop = asyncio.get_running_loop()
                loop.remove_reader(self._listener.fileno())
                self._resume = loop.call_later(1.0, self._resume_accepting)
                return
            self._admit(sock)

    def _resume_accepting(self) -> None:
        self._resume = None
        if self._listener is not None:
            asyncio.get_running_loop().add_reader(self._listener.fileno(), self._accept)

    def _admit(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        if len(self._conns) >= self.limits.max_connections:
            waiting = [c for c in self._conns if c.waiting_since is not None]
            if not waiting:
                sock.close()
                self.on_drop("full")
                return
            self._cut(min(waiting, key=lambda c: c.waiting_since or 0.0), "evicted")  # all waiting: never None
        conn = _Connection(sock, h11.Connection(h11.SERVER, max_incomplete_event_size=self.limits.max_header_bytes),
                           waiting_since=loop.time())
        self._conns.add(conn)
        conn.task = loop.create_task(self._serve(conn), name="http-connection")
        self._tasks.add(conn.task)
        conn.task.add_done_callback(lambda task: self._finished(conn, task))

    def _finished(self, conn: _Connection, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        self._conns.discard(conn)
        if conn.transport is None:
            conn.sock.close()  # cut before its transport was made (even before the task ran)

    def _cut(self, conn: _Connection, reason: str | None) -> None:
        """Close now (the fd goes on the next loop turn); `reason` is counted, None is a shutdown."""
        if conn.closed_for is None:
            conn.closed_for = reason or "stop"
            if reason:
                self.on_drop(reason)
                log.debug("http connection closed", extra={"reason": reason})
        if conn.transport is not None:
            conn.transport.abort()
        elif conn.task is not None:
            conn.task.cancel()  # still being set up: `_finished` closes the socket
        self._conns.discard(conn)

    async def _serve(self, conn: _Connection) -> None:
        writer: asyncio.StreamWriter | None = None
        try:
            reader, writer = await asyncio.open_connection(sock=conn.sock, limit=2 * self.limits.max_header_bytes)
            conn.transport = writer.transport  # type: ignore[assignment]  # a StreamWriter's transport is a Transport; typeshed says BaseTransport
            # drain() then waits until the kernel has every byte: no response piles up in our buffers
            writer.transport.set_write_buffer_limits(high=0)
            loop = asyncio.get_running_loop()
            while conn.closed_for is None and conn.waiting_since is not None:
                try:
                    async with asyncio.timeout_at(conn.waiting_since + self.limits.request_timeout_s):
                        request, refusal = await self._read_request(conn.parser, reader)
                except TimeoutError:
                    self._cut(conn, "timeout")
                    return
                except h11.RemoteProtocolError as e:
                    if conn.closed_for is None:  # not the EOF of a connection we cut ourselves
                        self.on_drop("bad_request")
                        if conn.parser.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                            await self._send(conn, writer, HTTPResponse(e.error_status_hint,
                                                                        f"bad request: {e}\n".encode()[:512]),
                                             head=False, close=True)
                    return
                if request is None:
                    return  # the client closed
                conn.waiting_since = None
                head = request.method == "HEAD"
                if refusal is not None:  # answered without reading the body; the connection cannot go on
                    await self._send(conn, writer, refusal, head=head, close=True)
                    return
                if not await self._send(conn, writer, self._answer(request), head=head, close=False):
                    return
                if conn.parser.our_state is not h11.DONE or conn.parser.their_state is not h11.DONE:
                    return  # Connection: close or HTTP/1.0
                conn.parser.start_next_cycle()
                conn.waiting_since = loop.time()
        except (OSError, h11.LocalProtocolError) as e:
            log.debug("http connection failed", extra={"reason": str(e)})
        finally:
            self._conns.discard(conn)
            if writer is not None:
                if conn.closed_for is None:
                    writer.close()
                else:
                    writer.transport.abort()  # cut (already aborted, or cut while being set up)

    async def _read_request(self, conn: h11.Connection, reader: asyncio.StreamReader
                            ) -> tuple[HTTPRequest | None, HTTPResponse | None]:
        """The next request (None at EOF) and, for a request we will not serve, its refusal."""
        limit = self.limits.max_header_bytes
        fed = 0  # h11 bounds only an incomplete request; a complete one read in one chunk is bounded here
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                if fed >= limit:
                    raise h11.RemoteProtocolError(f"request line and headers exceed {limit} bytes",
                                                  error_status_hint=431)
                data = await reader.read(min(_READ_CHUNK, limit - fed))
                fed += len(data)
                conn.receive_data(data)
                continue
            if isinstance(event, h11.Request):
                break
            return None, None  # ConnectionClosed (or PAUSED, which cannot happen at a cycle's start)
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in event.headers}
        method = event.method.decode("latin-1")
        path, _, query = event.target.decode("latin-1").partition("?")
        request = HTTPRequest(method, path, query, headers)
        if method not in ("GET", "HEAD"):
            return request, HTTPResponse(405, f"method {method[:32]} not allowed; use GET or HEAD\n".encode(),
                                         headers=(("Allow", "GET, HEAD"),))
        if "transfer-encoding" in headers or headers.get("content-length", "0") != "0":
            return request, HTTPResponse(413, b"request bodies are not accepted\n")
        end = conn.next_event()  # no body declared: h11 ends the message at once
        if not isinstance(end, h11.EndOfMessage):
            raise h11.RemoteProtocolError("request body where none was declared", error_status_hint=400)
        return request, None

    def _answer(self, request: HTTPRequest) -> HTTPResponse:
        try:
            return self.handler(request)
        except Exception:  # a handler bug must cost one request, never the connection loop
            log.exception("http handler failed", extra={"path": request.path})
            return HTTPResponse(500, b"internal error\n")

    async def _send(self, conn: _Connection, writer: asyncio.StreamWriter, response: HTTPResponse,
                    head: bool, close: bool) -> bool:
        headers = [("Content-Type", response.content_type), ("Content-Length", str(len(response.body))),
                   *response.headers]
        if close:
            headers.append(("Connection", "close"))
        c = conn.parser
        try:
            writer.write(c.send(h11.Response(status_code=response.status, headers=headers)))
            if not head and response.body:
                writer.write(c.send(h11.Data(data=response.body)))
            writer.write(c.send(h11.EndOfMessage()))
            async with asyncio.timeout(self.limits.write_timeout_s):
                await writer.drain()
        except TimeoutError:
            self._cut(conn, "timeout")
            return False
        except ConnectionError:
            return False
        return True


__all__ = ["BoundedHTTPServer", "HTTPLimits", "HTTPRequest", "HTTPResponse", "Handler", "parse_address"]
