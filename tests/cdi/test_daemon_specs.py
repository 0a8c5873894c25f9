"""The daemon writes our CDI specs: before devices are advertised, replaced on changes, removed at shutdown;
Allocate names devices from them (GPUs, replicas, MIG devices, NICs) and the CDI library resolves the names.

The daemon runs in this process (the real `Daemon`, a simulated node file it watches) with the kubelet
stand-in over real unix sockets; specs go to a temporary directory, never /var/run/cdi.
"""

from __future__ import annotations

import asyncio
import json
import os
import pathlib

import pytest
import yaml
from click.testing import CliRunner

from plugin.cli import cli
from plugin.config import parse_config
from plugin.runtime.daemon import Daemon, DaemonOptions
from topo_testkit.kubelet_standin import KubeletStandin
from plugin.model.gpu_allocate import GpuAllocateOptions
from plugin.model.resources import ResourceOptions
from plugin.sources.simulated import builtin_text
from plugin.sources.simulated.source import SimulatedSource

from cdi_nodes import TIME_SLICED

GPU_SHARED = "nvidia.com/gpu.shared"
MIG_HALF = "nvidia.com/mig-1g.10gb.half"
MIG_3G = "nvidia.com/mig-3g.40gb"
FOREIGN = "nvidia.yaml"  # what NVIDIA's toolkit would write; never ours to touch
FOREIGN_TEXT = """\
cdiVersion: 0.5.0
kind: nvidia.com/gpu
devices:
- name: all
  containerEdits:
    deviceNodes:
    - {path: /dev/nvidia0, type: c, major: 195, minor: 0}
"""


def options(strategies: tuple[str, ...]) -> ResourceOptions:
    return ResourceOptions(device_id_strategy="index", mig_strategy="mixed",
                           time_slicing=parse_config(TIME_SLICED, "config.yaml").time_slicing,
                           gpu_allocate=GpuAllocateOptions(device_list_strategy=strategies))


class Running:
    """A daemon and a kubelet stand-in in this loop, in private temporary directories."""

    def __init__(self, tmp: pathlib.Path, plugin_dir: str, strategies: tuple[str, ...]):
        self.node = tmp / "node.yaml"
        self.node.write_text(builtin_text("dgx-a100-mig"))
        self.cdi = tmp / "cdi"
        self.cdi.mkdir()
        (self.cdi / FOREIGN).write_text(FOREIGN_TEXT)
        self.plugin_dir = plugin_dir  # short: unix socket paths (the short_tmp fixture)
        self.kubelet = KubeletStandin(self.plugin_dir)
        self.daemon = Daemon(SimulatedSource(str(self.node), debounce_s=0.05),
                             DaemonOptions(plugin_dir=self.plugin_dir, cdi_spec_dir=str(self.cdi)), options(strategies))
        self.stop = asyncio.Event()
        #: Spec files present when the kubelet first saw each resource's devices.
        self.files_at_first_list: dict[str, list[str]] = {}

    async def __aenter__(self) -> Running:
        await self.kubelet.start()
        self.task = asyncio.create_task(self.daemon.run(self.stop, install_signals=False))
        return self

    async def __aexit__(self, *exc) -> None:
        self.stop.set()
        await self.task
        await self.kubelet.stop()

    def ours(self) -> list[str]:
        return sorted(n for n in os.listdir(self.cdi) if n != FOREIGN)

    async def wait_listed(self, *names: str) -> None:
        def seen() -> bool:
            for n in names:
                if self.kubelet.devices(n) and n not in self.files_at_first_list:
                    self.files_at_first_list[n] = self.ours()
            return all(self.kubelet.devices(n) for n in names)

        await self.kubelet.wait_for(seen, timeout=15)

    def spec(self, file_name: str) -> dict:
        return json.loads((self.cdi / file_name).read_text())


def index_names(spec: dict) -> list[str]:
    return [d["name"] for d in spec["devices"] if not d["name"].startswith("MIG-")]


async def test_specs_written_before_devices_are_listed_and_names_resolve(tmp_path, short_tmp, cdi_validator):
    async with Running(tmp_path, short_tmp, ("cdi-cri", "cdi-annotations")) as run:
        await run.wait_listed(GPU_SHARED, MIG_HALF, MIG_3G, "topo.dev/nic")
        want = ["topo-dp.nvidia.com-gpu_shared.json", "topo-dp.nvidia.com-mig-1g_10gb_half.json",
                "topo-dp.nvidia.com-mig-2g_20gb.json", "topo-dp.nvidia.com-mig-3g_40gb.json",
                "topo-dp.nvidia.com-mig-7g_80gb.json"]
        assert run.ours() == want  # simulated NICs have no device node to inject: no NIC spec
        assert all(files == want for files in run.files_at_first_list.values()), run.files_at_first_list
        # two replicas of GPU7 (the only GPU not in MIG mode): the GPU once
        resp = await run.kubelet.allocate(GPU_SHARED, ["7::0", "7::3"])
        assert [c.name for c in resp.cdi_devices] == ["topo-dp.nvidia.com/gpu_shared=7"]
        assert resp.envs["NVIDIA_VISIBLE_DEVICES"] == "void"  # CDI alone: NVIDIA's hook must add nothing
        key = "cdi.k8s.io/topo-device-plugin_nvidia.com_gpu.shared"
        assert resp.annotations[key] == "topo-dp.nvidia.com/gpu_shared=7"
        half = await run.kubelet.allocate(MIG_HALF, ["1:2::0", "1:2::1", "5:0::1"])
        assert [c.name for c in half.cdi_devices] == ["topo-dp.nvidia.com/mig-1g_10gb_half=1:2",
                                                      "topo-dp.nvidia.com/mig-1g_10gb_half=5:0"]
        big = await run.kubelet.allocate(MIG_3G, ["3:1"])
        names = [[c.name for c in r.cdi_devices] for r in (resp, half, big)]
        report = cdi_validator.run(run.cdi, inject=names)
        assert report.ok, json.dumps(report.report, indent=1)
        for inj, parents in zip(report.report["injections"], (["/dev/nvidia7"], ["/dev/nvidia1", "/dev/nvidia5"],
                                                              ["/dev/nvidia3"])):
            assert inj["error"] is None and not inj["unresolved"]
            paths = {n["path"] for n in inj["deviceNodes"]}
            assert set(parents) <= paths and "/dev/nvidiactl" in paths, paths
        # NVIDIA's spec beside ours: both load, no device is defined twice
        assert "nvidia.com/gpu=all" in report.report["devices"] and not report.report["cacheErrors"]


