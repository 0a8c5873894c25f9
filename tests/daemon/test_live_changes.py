"""Live changes have one writer: topology updates and config reloads are applied in arrival order.

Why: applying a change awaits (the build runs in a worker thread), so two
changes applied by two tasks can finish in either order and leave the servers
on the older one. The first tests drive the writer (`plugin.runtime.changes`)
alone; the last ones drive the real daemon over real sockets, with the first
update's build slowed (the build function patched in-process: the only stand-in
here) so that the second one, left alone, would finish first.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable

import pytest

from allocator.topology import UNHEALTHY, NodeTopology
from daemon_testlib import until

import plugin.runtime.daemon as daemon_module
from topo_testkit.kubelet_standin import KubeletStandin
from plugin.model.resources import ResourceOptions
from plugin.runtime.changes import ConfigReload, LiveChanges, TopologyUpdate
from plugin.runtime.daemon import Daemon, DaemonOptions
from plugin.sources.base import Publish
from plugin.sources.simulated import load_simulated

NODE = "pcie-2socket-4gpu-2nic"
GPU = "nvidia.com/gpu"


def topologies(n: int) -> list[NodeTopology]:
    """`n` distinct topologies of one node: in the k-th, GPU k is unhealthy (what a health event publishes)."""
    base = load_simulated(NODE)
    return [base.with_health({f"GPU{k}": UNHEALTHY}) for k in range(n)]


class HeldWriter:
    """A writer whose first change is held until released: later ones queue behind it meanwhile."""

    def __init__(self) -> None:
        self.applied: list[object] = []
        self.first_started = asyncio.Event()
        self.release = asyncio.Event()
        self.changes = LiveChanges(self.apply)

    async def apply(self, change) -> None:
        if not self.applied:
            self.applied.append(change)
            self.first_started.set()
            await self.release.wait()
        else:
            self.applied.append(change)

    async def run(self, first, *later) -> list[object]:
        task = asyncio.create_task(self.changes.run())
        try:
            self.changes.submit(first)
            await asyncio.wait_for(self.first_started.wait(), 10)
            for change in later:
                self.changes.submit(change)
            self.release.set()
            await asyncio.wait_for(self.changes.idle(), 10)
        finally:
            task.cancel()
        return self.applied


async def test_changes_are_applied_one_at_a_time_in_arrival_order():
    t = [TopologyUpdate(x) for x in topologies(2)]
    reload = ConfigReload("config file")
    assert await HeldWriter().run(t[0], reload, t[1]) == [t[0], reload, t[1]]
    assert await HeldWriter().run(reload, t[0]) == [reload, t[0]]


async def test_a_burst_of_topology_updates_builds_only_the_latest():
    t = [TopologyUpdate(x) for x in topologies(4)]
    writer = HeldWriter()
    assert await writer.run(*t) == [t[0], t[3]]
    assert (writer.changes.submitted, writer.changes.coalesced) == (4, 2)


async def test_a_reload_and_an_update_are_both_applied_and_a_waiting_reload_covers_a_newer_one():
    t = [TopologyUpdate(x) for x in topologies(3)]
    first, second = ConfigReload("config file"), ConfigReload("SIGHUP")
    # the reload waits; the update replaces only the update waiting before it; the second reload is covered
    assert await HeldWriter().run(t[0], t[1], first, t[2], second) == [t[0], first, t[2]]


async def test_a_failing_change_is_logged_and_the_writer_goes_on(caplog):
    t = [TopologyUpdate(x) for x in topologies(2)]
    applied = []

    async def apply(change) -> None:
        applied.append(change)
        if change is t[0]:
            raise RuntimeError("a bug")

    changes = LiveChanges(apply)
    task = asyncio.create_task(changes.run())
    try:
        changes.submit(t[0])
        await asyncio.wait_for(changes.idle(), 10)
        changes.submit(t[1])
        await asyncio.wait_for(changes.idle(), 10)
    finally:
        task.cancel()
    assert applied == t
    assert "live change failed: internal error (a bug)" in caplog.text


# -- the real daemon -----------------------------------------------------------------------------

class ScriptedSource:
    """The simulated boundary: a node that publishes the topologies the test hands it."""

    description = f"simulated {NODE} (scripted)"

    def __init__(self) -> None:
        self.publish: Publish | None = None
        self.watching = asyncio.Event()

    def load(self) -> NodeTopology:
        return load_simulated(NODE)

    async def watch(self, current: NodeTopology, publish: Publish) -> None:
        self.publish = publish
        self.watching.set()
        await asyncio.Event().wait()  # until cancelled


class SlowFirstBuild:
    """`plugin.runtime.daemon._build` with the build for `slow` held until released (in its worker thread)."""

    def __init__(self, slow: NodeTopology, build: Callable):
        self.slow = slow
        self.build = build
        self.started = threading.Event()
        self.release = threading.Event()
        self.calls: list[tuple[NodeTopology, str]] = []

    def __call__(self, topology: NodeTopology, options: ResourceOptions, *rest: object):
        self.calls.append((topology, options.gpu_resource_name))
        if topology is self.slow:
            self.started.set()
            assert self.release.wait(60), "the test never released the slow build"
        return self.build(topology, options, *rest)  # the rest: the daemon's subset tables


def unhealthy(kubelet: KubeletStandin, resource: str) -> set[str]:
    return {i for i, d in kubelet.devices(resource).items() if d.health == UNHEALTHY}


@pytest.fixture
async def serving(plugin_dir, tmp_path):
    """A daemon in this process on a scripted node, serving to a kubelet stand-in; its config file."""
    kubelet = KubeletStandin(plugin_dir)
    await kubelet.start()
    config = tmp_path / "config.yaml"
    config.write_text("version: v1\n")
    source = ScriptedSource()
    renamed = ResourceOptions(device_id_strategy="index", gpu_resource_name="example.com/gpu")
    daemon = Daemon(source, DaemonOptions(plugin_dir=plugin_dir, config_path=str(config)),
                    ResourceOptions(device_id_strategy="index"), reload_resources=lambda: renamed)
    stop = asyncio.Event()
    task = asyncio.create_task(daemon.run(stop, install_signals=False))
    try:
        await kubelet.wait_for(lambda: len(kubelet.devices(GPU)) == 4, timeout=30)
        await asyncio.wait_for(source.watching.wait(), 30)
        yield daemon, source, kubelet, config
    finally:
        stop.set()
        assert await asyncio.wait_for(task, 60) == 0
        await kubelet.stop()


async def test_two_updates_finishing_in_reverse_order_leave_the_servers_on_the_newer(serving, monkeypatch):
    daemon, source, kubelet, _ = serving
    older, newer = topologies(2)
    slow = SlowFirstBuild(older, daemon_module._build)
    monkeypatch.setattr(daemon_module, "_build", slow)
    source.publish(older)
    assert await asyncio.to_thread(slow.started.wait, 30)
    source.publish(newer)  # arrives while the older one is still building
    slow.release.set()
    await asyncio.wait_for(daemon.changes.idle(), 60)
    assert [t for t, _ in slow.calls] == [older, newer]
    assert daemon.topology is newer
    await kubelet.wait_for(lambda: unhealthy(kubelet, GPU) == {"1"}, timeout=30)
    served = daemon.servers[GPU].service.resource.devices
    assert [d.health for d in served] == ["Healthy", UNHEALTHY, "Healthy", "Healthy"]


async def test_a_burst_during_a_slow_build_builds_the_latest_only(serving, monkeypatch):
    daemon, source, kubelet, _ = serving
    t = topologies(4)
    slow = SlowFirstBuild(t[0], daemon_module._build)
    monkeypatch.setattr(daemon_module, "_build", slow)
    source.publish(t[0])
    assert await asyncio.to_thread(slow.started.wait, 30)
    for later in t[1:]:
        source.publish(later)
    slow.release.set()
    await asyncio.wait_for(daemon.changes.idle(), 60)
    assert [x for x, _ in slow.calls] == [t[0], t[3]]
    assert daemon.metrics.registry.get_sample_value("topo_dp_topology_updates_total") == 2
    await kubelet.wait_for(lambda: unhealthy(kubelet, GPU) == {"3"}, timeout=30)


async def test_a_config_reload_and_a_topology_update_during_a_slow_build_are_both_applied(
        serving, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="plugin.runtime.daemon")
    daemon, source, kubelet, config = serving
    older, newer = topologies(2)
    slow = SlowFirstBuild(older, daemon_module._build)
    monkeypatch.setattr(daemon_module, "_build", slow)
    source.publish(older)
    assert await asyncio.to_thread(slow.started.wait, 30)
    config.write_text("version: v1\n# renamed\n")  # the real file watch: `reload_resources` renames the GPUs
    await until(lambda: any(isinstance(c, ConfigReload) for c in daemon.changes.waiting), 30,
                "the config change to be queued behind the slow build")
    source.publish(newer)
    slow.release.set()
    await asyncio.wait_for(daemon.changes.idle(), 60)
    assert slow.calls == [(older, GPU), (older, "example.com/gpu"), (newer, "example.com/gpu")]
    assert daemon.topology is newer and set(daemon.servers) == {"example.com/gpu", "topo.dev/nic"}
    await kubelet.wait_for(lambda: unhealthy(kubelet, "example.com/gpu") == {"1"}, timeout=30)
    assert "config changed" in caplog.text
