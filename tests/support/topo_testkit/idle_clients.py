"""Many idle TCP clients, for tests and benchmarks of the HTTP endpoint's connection limits.

Why non-blocking: a server that stops accepting must not stall the client
side; its pending connections then show up in the counts instead.
"""

from __future__ import annotations

import select
import socket
import time


def connect_all(port: int, n: int, timeout: float = 30.0, host: str = "127.0.0.1") -> list[socket.socket]:
    """N non-blocking connections, each waited for up to `timeout` (those still pending stay pending)."""
    socks: list[socket.socket] = []
    pending: dict[int, socket.socket] = {}
    poller = select.poll()
    try:
        for _ in range(n):
            s = socket.socket()
            s.setblocking(False)
            socks.append(s)
            s.connect_ex((host, port))
            pending[s.fileno()] = s
            poller.register(s, select.POLLOUT)
        deadline = time.monotonic() + timeout
        while pending and time.monotonic() < deadline:
            for fd, _ in poller.poll(100):
                pending.pop(fd)
                poller.unregister(fd)
    except BaseException:
        for s in socks:
            s.close()
        raise
    return socks


def open_half_requests(port: int, n: int) -> list[socket.socket]:
    """N connections that send half a request, then nothing."""
    socks = connect_all(port, n)
    for s in socks:
        try:
            s.send(b"GET /metrics HTTP/1.1\r\nHost: idle-client\r\n")
        except OSError:
            pass  # not connected, or already cut by the server
    return socks


def closed_by_peer(s: socket.socket) -> bool:
    """Whether the server has closed (or reset) this non-blocking connection; never waits."""
    try:
        return s.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True
