"""`--nic-id-strategy pci`: NICs known to the kubelet by their PCI address, as Multus and its CNIs need.

Multus hands the device-plugin ID it reads from the kubelet's pod-resources API to the
delegate CNI as `runtimeConfig.deviceID`; host-device and sriov-cni look the function up as
/sys/bus/pci/devices/<ID>. So the ID the kubelet sees, the `PCIDEVICE_*` variable and the
`_INFO` JSON must all be the PCI address, and GPU–NIC pairing must work on those IDs.
The daemon runs in this process on real unix sockets; the kubelet stand-in drives it over gRPC.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import pathlib
from collections.abc import AsyncIterator

import pytest
import yaml

from plugin.model.resources import ResourceOptions, build_resources
from plugin.runtime.daemon import Daemon, DaemonOptions
from plugin.sources.errors import TopologyError
from plugin.sources.simulated import builtin_text, load_simulated
from plugin.sources.simulated.source import SimulatedSource
from topo_testkit.kubelet_standin import KubeletStandin

GPU, NIC = "nvidia.com/gpu", "topo.dev/nic"
ENV = "PCIDEVICE_TOPO_DEV_NIC"


@pytest.fixture
def plugin_dir(short_tmp: str) -> str:
    return short_tmp  # unix socket paths must stay short (tests/conftest.py)


def bdf(i: int) -> str:
    """The made-up PCI address of the DGX H100's NIC i (upper case and NVML's 8-digit domain on purpose)."""
    return f"0000:{0x1a + 0x10 * i:02x}:00.0"


def node_file(tmp_path: pathlib.Path, drop: int | None = None, same: bool = False) -> str:
    """The built-in DGX H100 with a pciBusId per NIC, written as NVML would (`00000000:1A:00.0`)."""
    data = yaml.safe_load(builtin_text("dgx-h100"))
    for i, nic in enumerate(data["nics"]):
        if i != drop:
            nic["pciBusId"] = ("0000" + bdf(0 if same else i)).upper()
    path = tmp_path / "node.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


@contextlib.asynccontextmanager
async def daemon(plugin_dir: str, source: str) -> AsyncIterator[KubeletStandin]:
    kubelet = KubeletStandin(plugin_dir)
    await kubelet.start()
    d = Daemon(SimulatedSource(source), DaemonOptions(plugin_dir=plugin_dir),
               ResourceOptions(device_id_strategy="index", nic_id_strategy="pci", pairing_window_s=600.0))
    stop = asyncio.Event()
    task = asyncio.create_task(d.run(stop, install_signals=False))
    try:
        await kubelet.wait_for(lambda: all(kubelet.devices(r) for r in (GPU, NIC)), timeout=20)
        yield kubelet
    finally:
        stop.set()
        assert await asyncio.wait_for(task, 30) == 0
        await kubelet.stop()


async def test_the_kubelet_sees_pci_addresses_and_pairing_picks_the_gpus_own_nic(plugin_dir, tmp_path):
    async with daemon(plugin_dir, node_file(tmp_path)) as kubelet:
        assert sorted(kubelet.devices(NIC)) == sorted(bdf(i) for i in range(8))
        await kubelet.allocate(GPU, ["5", "2"])
        picked = await kubelet.preferred(NIC, sorted(kubelet.devices(NIC)), [], 2)
        resp = await kubelet.allocate(NIC, picked)
    assert sorted(picked) == sorted([bdf(2), bdf(5)])  # GPU2's and GPU5's PIX NICs
    assert sorted(resp.envs[ENV].split(",")) == sorted(picked)
    info = json.loads(resp.envs[ENV + "_INFO"])
    assert {k: v["generic"]["deviceID"] for k, v in info.items()} == {b: b for b in picked}


def test_the_default_keeps_the_names_of_the_node_file(tmp_path):
    topology = load_simulated(node_file(tmp_path))
    nics = next(r for r in build_resources(topology, ResourceOptions()) if r.name == NIC)
    assert sorted(d.id for d in nics.devices) == [f"mlx5_{i}" for i in range(8)]


@pytest.mark.parametrize("case, words", [
    ("missing", ["mlx5_3", "no PCI address", "pciBusId", "--nic-id-strategy name"]),
    ("same", ["not unique", bdf(0), "own pciBusId"]),
])
def test_a_nic_without_a_usable_pci_address_is_refused_with_the_fix(tmp_path, case, words):
    path = node_file(tmp_path, drop=3 if case == "missing" else None, same=case == "same")
    with pytest.raises(TopologyError) as e:
        build_resources(load_simulated(path), ResourceOptions(nic_id_strategy="pci"))
    for w in words:
        assert w in str(e.value)
