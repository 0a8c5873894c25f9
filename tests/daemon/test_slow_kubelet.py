"""Registration whatever the kubelet's timing (issue 9, defect 6) and without the slow poll (test guard).

The daemon runs in this process (so `DaemonOptions` can be set), against the
kubelet stand-in over real unix sockets with real inotify.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator

from daemon_testlib import GPU, NIC, until

from plugin.runtime.daemon import Daemon, DaemonOptions
from topo_testkit.kubelet_standin import KubeletStandin
from plugin.serving.registration import socket_identity
from plugin.model.resources import ResourceOptions
from plugin.sources.simulated.source import SimulatedSource


@contextlib.asynccontextmanager
async def in_process_daemon(plugin_dir: str, **options: object) -> AsyncIterator[Daemon]:
    daemon = Daemon(SimulatedSource("dgx-a100"), DaemonOptions(plugin_dir=plugin_dir, **options),
                    ResourceOptions(device_id_strategy="index"))
    stop = asyncio.Event()
    task = asyncio.create_task(daemon.run(stop, install_signals=False))
    try:
        yield daemon
    finally:
        stop.set()
        assert await asyncio.wait_for(task, 30) == 0


async def test_a_slow_register_never_leaves_two_registrations_or_streams(plugin_dir, caplog):
    caplog.set_level(logging.WARNING, logger="plugin")
    kubelet = KubeletStandin(plugin_dir)
    kubelet.register_gate = asyncio.Event()  # every Register waits here before it dials back
    await kubelet.start()
    try:
        async with in_process_daemon(plugin_dir, register_timeout_s=0.3, retry_initial_s=0.1) as daemon:
            await kubelet.wait_for(lambda: kubelet.registers_in_flight == 2, timeout=20)

            # Hold both calls past the daemon's timeout: until it has either sent another Register
            # (what it used to do) or said, for both resources, that it keeps waiting for the first.
            def past_the_timeout() -> bool:
                return kubelet.register_calls > 2 or caplog.text.count("has not answered Register yet") >= 2

            await until(past_the_timeout, 30, "the daemon's Register timeout to pass")
            kubelet.register_gate.set()  # the kubelet answers at last, and finishes every call it got
            await kubelet.wait_for(lambda: kubelet.registers_in_flight == 0, timeout=20)
            await until(lambda: daemon.ready()[0], 20, "the daemon to see itself registered")
            await kubelet.wait_for(lambda: all(kubelet.devices(r) for r in (GPU, NIC)), timeout=20)
            # exactly one registration and one live stream per resource (kubernetes #121994)
            assert kubelet.register_calls == 2
            assert [len(kubelet.registrations_of(r)) for r in (GPU, NIC)] == [1, 1]
            assert kubelet.live_streams == {GPU: 1, NIC: 1}
            assert kubelet.max_live_streams == {GPU: 1, NIC: 1}
            assert kubelet.disconnected_newer == []
            assert not kubelet.client(GPU).stopped and len(kubelet.devices(GPU)) == 8
    finally:
        await kubelet.stop()


async def test_a_pending_register_is_not_abandoned_when_kubelet_sock_changes(plugin_dir):
    """kubelet.sock may change between the daemon's look and its connect (a crashed kubelet's stale
    socket replaced by the new kubelet's): a call in flight may have reached the live kubelet,
    which completes it whatever the caller does, so it must never be dropped for a second one."""
    kubelet = KubeletStandin(plugin_dir)
    kubelet.register_gate = asyncio.Event()
    await kubelet.start()
    try:
        async with in_process_daemon(plugin_dir) as daemon:
            await kubelet.wait_for(lambda: kubelet.registers_in_flight == 2, timeout=20)
            # The same live listener under a new identity (rename changes the ctime), as the daemon sees it.
            before = socket_identity(kubelet.socket_path)
            moved = kubelet.socket_path + ".moved"
            os.rename(kubelet.socket_path, moved)
            os.rename(moved, kubelet.socket_path)
            assert socket_identity(kubelet.socket_path) != before
            # the daemon reacts to the event (it counts a kubelet restart) while both calls are still held
            await until(lambda: "topo_dp_kubelet_restarts_total 1.0" in _metrics(daemon), 20,
                        "the daemon to notice the new kubelet.sock")
            await asyncio.sleep(0.5)  # only a window in which a wrong second Register would arrive and be counted
            kubelet.register_gate.set()
            await kubelet.wait_for(lambda: kubelet.registers_in_flight == 0, timeout=20)
            await until(lambda: daemon.ready()[0], 20, "the daemon to see itself registered")
            await kubelet.wait_for(lambda: all(kubelet.devices(r) for r in (GPU, NIC)), timeout=20)
            assert kubelet.register_calls == 2
            assert [len(kubelet.registrations_of(r)) for r in (GPU, NIC)] == [1, 1]
            assert kubelet.live_streams == {GPU: 1, NIC: 1} and kubelet.max_live_streams == {GPU: 1, NIC: 1}
    finally:
        await kubelet.stop()


def _metrics(daemon: Daemon) -> str:
    from prometheus_client import generate_latest

    return generate_latest(daemon.metrics.registry).decode()


async def test_kubelet_sock_creation_alone_leads_to_register(plugin_dir, caplog):
    """With the slow poll an hour away, only the inotify event on kubelet.sock can trigger Register."""
    caplog.set_level(logging.INFO, logger="plugin.runtime.daemon")
    async with in_process_daemon(plugin_dir, kubelet_poll_s=3600.0):
        def serving_and_waiting() -> bool:
            sockets = [n for n in os.listdir(plugin_dir) if n.endswith(".sock")]
            return len(sockets) == 2 and "waiting for the kubelet" in caplog.text

        await until(serving_and_waiting, 20, "the daemon to serve and wait for the kubelet")
        kubelet = KubeletStandin(plugin_dir)
        await kubelet.start()  # creates kubelet.sock
        try:
            await kubelet.wait_for(lambda: bool(kubelet.devices(GPU)) and bool(kubelet.devices(NIC)), timeout=10)
            assert [len(kubelet.registrations_of(r)) for r in (GPU, NIC)] == [1, 1]
        finally:
            await kubelet.stop()
