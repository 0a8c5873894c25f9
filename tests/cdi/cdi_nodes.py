"""Simulated nodes for the CDI tests: built-ins, time-sliced GPUs, MIG devices and RDMA/vfio NICs.

The NIC and MIG devices carry the attributes discovery records (see
plugin/sources/sysfs_nics.py ATTRIBUTES, and plugin/model/cdi/builders.py for MIG).
"""

from __future__ import annotations

import tempfile
from dataclasses import replace

from allocator.subdevices import replica_graph, replica_id
from allocator.topology import Device, DeviceGraph, DeviceKind
from plugin.model.resources import Resource, ResourceDevice, ResourceOptions, build_resources
from plugin.config import parse_config
from plugin.sources.nvml_gpus import NvmlGpuSource
from plugin.sources.simulated import load_simulated
from topo_testkit.fake_nvml import FakeNvml

BUILTINS = ("dgx-a100", "dgx-h100", "dgx-1-v100", "dgx-2-v100", "pcie-2socket-4gpu-2nic")


class _NoBuilder:
    def build(self, ids, devices):  # pragma: no cover - the CDI tests never Allocate
        raise AssertionError("not used")


def resources_of(source: str, strategy: str = "uuid") -> list[Resource]:
    return build_resources(load_simulated(source), ResourceOptions(device_id_strategy=strategy))


def time_sliced(gpu: Resource, replicas: int, name: str = "nvidia.com/gpu.shared") -> Resource:
    """The replica resource NVIDIA's `renameByDefault` would serve for `gpu`."""
    devices = tuple(ResourceDevice(replica_id(d.id, r), d.device, d.numa) for d in gpu.devices
                    for r in range(replicas))
    return Resource(name, DeviceKind.GPU, devices, "replicas", replica_graph(gpu.graph, replicas), _NoBuilder())


def mig_resource(name: str = "nvidia.com/mig-1g.10gb", gpus: int = 2, per_gpu: int = 3) -> Resource:
    """MIG devices as MIG discovery will describe them: parent minor, UUID, index, caps nodes."""
    devices = []
    cap = 10
    for g in range(gpus):
        for m in range(per_gpu):
            d = Device(name=f"GPU{g}-mig{m}", kind=DeviceKind.MIG, index=g * per_gpu + m, numa=g % 2,
                       uuid=f"MIG-{g:04d}{m:04d}-aaaa-bbbb-cccc-000000000000", minor=g, parent=f"GPU{g}",
                       attributes={"index": f"{g}:{m}", "caps_major": "237",
                                   "caps": f"/dev/nvidia-caps/nvidia-cap{cap},/dev/nvidia-caps/nvidia-cap{cap + 1}"})
            cap += 9
            devices.append(ResourceDevice(d.uuid, d, d.numa))
    graph = DeviceGraph(ids=tuple(d.id for d in devices), numa=tuple(d.numa for d in devices),
                        weights=tuple(tuple(0 for _ in devices) for _ in devices))
    return Resource(name, DeviceKind.MIG, tuple(devices), "mig", graph, _NoBuilder())


def nic_resource(name: str = "topo.dev/rdma_vfs") -> Resource:
    """Two RDMA VFs, a vfio-pci VF (IOMMU group 42), a noiommu vfio VF and a plain netdev VF."""
    base = Device(name="x", kind=DeviceKind.NIC, index=0, numa=0)
    specs = [
        ("0000:3b:00.2", {"driver": "mlx5_core", "rdma": "true", "rdma_devices": "mlx5_2",
                          "rdma_char_devices": "/dev/infiniband/issm2,/dev/infiniband/umad2,/dev/infiniband/uverbs2"}),
        ("0000:3b:00.3", {"driver": "mlx5_core", "rdma": "true", "rdma_devices": "mlx5_3",
                          "rdma_char_devices": "/dev/infiniband/uverbs3"}),
        ("0000:5e:02.0", {"driver": "vfio-pci", "iommu_group": "42", "vfio_device": "/dev/vfio/42",
                          "vfio_host_device": "/dev/vfio/42"}),
        ("0000:5e:02.1", {"driver": "vfio-pci", "iommu_group": "43", "vfio_device": "/dev/vfio/43",
                          "vfio_host_device": "/dev/vfio/noiommu-43"}),
        ("0000:5e:02.2", {"driver": "iavf", "rdma": "false", "netdev": "ens1f0v2"}),
    ]
    devices = tuple(ResourceDevice(bdf, replace(base, name=bdf, index=i, attributes=attrs), 0)
                    for i, (bdf, attrs) in enumerate(specs))
    graph = DeviceGraph(ids=tuple(d.id for d in devices), numa=(0,) * len(devices),
                        weights=tuple(tuple(0 for _ in devices) for _ in devices))
    return Resource(name, DeviceKind.NIC, devices, "spread", graph, _NoBuilder())


#: GPUs 4 ways (renamed by default) and the 1g.10gb MIG profile 2 ways under its own name.
TIME_SLICED = """\
version: v1
sharing:
  timeSlicing:
    renameByDefault: true
    resources:
    - {name: nvidia.com/gpu, replicas: 4}
    - {name: nvidia.com/mig-1g.10gb, replicas: 2, rename: mig-1g.10gb.half}
"""


def served(node: str, mig_strategy: str, config: str | None = None, strategy: str = "uuid") -> list[Resource]:
    """The resources the daemon serves for a simulated node (MIG strategy, optional time-slicing config)."""
    ts = parse_config(config, "config.yaml").time_slicing if config else None
    return build_resources(load_simulated(node), ResourceOptions(device_id_strategy=strategy,
                                                                 mig_strategy=mig_strategy, time_slicing=ts))


def served_by_nvml(node: str, mig_strategy: str) -> list[Resource]:
    """The GPU-family resources of a node discovered through the fake NVML (procfs written: caps and major)."""
    sim = load_simulated(node)
    fake = FakeNvml(sim.without(d.name for d in sim.nics))
    with tempfile.TemporaryDirectory() as d:
        topology = NvmlGpuSource(nvml=fake, sysfs_root=fake.write_sysfs(f"{d}/sys"),
                                 proc_root=fake.write_proc(f"{d}/proc")).load()
    return build_resources(topology, ResourceOptions(mig_strategy=mig_strategy))
