"""`nics.resourceList`: every selector, `#` VF ranges, first match, and precise errors for bad configs."""

from __future__ import annotations

import pytest
import yaml

from allocator.topology import DeviceKind
from plugin.config import ConfigError, parse_config
from plugin.model.nic_pools import NicPoolError, env_var_name, parse_pool_specs, parse_pools, summarize
from plugin.model.resources import ResourceOptions, build_resources
from plugin.sources.sysfs_nics import discover_nics
from topo_testkit.sysfs_fixture import example_config

SRC = "/etc/topo/config.yaml"


def nics(node):
    return discover_nics(node.sysfs_root, node.dev_root, node.proc_root).devices


def members(node, raw):
    pools = parse_pools(raw, SRC, dev_root=node.dev_root)
    summary, left = summarize(nics(node), pools)
    return {s.resource_name: list(s.devices) for s in summary}, list(left)


def vfs(node, netdev, *idx):
    pf = node.function(netdev)
    return [pf.vfs[i] for i in idx] if idx else list(pf.vfs)


def test_vendors_devices_drivers(node):
    got, left = members(node, [
        {"resourceName": "vfio", "selectors": {"drivers": ["vfio-pci"]}},
        {"resourceName": "cx6vf", "selectors": [{"vendors": ["0x15B3"], "devices": ["101c"]}]},
        {"resourceName": "intel", "selectors": [{"vendors": ["8086"]}]},
    ])
    assert got["topo.dev/vfio"] == [vfs(node, "ens1f0", 3)[0]]
    assert got["topo.dev/cx6vf"] == vfs(node, "ens1f0", 0, 1, 2) + vfs(node, "ens2f0")
    assert got["topo.dev/intel"] == [node.function("eno2").bdf]
    assert sorted(left) == sorted([node.function("ens1f1").bdf, node.function("ibp2s0f1").bdf])


def test_pfnames_with_vf_ranges_and_first_match(node):
    got, _ = members(node, [
        {"resourceName": "a", "selectors": [{"pfNames": ["ens1f0#0,2"]}]},
        {"resourceName": "b", "selectors": [{"pfNames": ["ENS1F0#1-3"]}]},  # case-insensitive, 2 already taken
        {"resourceName": "c", "selectors": [{"pfNames": ["ens2f0"]}]},       # bare name: every VF
        {"resourceName": "d", "selectors": [{"pfNames": ["ens1f1"]}]},       # a PF without VFs matches nothing
    ])
    assert got["topo.dev/a"] == vfs(node, "ens1f0", 0, 2)
    assert got["topo.dev/b"] == vfs(node, "ens1f0", 1, 3)
    assert got["topo.dev/c"] == vfs(node, "ens2f0")
    assert got["topo.dev/d"] == []


def test_root_devices_with_ranges_and_short_addresses(node):
    pf = node.function("ens2f0").bdf
    short = pf[len("0000:"):]
    got, _ = members(node, [
        {"resourceName": "r", "selectors": [{"rootDevices": [f"{short}#1-2"]}]},
        {"resourceName": "s", "selectors": [{"rootDevices": [pf]}]},
    ])
    assert got["topo.dev/r"] == vfs(node, "ens2f0", 1, 2)
    assert got["topo.dev/s"] == vfs(node, "ens2f0", 0, 3)


def test_pci_addresses_link_types_and_rdma(node):
    ib = node.function("ibp2s0f1").bdf
    eno2 = node.function("eno2").bdf
    got, _ = members(node, [
        {"resourceName": "ib", "selectors": [{"isRdma": True}]},
        {"resourceName": "addr", "selectors": [{"pciAddresses": [eno2.upper().replace("0000:", "")]}]},
        {"resourceName": "eth", "selectors": [{"linkTypes": ["ether"], "isRdma": False, "drivers": ["mlx5_core"]}]},
    ])
    assert got["topo.dev/ib"] == [ib]
    assert got["topo.dev/addr"] == [eno2]
    assert got["topo.dev/eth"] == sorted([node.function("ens1f1").bdf] + vfs(node, "ens1f0", 0, 1, 2) + vfs(node, "ens2f0"))


def test_selectors_are_alternatives_and_fields_are_and(node):
    got, _ = members(node, [
        {"resourceName": "none", "selectors": [{"vendors": ["8086"], "drivers": ["mlx5_core"]}]},
        {"resourceName": "either", "selectors": [{"vendors": ["8086"]}, {"linkTypes": ["infiniband"]}]},
        {"resourceName": "all", "selectors": {}},
    ])
    assert got["topo.dev/none"] == []
    assert got["topo.dev/either"] == sorted([node.function("eno2").bdf, node.function("ibp2s0f1").bdf])
    assert len(got["topo.dev/all"]) == len(nics(node)) - 2


