"""NIC Allocate responses: device specs and the SR-IOV network device plugin's env vars, exactly."""

from __future__ import annotations

import json
import os

from allocator.topology import NodeTopology
from plugin.model.allocate_response import DeviceNode
from plugin.model.nic_pools import go_json, parse_pools
from plugin.model.resources import ResourceOptions, build_resources
from plugin.sources.sysfs_nics import discover_nics
from topo_testkit.sysfs_fixture import HostBridge, NicCard, NodeSpec, Port, Socket, Vf, write_node

SRC = "config.yaml"


def resources(node, raw):
    topo = NodeTopology.build(discover_nics(node.sysfs_root, node.dev_root, node.proc_root).devices, {}, source="t")
    pools = parse_pools(raw, SRC, dev_root=node.dev_root)
    return {r.name: r for r in build_resources(topo, ResourceOptions(nic_pools=pools))}


def test_vfio_vf_gets_its_group_and_the_container_node(node):
    vf = node.function("ens1f0").vfs[3]
    group = node.function(vf).iommu_group
    res = resources(node, [{"resourceName": "sriov_vfio", "selectors": {"drivers": ["vfio-pci"]}}])
    out = res["topo.dev/sriov_vfio"].allocate([vf])
    assert out.devices == [
        DeviceNode("/dev/vfio/vfio", os.path.join(node.dev_root, "vfio", "vfio"), "rw"),
        DeviceNode(f"/dev/vfio/{group}", os.path.join(node.dev_root, "vfio", str(group)), "rw"),
    ]
    assert out.envs == {
        "PCIDEVICE_TOPO_DEV_SRIOV_VFIO": vf,
        "PCIDEVICE_TOPO_DEV_SRIOV_VFIO_INFO":
            '{"%s":{"generic":{"deviceID":"%s"},"vfio":{"dev-mount":"/dev/vfio/%d","mount":"/dev/vfio/vfio"}}}'
            % (vf, vf, group),
    }
    assert out.mounts == [] and out.cdi_devices == []


def test_two_vfio_devices_share_dev_vfio_vfio_once(tmp_path):
    cx = NicCard(ports=(Port("ens1f0", vfs=(Vf(driver="vfio-pci"), Vf(driver="vfio-pci"))),))
    node = write_node(NodeSpec("v", (Socket(0, (HostBridge((cx,)),)),)), str(tmp_path))
    a, b = node.function("ens1f0").vfs
    res = resources(node, [{"resourceName": "dpdk", "selectors": {"drivers": ["vfio-pci"]}}])
    out = res["topo.dev/dpdk"].allocate([b, a])
    hosts = [d.host_path for d in out.devices]
    assert hosts == [os.path.join(node.dev_root, "vfio", x) for x in
                     ("vfio", str(node.function(b).iommu_group), str(node.function(a).iommu_group))]
    assert out.envs["PCIDEVICE_TOPO_DEV_DPDK"] == f"{b},{a}"  # the kubelet's order, as upstream
    info = json.loads(out.envs["PCIDEVICE_TOPO_DEV_DPDK_INFO"])
    assert list(info) == sorted([a, b])  # Go marshals map keys sorted


def test_vfio_noiommu_host_path_differs_from_container_path(node):
    vf = node.function("ens1f0").vfs[3]
    group = node.function(vf).iommu_group
    with open(os.path.join(node.sysfs_root, "kernel", "iommu_groups", str(group), "name"), "w") as f:
        f.write("vfio-noiommu\n")
    os.rename(os.path.join(node.dev_root, "vfio", str(group)), os.path.join(node.dev_root, "vfio", f"noiommu-{group}"))
    res = resources(node, [{"resourceName": "v", "selectors": {"drivers": ["vfio-pci"]}}])
    out = res["topo.dev/v"].allocate([vf])
    assert out.devices[1] == DeviceNode(f"/dev/vfio/{group}", os.path.join(node.dev_root, "vfio", f"noiommu-{group}"))


