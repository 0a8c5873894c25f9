"""GPU health as the kubelet and the scheduler see it: the daemon on the NVML double, over real gRPC.

The daemon runs in-process on a generated node (sysfs, procfs with a boot ID) whose GPUs answer
through the NVML double. `kubelet` view: the GPUs served through the device-plugin API to the
kubelet stand-in, health read from ListAndWatch. `dra` view: the GPUs served through DRA, the
ResourceSlices read from the API-server stand-in, the taint value naming XID and action. Each
scenario is a row of the table in docs/gpu-discovery.md "Health" (tests/health/test_policy_table.py
has the whole matrix on the monitor), here through everything that carries it, and the operator's
clear is the real command writing the real file the running daemon watches.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile

import pytest
from click.testing import CliRunner
from prometheus_client import generate_latest
from topo_testkit.fake_nvml import FakeNvml, gpu_node_on_disk
from topo_testkit.kubelet_standin import KubeletStandin

from plugin.cli import cli
from plugin.dra import DraOptions, SliceOptions
from plugin.dra.kubelet.cdi import ClaimSpecs
from plugin.runtime.compose.dra import dra_driver
from plugin.health.options import GpuHealthOptions
from plugin.model.resources import ResourceOptions
from plugin.runtime.daemon import Daemon
from plugin.runtime.options import DaemonOptions
from plugin.sources.hardware import hardware_source_from_options
from plugin.sources.udev_hotplug import UdevUnavailable

NODE = "node-a"
DRIVER = "topo.dev"
GPU = "nvidia.com/gpu"


def no_udev(_subsystems):
    raise UdevUnavailable("no udev in this test")


@pytest.fixture
def root():
    base = tempfile.mkdtemp(prefix="tgh-", dir="/tmp")  # unix socket paths are short
    yield base
    shutil.rmtree(base, ignore_errors=True)


class Node:
    """The daemon's view of one node, through the kubelet stand-in or the API-server stand-in."""

    def __init__(self, view: str, fake: FakeNvml, kubelet: KubeletStandin, apiserver, state: str):
        self.view, self.fake, self.kubelet, self.apiserver, self.state = view, fake, kubelet, apiserver, state

    def health(self) -> dict[str, str]:
        """{GPU name: Healthy/Unhealthy or the taint value} as the view shows it."""
        by_uuid = {g.uuid: g.device.name for g in self.fake.gpus}
        if self.view == "kubelet":
            return {by_uuid[i]: d.health for i, d in self.kubelet.devices(GPU).items()}
        out = {}
        for s in self.apiserver.slices.values():
            for d in s["spec"]["devices"]:
                if d["name"].startswith("gpu-"):
                    taints = d.get("taints") or []
                    out[f"GPU{d['name'][4:]}"] = taints[0]["value"] if taints else "Healthy"
        return out

    async def wait(self, gpu: str, want: str, timeout: float = 30.0) -> None:
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while self.health().get(gpu) != want:
            if loop.time() > end:
                raise AssertionError(f"{gpu} never {want!r} on the {self.view} view; now {self.health()}")
            await asyncio.sleep(0.02)


@contextlib.asynccontextmanager
async def serving(view: str, root: str, apiserver, kube_api, fake=None, roots=None):
    if fake is None:
        fake, roots = gpu_node_on_disk(os.path.join(root, "n"), node="dgx-a100")
        FakeNvml.write_boot_id(roots["proc"], "boot-1")
    state = os.path.join(root, "state")
    source = hardware_source_from_options(
        sysfs_root=roots["sys"], dev_root=roots["dev"], proc_root=roots["proc"], nvml=fake, nics=False,
        node_name=NODE, monitor_factory=no_udev, debounce_s=0.02,
        gpu_health=GpuHealthOptions(quiet_period_s=0.3, wait_timeout_ms=50, probe_interval_s=0.05,
                                    state_directory=state))
    plugin_dir = os.path.join(root, "dp")
    os.makedirs(plugin_dir, exist_ok=True)
    kubelet = KubeletStandin(plugin_dir)
    await kubelet.start()
    dra = frozenset({GPU}) if view == "dra" else frozenset()

    async def make_dra(include):
        opts = DraOptions(slices=SliceOptions(node_name=NODE, driver_name=DRIVER, include=include),
                          kubelet_root=os.path.join(root, "k"), cdi_root=os.path.join(root, "cdi"),
                          instance_id="pod-1", resync_s=3600, health_heartbeat_s=3600)
        return dra_driver(opts, kube_api, cdi=ClaimSpecs(os.path.join(root, "cdi"), DRIVER))

    daemon = Daemon(source, DaemonOptions(plugin_dir=plugin_dir), ResourceOptions(dra_resources=dra),
                    dra_factory=make_dra if dra else None)
    stop = asyncio.Event()
    task = asyncio.create_task(daemon.run(stop, install_signals=False))
    node = Node(view, fake, kubelet, apiserver, state)
    try:
        loop = asyncio.get_running_loop()
        end = loop.time() + 30
        while len(node.health()) != 8 or not await asyncio.to_thread(fake.wait_registered, None, 0.1):
            assert loop.time() < end and not task.done(), "the daemon never served 8 GPUs"
            await asyncio.sleep(0.05)
        yield node, daemon, roots
    finally:
        stop.set()
        assert await asyncio.wait_for(task, 20) == 0
        await kubelet.stop()


