"""The daemon: one asyncio loop from discovery to registered servers.

Flow: the source's topology → `build_resources` → one `ResourceServer` per
resource → `Register` with the kubelet. A supervisor task owns every
serve/stop/register decision, so inotify bursts, retries and topology
changes never race each other: events only "kick" it, it debounces, then it
compares what is served with what should be.

Each resource is served, retried and registered on its own: one that cannot
be served (say a directory sits at its socket path) backs off and retries
without holding up the others, and a resource never has more than one
Register in flight, whatever the kubelet's timing (kubernetes #121994).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import stat
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from allocator import NodeTopology, Policy
from allocator.topology import Device

from .cdi.sync import SpecSync
from .errors import InputError, TopoDevicePluginError
from .filewatch import watch_file
from .metrics import Metrics
from .pairing_service import PairingService
from .pod_resources import DEFAULT_TIMEOUT_S as POD_RESOURCES_TIMEOUT_S
from .pod_resources import PodResourcesReader
from .preferred import DEFAULT_DEADLINE_S
from .ratelimited_log import RateLimitedLog, UndecodableRequestLog
from .socket_file import prune_stale_bind_dirs
from .signals import LoopSignals
from .registration import (
    KUBELET_SOCKET,
    PluginDirWatcher,
    RegistrationError,
    SocketIdentity,
    register,
    socket_identity,
)
from .resources import Resource, ResourceOptions, build_resources
from .search_pool import SearchPool
from .server import PolicyFactory, RequestHandling, ResourceServer
from .serving_modes import DraDevices, split
from .sources.base import TopologySource

if TYPE_CHECKING:
    from .health_endpoint import HealthServer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DaemonOptions:
    plugin_dir: str
    metrics_address: str | None = None
    #: Where our CDI specs go (`plugin.cdi.sync`); None: never write any.
    cdi_spec_dir: str | None = None
    #: Quiet time after a filesystem event before acting (one kubelet restart = one re-registration).
    debounce_s: float = 0.05
    #: After ending a stream a live kubelet still holds, wait this long before registering again,
    #: so the kubelet handles the disconnect first (kubernetes #121994).
    stream_end_grace_s: float = 1.0
    #: First retry delay after a resource failed to serve or to register (per resource; doubles up
    #: to `retry_max_s`).
    retry_initial_s: float = 0.2
    retry_max_s: float = 10.0
    #: Slow re-check while kubelet.sock is missing, in case an inotify event is lost.
    kubelet_poll_s: float = 5.0
    #: A Register unanswered this long is logged as slow. It is never abandoned: the kubelet
    #: completes it anyway, and a second one would leave two registrations and two streams
    #: (kubernetes #121994).
    register_timeout_s: float = 15.0
    #: The config file to watch; a valid change is applied live (see `reload_resources`).
    config_path: str | None = None
    #: Whole-request deadline of GetPreferredAllocation (why 1 s: `plugin.preferred`).
    preferred_deadline_s: float = DEFAULT_DEADLINE_S
    #: Threads for preferred-allocation searches (why threads, why two: `plugin.search_pool`).
    search_workers: int = 2
    #: The kubelet's pod-resources socket, to check pairing partners against (None: not read).
    pod_resources_socket: str | None = None
    #: Deadline of one pod-resources `List` (why short: `plugin.pod_resources`).
    pod_resources_timeout_s: float = POD_RESOURCES_TIMEOUT_S


class DraSide(Protocol):
    """The DRA driver as the daemon drives it (`plugin.dra.DraDriver`)."""

    async def start(self, topology: NodeTopology) -> None: ...

    def update(self, topology: NodeTopology) -> None: ...

    async def stop(self) -> None: ...

    def ready(self) -> tuple[bool, str]: ...


#: Makes the DRA driver for the devices `include` accepts (those of the DRA resources, see
#: `plugin.serving_modes`); raises `TopoDevicePluginError`s when it cannot (no API access...).
DraFactory = Callable[[Callable[[Device], bool]], Awaitable[DraSide]]


class _Retry:
    """One resource's backoff: each resource fails and retries on its own."""

    def __init__(self, initial_s: float, max_s: float):
        self.initial_s = initial_s
        self.max_s = max_s
        self.delay = 0.0
        self.not_before = 0.0

    def failed(self, now: float) -> float:
        self.delay = self.initial_s if self.delay == 0 else min(self.delay * 2, self.max_s)
        self.not_before = now + self.delay
        return self.delay

    def succeeded(self) -> None:
        self.delay = 0.0
        self.not_before = 0.0

    def due(self, now: float) -> bool:
        return now >= self.not_before


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
        clock: Callable[[], float] = time.monotonic,  # the pairing window's clock (tests drive it)
        dra_factory: DraFactory | None = None,
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
        self._retries: dict[str, _Retry] = {}
        #: The Register call in flight per resource (at most one, never cancelled while we run).
        self._registering: dict[str, asyncio.Task] = {}
        self._side_tasks: set[asyncio.Task] = set()
        self._reload_lock = asyncio.Lock()
        #: Builds and applies resources one at a time, in arrival order (a topology change, a reload).
        self._apply_lock = asyncio.Lock()
        self._kubelet_seen: tuple | None = None
        #: GPU–NIC pairing, shared by every server; its index follows the resources.
        self.pairing = PairingService(
            resource_options.pairing_window_s, clock,
            pod_resources=(PodResourcesReader(options.pod_resources_socket, options.pod_resources_timeout_s)
                           if options.pod_resources_socket else None))
        #: Shared by every server: one search pool, one rate-limited rejection log, the request deadline, pairing.
        self.handling = RequestHandling(SearchPool(options.search_workers),
                                        RateLimitedLog(logging.getLogger("plugin.server")),
                                        options.preferred_deadline_s, self.pairing)
        self.health_server: HealthServer | None = None
        #: The plugin directory's watcher, once started.
        self._watcher: PluginDirWatcher | None = None
        self.started = asyncio.Event()
        self.cdi = SpecSync(options.cdi_spec_dir)
        self.dra_factory = dra_factory
        #: The DRA driver, when some resource is served through DRA; it runs in this same loop.
        self.dra: DraSide | None = None
        self.dra_devices = DraDevices()

    @property
    def kubelet_socket(self) -> str:
        return os.path.join(self.options.plugin_dir, KUBELET_SOCKET)

    def ready(self) -> tuple[bool, str]:
        missing = [n for n, s in self.servers.items() if s.registered_with is None]
        if self.dra is not None:
            dra_ok, dra_why = self.dra.ready()
            if not dra_ok:
                return False, dra_why
            if not self.servers:
                return True, dra_why
        if not self.servers:
            # Nothing to register is a steady state (a node without matching devices), not a failure:
            # an unready pod would block the DaemonSet's rolling update.
            return True, "no devices to serve"
        if missing:
            return False, "not registered: " + ", ".join(sorted(missing))
        return True, "registered: " + ", ".join(sorted(self.servers))

    # -- life cycle -------------------------------------------------------
    async def run(self, stop: asyncio.Event | None = None, install_signals: bool = True) -> int:
        """Serve until `stop` is set or SIGTERM/SIGINT/SIGQUIT; SIGHUP reloads the config. Returns the exit code."""
        loop = asyncio.get_running_loop()
        stop = stop or asyncio.Event()
        # SIGQUIT is a shutdown request like SIGTERM (its default would dump core and leave sockets
        # behind); SIGHUP, whose default would kill us, reloads the config as a file change does.
        def shut_down(sig: signal.Signals):
            def handler() -> None:
                log.info("shutting down", extra={"signal": sig.name})
                stop.set()
            return handler

        handlers = {sig: shut_down(sig) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT)}
        handlers[signal.SIGHUP] = self._on_sighup
        signals = LoopSignals(loop, handlers) if install_signals else None
        try:
            with UndecodableRequestLog(self.handling.limited_log):
                return await self._serve(loop, stop)
        finally:
            if signals is not None:
                signals.close()

    async def _serve(self, loop: asyncio.AbstractEventLoop, stop: asyncio.Event) -> int:
        self.topology = await asyncio.to_thread(self.source.load)
        resources, dra_resources = split(build_resources(self.topology, self.resource_options),
                                         self.resource_options.dra_resources)
        self.pairing.rebuild(self.topology, {r.name: r.devices for r in resources})
        log.info("topology discovered", extra={"source": self.source.description,
                                               "devices": len(self.topology.devices),
                                               "resources": ", ".join(r.name for r in resources) or "none",
                                               "dra_resources": ", ".join(r.name for r in dra_resources) or "none"})
        try:  # every start-up failure stops what was started (`_stop_all`)
            await self._start_up(loop, resources, dra_resources)
            for r in resources:
                self.servers[r.name] = self._new_server(r)
                self._count_devices(r)
            self._tasks = [
                asyncio.create_task(self._supervise(), name="supervisor"),
                asyncio.create_task(self.source.watch(self.topology, self._publish), name="source-watch"),
                asyncio.create_task(self._heartbeat(), name="heartbeat"),
            ]
            if self.options.config_path and self.reload_resources:
                self._tasks.append(asyncio.create_task(
                    watch_file(self.options.config_path, self._reload_serialised), name="config-watch"))
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
            await self._stop_all()

    async def _start_up(self, loop: asyncio.AbstractEventLoop, resources: list[Resource],
                        dra_resources: list[Resource]) -> None:
        """CDI specs, the DRA driver, the plugin directory's watcher, the health endpoint: each is recorded
        as soon as it runs, so `_stop_all` stops exactly what a failure part-way left running."""
        await asyncio.to_thread(self.cdi.sync, resources)  # specs before any device is advertised
        if self.resource_options.dra_resources:
            await self._start_dra(dra_resources)
        os.makedirs(self.options.plugin_dir, mode=0o750, exist_ok=True)
        self._warn_if_world_writable()
        stale = prune_stale_bind_dirs(self.options.plugin_dir)
        if stale:
            log.info("removed bind directories left by a killed run", extra={"names": ", ".join(stale)})
        self._watcher = PluginDirWatcher(self.options.plugin_dir, loop, self._on_kubelet_socket,
                                         self._on_socket_removed)
        self._watcher.start()
        if self.options.metrics_address:
            # Imported here, at start-up and only when configured: the HTTP server and h11 cost memory
            # a daemon without the endpoint does not need (docs/deployment.md, "Memory").
            from .health_endpoint import HealthServer

            self.health_server = HealthServer(self.options.metrics_address, self.metrics, self.ready)
            await self.health_server.start()

    async def _stop_all(self) -> None:
        """Stop what was started, newest first: the device-plugin side, the DRA driver, then our CDI specs
        (after the servers: no Allocate names a removed spec). On a start-up failure some were never started.
        A step that fails is a warning and the next step still runs: the exit code says how serving ended,
        not whether a spec file could be removed (issue 19)."""
        steps: list[tuple[str, Callable[[], Awaitable[object]]]] = [
            ("device-plugin servers", lambda: self._shutdown(self._watcher))]
        if self.dra is not None:
            steps.append(("DRA driver", self.dra.stop))
        steps.append(("CDI specs", lambda: asyncio.to_thread(self.cdi.remove_all)))
        for what, step in steps:
            try:
                await step()
            except (OSError, TopoDevicePluginError) as e:
                log.warning("cleanup failed at shutdown", extra={"part": what, "reason": f"{type(e).__name__}: {e}"})
            except Exception:  # a bug: loud, but the remaining steps still run
                log.exception("cleanup failed at shutdown (a bug)", extra={"part": what})

    async def _start_dra(self, dra_resources: list[Resource]) -> None:
        if self.dra_factory is None:
            raise InputError(f"{', '.join(sorted(self.resource_options.dra_resources))}: DRA mode is only served "
                             "by `topo-device-plugin serve` (fix: remove draResources for this command)")
        assert self.topology is not None
        self.dra_devices.set(dra_resources)
        self.dra = await self.dra_factory(self.dra_devices.include)
        await self.dra.start(self.topology)

    def _new_server(self, r: Resource) -> ResourceServer:
        return ResourceServer(self.options.plugin_dir, r, self.policy_factory, self.metrics, self.handling)

    def _warn_if_world_writable(self) -> None:
        """Anyone who can write the directory can replace our sockets or plant a fake kubelet.sock."""
        path = self.options.plugin_dir
        mode = stat.S_IMODE(os.stat(path).st_mode)
        if mode & stat.S_IWOTH:
            log.warning("the device-plugin directory is world-writable: any local user can replace the plugin's "
                        "sockets or plant a fake kubelet.sock",
                        extra={"dir": path, "mode": f"{mode:04o}",
                               "fix": f"chmod o-w {path} (the kubelet creates it with mode 0750)"})

    def _on_sighup(self) -> None:
        if self.reload_resources is None:
            log.info("SIGHUP received; there is no configuration to reload")
            return
        log.info("SIGHUP received; reloading the configuration", extra={"config": self.options.config_path})
        task = asyncio.get_running_loop().create_task(self._reload_serialised(), name="sighup-reload")
        self._side_tasks.add(task)
        task.add_done_callback(self._side_tasks.discard)

    async def _reload_serialised(self) -> None:
        """A config-file change and a SIGHUP may arrive together: apply one reload at a time."""
        async with self._reload_lock:
            await self._reload_config()

    async def _shutdown(self, watcher: PluginDirWatcher | None) -> None:
        """Empty device list on open streams, stop serving, remove sockets."""
        if watcher is not None:
            watcher.stop()
        pending = [*self._tasks, *self._side_tasks, *self._registering.values()]
        for t in pending:
            t.cancel()
        for t in pending:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        if self._retry_handle:
            self._retry_handle.cancel()
        await asyncio.gather(*(s.stop(send_empty=True) for s in self.servers.values()))
        self.handling.search.close()
        await self.pairing.close()
        self.handling.limited_log.flush(force=True)
        if self.health_server:
            await self.health_server.stop()
        log.info("stopped")

    async def _heartbeat(self) -> None:
        while True:
            self.metrics.beat()
            self.handling.limited_log.flush()  # "suppressed N similar" once a window has ended
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
        async with self._apply_lock:  # in arrival order, never two at once (the build awaits a thread)
            try:
                built = await _build_off_loop(topology, self.resource_options, "topology change")
            except InputError as e:
                log.warning("new topology ignored", extra={"reason": str(e)})
                return
            except Exception:  # a bug, not bad input: say so loudly, keep serving the last good topology
                log.exception("new topology ignored: internal error (a bug)")
                return
            await self._install(topology, *built)

    async def _install(self, topology: NodeTopology, resources: list[Resource], dra_resources: list[Resource]) -> None:
        """Serve `resources` (built for `topology`) in place of what is served now."""
        self.topology = topology
        self.metrics.topology_updates.inc()
        if self.dra is not None:
            self.dra_devices.set(dra_resources)
            self.dra.update(topology)
        await asyncio.to_thread(self.cdi.sync, resources, False)
        wanted = {r.name: r for r in resources}
        # Before the servers see the new resources, so no request meets IDs the index lacks. In a thread:
        # the index grows with the devices (thousands of replicas), and the loop must keep answering.
        await asyncio.to_thread(self.pairing.rebuild, topology, {r.name: r.devices for r in resources})
        if self.pairing.window_s != self.resource_options.pairing_window_s:
            self.pairing.set_window(self.resource_options.pairing_window_s)
            log.info("pairing window changed", extra={"window_s": self.pairing.window_s})
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
                self.servers[name] = self._new_server(r)
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
        async with self._apply_lock:
            topology, built = self.topology, None
            if topology is not None:
                # Built once, in a thread (thousands of replicas take a while; /healthz and the RPCs are
                # answered meanwhile); options this node cannot serve (a MIG layout, a time-slicing
                # entry) are refused whole.
                try:
                    built = await _build_off_loop(topology, options, "config change")
                except InputError as e:
                    log.warning("config change ignored; keeping the running configuration",
                                extra={"config": self.options.config_path, "reason": str(e)})
                    return
                except Exception:
                    log.exception("config change ignored: internal error (a bug); keeping the running "
                                  "configuration", extra={"config": self.options.config_path})
                    return
            log.info("config changed", extra={"config": self.options.config_path})
            self.resource_options = options
            if topology is not None and built is not None:
                await self._install(topology, *built)

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
        except Exception as e:  # OSError, or RuntimeError from gRPC's bind
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
        except Exception as e:  # RegistrationError: the kubelet's reason; anything else is ours, still retried
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


def _build(topology: NodeTopology, options: ResourceOptions) -> tuple[list[Resource], list[Resource]]:
    """(device-plugin resources, DRA resources) for `topology`; run in a thread, it touches no daemon state."""
    return split(build_resources(topology, options), options.dra_resources)


async def _build_off_loop(topology: NodeTopology, options: ResourceOptions,
                          cause: str) -> tuple[list[Resource], list[Resource]]:
    """`_build` in a worker thread: thousands of replicas take a while, and the loop keeps answering meanwhile."""
    log.debug("building resources", extra={"cause": cause})
    built = await asyncio.to_thread(_build, topology, options)
    log.debug("resources built", extra={"cause": cause, "devices": sum(len(r.devices) for r in built[0])})
    return built


def run_daemon(make: Callable[[], Daemon]) -> int:
    """Run a daemon in a fresh event loop (the CLI entry point)."""

    async def main() -> int:
        return await make().run()

    return asyncio.run(main())
