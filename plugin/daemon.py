"""The daemon: one asyncio loop from discovery to registered servers.

Flow: the source's topology → `build_resources` → one `ResourceServer` per
resource → `Register` with the kubelet. A supervisor task owns every
serve/stop/register decision, so inotify bursts, retries and topology
changes never race each other: events only "kick" it, it debounces, then it
compares what is served with what should be.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass

from allocator import NodeTopology, Policy

from .errors import InputError
from .filewatch import watch_file
from .metrics import HealthServer, Metrics
from .registration import KUBELET_SOCKET, PluginDirWatcher, RegistrationError, register, socket_identity
from .resources import Resource, ResourceOptions, build_resources
from .server import PolicyFactory, ResourceServer
from .sources.base import TopologySource

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DaemonOptions:
    plugin_dir: str
    metrics_address: str | None = None
    #: Quiet time after a filesystem event before acting (one kubelet restart = one re-registration).
    debounce_s: float = 0.05
    #: After ending a stream a live kubelet still holds, wait this long before registering again,
    #: so the kubelet handles the disconnect first (kubernetes #121994).
    stream_end_grace_s: float = 1.0
    #: First retry delay after a failed Register (doubles up to `retry_max_s`).
    retry_initial_s: float = 0.2
    retry_max_s: float = 10.0
    #: Slow re-check while kubelet.sock is missing, in case an inotify event is lost.
    kubelet_poll_s: float = 5.0
    register_timeout_s: float = 15.0
    #: The config file to watch; a valid change is applied live (see `reload_resources`).
    config_path: str | None = None


def default_policy_factory(name: str, options: dict) -> Policy:
    from allocator.policies import get_policy

    return get_policy(name, **options)


class Daemon:
    def __init__(
        self,
        source: TopologySource,
        options: DaemonOptions,
        resource_options: ResourceOptions,
        policy_factory: PolicyFactory = default_policy_factory,
        metrics: Metrics | None = None,
        reload_resources: Callable[[], ResourceOptions] | None = None,
    ):
        self.source = source
        self.options = options
        self.resource_options = resource_options
        self.policy_factory = policy_factory
        self.reload_resources = reload_resources
        self.metrics = metrics or Metrics()
        self.servers: dict[str, ResourceServer] = {}
        self.topology: NodeTopology | None = None
        self._kick = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self._retry_handle: asyncio.TimerHandle | None = None
        self._backoff = options.retry_initial_s
        self._kubelet_seen: tuple | None = None
        self.health_server: HealthServer | None = None
        self.started = asyncio.Event()

    @property
    def kubelet_socket(self) -> str:
        return os.path.join(self.options.plugin_dir, KUBELET_SOCKET)

    def ready(self) -> tuple[bool, str]:
        missing = [n for n, s in self.servers.items() if s.registered_with is None]
        if not self.servers:
            # Nothing to register is a steady state (a node without matching devices), not a failure:
            # an unready pod would block the DaemonSet's rolling update.
            return True, "no devices to serve"
        if missing:
            return False, "not registered: " + ", ".join(sorted(missing))
        return True, "registered: " + ", ".join(sorted(self.servers))

    # -- life cycle -------------------------------------------------------
    async def run(self, stop: asyncio.Event | None = None, install_signals: bool = True) -> int:
        """Serve until `stop` is set or SIGTERM/SIGINT; returns the exit code."""
        loop = asyncio.get_running_loop()
        stop = stop or asyncio.Event()
        if install_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, stop.set)
        self.topology = await asyncio.to_thread(self.source.load)
        resources = build_resources(self.topology, self.resource_options)
        log.info("topology discovered", extra={"source": self.source.description,
                                               "devices": len(self.topology.devices),
                                               "resources": ", ".join(r.name for r in resources) or "none"})
        os.makedirs(self.options.plugin_dir, mode=0o750, exist_ok=True)
        watcher = PluginDirWatcher(self.options.plugin_dir, loop, self._on_kubelet_socket, self._on_socket_removed)
        watcher.start()
        if self.options.metrics_address:
            self.health_server = HealthServer(self.options.metrics_address, self.metrics, self.ready)
            self.health_server.start()
        try:
            for r in resources:
                self.servers[r.name] = ResourceServer(self.options.plugin_dir, r, self.policy_factory, self.metrics)
                self._count_devices(r)
            self._tasks = [
                asyncio.create_task(self._supervise(), name="supervisor"),
                asyncio.create_task(self.source.watch(self.topology, self._publish), name="source-watch"),
                asyncio.create_task(self._heartbeat(), name="heartbeat"),
            ]
            if self.options.config_path and self.reload_resources:
                self._tasks.append(asyncio.create_task(
                    watch_file(self.options.config_path, self._reload_config), name="config-watch"))
            self.kick()
            self.started.set()
            stopper = asyncio.create_task(stop.wait())
            done, _ = await asyncio.wait([stopper, *self._tasks], return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                if t is not stopper and t.exception() is not None:
                    log.error("internal task failed", exc_info=t.exception())
                    return 1
            return 0
        finally:
            await self._shutdown(watcher)
            if install_signals:
                for sig in (signal.SIGTERM, signal.SIGINT):
                    loop.remove_signal_handler(sig)

    async def _shutdown(self, watcher: PluginDirWatcher) -> None:
        """Empty device list on open streams, stop serving, remove sockets."""
        watcher.stop()
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        if self._retry_handle:
            self._retry_handle.cancel()
        await asyncio.gather(*(s.stop(send_empty=True) for s in self.servers.values()))
        if self.health_server:
            self.health_server.stop()
        log.info("stopped")

    async def _heartbeat(self) -> None:
        while True:
            self.metrics.beat()
            await asyncio.sleep(1.0)

    # -- events -------------------------------------------------------------
    def kick(self) -> None:
        self._kick.set()

    def _on_kubelet_socket(self) -> None:
        self.kick()

    def _on_socket_removed(self, path: str) -> None:
        if any(s.socket_path == path for s in self.servers.values()) or os.path.basename(path) == KUBELET_SOCKET:
            self.kick()

    def _publish(self, topology: NodeTopology) -> None:
        """Called by the source on the loop with each new topology."""
        asyncio.get_running_loop().create_task(self._apply_topology(topology))

    async def _apply_topology(self, topology: NodeTopology) -> None:
        try:
            resources = build_resources(topology, self.resource_options)
        except InputError as e:
            log.warning("new topology ignored", extra={"reason": str(e)})
            return
        except Exception:  # a bug, not bad input: say so loudly, keep serving the last good topology
            log.exception("new topology ignored: internal error (a bug)")
            return
        self.topology = topology
        self.metrics.topology_updates.inc()
        wanted = {r.name: r for r in resources}
        for name, server in list(self.servers.items()):
            if name not in wanted:
                del self.servers[name]
                await server.stop(send_empty=True)
                self.metrics.set_devices(name, 0, 0)
                log.info("resource removed", extra={"resource": name})
        for name, r in wanted.items():
            self._count_devices(r)
            if name in self.servers:
                await self.servers[name].update(r)
            else:
                self.servers[name] = ResourceServer(self.options.plugin_dir, r, self.policy_factory, self.metrics)
                log.info("resource added", extra={"resource": name})
                self.kick()

    async def _reload_config(self) -> None:
        """Apply a changed config file: pools and policies change live; streams of unchanged resources stay."""
        try:
            options = await asyncio.to_thread(self.reload_resources)
        except InputError as e:  # ConfigError, NicPoolError, OptionError: name the file, field and fix
            log.warning("config change ignored; keeping the running configuration",
                        extra={"config": self.options.config_path, "reason": str(e)})
            return
        except Exception:  # a bug (or RecursionError/MemoryError past the reader): loud, and keep running
            log.exception("config change ignored: internal error (a bug); keeping the running configuration",
                          extra={"config": self.options.config_path})
            return
        log.info("config changed", extra={"config": self.options.config_path})
        self.resource_options = options
        if self.topology is not None:
            await self._apply_topology(self.topology)

    def _count_devices(self, r: Resource) -> None:
        healthy = sum(1 for d in r.devices if d.device.healthy)
        self.metrics.set_devices(r.name, healthy, len(r.devices) - healthy)

    # -- the supervisor -------------------------------------------------------
    async def _supervise(self) -> None:
        while True:
            await self._kick.wait()
            await asyncio.sleep(self.options.debounce_s)
            self._kick.clear()
            try:
                await self._reconcile()
            except Exception:  # never let one bad round kill registration for good
                log.exception("reconcile failed; retrying")
                self._schedule_retry()

    async def _reconcile(self) -> None:
        kubelet = socket_identity(self.kubelet_socket)
        if kubelet is not None and self._kubelet_seen is not None and kubelet != self._kubelet_seen:
            self.metrics.kubelet_restarts.inc()
        if kubelet is not None:
            self._kubelet_seen = kubelet
        restart = [
            s for s in self.servers.values()
            if not s.serving
            or not s.socket_is_ours()
            or (kubelet is not None and s.registered_with is not None and s.registered_with != kubelet)
        ]
        had_streams = False
        for s in restart:
            if s.serving:
                had_streams |= await s.stop()
        if had_streams:
            await asyncio.sleep(self.options.stream_end_grace_s)
        for s in restart:
            await s.start()
        if kubelet is None:
            log.info("waiting for the kubelet", extra={"socket": self.kubelet_socket})
            self._schedule_retry(self.options.kubelet_poll_s)
            return
        pending = [s for s in self.servers.values() if s.serving and s.registered_with != kubelet]
        results = await self._register_all(pending, kubelet)
        if results is None:
            return  # the kubelet restarted meanwhile; the next round registers with the new one
        if not all(results):
            self._schedule_retry()
        else:
            self._backoff = self.options.retry_initial_s

    async def _register_all(self, servers: list[ResourceServer], kubelet: tuple) -> list[bool] | None:
        """Register every server concurrently; give up (None) as soon as kubelet.sock is replaced.

        Why: the kubelet dials us back inside Register with a 10 s timeout, so a
        call caught by a kubelet restart can hang; the new kubelet must not wait for it.
        """
        tasks = [asyncio.create_task(self._register_one(s, kubelet)) for s in servers]
        if not tasks:
            return []
        watch_kicks = True
        try:
            while True:
                kick = asyncio.create_task(self._kick.wait()) if watch_kicks else None
                waiting = [t for t in tasks if not t.done()]
                if not waiting:
                    return [t.result() for t in tasks]
                await asyncio.wait(waiting + ([kick] if kick else []), return_when=asyncio.FIRST_COMPLETED)
                if kick is not None:
                    if not kick.done():
                        kick.cancel()
                    elif socket_identity(self.kubelet_socket) != kubelet:
                        return None
                    else:
                        watch_kicks = False  # an unrelated event; the next round handles it
        finally:
            for t in tasks:
                t.cancel()

    async def _register_one(self, s: ResourceServer, kubelet: tuple) -> bool:
        try:
            await register(self.kubelet_socket, os.path.basename(s.socket_path), s.name,
                           timeout=self.options.register_timeout_s)
        except RegistrationError as e:
            self.metrics.registration_failures.labels(s.name).inc()
            log.warning("registration failed", extra={"resource": s.name, "reason": str(e)})
            return False
        s.registered_with = kubelet
        self.metrics.registrations.labels(s.name).inc()
        log.info("registered with the kubelet", extra={"resource": s.name,
                                                       "endpoint": os.path.basename(s.socket_path)})
        return True

    def _schedule_retry(self, delay: float | None = None) -> None:
        if delay is None:
            delay = self._backoff
            self._backoff = min(self._backoff * 2, self.options.retry_max_s)
        if self._retry_handle:
            self._retry_handle.cancel()
        self._retry_handle = asyncio.get_running_loop().call_later(delay, self.kick)


def run_daemon(make: Callable[[], Daemon]) -> int:
    """Run a daemon in a fresh event loop (the CLI entry point)."""

    async def main() -> int:
        return await make().run()

    return asyncio.run(main())
