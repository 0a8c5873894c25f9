"""NVIDIA's `imex.channelIDs` / `imex.required` through the real daemon over real sockets.

What an operator switching from NVIDIA's plugin would notice: with `channelIDs: [0]` every GPU container's
Allocate carries the IMEX channel `/dev/nvidia-caps-imex-channels/channel0` (device spec, NVIDIA's
`NVIDIA_IMEX_CHANNELS` with envvar, the CDI name of our spec with cdi-cri), as NVIDIA's plugin gives it; a
channel the node lacks fails the start with the fix when `required` is true and is left out with a warning
when it is false. The channel node is made with `mknod` (as NVIDIA's CI makes them) where the test runs as
root, with the major the simulated node file states (`imexChannelsMajor`, /proc/devices on a real node).
"""

from __future__ import annotations

import json
import os
import pathlib
import stat

import pytest
import yaml

from plugin.sources.simulated import builtin_text

GPU = "nvidia.com/gpu"
MAJOR = 234
CHANNEL = "/dev/nvidia-caps-imex-channels/channel0"
CONFIG = "version: v1\nimex:\n  channelIDs: [0]\n  required: {required}\n"


def node_file(tmp_path: pathlib.Path, builtin: str = "dgx-a100") -> pathlib.Path:
    """A built-in node with the channels' major stated, as /proc/devices would list it on a real node."""
    data = yaml.safe_load(builtin_text(builtin))
    data["imexChannelsMajor"] = MAJOR
    path = tmp_path / "node.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def dev_root(tmp_path: pathlib.Path, major: int | None = MAJOR) -> pathlib.Path:
    """A --dev-root with channel 0 made by mknod (None: no channel); skips where mknod is not permitted."""
    dev = tmp_path / "dev"
    (dev / "nvidia-caps-imex-channels").mkdir(parents=True)
    if major is not None:
        try:
            os.mknod(dev / "nvidia-caps-imex-channels" / "channel0", 0o666 | stat.S_IFCHR, os.makedev(major, 0))
        except PermissionError:
            pytest.skip("mknod is not permitted here (no CAP_MKNOD): the channel node cannot be made")
    return dev


def config(tmp_path: pathlib.Path, required: bool) -> pathlib.Path:
    path = tmp_path / "c.yaml"
    path.write_text(CONFIG.format(required=str(required).lower()))
    return path


async def test_every_gpu_container_gets_the_channel_node_and_nvidias_variable(kubelet, start_daemon, tmp_path):
    dev = dev_root(tmp_path)
    start_daemon("--config", str(config(tmp_path, True)), "--dev-root", str(dev), simulate=str(node_file(tmp_path)))
    await kubelet.wait_for(lambda: len(kubelet.devices(GPU)) == 8, timeout=60)
    host = str(dev / "nvidia-caps-imex-channels" / "channel0")
    for ids in (["0"], ["3", "5"]):
        resp = await kubelet.allocate(GPU, ids)
        specs = {d.container_path: (d.host_path, d.permissions) for d in resp.devices}
        assert specs[CHANNEL] == (host, "rw"), specs
        assert resp.envs["NVIDIA_IMEX_CHANNELS"] == "0"
        assert resp.envs["NVIDIA_VISIBLE_DEVICES"] == ",".join(ids)
    st = os.stat(host)  # what the runtime finds at the device spec's host path
    assert (os.major(st.st_rdev), os.minor(st.st_rdev)) == (MAJOR, 0)


