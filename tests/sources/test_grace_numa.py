"""Grace: GPU memory shows up as NUMA nodes without CPUs; the TopologyInfo we send the kubelet
must still name the CPU node its Topology Manager aligns with, never a GPU-memory node."""

from __future__ import annotations

import logging

from plugin.model.resources import ResourceOptions, build_resources
from plugin.serving.server import device_message
from plugin.sources.hardware import HardwareOptions, HardwareSource, cpu_numa_map
from topo_testkit import sysfs_fixture as sf

MEMORY_NODES = {2, 10, 18, 26}


def discover(node: sf.GeneratedNode):
    return HardwareSource(HardwareOptions(
        sysfs_root=node.sysfs_root, dev_root=node.dev_root, proc_root=node.proc_root,
        nvml=sf.fake_nvml(node), hotplug=False, node_name=node.spec.name)).load()


def topology_info_nodes(topology) -> dict[str, set[int]]:
    """What ListAndWatch tells the kubelet, per resource: the NUMA node IDs in TopologyInfo."""
    out: dict[str, set[int]] = {}
    for r in build_resources(topology, ResourceOptions(dev_root="/dev")):
        msg = device_message(r)
        out[r.name] = {n.ID for d in msg.devices for n in d.topology.nodes}
    return out


def test_gpu_memory_nodes_are_numa_nodes_but_never_a_devices_topology_info(tmp_path):
    node = sf.write_node(sf.gb200_cx7_node(), str(tmp_path))
    t = discover(node)
    assert set(t.numa_nodes) == {0, 1} | MEMORY_NODES  # the machine has them...
    assert {d.numa for d in t.devices} == {0, 1}        # ...but devices sit on CPU nodes
    infos = topology_info_nodes(t)
    assert infos["nvidia.com/gpu"] == {0, 1} and infos["topo.dev/nic"] == {0, 1}


def test_a_gpu_whose_numa_node_names_its_memory_node_reports_the_nearest_cpu_node(tmp_path, caplog):
    """Should a GPU's `numa_node` ever name a CPU-less node, its socket (nearest by distance) stands in."""
    grace = sf.GRACE_RP
    spec = sf.NodeSpec(
        name="grace-numa-guard",
        sockets=(sf.Socket(0, (sf.HostBridge((sf.Gpu(sysfs_numa=10),), domain=0x8, root_port=grace),)),
                 sf.Socket(1, (sf.HostBridge((sf.Gpu(sysfs_numa=26),), domain=0x18, root_port=grace),))),
        gpu_memory_nodes=((2, 0), (10, 0), (18, 1), (26, 1)),
    )
    node = sf.write_node(spec, str(tmp_path))
    with open(f"{node.sysfs_root}/bus/pci/devices/0008:01:00.0/numa_node") as f:
        assert f.read().strip() == "10"  # the tree really says the memory node
    with caplog.at_level(logging.WARNING):
        t = discover(node)
    assert (t.device("GPU0").numa, t.device("GPU1").numa) == (0, 1)
    assert topology_info_nodes(t)["nvidia.com/gpu"] == {0, 1}
    moved = [r.getMessage() for r in caplog.records if "has no CPUs" in r.getMessage()]
    assert len(moved) == 2 and "GPU0 reports NUMA node 10" in moved[0] and "GPU1 reports NUMA node 26" in moved[1]


def test_cpu_numa_map_reads_cpulist_and_distance(tmp_path):
    node = sf.write_node(sf.gb200_cx7_node(), str(tmp_path))
    assert cpu_numa_map(node.sysfs_root) == {2: 0, 10: 0, 18: 1, 26: 1}
    # A tree without Grace's memory nodes maps nothing.
    plain = sf.write_node(sf.default_node(), str(tmp_path / "plain"))
    assert cpu_numa_map(plain.sysfs_root) == {}
