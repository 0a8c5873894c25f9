"""Run our daemon with ONE deliberately broken behaviour, to prove the kubelet tests catch it.

Test-only: the product has no switch for this. The break is a monkeypatch applied in
this process before the normal CLI runs:

    python tests/kubelet/broken_plugin.py <variant> serve --simulate ... (normal serve args)

variants:
  preferred-one-too-many   GetPreferredAllocation returns one more ID than allocation_size
  register-before-serving  Register is called before the device-plugin socket is served
  reregister-with-old-stream-open
                           on re-registration the old server (and its ListAndWatch stream)
                           is only stopped 1.5 s after the new Register: kubernetes #121994
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from plugin.serving import registration, server
from plugin.cli import cli


def preferred_one_too_many() -> None:
    orig = server.DevicePluginService.GetPreferredAllocation

    async def broken(self, request, context):
        resp = await orig(self, request, context)
        for creq, cresp in zip(request.container_requests, resp.container_responses):
            extra = [d for d in creq.available_deviceIDs if d not in cresp.deviceIDs]
            if extra:
                cresp.deviceIDs.append(sorted(extra)[-1])
        return resp

    server.DevicePluginService.GetPreferredAllocation = broken


def register_before_serving() -> None:
    orig = server.ResourceServer.start

    async def broken(self):
        kubelet_sock = os.path.join(os.path.dirname(self.socket_path), "kubelet.sock")
        if os.path.exists(kubelet_sock):
            try:
                await registration.register(kubelet_sock, os.path.basename(self.socket_path), self.name, timeout=30)
            except Exception as e:  # noqa: BLE001 (the kubelet cannot dial us back: it fails after its 10 s timeout)
                print(f"broken_plugin: early Register failed: {e}", file=sys.stderr, flush=True)
        await orig(self)

    server.ResourceServer.start = broken


def reregister_with_old_stream_open() -> None:
    async def broken(self, send_empty=False, grace=0.5):
        old, self._server = self._server, None
        if old is None:
            return False
        old_service = self.service

        async def later():
            await asyncio.sleep(1.5)
            await old_service.close_streams(False)
            await old.stop(0)

        asyncio.get_running_loop().create_task(later())
        self.registered_with = None
        return False  # "no stream was open": the daemon re-registers at once

    server.ResourceServer.stop = broken


VARIANTS = {"preferred-one-too-many": preferred_one_too_many, "register-before-serving": register_before_serving,
            "reregister-with-old-stream-open": reregister_with_old_stream_open}

if __name__ == "__main__":
    VARIANTS[sys.argv[1]]()
    cli.main(args=sys.argv[2:], prog_name="topo-device-plugin")
