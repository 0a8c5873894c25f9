"""The `HOST:PORT` of the metrics endpoint, parsed.

Why a module of its own: the CLI checks the flag on every `serve`, and the HTTP
server (plugin/observability/http_server.py, with h11) is only imported when the endpoint is
configured; parsing the flag must not pull the server in.
"""

from __future__ import annotations


def parse_address(address: str) -> tuple[str, int]:
    """`HOST:PORT`, `[V6]:PORT` or `:PORT` (all IPv4 interfaces) -> (host, port)."""
    host, sep, port_text = address.rpartition(":")
    host = host.strip()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        port = int(port_text)
    except ValueError:
        port = -1
    if not sep or not 0 <= port <= 65535 or ("[" in host or "]" in host):
        raise ValueError(f"metrics address {address!r} is not HOST:PORT (for example 0.0.0.0:9400 or [::]:9400)")
    return host or "0.0.0.0", port
