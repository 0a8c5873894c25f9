"""The spec's GPU–NIC complex rule in the allocator: a GPU and a NIC of one complex pair as PIX.

Checked: the weight itself (only the complex pair changes, every other pair keeps its PCIe
weight, GPU–GPU and NIC–NIC pairs stay out); nodes without complexes get exactly today's
weights and answers; on the Grace / ConnectX-8 built-ins every preferred answer with partners
is the optimum of the spec's objectives, computed by the spec-literal oracle
(`topo_testkit.pairing_oracle`, which reads the complex rule from the spec text, not from the
allocator); and what that buys: on gb300-cx8-dd the GPU request with a NIC partner picks the
complex's GPU, which the PCIe path alone cannot tell from its socket neighbour.
"""

from __future__ import annotations

import dataclasses
import random

import pytest
from topo_testkit.pairing_oracle import oracle_for

from allocator.pairing import PairingIndex, pair_weight
from allocator.policies import get_policy
from allocator.request import AllocationRequest
from allocator.topology import ComplexKind, Device, DeviceKind, Link, NodeTopology
from plugin.model.resources import Resource, ResourceOptions, build_resources
from plugin.sources import builtin_names
from plugin.sources.simulated import load_simulated

from pairing_testlib import GPU_POLICIES, NIC_POLICIES

PLATFORMS = ("gb200-cx7", "gb300-cx8-dd")


def _tray() -> NodeTopology:
    """Two GPUs and three NICs on one socket; GPU0's complex NIC is nic1, across the sockets (SYS)."""
    dd = ComplexKind.DATA_DIRECT
    devs = [
        Device("GPU0", DeviceKind.GPU, 0, 0, complex="c0", complex_kind=dd),
        Device("GPU1", DeviceKind.GPU, 1, 0),
        Device("nic0", DeviceKind.NIC, 0, 0, port="nic0"),
        Device("nic1", DeviceKind.NIC, 1, 1, port="nic1", complex="c0", complex_kind=dd),
        Device("nic2", DeviceKind.NIC, 2, 0, port="nic2", complex="c0", complex_kind=dd),
    ]
    links = [("GPU0", "nic0", Link.parse("PXB")), ("GPU1", "nic0", Link.parse("PIX")),
             ("GPU0", "GPU1", Link.parse("NV4")), ("GPU0", "nic2", Link.parse("NODE")),
             ("nic1", "nic2", Link.parse("SYS"))]
    return NodeTopology.build(devs, links, source="tray")


def test_a_complex_pair_weighs_pix_and_every_other_pair_its_pcie_path() -> None:
    t = _tray()
    d = {x.name: x for x in t.devices}
    assert t.link("GPU0", "nic1").label == "SYS" and pair_weight(t, d["GPU0"], d["nic1"]) == 50
    assert pair_weight(t, d["nic2"], d["GPU0"]) == 50  # NODE path, same complex; order does not matter
    assert pair_weight(t, d["GPU0"], d["nic0"]) == 40  # PXB, no complex: its PCIe weight
    assert pair_weight(t, d["GPU1"], d["nic0"]) == 50  # PIX by path
    assert pair_weight(t, d["GPU1"], d["nic1"]) == 10  # the NIC has a complex, the GPU none: SYS
    assert pair_weight(t, d["nic1"], d["nic2"]) == 0  # one complex, but two NICs
    assert pair_weight(t, d["GPU0"], d["GPU1"]) == 0


def test_the_pairing_index_reads_complexes() -> None:
    t = _tray()
    members = {"gpu": [_M(d.name, d) for d in t.gpus], "nic": [_M(d.name, d) for d in t.nics]}
    p = PairingIndex.build(t, members).partners("nic", {"gpu": ["GPU0"]})
    assert [p.row(n) for n in ("nic0", "nic1", "nic2")] == [(40,), (50,), (50,)]


class _M:
    def __init__(self, id: str, device: Device):
        self.id, self.device, self.numa = id, device, device.numa


def _weights(t: NodeTopology) -> dict[tuple[str, str], int]:
    return {(g.name, n.name): pair_weight(t, g, n) for g in t.gpus for n in t.nics}


@pytest.mark.parametrize("name", builtin_names())
def test_without_complexes_pairing_weights_are_the_pcie_weights(name: str) -> None:
    """Every built-in: the rule changes complex pairs and nothing else (and nothing on a node without)."""
    t = load_simulated(name)
    bare = dataclasses.replace(t, devices=tuple(dataclasses.replace(d, complex=None, complex_kind=None)
                                                for d in t.devices))
    assert _weights(bare) == {(g.name, n.name): t.weight(g.name, n.name) for g in t.gpus for n in t.nics}
    changed = {k for k, w in _weights(t).items() if w != _weights(bare)[k]}
    assert changed == {(g.name, n.name) for g in t.gpus for n in t.nics
                       if g.complex is not None and g.complex == n.complex and t.weight(g.name, n.name) != 50}
    if name in PLATFORMS:
        assert len(changed) == len(t.gpus)  # each GPU's complex pair was NODE by path