def bad(view: str, taint: str) -> str:
    return "Unhealthy" if view == "kubelet" else taint


@pytest.mark.parametrize("view", ["kubelet", "dra"])
async def test_restart_app_changes_nothing_and_reset_gpu_waits_for_the_reset(view, root, apiserver, kube_api):
    async with serving(view, root, apiserver, kube_api) as (node, daemon, _roots):
        fake = node.fake
        fake.inject_xid("GPU1", 13)  # RESTART_APP: counted, logged, the GPU serves on
        fake.set_health_facts("GPU2", volatile_dbe=1, remap_pending=True)
        fake.inject_xid("GPU2", 48, recovery_action=1)  # the driver asks for a GPU reset
        await node.wait("GPU2", bad(view, "xid-48.reset-gpu"))
        assert node.health()["GPU1"] == "Healthy"
        assert {g for g, h in node.health().items() if h != "Healthy"} == {"GPU2"}
        counts = daemon.source.xid_counts()
        assert counts[("GPU1", 13, "RESTART_APP")] == 1 and counts[("GPU2", 48, "WORKFLOW_XID_48")] == 1
        scrape = generate_latest(daemon.metrics.registry).decode()
        assert 'topo_dp_gpu_required_action{action="reset GPU",gpu="GPU2"} 1.0' in scrape
        assert 'topo_dp_gpu_required_action{action="none",gpu="GPU1"} 1.0' in scrape
        assert 'topo_dp_gpu_xids_total{bucket="RESTART_APP",gpu="GPU1",xid="13"} 1.0' in scrape
        if view == "dra":  # what the kubelet writes into a holding pod's allocatedResourcesStatus
            [report] = [r for r in daemon.dra.health.reports() if r.device == "gpu-2"]
            assert report.health == "Unhealthy"
            assert report.message.startswith("GPU2: xid-48: reset GPU (XID 48 (ROBUST_CHANNEL_GPU_ECC_DBE")
        fake.reset_gpu("GPU2")  # the evidence: the field reads none, the remap is applied
        await node.wait("GPU2", "Healthy")
        assert 'topo_dp_gpu_required_action{action="none",gpu="GPU2"} 1.0' in \
            generate_latest(daemon.metrics.registry).decode()
        assert 'action="reset GPU"' not in generate_latest(daemon.metrics.registry).decode()


@pytest.mark.parametrize("view", ["kubelet", "dra"])
async def test_a_lost_gpu_is_one_lost_gpu_and_the_operator_clears_it(view, root, apiserver, kube_api):
    async with serving(view, root, apiserver, kube_api) as (node, _daemon, _roots):
        fake = node.fake
        fake.lose("GPU5")
        fake.inject_xid("GPU5", 79)
        await node.wait("GPU5", bad(view, "xid-79.restart-node"))
        assert {g for g, h in node.health().items() if h != "Healthy"} == {"GPU5"}
        fake.restore("GPU5")  # NVML answers again: not enough for a GPU that fell off the bus
        r = CliRunner().invoke(cli, ["health", "clear", "--gpu", fake.by_name["GPU5"].uuid,
                                     "--state-dir", node.state])
        assert r.exit_code == 0, r.output
        await node.wait("GPU5", "Healthy")


async def test_a_fault_outlives_a_daemon_restart_and_ends_with_a_reboot(root, apiserver, kube_api):
    fake, roots = gpu_node_on_disk(os.path.join(root, "n"), node="dgx-a100")
    FakeNvml.write_boot_id(roots["proc"], "boot-1")
    async with serving("kubelet", root, apiserver, kube_api, fake, roots) as (node, _d, _r):
        fake.inject_xid("GPU3", 57)  # CONTACT_SUPPORT
        await node.wait("GPU3", "Unhealthy")
    async with serving("kubelet", root, apiserver, kube_api, fake, roots) as (node, _d, _r):
        await node.wait("GPU3", "Unhealthy")  # same boot: restored, never advertised Healthy
    FakeNvml.write_boot_id(roots["proc"], "boot-2")
    async with serving("kubelet", root, apiserver, kube_api, fake, roots) as (node, _d, _r):
        await node.wait("GPU3", "Healthy")
        assert set(node.health().values()) == {"Healthy"}
