"""The daemon's `--nrt` hook: the real daemon, pod-resources on a real socket, the object over real HTTP.

What a user notices: with the daemon serving, its node's object appears; a GPU that turns unhealthy
(a topology the source publishes) leaves `allocatable`; the daemon stopping deletes the object.
"""

from __future__ import annotations

import asyncio
import os

from allocator.topology import UNHEALTHY, NodeTopology
from topo_testkit.kubelet_standin import KubeletStandin
from plugin.model.resources import ResourceOptions
from plugin.nrt.side import NrtOptions, NrtSide
from plugin.runtime.daemon import Daemon, DaemonOptions
from plugin.sources.base import Publish
from plugin.sources.simulated import load_simulated

from test_side import PodResources
from test_writer import NODE, until

SIM = "pcie-2socket-4gpu-2nic"
GPU = "nvidia.com/gpu"


class ScriptedSource:
    """The simulated boundary: a node that publishes the topologies the test hands it."""

    description = f"simulated {SIM} (scripted)"

    def __init__(self) -> None:
        self.publish: Publish | None = None
        self.watching = asyncio.Event()

    def load(self) -> NodeTopology:
        return load_simulated(SIM)

    async def watch(self, current: NodeTopology, publish: Publish) -> None:
        self.publish = publish
        self.watching.set()
        await asyncio.Event().wait()


def allocatable_gpus(obj: dict) -> int:
    return sum(int(r["allocatable"]) for z in obj["zones"] for r in z["resources"] if r["name"] == GPU)


async def test_the_daemon_publishes_follows_health_and_deletes_at_stop(nrt_server, connect, short_tmp, tmp_path):
    plugin_dir = os.path.join(short_tmp, "dp")
    os.makedirs(plugin_dir)
    socket = os.path.join(short_tmp, "pod-resources", "kubelet.sock")
    kubelet, pod_resources = KubeletStandin(plugin_dir), PodResources()
    await kubelet.start()
    await pod_resources.start(socket)
    options = NrtOptions(NODE, socket, str(tmp_path / "kubelet.yaml"), poll_s=0.05, min_interval_s=0.2)
    source = ScriptedSource()
    daemon = Daemon(source, DaemonOptions(plugin_dir=plugin_dir), ResourceOptions(device_id_strategy="index"),
                    nrt_factory=lambda: NrtSide(options, connect))
    stop = asyncio.Event()
    task = asyncio.create_task(daemon.run(stop, install_signals=False))
    try:
        await until(lambda: NODE in nrt_server.objects, "the daemon's object is published")
        assert allocatable_gpus(nrt_server.objects[NODE]) == 4
        await asyncio.wait_for(source.watching.wait(), 30)
        assert source.publish is not None
        source.publish(load_simulated(SIM).with_health({"GPU1": UNHEALTHY}))
        await until(lambda: allocatable_gpus(nrt_server.objects[NODE]) == 3, "the unhealthy GPU leaves allocatable")
    finally:
        stop.set()
        assert await asyncio.wait_for(task, 60) == 0
        await kubelet.stop()
        await pod_resources.stop()
    assert NODE not in nrt_server.objects