def _resources(t: NodeTopology) -> tuple[Resource, Resource, PairingIndex]:
    rs = build_resources(t, ResourceOptions(device_id_strategy="index"))
    gpu = next(r for r in rs if r.kind is DeviceKind.GPU)
    nic = next(r for r in rs if r.kind is DeviceKind.NIC)
    return gpu, nic, PairingIndex.build(t, {r.name: r.devices for r in rs})


def _answers(t: NodeTopology, seed: int, n: int) -> list[tuple[str, ...]]:
    gpu, nic, index = _resources(t)
    rng = random.Random(seed)
    out = []
    for policy in GPU_POLICIES + NIC_POLICIES:
        me, other = (gpu, nic) if policy in GPU_POLICIES else (nic, gpu)
        for _ in range(n):
            avail = rng.sample(me.graph.ids, rng.randint(1, len(me.graph.ids)))
            k = rng.randint(1, len(avail))
            partners = index.partners(me.name, {other.name: rng.sample(other.graph.ids, rng.randint(0, 4))})
            out.append(get_policy(policy).allocate(me.graph, AllocationRequest.of(avail, [], k, partners)).ids)
    return out


def test_complexes_on_pairs_that_are_pix_anyway_change_no_answer() -> None:
    """DGX H100 with each GPU and its PIX NIC declared a complex answers exactly as plain DGX H100."""
    t = load_simulated("dgx-h100")
    complex_of: dict[str, str] = {}
    for g in t.gpus:
        for n in t.nics:
            if t.link(g.name, n.name).label == "PIX":
                complex_of[g.name] = complex_of[n.name] = f"c-{g.name}"
    tagged = dataclasses.replace(t, devices=tuple(
        dataclasses.replace(d, complex=complex_of[d.name], complex_kind=ComplexKind.INLINE)
        if d.name in complex_of else d for d in t.devices))
    assert sum(d.complex is not None for d in tagged.devices) == 16
    assert _answers(tagged, 3, 40) == _answers(t, 3, 40)


@pytest.mark.parametrize("name", PLATFORMS + ("hgx-b200",))
@pytest.mark.parametrize("policy", GPU_POLICIES + NIC_POLICIES)
def test_every_answer_with_partners_is_the_spec_optimum_on_the_new_platforms(name: str, policy: str) -> None:
    t = load_simulated(name)
    gpu, nic, index = _resources(t)
    oracle = oracle_for(t, [gpu, nic])
    me, other = (gpu, nic) if policy in GPU_POLICIES else (nic, gpu)
    oracle.policies = {**oracle.policies, me.name: policy}
    rng = random.Random(f"{name}/{policy}")
    problems = []
    for _ in range(60):
        avail = rng.sample(me.graph.ids, rng.randint(1, len(me.graph.ids)))
        k = rng.randint(1, len(avail))
        must = rng.sample(avail, rng.randint(0, min(k, 2)))
        group = {other.name: tuple(rng.sample(other.graph.ids, rng.randint(1, len(other.graph.ids))))}
        got = get_policy(policy).allocate(me.graph, AllocationRequest.of(avail, must, k,
                                                                          index.partners(me.name, group)))
        problem = oracle.check(me.name, avail, must, k, group, got.ids)
        if problem:
            problems.append(problem)
    assert not problems, "\n".join(problems[:5])


@pytest.mark.parametrize("name", PLATFORMS)
def test_a_gpu_request_with_a_nic_partner_takes_that_nics_complex_gpu(name: str) -> None:
    """What the rule buys: each NIC as the partner of a one-GPU request gets its own complex's GPU,
    with every GPU free, although by PCIe path the other GPU of the socket is just as close."""
    t = load_simulated(name)
    gpu, nic, index = _resources(t)
    gpu_of = {d.id: g.id for d in nic.devices for g in gpu.devices if g.device.complex == d.device.complex}
    for nic_id, want in gpu_of.items():
        for policy in GPU_POLICIES:
            req = AllocationRequest.of(gpu.graph.ids, [], 1, index.partners(gpu.name, {nic.name: [nic_id]}))
            assert get_policy(policy).allocate(gpu.graph, req).ids == (want,), (nic_id, policy)
