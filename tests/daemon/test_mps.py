"""NVIDIA's `sharing.mps` through the real daemon over real sockets, with a stand-in MPS control program.

What an operator would notice: the replicas turn Healthy only once the control
daemon answers and has its defaults; Allocate hands the container the pipe
directory and its share's limits; a control daemon that dies takes every
replica of its GPUs Unhealthy until it is restarted; the daemon's stop quits it.
The stand-in (tests/support/mps_standin) records what it was told.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal

import grpc
import pytest

from plugin.sources.simulated import load_simulated

GPU = "nvidia.com/gpu"
STANDIN = str(pathlib.Path(__file__).resolve().parents[1] / "support" / "mps_standin" / "nvidia-cuda-mps-control")
MPS_CONFIG = """version: v1
sharing:
  mps:
    resources:
    - name: nvidia.com/gpu
      replicas: 4
"""


@pytest.fixture
def mps_root(short_tmp) -> pathlib.Path:
    """The MPS root in a short directory: the control daemon's pipe directory holds a unix socket, and a path
    past 107 bytes cannot be bound (pytest's tmp_path under workers is longer)."""
    return pathlib.Path(short_tmp) / "mps"


@pytest.fixture(autouse=True)
def no_standin_left(mps_root):
    """A daemon the fixture kills cannot quit its control daemon: end what a test left, by its pid file."""
    yield
    for pid_file in mps_root.glob("*/pipe/nvidia-cuda-mps-control.pid"):
        try:
            os.kill(int(pid_file.read_text()), signal.SIGTERM)
        except (ProcessLookupError, ValueError):
            pass


def records(root: pathlib.Path) -> list[dict]:
    path = root / "nvidia.com_gpu" / "log" / "standin.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def health(kubelet) -> set[str]:
    return {d.health for d in kubelet.devices(GPU).values()}


def start(start_daemon, tmp_path: pathlib.Path, root: pathlib.Path) -> tuple[object, pathlib.Path]:
    config = tmp_path / "c.yaml"
    config.write_text(MPS_CONFIG)
    daemon = start_daemon("--config", str(config), "--mps-root", str(root), "--mps-control-binary", STANDIN,
                          strategy="uuid")
    return daemon, root


async def test_replicas_turn_healthy_once_the_control_daemon_has_its_defaults(kubelet, start_daemon, tmp_path, mps_root):
    _, root = start(start_daemon, tmp_path, mps_root)
    await kubelet.wait_for(lambda: len(kubelet.devices(GPU)) == 32 and health(kubelet) == {"Healthy"}, timeout=60)
    uuids = list(dict.fromkeys(i.split("::")[0] for i in kubelet.devices(GPU)))  # the simulated GPUs' UUIDs
    told = records(root)
    assert told[0]["event"] == "start"
    assert told[0]["CUDA_VISIBLE_DEVICES"].split(",") == uuids and len(uuids) == 8
    commands = [r["command"] for r in told if r["event"] == "command" and r["command"] != "get_server_list"]
    memory = load_simulated("dgx-a100").gpus[0].memory_mib
    assert memory
    mib = memory // 4
    assert commands == [f"set_default_device_pinned_mem_limit {n} {mib}M" for n in range(8)] + \
        ["set_default_active_thread_percentage 25"]
    assert (root / "nvidia.com_gpu" / ".ready").exists()

    replica = next(i for i in kubelet.devices(GPU) if i.startswith(uuids[3]))
    resp = await kubelet.allocate(GPU, [replica])
    assert resp.envs["NVIDIA_VISIBLE_DEVICES"] == uuids[3]
    assert resp.envs["CUDA_MPS_PIPE_DIRECTORY"] == "/mps/nvidia.com_gpu/pipe"
    assert resp.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert resp.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"0={mib}M"
    mounts = [(m.container_path, m.host_path, m.read_only) for m in resp.mounts]
    assert ("/mps/nvidia.com_gpu/pipe", str(root / "nvidia.com_gpu" / "pipe"), False) in mounts
    assert ("/dev/shm", str(root / "shm"), False) in mounts  # where MPS clients meet their server

    two = [i for i in kubelet.devices(GPU) if i.startswith(uuids[0])][:1] + [replica]
    try:
        await kubelet.allocate(GPU, two)
    except grpc.aio.AioRpcError as e:
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and "sharing.mps" in e.details(), e.details()
    else:
        raise AssertionError("two MPS replicas went to one container")


async def test_a_dead_control_daemon_takes_its_replicas_unhealthy_until_restarted(kubelet, start_daemon, tmp_path, mps_root):
    daemon, root = start(start_daemon, tmp_path, mps_root)
    await kubelet.wait_for(lambda: len(kubelet.devices(GPU)) == 32 and health(kubelet) == {"Healthy"}, timeout=60)
    pid = int((root / "nvidia.com_gpu" / "pipe" / "nvidia-cuda-mps-control.pid").read_text())
    os.kill(pid, signal.SIGKILL)
    await kubelet.wait_for(lambda: health(kubelet) == {"Unhealthy"}, timeout=60)
    await kubelet.wait_for(lambda: health(kubelet) == {"Healthy"}, timeout=60)
    starts = [r for r in records(root) if r["event"] == "start"]
    assert len(starts) == 2 and starts[1]["pid"] != pid
    assert "MPS control daemon stopped answering" in daemon.log()

    assert await daemon.terminate(timeout=60) == 0
    assert records(root)[-1]["event"] == "quit"
    assert not (root / "nvidia.com_gpu" / ".ready").exists()


async def test_a_missing_control_program_keeps_the_replicas_unhealthy_and_says_how_to_fix(
        kubelet, start_daemon, tmp_path, mps_root):
    config = tmp_path / "c.yaml"
    config.write_text(MPS_CONFIG)
    daemon = start_daemon("--config", str(config), "--mps-root", str(mps_root),
                          "--mps-control-binary", str(tmp_path / "no-such-program"))
    await kubelet.wait_for(lambda: len(kubelet.devices(GPU)) == 32, timeout=60)
    assert health(kubelet) == {"Unhealthy"}
    await kubelet.wait_for(lambda: "--mps-control-binary" in daemon.log(), timeout=60)
    assert "not found" in daemon.log()
