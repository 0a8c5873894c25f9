"""Objectives with partners: the behaviour the spec calls out, on small hand-made nodes,
and the time budget above the exact range."""

from __future__ import annotations

import random

import pytest

from allocator.pairing import PairingIndex, Partners
from allocator.policies import get_policy
from allocator.request import AllocationRequest
from allocator.topology import Device, DeviceKind, Link, NodeTopology
from plugin.model.resources import Resource, ResourceOptions, build_resources
from plugin.sources.simulated import load_simulated

from pairing_testlib import GPU_POLICIES, NIC_POLICIES, generated_node, paired_brute_force, paired_criteria


def node(gpus: list[int | None], nics: list[tuple[int | None, str]], links: dict[tuple[str, str], str],
         default_same: str = "NODE") -> tuple[Resource, Resource, PairingIndex]:
    """GPUs `GPU<i>` with NUMA nodes, NICs `nic<i>` with (NUMA, port), links by name; other
    pairs NODE on one NUMA node, SYS across."""
    devs = [Device(f"GPU{i}", DeviceKind.GPU, i, n) for i, n in enumerate(gpus)]
    devs += [Device(f"nic{i}", DeviceKind.NIC, i, n, port=p) for i, (n, p) in enumerate(nics)]
    table = []
    for a in range(len(devs)):
        for b in range(a + 1, len(devs)):
            x, y = devs[a], devs[b]
            tok = links.get((x.name, y.name)) or links.get((y.name, x.name))
            if tok is None:
                tok = default_same if x.numa == y.numa and x.numa is not None else "SYS"
            table.append((x.name, y.name, Link.parse(tok)))
    t = NodeTopology.build(devs, table, source="test")
    rs = build_resources(t, ResourceOptions(device_id_strategy="index"))
    gpu = next(r for r in rs if r.kind == DeviceKind.GPU)
    nic = next(r for r in rs if r.kind == DeviceKind.NIC)
    return gpu, nic, PairingIndex.build(t, {r.name: r.devices for r in rs})


def ask(me: Resource, policy: str, size: int, partners: Partners, available: list[str] | None = None,
        must: tuple[str, ...] = ()) -> tuple[str, ...]:
    req = AllocationRequest.of(available or me.graph.ids, must, size, partners)
    a = get_policy(policy).allocate(me.graph, req)
    assert a.optimal
    return a.ids


def nvswitch(n: int) -> dict[tuple[str, str], str]:
    return {(f"GPU{a}", f"GPU{b}"): "NV18" for a in range(n) for b in range(a + 1, n)}


@pytest.mark.parametrize("policy", GPU_POLICIES)
def test_each_gpu_wants_a_nic_of_its_own(policy: str) -> None:
    """GPU0 and GPU1 share switch A with nic0; GPU2 and GPU3 share switch B with nic1. With both
    NICs as partners two GPUs of one switch would count nic0 twice; the matching gives one GPU per NIC."""
    links = {**nvswitch(4), ("GPU0", "nic0"): "PIX", ("GPU1", "nic0"): "PIX",
             ("GPU2", "nic1"): "PIX", ("GPU3", "nic1"): "PIX"}
    gpu, nic, idx = node([0] * 4, [(0, "p0"), (0, "p1")], links)
    assert ask(gpu, policy, 2, idx.partners(gpu.name, {nic.name: ["nic0", "nic1"]})) == ("0", "2")


@pytest.mark.parametrize("policy", GPU_POLICIES)
def test_gpu_links_come_before_pairing(policy: str) -> None:
    """GPU0-GPU1 is NV12, GPU2-GPU3 NV4: W(S) outranks X, so the NV12 pair wins even though
    the partner NIC is PIX to GPU2 and GPU3."""
    links = {("GPU0", "GPU1"): "NV12", ("GPU2", "GPU3"): "NV4", ("GPU2", "nic0"): "PIX", ("GPU3", "nic1"): "PIX"}
    gpu, nic, idx = node([0] * 4, [(0, "p0"), (0, "p1")], links)
    assert ask(gpu, policy, 2, idx.partners(gpu.name, {nic.name: ["nic0", "nic1"]})) == ("0", "1")
    # Equal links: pairing decides.
    links[("GPU2", "GPU3")] = "NV12"
    gpu, nic, idx = node([0] * 4, [(0, "p0"), (0, "p1")], links)
    assert ask(gpu, policy, 2, idx.partners(gpu.name, {nic.name: ["nic0", "nic1"]})) == ("2", "3")


def test_partner_numa_counts_in_span() -> None:
    """A NIC partner on NUMA 1: numa-first takes a NUMA-1 GPU (span(S u P) = 1), the one on the
    NIC's switch; without partners a single GPU goes to the lowest position."""
    links = {**nvswitch(4), ("GPU3", "nic1"): "PIX"}
    gpu, nic, idx = node([0, 0, 1, 1], [(0, "p0"), (1, "p1")], links)
    partners = idx.partners(gpu.name, {nic.name: ["nic1"]})
    assert ask(gpu, "numa-first", 1, Partners()) == ("0",)
    assert ask(gpu, "numa-first", 1, partners) == ("3",)


def test_link_first_puts_links_before_joint_span() -> None:
    """NV12 pair on NUMA 0, NV4 pair on NUMA 1, NIC partner on NUMA 1."""
    links = {("GPU0", "GPU1"): "NV12", ("GPU2", "GPU3"): "NV4"}
    gpu, nic, idx = node([0, 0, 1, 1], [(0, "p0"), (1, "p1")], links)
    partners = idx.partners(gpu.name, {nic.name: ["nic1"]})
    assert ask(gpu, "numa-first", 2, partners) == ("2", "3")
    assert ask(gpu, "link-first", 2, partners) == ("0", "1")


