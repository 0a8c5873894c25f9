"""`PairingService.nccl_env_for`: which Allocate answer of a container carries each NCCL variable.

The kubelet merges a container's Allocate answers keeping one value of a
variable two answers set (devicemanager `deviceRunContainerOptions`, over a
map: which one is arbitrary), so each variable must be given by one answer
only, also when a container has NICs of several pools. On a generated DGX
H100 whose GPUs 0-3 have InfiniBand NICs and GPUs 4-7 Ethernet NICs, served
as two NIC pools (or the RDMA NICs split into two pools).
"""

from __future__ import annotations

import pytest

from allocator.topology import Device
from plugin.allocation.pairing_service import PairingService
from plugin.model.resource import ResourceDevice
from topo_testkit.nccl_nodes import dgx_h100_mixed_node
from topo_testkit.sysfs_fixture import GeneratedNode, write_node

GPU = "nvidia.com/gpu"


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def node(tmp_path) -> GeneratedNode:
    return write_node(dgx_h100_mixed_node(), str(tmp_path / "node"))


def service(node: GeneratedNode, pools: dict[str, list[str]], nccl_env: bool = True) -> PairingService:
    """GPUs (ID `GPU<i>`) and the NIC pools `pools` (resource -> netdevs; ID: the netdev)."""
    t = node.topology
    by_bdf = {d.name: d for d in t.nics}

    def member(i: str, d: Device) -> ResourceDevice:
        return ResourceDevice(i, d, d.numa)

    resources = {GPU: [member(g.name, g) for g in t.gpus]}
    for res, netdevs in pools.items():
        resources[res] = [member(n, by_bdf[node.function(n).bdf]) for n in netdevs]
    s = PairingService(1.0, Clock(), nccl_env=nccl_env)
    s.rebuild(t, resources)
    return s


def allocate(s: PairingService, res: str, ids: list[str]) -> dict[str, str]:
    s.on_allocate(res, ids)
    return s.nccl_env_for(res)


def test_two_pools_of_different_kinds_each_give_their_own_variable_once(node):
    s = service(node, {"example.com/rdma": ["ibp0s0", "ibp1s0"], "example.com/eth": ["ens4np0", "ens5np0"]})
    assert allocate(s, GPU, ["GPU4", "GPU0"]) == {}
    assert allocate(s, "example.com/eth", ["ens4np0"]) == {"NCCL_SOCKET_IFNAME": "=ens4np0"}
    rdma = node.function("ibp0s0").rdma_dev
    assert allocate(s, "example.com/rdma", ["ibp0s0"]) == {"NCCL_IB_HCA": f"={rdma}:1"}
    # The next container (GPU again: a new group) is hinted afresh.
    assert allocate(s, GPU, ["GPU1"]) == {}
    assert allocate(s, "example.com/rdma", ["ibp1s0"]) == {"NCCL_IB_HCA": f"={node.function('ibp1s0').rdma_dev}:1"}


def test_a_second_pool_of_the_same_kind_never_sets_the_variable_again(node):
    """The first answer that knows GPUs and NICs sets NCCL_IB_HCA; a later pool of the same container
    would set it with another value, which the kubelet would resolve arbitrarily, so it does not."""
    s = service(node, {"example.com/rdma-a": ["ibp0s0"], "example.com/rdma-b": ["ibp1s0"]})
    allocate(s, GPU, ["GPU0", "GPU1"])
    assert allocate(s, "example.com/rdma-a", ["ibp0s0"]) == {"NCCL_IB_HCA": f"={node.function('ibp0s0').rdma_dev}:1"}
    assert allocate(s, "example.com/rdma-b", ["ibp1s0"]) == {}


def test_when_the_gpus_come_last_their_answer_names_every_pools_nics(node):
    s = service(node, {"example.com/rdma-a": ["ibp0s0"], "example.com/rdma-b": ["ibp1s0"]})
    assert allocate(s, "example.com/rdma-b", ["ibp1s0"]) == {}
    assert allocate(s, "example.com/rdma-a", ["ibp0s0"]) == {}  # NICs alone: nothing to pair yet
    a, b = node.function("ibp0s0").rdma_dev, node.function("ibp1s0").rdma_dev
    assert allocate(s, GPU, ["GPU1", "GPU0"]) == {"NCCL_IB_HCA": f"={a}:1,{b}:1"}  # GPU0's first


def test_off_gives_nothing(node):
    s = service(node, {"example.com/rdma": ["ibp0s0"]}, nccl_env=False)
    allocate(s, GPU, ["GPU0"])
    assert allocate(s, "example.com/rdma", ["ibp0s0"]) == {}
