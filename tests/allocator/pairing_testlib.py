"""Nodes with GPUs and NICs, and a brute-force oracle of the spec's objectives with partners.

The oracle is the spec read literally ("One container, several resources:
pairing GPUs with NICs", `shared/spec/allocation.md`): enumerate every S with
M <= S <= A and |S| = k, rank it by the policy's criteria tuple, keep the
best (ties: the lowest sorted positions, the search's fixed rule). X is
computed from scratch for each S with `pairing_weight`, which
`test_pairing_weight.py` checks against brute force over all matchings.
"""

from __future__ import annotations

import itertools
import pathlib
import random
from collections.abc import Iterable

from topo_testkit.pairing_oracle import spec_order

from allocator.pairing import pairing_weight
from allocator.request import AllocationRequest
from allocator.scoring import left_score_idx, port_count_idx, score_idx
from allocator.topology import Device, DeviceGraph, DeviceKind, Link, LinkLevel, NodeTopology

GPU_POLICIES = ("numa-first", "link-first")
NIC_POLICIES = ("spread", "packed")


def shared_topologies() -> list[pathlib.Path]:
    """`shared/topologies/*.txt` beside the checkout (or beside the folder of worktrees)."""
    here = pathlib.Path(__file__).resolve()
    for parent in here.parents:
        found = sorted((parent / "shared" / "topologies").glob("*.txt"))
        if found:
            return found
    raise AssertionError("no shared/topologies/*.txt beside the checkout; the tests need ../shared")


def paired_criteria(g: DeviceGraph, policy: str, req: AllocationRequest, chosen: Iterable[str]) -> tuple[int, ...]:
    """The spec's criteria with partners (smaller is better), the fixed rule excluded."""
    pos = g.index_of()
    s = sorted(pos[i] for i in chosen)
    a = [pos[i] for i in req.available]
    partners = req.partners
    nodes = {g.numa[i] for i in s if g.numa[i] is not None} | {n for n in partners.numa if n is not None}
    span = len(nodes)
    x = pairing_weight([partners.row(g.ids[i]) for i in s], len(partners))
    w = score_idx(g, s)
    left = left_score_idx(g, a, s)
    return spec_order(policy, span, w, x, left, port_count_idx(g, s))


def paired_brute_force(g: DeviceGraph, policy: str, req: AllocationRequest) -> tuple[str, ...]:
    """The best set by exhaustive enumeration, IDs in graph order."""
    pos = g.index_of()
    must = list(req.must_include)
    rest = [i for i in req.available if i not in set(must)]
    best: tuple | None = None
    best_ids: tuple[str, ...] = ()
    for combo in itertools.combinations(rest, req.size - len(must)):
        chosen = must + list(combo)
        key = paired_criteria(g, policy, req, chosen) + (tuple(sorted(pos[i] for i in chosen)),)
        if best is None or key < best:
            best = key
            best_ids = tuple(sorted(chosen, key=pos.__getitem__))
    return best_ids


# -- generated nodes ------------------------------------------------------
def generated_node(rng: random.Random, gpus: int, nics: int, numa_nodes: int = 2,
                   p_no_numa: float = 0.15, p_nvlink: float = 0.4, vf_ports: bool = True) -> NodeTopology:
    """GPUs and NICs under PCIe switches, host bridges and NUMA nodes, as on real servers.

    Each device sits under a switch; switches hang under host bridges, two
    switches of a bridge sometimes behind one upstream switch. Links follow
    `nvidia-smi topo -m`: same switch PIX, same upstream switch PXB, same
    bridge PHB, same NUMA node NODE, else SYS. Some GPU pairs get NVLink.
    Some devices report no NUMA node (sysfs -1) although they sit in the tree.
    NICs may be VFs sharing a port (physical function).
    """
    numa_nodes = max(1, numa_nodes)
    places = []  # (numa, bridge, upstream, switch)
    for n in range(numa_nodes):
        for b in range(rng.randint(1, 2)):
            for s in range(rng.randint(1, 2)):
                places.append((n, b, rng.randint(0, 1), s))

    def level(x: tuple[int, int, int, int], y: tuple[int, int, int, int]) -> LinkLevel:
        if x[0] != y[0]:
            return LinkLevel.SYS
        if x[1] != y[1]:
            return LinkLevel.NODE
        if x[3] == y[3] and x[2] == y[2]:
            return LinkLevel.PIX
        if x[2] == y[2]:
            return LinkLevel.PXB
        return LinkLevel.PHB

    devs: list[Device] = []
    where: dict[str, tuple[int, int, int, int]] = {}
    for i in range(gpus):
        pl = rng.choice(places)
        numa = None if rng.random() < p_no_numa else pl[0]
        devs.append(Device(f"GPU{i}", DeviceKind.GPU, i, numa))
        where[f"GPU{i}"] = pl
    ports: list[str] = []
    for i in range(nics):
        if vf_ports and ports and rng.random() < 0.3:
            port = rng.choice(ports)
            pl = next(where[d.name] for d in devs if d.port == port)
        else:
            port = f"pf{len(ports)}"
            ports.append(port)
            pl = rng.choice(places)
        numa = None if rng.random() < p_no_numa else pl[0]
        devs.append(Device(f"nic{i}", DeviceKind.NIC, i, numa, port=port))
        where[f"nic{i}"] = pl
    links = []
    for a, b in itertools.combinations(devs, 2):
        lv = level(where[a.name], where[b.name])
        nv = 0
        if a.kind == b.kind == DeviceKind.GPU and rng.random() < p_nvlink:
            nv = rng.choice((1, 2, 4, 12))
        links.append((a.name, b.name, Link(nvlinks=nv, level=lv)))
    return NodeTopology.build(devs, links, source="generated", numa_nodes=range(numa_nodes))


def assert_matches_brute_force(g: DeviceGraph, policy: str, req: AllocationRequest) -> None:
    """The policy's answer for `req` is the brute-force optimum (same set, same criteria), proven optimal,
    with a reported pairing that is the set's X and a one-to-one matching of it."""
    from allocator.policies import get_policy

    got = get_policy(policy).allocate(g, req)
    ref = paired_brute_force(g, policy, req)
    assert paired_criteria(g, policy, req, got.ids) == paired_criteria(g, policy, req, ref)
    assert got.ids == ref
    assert got.optimal
    rows = [req.partners.row(i) for i in got.ids]
    assert got.pairing == pairing_weight(rows, len(req.partners))
    assert len({p for _, p, _ in got.pairs}) == len(got.pairs)
    assert {i for i, _, _ in got.pairs} <= set(got.ids)