def test_pool_options_reach_the_resources(node):
    from allocator.topology import NodeTopology

    topo = NodeTopology.build(nics(node), {}, source="t")
    pools = parse_pools([
        {"resourceName": "vfs", "resourcePrefix": "example.com", "allocationPolicy": "packed",
         "excludeTopology": True, "selectors": {"devices": ["101c"]}},
        {"resourceName": "rest", "selectors": {}},
    ], SRC, dev_root=node.dev_root)
    res = {r.name: r for r in build_resources(topo, ResourceOptions(nic_pools=pools))}
    assert set(res) == {"example.com/vfs", "topo.dev/rest"}
    vfs_res = res["example.com/vfs"]
    assert vfs_res.kind is DeviceKind.NIC and vfs_res.policy == "packed"
    assert all(d.numa is None for d in vfs_res.devices)  # excludeTopology
    assert {d.numa for d in res["topo.dev/rest"].devices} == {0, 1}
    assert res["topo.dev/rest"].policy == "spread"


def test_example_config_of_the_generated_node_is_valid_and_fills_every_pool(node):
    cfg = parse_config(example_config(node), "config.yaml")
    pools = parse_pools(cfg.nic_resource_list, "config.yaml", dev_root=node.dev_root)
    summary, left = summarize(nics(node), pools)
    assert all(s.devices for s in summary), summary
    assert left == ()


def test_env_var_names():
    assert env_var_name("intel.com", "intel_sriov_netdevice") == "PCIDEVICE_INTEL_COM_INTEL_SRIOV_NETDEVICE"
    assert env_var_name("topo.dev", "sriov-a") == "PCIDEVICE_TOPO_DEV_SRIOV_A"
    assert env_var_name("my-corp.io", "x") == "PCIDEVICE_MY_CORP_IO_X"


BAD = [
    ({"resourceList": "x"}, "nics.resourceList", "expected a list"),
    ([["a"]], "nics.resourceList[0]", "expected a mapping"),
    ([{"selectors": {}}], "nics.resourceList[0].resourceName", "is required"),
    ([{"resourceName": "a b", "selectors": {}}], "nics.resourceList[0].resourceName", "letters, digits"),
    ([{"resourceName": "_a", "selectors": {}}], "nics.resourceList[0].resourceName", "not a valid extended resource"),
    ([{"resourceName": "a", "resourcePrefix": "Intel.COM", "selectors": {}}],
     "nics.resourceList[0].resourcePrefix", "not a valid resource domain"),
    ([{"resourceName": "a", "resourcePrefix": "kubernetes.io", "selectors": {}}],
     "nics.resourceList[0].resourcePrefix", "not a valid resource domain"),
    ([{"resourceName": "a"}], "nics.resourceList[0].selectors", "is required"),
    ([{"resourceName": "a", "selectors": []}], "nics.resourceList[0].selectors", "is empty"),
    ([{"resourceName": "a", "selectors": "vendors"}], "nics.resourceList[0].selectors", "expected a list"),
    ([{"resourceName": "a", "selectors": ["x"]}], "nics.resourceList[0].selectors[0]", "must be a mapping"),
    ([{"resourceName": "a", "selector": {}}], "nics.resourceList[0].selector", "did you mean 'selectors'"),
    ([{"resourceName": "a", "deviceType": "accelerator", "selectors": {}}],
     "nics.resourceList[0].deviceType", "only netDevice"),
    ([{"resourceName": "a", "excludeTopology": "yes", "selectors": {}}],
     "nics.resourceList[0].excludeTopology", "true or false"),
    ([{"resourceName": "a", "allocationPolicy": "balanced", "selectors": {}}],
     "nics.resourceList[0].allocationPolicy", "not a NIC policy"),
    ([{"resourceName": "a", "selectors": {}}, {"resourceName": "a", "selectors": {}}],
     "nics.resourceList[1].resourceName", "already defined at nics.resourceList[0]"),
    ([{"resourceName": "a", "selectors": {"vendor": ["15b3"]}}],
     "nics.resourceList[0].selectors.vendor", "did you mean 'vendors'"),
    ([{"resourceName": "a", "selectors": [{"vendors": "15b3"}]}],
     "nics.resourceList[0].selectors[0].vendors", "got the string"),
    ([{"resourceName": "a", "selectors": [{"vendors": ["mellanox"]}]}],
     "nics.resourceList[0].selectors[0].vendors[0]", "not a hex PCI vendor ID"),
    ([{"resourceName": "a", "selectors": [{"devices": [4123]}]}],
     "nics.resourceList[0].selectors[0].devices[0]", "expected a string"),
    ([{"resourceName": "a", "selectors": [{"pciAddresses": ["3b:00"]}]}],
     "nics.resourceList[0].selectors[0].pciAddresses[0]", "not a PCI address"),
    ([{"resourceName": "a", "selectors": [{"pfNames": ["ens1f0#"]}]}],
     "nics.resourceList[0].selectors[0].pfNames[0]", "no VF index after '#'"),
    ([{"resourceName": "a", "selectors": [{"pfNames": ["ens1f0#2-"]}]}],
     "nics.resourceList[0].selectors[0].pfNames[0]", "bad VF index or range '2-'"),
    ([{"resourceName": "a", "selectors": [{"pfNames": ["ens1f0#5-2"]}]}],
     "nics.resourceList[0].selectors[0].pfNames[0]", "end is before its start"),
    ([{"resourceName": "a", "selectors": [{"pfNames": ["#1"]}]}],
     "nics.resourceList[0].selectors[0].pfNames[0]", "names no PF"),
    ([{"resourceName": "a", "selectors": [{"pfNames": ["ens1f0#0-1", "ens1f0#3"]}]}],
     "nics.resourceList[0].selectors[0].pfNames[1]", "already listed"),
    ([{"resourceName": "a", "selectors": [{"pfNames": ["a#1#2"]}]}],
     "nics.resourceList[0].selectors[0].pfNames[0]", "more than one '#'"),
    ([{"resourceName": "a", "selectors": [{"rootDevices": ["ens1f0#1"]}]}],
     "nics.resourceList[0].selectors[0].rootDevices[0]", "not a PCI address"),
    ([{"resourceName": "a", "selectors": [{"linkTypes": ["ethernet"]}]}],
     "nics.resourceList[0].selectors[0].linkTypes[0]", "use 'ether'"),
    ([{"resourceName": "a", "selectors": [{"isRdma": "true"}]}],
     "nics.resourceList[0].selectors[0].isRdma", "true or false"),
    ([{"resourceName": "a", "selectors": [{"isRdma": True, "drivers": ["vfio-pci"]}]}],
     "nics.resourceList[0].selectors[0].isRdma", "no RDMA device"),
    ([{"resourceName": "a", "selectors": [{"ddpProfiles": ["GTPv1"]}]}],
     "nics.resourceList[0].selectors[0].ddpProfiles", "not supported"),
    ([{"resourceName": "a", "selectors": {}, "additionalInfo": {"*": {"k": 1}}}],
     "nics.resourceList[0].additionalInfo.*.k", "expected a string"),
    ([{"resourceName": "a", "selectors": {}, "additionalInfo": {"eth0": {"k": "v"}}}],
     "nics.resourceList[0].additionalInfo.eth0", "not a PCI address"),
]


