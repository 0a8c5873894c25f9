"""sysfs NIC discovery on generated trees: what is offered, what is not, and every fact we read."""

from __future__ import annotations

import os
import shutil
from dataclasses import replace

from allocator.topology import HEALTHY, UNHEALTHY, DeviceKind
from plugin.sources.sysfs_nics import default_route_interfaces, discover_nics, link_states, rdma_char_devices
from topo_testkit.sysfs_fixture import (
    Bond, Gpu, HostBridge, NicCard, NodeSpec, Port, Socket, Switch, Vf, default_node, write_node,
)


def scan(node, **kw):
    return discover_nics(node.sysfs_root, node.dev_root, node.proc_root, **kw)


def test_generated_node_is_discovered_exactly(node):
    inv = scan(node)
    assert inv.devices == node.topology.nics
    assert all(d.kind is DeviceKind.NIC and d.name == d.pci_bus_id for d in inv.devices)
    assert [d.index for d in inv.devices] == list(range(len(inv.devices)))


def test_pf_with_vfs_is_not_offered_but_its_vfs_are(node):
    inv = scan(node)
    names = {d.name for d in inv.devices}
    for netdev in ("ens1f0", "ens2f0"):
        pf = node.function(netdev)
        assert pf.bdf not in names
        assert "SR-IOV PF with 4 VFs" in inv.skipped[pf.bdf]
        assert set(pf.vfs) <= names
        for i, vf in enumerate(pf.vfs):
            d = next(x for x in inv.devices if x.name == vf)
            assert d.port == pf.bdf
            assert d.attributes["pf"] == pf.bdf
            assert d.attributes["pf_netdev"] == netdev
            assert d.attributes["vf_index"] == str(i)
    # A PF without VFs is offered and is its own port.
    ens1f1 = next(d for d in inv.devices if d.attributes["netdev"] == "ens1f1")
    assert ens1f1.port == ens1f1.name
    assert ens1f1.attributes["sriov_numvfs"] == "0" and ens1f1.attributes["sriov_totalvfs"] == "8"


def test_default_route_nic_is_never_offered(node):
    inv = scan(node)
    eno1 = node.function("eno1")
    assert eno1.bdf not in {d.name for d in inv.devices}
    assert "default route (eno1)" in inv.skipped[eno1.bdf]
    assert inv.default_route_netdevs == ("eno1",)
    # Its sibling port (a subnet route only) is offered.
    assert node.function("eno2").bdf in {d.name for d in inv.devices}


def test_default_route_through_a_bond_excludes_its_slaves(tmp_path):
    spec = default_node()
    cx = NicCard(ports=(Port("ens3f0"), Port("ens3f1"), Port("ens3f2")))
    spec = replace(spec, sockets=(Socket(0, (HostBridge((cx,)),)),), nvlinks=(), bonds=(Bond("bond0", ("ens3f0", "ens3f1")),))
    node = write_node(spec, str(tmp_path))
    inv = scan(node)
    assert {d.attributes["netdev"] for d in inv.devices} == {"ens3f2"}
    assert set(inv.default_route_netdevs) == {"bond0", "ens3f0", "ens3f1"}
    assert inv.devices == node.topology.nics


def test_ipv6_default_route_counts_and_lo_reject_route_does_not(node):
    path = os.path.join(node.proc_root, "net", "ipv6_route")
    zero = "0" * 32
    with open(path, "w") as f:
        f.write(f"{zero} 00 {zero} 00 fe800000000000000000000000000001 00000400 00000001 00000000 00000003 ens1f1\n")
        f.write(f"{zero} 00 {zero} 00 {zero} ffffffff 00000001 00000000 00200200       lo\n")
    assert default_route_interfaces(node.proc_root) == {"eno1", "ens1f1"}
    assert node.function("ens1f1").bdf not in {d.name for d in scan(node).devices}


def test_route_table_parsing_ignores_non_default_and_down_routes(tmp_path):
    os.makedirs(tmp_path / "net")
    (tmp_path / "net" / "route").write_text(
        "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n"
        "eth0\t00000000\t0101A8C0\t0002\t0\t0\t100\t00000000\t0\t0\t0\n"  # not RTF_UP
        "eth1\t0001A8C0\t00000000\t0001\t0\t0\t100\t00FFFFFF\t0\t0\t0\n"
        "eth2\t00000000\t0101A8C0\t0003\t0\t0\t100\t00000000\t0\t0\t0\n"
    )
    assert default_route_interfaces(str(tmp_path)) == {"eth2"}


