"""The NVLink clique as a Node Feature Discovery feature file: content, atomic replacement, and kept
current by the hardware source when the fabric changes (rescan, GPU health event)."""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import replace

import pytest

from allocator.topology import Device, DeviceKind, FabricInfo
from plugin.sources.fabric_labels import CLIQUE_LABEL, FabricLabelFile, clique_of
from plugin.sources.hardware import HardwareOptions, HardwareSource
from plugin.sources.udev_hotplug import UdevUnavailable
from topo_testkit import sysfs_fixture as sf
from topo_testkit.fake_udev import FakeUdev

CLUSTER = sf.NVL72_FABRIC.cluster_uuid


def no_udev(_subsystems):
    raise UdevUnavailable("no udev in this test")


def labels(path) -> dict[str, str]:
    """The labels NFD would make of the file: `key=value` lines, `#` lines are comments."""
    out = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if line and not line.startswith("#"):
                key, _, value = line.partition("=")
                out[key] = value
    return out


async def wait_for(pred, timeout=5.0):
    deadline = asyncio.get_running_loop().time() + timeout
    while not pred():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.01)


def gb200(tmp_path, fabric=sf.NVL72_FABRIC, udev=None):
    node = sf.write_node(sf.gb200_cx7_node(fabric=fabric), str(tmp_path / "node"))
    fake = sf.fake_nvml(node)
    features = tmp_path / "features.d"
    features.mkdir()
    path = str(features / "topo-device-plugin")
    src = HardwareSource(HardwareOptions(
        sysfs_root=node.sysfs_root, dev_root=node.dev_root, proc_root=node.proc_root, nvml=fake,
        node_name=node.spec.name, debounce_s=0.02, monitor_factory=udev if udev is not None else no_udev,
        rescan_interval_s=60, fabric_labels_file=path))
    return src, fake, path


def test_the_clique_label_is_written_at_start_in_gpu_feature_discoverys_form(tmp_path):
    src, _, path = gb200(tmp_path)
    src.load()
    assert labels(path) == {CLIQUE_LABEL: f"{CLUSTER}.7"}
    assert CLIQUE_LABEL == "nvidia.com/gpu.clique"
    assert [p for p in os.listdir(os.path.dirname(path))] == ["topo-device-plugin"]  # no temporary left


def test_no_fabric_means_no_file(tmp_path):
    src, _, path = gb200(tmp_path, fabric=None)
    src.load()
    assert not os.path.exists(path)


def test_same_content_is_not_rewritten_and_a_change_replaces_the_file_atomically(tmp_path):
    path = str(tmp_path / "f")
    gpu = Device(name="GPU0", kind=DeviceKind.GPU, index=0, fabric=FabricInfo(CLUSTER, 7))
    f = FabricLabelFile(path)
    assert f.update([gpu]) is True
    inode = os.stat(path).st_ino
    assert f.update([gpu]) is False and os.stat(path).st_ino == inode
    assert f.update([replace(gpu, fabric=FabricInfo(CLUSTER, 9))]) is True
    assert os.stat(path).st_ino != inode  # a new file renamed over the old: readers never see half of it
    assert labels(path) == {CLIQUE_LABEL: f"{CLUSTER}.9"}


def test_the_clique_is_that_of_the_gpus_whose_fabric_is_complete():
    a = Device(name="GPU0", kind=DeviceKind.GPU, index=0, fabric=FabricInfo(CLUSTER, 7))
    b = Device(name="GPU1", kind=DeviceKind.GPU, index=1, fabric=FabricInfo(CLUSTER, 8))
    assert clique_of([a, b]) == (None, f"GPUs report different cliques ({CLUSTER}.7, {CLUSTER}.8)")
    assert clique_of([a, replace(b, fabric=FabricInfo(CLUSTER, 8, "in-progress"))]) == (f"{CLUSTER}.7", None)


def test_disagreeing_gpus_remove_the_label_with_one_warning(tmp_path, caplog):
    path = str(tmp_path / "f")
    f = FabricLabelFile(path)
    a = Device(name="GPU0", kind=DeviceKind.GPU, index=0, fabric=FabricInfo(CLUSTER, 7))
    f.update([a])
    b = Device(name="GPU1", kind=DeviceKind.GPU, index=1, fabric=FabricInfo(CLUSTER, 8))
    with caplog.at_level(logging.WARNING, logger="plugin.sources.fabric_labels"):
        f.update([a, b])
        f.update([a, b])
    assert not os.path.exists(path)
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings == [f"no NVLink clique label: GPUs report different cliques ({CLUSTER}.7, {CLUSTER}.8)"]


