"""NriPlugin survives what a broken or absent runtime does: it logs, backs off, retries, never raises.

The runtime here is a unix socket server of the test's own that breaks NRI's
protocol on purpose (the well-behaved runtime is NRI's own, in
test_nri_runtime.py).
"""

from __future__ import annotations

import asyncio
import struct

import pytest

from plugin.backoff import Backoff
from plugin.errors import InputError
from plugin.nri import NriPlugin, PodSandbox
from plugin.nri.mux import MAX_PAYLOAD


class Nothing:
    async def synchronize(self, pods: list[PodSandbox]) -> None: ...
    async def run_pod_sandbox(self, pod: PodSandbox) -> None: ...
    async def stop_pod_sandbox(self, pod: PodSandbox) -> None: ...
    async def remove_pod_sandbox(self, pod: PodSandbox) -> None: ...


async def _serve(path: str, on_connection) -> asyncio.Server:
    return await asyncio.start_unix_server(on_connection, path=path)


async def test_a_runtime_that_breaks_the_protocol_is_retried_and_the_plugin_keeps_running(tmp_path):
    sock = str(tmp_path / "nri.sock")
    connections: asyncio.Queue[int] = asyncio.Queue()

    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.put_nowait(1)
        writer.write(struct.pack(">II", 1, MAX_PAYLOAD + 1))  # an impossible frame
        await writer.drain()
        await reader.read()  # until the plugin hangs up
        writer.close()

    server = await _serve(sock, garbage)
    plugin = NriPlugin(sock, Nothing(), backoff=Backoff(initial=0.01, cap=0.05))
    try:
        await plugin.start()
        for _ in range(3):  # refused, reconnected, refused again...
            await asyncio.wait_for(connections.get(), 60)
        assert not plugin.connected
        assert plugin._task is not None and not plugin._task.done()  # still running, nothing raised
    finally:
        await plugin.stop()
        server.close()


async def test_a_runtime_that_hangs_up_at_once_is_retried(tmp_path):
    sock = str(tmp_path / "nri.sock")
    connections: asyncio.Queue[int] = asyncio.Queue()

    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.put_nowait(1)
        writer.close()

    server = await _serve(sock, hang_up)
    plugin = NriPlugin(sock, Nothing(), backoff=Backoff(initial=0.01, cap=0.05))
    try:
        await plugin.start()
        for _ in range(3):
            await asyncio.wait_for(connections.get(), 60)
        assert not plugin.connected and not plugin._task.done()
    finally:
        await plugin.stop()
        server.close()


async def test_stop_while_waiting_for_an_absent_socket_returns(tmp_path):
    plugin = NriPlugin(str(tmp_path / "missing" / "nri.sock"), Nothing(), backoff=Backoff(initial=0.01, cap=0.05))
    await plugin.start()
    await asyncio.sleep(0.05)  # let it fail a few connects; what is checked is that stop() ends it cleanly
    await plugin.stop()
    assert not plugin.connected and plugin._task is None


@pytest.mark.parametrize(("name", "index", "message"), [
    ("", "10", "NRI plugin name is empty"),
    ("topo", "1", "NRI plugin index '1' is invalid: it must be two digits"),
    ("topo", "1a", "NRI plugin index '1a' is invalid"),
])
def test_a_name_or_index_the_runtime_would_refuse_is_refused_up_front(name, index, message):
    with pytest.raises(InputError, match=message):
        NriPlugin("/run/nri/nri.sock", Nothing(), name=name, index=index)
