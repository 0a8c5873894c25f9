"""The claim's NicConfig: what each NIC becomes in the pod, and every bad configuration refused naming its field
and the fix (issue 21).

`nic_plan` asks the node one question, the maximum MTU of a netdev (None: no such interface); here a table of
the simulated node's netdevs answers it (the hardware boundary). tests/dra/test_pod_network.py asks a real
kernel about real veth pairs.
"""

from __future__ import annotations

import copy

import pytest

from plugin.dra.claims.claim import parse_claim
from plugin.dra.claims.prepared import NicNetwork, Route
from plugin.dra.network.nic_config import API_VERSION, KIND, NicConfigError, PlanLimits, nic_plan
from plugin.dra.slices.build import SliceOptions, device_table
from plugin.sources.simulated import load_node_yaml

DRIVER = "topo.dev"
NODE_YAML = """\
apiVersion: topo-device-plugin/v1
kind: SimulatedNode
gpus: [{numa: 0}, {numa: 0}]
nics:
  - {name: nic0, numa: 0, netdev: ens1f0, rdmaDevice: mlx5_0}
  - {name: nic1, numa: 0, netdev: ens1f1}
  - {name: nic2, numa: 0, netdev: eth0}
  - {name: vf0, numa: 0}
"""
#: Maximum MTU per netdev on the simulated node (what plugin.netattach.max_mtu reads from the kernel).
MAX_MTU = {"ens1f0": 9000, "ens1f1": 9216, "eth0": 1500}
TABLE = device_table(load_node_yaml(NODE_YAML, "node.yaml"), SliceOptions(node_name="node-a"))


def allocated(**requests: list[str]) -> list:
    """(device name, Device, [request]) per device, as the preparer hands them over."""
    return [(d, TABLE[d], [r]) for r, devices in requests.items() for d in devices]


def claim(*entries: dict, source: str = "FromClaim") -> dict:
    return {"status": {"allocation": {"devices": {"config": [{"source": source, **e} for e in entries]}}}}


def nic_config(requests=None, driver=DRIVER, **params) -> dict:
    entry: dict = {"opaque": {"driver": driver, "parameters": {"apiVersion": API_VERSION, "kind": KIND, **params}}}
    if requests is not None:
        entry["requests"] = requests
    return entry


def plan(c: dict, alloc: list, limits: PlanLimits = PlanLimits()) -> dict:
    return nic_plan("team/pair", parse_claim(c), DRIVER, alloc, MAX_MTU.get, limits)


PAIR = allocated(gpus=["gpu-0", "gpu-1"], nic=["nic-nic0"])


def test_no_config_attaches_each_nic_under_its_own_name_and_leaves_gpus_and_netdevless_nics_alone():
    got = plan(claim(), allocated(gpus=["gpu-0"], a=["nic-nic0"], b=["nic-nic1"], vf=["nic-vf0"]))
    assert got == {"nic-nic0": NicNetwork("ens1f0", "ens1f0", rdma_device="mlx5_0"),
                   "nic-nic1": NicNetwork("ens1f1", "ens1f1")}


def test_a_full_config_becomes_the_nics_pod_interface():
    c = claim(nic_config(["nic"], interfaceName="net1", addresses=["192.0.2.10/24", "2001:db8::10/64"],
                         routes=[{"destination": "198.51.100.0/24", "gateway": "192.0.2.1"},
                                 {"destination": "0.0.0.0/0"}], mtu=9000))
    assert plan(c, PAIR) == {"nic-nic0": NicNetwork("ens1f0", "net1", ("192.0.2.10/24", "2001:db8::10/64"),
                                                     (Route("198.51.100.0/24", "192.0.2.1"), Route("0.0.0.0/0")),
                                                     9000, "mlx5_0")}