async def test_with_cdi_alone_the_channel_is_a_device_of_our_spec_named_in_every_answer(
        kubelet, start_daemon, tmp_path):
    dev = dev_root(tmp_path)
    cdi = tmp_path / "cdi"
    cdi.mkdir()
    start_daemon("--config", str(config(tmp_path, True)), "--dev-root", str(dev), "--device-list-strategy", "cdi-cri",
                 "--cdi-spec-dir", str(cdi), "--no-pass-device-specs", simulate=str(node_file(tmp_path)))
    await kubelet.wait_for(lambda: len(kubelet.devices(GPU)) == 8, timeout=60)
    resp = await kubelet.allocate(GPU, ["2"])
    names = [d.name for d in resp.cdi_devices]
    channel = [n for n in names if n.endswith("=imex-channel0")]
    assert len(channel) == 1 and len(names) == 2, names
    assert CHANNEL not in {d.container_path for d in resp.devices}  # CDI alone: the spec carries it
    assert "NVIDIA_IMEX_CHANNELS" not in resp.envs  # NVIDIA sets it with envvar only
    kind, name = channel[0].split("=")
    specs = [json.loads(p.read_text()) for p in cdi.glob("*.json")]
    [spec] = [s for s in specs if s["kind"] == kind]
    [device] = [d for d in spec["devices"] if d["name"] == name]
    [node] = device["containerEdits"]["deviceNodes"]
    assert (node["path"], node["type"], node["major"], node["minor"]) == (CHANNEL, "c", MAJOR, 0)


async def test_a_required_channel_the_node_lacks_stops_the_start_with_the_fix(start_daemon, tmp_path):
    dev = dev_root(tmp_path, major=None)
    daemon = start_daemon("--config", str(config(tmp_path, True)), "--dev-root", str(dev),
                          simulate=str(node_file(tmp_path)))
    assert await daemon.wait(timeout=60) == 2
    log = daemon.log()
    assert "field imex.channelIDs: IMEX channel 0:" in log and "channel0 does not exist" in log
    assert "imex.required: false" in log  # the fix names the way out


async def test_a_node_of_another_device_at_the_channels_path_is_no_channel(start_daemon, tmp_path):
    dev = dev_root(tmp_path, major=MAJOR + 1)
    daemon = start_daemon("--config", str(config(tmp_path, True)), "--dev-root", str(dev),
                          simulate=str(node_file(tmp_path)))
    assert await daemon.wait(timeout=60) == 2
    assert f"has major {MAJOR + 1}, not the {MAJOR} that nvidia-caps-imex-channels has" in daemon.log()


async def test_a_channel_not_required_is_left_out_and_the_gpus_served_without_it(kubelet, start_daemon, tmp_path):
    dev = dev_root(tmp_path, major=None)
    daemon = start_daemon("--config", str(config(tmp_path, False)), "--dev-root", str(dev),
                          simulate=str(node_file(tmp_path)))
    await kubelet.wait_for(lambda: len(kubelet.devices(GPU)) == 8, timeout=60)
    resp = await kubelet.allocate(GPU, ["1"])
    assert CHANNEL not in {d.container_path for d in resp.devices}
    assert "NVIDIA_IMEX_CHANNELS" not in resp.envs
    assert "requested IMEX channel left out" in daemon.log()


async def test_mig_devices_and_time_slicing_replicas_get_the_channel_too(kubelet, start_daemon, tmp_path):
    """NVIDIA gives the channel to every container of the plugin, whatever GPU-family resource it asked for."""
    dev = dev_root(tmp_path)
    cfg = tmp_path / "c.yaml"
    cfg.write_text("version: v1\nflags:\n  migStrategy: mixed\nsharing:\n  timeSlicing:\n    resources:\n"
                   "    - {name: nvidia.com/gpu, replicas: 2}\nimex:\n  channelIDs: [0]\n")
    start_daemon("--config", str(cfg), "--dev-root", str(dev), simulate=str(node_file(tmp_path, "dgx-a100-mig")))
    mig = "nvidia.com/mig-1g.10gb"
    await kubelet.wait_for(lambda: kubelet.devices(mig) and kubelet.devices(GPU), timeout=60)
    replica = next(i for i in kubelet.devices(GPU) if "::" in i)
    for resource, ids in ((mig, [next(iter(kubelet.devices(mig)))]), (GPU, [replica])):
        resp = await kubelet.allocate(resource, ids)
        assert CHANNEL in {d.container_path for d in resp.devices}, (resource, resp.devices)
        assert resp.envs["NVIDIA_IMEX_CHANNELS"] == "0", resource