def test_vfio_vf_has_its_iommu_group_and_no_netdev(node):
    vf = node.function("ens1f0").vfs[3]
    d = next(x for x in scan(node).devices if x.name == vf)
    group = node.function(vf).iommu_group
    assert d.attributes["driver"] == "vfio-pci"
    assert d.attributes["netdev"] == ""
    assert d.attributes["iommu_group"] == str(group)
    assert d.attributes["vfio_device"] == d.attributes["vfio_host_device"] == f"/dev/vfio/{group}"
    assert d.attributes["link_type"] == "ether"  # from the PF, as the SR-IOV plugin does


def test_vfio_noiommu_group_uses_the_noiommu_host_node(node):
    vf = node.function("ens1f0").vfs[3]
    group = node.function(vf).iommu_group
    with open(os.path.join(node.sysfs_root, "kernel", "iommu_groups", str(group), "name"), "w") as f:
        f.write("vfio-noiommu\n")
    d = next(x for x in scan(node).devices if x.name == vf)
    assert d.attributes["vfio_device"] == f"/dev/vfio/{group}"
    assert d.attributes["vfio_host_device"] == f"/dev/vfio/noiommu-{group}"


def test_rdma_port_and_its_char_devices(node):
    ib = node.function("ibp2s0f1")
    d = next(x for x in scan(node).devices if x.name == ib.bdf)
    assert d.attributes["rdma"] == "true"
    assert d.attributes["rdma_devices"] == "mlx5_0"
    assert d.attributes["rdma_char_devices"] == "/dev/infiniband/issm0,/dev/infiniband/umad0,/dev/infiniband/uverbs0"
    assert d.attributes["link_type"] == "infiniband"
    assert d.attributes["class"] == "0x020700"
    others = [x for x in scan(node).devices if x.name != ib.bdf]
    assert all(x.attributes["rdma"] == "false" and "rdma_devices" not in x.attributes for x in others)


def _many_rdma_vfs_node(tmp_path, operstate="up"):
    cx = NicCard(ports=(Port("ens5f0", vfs=tuple(Vf(rdma=True) for _ in range(11)), total_vfs=16,
                             operstate=operstate),))
    return write_node(NodeSpec("rdma", (Socket(0, (HostBridge((cx,)),)),)), str(tmp_path))


def test_char_devices_match_the_rdma_device_exactly(tmp_path):
    node = _many_rdma_vfs_node(tmp_path)
    # mlx5_1 must not pick up mlx5_10's char devices (rdmamap's substring match would).
    assert rdma_char_devices(node.sysfs_root, "mlx5_1") == [
        "/dev/infiniband/issm1", "/dev/infiniband/umad1", "/dev/infiniband/uverbs1"]
    assert scan(node).devices == node.topology.nics


def test_vf_moved_into_a_pod_keeps_its_rdma_facts(tmp_path):
    node = _many_rdma_vfs_node(tmp_path)
    first = scan(node)
    vf = node.function("ens5f0").vfs[2]
    real = os.path.realpath(os.path.join(node.sysfs_root, "bus", "pci", "devices", vf))
    shutil.rmtree(os.path.join(real, "infiniband"))
    shutil.rmtree(os.path.join(real, "net"))
    os.unlink(os.path.join(node.sysfs_root, "class", "net", node.function(vf).netdev))  # gone from our netns
    without_memory = next(d for d in scan(node).devices if d.name == vf)
    assert without_memory.attributes["rdma"] == "false"
    again = next(d for d in scan(node, previous=first.devices).devices if d.name == vf)
    before = next(d for d in first.devices if d.name == vf)
    assert again.attributes["rdma"] == "true"
    assert again.attributes["rdma_devices"] == before.attributes["rdma_devices"]
    assert again.attributes["rdma_char_devices"] == before.attributes["rdma_char_devices"]
    assert again.attributes["link_type"] == "ether"


