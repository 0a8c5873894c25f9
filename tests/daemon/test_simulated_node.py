"""Serving every shared topology, and live edits of a simulated node file reaching ListAndWatch."""

from __future__ import annotations

import os
import pathlib
import time

import pytest
import yaml
from daemon_testlib import until
from topo_testkit import SHARED_DIR

from plugin.sources.simulated import builtin_text

GPU = "nvidia.com/gpu"
TOPOLOGIES = SHARED_DIR / "topologies"

# NUMA node of each GPU, as shared/spec/topology-input.md derives it from the text
# (first node of `NUMA Affinity`; without that column, groups of equal `CPU Affinity`).
EXPECTED_NUMA = {
    "02-hgx-a100-8gpu-nv12-17nic-niclegend.txt": [0] * 8,
    "04-dgx1-8gpu-nv1-nv2-4nic-no-numa.txt": [0, 0, 0, 0, 1, 1, 1, 1],
    "07-pcie-3x-rtxa6000-nvlink-bridge-nv4-pair.txt": [0, 0, 0],
    "11-gh200-quad-4gpu-nv6-gpu-numa-id.txt": [0, 1, 2, 3],
    "13-ibm-power9-4x-v100-nv3-pairs-4nic.txt": [0, 0, 8, 8],
    "14-hgx-h100-8gpu-nv18-6nic-empty-cpu-affinity.txt": [0, 0, 0, 0, 1, 1, 1, 1],
    "21-pcie-8x-l40s-dual-socket-node-sys-1nic.txt": [0, 0, 0, 0, 1, 1, 1, 1],
    "23-pcie-2x-k80-4gpu-mlx4-old-soc-legend.txt": [0, 0, 0, 0],
}


def test_expectations_cover_every_shared_topology(shared_topologies):
    assert sorted(p.name for p in shared_topologies) == sorted(EXPECTED_NUMA)


@pytest.mark.parametrize("name", sorted(EXPECTED_NUMA))
async def test_serves_shared_topology_with_index_ids_and_numa(kubelet, start_daemon, name):
    start_daemon(simulate=str(TOPOLOGIES / name))
    await kubelet.wait_for(lambda: bool(kubelet.devices(GPU)), timeout=10)
    devs = kubelet.devices(GPU)
    n = len(EXPECTED_NUMA[name])
    assert sorted(devs, key=int) == [str(i) for i in range(n)]
    assert [devs[str(i)].numa for i in range(n)] == [(x,) for x in EXPECTED_NUMA[name]]


@pytest.fixture
def node_file(tmp_path) -> pathlib.Path:
    path = tmp_path / "node.yaml"
    path.write_text(builtin_text("pcie-2socket-4gpu-2nic"))
    return path


def edit(path: pathlib.Path, change) -> float:
    """Rewrite the file the way editors and ConfigMaps do (write a temp file, rename over)."""
    data = yaml.safe_load(path.read_text())
    change(data)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(data, sort_keys=False))
    started = time.monotonic()
    os.replace(tmp, path)
    return started


async def test_edits_reach_open_stream_within_one_second(kubelet, start_daemon, node_file):
    daemon = start_daemon(simulate=str(node_file))
    await kubelet.wait_for(lambda: len(kubelet.devices(GPU)) == 4, timeout=10)

    def unhealthy(data):
        data["gpus"][2]["health"] = "Unhealthy"

    edit(node_file, unhealthy)
    await kubelet.wait_for(lambda: kubelet.devices(GPU)["2"].health == "Unhealthy", timeout=1.0)
    assert [kubelet.devices(GPU)[i].health for i in "013"] == ["Healthy"] * 3

    def remove_last(data):
        data["gpus"].pop()
        data["links"] = [entry for entry in data["links"] if "GPU3" not in entry["devices"]]

    edit(node_file, remove_last)
    await kubelet.wait_for(lambda: sorted(kubelet.devices(GPU)) == ["0", "1", "2"], timeout=1.0)
    assert len(kubelet.registrations_of(GPU)) == 1  # a change is a new list on the same stream
    assert daemon.proc.poll() is None


async def test_broken_edit_is_logged_and_ignored(kubelet, start_daemon, node_file):
    daemon = start_daemon(simulate=str(node_file))
    await kubelet.wait_for(lambda: len(kubelet.devices(GPU)) == 4, timeout=10)
    client = kubelet.client(GPU)
    updates = client.updates
    node_file.write_text(node_file.read_text().replace("numa: 1", "numa: one"))

    def ignored() -> list[str]:
        return [x for x in daemon.log().splitlines() if "simulated node edit ignored" in x and "numa" in x]

    await until(lambda: bool(ignored()), 20, "the daemon to log the ignored edit")
    assert str(node_file) in ignored()[0]
    assert client.updates == updates
    assert len(kubelet.devices(GPU)) == 4
    assert daemon.proc.poll() is None
    # a good edit afterwards still applies, as the one update since the broken edit
    node_file.write_text(builtin_text("pcie-2socket-4gpu-2nic").replace("{name: GPU1, numa: 0,",
                                                                         "{name: GPU1, numa: 0, health: Unhealthy,"))
    await kubelet.wait_for(lambda: kubelet.devices(GPU)["1"].health == "Unhealthy", timeout=2.0)
    assert client.updates == updates + 1
