"""`--no-pass-device-specs` with a CDI strategy: Allocate names devices through CDI only, and loses nothing.

The node is the NVML path (fake NVML driven by the dgx-a100-mig node, with its generated sysfs, procfs
and device nodes), so GPUs and MIG devices have real device nodes to list. For each device the test
compares the two answers: with device specs (our default) and CDI alone. The CDI project's own library
injects the CDI-alone names from the spec we wrote; the nodes it injects must include every node the
default answer listed, so a container gets the same devices either way.
"""

from __future__ import annotations

import pathlib

import pytest

from plugin.cdi_files.sync import SpecSync
from plugin.model.gpu_allocate import GpuAllocateOptions
from plugin.model.resources import Resource, ResourceOptions, build_resources
from plugin.sources.hardware import hardware_source_from_options
from topo_testkit.fake_nvml import gpu_node_on_disk

GPU = "nvidia.com/gpu"
MIG_1G = "nvidia.com/mig-1g.10gb"
MIG_3G = "nvidia.com/mig-3g.40gb"


@pytest.fixture
def node(tmp_path: pathlib.Path):
    fake, roots = gpu_node_on_disk(str(tmp_path))
    # The fixture's nodes are plain files; the driver's optional nodes have dynamic majors, so a spec can
    # describe them only from a real character device: stand one in for each, as the driver would create it.
    for name in ("nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset"):
        optional = pathlib.Path(roots["dev"], name)
        optional.unlink()
        optional.symlink_to("/dev/null")
    source = hardware_source_from_options(sysfs_root=roots["sys"], dev_root=roots["dev"], proc_root=roots["proc"],
                                          nvml=fake, nics=False, hotplug=False)
    return source.load(), roots["dev"]


def resources(node, pass_device_specs: bool) -> dict[str, Resource]:
    topology, dev = node
    options = ResourceOptions(
        device_id_strategy="index", mig_strategy="mixed", dev_root=dev,
        gpu_allocate=GpuAllocateOptions(device_list_strategy=("cdi-cri",), dev_root=dev,
                                        pass_device_specs=pass_device_specs))
    return {r.name: r for r in build_resources(topology, options)}


@pytest.mark.parametrize("resource, ids", [(GPU, ["7"]), (MIG_1G, ["1:0", "6:2"]), (MIG_3G, ["3:1"])])
def test_cdi_alone_lists_no_node_and_the_spec_injects_every_node_the_default_listed(
        node, tmp_path, cdi_validator, resource, ids):
    default = resources(node, True)[resource].allocate(ids)
    alone_resources = resources(node, False)
    alone = alone_resources[resource].allocate(ids)
    listed = {d.container_path for d in default.devices}
    assert listed and "/dev/nvidiactl" in listed  # the default answer lists real nodes
    assert alone.devices == [], "CDI alone: the runtime injects the nodes, Allocate lists none"
    assert alone.cdi_devices == default.cdi_devices and alone.cdi_devices
    assert alone.envs == default.envs  # NVIDIA_VISIBLE_DEVICES=void either way: no hook adds anything
    spec_dir = tmp_path / "cdi"
    SpecSync(str(spec_dir)).sync(alone_resources.values())
    report = cdi_validator.run(spec_dir, inject=[alone.cdi_devices])
    assert report.ok, report.report
    (injection,) = report.report["injections"]
    assert injection["error"] is None and not injection["unresolved"]
    injected = {n["path"] for n in injection["deviceNodes"]}
    assert listed <= injected, f"CDI alone would lose {sorted(listed - injected)}"


def test_without_a_cdi_strategy_device_specs_are_always_passed(node, caplog):
    # NVIDIA's configs often say passDeviceSpecs: false with envvar (their runtime hook makes the nodes);
    # we have no such hook, so the nodes still come from Allocate.
    topology, dev = node
    options = ResourceOptions(device_id_strategy="index", dev_root=dev,
                              gpu_allocate=GpuAllocateOptions(dev_root=dev, pass_device_specs=False))
    (gpu,) = [r for r in build_resources(topology, options) if r.name == GPU]
    resp = gpu.allocate(["0"])
    assert "/dev/nvidia0" in {d.container_path for d in resp.devices} and not resp.cdi_devices