@pytest.mark.parametrize(("raw", "where", "what"), BAD, ids=[f"{b[1]}:{b[2]}" for b in BAD])
def test_bad_configs_name_file_field_and_fix(raw, where, what):
    if isinstance(raw, dict):
        raw = raw["resourceList"]
    with pytest.raises(NicPoolError) as e:
        parse_pools(raw, SRC)
    msg = str(e.value)
    assert msg.startswith(f"{SRC}: field {where}: "), msg
    assert what in msg
    assert "(fix: " in msg and msg.endswith(")")
    assert e.value.field == where
    assert isinstance(e.value, ConfigError)


def test_yaml_round_trip_of_a_documented_example():
    text = """
version: v1
nics:
  resourceList:
    - resourceName: sriov_gpudirect
      resourcePrefix: example.com
      allocationPolicy: spread
      selectors:
        - vendors: ["15b3"]
          pfNames: ["ens1f0#0-3", "ens2f0"]
          isRdma: true
    - resourceName: dpdk
      excludeTopology: true
      selectors: {drivers: [vfio-pci]}
      additionalInfo:
        "*": {mode: dpdk}
        "0000:1c:00.5": {mode: special}
"""
    cfg = parse_config(text, "x.yaml")
    specs = parse_pool_specs(cfg.nic_resource_list, "x.yaml")
    assert [s.resource_name for s in specs] == ["example.com/sriov_gpudirect", "topo.dev/dpdk"]
    sel = specs[0].selectors[0]
    assert sel.vendors == frozenset({"15b3"}) and sel.is_rdma
    assert sel.pf_names[0].indexes == frozenset({0, 1, 2, 3}) and sel.pf_names[1].indexes is None
    assert specs[1].exclude_topology and specs[1].additional_info["0000:1c:00.5"] == {"mode": "special"}
    assert yaml.safe_load(text)["nics"]["resourceList"][1]["resourceName"] == "dpdk"
