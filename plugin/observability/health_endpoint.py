"""The daemon's HTTP endpoint: Prometheus `/metrics`, `/healthz` (liveness) and `/readyz` (readiness).

Why these meanings: the kubelet restarts the pod when liveness fails, so
`/healthz` says only "the event loop turns": it is answered on the loop itself
(a stalled loop answers nothing and the probe times out) and it also fails
when the loop's heartbeat is older than `stale_after` (the heartbeat task
died, or the loop has just come back from a long stall). `/readyz` says "every
resource is registered with the kubelet" and, with DRA on, "the DRA driver is
registered and its ResourceSlices are published" (not while publishing keeps
failing: the scheduler would see stale or no devices), which is what a
rolling update should wait for; a 503 answer's body says why. Any other path is 404: a typo in a scrape config should show,
not quietly return metrics.

The server under it (plugin/observability/http_server.py) bounds connections, time and
request size, so a port scan or a slowloris cannot take the daemon down.
"""

from __future__ import annotations

import gzip
import logging
import time
from collections.abc import Callable

from prometheus_client.exposition import choose_encoder, gzip_accepted

from .http_server import BoundedHTTPServer, HTTPLimits, HTTPRequest, HTTPResponse
from .metrics import Metrics

log = logging.getLogger(__name__)

_PATHS = ("/metrics", "/healthz", "/readyz")


class HealthServer:
    """Serves /metrics, /healthz and /readyz on HOST:PORT, on the running asyncio loop."""

    def __init__(self, address: str, metrics: Metrics, ready: Callable[[], tuple[bool, str]],
                 stale_after: float = 15.0, limits: HTTPLimits = HTTPLimits()):
        self.metrics = metrics
        self.ready = ready
        self.stale_after = stale_after
        self._http = BoundedHTTPServer(address, self._route, limits, on_drop=metrics.http_dropped)

    @property
    def port(self) -> int:
        return self._http.port

    @property
    def connections(self) -> int:
        """Connections open now (never more than the limit)."""
        return self._http.connections

    async def start(self) -> None:
        await self._http.start()
        log.info("metrics and health endpoints listening", extra={"address": self._http.host, "port": self.port})

    async def stop(self) -> None:
        await self._http.stop()

    def _route(self, request: HTTPRequest) -> HTTPResponse:
        if request.path == "/healthz":
            age = time.monotonic() - self.metrics.heartbeat
            if age < self.stale_after:
                return HTTPResponse(200, b"ok\n")
            return HTTPResponse(503, f"event loop stalled for {age:.1f}s\n".encode())
        if request.path == "/readyz":
            ok, why = self.ready()
            return HTTPResponse(200 if ok else 503, (why + "\n").encode())
        if request.path == "/metrics":
            return self._metrics(request)
        return HTTPResponse(404, f"not found; this endpoint serves {', '.join(_PATHS)}\n".encode())

    def _metrics(self, request: HTTPRequest) -> HTTPResponse:
        # The text and OpenMetrics formats as prometheus-client negotiates them from Accept.
        encoder, content_type = choose_encoder(request.headers.get("accept", ""))
        body = encoder(self.metrics.registry)
        headers: tuple[tuple[str, str], ...] = (("Vary", "Accept, Accept-Encoding"),)
        if gzip_accepted(request.headers.get("accept-encoding", "")):
            body = gzip.compress(body, compresslevel=6)
            headers += (("Content-Encoding", "gzip"),)
        return HTTPResponse(200, body, content_type, headers)