def test_the_claims_entry_overrides_the_classs_and_other_drivers_entries_are_not_ours():
    c = claim(nic_config(mtu=1500), source="FromClass")
    c["status"]["allocation"]["devices"]["config"] += [
        {"source": "FromClaim", **nic_config(["nic"], mtu=4000)},
        {"source": "FromClaim", "opaque": {"driver": "gpu.nvidia.com", "parameters": {"anything": True}}}]
    assert plan(c, PAIR)["nic-nic0"].mtu == 4000


def test_mtu_and_routes_only_config_applies_to_every_nic_of_a_request():
    got = plan(claim(nic_config(["nics"], mtu=9000)), allocated(nics=["nic-nic0", "nic-nic1"]))
    assert {n.pod_name: n.mtu for n in got.values()} == {"ens1f0": 9000, "ens1f1": 9000}


def _with(entry_change) -> dict:
    c = claim(nic_config(["nic"], interfaceName="net1", addresses=["192.0.2.10/24"], mtu=9000))
    entry_change(c["status"]["allocation"]["devices"]["config"][0]["opaque"]["parameters"])
    return c


P = "spec.devices.config[0].opaque.parameters"

#: (what is wrong, the claim, the allocation, the field the message must name, a word of the fix)
BAD = [
    ("malformed address", _with(lambda p: p.update(addresses=["192.0.2.300/24"])), PAIR,
     f"{P}.addresses[0]", "prefix length"),
    ("address without a prefix", _with(lambda p: p.update(addresses=["192.0.2.10"])), PAIR,
     f"{P}.addresses[0]", "192.0.2.10/24"),
    ("address not in canonical form", _with(lambda p: p.update(addresses=["2001:DB8:0::10/64"])), PAIR,
     f"{P}.addresses[0]", "2001:db8::10/64"),
    ("IPv4-mapped address", _with(lambda p: p.update(addresses=["::ffff:192.0.2.1/120"])), PAIR,
     f"{P}.addresses[0]", "192.0.2.1/24"),
    ("address listed twice", _with(lambda p: p.update(addresses=["192.0.2.10/24", "192.0.2.10/24"])), PAIR,
     f"{P}.addresses", "once"),
    ("addresses not a list", _with(lambda p: p.update(addresses="192.0.2.10/24")), PAIR,
     f"{P}.addresses", "addresses: ["),
    ("route with host bits", _with(lambda p: p.update(routes=[{"destination": "198.51.100.7/24"}])), PAIR,
     f"{P}.routes[0].destination", "198.51.100.0/24"),
    ("route to nowhere", _with(lambda p: p.update(routes=[{"destination": "somewhere"}])), PAIR,
     f"{P}.routes[0].destination", "CIDR"),
    ("route gateway not an address", _with(lambda p: p.update(routes=[{"destination": "0.0.0.0/0",
                                                                       "gateway": "router"}])), PAIR,
     f"{P}.routes[0].gateway", "gateway: 192.0.2.1"),
    ("route gateway of the other family", _with(lambda p: p.update(routes=[{"destination": "0.0.0.0/0",
                                                                            "gateway": "2001:db8::1"}])), PAIR,
     f"{P}.routes[0].gateway", "family"),
    ("route gateway outside every address's network",
     _with(lambda p: p.update(routes=[{"destination": "198.51.100.0/24", "gateway": "203.0.113.1"}])), PAIR,
     f"{P}.routes[0].gateway", "inside 192.0.2.0/24"),
    ("route gateway on an interface without an address of its family",
     _with(lambda p: p.update(routes=[{"destination": "2001:db8:1::/48", "gateway": "2001:db8::1"}])), PAIR,
     f"{P}.routes[0].gateway", "address in the gateway's network"),
    ("route gateway on an interface without addresses",
     claim(nic_config(["nic"], routes=[{"destination": "0.0.0.0/0", "gateway": "192.0.2.1"}])), PAIR,
     f"{P}.routes[0].gateway", "address in the gateway's network"),
    ("one address on two NICs of the claim",
     claim(nic_config(["a"], addresses=["192.0.2.10/24"]), nic_config(["b"], addresses=["192.0.2.10/25"])),
     allocated(a=["nic-nic0"], b=["nic-nic1"]), "spec.devices.config[1].opaque.parameters.addresses",
     "addresses of its own"),
    ("unknown route field", _with(lambda p: p.update(routes=[{"destination": "0.0.0.0/0", "metric": 5}])), PAIR,
     f"{P}.routes[0].metric", "destination and gateway"),
    ("mtu above the device's maximum", _with(lambda p: p.update(mtu=9500)), PAIR,
     f"{P}.mtu", "at most 9000"),
    ("mtu not a number", _with(lambda p: p.update(mtu="jumbo")), PAIR, f"{P}.mtu", "whole number"),
    ("mtu too small for IPv6", _with(lambda p: p.update(mtu=1000, addresses=["2001:db8::1/64"])), PAIR,
     f"{P}.mtu", "1280"),
    ("interface name lo", _with(lambda p: p.update(interfaceName="lo")), PAIR,
     f"{P}.interfaceName", "net1"),
    ("interface name of the primary CNI", _with(lambda p: p.update(interfaceName="eth0")), PAIR,
     f"{P}.interfaceName", "another name"),
    ("a NIC whose own name is the primary CNI's", claim(), allocated(nic=["nic-nic2"]),
     "device nic-nic2", "interfaceName"),
    ("interface name too long", _with(lambda p: p.update(interfaceName="a-very-long-name0")), PAIR,
     f"{P}.interfaceName", "1 to 15"),
    ("unknown field", _with(lambda p: p.update(ethtool={"tso": False})), PAIR,
     f"{P}.ethtool", "remove or rename"),
    ("wrong kind", _with(lambda p: p.update(kind="NetConfig")), PAIR, f"{P}.kind", f"kind: {KIND}"),
    ("wrong apiVersion", _with(lambda p: p.update(apiVersion="net.topo-device-plugin.io/v1")), PAIR,
     f"{P}.apiVersion", API_VERSION),
    ("two requests naming one interface",
     claim(nic_config(["a"], interfaceName="net1"), nic_config(["b"], interfaceName="net1")),
     allocated(a=["nic-nic0"], b=["nic-nic1"]), "spec.devices.config[1].opaque.parameters.interfaceName",
     "its own interfaceName"),
    ("interfaceName on a request of two NICs", claim(nic_config(["nics"], interfaceName="net1")),
     allocated(nics=["nic-nic0", "nic-nic1"]), f"{P}.interfaceName", "count: 1"),
    ("addresses on a request of two NICs", claim(nic_config(["nics"], addresses=["192.0.2.1/24"])),
     allocated(nics=["nic-nic0", "nic-nic1"]), f"{P}.addresses", "count: 1"),
    ("a request the claim does not have", claim(nic_config(["nic", "storage"], mtu=1500)), PAIR,
     "spec.devices.config[0].requests", "gpus, nic"),
    ("config on a GPU request", claim(nic_config(["gpus"], mtu=1500)), PAIR,
     "spec.devices.config[0].requests", "NIC requests only"),
    ("config on a NIC without a netdev", claim(nic_config(["vf"], mtu=1500)), allocated(vf=["nic-vf0"]),
     P, "NICs with a netdev"),
    ("parameters not a mapping", claim({"opaque": {"driver": DRIVER, "parameters": ["mtu", 9000]}}), PAIR,
     P, f"apiVersion: {API_VERSION}"),
]


