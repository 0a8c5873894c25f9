"""MPS through claim config: `GpuConfig` `strategy: MPS`, one control daemon per GPU, the claim's CDI edits.

The kubelet side runs over real gRPC on real unix sockets against the stand-in API server (as
test_gpu_sharing.py); the MPS control program is the stand-in of tests/support/mps_standin, a
real executable that records what it was told. What a user would notice: the container's CDI
spec mounts the GPU's pipe directory and sets the claim's limits; two claims on one GPU share
one control daemon, which quits with the last of them.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal

import pytest

from kubelet_standin import register, registration_sockets
from plugin.dra import DraOptions, SliceOptions
from plugin.runtime.compose.dra import dra_driver
from plugin.dra.claims.opaque import OpaqueConfig
from plugin.dra.claims.gpu_config import NVIDIA_API_VERSION, parse_gpu_config
from plugin.dra.slices.build import device_table

NODE = "node-a"
DRIVER = "topo.dev"
STANDIN = str(pathlib.Path(__file__).resolve().parents[1] / "support" / "mps_standin" / "nvidia-cuda-mps-control")


def mps_config(**mps) -> dict:
    sharing: dict = {"strategy": "MPS"}
    if mps:
        sharing["mpsConfig"] = mps
    return {"apiVersion": NVIDIA_API_VERSION, "kind": "GpuConfig", "sharing": sharing}


def entry(params, requests=()) -> dict:
    return {"source": "FromClaim", "requests": list(requests), "opaque": {"driver": DRIVER, "parameters": params}}


def test_nvidias_mps_config_reads_with_its_quantities():
    got = parse_gpu_config(OpaqueConfig(source="FromClaim", requests=(), index=0, parameters=mps_config(
        defaultActiveThreadPercentage=40, defaultPinnedDeviceMemoryLimit="10Gi",
        defaultPerDevicePinnedMemoryLimit={"0": "5G"})))
    assert got is not None and got.timeslice is None and got.mps is not None
    assert (got.mps.active_thread_percentage, got.mps.pinned_mib) == (40, 10240)
    assert dict(got.mps.per_device_pinned_mib) == {"0": 5 * 10**9 // (1 << 20)}


@pytest.fixture
def roots(short_tmp):
    return os.path.join(short_tmp, "kubelet"), os.path.join(short_tmp, "cdi"), os.path.join(short_tmp, "mps")


@pytest.fixture
async def plugin(roots, kube_api, dgx_h100):
    opts = DraOptions(slices=SliceOptions(node_name=NODE, driver_name=DRIVER), kubelet_root=roots[0],
                      cdi_root=roots[1], instance_id="pod-0", resync_s=3600, mps_root=roots[2],
                      mps_control_binary=STANDIN)
    drv = dra_driver(opts, kube_api)
    await drv.start(dgx_h100)
    try:
        yield await register(registration_sockets(roots[0])[-1])
    finally:
        await drv.stop()
        for pid_file in pathlib.Path(roots[2]).glob("*/pipe/nvidia-cuda-mps-control.pid"):
            try:  # a test that failed half-way: end the stand-in daemon it left
                os.kill(int(pid_file.read_text()), signal.SIGTERM)
            except (ProcessLookupError, ValueError):
                pass


def add_claim(apiserver, name: str, devices: dict[str, str], configs: list[dict]) -> str:
    uid = apiserver.add_claim("team", name, [{"request": r, "driver": DRIVER, "pool": NODE, "device": d}
                                             for r, d in devices.items()])
    apiserver.claims[("team", name)]["status"]["allocation"]["devices"]["config"] = configs
    return uid


def edits_of(roots, uid: str) -> tuple[dict[str, str], list[dict]]:
    with open(os.path.join(roots[1], f"{DRIVER}-claim_{uid}.json"), encoding="utf-8") as f:
        spec = json.load(f)
    env = dict(e.split("=", 1) for d in spec["devices"] for e in d["containerEdits"].get("env", []))
    return env, [m for d in spec["devices"] for m in d["containerEdits"].get("mounts", [])]


def told(roots, uuid: str) -> list[dict]:
    path = os.path.join(roots[2], f"dra-{uuid}", "log", "standin.jsonl")
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


async def test_two_claims_on_a_gpu_share_one_control_daemon_which_quits_with_the_last(
        plugin, roots, apiserver, dgx_h100):
    uuid = device_table(dgx_h100, SliceOptions(node_name=NODE))["gpu-3"].uuid
    first = add_claim(apiserver, "first", {"gpu": "gpu-3"}, [entry(mps_config(
        defaultActiveThreadPercentage=50, defaultPinnedDeviceMemoryLimit="8Gi"))])
    second = add_claim(apiserver, "second", {"gpu": "gpu-3"}, [entry(mps_config(defaultActiveThreadPercentage=25))])
    assert (await plugin.prepare(("team", first, "first"))).claims[first].error == ""
    env, mounts = edits_of(roots, first)
    inside = f"/mps/dra-{uuid}/pipe"
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == inside
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50" and env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=8192M"
    assert mounts == [{"hostPath": os.path.join(roots[2], f"dra-{uuid}", "pipe"), "containerPath": inside,
                       "options": ["rbind", "rw"]},
                      {"hostPath": os.path.join(roots[2], "shm"), "containerPath": "/dev/shm",
                       "options": ["rbind", "rw"]}]
    log = told(roots, uuid)
    assert log[0] == {"event": "start", "pid": log[0]["pid"], "CUDA_VISIBLE_DEVICES": uuid}
    assert [r["command"] for r in log if r["event"] == "command" and r["command"] != "get_server_list"] == [
        "set_default_device_pinned_mem_limit 0 8192M", "set_default_active_thread_percentage 50"]

    assert (await plugin.prepare(("team", second, "second"))).claims[second].error == ""
    env2, _ = edits_of(roots, second)
    assert env2["CUDA_MPS_PIPE_DIRECTORY"] == inside and env2["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" not in env2
    assert len([r for r in told(roots, uuid) if r["event"] == "start"]) == 1, "the second claim joins the daemon"

    assert (await plugin.unprepare(("team", first, "first"))).claims[first].error == ""
    assert told(roots, uuid)[-1]["event"] != "quit", "another claim still holds the daemon"
    assert (await plugin.unprepare(("team", second, "second"))).claims[second].error == ""
    assert told(roots, uuid)[-1]["event"] == "quit"


async def test_an_mps_config_naming_a_nic_request_is_refused_and_starts_nothing(plugin, roots, apiserver):
    uid = add_claim(apiserver, "nic", {"gpu": "gpu-0", "nic": "nic-mlx5-0"}, [entry(mps_config(), requests=["nic"])])
    err = (await plugin.prepare(("team", uid, "nic"))).claims[uid].error
    assert "strategy MPS applies to request 'nic', which got nic-mlx5-0 (nic), not a full GPU" in err, err
    assert not os.path.exists(roots[2]) or not os.listdir(roots[2])
