"""An NRI plugin that tells a handler when pod sandboxes start, stop and go away.

Why NRI: the moment a pod's network namespace exists but its containers have
not started (RunPodSandbox) is only visible inside the container runtime; NRI
(containerd 1.7+/2.x, CRI-O) relays it to plugins over a unix socket and waits
for their answer, so a failing handler fails the sandbox instead of leaving a
pod running without what it was promised.

What a plugin does, as containerd/nri v0.8.0's pkg/stub does it: connect to
the socket, multiplex it (plugin/nri/mux.py), serve the Plugin service on
connection 1, call Runtime.RegisterPlugin(name, index) on connection 2. The
runtime then calls Configure (we answer with the events we want: the three
pod-sandbox events, nothing else), Synchronize (every pod it knows; possibly
in several parts with `more` set, which we collect and deliver once), the
events, and Shutdown. Every other call is answered empty, which is what
"nothing to change" means in NRI.

The runtime waits for each answer (containerd's default `plugin_request_timeout`
is 2 s; past it the runtime drops the plugin): handlers must be quick. A handler
that raises becomes the event's error answer, so containerd fails that step.

The connection comes and goes with containerd: when the socket is missing or
the connection drops, NriPlugin retries with a capped exponential backoff
with full jitter (plugin.backoff.Backoff), registers again and receives a fresh
Synchronize. Nothing here raises into the daemon.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from typing import Protocol

from plugin.api.nri.v1alpha1 import api_pb2 as nri
from plugin.backoff import Backoff
from plugin.errors import InputError
from plugin.nri.mux import PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN, Multiplexer
from plugin.nri.ttrpc import Code, Endpoint, StatusError

log = logging.getLogger(__name__)

PLUGIN_SERVICE = "nri.pkg.api.v1alpha1.Plugin"
RUNTIME_SERVICE = "nri.pkg.api.v1alpha1.Runtime"
#: How long registration may take before the attempt counts as failed (NRI's own default is 5 s).
REGISTER_TIMEOUT_S = 10.0
#: The events we subscribe to; NRI's mask has bit (event - 1) for each event.
EVENTS = (nri.RUN_POD_SANDBOX, nri.STOP_POD_SANDBOX, nri.REMOVE_POD_SANDBOX)
EVENT_MASK = sum(1 << (e - 1) for e in EVENTS)


@dataclass(frozen=True)
class PodSandbox:
    """What a handler needs of a pod sandbox."""

    uid: str
    namespace: str
    name: str
    #: Path of the sandbox's network namespace (linux.namespaces[type=="network"]),
    #: e.g. /var/run/netns/cni-...; None for a host-network pod or when the runtime gave none.
    netns: str | None

    @classmethod
    def from_nri(cls, pod: nri.PodSandbox) -> PodSandbox:
        netns = next((ns.path for ns in pod.linux.namespaces if ns.type == "network" and ns.path), None)
        return cls(uid=pod.uid, namespace=pod.namespace, name=pod.name, netns=netns)


class PodSandboxHandler(Protocol):
    """Receives the pod-sandbox events; raising from one answers that event with the error."""

    async def synchronize(self, pods: list[PodSandbox]) -> None: ...

    async def run_pod_sandbox(self, pod: PodSandbox) -> None: ...

    async def stop_pod_sandbox(self, pod: PodSandbox) -> None: ...

    async def remove_pod_sandbox(self, pod: PodSandbox) -> None: ...


def _reason(exc: BaseException) -> str:
    """The first real error inside (nested) exception groups: what a log reader needs to see."""
    while isinstance(exc, BaseExceptionGroup):
        exc = next((e for e in exc.exceptions if not isinstance(e, asyncio.CancelledError)), exc.exceptions[0])
    return f"{type(exc).__name__}: {exc}"


class NriPlugin:
    """Keeps one registered NRI plugin connection alive and forwards pod-sandbox events to `handler`."""

    def __init__(self, socket_path: str, handler: PodSandboxHandler, *, name: str = "topo-device-plugin",
                 index: str = "10", backoff: Backoff | None = None):
        # Checked here, as the runtime does at RegisterPlugin: a bad one would be refused on every retry.
        if not name:
            raise InputError("NRI plugin name is empty: give the plugin a name (containerd lists it as INDEX-NAME)")
        if len(index) != 2 or not index.isascii() or not index.isdigit():
            raise InputError(f"NRI plugin index {index!r} is invalid: it must be two digits, e.g. '10' "
                             "(NRI orders plugins by it)")
        self.socket_path = socket_path
        self.handler = handler
        self.name = name
        self.index = index
        self._backoff = backoff or Backoff(initial=0.5, cap=10.0)
        self._task: asyncio.Task[None] | None = None
        self._connected = False
        self._sync_parts: list[nri.PodSandbox] = []
        #: Completed connections (registered and synchronized), for logs and tests.
        self.sessions = 0

    @property
    def connected(self) -> bool:
        """Registered with the runtime and synchronized: events now reach the handler."""
        return self._connected

    async def start(self) -> None:
        """Connect in the background; returns at once (containerd may not be up yet)."""
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name=f"nri-plugin:{self.name}")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._connected = False

    async def _run(self) -> None:
        waiting_logged = False
        while True:
            try:
                reader, writer = await asyncio.open_unix_connection(self.socket_path)
            except OSError as exc:
                if not waiting_logged:
                    log.info("NRI socket %s not reachable (%s); retrying with backoff until the runtime "
                             "offers it (is NRI enabled in containerd?)", self.socket_path, exc)
                    waiting_logged = True
                await asyncio.sleep(self._backoff.next())
                continue
            waiting_logged = False
            try:
                await self._session(reader, writer)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # whatever the runtime does, the daemon stays up
                me = asyncio.current_task()
                if me is not None and me.cancelling():
                    # stop() came while the session was failing: a TaskGroup then raises the failure
                    # and the cancellation is spent; honour it here or the loop would go on.
                    raise asyncio.CancelledError from exc
                log.warning("NRI connection on %s ended: %s", self.socket_path, _reason(exc))
            finally:
                self._connected = False
                self._sync_parts = []
            await asyncio.sleep(self._backoff.next())

    async def _session(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        mux = Multiplexer(reader, writer)
        server = Endpoint(mux.open(PLUGIN_SERVICE_CONN), self._serve, name="NRI plugin service")
        client = Endpoint(mux.open(RUNTIME_SERVICE_CONN), name="NRI runtime service")
        try:
            async with asyncio.TaskGroup() as tg:
                mux_task = tg.create_task(mux.run())
                tg.create_task(server.run())
                tg.create_task(client.run())
                req = nri.RegisterPluginRequest(plugin_name=self.name, plugin_idx=self.index)
                await client.call(RUNTIME_SERVICE, "RegisterPlugin", req.SerializeToString(),
                                  timeout=REGISTER_TIMEOUT_S)
                log.info("NRI plugin %s-%s registered on %s", self.index, self.name, self.socket_path)
                await mux_task
        finally:
            mux.close()
        log.info("NRI connection on %s closed", self.socket_path)

    async def _serve(self, service: str, method: str, payload: bytes) -> bytes:
        """The Plugin service: our three events and Synchronize reach the handler, the rest is answered empty."""
        if service != PLUGIN_SERVICE:
            raise StatusError(Code.UNIMPLEMENTED, f"service {service} is not served by this NRI plugin")
        if method == "Configure":
            req = nri.ConfigureRequest.FromString(payload)
            log.info("NRI runtime %s %s configures plugin %s", req.runtime_name, req.runtime_version, self.name)
            return nri.ConfigureResponse(events=EVENT_MASK).SerializeToString()
        if method == "Synchronize":
            return await self._synchronize(nri.SynchronizeRequest.FromString(payload))
        if method == "StateChange":
            await self._state_change(nri.StateChangeEvent.FromString(payload))
            return b""
        if method == "Shutdown":
            log.info("NRI runtime shuts plugin %s down", self.name)
        return b""  # an empty message of any type: "no adjustment, no update"

    async def _synchronize(self, req: nri.SynchronizeRequest) -> bytes:
        self._sync_parts.extend(req.pods)
        if req.more:  # more parts follow: answer `more` back, as the runtime checks
            return nri.SynchronizeResponse(more=True).SerializeToString()
        pods, self._sync_parts = [PodSandbox.from_nri(p) for p in self._sync_parts], []
        try:
            await self.handler.synchronize(pods)
        except Exception as exc:
            # The runtime closes the connection on this answer; we register again after a backoff
            # and get a fresh Synchronize then.
            log.warning("NRI synchronize handler failed for %d pods: %s", len(pods), exc)
            raise StatusError(Code.UNKNOWN, f"{self.name}: Synchronize of {len(pods)} pods: {exc}") from exc
        self._connected = True
        self.sessions += 1
        self._backoff.reset()
        log.info("NRI plugin %s synchronized: %d pods", self.name, len(pods))
        return nri.SynchronizeResponse().SerializeToString()

    async def _state_change(self, evt: nri.StateChangeEvent) -> None:
        pod = PodSandbox.from_nri(evt.pod)
        call = {nri.RUN_POD_SANDBOX: self.handler.run_pod_sandbox,
                nri.STOP_POD_SANDBOX: self.handler.stop_pod_sandbox,
                nri.REMOVE_POD_SANDBOX: self.handler.remove_pod_sandbox}.get(evt.event)
        if call is None:
            return  # not subscribed: nothing to do
        try:
            await call(pod)
        except Exception as exc:
            log.warning("NRI %s for pod %s/%s (%s) failed: %s", nri.Event.Name(evt.event), pod.namespace,
                        pod.name, pod.uid, exc)
            raise StatusError(Code.UNKNOWN, f"{self.name}: {nri.Event.Name(evt.event)} of pod "
                                            f"{pod.namespace}/{pod.name}: {exc}") from exc
