"""NVLink fabric clique from NVML (`nvmlDeviceGetGpuFabricInfoV`, or the older call), and the DRA
`clique` attribute it becomes; absent, quietly, where the driver or the GPU has no fabric."""

from __future__ import annotations

import logging
from dataclasses import replace

import pytest

from allocator.topology import FabricInfo, NodeTopology
from plugin.dra.slices.build import SliceOptions, build_devices
from plugin.sources import load_simulated
from plugin.sources.nvml_gpus import discover_gpus
from topo_testkit.fake_nvml import FakeNvml

CLUSTER = "8a3e5c71-2d4f-4b96-a0e8-5f7c1b9d2e43"
NEW, OLD = "nvmlDeviceGetGpuFabricInfoV", "nvmlDeviceGetGpuFabricInfo"


def fake_with_fabric(state: str = "completed", **kw) -> FakeNvml:
    fake = FakeNvml(load_simulated("dgx-a100"), **kw)
    for g in fake.gpus:
        fake.set_fabric(g.device.name, FabricInfo(CLUSTER, 7, state))
    return fake


def gpus(fake: FakeNvml, tmp_path) -> list:
    devices, _ = discover_gpus(fake, fake.write_sysfs(str(tmp_path / "sys")))
    return [d for d in devices if d.kind.value == "gpu"]


def test_completed_fabric_gives_every_gpu_its_clique(tmp_path):
    fake = fake_with_fabric()
    found = gpus(fake, tmp_path)
    assert {d.fabric for d in found} == {FabricInfo(CLUSTER, 7, "completed")}
    assert found[0].fabric.clique == f"{CLUSTER}.7"
    assert fake.calls[NEW] == len(found) and fake.calls[OLD] == 0


def test_a_driver_without_the_versioned_call_is_asked_the_older_one(tmp_path):
    fake = fake_with_fabric(missing_functions={NEW})
    found = gpus(fake, tmp_path)
    assert {d.fabric.clique for d in found} == {f"{CLUSTER}.7"}
    assert fake.calls[OLD] == len(found)


def test_a_driver_without_either_call_reports_no_fabric_and_no_error(tmp_path, caplog):
    fake = fake_with_fabric(missing_functions={NEW, OLD})
    with caplog.at_level(logging.DEBUG, logger="plugin.sources.nvml_gpus"):
        found = gpus(fake, tmp_path)
    assert found and all(d.fabric is None for d in found)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert any("fabric" in r.getMessage() for r in caplog.records)  # said at debug level


@pytest.mark.parametrize("state", ["not-started", "in-progress", "not-supported"])
def test_a_fabric_not_yet_set_up_is_no_clique(tmp_path, state):
    assert all(d.fabric is None for d in gpus(fake_with_fabric(state), tmp_path))


def test_gpus_without_a_fabric_answer_not_supported_and_get_none(tmp_path):
    fake = FakeNvml(load_simulated("dgx-a100"))
    found = gpus(fake, tmp_path)
    assert all(d.fabric is None for d in found) and fake.calls[NEW] == len(found)


def test_dra_slices_carry_the_clique_on_gpus_only_when_completed(tmp_path):
    t = load_simulated("dgx-a100")
    done = FabricInfo(CLUSTER, 7)
    gpu0, gpu1 = t.gpus[0].name, t.gpus[1].name
    devices = [replace(d, fabric=done) if d.name == gpu0 else
               replace(d, fabric=FabricInfo(CLUSTER, 7, "in-progress")) if d.name == gpu1 else d
               for d in t.devices]
    topo = NodeTopology.build(devices, t.links, source=t.source, numa_nodes=t.numa_nodes,
                              numa_distances=t.numa_distances)
    entries = {e["name"]: e["attributes"] for e in build_devices(topo, SliceOptions(node_name="n1"))}
    with_clique = [a["clique"] for a in entries.values() if "clique" in a]
    assert with_clique == [{"string": f"{CLUSTER}.7"}]  # GPU0 only: GPU1's fabric is not set up