@pytest.mark.parametrize("policy", NIC_POLICIES)
def test_nic_pairing_outranks_ports(policy: str) -> None:
    """Two VFs of port pf0 sit on the switch of GPU0 and GPU1, a VF of pf1 elsewhere on the socket.
    Without partners spread takes two ports; with GPU0 and GPU1 as partners both VFs of pf0 pair PIX."""
    links = {("GPU0", "GPU1"): "NV4", ("GPU0", "nic0"): "PIX", ("GPU0", "nic1"): "PIX",
             ("GPU1", "nic0"): "PIX", ("GPU1", "nic1"): "PIX", ("nic0", "nic1"): "PIX"}
    gpu, nic, idx = node([0, 0], [(0, "pf0"), (0, "pf0"), (0, "pf1")], links)
    plain = ask(nic, policy, 2, Partners())
    assert plain == (("nic0", "nic2") if policy == "spread" else ("nic0", "nic1"))
    assert ask(nic, policy, 2, idx.partners(nic.name, {gpu.name: ["0", "1"]})) == ("nic0", "nic1")


@pytest.mark.parametrize("policy", NIC_POLICIES)
def test_dgx_h100_nics_follow_the_gpus(policy: str) -> None:
    t = load_simulated("dgx-h100")
    rs = {r.kind: r for r in build_resources(t, ResourceOptions(device_id_strategy="index"))}
    gpu, nic = rs[DeviceKind.GPU], rs[DeviceKind.NIC]
    idx = PairingIndex.build(t, {r.name: r.devices for r in rs.values()})
    partners = idx.partners(nic.name, {gpu.name: ["1", "2", "6"]})
    assert ask(nic, policy, 3, partners) == ("mlx5_1", "mlx5_2", "mlx5_6")
    # The GPUs' side, with must-include: GPU0 is kept; the other GPU is the PIX partner of mlx5_5,
    # and the report shows the matching.
    req = AllocationRequest.of(gpu.graph.ids, ["0"], 2, idx.partners(gpu.name, {nic.name: ["mlx5_5", "mlx5_6"]}))
    a = get_policy("numa-first").allocate(gpu.graph, req)
    assert a.ids == ("0", "5")
    assert a.pairs == (("0", "topo.dev/nic=mlx5_6", 10), ("5", "topo.dev/nic=mlx5_5", 50))
    assert a.pairing == 60


def test_partner_of_the_same_kind_counts_for_span_only() -> None:
    """A GPU partner (another GPU resource) adds no pairing weight but its NUMA node still counts."""
    links = nvswitch(4)
    gpu, _, _ = node([0, 0, 1, 1], [(0, "p0")], links)
    other_gpu = Partners(("example.com/gpu=x",), (1,), {})
    a = get_policy("numa-first").allocate(gpu.graph, AllocationRequest.of(gpu.graph.ids, [], 2, other_gpu))
    assert a.ids == ("2", "3")
    assert (a.pairing, a.pairs) == (0, ())


# -- the time budget above the exact range ----------------------------------------------
def _big_cases() -> list[tuple[Resource, str, AllocationRequest]]:
    out = []
    for seed in range(6):
        rng = random.Random(seed)
        gpu, nic, idx = _resources_of(generated_node(rng, 24, 20, 3, p_nvlink=0.3))
        for policy, me, other in (("numa-first", gpu, nic), ("spread", nic, gpu)):
            partners = idx.partners(me.name, {other.name: rng.sample(other.graph.ids, 8)})
            must = tuple(rng.sample(me.graph.ids, 1))
            out.append((me, policy, AllocationRequest.of(me.graph.ids, must, 8, partners)))
    return out


def _resources_of(t: NodeTopology) -> tuple[Resource, Resource, PairingIndex]:
    rs = build_resources(t, ResourceOptions(device_id_strategy="index"))
    return (next(r for r in rs if r.kind == DeviceKind.GPU), next(r for r in rs if r.kind == DeviceKind.NIC),
            PairingIndex.build(t, {r.name: r.devices for r in rs}))


def test_above_the_exact_range_answers_are_valid_and_optimal_is_truthful() -> None:
    """20-24 candidates, k = 8: with a budget too small to finish, the answer is still k valid IDs with
    must-include and the smallest span(S u P), and says it is not proven; unlimited, it is proven; an
    answer that says it is optimal equals the unlimited one."""
    cut = 0
    for me, policy, req in _big_cases():
        exact = get_policy(policy, time_budget_s=None).allocate(me.graph, req)
        assert exact.optimal
        for budget in (1e-9, 0.02):
            a = get_policy(policy, time_budget_s=budget).allocate(me.graph, req)
            assert len(a.ids) == len(set(a.ids)) == req.size
            assert set(a.ids) <= set(req.available) and set(req.must_include) <= set(a.ids)
            span = paired_criteria(me.graph, policy, req, a.ids)[0]
            assert span == paired_criteria(me.graph, policy, req, exact.ids)[0]
            if a.optimal:
                assert a.ids == exact.ids
            elif budget == 1e-9:
                cut += 1
    assert cut >= 3, "the budget never cut a search short: the cases are too easy to test it"


def test_exact_answer_above_sixteen_matches_oracle() -> None:
    """One case above the exact range, checked by enumeration: 18 NICs, k = 3."""
    rng = random.Random(7)
    gpu, nic, idx = _resources_of(generated_node(rng, 8, 18, 2))
    req = AllocationRequest.of(nic.graph.ids, [], 3, idx.partners(nic.name, {gpu.name: ["0", "3", "5"]}))
    a = get_policy("spread", time_budget_s=None).allocate(nic.graph, req)
    assert a.ids == paired_brute_force(nic.graph, "spread", req)
