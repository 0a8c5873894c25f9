"""The demo's kubelet stand-in with what tests and benchmarks need on top: restarts, a slow Register, counters.

Why a subclass here and not in `plugin/demo/`: the demo needs only the happy
path (plugin/demo/kubelet_standin.py), and hooks that hold the kubelet's
`Register` or count its streams are test instruments that must not ship.
What this adds to the demo's stand-in (shared/research/kubelet-device-manager.md §2):
- `restart()` ends every stream, deletes every non-directory file in the
  directory except the checkpoint, and creates `kubelet.sock` again;
- a `Register` runs to its end even when the caller gives up on it (the Go
  handler ignores the caller's cancellation), and `register_gate` can hold
  every `Register` before it dials back, to play a slow kubelet;
  `register_calls` and `registers_in_flight` count them;
- when an older `ListAndWatch` stream of a resource ends, it disconnects
  whatever client is current, as 1.28–1.34 do (kubernetes #121994), so a
  plugin that re-registers too early is caught (`disconnected_newer`);
- `live_streams`, `max_live_streams` and `stream_ends` per resource, and
  `registrations_of(resource)`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time

from plugin.demo import kubelet_standin as demo
from plugin.demo.kubelet_standin import DeviceState, PluginClient, Registration

__all__ = ["CHECKPOINT", "DeviceState", "KubeletStandin", "PluginClient", "Registration"]

CHECKPOINT = "kubelet_internal_checkpoint"


class KubeletStandin(demo.KubeletStandin):
    def __init__(self, plugin_dir: str, dial_timeout: float = 10.0):
        super().__init__(plugin_dir, dial_timeout)
        self.live_streams: dict[str, int] = {}
        self.max_live_streams: dict[str, int] = {}
        self.stream_ends: list[tuple[str, float]] = []
        #: resources whose newer client was disconnected by an older stream ending (kubernetes #121994)
        self.disconnected_newer: list[str] = []
        #: When set to an unset Event, every Register waits for it before dialing back (a slow kubelet).
        self.register_gate: asyncio.Event | None = None
        self.register_calls = 0
        self.registers_in_flight = 0
        self._handlers: set[asyncio.Task] = set()

    # -- life cycle -------------------------------------------------------
    async def stop(self) -> None:
        # A dying kubelet answers nothing more: in-flight Register calls fail at once.
        for t in list(self._handlers):
            t.cancel()
        await super().stop()

    async def restart(self, downtime: float = 0.0) -> None:
        """What a kubelet restart looks like to a plugin."""
        await self.stop()
        for name in os.listdir(self.plugin_dir):
            path = os.path.join(self.plugin_dir, name)
            if name != CHECKPOINT and not os.path.isdir(path):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
        if downtime:
            await asyncio.sleep(downtime)
        await self.start()

    # -- Registration service -------------------------------------------
    async def _register(self, request) -> None:
        # The work is a task of its own: a caller that gives up (deadline, cancel) does not stop it.
        work = asyncio.get_running_loop().create_task(self._counted_register(request))
        self._handlers.add(work)
        work.add_done_callback(self._handlers.discard)
        await asyncio.shield(work)

    async def _counted_register(self, request) -> None:
        self.register_calls += 1
        self.registers_in_flight += 1
        try:
            await self._notify()
            if self.register_gate is not None:
                await self.register_gate.wait()
            await super()._register(request)
        finally:
            self.registers_in_flight -= 1
            await self._notify()

    async def _run_client(self, client: PluginClient) -> None:
        name = client.resource
        self.live_streams[name] = self.live_streams.get(name, 0) + 1
        self.max_live_streams[name] = max(self.max_live_streams.get(name, 0), self.live_streams[name])
        await super()._run_client(client)

    def _stream_ended(self, client: PluginClient) -> None:
        name = client.resource
        self.live_streams[name] -= 1
        self.stream_ends.append((name, time.monotonic()))
        # As the real kubelet (1.28-1.34): look the client up by name only and disconnect it.
        current = self.clients.get(name)
        if current is None or client.stopped:
            return
        self._disconnect(current)
        if current is not client:
            self.disconnected_newer.append(name)
            if current.stream_task:
                current.stream_task.cancel()

    # -- what tests ask ---------------------------------------------------
    def registrations_of(self, resource: str) -> list[Registration]:
        return [r for r in self.registrations if r.resource == resource]
