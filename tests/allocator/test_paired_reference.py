"""Objectives with partners against the brute-force oracle of the spec (hypothesis).

Nodes: every shared `nvidia-smi topo -m` topology with NICs (loaded with the
project's simulated-node loader), the built-in nodes (gb200-cx7 and gb300-cx8-dd with
GPU–NIC complexes among them), and generated nodes
(GPUs and NICs under PCIe switches, several NUMA nodes, some devices without
NUMA, VFs sharing ports). Requests: random available set (at most 12 devices,
so the oracle can enumerate), k = 1 ... min(8, |A|), random must-include,
random partners from the other resource (plus a stale ID). Both GPU policies
get NIC partners, both NIC policies get GPU partners.

The answer must tie the oracle on every criterion; since both apply the same
fixed rule, it must be the very same set. It must also be proven optimal.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from allocator.pairing import PairingIndex
from allocator.policies import get_policy
from allocator.request import AllocationRequest
from allocator.topology import NodeTopology
from plugin.model.resources import Resource, ResourceOptions, build_resources
from plugin.sources.simulated import load_simulated

from pairing_testlib import (
    GPU_POLICIES,
    assert_matches_brute_force,
    NIC_POLICIES,
    generated_node,
    shared_topologies,
)

SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])

NODES_WITH_NICS = [str(p) for p in shared_topologies()] + ["dgx-h100", "dgx-a100", "dgx-1-v100",
                                                            "pcie-2socket-4gpu-2nic", "hgx-b200", "gb200-cx7",
                                                            "gb300-cx8-dd"]


def _resources(t: NodeTopology) -> tuple[Resource, Resource, PairingIndex]:
    rs = build_resources(t, ResourceOptions(device_id_strategy="index"))
    gpu = next(r for r in rs if r.name == "nvidia.com/gpu")
    nic = next(r for r in rs if r.name == "topo.dev/nic")
    return gpu, nic, PairingIndex.build(t, {r.name: r.devices for r in rs})


_LOADED: dict[str, tuple[Resource, Resource, PairingIndex] | None] = {}


def _node(source: str) -> tuple[Resource, Resource, PairingIndex] | None:
    if source not in _LOADED:
        t = load_simulated(source)
        _LOADED[source] = _resources(t) if t.gpus and t.nics else None
    return _LOADED[source]


def small_node(rng: random.Random, policy: str) -> tuple[Resource, Resource, PairingIndex]:
    """A generated node of 2-10 GPUs and NICs; (the policy's resource, the other one, the index)."""
    gpu, nic, index = _resources(generated_node(rng, rng.randint(2, 10), rng.randint(2, 10), 2))
    return (gpu, nic, index) if policy in GPU_POLICIES else (nic, gpu, index)


def random_request(rng: random.Random, me: Resource, other: Resource, index: PairingIndex) -> AllocationRequest:
    g = me.graph
    avail = rng.sample(g.ids, rng.randint(1, min(12, len(g.ids))))
    k = rng.randint(1, min(8, len(avail)))
    must = rng.sample(avail, rng.randint(0, min(k, 2)))
    partner_ids = rng.sample(other.graph.ids, rng.randint(0, min(8, len(other.graph.ids))))
    if rng.random() < 0.2:
        partner_ids.append("no-such-device")
    partners = index.partners(me.name, {other.name: partner_ids})
    return AllocationRequest.of(avail, must, k, partners)


def check(me: Resource, policy: str, req: AllocationRequest) -> None:
    assert_matches_brute_force(me.graph, policy, req)


def test_some_shared_topologies_have_nics() -> None:
    """Guard: the shared-topology cases below are not vacuous."""
    with_nics = [s for s in NODES_WITH_NICS if _node(s) is not None]
    assert len(with_nics) >= 8


@pytest.mark.parametrize("source", NODES_WITH_NICS, ids=lambda s: s.rsplit("/", 1)[-1][:40])
@pytest.mark.parametrize("policy", GPU_POLICIES + NIC_POLICIES)
@SETTINGS
@given(rng=st.randoms(use_true_random=False))
def test_shared_topologies_match_oracle(source: str, policy: str, rng: random.Random) -> None:
    node = _node(source)
    if node is None:
        return  # no NICs on this node: nothing pairs (the guard above counts the others)
    gpu, nic, index = node
    me, other = (gpu, nic) if policy in GPU_POLICIES else (nic, gpu)
    check(me, policy, random_request(rng, me, other, index))


@pytest.mark.parametrize("policy", GPU_POLICIES + NIC_POLICIES)
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rng=st.randoms(use_true_random=False), gpus=st.integers(1, 12), nics=st.integers(1, 12),
       numa=st.integers(1, 3))
def test_generated_nodes_match_oracle(policy: str, rng: random.Random, gpus: int, nics: int, numa: int) -> None:
    gpu, nic, index = _resources(generated_node(rng, gpus, nics, numa))
    me, other = (gpu, nic) if policy in GPU_POLICIES else (nic, gpu)
    check(me, policy, random_request(rng, me, other, index))


@pytest.mark.parametrize("policy", GPU_POLICIES + NIC_POLICIES)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rng=st.randoms(use_true_random=False))
def test_unknown_partners_change_nothing(policy: str, rng: random.Random) -> None:
    """Partners that are all stale (or of the requesting resource) give today's answer, exactly."""
    me, other, index = small_node(rng, policy)
    req = random_request(rng, me, other, index)
    stale = index.partners(me.name, {other.name: ["gone-1", "gone-2"], me.name: list(me.graph.ids[:2])})
    assert not stale
    plain = AllocationRequest.of(req.available, req.must_include, req.size)
    with_stale = AllocationRequest.of(req.available, req.must_include, req.size, stale)
    p = get_policy(policy)
    assert p.allocate(me.graph, with_stale) == p.allocate(me.graph, plain)


@pytest.mark.parametrize("policy", GPU_POLICIES + NIC_POLICIES)
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rng=st.randoms(use_true_random=False))
def test_deterministic_and_order_independent(policy: str, rng: random.Random) -> None:
    """Same request twice, or with shuffled available / must-include / partners: the same answer."""
    me, other, index = small_node(rng, policy)
    g = me.graph
    partner_ids = rng.sample(other.graph.ids, rng.randint(1, len(other.graph.ids)))
    avail = rng.sample(g.ids, rng.randint(1, len(g.ids)))
    k = rng.randint(1, len(avail))
    must = rng.sample(avail, rng.randint(0, min(2, k)))
    req = AllocationRequest.of(avail, must, k, index.partners(me.name, {other.name: partner_ids}))
    rng.shuffle(partner_ids)
    shuffled = AllocationRequest.of(rng.sample(avail, len(avail)), rng.sample(must, len(must)), k,
                                    index.partners(me.name, {other.name: partner_ids}))
    p = get_policy(policy)
    first = p.allocate(g, req)
    assert p.allocate(g, req) == first
    again = p.allocate(g, shuffled)
    assert (again.ids, again.pairing) == (first.ids, first.pairing)
