"""Time-slicing through the real daemon over real sockets: NVIDIA's config unchanged, replicas on the wire,
Allocate per physical GPU, `failRequestsGreaterThanOne`, and a GPU's health reaching all its replicas at once."""

from __future__ import annotations

import asyncio
import pathlib

import grpc
import yaml

from plugin.api import api_pb2, api_pb2_grpc
from plugin.sources.simulated import builtin_text, load_simulated
from topo_testkit.nvidia_configs import FLAGS_AND_TIME_SLICING, TIME_SLICING

GPU = "nvidia.com/gpu"
SHARED = "nvidia.com/gpu.shared"

NVIDIA_README_TIME_SLICING = TIME_SLICING
# The README's flags as NVIDIA ships them, with time-slicing renamed by default and one replica per container.
NVIDIA_README_FLAGS_AND_SHARING = FLAGS_AND_TIME_SLICING.replace(
    "renameByDefault: false", "renameByDefault: true").replace(
    "failRequestsGreaterThanOne: false", "failRequestsGreaterThanOne: true")


def write(tmp_path: pathlib.Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


async def test_nvidia_readme_config_advertises_80_replicas_with_numa(kubelet, start_daemon, tmp_path):
    start_daemon("--config", write(tmp_path, "c.yaml", NVIDIA_README_TIME_SLICING), simulate="dgx-a100")
    await kubelet.wait_for(lambda: len(kubelet.devices(GPU)) == 80, timeout=15)
    gpus = {str(d.index): d.numa for d in load_simulated("dgx-a100").gpus}
    devices = kubelet.devices(GPU)
    assert sorted(devices) == sorted(f"{g}::{r}" for g in gpus for r in range(10))
    for i, d in devices.items():
        assert d.numa == (gpus[i.split("::")[0]],) and d.health == "Healthy"


async def test_nvidia_flags_and_rename_by_default(kubelet, start_daemon, tmp_path):
    daemon = start_daemon("--config", write(tmp_path, "c.yaml", NVIDIA_README_FLAGS_AND_SHARING),
                          "--simulate", "dgx-a100", "--device-plugin-path", kubelet.plugin_dir, raw=True)
    await kubelet.wait_for(lambda: len(kubelet.devices(SHARED)) == 80, timeout=15)
    assert GPU not in kubelet.clients  # every GPU is shared: nothing is left to serve whole
    ids = list(kubelet.devices(SHARED))
    assert all(i.startswith("GPU-") and "::" in i for i in ids)  # deviceIDStrategy: uuid, NVIDIA's replica IDs
    # passDeviceSpecs: false with envvar (NVIDIA's runtime hook makes the nodes): ours still pass them, and say so
    assert "passDeviceSpecs false has no effect without a CDI device list strategy" in daemon.log()


async def test_allocate_names_each_gpu_once(kubelet, start_daemon, tmp_path):
    config = NVIDIA_README_TIME_SLICING.replace("replicas: 10", "replicas: 4")
    start_daemon("--config", write(tmp_path, "c.yaml", config))
    await kubelet.wait_for(lambda: len(kubelet.devices(GPU)) == 32, timeout=15)
    resp = await kubelet.allocate(GPU, ["3::0", "3::2", "5::1"])
    assert resp.envs["NVIDIA_VISIBLE_DEVICES"] == "3,5"
    resp = await kubelet.allocate(GPU, ["6::3"])
    assert resp.envs["NVIDIA_VISIBLE_DEVICES"] == "6"


async def test_fail_requests_greater_than_one_is_invalid_argument(kubelet, start_daemon, tmp_path, plugin_dir):
    config = NVIDIA_README_FLAGS_AND_SHARING.replace('deviceIDStrategy: "uuid"', 'deviceIDStrategy: "index"')
    start_daemon("--config", write(tmp_path, "c.yaml", config), "--simulate", "dgx-a100",
                 "--device-plugin-path", plugin_dir, raw=True)
    await kubelet.wait_for(lambda: len(kubelet.devices(SHARED)) == 80, timeout=15)
    try:
        await kubelet.allocate(SHARED, ["0::0", "1::0"])
    except grpc.aio.AioRpcError as e:
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "failRequestsGreaterThanOne" in e.details() and "maximum request size for shared resources is 1" \
            in e.details(), e.details()
    else:
        raise AssertionError("two replicas were allocated despite failRequestsGreaterThanOne")
    resp = await kubelet.allocate(SHARED, ["4::7"])  # one replica is fine, and the daemon still serves
    assert resp.envs["NVIDIA_VISIBLE_DEVICES"] == "4"
    # GetPreferredAllocation is not refused (as NVIDIA's): the kubelet asks before it allocates
    assert len(await kubelet.preferred(SHARED, list(kubelet.devices(SHARED)), [], 1)) == 1


async def test_unhealthy_gpu_turns_all_its_replicas_unhealthy_in_one_update(kubelet, start_daemon, tmp_path,
                                                                            plugin_dir):
    node = tmp_path / "node.yaml"
    node.write_text(builtin_text("dgx-a100"))
    config = NVIDIA_README_TIME_SLICING.replace("replicas: 10", "replicas: 6")
    start_daemon("--config", write(tmp_path, "c.yaml", config), simulate=str(node))
    await kubelet.wait_for(lambda: len(kubelet.devices(GPU)) == 48, timeout=15)
    endpoint = kubelet.registrations_of(GPU)[-1].endpoint
    async with grpc.aio.insecure_channel(f"unix:{plugin_dir}/{endpoint}") as channel:
        stream = api_pb2_grpc.DevicePluginStub(channel).ListAndWatch(api_pb2.Empty())
        first = await stream.read()
        assert {d.health for d in first.devices} == {"Healthy"}
        data = yaml.safe_load(node.read_text())
        data["gpus"][3]["health"] = "Unhealthy"
        tmp = node.with_suffix(".tmp")
        tmp.write_text(yaml.safe_dump(data, sort_keys=False))
        tmp.rename(node)
        update = await asyncio.wait_for(stream.read(), timeout=15)
        stream.cancel()
    health = {d.ID: d.health for d in update.devices}
    assert len(health) == 48
    assert {h for i, h in health.items() if i.startswith("3::")} == {"Unhealthy"}
    assert {h for i, h in health.items() if not i.startswith("3::")} == {"Healthy"}
    # and Allocate refuses a replica of the unhealthy GPU
    await kubelet.wait_for(lambda: kubelet.devices(GPU)["3::0"].health == "Unhealthy", timeout=15)
    try:
        await kubelet.allocate(GPU, ["3::0"])
    except grpc.aio.AioRpcError as e:
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and "unhealthy" in e.details()
    else:
        raise AssertionError("a replica of an unhealthy GPU was allocated")


async def test_mps_of_mig_devices_stops_start_up_with_exit_2(start_daemon, tmp_path):
    """MPS itself is served (tests/daemon/test_mps.py); MIG devices under MPS are refused, as NVIDIA does."""
    config = "version: v1\nsharing:\n  mps:\n    resources:\n    - {name: nvidia.com/mig-3g.40gb, replicas: 2}\n"
    daemon = start_daemon("--config", write(tmp_path, "c.yaml", config), "--mig-strategy", "mixed",
                          simulate="dgx-a100-mig")
    assert await daemon.wait(15) == 2
    log = daemon.log()
    assert "c.yaml:5: field sharing.mps.resources[0].name" in log and "only whole GPUs" in log, log


async def test_time_slicing_changes_live_and_a_change_this_node_cannot_serve_is_refused_whole(
        kubelet, start_daemon, tmp_path, plugin_dir):
    config = tmp_path / "c.yaml"
    config.write_text("version: v1\n")
    node = tmp_path / "node.yaml"
    node.write_text(builtin_text("dgx-a100"))
    daemon = start_daemon("--config", str(config), simulate=str(node))
    await kubelet.wait_for(lambda: len(kubelet.devices(GPU)) == 8, timeout=15)
    tmp = tmp_path / "c.tmp"
    tmp.write_text(TIME_SLICING.replace("replicas: 10", "replicas: 2"))
    tmp.rename(config)
    await kubelet.wait_for(lambda: len(kubelet.devices(GPU)) == 16, timeout=15)
    # valid YAML, but this node has 8 GPUs, not 9: logged, the running configuration stays
    tmp.write_text(TIME_SLICING.replace("replicas: 10", "replicas: 2\n      devices: 9\n      rename: x"))
    tmp.rename(config)
    for _ in range(150):
        if "config change ignored" in daemon.log():
            break
        await asyncio.sleep(0.1)
    assert "9 devices requested but nvidia.com/gpu has only 8 on this node" in daemon.log()
    # and the daemon still follows the node: a GPU turning unhealthy reaches its replicas
    data = yaml.safe_load(node.read_text())
    data["gpus"][2]["health"] = "Unhealthy"
    node.with_suffix(".tmp").write_text(yaml.safe_dump(data, sort_keys=False))
    node.with_suffix(".tmp").rename(node)
    await kubelet.wait_for(lambda: {d.health for i, d in kubelet.devices(GPU).items() if i.startswith("2::")}
                           == {"Unhealthy"}, timeout=15)
    assert len(kubelet.devices(GPU)) == 16 and "nvidia.com/x" not in kubelet.clients