@pytest.mark.parametrize("what,c,alloc,field,fix", BAD, ids=[b[0] for b in BAD])
def test_bad_configuration_is_refused_naming_the_field_and_the_fix(what, c, alloc, field, fix):
    with pytest.raises(NicConfigError) as e:
        plan(c, alloc)
    msg = str(e.value)
    assert msg.startswith("ResourceClaim team/pair: "), msg
    assert field in msg, msg
    fix_part = msg.split("(fix: ", 1)[1]
    assert fix in fix_part, msg


def test_a_gateway_is_reached_through_an_address_of_its_network_or_ipv6_link_local():
    c = claim(nic_config(["nic"], addresses=["192.0.2.10/24", "2001:db8::10/64"],
                         routes=[{"destination": "198.51.100.0/24", "gateway": "192.0.2.254"},
                                 {"destination": "2001:db8:1::/48", "gateway": "2001:db8::1"},
                                 {"destination": "2001:db8:2::/48", "gateway": "fe80::1"},
                                 {"destination": "203.0.113.0/24"}]))
    assert [r.gateway for r in plan(c, PAIR)["nic-nic0"].routes] == ["192.0.2.254", "2001:db8::1", "fe80::1", None]


def test_a_netdev_missing_from_the_node_is_refused_before_anything_moves():
    with pytest.raises(NicConfigError, match=r"device nic-nic0: network interface ens1f0 .* not in the node's "):
        nic_plan("team/pair", parse_claim(claim()), DRIVER, PAIR, lambda _: None, PlanLimits())


