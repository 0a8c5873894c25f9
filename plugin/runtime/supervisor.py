"""The supervisor: every serve/stop/register decision for the device-plugin servers.

Why one task owns them: inotify bursts, retries and topology changes only
"kick" it; it debounces, then compares what is served with what should be,
so none of them races another. Each resource is served, retried and
registered on its own: one that cannot be served (say a directory sits at its
socket path) backs off and retries without holding up the others, and a
resource never has more than one Register in flight, whatever the kubelet's
timing (kubernetes #121994).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os

from ..backoff import Backoff
from ..observability.metrics import Metrics
from ..serving.registration import KUBELET_SOCKET, RegistrationError, SocketIdentity, register, socket_identity
from ..serving.server import ResourceServer
from .options import DaemonOptions

#: The daemon's own logger: what operators filter on (`plugin.runtime.daemon`) does not change with the
#: module of the runtime that writes a line.
log = logging.getLogger("plugin.runtime.daemon")


class _Retry:
    """One resource's backoff: each resource fails and retries on its own (jittered: plugin.backoff)."""

    def __init__(self, initial_s: float, max_s: float):
        self.backoff = Backoff(initial_s, max_s)
        self.not_before = 0.0

    def failed(self, now: float) -> float:
        delay = self.backoff.next()
        self.not_before = now + delay
        return delay

    def succeeded(self) -> None:
        self.backoff.reset()
        self.not_before = 0.0

    def due(self, now: float) -> bool:
        return now >= self.not_before


