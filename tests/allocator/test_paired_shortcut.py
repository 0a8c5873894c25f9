"""The shortcut that answers a request with partners without a search (`pairing_shortcuts.forced_pairing`).

Requests where it applies are generated on purpose (partners whose own best
device is free and unique: GPU i with its PIX NIC on a DGX H100, generated
PCIe trees) and the answer is compared with the brute-force oracle of the
spec; requests where it must not apply (a partner's best device taken, tied
best devices, more devices asked than partners) are checked to go to the search.
"""

from __future__ import annotations

import random

import pytest

from allocator.pairing import PairingIndex
from allocator.policies import get_policy
from allocator.policies.pairing_problem import PairedProblem
from allocator.policies.pairing_shortcuts import forced_pairing
from allocator.policies.problem import Problem
from allocator.request import AllocationRequest
from plugin.model.resources import ResourceOptions, build_resources
from plugin.sources.simulated import load_simulated

from pairing_testlib import generated_node, paired_brute_force, paired_criteria

POLICIES = {"nvidia.com/gpu": ("numa-first", "link-first"), "topo.dev/nic": ("spread", "packed")}


def node(t):
    rs = {r.name: r for r in build_resources(t, ResourceOptions(device_id_strategy="index"))}
    return rs, PairingIndex.build(t, {r.name: r.devices for r in rs.values()})


def shortcut_applies(graph, policy, req) -> bool:
    p = Problem.build(graph, req)
    return forced_pairing(PairedProblem.build(p, req.partners)) is not None


@pytest.mark.parametrize("seed", range(40))
def test_requests_the_shortcut_answers_are_the_oracles(seed):
    rng = random.Random(seed)
    t = load_simulated("dgx-h100") if seed % 2 else generated_node(rng, rng.randint(3, 9), rng.randint(3, 9), 2,
                                                                   p_nvlink=rng.choice((0.0, 1.0)))
    rs, index = node(t)
    hits = 0
    for me_name, other_name in (("nvidia.com/gpu", "topo.dev/nic"), ("topo.dev/nic", "nvidia.com/gpu")):
        me, other = rs[me_name], rs[other_name]
        for policy in POLICIES[me_name]:
            for _ in range(15):
                k = rng.randint(1, min(4, len(me.graph.ids), len(other.graph.ids)))
                partner_ids = rng.sample(other.graph.ids, k)
                partners = index.partners(me.name, {other.name: partner_ids})
                avail = rng.sample(me.graph.ids, rng.randint(k, len(me.graph.ids)))
                best = {max(avail, key=lambda c: partners.row(c)[j]) for j in range(len(partners))}
                must = rng.sample(sorted(best & set(avail)), rng.randint(0, min(1, len(best & set(avail)))))
                req = AllocationRequest.of(avail, must, k, partners)
                got = get_policy(policy).allocate(me.graph, req)
                want = paired_brute_force(me.graph, policy, req)
                assert paired_criteria(me.graph, policy, req, got.ids) == paired_criteria(me.graph, policy, req, want)
                assert set(got.ids) == set(want), (policy, req)
                hits += shortcut_applies(me.graph, policy, req)
    if seed % 2:
        assert hits > 0  # on a DGX H100 the shortcut answers some of these


def test_it_stays_out_where_it_proves_nothing():
    rs, index = node(load_simulated("dgx-h100"))
    gpu, nic = rs["nvidia.com/gpu"], rs["topo.dev/nic"]
    nics = list(nic.graph.ids)
    pair = index.partners(nic.name, {gpu.name: ["2", "6"]})
    assert shortcut_applies(nic.graph, "spread", AllocationRequest.of(nics, [], 2, pair))
    # GPU2's PIX NIC is taken: the best NIC for it is no longer unique.
    assert not shortcut_applies(nic.graph, "spread", AllocationRequest.of(
        [n for n in nics if n != "mlx5_2"], [], 2, pair))
    # More NICs than partners, or must-include outside the best NICs: a search decides the rest.
    assert not shortcut_applies(nic.graph, "spread", AllocationRequest.of(nics, [], 3, pair))
    assert not shortcut_applies(nic.graph, "spread", AllocationRequest.of(nics, ["mlx5_0"], 2, pair))
    # DGX A100: two NICs behind each GPU's switch tie, so nothing is forced.
    rs, index = node(load_simulated("dgx-a100"))
    a100 = index.partners("topo.dev/nic", {"nvidia.com/gpu": ["2"]})
    assert not shortcut_applies(rs["topo.dev/nic"].graph, "spread",
                                AllocationRequest.of(list(rs["topo.dev/nic"].graph.ids), [], 1, a100))
