"""The search with partners on the built-in nodes, up to all 16 GPUs of the DGX-2, against brute force.

Why a second oracle test beside `test_paired_reference.py`: that one keeps at
most 12 available devices so the oracle can enumerate any k; the cost the
paired search saves (problem and branch-and-bound set-up built once, duals
computed only when the credits do not prune, one-pass twin classes) shows on
the full nodes the kubelet sends, so here every built-in node with GPUs and
NICs is asked with free sets up to the whole node (the DGX-2's 16 GPUs
sharing 8 NICs included), k = 1 ... 4 (so brute force still enumerates
every set), random must-include and random partners from the other resource
as a container's earlier `Allocate` gives them.

The answer must be the oracle's very set (both apply the fixed rule), proven
optimal, with the reported pairing its X and its pairs a one-to-one matching.
On the NVSwitch nodes the GPU policies may answer without a search
(`pairing_shortcuts.uniform_links_pairing`); partners with arbitrary, often tied weights
check that shortcut where the built-in NICs rarely lead (one GPU the best of
two partners, partners without a NUMA node).
"""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from allocator.pairing import PairingIndex, Partners, pairing_weight
from allocator.policies import get_policy
from allocator.request import AllocationRequest
from plugin.model.resources import Resource, ResourceOptions, build_resources
from plugin.sources.simulated import builtin_names, load_simulated

from pairing_testlib import GPU_POLICIES, NIC_POLICIES, assert_matches_brute_force, paired_brute_force

_NODES: dict[str, tuple[Resource, Resource, PairingIndex] | None] = {}


def _node(name: str) -> tuple[Resource, Resource, PairingIndex] | None:
    """(GPU resource, NIC resource, pairing index) of a built-in node; None when it lacks either."""
    if name not in _NODES:
        t = load_simulated(name)
        rs = build_resources(t, ResourceOptions(device_id_strategy="index"))
        gpu = next((r for r in rs if r.name == "nvidia.com/gpu"), None)
        nic = next((r for r in rs if r.name == "topo.dev/nic"), None)
        _NODES[name] = (gpu, nic, PairingIndex.build(t, {r.name: r.devices for r in rs})) if gpu and nic else None
    return _NODES[name]


PAIRING_NODES = [n for n in builtin_names() if _node(n) is not None]


def test_the_sixteen_gpu_node_is_among_them() -> None:
    """Guard: the node the optimisation is for (16 GPUs, 8 NICs) is checked, with all its devices."""
    assert "dgx-2-v100" in PAIRING_NODES
    gpu, nic, _ = _node("dgx-2-v100")
    assert (len(gpu.graph.ids), len(nic.graph.ids)) == (16, 8)


def _request(rng: random.Random, me: Resource, other: Resource, index: PairingIndex) -> AllocationRequest:
    ids = list(me.graph.ids)
    # A third of the requests see the whole node free (the walk's first pods), the rest a random part.
    avail = ids if rng.random() < 1 / 3 else rng.sample(ids, rng.randint(1, len(ids)))
    k = rng.randint(1, min(5, len(avail)))
    must = rng.sample(avail, rng.randint(0, min(k, 2)))
    partner_ids = rng.sample(other.graph.ids, rng.randint(1, min(8, len(other.graph.ids))))
    return AllocationRequest.of(avail, must, k, index.partners(me.name, {other.name: partner_ids}))


@pytest.mark.parametrize("name", PAIRING_NODES)
@pytest.mark.parametrize("policy", GPU_POLICIES + NIC_POLICIES)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rng=st.randoms(use_true_random=False))
def test_full_nodes_match_brute_force(name: str, policy: str, rng: random.Random) -> None:
    gpu, nic, index = _node(name)
    me, other = (gpu, nic) if policy in GPU_POLICIES else (nic, gpu)
    req = _request(rng, me, other, index)
    assert_matches_brute_force(me.graph, policy, req)


@pytest.mark.parametrize("name", ["dgx-2-v100", "dgx-a100", "dgx-h100"])
@pytest.mark.parametrize("policy", GPU_POLICIES)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rng=st.randoms(use_true_random=False))
def test_nvswitch_nodes_with_any_partner_weights_match_brute_force(name: str, policy: str,
                                                                     rng: random.Random) -> None:
    """All GPUs of these nodes share one link, where the GPU policies answer without a search when the
    partners' best GPUs allow it: partners whose weights tie often (one GPU the best of several
    partners, several GPUs the best of one, partners on no NUMA node) must still get the oracle's set."""
    gpu, _, _ = _node(name)
    g = gpu.graph
    ids = list(g.ids)
    avail = ids if rng.random() < 1 / 3 else rng.sample(ids, rng.randint(2, len(ids)))
    k = rng.randint(1, min(5, len(avail)))
    must = rng.sample(avail, rng.randint(0, min(k, 2)))
    n = rng.randint(1, 5)
    nodes = sorted({x for x in g.numa if x is not None}) + [None]
    weights = {i: tuple(rng.choice((0, 10, 20, 50)) for _ in range(n)) for i in ids if rng.random() < 0.8}
    partners = Partners(tuple(f"nic=p{j}" for j in range(n)), tuple(rng.choice(nodes) for _ in range(n)),
                        {i: r for i, r in weights.items() if any(r)})
    req = AllocationRequest.of(avail, must, k, partners)
    got = get_policy(policy).allocate(g, req)
    ref = paired_brute_force(g, policy, req)
    assert got.ids == ref
    assert got.optimal
    assert got.pairing == pairing_weight([partners.row(i) for i in got.ids], n)
