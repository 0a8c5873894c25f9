"""`topo-device-plugin demo`: the daemon on a simulated node, registered with a kubelet stand-in.

With `--hardware` it serves the node's own devices instead: on a GPU node, the same transcript is
a smoke test of discovery, allocation and the device-plugin API that needs no kubelet.

Why: the first thing a new user runs. No GPU, no kubelet, no root: a
temporary directory plays `/var/lib/kubelet/device-plugins`, the stand-in
plays the kubelet's device manager, and the transcript shows what the
kubelet would see and get.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from collections.abc import Sequence

import click

from allocator.pairing import pair_label
from allocator.topology import DeviceKind

from ..runtime.compose.root import compose_demo
from ..runtime.daemon import Daemon
from ..demo.device_manager import StandinDeviceManager, pod
from ..demo.kubelet_standin import KubeletStandin
from ..observability.logging_setup import setup_logging
from ..model.render import plural
from .options import Settings, option, with_settings
from .routing import Command
from .typed import DemoSettings, demo_settings, node_settings


async def _demo(settings: Settings, demo: DemoSettings, hold: float, out) -> int:
    with tempfile.TemporaryDirectory(prefix="topo-dp-demo-") as tmp:
        kubelet = KubeletStandin(tmp)
        await kubelet.start()
        try:
            return await _transcript(settings, demo, kubelet, tmp, hold, out)
        finally:
            await kubelet.stop()  # also when the transcript fails early (a closed stdout, a bad option)


async def _transcript(settings: Settings, demo: DemoSettings, kubelet: KubeletStandin, tmp: str, hold: float,
                      out) -> int:
    out(f"kubelet stand-in listening on {kubelet.socket_path}")
    cdi_dir = os.path.join(tmp, "cdi")  # the demo's stand-in for /var/run/cdi
    # Read here, after the stand-in is up, as always: a bad option fails the transcript with the stand-in stopped.
    node = node_settings(settings, demo.default_node)
    daemon = compose_demo(node.source, node.resources, plugin_dir=tmp, cdi_spec_dir=cdi_dir)
    started = time.monotonic()  # as before: from the daemon's start, the source already built
    stop = asyncio.Event()
    task = asyncio.create_task(daemon.run(stop, install_signals=False))
    try:
        started_wait = asyncio.create_task(daemon.started.wait())
        await asyncio.wait([started_wait, task], return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            started_wait.cancel()
            return task.result()  # raises what stopped the daemon before it served
        names = list(daemon.servers)
        if not names:
            out("the node has no GPU or NIC to serve: nothing registered with the kubelet stand-in "
                "(the daemon's log above says why)")
        await kubelet.wait_for(lambda: all(kubelet.devices(n) for n in names), timeout=15)
        if names:
            # In the daemon's resource order, not arrival order (the servers register concurrently):
            # the same line every run, as the README shows it.
            regs = sorted(kubelet.registrations, key=lambda r: names.index(r.resource) if r.resource in names
                          else len(names))
            out(f"registered in {1000 * (time.monotonic() - started):.0f} ms: "
                + ", ".join(f"{r.resource} (endpoint {r.endpoint})" for r in regs))
        for name in names:
            devs = kubelet.devices(name)
            out(f"\n{name}: {plural(len(devs), 'device')} from ListAndWatch")
            for d in devs.values():
                numa = ",".join(map(str, d.numa)) or "none"
                out(f"  {d.id:<42} {d.health:<9} NUMA {numa}")
        gpu = node.resources.gpu_resource_name
        family = [n for n in names if daemon.servers[n].service.resource.kind in (DeviceKind.GPU, DeviceKind.MIG)]
        gpu_taken: list[str] = []
        for name in family:
            ids = list(kubelet.devices(name))
            for size in (1, 2, 4) if name == gpu else (min(2, len(ids)),):
                if size <= len(ids):
                    pick = await kubelet.preferred(name, ids, [], size)
                    out(f"\n{name}: GetPreferredAllocation(size={size}, all free) -> {', '.join(pick)}")
            pick = await kubelet.preferred(name, ids, [], min(2, len(ids)))
            resp = await kubelet.allocate(name, pick)
            out(f"Allocate({', '.join(pick)}) -> envs {dict(resp.envs)}"
                + (f", devices {[d.host_path for d in resp.devices]}" if resp.devices else "")
                + (f", cdi {[c.name for c in resp.cdi_devices]}" if resp.cdi_devices else "")
                + (f", annotations {dict(resp.annotations)}" if resp.annotations else ""))
            if name == gpu:
                gpu_taken = pick
        nics = [n for n in names if daemon.servers[n].service.resource.kind is DeviceKind.NIC]
        if gpu in names and nics:
            await _paired_pod(daemon, kubelet, gpu, nics[0], gpu_taken, out)
        specs = sorted(os.listdir(cdi_dir)) if os.path.isdir(cdi_dir) else []
        if specs:
            out(f"\nCDI specs written to {cdi_dir}: {', '.join(specs)}")
        if hold:
            out(f"\nserving for {hold:.0f} s (Ctrl-C to stop)...")
            try:
                await asyncio.wait_for(asyncio.shield(task), timeout=hold)
            except asyncio.TimeoutError:
                pass
    finally:
        stop.set()
        try:
            code = await task  # re-raises what stopped the daemon (a bad --simulate file: exit 2)
        finally:
            await kubelet.stop()
    out(f"\ndaemon stopped (exit {code}); sockets removed")
    return code


def _in_order(ids: Sequence[str], listed: list[str]) -> tuple[str, ...]:
    """`ids` in the order ListAndWatch listed them (unknown IDs last)."""
    pos = {d: i for i, d in enumerate(listed)}
    return tuple(sorted(ids, key=lambda d: pos.get(d, len(pos))))


async def _paired_pod(daemon: Daemon, kubelet: KubeletStandin, gpu: str, nic: str, taken: list[str],
                      out) -> None:
    """Another container, asking GPUs and NICs, walked as the kubelet does (its GPUs first here):
    its NIC request has its GPUs as partners (GPU–NIC pairing, docs/pairing.md)."""
    n = min(2, len(kubelet.devices(gpu)) - len(taken), len(kubelet.devices(nic)))
    if n < 1:
        return
    dm = StandinDeviceManager(kubelet, shuffle_resources=False)
    dm.in_use[gpu] = set(taken)
    got = (await dm.admit(pod("demo", {gpu: n, nic: n})))["main"]
    # The kubelet hands a container its devices as a set: shown in the node's device order, so the
    # transcript is the same every run (the README quotes it).
    got = {r: _in_order(ids, list(kubelet.devices(r))) for r, ids in got.items()}
    out(f"\nA container asking {n} GPUs and {n} NICs (the kubelet asks for one resource, then the other): "
        f"{gpu} {', '.join(got[gpu])}, {nic} {', '.join(got[nic])}")
    pairs = daemon.pairing.index.match(gpu, list(got[gpu]), {nic: got[nic]})
    out("  pairs: " + (", ".join(f"{d} ~ {p.split('=', 1)[1]} {pair_label(w)}" for d, p, w in pairs) or "none"))


@click.command(cls=Command, examples=("topo-device-plugin demo --simulate dgx-h100",))
@with_settings("demo")
@option("--hold", type=float, default=0.0, help="Keep serving this many seconds after the transcript.")
@option("--hardware", is_flag=True,
        help="Serve this node's own devices (NVML GPUs, sysfs NICs) instead of a simulated node: "
             "a smoke test of a GPU node without a kubelet.")
def demo(settings: Settings, hold: float, hardware: bool) -> None:
    """Serve a simulated node to a kubelet stand-in in a temp dir and show what the kubelet sees."""
    own = demo_settings(settings, hardware)
    setup_logging(own.log.level, own.log.format)
    code = asyncio.run(_demo(settings, own, hold, click.echo))
    click.get_current_context().exit(code)
