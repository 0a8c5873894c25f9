"""The daemon: one asyncio loop from discovery to registered servers.

Flow: the source's topology → `build_resources` → one `ResourceServer` per
resource → `Register` with the kubelet (and the DRA driver for the resources
served through DRA). The daemon composes; each concern is a module of
`plugin.runtime`:
- `options.py`: what the daemon is told (`DaemonOptions`, the DRA side);
- `supervisor.py`: every serve/stop/register decision, per resource, with
  retries (one task; events only "kick" it);
- `changes.py`: the one writer of live changes: topology updates and config
  reloads are applied in arrival order by one task, bursts coalesced;
- here: start-up, what applying a change means (build off the loop, install),
  and shutdown in reverse order.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import signal
import stat
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from allocator import NodeTopology, Policy
from allocator.policies import SubsetTableCache, get_policy

from ..allocation.pairing_service import PairingService
from ..allocation.pod_resources import PodResourcesReader
from ..allocation.search_pool import SearchPool
from ..errors import InputError, TopoDevicePluginError
from ..health.policy import action_of_reason
from ..heap import release_free_heap
from ..cdi_files.sync import SpecSync
from ..model.resources import Resource, ResourceOptions, build_resources
from ..model.serving_modes import DraDevices, split
from ..mps.control import MpsControl
from ..mps.specs import device_plugin_specs, gated, mps_builder
from ..mps.supervisor import MpsSupervisor
from ..observability.metrics import Metrics
from ..observability.ratelimited_log import RateLimitedLog, UndecodableRequestLog
from ..serving.registration import KUBELET_SOCKET, PluginDirWatcher
from ..serving.server import PolicyFactory, RequestHandling, ResourceServer
from ..serving.plugin_dir import PluginDirClaim, claim_plugin_dir
from ..serving.socket_file import prune_stale_bind_dirs
from ..sources.base import TopologySource
from ..watch.filewatch import watch_file
from .changes import Change, ConfigReload, LiveChanges, TopologyUpdate
from .options import DaemonOptions, DraFactory, DraSide, NrtFactory, NrtHook
from .signals import LoopSignals
from .supervisor import Supervisor

__all__ = ["Daemon", "DaemonOptions", "DraFactory", "DraSide", "default_policy_factory", "run_daemon"]

if TYPE_CHECKING:
    from ..observability.health_endpoint import HealthServer

log = logging.getLogger(__name__)


def default_policy_factory(name: str, options: dict, tables: SubsetTableCache | None = None) -> Policy:
    return get_policy(name, tables=tables, **options)


class Daemon:
    def __init__(
        self,
        source: TopologySource,
        options: DaemonOptions,
        resource_options: ResourceOptions,
        policy_factory: PolicyFactory | None = None,
        metrics: Metrics | None = None,
        reload_resources: Callable[[], ResourceOptions] | None = None,
        clock: Callable[[], float] = time.monotonic,  # the pairing window's clock (tests drive it)
        dra_factory: DraFactory | None = None,
        nrt_factory: NrtFactory | None = None,
    ):
        self.source = source
        self.options = options
        self.resource_options = resource_options
        #: The subset tables of this daemon's resources (allocator.policies.subsets): filled when the
        #: resources are built, read by their policies, reused across rebuilds of the same topology.
        self.subset_tables = SubsetTableCache()
        self.policy_factory: PolicyFactory = policy_factory or functools.partial(
            default_policy_factory, tables=self.subset_tables)
        self.reload_resources = reload_resources
        self.metrics = metrics or Metrics()
        self.metrics.xid_source = getattr(source, "xid_counts", None)
        self.servers: dict[str, ResourceServer] = {}
        self.topology: NodeTopology | None = None
        self._tasks: list[asyncio.Task] = []
        #: Serves and registers `servers`; the daemon only changes the dict and kicks it.
        self.supervisor = Supervisor(self.servers, options, self.metrics)
        #: The one writer of live changes (topology updates, config reloads), in arrival order.
        self.changes = LiveChanges(self._apply_change)
        #: GPU–NIC pairing, shared by every server; its index follows the resources.
        self.pairing = PairingService(
            resource_options.pairing_window_s, clock,
            pod_resources=(PodResourcesReader(options.pod_resources_socket, options.pod_resources_timeout_s)
                           if options.pod_resources_socket else None),
            nccl_env=resource_options.nccl_env)
        #: Shared by every server: one search pool, one rate-limited rejection log, the request deadline, pairing.
        self.handling = RequestHandling(SearchPool(options.search_workers),
                                        RateLimitedLog(logging.getLogger("plugin.serving.server")),
                                        options.preferred_deadline_s, self.pairing)
        self.health_server: HealthServer | None = None
        #: The plugin directory's watcher, once started.
        self._watcher: PluginDirWatcher | None = None
        self._dir_claim: PluginDirClaim | None = None
        self.started = asyncio.Event()
        self.cdi = SpecSync(options.cdi_spec_dir)
        self.dra_factory = dra_factory
        #: The DRA driver, when some resource is served through DRA; it runs in this same loop.
        self.dra: DraSide | None = None
        self.dra_devices = DraDevices()
        #: The control daemons of the `sharing.mps` resources (None: no MPS), and those resources as built,
        #: before their replicas are gated on their daemon's health (`plugin.mps.specs.gated`).
        self.mps: MpsSupervisor | None = None
        self._mps_resources: dict[str, Resource] = {}
        #: The NodeResourceTopology publisher (`--nrt`, plugin/nrt/), when configured; fed every resource build.
        self.nrt_factory = nrt_factory
        self.nrt: NrtHook | None = None

    @property
    def kubelet_socket(self) -> str:
        return self.supervisor.kubelet_socket

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
        self._count_gpu_actions(self.topology)
        await asyncio.to_thread(release_free_heap, "discovery")
        resources, dra_resources = split(build_resources(self.topology, self.resource_options, self.subset_tables),
                                         self.resource_options.dra_resources)
        self.pairing.rebuild(self.topology, {r.name: r.devices for r in resources})
        log.info("topology discovered", extra={"source": self.source.description,
                                               "devices": len(self.topology.devices),
                                               "resources": ", ".join(r.name for r in resources) or "none",
                                               "dra_resources": ", ".join(r.name for r in dra_resources) or "none"})
        try:  # every start-up failure stops what was started (`_stop_all`)
            await self._start_up(loop, resources, dra_resources)
            self._start_mps(resources)
            for r in resources:
                self.servers[r.name] = self._new_server(self._gated(r))
                self._count_devices(r)
            self._tasks = [
                asyncio.create_task(self.supervisor.run(), name="supervisor"),
                asyncio.create_task(self.changes.run(), name="live-changes"),
                asyncio.create_task(self.source.watch(self.topology, self._publish), name="source-watch"),
                asyncio.create_task(self._heartbeat(), name="heartbeat"),
            ]
            if self.mps is not None:
                self._tasks.append(asyncio.create_task(self.mps.run(), name="mps-daemons"))
            if self.options.config_path and self.reload_resources:
                self._tasks.append(asyncio.create_task(
                    watch_file(self.options.config_path, self._on_config_file), name="config-watch"))
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
        if self.nrt_factory is not None:  # optional part: the NodeResourceTopology publisher
            assert self.topology is not None
            self.nrt = self.nrt_factory()
            await self.nrt.start(self.topology, resources)
        self._dir_claim = claim_plugin_dir(self.options.plugin_dir)
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
            from ..observability.health_endpoint import HealthServer  # noqa: PLC0415 (see above)

            self.health_server = HealthServer(self.options.metrics_address, self.metrics, self.ready)
            await self.health_server.start()

    async def _stop_all(self) -> None:
        """Stop what was started, newest first: the device-plugin side, the DRA driver, then our CDI specs
        (after the servers: no Allocate names a removed spec). On a start-up failure some were never started.
        A step that fails is a warning and the next step still runs: the exit code says how serving ended,
        not whether a spec file could be removed (issue 19)."""
        steps: list[tuple[str, Callable[[], Awaitable[object]]]] = [
            ("device-plugin servers", lambda: self._shutdown(self._watcher))]
        if self.mps is not None:
            steps.append(("MPS control daemons", self.mps.stop))
        if self.dra is not None:
            steps.append(("DRA driver", self.dra.stop))
        if self.nrt is not None:
            steps.append(("NodeResourceTopology", self.nrt.stop))
        steps.append(("CDI specs", lambda: asyncio.to_thread(self.cdi.remove_all)))
        for what, step in steps:
            try:
                await step()
            except (OSError, TopoDevicePluginError) as e:
                log.warning("cleanup failed at shutdown", extra={"part": what, "reason": f"{type(e).__name__}: {e}"})
            except Exception:  # a bug: loud, but the remaining steps still run
                log.exception("cleanup failed at shutdown (a bug)", extra={"part": what})
        if self._dir_claim is not None:  # last: our sockets are gone, another daemon may take the directory
            self._dir_claim.release()
            self._dir_claim = None

    async def _start_dra(self, dra_resources: list[Resource]) -> None:
        if self.dra_factory is None:
            raise InputError(f"{', '.join(sorted(self.resource_options.dra_resources))}: DRA mode is only served "
                             "by `topo-device-plugin serve` (fix: remove draResources for this command)")
        assert self.topology is not None
        self.dra_devices.set(dra_resources)
        self.dra = await self.dra_factory(self.dra_devices.include)
        await self.dra.start(self.topology)

    def _start_mps(self, resources: list[Resource]) -> None:
        """A supervisor for the control daemons of the `sharing.mps` resources (started with the other tasks).

        The daemons follow the resources of start-up: a topology change or reload that changes which GPUs
        are shared keeps them as they are until a restart (logged there)."""
        specs = device_plugin_specs(resources)
        if not specs:
            return
        self._mps_resources = {r.name: r for r in resources if mps_builder(r) is not None}
        self.mps = MpsSupervisor(MpsControl(self.options.mps_control_binary), specs, self._on_mps_change,
                                 self.options.mps_probe_interval_s)

    def _gated(self, r: Resource) -> Resource:
        """`r` as advertised: an MPS resource's replicas are Unhealthy while its control daemon is not ready
        (always, for one that has no daemon: added by a reload, it waits for a restart)."""
        if mps_builder(r) is None:
            return r
        return gated(r, self.mps is not None and self.mps.ready(r.name))

    def _on_mps_change(self, name: str, ready: bool) -> None:
        """A control daemon turned ready or went away: its resource's replicas follow (a new device list)."""
        server, r = self.servers.get(name), self._mps_resources.get(name)
        if server is not None and r is not None:
            asyncio.get_running_loop().create_task(server.update(gated(r, ready)), name=f"mps-health:{name}")

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
        self.changes.submit(ConfigReload("SIGHUP"))

    async def _on_config_file(self) -> None:
        self.changes.submit(ConfigReload("config file"))

    async def _shutdown(self, watcher: PluginDirWatcher | None) -> None:
        """Empty device list on open streams, stop serving, remove sockets."""
        if watcher is not None:
            watcher.stop()
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        await self.supervisor.stop()
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
        self.supervisor.kick()

    def _on_kubelet_socket(self) -> None:
        self.kick()

    def _on_socket_removed(self, path: str) -> None:
        if any(s.socket_path == path for s in self.servers.values()) or os.path.basename(path) == KUBELET_SOCKET:
            self.kick()

    def _publish(self, topology: NodeTopology) -> None:
        """Called by the source on the loop with each new topology: queued for the one writer."""
        self.changes.submit(TopologyUpdate(topology))

    async def _apply_change(self, change: Change) -> None:
        """The writer's step (`LiveChanges`): one change at a time, never two at once."""
        if isinstance(change, TopologyUpdate):
            await self._apply_topology(change.topology)
        else:
            await self._reload_config()

    async def _apply_topology(self, topology: NodeTopology) -> None:
        try:
            built = await _build_off_loop(topology, self.resource_options, self.subset_tables, "topology change")
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
        self._count_gpu_actions(topology)
        if self.dra is not None:
            self.dra_devices.set(dra_resources)
            self.dra.update(topology)
        if self.nrt is not None:
            self.nrt.update(topology, resources)
        await asyncio.to_thread(self.cdi.sync, resources, False)
        wanted = {r.name: r for r in resources}
        # Before the servers see the new resources, so no request meets IDs the index lacks. In a thread:
        # the index grows with the devices (thousands of replicas), and the loop must keep answering.
        await asyncio.to_thread(self.pairing.rebuild, topology, {r.name: r.devices for r in resources})
        if self.pairing.window_s != self.resource_options.pairing_window_s:
            self.pairing.set_window(self.resource_options.pairing_window_s)
            log.info("pairing window changed", extra={"window_s": self.pairing.window_s})
        if self.pairing.nccl_env != self.resource_options.nccl_env:
            self.pairing.nccl_env = self.resource_options.nccl_env
            log.info("NCCL hints changed", extra={"nccl_env": self.pairing.nccl_env})
        for name, server in list(self.servers.items()):
            if name not in wanted:
                del self.servers[name]
                await server.stop(send_empty=True)
                self.metrics.set_devices(name, 0, 0)
                log.info("resource removed", extra={"resource": name})
        for name, r in wanted.items():
            self._count_devices(r)
            if mps_builder(r) is not None:
                if self.mps is None or name not in self.mps.specs:
                    log.warning("MPS resource has no control daemon until a restart", extra={"resource": name})
                self._mps_resources[name] = r
            r = self._gated(r)
            if name in self.servers:
                await self.servers[name].update(r)
            else:
                self.servers[name] = self._new_server(r)
                log.info("resource added", extra={"resource": name})
                self.kick()

    async def _reload_config(self) -> None:
        """Apply a changed config file: pools and policies change live; streams of unchanged resources stay."""
        reload = self.reload_resources
        if reload is None:  # callers check first (SIGHUP, the config file watcher): nothing to reload
            return
        try:
            options = await asyncio.to_thread(reload)
        except InputError as e:  # ConfigError, NicPoolError, OptionError: name the file, field and fix
            log.warning("config change ignored; keeping the running configuration",
                        extra={"config": self.options.config_path, "reason": str(e)})
            return
        except Exception:  # a bug (or RecursionError/MemoryError past the reader): loud, and keep running
            log.exception("config change ignored: internal error (a bug); keeping the running configuration",
                          extra={"config": self.options.config_path})
            return
        topology, built = self.topology, None
        if topology is not None:
            # Built once, in a thread (thousands of replicas take a while; /healthz and the RPCs are
            # answered meanwhile); options this node cannot serve (a MIG layout, a time-slicing
            # entry) are refused whole.
            try:
                built = await _build_off_loop(topology, options, self.subset_tables, "config change")
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

    def _count_gpu_actions(self, topology: NodeTopology) -> None:
        """Each GPU's required action for the metrics, whichever way (device plugin, DRA) it is served."""
        self.metrics.set_gpu_actions({g.name: action_of_reason(g.health_reason).value if not g.healthy
                                      else "none" for g in topology.gpus})



def _build(topology: NodeTopology, options: ResourceOptions,
           tables: SubsetTableCache) -> tuple[list[Resource], list[Resource]]:
    """(device-plugin resources, DRA resources) for `topology`; run in a thread, it touches no daemon state
    but the subset tables (a thread-safe cache)."""
    return split(build_resources(topology, options, tables), options.dra_resources)


async def _build_off_loop(topology: NodeTopology, options: ResourceOptions, tables: SubsetTableCache,
                          cause: str) -> tuple[list[Resource], list[Resource]]:
    """`_build` in a worker thread: thousands of replicas take a while, and the loop keeps answering meanwhile."""
    log.debug("building resources", extra={"cause": cause})
    built = await asyncio.to_thread(_build, topology, options, tables)
    log.debug("resources built", extra={"cause": cause, "devices": sum(len(r.devices) for r in built[0])})
    return built


def run_daemon(make: Callable[[], Daemon]) -> int:
    """Run a daemon in a fresh event loop (the CLI entry point)."""

    async def main() -> int:
        return await make().run()

    return asyncio.run(main())