def test_an_unwritable_directory_is_a_warning_not_a_crash(tmp_path, caplog):
    f = FabricLabelFile(str(tmp_path / "missing-dir" / "f"))
    with caplog.at_level(logging.WARNING, logger="plugin.sources.fabric_labels"):
        assert f.update([Device(name="GPU0", kind=DeviceKind.GPU, index=0, fabric=FabricInfo(CLUSTER, 7))]) is False
    assert any("cannot write the fabric label file" in r.getMessage() for r in caplog.records)


async def test_a_rescan_that_sees_a_new_clique_rewrites_the_label(tmp_path):
    udev = FakeUdev()
    src, fake, path = gb200(tmp_path, udev=udev)
    first = await asyncio.to_thread(src.load)
    task = asyncio.create_task(src.watch(first, lambda _: None))
    try:
        await wait_for(lambda: src.watcher is not None and src.watcher.mode != "stopped")
        for g in fake.gpus:  # the rack was repartitioned: a new NVLink domain
            fake.set_fabric(g.device.name, FabricInfo(CLUSTER, 9))
        udev.send("change", "pci")
        await wait_for(lambda: labels(path).get(CLIQUE_LABEL) == f"{CLUSTER}.9")
        for g in fake.gpus:  # the fabric manager restarts: not set up yet
            fake.set_fabric(g.device.name, FabricInfo(CLUSTER, 9, "in-progress"))
        udev.send("change", "pci")
        await wait_for(lambda: not os.path.exists(path))
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_a_gpu_health_event_re_reads_the_fabric(tmp_path):
    """No udev event comes when the fabric changes; a GPU health event (an XID) asks for a rescan."""
    udev = FakeUdev()
    src, fake, path = gb200(tmp_path, udev=udev)
    first = await asyncio.to_thread(src.load)
    task = asyncio.create_task(src.watch(first, lambda _: None))
    try:
        await wait_for(lambda: src.watcher is not None and src.watcher.mode != "stopped")
        assert await asyncio.to_thread(fake.wait_registered, None, 5.0)
        for g in fake.gpus:
            fake.set_fabric(g.device.name, FabricInfo(CLUSTER, 11))
        rescans = src.watcher.rescans
        fake.inject_xid("GPU0", 79)
        await wait_for(lambda: labels(path).get(CLIQUE_LABEL) == f"{CLUSTER}.11")
        assert src.watcher.rescans > rescans
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_a_gpu_the_fabric_manager_registers_after_start_gets_its_clique_without_any_event(tmp_path):
    """NVL72 boot order: the daemon starts while the fabric manager is still registering the GPUs.

    No udev event, NVML event or health event follows; the periodic re-read (here every 50 ms)
    sees the state go from not started through in progress to completed, and the rescan it asks
    for writes the label and publishes GPUs that carry the clique.
    """
    src, fake, path = gb200(tmp_path)
    src = HardwareSource(replace(src.options, fabric_recheck_s=0.05))
    for g in fake.gpus:
        fake.set_fabric(g.device.name, FabricInfo(CLUSTER, 0, "not-started"))
    first = await asyncio.to_thread(src.load)
    assert not os.path.exists(path) and all(g.fabric is None for g in first.gpus)
    published = []
    task = asyncio.create_task(src.watch(first, published.append))
    try:
        await wait_for(lambda: src.watcher is not None and src.watcher.mode != "stopped")
        for g in fake.gpus:
            fake.set_fabric(g.device.name, FabricInfo(CLUSTER, 0, "in-progress"))
        fake.set_fabric("GPU0", FabricInfo(CLUSTER, 7))  # one registered: the others still in progress
        await wait_for(lambda: published and published[-1].device("GPU0").fabric is not None, timeout=30)
        assert labels(path) == {CLIQUE_LABEL: f"{CLUSTER}.7"}
        for g in fake.gpus:
            fake.set_fabric(g.device.name, FabricInfo(CLUSTER, 7))
        await wait_for(lambda: all(d.fabric is not None for d in published[-1].gpus), timeout=30)
        assert {d.fabric.clique for d in published[-1].gpus} == {f"{CLUSTER}.7"}
        assert fake.calls["nvmlDeviceGetGpuFabricInfoV"] > 2 * len(fake.gpus)  # read again, not only at start
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