def test_class_entries_are_named_as_the_classs():
    c = claim(nic_config(mtu=99999), source="FromClass")
    with pytest.raises(NicConfigError, match=r"config\[0\] from the DeviceClass\.opaque\.parameters\.mtu"):
        plan(c, PAIR)


def test_without_attachment_a_config_is_refused_saying_how_to_turn_it_on_and_nics_stay():
    off = PlanLimits(unavailable="NRI is not connected", unavailable_fix="turn NRI on in containerd")
    with pytest.raises(NicConfigError, match=r"NRI is not connected \(fix: turn NRI on in containerd, or remove"):
        plan(claim(nic_config(["nic"], mtu=1500)), PAIR, off)
    assert plan(claim(), PAIR, off) == {}  # without a NicConfig the claim is prepared, its NICs stay put


def test_the_primary_interface_name_is_the_nodes_choice():
    limits = PlanLimits(taken_names=("lo", "net0"))
    assert plan(claim(), allocated(nic=["nic-nic2"]), limits)["nic-nic2"].pod_name == "eth0"
    with pytest.raises(NicConfigError, match="net0 is taken"):
        plan(claim(nic_config(["nic"], interfaceName="net0")), PAIR, limits)


def test_a_valid_claim_is_not_changed_by_planning():
    c = claim(nic_config(["nic"], interfaceName="net1", addresses=["192.0.2.10/24"]))
    before = copy.deepcopy(c)
    plan(c, PAIR)
    assert c == before


ADDRESS_FORMS = ["192.0.2.10/24", "2001:db8::10/64", "2001:DB8::10/64", "2001:db8:0::10/64", "fe80::1/64",
                 "2001:0db8::1/64", "::ffff:192.0.2.1/120", "192.0.2.0/24", "::1/128", "10.0.0.1/32"]


@pytest.mark.parametrize("address", ADDRESS_FORMS)
def test_addresses_are_refused_exactly_when_the_api_server_would_refuse_them_in_networkdata(address, claim_validator):
    """An address we accept at prepare ends up in networkData.ips; one the API server refuses there would leave a
    claim status we can never write. Both sides must agree, address by address."""
    from claim_validation import run_validator

    try:
        plan(_with(lambda p: p.update(addresses=[address])), PAIR)
        ours = True
    except NicConfigError:
        ours = False
    status_claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                    "metadata": {"name": "pair", "namespace": "team", "uid": "0b4c1d1e-0000-4000-8000-00000000000a"},
                    "spec": {"devices": {"requests": []}},
                    "status": {"allocation": {"devices": {"results": [
                        {"request": "nic", "driver": DRIVER, "pool": "node-a", "device": "nic-nic0"}]}},
                        "devices": [{"driver": DRIVER, "pool": "node-a", "device": "nic-nic0", "conditions": [],
                                     "networkData": {"interfaceName": "net1", "ips": [address]}}]}}
    theirs = run_validator(claim_validator, status_claim)
    assert ours == (theirs.returncode == 0), (address, ours, theirs.stderr)