def test_numa_minus_one_means_no_numa(tmp_path):
    cx = NicCard(ports=(Port("ens1f0", vfs=(Vf(),)),))
    node = write_node(NodeSpec("nonuma", (Socket(None, (HostBridge((cx,)),)),)), str(tmp_path))
    devs = scan(node).devices
    assert devs and all(d.numa is None for d in devs)
    assert devs == node.topology.nics


def test_function_without_a_driver_is_skipped(node):
    eno2 = node.function("eno2")
    os.unlink(os.path.join(node.sysfs_root, "bus", "pci", "devices", eno2.bdf, "driver"))
    inv = scan(node)
    assert eno2.bdf not in {d.name for d in inv.devices}
    assert inv.skipped[eno2.bdf] == "no driver bound"


def test_gpus_bridges_and_other_classes_are_not_nics(node):
    names = {d.name for d in scan(node).devices}
    for f in node.functions:
        if f.role in ("gpu", "bridge"):
            assert f.bdf not in names


def test_missing_sysfs_root_gives_no_nics(tmp_path):
    inv = discover_nics(str(tmp_path / "nope"), str(tmp_path), str(tmp_path))
    assert inv.devices == ()


def test_link_down_makes_pf_and_its_vfs_unhealthy_when_configured(node):
    node.set_operstate("ens1f0", "down")
    node.set_operstate("ens1f1", "down")
    by = {d.name: d for d in scan(node, link_health=True).devices}
    for vf in node.function("ens1f0").vfs:
        assert by[vf].health == UNHEALTHY
    assert by[node.function("ens1f1").bdf].health == UNHEALTHY
    assert by[node.function("eno2").bdf].health == HEALTHY
    # Without link health, a down link changes nothing but the recorded state.
    plain = {d.name: d for d in scan(node).devices}
    assert all(d.health == HEALTHY for d in plain.values())
    assert plain[node.function("ens1f1").bdf].attributes["operstate"] == "down"


def test_link_states_reads_every_netdev_and_pf(node):
    states = link_states(node.sysfs_root, scan(node).devices)
    assert states["ens1f0"] == "up"  # the PF of offered VFs
    assert states["ens1f0v0"] == "up"
    assert "eno1" not in states
    node.set_operstate("ens1f0", "down")
    assert link_states(node.sysfs_root, scan(node).devices)["ens1f0"] == "down"


def test_intel_vfs_and_a_gpu_only_switch(tmp_path):
    x = NicCard(ports=(Port("enp1s0f0", vfs=(Vf(), Vf(driver="vfio-pci")), total_vfs=64),),
                vendor="8086", device="1592", vf_device="1889", driver="ice", vf_driver="iavf")
    spec = NodeSpec("intel", (Socket(0, (HostBridge((Switch((Gpu(), x)),)),)),))
    node = write_node(spec, str(tmp_path))
    devs = scan(node).devices
    assert devs == node.topology.nics
    assert [d.attributes["driver"] for d in devs] == ["iavf", "vfio-pci"]
    assert devs[0].model == "E810 VF (iavf)"


def test_virtio_netdev_under_a_child_device_is_found_and_the_uplink_excluded(tmp_path):
    """virtio puts the netdev at <bdf>/virtio0/net/eth0, not <bdf>/net (seen on real VMs)."""
    virtio = NicCard(ports=(Port("eth0", total_vfs=0, default_route=True, netdev_parent="virtio0"),),
                     vendor="1af4", device="1041", driver="virtio-pci")
    virtio2 = NicCard(ports=(Port("eth1", total_vfs=0, netdev_parent="virtio1", operstate="down"),),
                      vendor="1af4", device="1041", driver="virtio-pci")
    node = write_node(NodeSpec("vm", (Socket(None, (HostBridge((virtio, virtio2)),)),)), str(tmp_path))
    inv = scan(node, link_health=True)
    assert "default route (eth0)" in inv.skipped[node.function("eth0").bdf]
    (d,) = inv.devices
    assert d.attributes["netdev"] == "eth1" and d.attributes["operstate"] == "down"
    assert d.health == UNHEALTHY
    assert inv.devices == tuple(replace(x, health=UNHEALTHY) for x in node.topology.nics)