async def test_specs_follow_the_node_and_leave_with_the_daemon(tmp_path, short_tmp):
    async with Running(tmp_path, short_tmp, ("envvar", "cdi-cri")) as run:
        await run.wait_listed(GPU_SHARED, MIG_3G)
        before = run.spec("topo-dp.nvidia.com-mig-3g_40gb.json")
        assert index_names(before) == ["0:0", "3:0", "3:1", "6:0"]  # (each also by its MIG UUID)
        resp = await run.kubelet.allocate(MIG_3G, ["6:0"])
        # envvar and CDI together: the IDs for NVIDIA's hook (driver libraries), device nodes through CDI
        assert resp.envs["NVIDIA_VISIBLE_DEVICES"] == "6:0"
        assert [c.name for c in resp.cdi_devices] == ["topo-dp.nvidia.com/mig-3g_40gb=6:0"]
        # GPU6 loses its MIG devices, GPU7 goes away: specs are replaced and removed as the node changes
        data = yaml.safe_load(run.node.read_text())
        data["gpus"][6]["mig"] = [{"profile": "7g.80gb"}]
        data["gpus"] = data["gpus"][:7]
        for link in data["links"]:
            link["devices"] = [d for d in link["devices"] if d != "GPU7"]
        data["links"] = [link for link in data["links"] if len(link["devices"]) > 1]
        tmp = run.node.with_suffix(".tmp")
        tmp.write_text(yaml.safe_dump(data, sort_keys=False))
        tmp.rename(run.node)
        await run.kubelet.wait_for(lambda: set(run.kubelet.devices(MIG_3G)) == {"0:0", "3:0", "3:1"}, timeout=15)
        after = run.spec("topo-dp.nvidia.com-mig-3g_40gb.json")
        assert index_names(after) == ["0:0", "3:0", "3:1"]
        assert "topo-dp.nvidia.com-gpu_shared.json" not in run.ours()  # no whole GPU is left to share
        assert not [n for n in os.listdir(run.cdi) if n.endswith(".tmp")]
    assert run.ours() == []
    assert (run.cdi / FOREIGN).read_text() == FOREIGN_TEXT


async def test_envvar_daemon_never_touches_the_spec_directory(tmp_path, short_tmp):
    async with Running(tmp_path, short_tmp, ("envvar",)) as run:
        stale = run.cdi / "topo-dp.nvidia.com-gpu.json"  # left by an earlier run: not this daemon's business
        stale.write_text("{}")
        await run.wait_listed(GPU_SHARED)
        resp = await run.kubelet.allocate(GPU_SHARED, ["7::1"])
        assert not resp.cdi_devices and resp.envs["NVIDIA_VISIBLE_DEVICES"] == "7"
    assert sorted(os.listdir(run.cdi)) == sorted([FOREIGN, stale.name])


def test_serve_stops_with_the_fix_when_the_spec_directory_cannot_be_written(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    r = CliRunner().invoke(cli, ["serve", "--simulate", "dgx-a100", "--device-list-strategy", "cdi-cri",
                                 "--cdi-spec-dir", str(blocker / "cdi"), "--device-plugin-path", str(tmp_path / "dp")])
    assert r.exit_code == 1, r.output
    assert f"CDI spec {blocker / 'cdi'}/topo-dp.nvidia.com-gpu.json: Not a directory" in r.output, r.output
    # The fix names what is in the way (the file above the directory), not the directory.
    assert f"(fix: {blocker} is not a directory: remove or rename it" in r.output, r.output
    assert "--cdi-spec-dir" in r.output and "Traceback" not in r.output
    assert not (tmp_path / "dp" / "topo-nvidia.com-gpu.sock").exists()


@pytest.mark.parametrize("strategy", ["cdi-cri", "cdi-annotations"])
def test_external_specs_keep_the_vendor_names(strategy):
    """--cdi-specs external: names of a spec another tool wrote (nvidia-ctk), as before; nothing is written."""
    from plugin.model.resources import build_resources
    from plugin.sources.simulated import load_simulated

    o = ResourceOptions(gpu_allocate=GpuAllocateOptions(device_list_strategy=(strategy,), cdi_specs="external"))
    (gpu, *_) = build_resources(load_simulated("dgx-a100"), o)
    assert gpu.cdi_spec is None
    first = gpu.devices[0]
    resp = gpu.allocate([first.id])
    names = list(resp.cdi_devices) or resp.annotations["cdi.k8s.io/topo-device-plugin_nvidia.com_gpu"].split(",")
    assert names == [f"nvidia.com/gpu={first.id}"]
