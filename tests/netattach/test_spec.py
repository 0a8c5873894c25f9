"""The records the ledger keeps: what comes back from JSON is what went in (a restart undoes from it)."""

from __future__ import annotations

import json

from plugin.netattach import Attached, InterfaceSpec, RouteSpec


def test_the_pod_name_defaults_to_the_host_name():
    assert InterfaceSpec("ens1f0").pod_name == "ens1f0"
    assert InterfaceSpec("ens1f0", "net1").pod_name == "net1"


def test_an_attachment_survives_its_json_round_trip():
    att = Attached(spec=InterfaceSpec("ens1f0", "net1", addresses=("10.0.0.2/24", "fd00::2/64"),
                                      routes=(RouteSpec("0.0.0.0/0", "10.0.0.1"), RouteSpec("10.9.0.0/16")),
                                      mtu=9000, rdma_device="mlx5_0"),
                   netns="/var/run/netns/cni-1", original_mtu=1500, hw_address="0a:00:00:00:00:01", was_up=True,
                   rdma_moved=True, netns_id=(4, 4026532177), perm_address="0a:00:00:00:00:02")
    assert Attached.from_json(json.loads(json.dumps(att.to_json()))) == att
    bare = Attached(spec=InterfaceSpec("veth1"), netns="/x", original_mtu=1500, hw_address="0a:00:00:00:00:03",
                    was_up=False)
    assert Attached.from_json(json.loads(json.dumps(bare.to_json()))) == bare