def test_rdma_device_gets_its_char_devices_and_rdma_cm(node):
    ib = node.function("ibp2s0f1").bdf
    res = resources(node, [{"resourceName": "rdma_ib", "selectors": [{"isRdma": True}]}])
    out = res["topo.dev/rdma_ib"].allocate([ib])
    ibdir = os.path.join(node.dev_root, "infiniband")
    assert out.devices == [DeviceNode(f"/dev/infiniband/{n}", os.path.join(ibdir, n), "rw")
                           for n in ("issm0", "umad0", "uverbs0", "rdma_cm")]
    assert out.envs["PCIDEVICE_TOPO_DEV_RDMA_IB"] == ib
    assert out.envs["PCIDEVICE_TOPO_DEV_RDMA_IB_INFO"] == (
        '{"%s":{"generic":{"deviceID":"%s"},"rdma":{"issm":"/dev/infiniband/issm0","rdma_cm":'
        '"/dev/infiniband/rdma_cm","rdma_dev":"mlx5_0","umad":"/dev/infiniband/umad0",'
        '"uverbs":"/dev/infiniband/uverbs0"}}}' % (ib, ib))


def test_rdma_char_devices_missing_from_dev_are_left_out(node):
    ib = node.function("ibp2s0f1").bdf
    os.unlink(os.path.join(node.dev_root, "infiniband", "issm0"))
    os.unlink(os.path.join(node.dev_root, "infiniband", "rdma_cm"))
    res = resources(node, [{"resourceName": "r", "selectors": [{"isRdma": True}]}])
    out = res["topo.dev/r"].allocate([ib])
    assert [d.container_path for d in out.devices] == ["/dev/infiniband/umad0", "/dev/infiniband/uverbs0"]
    rdma = json.loads(out.envs["PCIDEVICE_TOPO_DEV_R_INFO"])[ib]["rdma"]
    assert rdma == {"umad": "/dev/infiniband/umad0", "uverbs": "/dev/infiniband/uverbs0", "rdma_dev": "mlx5_0"}


def test_kernel_netdev_vfs_get_no_device_nodes(node):
    ids = node.function("ens2f0").vfs[:3]
    res = resources(node, [{"resourceName": "sriov_b", "resourcePrefix": "intel.com",
                            "selectors": {"pfNames": ["ens2f0"]}}])
    out = res["intel.com/sriov_b"].allocate(ids)
    assert out.devices == []
    assert out.envs["PCIDEVICE_INTEL_COM_SRIOV_B"] == ",".join(ids)
    assert json.loads(out.envs["PCIDEVICE_INTEL_COM_SRIOV_B_INFO"]) == {i: {"generic": {"deviceID": i}} for i in ids}


def test_additional_info_global_then_per_address(node):
    a, b = node.function("ens2f0").vfs[:2]
    res = resources(node, [{"resourceName": "x", "selectors": {"pfNames": ["ens2f0"]},
                            "additionalInfo": {"*": {"mode": "kernel", "zone": "a"}, b: {"mode": "special"}}}])
    info = json.loads(res["topo.dev/x"].allocate([a, b]).envs["PCIDEVICE_TOPO_DEV_X_INFO"])
    assert info[a]["extra"] == {"mode": "kernel", "zone": "a"}
    assert info[b]["extra"] == {"mode": "special", "zone": "a"}


def test_need_vhost_net_adds_vhost_and_tun_when_present(node):
    vf = node.function("ens2f0").vfs[0]
    raw = [{"resourceName": "v", "selectors": {"pfNames": ["ens2f0"], "needVhostNet": True}}]
    out = resources(node, raw)["topo.dev/v"].allocate([vf])
    assert out.devices == [] and "vhost" not in json.loads(out.envs["PCIDEVICE_TOPO_DEV_V_INFO"])[vf]
    os.makedirs(os.path.join(node.dev_root, "net"), exist_ok=True)
    for p in ("vhost-net", "net/tun"):
        open(os.path.join(node.dev_root, p), "w").close()
    out = resources(node, raw)["topo.dev/v"].allocate([vf])
    assert [d.container_path for d in out.devices] == ["/dev/vhost-net", "/dev/net/tun"]
    assert json.loads(out.envs["PCIDEVICE_TOPO_DEV_V_INFO"])[vf]["vhost"] == {
        "net-mount": "/dev/vhost-net", "tun-mount": "/dev/net/tun"}


def test_go_json_matches_go_marshal():
    assert go_json({"b": {"y": "1", "x": "<&>"}, "a": {}}) == '{"a":{},"b":{"x":"\\u003c\\u0026\\u003e","y":"1"}}'
    assert go_json({"k": "é\u2028"}) == '{"k":"é\\u2028"}'


def test_response_is_stable_for_replay(node):
    """The kubelet replays the response for the pod's life: same IDs, same answer."""
    vf = node.function("ens1f0").vfs[3]
    res = resources(node, [{"resourceName": "v", "selectors": {"drivers": ["vfio-pci"]}}])["topo.dev/v"]
    assert res.allocate([vf]) == res.allocate([vf])
