"""Run the GPU health monitor beside the event loop: its changes hop onto the loop, the clear file is watched.

Why apart from the monitor: the monitor is a plain thread (tests drive it
directly); this is the asyncio side the sources use, with the operator's clear
file watched through inotify (plugin/watch/filewatch.py), so `topo-device-plugin
health clear` takes effect at once on the running daemon.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from allocator.topology import Device

from ..watch.filewatch import watch_file
from .monitor import GpuHealthMonitor
from .options import GpuHealthOptions
from .policy import GpuHealth
from .store import CLEAR_FILE

log = logging.getLogger(__name__)

__all__ = ["watch_gpu_health"]


async def watch_gpu_health(
    nvml: Any,
    gpus: Sequence[Device],
    options: GpuHealthOptions,
    on_health: Callable[[Mapping[str, GpuHealth]], None],
    *,
    on_links: Callable[[str, str], None] | None = None,
    started: Callable[[GpuHealthMonitor], None] | None = None,
) -> None:
    """Run a `GpuHealthMonitor` until cancelled; `on_health` (and `on_links`) run on this loop at each change.

    `started` (optional) receives the monitor once its thread runs (tests and metrics use it).
    Cancelling stops and joins the thread.
    """
    if not options.enabled or not any(d.uuid for d in gpus):
        await asyncio.Event().wait()
        return
    loop = asyncio.get_running_loop()

    def forward(health: dict[str, GpuHealth]) -> None:
        try:
            loop.call_soon_threadsafe(on_health, health)
        except RuntimeError:  # loop closed while shutting down
            pass

    def forward_links(gpu: str, why: str) -> None:
        if on_links is None:
            return
        try:
            loop.call_soon_threadsafe(on_links, gpu, why)
        except RuntimeError:
            pass

    monitor = GpuHealthMonitor(nvml, gpus, options, forward, on_links=forward_links)
    clears: asyncio.Task | None = None
    directory = options.state_directory
    if directory is not None:
        try:
            os.makedirs(directory, exist_ok=True)
        except OSError as e:
            log.warning("GPU health state directory unusable: faults are not kept across restarts and "
                        "`health clear` cannot reach this daemon", extra={"dir": directory, "reason": str(e)})
            directory = None
    if directory is not None:
        monitor.apply_clear_file(initial=True)

        async def on_clear_file() -> None:
            cleared = monitor.apply_clear_file()
            if cleared:
                log.info("operator clear applied", extra={"gpus": cleared})

        clears = loop.create_task(watch_file(os.path.join(directory, CLEAR_FILE), on_clear_file),
                                  name="gpu-health-clear")
    monitor.start()
    if started is not None:
        started(monitor)
    try:
        await asyncio.Event().wait()
    finally:
        if clears is not None:
            clears.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await clears
        monitor.request_stop()
        await asyncio.shield(asyncio.to_thread(monitor.stop))