class Supervisor:
    """Serves and registers the daemon's servers (`servers`: the daemon's own dict, which it changes)."""

    def __init__(self, servers: dict[str, ResourceServer], options: DaemonOptions, metrics: Metrics):
        self.servers = servers
        self.options = options
        self.metrics = metrics
        self._kick = asyncio.Event()
        self._retry_handle: asyncio.TimerHandle | None = None
        self._retries: dict[str, _Retry] = {}
        #: The Register call in flight per resource (at most one, never cancelled while we run).
        self._registering: dict[str, asyncio.Task] = {}
        self._kubelet_seen: tuple | None = None

    @property
    def kubelet_socket(self) -> str:
        return os.path.join(self.options.plugin_dir, KUBELET_SOCKET)

    def kick(self) -> None:
        self._kick.set()

    async def stop(self) -> None:
        """At shutdown only: end the Register calls in flight and the retry timer."""
        pending = list(self._registering.values())
        for t in pending:
            t.cancel()
        for t in pending:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        if self._retry_handle:
            self._retry_handle.cancel()

    async def run(self) -> None:
        """The supervisor task: one reconcile round per (debounced) kick, until cancelled."""
        while True:
            await self._kick.wait()
            await asyncio.sleep(self.options.debounce_s)
            self._kick.clear()
            try:
                await self._reconcile()
            except Exception:  # never let one bad round kill registration for good
                log.exception("reconcile failed; retrying")
                self._wake_in(self.options.retry_initial_s)

    def _retry(self, name: str) -> _Retry:
        r = self._retries.get(name)
        if r is None:
            r = self._retries[name] = _Retry(self.options.retry_initial_s, self.options.retry_max_s)
        return r

    async def _reconcile(self) -> None:
        loop = asyncio.get_running_loop()
        kubelet = socket_identity(self.kubelet_socket)
        if kubelet is not None and self._kubelet_seen is not None and kubelet != self._kubelet_seen:
            self.metrics.kubelet_restarts.inc()
        if kubelet is not None:
            self._kubelet_seen = kubelet
        now = loop.time()
        restart = [
            s for s in self.servers.values()
            # never restart under a Register in flight: its answer would belong to a stopped server
            if s.name not in self._registering and self._retry(s.name).due(now)
            and (not s.serving
                 or not s.socket_is_ours()
                 or (kubelet is not None and s.registered_with is not None and s.registered_with != kubelet))
        ]
        had_streams = False
        for s in restart:
            if s.serving:
                had_streams |= await s.stop()
        if had_streams:
            await asyncio.sleep(self.options.stream_end_grace_s)
        for s in restart:
            await self._start(s)
        if kubelet is None:
            log.info("waiting for the kubelet", extra={"socket": self.kubelet_socket})
        else:
            now = loop.time()
            for s in self.servers.values():
                if (s.serving and s.registered_with != kubelet and s.name not in self._registering
                        and self._retry(s.name).due(now)):
                    self._registering[s.name] = loop.create_task(self._register_one(s, kubelet),
                                                                 name=f"register {s.name}")
        self._plan_next_round(kubelet is None)

    async def _start(self, s: ResourceServer) -> None:
        """Serve one resource; a failure is logged and retried later for this resource alone."""
        try:
            await s.start()
        except Exception as e:  # noqa: BLE001 (OSError, or RuntimeError from gRPC's bind)
            delay = self._retry(s.name).failed(asyncio.get_running_loop().time())
            log.warning("cannot serve resource; will retry", extra={
                "resource": s.name, "socket": s.socket_path, "reason": f"{type(e).__name__}: {e}",
                "retry_in_s": round(delay, 2)})
        else:
            self._retry(s.name).succeeded()

    def _plan_next_round(self, waiting_for_kubelet: bool) -> None:
        """Wake the supervisor for the earliest per-resource retry (and the slow kubelet.sock poll)."""
        now = asyncio.get_running_loop().time()
        waits = [r.not_before - now for name, r in self._retries.items()
                 if name in self.servers and r.not_before > now]
        if waiting_for_kubelet:
            waits.append(self.options.kubelet_poll_s)
        if waits:
            self._wake_in(min(waits))

    async def _register_one(self, s: ResourceServer, kubelet: SocketIdentity) -> None:
        """One Register call, awaited to its end however long the kubelet takes (see `register`).

        Never cancelled while the daemon runs, not even when kubelet.sock is replaced: a call to a
        kubelet that died fails by itself (its connection closes), while a call that reached the
        new kubelet (the socket may change between our look and the connect) is completed by that
        kubelet whatever we do, so abandoning it and registering again would leave two
        registrations (kubernetes #121994).
        """
        try:
            await register(self.kubelet_socket, os.path.basename(s.socket_path), s.name,
                           slow_after=self.options.register_timeout_s)
        except Exception as e:  # noqa: BLE001 (RegistrationError: the kubelet's reason; anything else is ours, still retried)
            self.metrics.registration_failures.labels(s.name).inc()
            now_kubelet = socket_identity(self.kubelet_socket)
            if now_kubelet is not None and now_kubelet != kubelet:
                delay = 0.0  # the kubelet we called is gone and a new one listens: try that one at once
            else:
                delay = self._retry(s.name).failed(asyncio.get_running_loop().time())
            reason = str(e) if isinstance(e, RegistrationError) else f"{type(e).__name__}: {e}"
            log.warning("registration failed; will retry", extra={"resource": s.name, "reason": reason,
                                                                   "retry_in_s": round(delay, 2)})
        else:
            if self.servers.get(s.name) is s and s.serving:
                # The kubelet that answered is the one listening now: kubelet.sock may have been
                # replaced (a crashed kubelet's stale socket) between our look and the connect.
                s.registered_with = socket_identity(self.kubelet_socket) or kubelet
                self._retry(s.name).succeeded()
                self.metrics.registrations.labels(s.name).inc()
                log.info("registered with the kubelet", extra={"resource": s.name,
                                                               "endpoint": os.path.basename(s.socket_path)})
        finally:
            if self._registering.get(s.name) is asyncio.current_task():
                del self._registering[s.name]
            self.kick()

    def _wake_in(self, delay: float) -> None:
        if self._retry_handle:
            self._retry_handle.cancel()
        self._retry_handle = asyncio.get_running_loop().call_later(max(0.0, delay), self.kick)
